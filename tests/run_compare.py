"""Compare two finished training runs for exact equality (a resumed run against an uninterrupted one), for
tests: checkpoints, replay files and ``metrics.csv`` rows, timings and paths aside; and ``killed_at_200``, which
stops a run right after a checkpoint to make the resumed one."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from her_agents.run.checkpoint import load_checkpoint, read_replay

__all__ = ["differences", "killed_at_200", "run_differences"]

#: values that differ between two runs of the same computation: clocks, the run directory, the W&B run
TIMING_KEYS = ("wall_time", "env_steps_per_s", "dist/global_env_steps_per_s")


def differences(a: Any, b: Any, path: str = "", skip: tuple[str, ...] = ()) -> list[str]:
    """Paths where two nested values (dicts, lists, tuples, tensors, arrays, scalars) are not bit-identical
    (NaN equals NaN). Dict keys named in ``skip`` are not compared."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}/{k}: only in one" for k in sorted(set(a) ^ set(b), key=str) if k not in skip]
        for k in a:
            if k in b and k not in skip:
                out += differences(a[k], b[k], f"{path}/{k}", skip)
        return out
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]", skip)]
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return [] if a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b) else [path]
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        same = a.shape == b.shape and a.dtype == b.dtype and (
            np.array_equal(a, b, equal_nan=a.dtype.kind == "f") if a.dtype != object else
            not differences(a.tolist(), b.tolist()))
        return [] if same else [path]
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return []
    return [] if type(a) is type(b) and a == b else [f"{path}: {a!r} vs {b!r}"]


def killed_at_200(real: Callable[..., None]) -> Callable[..., None]:
    """``real`` (the loop's ``save_training_state``) made to raise ``RuntimeError("simulated kill ...")`` right
    after it has written the checkpoint at 200 env steps: set it on ``her_agents.loop.steps`` to kill a run there."""

    def killed(run_dir, config, state, *args, **kwargs):
        real(run_dir, config, state, *args, **kwargs)
        if state.counters["env_steps"] == 200:
            raise RuntimeError("simulated kill after the checkpoint at 200 env steps")

    return killed


def _rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def run_differences(a: Path, b: Path, replay_files: tuple[str, ...] = ("replay",)) -> list[str]:
    """Every difference between the runs in ``a`` and ``b``: their last ``checkpoint.pt`` (config, W&B id and
    clocks aside), the given replays (their storage as saved, :func:`her_agents.run.checkpoint.read_replay`) and
    the ``metrics.csv`` rows (clocks aside)."""
    ca, cb = load_checkpoint(a / "checkpoint.pt"), load_checkpoint(b / "checkpoint.pt")
    # where the replay files stand (base, log bytes) depends on when the run was resumed; what they hold does not
    out = differences(ca, cb, "checkpoint", skip=("config", "wandb_id", "replay_files", *TIMING_KEYS))
    for name in replay_files:
        name = name.removesuffix(".npz")
        out += differences(read_replay(a, name), read_replay(b, name), name)
    ra, rb = _rows(a), _rows(b)
    out += differences([{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in ra],
                       [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rb], "metrics.csv")
    return out
