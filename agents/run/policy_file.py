"""Policy files: only what acting needs, loaded without unpickling code.

A policy file holds the actor's weights (``actor.<name>``, float16 or float32) and the observation and goal
normalizers' running sums (``obs_normalizer.sum`` / ``.sumsq`` / ``.count``, the same for ``goal_normalizer``,
float64), plus string metadata: ``format`` (``her-robotics-policy``), ``format_version``, ``env_id``, ``algo``,
``dtype``, the normalizers' settings (``normalizer``, JSON) and the run's whole config (``config``, JSON), so that
the file alone rebuilds the policy. Critics, target networks, optimizers and the replay are left out.

Two encodings of the same content (Hugging Face Hub model repos use both names):

- ``model.safetensors`` (written when the ``safetensors`` package is installed): tensors and metadata, nothing
  executable by construction;
- ``model.pt``: ``torch.save({"metadata": {...}, "tensors": {...}})``, read with ``torch.load(weights_only=True)``,
  which refuses any pickled object other than tensors, dicts, lists, strings and numbers.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .checkpoint import write_atomic

__all__ = [
    "FORMAT", "FORMAT_VERSION", "MODEL_FILES", "Policy", "find_model_file", "load_policy", "policy_tensors",
    "read_policy_file", "safetensors_available", "write_policy_file",
]

FORMAT = "her-robotics-policy"
FORMAT_VERSION = 1
#: the model file names, in the order a directory is searched
MODEL_FILES = ("model.safetensors", "model.pt")
_NORMALIZERS = ("obs_normalizer", "goal_normalizer")
_SUMS = ("sum", "sumsq", "count")


def safetensors_available() -> bool:
    """Whether the ``safetensors`` package can be imported (then ``her-export`` writes ``model.safetensors``)."""
    try:
        import safetensors.torch  # noqa: F401
    except ImportError:
        return False
    return True


def policy_tensors(agent: Any, dtype: torch.dtype = torch.float32) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The tensors of ``agent.policy_state_dict()``: the actor's floating-point weights in ``dtype`` (other
    buffers as they are), the normalizers' sums in float64; and the normalizers' settings (``eps``, ``clip_obs``,
    ``clip_range``), which are the same for both normalizers of an agent."""
    state = agent.policy_state_dict()
    tensors = {f"actor.{k}": (v.to(dtype) if v.is_floating_point() else v).contiguous()
               for k, v in state["actor"].items()}
    for name in _NORMALIZERS:
        for key in _SUMS:
            tensors[f"{name}.{key}"] = torch.as_tensor(np.asarray(state[name][key], np.float64))
    norm = state["obs_normalizer"]
    settings = {k: float(norm[k]) for k in ("eps", "clip_obs", "clip_range")}
    return tensors, settings


def write_policy_file(path: str | Path, agent: Any, config: dict[str, Any], dtype: torch.dtype = torch.float32
                      ) -> Path:
    """Write ``agent``'s policy (``policy_tensors``) and ``config`` (the run's config as a plain dict) to
    ``path`` atomically; a ``.safetensors`` suffix picks safetensors, anything else the weights-only torch file.

    Raises:
        ImportError: a ``.safetensors`` path without the ``safetensors`` package.
        OSError: the file cannot be written.
    """
    path = Path(path)
    tensors, settings = policy_tensors(agent, dtype)
    metadata = {
        "format": FORMAT, "format_version": str(FORMAT_VERSION), "env_id": str(config["env"]["id"]),
        "algo": str(config["algo"]), "dtype": str(dtype).removeprefix("torch."),
        "normalizer": json.dumps(settings), "config": json.dumps(config, sort_keys=True),
    }
    if path.suffix == ".safetensors":
        from safetensors.torch import save

        data = save(tensors, metadata)
        write_atomic(path, lambda f: f.write(data))
    else:
        buf = io.BytesIO()
        torch.save({"metadata": metadata, "tensors": tensors}, buf)
        write_atomic(path, lambda f: f.write(buf.getvalue()))
    return path


