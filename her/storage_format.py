"""How an ``EpisodeStorage`` is kept on disk: the format of its state, the migration of earlier formats, and the
``.npz`` file written atomically.

``EpisodeStorage.state_dict`` / ``load_state_dict`` / ``save`` / ``load`` (``her/storage.py``) are the interface;
this module is the one place that knows the formats. It imports no other piece.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from ._util import check_replaceable

__all__ = ["STORAGE_FORMAT", "load_npz", "migrate_storage_state", "save_npz"]

STORAGE_FORMAT = 1
"""Format of ``EpisodeStorage.state_dict`` (its ``format`` entry): 1 since the entry exists. Format 0 (no
entry) is what earlier versions saved, some without the ``next_achieved_goal`` field."""


def migrate_storage_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """A storage state of any format this version reads, in format ``STORAGE_FORMAT``: the one place that
    knows the earlier formats.

    Raises:
        ValueError: a format this version does not know (one line naming it and the formats read).
    """
    state = dict(state)
    found = int(np.asarray(state.pop("format", 0)))
    if found not in (0, STORAGE_FORMAT):
        raise ValueError(f"a replay storage of format {found}: this version of her reads formats 0 to "
                         f"{STORAGE_FORMAT} (a newer version of her wrote it?)")
    if found == 0 and "field.achieved_goal" in state and "field.next_achieved_goal" not in state:
        # saved before the records kept a copy of the next state's achieved goal: derive it
        state["field.next_achieved_goal"] = np.roll(state["field.achieved_goal"], -1, axis=0)
    return state


def save_npz(path: str, arrays: Mapping[str, Any]) -> None:
    """Write ``arrays`` compressed (``.npz``) atomically: a temp file beside ``path``, fsync, then ``os.replace``;
    the file gets the permissions ``open()`` would give it (the umask's). Nothing is left behind on an error.

    Raises:
        IsADirectoryError, ValueError: ``path`` exists and is not a regular file (``check_replaceable``).
        OSError: the file cannot be written (e.g. a full disk); ``path`` is then unchanged.
    """
    check_replaceable(path)
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, suffix=".npz.tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez_compressed(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # mkstemp makes 0600
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_npz(path: str) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file written by ``save_npz``, read into memory (no pickles)."""
    with np.load(path) as z:
        return {k: z[k] for k in z.files}
