"""Atomic file writes (``write_atomic``): a temp file in the same directory, fsync, then ``os.replace``. A
process killed at any moment leaves either the previous complete file or the new complete one, never a
half-written file under its name. ``check_writable`` refuses a path that cannot be written before the work
that makes its content.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from her._util import check_replaceable

__all__ = ["check_writable", "write_atomic"]


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
