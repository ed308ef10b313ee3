"""Atomic checkpoints: write a temp file in the same directory, fsync, then ``os.replace``.

A process killed at any moment leaves either the previous complete checkpoint or the new complete one,
never a half-written file under the checkpoint's name, and no temp file once the next save or resume has run.

A run directory holds ``checkpoint.pt`` and, with ``log.save_replay``, ``replay.npz``. Two files cannot be
replaced in one atomic step, so :func:`save_run_state` orders the writes such that every kill point leaves a
matching pair that :func:`load_replay_arrays` finds:

1. the replay is written (atomically) to ``replay-<env_steps>.npz``, tagged with ``meta/env_steps``;
2. ``checkpoint.pt`` is replaced (atomically), its ``counters["env_steps"]`` equal to that tag;
3. ``replay-<env_steps>.npz`` is renamed to ``replay.npz``.

Killed before 2: the old checkpoint and the old ``replay.npz`` still match (the new replay is a stray that the
resume deletes). Killed between 2 and 3: the resume finds ``replay-<checkpoint env_steps>.npz`` and moves it
into place. After 3: ``replay.npz`` matches.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["load_checkpoint", "load_replay_arrays", "save_checkpoint", "save_run_state", "write_atomic"]

REPLAY_FILE = "replay.npz"
_PENDING_REPLAY = re.compile(r"^replay-(\d+)\.npz$")


def write_atomic(path: str | os.PathLike, write: Any) -> None:
    """Call ``write(f)`` on a temp file next to ``path``, fsync, then ``os.replace`` it onto ``path``.

    On any exception (also ``KeyboardInterrupt``) the temp file is removed and ``path`` is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if path.exists():  # keep the replaced file's permissions (mkstemp makes 0600)
            os.chmod(tmp, stat.S_IMODE(path.stat().st_mode))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> None:
    """``torch.save(state)`` to ``path`` atomically."""
    write_atomic(path, lambda f: torch.save(state, f))


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint written by ``save_checkpoint``.

    Raises:
        FileNotFoundError: no checkpoint at ``path`` (a run directory's ``checkpoint.pt`` is tried too).
        ValueError: the file is truncated, corrupt or not a her-robotics checkpoint (one line).
    """
    path = Path(path)
    if path.is_dir():
        path = path / "checkpoint.pt"
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as exc:  # torch raises RuntimeError, EOFError, pickle errors... for a damaged file
        raise ValueError(f"checkpoint {path} cannot be read: expected a complete her-robotics checkpoint, got a "
                         f"truncated or corrupt file ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
                         ) from None
    if not isinstance(state, dict) or not {"config", "agent", "counters"} <= set(state):
        raise ValueError(f"checkpoint {path}: expected a her-robotics checkpoint (keys config, agent, counters), "
                         f"got {type(state).__name__}" + (f" with keys {sorted(state)[:8]}" if isinstance(state, dict)
                                                          else ""))
    return state


def save_run_state(run_dir: str | os.PathLike, state: dict[str, Any],
                   replay_arrays: dict[str, np.ndarray] | None = None) -> None:
    """Write ``<run_dir>/checkpoint.pt`` and, if given, the flat replay arrays to ``<run_dir>/replay.npz``, in
    the crash-safe order of the module docstring. ``state["counters"]["env_steps"]`` tags the pair."""
    run_dir = Path(run_dir)
    if replay_arrays is not None:
        steps = int(state["counters"]["env_steps"])
        pending = run_dir / f"replay-{steps}.npz"
        arrays = {**replay_arrays, "meta/env_steps": np.asarray(steps, np.int64)}
        write_atomic(pending, lambda f: np.savez_compressed(f, **arrays))
        try:
            save_checkpoint(run_dir / "checkpoint.pt", state)
        except BaseException:
            pending.unlink(missing_ok=True)  # the old pair stays valid
            raise
        os.replace(pending, run_dir / REPLAY_FILE)
    else:
        save_checkpoint(run_dir / "checkpoint.pt", state)


def load_replay_arrays(run_dir: str | os.PathLike, env_steps: int) -> dict[str, np.ndarray] | None:
    """The flat replay arrays saved with the checkpoint of ``env_steps`` (``None`` if the run saved none).

    Finishes a save that was killed between the checkpoint and the replay rename, and removes what a killed
    save left behind (temp files, replays newer than the checkpoint).

    Raises:
        ValueError: ``replay.npz`` belongs to another checkpoint than ``env_steps``, or is truncated / corrupt.
    """
    run_dir = Path(run_dir)
    for p in run_dir.glob("*.tmp"):
        p.unlink(missing_ok=True)
    for p in run_dir.glob("replay-*.npz"):
        m = _PENDING_REPLAY.match(p.name)
        if m and int(m.group(1)) == env_steps:
            os.replace(p, run_dir / REPLAY_FILE)
        elif m:
            p.unlink(missing_ok=True)
    path = run_dir / REPLAY_FILE
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=True) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as exc:  # zipfile.BadZipFile, EOFError, ValueError, zlib.error... for a damaged file
        raise ValueError(f"replay {path} cannot be read: expected a complete replay saved with the checkpoint, got "
                         f"a truncated or corrupt file ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                         f"move it away to resume with an empty replay") from None
    saved = arrays.pop("meta/env_steps", None)
    if saved is not None and int(saved) != env_steps:
        raise ValueError(f"{path} was saved at {int(saved)} env steps, the checkpoint at {env_steps}: "
                         "they do not belong together")
    return arrays
