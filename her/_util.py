"""Small helpers of the sampling hot path."""

from __future__ import annotations

from functools import lru_cache

import numpy as np


@lru_cache(maxsize=64)
def _template(n: int, value: float, dtype: str) -> np.ndarray:
    t = np.full(n, value, dtype)
    t.flags.writeable = False
    return t


def filled(n: int, value: float, dtype: str) -> np.ndarray:
    """A new writable ``[n]`` array of ``value``: a copy of a cached template, ~5x cheaper than ``np.full`` for the
    few hundred elements of a batch (a per-call cost of every sample)."""
    return _template(n, value, dtype).copy()
