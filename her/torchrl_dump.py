"""The directory format of ``HerTorchRLReplayBuffer.dumps`` / ``loads`` (TorchRL's ``ReplayBuffer.dumps``):
``buffer.npz`` (the state's arrays, a nested state flattened to ``{"a/b": array}``, the RNG state as JSON text, so
nothing is pickled) and ``meta.json`` (format, write count, number of envs, shapes). Each file is written
atomically. numpy only: this module imports neither torch nor tensordict.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ._util import check_replaceable

__all__ = ["DUMP_FORMAT", "read_dump", "write_dump"]

DUMP_FORMAT = 1


def write_dump(path: Path, state: Mapping[str, Any]) -> None:
    """Write ``state`` (a ``HerTorchRLReplayBuffer.state_dict()``) into the directory ``path`` (created).

    Raises:
        OSError: ``path`` cannot be written (e.g. it is a file, a full disk).
    """
    path.mkdir(parents=True, exist_ok=True)
    meta = {"format": DUMP_FORMAT, "write_count": state["write_count"], "n_envs": state.get("n_envs"),
            "shapes": state.get("shapes")}
    # Any: numpy's stub would match the ** entries against savez_compressed's allow_pickle: bool
    arrays: dict[str, Any] = _flatten(state["her"]) if "her" in state else {}
    _write_atomic(path / "buffer.npz", lambda f: np.savez_compressed(f, **arrays))
    _write_atomic(path / "meta.json", lambda f: f.write(json.dumps(meta).encode()))


def read_dump(path: Path) -> dict[str, Any]:
    """The state that ``write_dump`` wrote into ``path``, without unpickling.

    Raises:
        FileNotFoundError: ``path`` holds no ``meta.json`` / ``buffer.npz`` of a dump.
        ValueError: a damaged dump or one of an unknown format (one line naming the directory).
    """
    for name in ("meta.json", "buffer.npz"):
        if not (path / name).is_file():
            raise FileNotFoundError(f"loads({str(path)!r}): no {name} there; expected a directory written by "
                                    "HerTorchRLReplayBuffer.dumps")
    try:
        meta = json.loads((path / "meta.json").read_text())
        with np.load(path / "buffer.npz", allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise ValueError(f"loads({str(path)!r}): the dump cannot be read ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:160]})") from None
    if not isinstance(meta, dict) or meta.get("format") != DUMP_FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise ValueError(f"loads({str(path)!r}): a dump of format {found!r}; this version reads format "
                         f"{DUMP_FORMAT}")
    state: dict[str, Any] = {"write_count": meta["write_count"]}
    if meta["shapes"] is not None:
        state.update(her=_unflatten(arrays), n_envs=meta["n_envs"], shapes=meta["shapes"])
    return state


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, np.ndarray]:
    """A nested state as ``{"a/b": array}``; a numpy bit generator's state (128-bit integers) as JSON text."""
    out: dict[str, np.ndarray] = {}
    for k, v in d.items():
        if isinstance(v, Mapping) and "bit_generator" in v:
            out[f"{prefix}{k}:json"] = np.asarray(json.dumps(v))
        elif isinstance(v, Mapping):
            out.update(_flatten(v, f"{prefix}{k}/") if v else {f"{prefix}{k}/": np.zeros(0)})
        else:
            out[f"{prefix}{k}"] = np.asarray(v)
    return out


def _unflatten(flat: Mapping[str, np.ndarray]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in flat.items():
        node = out
        *parents, leaf = k.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        if leaf.endswith(":json"):
            node[leaf[:-len(":json")]] = json.loads(str(v))
        elif leaf:
            node[leaf] = v.item() if v.ndim == 0 else v
    return out


def _write_atomic(path: Path, write: Callable[[Any], Any]) -> None:
    check_replaceable(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
