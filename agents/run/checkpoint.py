"""Atomic checkpoints: write a temp file in the same directory, fsync, then ``os.replace``.

A process killed at any moment leaves either the previous complete checkpoint or the new complete one,
never a half-written file under the checkpoint's name, and no temp file once the next save or resume has run.

A run directory holds ``checkpoint.pt`` and, with ``log.save_replay``, ``replay.npz``. Two files cannot be
replaced in one atomic step, so [`save_run_state`][her_agents.run.checkpoint.save_run_state] orders the writes
such that every kill point leaves a
matching pair that ``load_replay_arrays`` finds:

1. the replay is written (atomically) to ``replay-<env_steps>.npz``, tagged with ``meta/env_steps``;
2. ``checkpoint.pt`` is replaced (atomically), its ``counters["env_steps"]`` equal to that tag;
3. ``replay-<env_steps>.npz`` is renamed to ``replay.npz``.

Killed before 2: the old checkpoint and the old ``replay.npz`` still match (the new replay is a stray that the
resume deletes). Killed between 2 and 3: the resume finds ``replay-<checkpoint env_steps>.npz`` and moves it
into place. After 3: ``replay.npz`` matches.

A data-parallel run (torchrun) keeps one ``checkpoint.pt`` (written by rank 0, holding every rank's own state)
and one replay per rank, ``replay.npz`` for rank 0 and ``replay-rank<r>.npz`` for rank ``r``
(``replay_name``), each written in the same three steps with the checkpoint in the middle.

The rest of the module is what a checkpoint holds besides the agent: this process's random state
(``process_rng_state``), the replay as flat arrays (``flatten_arrays``) and, for a resume without the
replay file, the replay's schedules (``replay_schedule``).
"""

from __future__ import annotations

import errno
import functools
import os
import random
import re
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    import her

__all__ = [
    "check_world_size",
    "check_writable",
    "commit_replay",
    "flatten_arrays",
    "load_checkpoint",
    "load_process_rng_state",
    "load_replay_arrays",
    "load_replay_schedule",
    "process_rng_state",
    "replay_name",
    "replay_schedule",
    "save_checkpoint",
    "save_run_state",
    "unflatten_arrays",
    "write_atomic",
    "write_pending_replay",
]

REPLAY_FILE = "replay.npz"


def replay_name(rank: int = 0) -> str:
    """The replay file of a process, without ``.npz``: ``replay`` (rank 0, a single process), ``replay-rank<r>``."""
    return "replay" if rank == 0 else f"replay-rank{rank}"


@functools.cache
def _new_file_mode() -> int:
    """0666 less this process's umask: the mode ``open()`` gives a new file (read once; umask has no getter)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def write_atomic(path: str | os.PathLike, write: Any) -> None:
    """Call ``write(f)`` on a temp file next to ``path``, fsync, then ``os.replace`` it onto ``path``.

    On any exception (also ``KeyboardInterrupt``) the temp file is removed and ``path`` is left untouched.

    Raises:
        OSError: the file cannot be written (e.g. ``ENOSPC``, a full disk), with ``filename`` set to ``path``;
            also where ``write`` reports the failed write as an error of its own (``torch.save`` raises a
            RuntimeError whose context is the OSError).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp makes 0600: keep the replaced file's permissions, or give a new file what open() would
        os.chmod(tmp, stat.S_IMODE(path.stat().st_mode) if path.exists() else _new_file_mode())
        os.replace(tmp, path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        cause = exc if isinstance(exc, OSError) else exc.__context__
        if isinstance(exc, Exception) and isinstance(cause, OSError) and cause.errno is not None:
            raise OSError(cause.errno, cause.strerror, str(path)) from None  # one line: the file and why
        raise


def check_writable(path: str | os.PathLike) -> None:
    """Refuse up front a file path that cannot be written (before the work that makes its content): it is a
    directory or a file that cannot be opened for writing, or a temp file cannot be made in the nearest existing
    directory on its way (the missing ones are created when the file is written). Nothing is left behind.

    Raises:
        OSError: e.g. ``IsADirectoryError``, ``NotADirectoryError``, ``PermissionError`` or ``EROFS`` (a
            read-only filesystem), ``filename`` set to the path that fails.
    """
    where = path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    try:
        if path.exists():
            with open(path, "ab"):  # appends nothing: the file is unchanged
                return
        where = path.absolute().parent
        while not where.exists():
            where = where.parent
        if not where.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(where))
        fd, tmp = tempfile.mkstemp(dir=where, prefix=".write-test.")
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(where)) from None


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


def write_pending_replay(run_dir: str | os.PathLike, replay_arrays: dict[str, np.ndarray], env_steps: int,
                         name: str = "replay") -> Path:
    """Step 1 of a save: the flat replay arrays to ``<run_dir>/<name>-<env_steps>.npz`` (atomically), tagged with
    ``meta/env_steps``. Returns that path; ``commit_replay`` moves it into place once the checkpoint is."""
    pending = Path(run_dir) / f"{name}-{int(env_steps)}.npz"
    arrays = {**replay_arrays, "meta/env_steps": np.asarray(int(env_steps), np.int64)}
    write_atomic(pending, lambda f: np.savez_compressed(f, **arrays))
    return pending


def commit_replay(pending: Path, name: str = "replay") -> None:
    """Step 3 of a save: ``<name>-<env_steps>.npz`` becomes ``<name>.npz``."""
    os.replace(pending, pending.with_name(f"{name}.npz"))


