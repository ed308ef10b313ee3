"""Atomic checkpoints: write a temp file in the same directory, fsync, then ``os.replace``.

A process killed at any moment leaves either the previous complete checkpoint or the new complete one,
never a half-written file under the checkpoint's name, and no temp file once the next save or resume has run.

A run directory holds ``checkpoint.pt`` and, with ``log.save_replay`` (the default), the replay as a base
``replay.npz`` and an append-only episode log ``replay-<base env steps>.log`` (``ReplayFiles``). Files
cannot be replaced together in one atomic step, so a save orders the writes such that every kill point leaves
a matching set that a resume finds:

1. the episodes added since the last checkpoint are appended to the log (fsync), or a new base is written
   (atomically) to ``replay-<env_steps>.npz``, tagged with ``meta/env_steps``, with an empty log of its own;
2. ``checkpoint.pt`` is replaced (atomically); its ``replay_files`` entry names the base and how many bytes of
   the log belong to it;
3. a new base is renamed to ``replay.npz`` and the old log removed.

Killed before 2: the old checkpoint, its base and the first bytes of its log still match (appended bytes past
them are cut; a new base is a stray that the resume deletes). Killed between 2 and 3: the resume finds
``replay-<base>.npz`` and moves it into place. After 3: everything matches.

A data-parallel run (torchrun) keeps one ``checkpoint.pt`` (written by rank 0, holding every rank's own state)
and one replay per rank, ``replay*`` for rank 0 and ``replay-rank<r>*`` for rank ``r`` (``replay_name``),
each written in the same three steps with the checkpoint in the middle.

Both kinds of file carry a format version (``CHECKPOINT_FORMAT``, ``REPLAY_FORMAT``); the earlier
formats are read through one migration each (``migrate_checkpoint``, ``migrate_replay``). Loading
never runs code: ``checkpoint.pt`` is read weights-only, a format-0 replay's object arrays through an
unpickler that builds numpy arrays of plain values only.

The pieces live beside this module: the atomic write (``her_agents.run.atomic``) and the replay's files
(``her_agents.run.replay_files``), whose names this module re-exports. What is here: the checkpoint itself
(``save_checkpoint``, ``load_checkpoint``, ``migrate_checkpoint``), the pair written in order
(``save_run_state``, ``read_replay``) and what a checkpoint holds besides the agent: this process's random
state (``process_rng_state``) and, for a resume without the replay file, the replay's schedules
(``replay_schedule``).
"""

from __future__ import annotations

import functools
import os
import pickle
import random
import re
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .atomic import check_writable, write_atomic
from .replay_files import REPLAY_FILE as REPLAY_FILE
from .replay_files import (
    REPLAY_FORMAT,
    ReplayFiles,
    commit_replay,
    flatten_arrays,
    load_replay_arrays,
    migrate_replay,
    replay_name,
    unflatten_arrays,
    write_pending_replay,
)

if TYPE_CHECKING:
    import her

__all__ = [
    "CHECKPOINT_FORMAT",
    "REPLAY_FORMAT",
    "ReplayFiles",
    "check_world_size",
    "check_writable",
    "commit_replay",
    "flatten_arrays",
    "load_checkpoint",
    "load_process_rng_state",
    "load_replay_arrays",
    "load_replay_schedule",
    "migrate_checkpoint",
    "migrate_replay",
    "process_rng_state",
    "read_replay",
    "replay_name",
    "replay_schedule",
    "save_checkpoint",
    "save_run_state",
    "unflatten_arrays",
    "write_atomic",
    "write_pending_replay",
]


@functools.cache
def _safe_globals() -> list[Any]:
    """What unpickling a checkpoint may construct besides torch's own weights-only types: numpy arrays, their
    dtypes and scalars (the RNG states, the replay schedules), under numpy 2's module names and numpy 1's."""
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy 1
        from numpy.core import multiarray  # type: ignore[no-redef]
    kinds = getattr(np, "dtypes", None)  # numpy >= 1.25 pickles a dtype by its class
    dtypes = [getattr(kinds, n) for n in dir(kinds) if n.endswith("DType")] if kinds else []
    core = [multiarray._reconstruct, multiarray.scalar]
    return [np.ndarray, np.dtype, *dtypes, *core,
            *((f, "numpy.core.multiarray." + f.__name__) for f in core)]


CHECKPOINT_FORMAT = 1
"""Format of ``checkpoint.pt`` (its ``format`` entry). 0: no entry (every checkpoint before formats existed;
some lack the entries ``migrate_checkpoint`` fills in). 1: the replay is referred to by ``replay_files``
(``ReplayFiles``), its sampler state in ``replay_sampler``."""


def save_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> None:
    """``torch.save(state)`` to ``path`` atomically, with ``format`` ``CHECKPOINT_FORMAT``."""
    state = {**state, "format": CHECKPOINT_FORMAT}
    write_atomic(path, lambda f: torch.save(state, f))


_OWN_ENTRIES: dict[str, Any] = {"agent_rng": None, "replay_schedule": None, "update_schedule": None, "eval_window": None,
                "hooks": {}, "envs": {}, "replay_files": None, "replay_sampler": None}
"""A process's entries of a checkpoint and what a format-0 checkpoint without one stands for (None: not saved,
the value of the freshly built run stays)."""


