"""Trained policies shipped with the package: ``her-eval pretrained:FetchReach-v4`` runs one without a run
directory, ``her-eval --list-pretrained`` lists them.

Each is a directory ``<name>/`` of this package (package data of the wheel) as ``her-export`` writes it: the model
file (actor + normalizer statistics, ``her_agents.run.policy_file``), ``config.yaml``, ``results.json`` (the
success rate measured on 100 episodes of the shipped file by ``scripts/measure_pretrained.py``) and the model card
``README.md``. The names are the env ids; a name lists only where its model file ships.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["PREFIX", "load_pretrained", "names", "pretrained_dir", "pretrained_results"]

PREFIX = "pretrained:"
_MODEL_FILES = ("model.safetensors", "model.pt")  # as her_agents.run.policy_file.MODEL_FILES (no torch import here)


def _root() -> Path:
    return Path(str(resources.files(__name__)))


def names() -> list[str]:
    """The shipped policies' names (sorted), e.g. ``["FetchReach-v4"]``."""
    root = _root()
    return sorted(d.name for d in root.iterdir()
                  if d.is_dir() and any((d / m).is_file() for m in _MODEL_FILES))


def pretrained_dir(name: str) -> Path:
    """The directory of the shipped policy ``name`` (a leading ``pretrained:`` is accepted).

    Raises:
        ValueError: no shipped policy of that name (one line listing the valid ones).
    """
    name = name.removeprefix(PREFIX)
    valid = names()
    if name not in valid:
        raise ValueError(f"unknown pretrained policy {name!r}; shipped: {', '.join(valid) or 'none'}")
    return _root() / name


def pretrained_results(name: str) -> dict[str, Any]:
    """The shipped ``results.json`` of ``name`` (success rate measured on the shipped file, env steps, ...)."""
    return json.loads((pretrained_dir(name) / "results.json").read_text())


def load_pretrained(name: str, device: str = "cpu") -> Any:
    """The shipped policy ``name`` (``her_agents.run.policy_file.Policy``; ``.agent.act`` acts).

    Raises:
        ValueError: an unknown name, or a model file this install cannot read.
    """
    from ..run.policy_file import load_policy

    return load_policy(pretrained_dir(name), device=device)
