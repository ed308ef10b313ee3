"""A process's replay on disk beside ``checkpoint.pt``: a compressed base ``<name>.npz`` and an append-only
log of the episodes added since it, ``<name>-<base env steps>.log`` (``ReplayFiles``; ``<name>`` is
``replay_name``), written in the crash-safe order that ``her_agents.run.checkpoint`` describes, with the
checkpoint between their steps.

A base file carries a format version (``REPLAY_FORMAT``); the earlier format is read through one migration
(``migrate_replay``), and a format-0 replay's object arrays through an unpickler that builds numpy arrays of plain
values only. The replay's state is saved as flat arrays (``flatten_arrays``, ``unflatten_arrays``).
"""

from __future__ import annotations

import io
import os
import pickle
import re
import struct
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .atomic import write_atomic

if TYPE_CHECKING:
    import her

__all__ = [
    "REPLAY_FORMAT",
    "ReplayFiles",
    "commit_replay",
    "flatten_arrays",
    "load_replay_arrays",
    "migrate_replay",
    "replay_name",
    "unflatten_arrays",
    "write_pending_replay",
]

REPLAY_FILE = "replay.npz"


def replay_name(rank: int = 0) -> str:
    """The replay file of a process, without ``.npz``: ``replay`` (rank 0, a single process), ``replay-rank<r>``."""
    return "replay" if rank == 0 else f"replay-rank{rank}"


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
            self.apply_log(entry)
            self.saved = {k: int(v) for k, v in entry.items()}
        self.replay.writer.discard_in_progress()
        if own.get("replay_sampler") is not None:
            self.replay.sampler.load_state_dict(own["replay_sampler"])
        return None

    def apply_log(self, entry: dict[str, Any]) -> None:
        """Add the episodes of the log's first ``entry["log_bytes"]`` bytes (``entry``: a checkpoint's
        ``replay_files``) to the storage and cut what follows them; ``load`` calls it, and ``read_replay`` on a
        storage of its own.

        Raises:
            ValueError: the log is missing, truncated or corrupt, or ends at other episodes than ``entry``'s.
        """
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