def migrate_checkpoint(state: dict[str, Any], path: str | os.PathLike = "checkpoint.pt") -> dict[str, Any]:
    """A loaded checkpoint of any format this version reads, in format ``CHECKPOINT_FORMAT``: the one place
    that knows the earlier formats, so that a resume reads every entry without looking for it.

    Raises:
        ValueError: a format this version does not know (one line naming it and the formats read).
    """
    found = state.get("format", 0)
    if not isinstance(found, int) or found not in (0, CHECKPOINT_FORMAT):
        raise ValueError(f"checkpoint {path} is of format {found!r}; this version of her-robotics reads formats 0 "
                         f"to {CHECKPOINT_FORMAT} (a newer version wrote it?)")
    state = dict(state)
    # added within format 1: a checkpoint without it was written by a version that sent each video to W&B before
    # the checkpoint, so none waits to be sent again
    state.setdefault("video_steps", [])
    if found == 0:
        state.setdefault("world_size", 1)
        state.setdefault("wandb_id", None)
        for own in [state, *state.get("ranks", [])]:
            for key, value in _OWN_ENTRIES.items():
                own.setdefault(key, value)
    state["format"] = CHECKPOINT_FORMAT
    return state


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
        with torch.serialization.safe_globals(_safe_globals()):
            state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        if "Weights only load failed" not in str(exc):
            raise ValueError(f"checkpoint {path} cannot be read: expected a complete her-robotics checkpoint, got "
                             f"a corrupt file (UnpicklingError: {str(exc).splitlines()[0][:200]})") from None
        found = re.search(r"GLOBAL (\S+)", str(exc))
        what = found.group(1) if found else "a pickled object"
        raise ValueError(f"checkpoint {path} refused: loading it would run code ({what}); a her-robotics checkpoint "
                         "holds only tensors, numpy arrays and plain containers") from None
    except Exception as exc:  # torch raises RuntimeError, EOFError, pickle errors... for a damaged file
        raise ValueError(f"checkpoint {path} cannot be read: expected a complete her-robotics checkpoint, got a "
                         f"truncated or corrupt file ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
                         ) from None
    if not isinstance(state, dict) or not {"config", "agent", "counters"} <= set(state):
        raise ValueError(f"checkpoint {path}: expected a her-robotics checkpoint (keys config, agent, counters), "
                         f"got {type(state).__name__}" + (f" with keys {sorted(state)[:8]}" if isinstance(state, dict)
                                                          else ""))
    return migrate_checkpoint(state, path)


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


def read_replay(run_dir: str | os.PathLike, name: str = "replay") -> dict[str, np.ndarray]:
    """The storage state (flat arrays, keys ``storage/...`` as ``flatten_arrays`` names them) of the replay
    saved with the run directory's ``checkpoint.pt``, base and log together: for tools and tests.

    Raises:
        ValueError: no replay saved, or as ``ReplayFiles.load``.
    """
    import her

    run_dir = Path(run_dir)
    state = load_checkpoint(run_dir / "checkpoint.pt")
    own = state if name == "replay" else state["ranks"][int(name.rsplit("rank", 1)[1])]
    arrays = load_replay_arrays(run_dir, int((own["replay_files"] or {"base": state["counters"]["env_steps"]})
                                             ["base"]), name)
    if arrays is None:
        raise ValueError(f"{run_dir} holds no replay {name}.npz")
    base = migrate_replay(arrays, run_dir / f"{name}.npz")
    st = base["storage"]
    if own["replay_files"] is not None:
        info = {k[len("field.info."):]: v.shape[1:] for k, v in st.items() if k.startswith("field.info.")}
        goal = st["field.achieved_goal"].shape[1:] if "field.achieved_goal" in st else None
        storage = her.EpisodeStorage(int(base["meta"]["capacity"]), st["field.observation"].shape[1:],
                                     st["field.action"].shape[1:], goal, info_shapes=info,
                                     max_episode_steps=int(base["meta"]["max_episode_steps"]))
        storage.load_state_dict(st)
        files = ReplayFiles(run_dir, SimpleNamespace(storage=storage), name)  # type: ignore[arg-type]  # reads only
        files.apply_log(own["replay_files"])
        st = storage.state_dict()
    return flatten_arrays({"storage": st})


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


def replay_schedule(replay: her.HerReplayBuffer) -> dict[str, Any]:
    """What a ``her.HerReplayBuffer`` needs to continue without its storage: the sampling RNG and the
    prioritized sampler's schedules (``n_samples``, which anneals beta, and the priority new transitions
    enter at)."""
    sampler: Any = replay.sampler  # a PrioritizedSampler's schedules are not in the Sampler protocol
    out: dict[str, Any] = {"rng": replay.rng.bit_generator.state}
    if hasattr(sampler, "n_samples"):
        out["n_samples"] = int(sampler.n_samples)
        out["max_priority"] = sampler.max_priority
    return out


def load_replay_schedule(replay: her.HerReplayBuffer, schedule: dict[str, Any]) -> None:
    """Restore ``replay_schedule`` into a replay whose storage restarts empty."""
    replay.rng.bit_generator.state = schedule["rng"]
    sampler: Any = replay.sampler
    if "n_samples" in schedule and hasattr(sampler, "n_samples"):
        sampler.n_samples = int(schedule["n_samples"])
        sampler.max_priority = schedule["max_priority"]