def read_policy_file(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors and metadata of a policy file, read without unpickling code.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: not a her-robotics policy file, a newer format version, a ``.safetensors`` file without the
            ``safetensors`` package, or a corrupt file (one line naming the file).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no policy file at {path}")
    try:
        if path.suffix == ".safetensors":
            try:
                from safetensors import safe_open
            except ImportError:
                raise ValueError(f"{path} is a safetensors file: install the safetensors package to read it") from None
            with safe_open(str(path), framework="pt") as f:
                metadata = dict(f.metadata() or {})
                tensors = {k: f.get_tensor(k) for k in f.keys()}  # safe_open has no __iter__
        else:
            blob = torch.load(path, map_location="cpu", weights_only=True)
            if not isinstance(blob, dict) or "metadata" not in blob or "tensors" not in blob:
                raise ValueError("no 'metadata' and 'tensors' entries")
            metadata, tensors = dict(blob["metadata"]), dict(blob["tensors"])
    except ValueError as exc:
        if str(exc).startswith(str(path)):
            raise
        raise ValueError(f"{path} is not a readable her-robotics policy file ({exc})") from None
    except Exception as exc:  # a pickled object weights_only refuses, a truncated file, a bad header
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ValueError(f"{path} is not a readable her-robotics policy file ({type(exc).__name__}: {first})") from None
    if metadata.get("format") != FORMAT:
        raise ValueError(f"{path} is not a her-robotics policy file (format {metadata.get('format')!r})")
    if int(metadata.get("format_version", 0)) > FORMAT_VERSION:
        raise ValueError(f"{path} has policy format version {metadata['format_version']}; this her-robotics reads "
                         f"up to {FORMAT_VERSION}: upgrade her-robotics")
    return tensors, metadata


def find_model_file(directory: str | Path) -> Path:
    """The model file of an exported policy directory (``model.safetensors``, else ``model.pt``).

    Raises:
        FileNotFoundError: the directory holds neither.
    """
    directory = Path(directory)
    for name in MODEL_FILES:
        if (directory / name).is_file():
            return directory / name
    raise FileNotFoundError(f"{directory} holds no policy file ({' or '.join(MODEL_FILES)})")


@dataclass
class Policy:
    """A policy loaded from a file: ``agent.act(observation, desired_goal, deterministic=True)`` acts.

    ``agent`` is the algorithm's agent with the file's actor and normalizers (critics untrained: acting only);
    ``config`` the run's config (plain dict); ``metadata`` the file's metadata; ``path`` the file.
    """

    agent: Any
    env_id: str
    algo: str
    config: dict[str, Any]
    metadata: dict[str, str]
    path: Path


def load_policy(path: str | Path, device: str = "cpu") -> Policy:
    """Load a policy file or an exported directory (``find_model_file``) for acting, weights cast to
    float32 on ``device``.

    Raises:
        FileNotFoundError: no policy file there.
        ValueError: as ``read_policy_file``, or weights that do not fit the config's networks.
    """
    from ..algos.base import q_clip_for_env
    from ..algos.registry import make_agent
    from her_envs import goal_env_spec

    path = Path(path)
    if path.is_dir():
        path = find_model_file(path)
    tensors, metadata = read_policy_file(path)
    config = json.loads(metadata["config"])
    settings = json.loads(metadata["normalizer"])
    env_id = config["env"]["id"]
    spec = goal_env_spec(env_id)
    section = dict(config["agent"])
    if "q_clip" not in section:
        section["q_clip"] = q_clip_for_env(spec.reward_range, config["train"]["gamma"], env_id)
    section["compile"] = False  # acting only: nothing to compile
    agent = make_agent(config["algo"], spec.observation_dim, spec.goal_dim, spec.action_dim, device=device,
                       n_threads=None, **section)
    actor = {k.removeprefix("actor."): (v.float() if v.is_floating_point() else v)
             for k, v in tensors.items() if k.startswith("actor.")}
    norms = {name: {**settings, "size": tensors[f"{name}.sum"].numel(),
                    **{key: tensors[f"{name}.{key}"].numpy() for key in _SUMS}} for name in _NORMALIZERS}
    try:
        agent.load_policy_state_dict({"actor": actor, **norms})
    except (RuntimeError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0]
        raise ValueError(f"{path}: the weights do not fit the {config['algo']} networks of its config ({first})"
                         ) from None
    return Policy(agent, env_id, str(config["algo"]), config, metadata, path)
