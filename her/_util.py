"""Small helpers of the hot paths (sampling, adding steps) and the argument checks the pieces share."""

from __future__ import annotations

import math
import numbers
import operator
from functools import lru_cache
from typing import Any

import numpy as np

__all__ = ["ParameterError", "as_shape", "check_real", "filled", "positive_int", "real_float32", "refuse_complex"]

_CACHED_MAX = 1 << 16  # batch sizes up to this reuse a template; larger ones are rare and would pin memory


@lru_cache(maxsize=32)
def _template(n: int, value: float, dtype: str) -> np.ndarray:
    t = np.full(n, value, dtype)
    t.flags.writeable = False
    return t


class ParameterError(ValueError):
    """An argument of a ``her`` constructor or factory out of its range. ``param`` names the argument (e.g.
    ``"beta0"``) and ``detail`` says the rest (``"must be in [0, 1], got 2.0"``); the message is both,
    ``"beta0 must be in [0, 1], got 2.0"``. A layer above (a run config) reads ``param`` to name its own key.
    """

    def __init__(self, param: str, detail: str) -> None:
        super().__init__(f"{param} {detail}")
        self.param, self.detail = param, detail


def filled(n: int, value: float, dtype: str) -> np.ndarray:
    """A new writable ``[n]`` array of ``value``: a copy of a cached template, cheaper than ``np.full`` for the
    few hundred elements of a batch (a per-call cost of every sample)."""
    if n > _CACHED_MAX:
        return np.full(n, value, dtype)
    return _template(n, value, dtype).copy()


def refuse_complex(x: object, name: str) -> None:
    """Raise ValueError if ``x`` holds complex numbers: a float32 cast would drop the imaginary part with only a
    warning. Reads the dtype of arrays and numpy scalars directly (``np.iscomplexobj`` costs 4x more per step)."""
    dtype = x.dtype if isinstance(x, (np.ndarray, np.generic)) else np.asarray(x).dtype
    if dtype.kind == "c":
        raise ValueError(f"{name} must be real numbers, got a complex array (dtype {dtype})")


def real_float32(x: Any, name: str) -> np.ndarray:
    """``x`` as float32; complex input is refused (numpy would drop the imaginary part with only a warning)."""
    refuse_complex(x, name)
    return np.asarray(x, np.float32)


def as_shape(x: Any, name: str = "shape") -> tuple[int, ...]:
    """A shape as a tuple of non-negative ints; a ValueError naming ``name`` otherwise."""
    try:
        dims = tuple(operator.index(d) for d in x)
    except TypeError:
        raise ValueError(f"{name} must be a tuple of non-negative ints, e.g. (25,), got {x!r}") from None
    if any(d < 0 for d in dims):
        raise ValueError(f"{name} must be a tuple of non-negative ints, e.g. (25,), got {x!r}")
    return dims


def positive_int(v: Any, name: str) -> int:
    """``v`` as an int >= 1 (not a bool); a ValueError naming ``name`` otherwise."""
    if isinstance(v, (bool, np.bool_)):  # operator.index(True) is 1: a flag passed where a size belongs
        raise ValueError(f"{name} must be a positive integer, got {v!r}")
    try:
        n = operator.index(v)
    except TypeError:
        raise ValueError(f"{name} must be a positive integer, got {v!r}") from None
    if n < 1:
        raise ValueError(f"{name} must be a positive integer, got {v!r}")
    return n


def check_real(name: str, value: object, what: str, low: float = -math.inf, high: float = math.inf,
               low_open: bool = False, high_open: bool = False) -> float:
    """``value`` as a float if it is a real number (not a bool) in the interval ``low .. high`` (each end closed
    unless ``*_open``; NaN is never inside), else one error naming ``name``: ``"<name> must be <what>, got ..."``.

    Raises:
        TypeError: not a real number (a string, None, an array, a bool).
        ParameterError: outside the interval, or NaN.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {what}, got {value!r} ({type(value).__name__})")
    v = float(value)
    if not ((low < v) if low_open else (low <= v)) or not ((v < high) if high_open else (v <= high)):
        raise ParameterError(name, f"must be {what}, got {value}")
    return v


def check_replaceable(path: object) -> None:
    """Refuse to write a file by ``os.replace`` onto ``path`` when ``path`` exists and is not a regular file:
    the rename would replace a device, FIFO or socket (``/dev/full``, ``/dev/null`` written as root) with a
    plain file instead of writing into it, or fail late on a directory.

    Raises:
        IsADirectoryError: ``path`` is a directory.
        ValueError: ``path`` is another kind of non-regular file, naming what it is."""
    import os
    import stat

    try:
        mode = os.stat(path).st_mode  # type: ignore[arg-type]
    except (FileNotFoundError, NotADirectoryError):
        return
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(21, "expected a file path, got a directory", str(path))
    kind = ("a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode)
            else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
    raise ValueError(f"cannot save to {path}: expected a regular file path (the file is written beside it and "
                     f"renamed onto it), got {kind}, which the rename would replace")