def save_run_state(run_dir: str | os.PathLike, state: dict[str, Any],
                   replay_arrays: dict[str, np.ndarray] | None = None) -> None:
    """Write ``<run_dir>/checkpoint.pt`` and, if given, the flat replay arrays to ``<run_dir>/replay.npz``, in
    the crash-safe order of the module docstring. ``state["counters"]["env_steps"]`` tags the pair."""
    run_dir = Path(run_dir)
    if replay_arrays is not None:
        pending = write_pending_replay(run_dir, replay_arrays, int(state["counters"]["env_steps"]))
        try:
            save_checkpoint(run_dir / "checkpoint.pt", state)
        except BaseException:
            pending.unlink(missing_ok=True)  # the old pair stays valid
            raise
        commit_replay(pending)
    else:
        save_checkpoint(run_dir / "checkpoint.pt", state)


def load_replay_arrays(run_dir: str | os.PathLike, env_steps: int, name: str = "replay"
                       ) -> dict[str, np.ndarray] | None:
    """The flat replay arrays saved with the checkpoint of ``env_steps`` (``None`` if the run saved none).

    Finishes a save that was killed between the checkpoint and the replay rename, and removes what a killed
    save left behind (temp files, replays newer than the checkpoint). ``name``: ``replay_name`` of the
    process (rank 0 also removes every other temp file of the directory).

    Raises:
        ValueError: ``<name>.npz`` belongs to another checkpoint than ``env_steps``, or is truncated / corrupt.
    """
    run_dir = Path(run_dir)
    for p in run_dir.glob("*.tmp" if name == "replay" else f"{name}*.tmp"):
        p.unlink(missing_ok=True)
    pending_name = re.compile(rf"^{re.escape(name)}-(\d+)\.npz$")
    for p in run_dir.glob(f"{name}-*.npz"):
        m = pending_name.match(p.name)
        if m and int(m.group(1)) == env_steps:
            commit_replay(p, name)
        elif m:
            p.unlink(missing_ok=True)
    path = run_dir / f"{name}.npz"
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


def check_world_size(state: dict[str, Any], world_size: int, run_dir: str | os.PathLike) -> None:
    """Refuse to resume a checkpoint of a run with another number of processes (each holds its own state).

    Raises:
        ValueError: ``state["world_size"]`` is not ``world_size`` (a checkpoint without it is accepted).
    """
    saved = state.get("world_size")
    if saved is not None and int(saved) != world_size:
        how = ("without torchrun" if int(saved) == 1 else
               f"under torchrun with --nproc_per_node={int(saved)} (or --nnodes x --nproc_per_node = {int(saved)})")
        raise ValueError(f"--resume {run_dir}: the checkpoint is of a run of {int(saved)} process(es) and this run "
                         f"has {world_size}; each process resumes its own state, so resume it {how}")


# ---------------------------------------------------------------------------------------------------------
# What a checkpoint holds besides the agent
# ---------------------------------------------------------------------------------------------------------


def process_rng_state(rng: np.random.Generator | None = None) -> dict[str, Any]:
    """This process's random state outside the agent, the replay and the envs: ``rng`` (the loop's generator,
    warm-up actions; key ``numpy``), torch's CPU generator (``torch``) and CUDA generators (``cuda``, where CUDA
    is in use), Python's ``random`` (``python``) and numpy's global generator (``numpy_global``)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate(),
                             "numpy_global": np.random.get_state()}
    if rng is not None:
        state["numpy"] = rng.bit_generator.state
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def load_process_rng_state(state: dict[str, Any], rng: np.random.Generator | None = None) -> None:
    """Restore ``process_rng_state`` (the keys a checkpoint has; CUDA only on as many devices)."""
    if rng is not None and "numpy" in state:
        rng.bit_generator.state = state["numpy"]
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "python" in state:
        random.setstate(state["python"])
    if "numpy_global" in state:
        np.random.set_state(state["numpy_global"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def flatten_arrays(d: dict, prefix: str = "") -> dict[str, np.ndarray]:
    """A nested dict (a replay's ``state_dict()``) as ``{"a/b/c": array}`` for ``np.savez``; an empty dict is kept
    as ``"a/": []``."""
    out: dict[str, np.ndarray] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten_arrays(v, f"{prefix}{k}/") if v else {f"{prefix}{k}/": np.zeros(0)})
        else:
            out[f"{prefix}{k}"] = np.asarray(v)
    return out


def unflatten_arrays(flat: dict[str, np.ndarray]) -> dict[str, Any]:
    """The nested dict of ``flatten_arrays`` (0-d and object arrays back to their Python value)."""
    out: dict[str, Any] = {}
    for k, v in flat.items():
        node = out
        *parents, leaf = k.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        if leaf:  # "a/" marks an empty dict
            node[leaf] = v.item() if v.dtype == object or v.ndim == 0 else v
    return out


def replay_schedule(replay: her.HerReplayBuffer) -> dict[str, Any]:
    """What a ``her.HerReplayBuffer`` needs to continue without its storage: the sampling RNG and the
    prioritized sampler's schedules (``n_samples``, which anneals beta, and the priority new transitions
    enter at)."""
    sampler = replay.sampler
    out: dict[str, Any] = {"rng": replay.rng.bit_generator.state}
    if hasattr(sampler, "n_samples"):
        out["n_samples"] = int(sampler.n_samples)
        out["max_priority"] = sampler.max_priority
    return out


def load_replay_schedule(replay: her.HerReplayBuffer, schedule: dict[str, Any]) -> None:
    """Restore ``replay_schedule`` into a replay whose storage restarts empty."""
    replay.rng.bit_generator.state = schedule["rng"]
    if "n_samples" in schedule and hasattr(replay.sampler, "n_samples"):
        replay.sampler.n_samples = int(schedule["n_samples"])
        replay.sampler.max_priority = schedule["max_priority"]
