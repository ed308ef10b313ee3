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

The rest of the module is what a checkpoint holds besides the agent: this process's random state
(``process_rng_state``), the replay as flat arrays (``flatten_arrays``) and, for a resume without the
replay file, the replay's schedules (``replay_schedule``).
"""

from __future__ import annotations

import errno
import functools
import io
import os
import pickle
import random
import re
import stat
import struct
import tempfile
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from her._util import check_replaceable

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
    check_replaceable(path)
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


def write_pending_replay(run_dir: str | os.PathLike, replay_arrays: dict[str, np.ndarray], env_steps: int,
                         name: str = "replay") -> Path:
    """Step 1 of a save: the flat replay arrays to ``<run_dir>/<name>-<env_steps>.npz`` (atomically), tagged with
    ``meta/env_steps``. Returns that path; ``commit_replay`` moves it into place once the checkpoint is."""
    pending = Path(run_dir) / f"{name}-{int(env_steps)}.npz"
    arrays: dict[str, Any] = {**replay_arrays, "meta/env_steps": np.asarray(int(env_steps), np.int64)}
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
        arrays = _read_npz(path)
    except Exception as exc:  # zipfile.BadZipFile, EOFError, ValueError, zlib.error... for a damaged file
        raise ValueError(f"replay {path} cannot be read: expected a complete replay saved with the checkpoint, got "
                         f"a truncated or corrupt file ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                         f"move it away to resume with an empty replay") from None
    saved = arrays.pop("meta/env_steps", None)
    if saved is not None and int(saved) != env_steps:
        raise ValueError(f"{path} was saved at {int(saved)} env steps, the checkpoint at {env_steps}: "
                         "they do not belong together")
    return arrays


REPLAY_FORMAT = 1
"""Format of a replay base file (``meta/format``). 0: no entry, the whole buffer's state (storage, sampler,
RNG) in ``replay.npz``, its RNG as pickled object arrays. 1: the storage only (no object arrays: loaded without
unpickling), with the storage's construction (``meta/capacity``, ``meta/max_episode_steps``); the sampler's
state and RNG go into the checkpoint, the episodes added since the base into an append-only log."""

_LOG_MAGIC = b"her-episode-log\n"
_CHUNK = struct.Struct("<4sQ")  # b"EPIS", byte length of the npz that follows


class _NumpyOnly(pickle.Unpickler):
    """Unpickles numpy arrays of plain Python values (a format-0 replay's object arrays) and nothing else."""

    _ALLOWED = {("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "_reconstruct"),
                ("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "scalar"),
                ("numpy._core.multiarray", "scalar")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED or (module.startswith("numpy") and name.endswith("DType")):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it needs code to load ({module}.{name})")


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz``; object arrays (only in format-0 replays) through ``_NumpyOnly``."""
    out: dict[str, np.ndarray] = {}
    with zipfile.ZipFile(path) as z:
        for member in z.namelist():
            with z.open(member) as f:
                version = np.lib.format.read_magic(f)
                shape, fortran, dtype = (np.lib.format.read_array_header_1_0(f) if version == (1, 0) else
                                         np.lib.format.read_array_header_2_0(f))
                if dtype.hasobject:
                    out[member.removesuffix(".npy")] = _NumpyOnly(f).load()
                    continue
            with z.open(member) as f:
                out[member.removesuffix(".npy")] = np.lib.format.read_array(f, allow_pickle=False)
    return out


def migrate_replay(arrays: dict[str, np.ndarray], path: Path) -> dict[str, Any]:
    """A replay base file's arrays (any format this version reads) as the nested state of format
    ``REPLAY_FORMAT``: ``{"storage": ..., "sampler": ... or None, "rng": ... or None, "meta": ...}`` (a
    format-0 file holds the sampler and RNG; a format-1 checkpoint holds them instead).

    Raises:
        ValueError: a format this version does not know (one line naming it and the formats read).
    """
    found = int(arrays.get("meta/format", 0))
    if found not in (0, REPLAY_FORMAT):
        raise ValueError(f"replay {path} is of format {found}; this version of her-robotics reads formats 0 to "
                         f"{REPLAY_FORMAT} (a newer version wrote it?)")
    nested = unflatten_arrays(arrays)
    return {"storage": nested["storage"], "sampler": nested.get("sampler"), "rng": nested.get("rng"),
            "meta": nested.get("meta", {})}


class ReplayFiles:
    """A process's replay on disk beside ``checkpoint.pt``, written without rewriting it at every checkpoint.

    - ``<name>.npz``: a base, the storage's full state (compressed), tagged ``meta/env_steps`` with the
      checkpoint it was written with (``<name>`` is ``replay_name``);
    - ``<name>-<base env steps>.log``: an append-only log of the episodes added since that base: a header,
      then one chunk per checkpoint (``b"EPIS"``, a length, an ``.npz`` of the episodes' records).

    ``prepare`` appends the episodes added since the last checkpoint to the log (truncated first to the
    size the last checkpoint covers: bytes of a failed save are never read) and fsyncs, or, once the log
    outgrows the storage's own size or episodes were evicted before they were logged, writes a new base as
    ``<name>-<env steps>.npz`` with an empty log of its own. It returns the checkpoint's entries
    (``replay_files``: base, log bytes and episodes covered; ``replay_sampler``: the sampler's state). The
    checkpoint is then written; ``commit`` renames a new base into place and removes the old log
    (``abort`` instead if the checkpoint failed). A kill at any point leaves the previous checkpoint
    with its base and the first ``log bytes`` of its log intact, or the new checkpoint with its own:
    ``load`` finishes or undoes a save cut short.
    """

    def __init__(self, run_dir: str | os.PathLike, replay: her.HerReplayBuffer, name: str = "replay") -> None:
        self.run_dir, self.replay, self.name = Path(run_dir), replay, name
        self.saving = True
        """Whether checkpoints save the replay (``log.save_replay``); the loop sets it before each save."""
        self.saved: dict[str, int] | None = None  # the entry of the last checkpoint written or loaded
        self._next: tuple[dict[str, int], Path | None] | None = None

    def _log(self, base: int) -> Path:
        return self.run_dir / f"{self.name}-{int(base)}.log"

    def prepare(self, env_steps: int) -> dict[str, Any]:
        """Step 1 of a save (see the class). Raises OSError (e.g. a full disk): nothing committed changes."""
        storage, saved = self.replay.storage, self.saved
        chunk = storage.episodes_after(saved["episodes"]) if saved is not None else None
        if chunk is not None and saved is not None and saved["log_bytes"] + chunk["records"].nbytes < storage.nbytes:
            blob = io.BytesIO()
            arrays: dict[str, Any] = {"lengths": chunk["lengths"], **{f"field.{k}": chunk["records"][k]
                                                                      for k in chunk["records"].dtype.names or ()}}
            if storage.has_goals:
                arrays["achieved_goal"] = chunk["achieved_goal"]
            np.savez_compressed(blob, **arrays)
            log = self._log(saved["base"])
            try:
                with open(log, "r+b") as f:
                    f.truncate(saved["log_bytes"])
                    f.seek(saved["log_bytes"])
                    f.write(_CHUNK.pack(b"EPIS", blob.tell()) + blob.getvalue())
                    f.flush()
                    os.fsync(f.fileno())
                    size = f.tell()
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, str(log)) from None
            self._next = ({**saved, "log_bytes": size, "episodes": storage.n_episodes_added}, None)
        else:
            arrays = flatten_arrays({"storage": storage.state_dict(copy=False)})
            arrays.update({"meta/format": np.asarray(REPLAY_FORMAT), "meta/capacity": np.asarray(storage.capacity),
                           "meta/max_episode_steps": np.asarray(storage.max_episode_steps)})
            pending = write_pending_replay(self.run_dir, arrays, env_steps, self.name)
            try:
                header = _LOG_MAGIC + struct.pack("<Q", REPLAY_FORMAT)
                write_atomic(self._log(env_steps), lambda f: f.write(header))
            except BaseException:
                pending.unlink(missing_ok=True)
                raise
            self._next = ({"base": int(env_steps), "log_bytes": len(header), "episodes": storage.n_episodes_added},
                          pending)
        return {"replay_files": dict(self._next[0]), "replay_sampler": self.replay.sampler.state_dict()}

    def commit(self) -> None:
        """Step 3 of a save, once the checkpoint holding ``prepare``'s entries is written."""
        entry, pending = self._next or (None, None)
        if entry is None:
            return
        if pending is not None:
            commit_replay(pending, self.name)
            self._remove_logs(keep=self._log(entry["base"]).name)  # the old base's, or a replay's never loaded
        self.saved, self._next = entry, None

    def _remove_logs(self, keep: str | None = None) -> None:
        for p in self.run_dir.glob(f"{self.name}-*.log"):
            if re.fullmatch(rf"{re.escape(self.name)}-\d+\.log", p.name) and p.name != keep:
                p.unlink(missing_ok=True)

    def abort(self) -> None:
        """The checkpoint was not written: remove a new base and its log (appended bytes are cut at the next
        save or resume)."""
        entry, pending = self._next or (None, None)
        if entry is not None and pending is not None:
            pending.unlink(missing_ok=True)
            if self.saved is None or self.saved["base"] != entry["base"]:
                self._log(entry["base"]).unlink(missing_ok=True)
        self._next = None

    def remove(self) -> None:
        """Remove every replay file of this process (a run that saves none: old files are not its state)."""
        (self.run_dir / f"{self.name}.npz").unlink(missing_ok=True)
        self._remove_logs()

    def load(self, own: dict[str, Any], env_steps: int) -> str | None:
        """Restore the replay saved with a checkpoint (``own``: this process's entries of it, ``env_steps``: its
        counter) and finish or undo a save cut short. Returns None when restored, else why there is no replay
        to restore (the storage then stays empty; its sampling RNG and schedules continue).

        Raises:
            ValueError: a replay file that is truncated, corrupt, of an unknown format or of another checkpoint.
        """
        entry = own.get("replay_files")
        base_steps = int(entry["base"]) if entry is not None else int(env_steps)
        arrays = load_replay_arrays(self.run_dir, base_steps, self.name)
        if entry is not None:
            self._remove_logs(keep=self._log(base_steps).name)
        if arrays is None:
            path = self.run_dir / f"{self.name}.npz"
            return (f"{path.name} is missing, although the run saved its replay with each checkpoint (deleted or "
                    "moved?)" if entry is not None else "the run saved none with its checkpoints, log.save_replay=false")
        state = migrate_replay(arrays, self.run_dir / f"{self.name}.npz")
        if state["sampler"] is not None:  # format 0: the whole buffer's state in the file
            self.replay.load_state_dict({"storage": state["storage"], "sampler": state["sampler"],
                                         "rng": state["rng"]})
            return None
        self.replay.storage.load_state_dict(state["storage"])
        if entry is not None:
            self._replay_log(entry)
            self.saved = {k: int(v) for k, v in entry.items()}
        self.replay.writer.discard_in_progress()
        if own.get("replay_sampler") is not None:
            self.replay.sampler.load_state_dict(own["replay_sampler"])
        return None

    def _replay_log(self, entry: dict[str, Any]) -> None:
        """Add the episodes of the log's first ``entry["log_bytes"]`` bytes and cut what follows them."""
        log, size, storage = self._log(entry["base"]), int(entry["log_bytes"]), self.replay.storage

        def refuse(why: str) -> ValueError:
            return ValueError(f"replay log {log} cannot be read: expected the episodes of the checkpoint's replay, "
                              f"got a truncated or corrupt file ({why}); move {self.name}.npz and it away to resume "
                              "with an empty replay")

        try:
            with open(log, "r+b") as f:
                data = f.read(size)
                f.truncate(size)
        except FileNotFoundError:
            raise refuse("it is missing, and the checkpoint's replay needs it") from None
        if len(data) < size or not data.startswith(_LOG_MAGIC):
            raise refuse(f"expected {size} bytes starting with its header, got {len(data)}")
        pos = len(_LOG_MAGIC) + 8
        while pos < size:
            tag, n = _CHUNK.unpack_from(data, pos)
            if tag != b"EPIS" or pos + _CHUNK.size + n > size:
                raise refuse(f"a damaged chunk at byte {pos}")
            try:
                with np.load(io.BytesIO(data[pos + _CHUNK.size:pos + _CHUNK.size + n]), allow_pickle=False) as z:
                    lengths = z["lengths"]
                    records = np.zeros(int((lengths + 1).sum()), storage.dtype)
                    for k in storage.dtype.names or ():
                        records[k] = z[f"field.{k}"]
                    storage.add_episodes({"records": records, "lengths": lengths,
                                          **({"achieved_goal": z["achieved_goal"]} if storage.has_goals else {})})
            except (KeyError, ValueError, OSError, zipfile.BadZipFile) as exc:
                raise refuse(f"a damaged chunk at byte {pos} ({type(exc).__name__}: {str(exc)[:120]})") from None
            pos += _CHUNK.size + n
        if storage.n_episodes_added != int(entry["episodes"]):
            raise refuse(f"it holds episodes up to {storage.n_episodes_added}, the checkpoint {entry['episodes']}")


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
        files._replay_log(own["replay_files"])
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
