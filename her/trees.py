"""Batched segment trees for proportional prioritized replay (Schaul et al. 2016, Appendix B.2.1).

The trees are K-ary (``branching`` children per node, 32 by default) instead of binary: a 1,000,000-leaf
tree is 4 levels deep instead of 20, so a batched update or search is a handful of vectorized numpy
operations per level and never a Python loop per sample. ``branching=2`` gives the classic binary sum tree.
Any capacity works: the leaf level is padded with the operation's neutral element.

Every internal node is recomputed from its children on each update (never patched with a delta), so an
internal node always equals the reduction of its children and the sums cannot drift.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

__all__ = ["MaxTree", "MinTree", "SegmentTree", "SumTree"]


class SegmentTree:
    """A K-ary tree of float64 values reduced by ``reduce`` ("sum", "min" or "max").

    Args:
        capacity: number of leaves (any positive integer).
        reduce: "sum", "min" or "max".
        branching: children per internal node (>= 2).

    Raises:
        ValueError: capacity < 1, branching < 2 or an unknown reduce.
    """

    _OPS: ClassVar[dict] = {"sum": (np.sum, 0.0), "min": (np.min, np.inf), "max": (np.max, -np.inf)}

    def __init__(self, capacity: int, reduce: str = "sum", branching: int = 32) -> None:
        if int(capacity) < 1:
            raise ValueError(f"tree capacity must be >= 1, got {capacity}")
        if int(branching) < 2:
            raise ValueError(f"tree branching must be >= 2, got {branching}")
        if reduce not in self._OPS:
            raise ValueError(f"reduce must be one of {sorted(self._OPS)}, got {reduce!r}")
        self.capacity = int(capacity)
        self.branching = int(branching)
        self._reduce, self.neutral = self._OPS[reduce]
        depth = 1
        while self.branching**depth < self.capacity:
            depth += 1
        self.depth = depth
        # levels[0] is the root (size 1), levels[depth] the padded leaves.
        self.levels = [np.full(self.branching**d, self.neutral, dtype=np.float64) for d in range(depth + 1)]
        self._child = np.arange(self.branching)

    @property
    def leaves(self) -> np.ndarray:
        """View of the ``capacity`` leaf values, shape [capacity], float64 (read it, write via update)."""
        return self.levels[self.depth][: self.capacity]

    @property
    def root(self) -> float:
        """Reduction over all leaves."""
        return float(self.levels[0][0])

    def __getitem__(self, indices) -> np.ndarray:
        return self.levels[self.depth][np.asarray(indices)]

    def update(self, indices: np.ndarray, values: np.ndarray) -> None:
        """Set ``leaves[indices] = values`` and recompute their ancestors, all in one batched pass.

        Args:
            indices: int array [B] of leaf indices in [0, capacity).
            values: float array [B] (or a scalar).
        Raises:
            IndexError: an index outside [0, capacity).
        """
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size == 0:
            return
        if idx.min() < 0 or idx.max() >= self.capacity:
            raise IndexError(f"tree indices must be in [0, {self.capacity}), got [{idx.min()}, {idx.max()}]")
        self.levels[self.depth][idx] = values
        k = self.branching
        for d in range(self.depth - 1, -1, -1):
            idx = idx // k
            if idx.size > k**d:  # more updates than nodes on this level: rebuild the level whole
                self.levels[d][:] = self._reduce(self.levels[d + 1].reshape(-1, k), axis=1)
                idx = np.arange(k**d)
            else:
                children = self.levels[d + 1][idx[:, None] * k + self._child]
                self.levels[d][idx] = self._reduce(children, axis=1)

    def rebuild(self) -> None:
        """Recompute every internal node from the leaves (after bulk writes to ``levels[depth]``)."""
        k = self.branching
        for d in range(self.depth - 1, -1, -1):
            self.levels[d][:] = self._reduce(self.levels[d + 1].reshape(-1, k), axis=1)


class SumTree(SegmentTree):
    """Sum tree with a batched prefix-sum search (``find``). Leaf values must be finite and >= 0."""

    def __init__(self, capacity: int, branching: int = 32) -> None:
        super().__init__(capacity, "sum", branching)

    @property
    def total(self) -> float:
        return self.root

    def update(self, indices: np.ndarray, values: np.ndarray) -> None:
        """Set leaf priorities; refuses NaN, infinite or negative values with a ValueError."""
        v = np.asarray(values, dtype=np.float64)
        if not np.all(np.isfinite(v)) or np.any(v < 0):
            bad = v[~(np.isfinite(v) & (v >= 0))].ravel()[:5]
            raise ValueError(f"priorities must be finite and >= 0, got {bad.tolist()}")
        super().update(indices, v)

    def find(self, prefix_masses: np.ndarray) -> np.ndarray:
        """For each mass ``m``, the leaf ``i`` with ``sum(leaves[:i]) <= m < sum(leaves[:i+1])``.

        Args:
            prefix_masses: float array [B] in [0, total).
        Returns:
            int64 array [B] of leaf indices; never a leaf of value 0 while ``total > 0`` (masses at or past
            the total, from rounding, land on the last positive leaf).
        Raises:
            ValueError: the tree is empty (total == 0).
        """
        if not self.levels[0][0] > 0:
            raise ValueError("cannot sample from a sum tree whose total priority is 0 (no items)")
        mass = np.asarray(prefix_masses, dtype=np.float64).reshape(-1).copy()
        idx = np.zeros(mass.shape[0], dtype=np.int64)
        k, rows = self.branching, np.arange(mass.shape[0])
        for d in range(1, self.depth + 1):
            children = self.levels[d][idx[:, None] * k + self._child]  # [B, K]
            csum = np.cumsum(children, axis=1)
            j = np.minimum((csum <= mass[:, None]).sum(axis=1), k - 1)
            chosen = children[rows, j]
            empty = chosen <= 0
            if empty.any():  # rounding pushed the mass past the last positive child
                last_pos = k - 1 - np.argmax(children[empty, ::-1] > 0, axis=1)
                j[empty] = last_pos
                chosen = children[rows, j]
            mass = np.clip(mass - (csum[rows, j] - chosen), 0.0, np.nextafter(chosen, 0))
            idx = idx * k + j
        return idx


class MinTree(SegmentTree):
    """Min tree; empty leaves hold +inf so they never count as the minimum."""

    def __init__(self, capacity: int, branching: int = 32) -> None:
        super().__init__(capacity, "min", branching)


class MaxTree(SegmentTree):
    """Max tree; empty leaves hold -inf."""

    def __init__(self, capacity: int, branching: int = 32) -> None:
        super().__init__(capacity, "max", branching)
