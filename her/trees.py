"""Batched segment trees for proportional prioritized replay (Schaul et al. 2016, Appendix B.2.1).

The trees are K-ary (``branching`` children per node, 16 by default) instead of binary: a 1,000,000-leaf
tree is 5 levels deep instead of 20, so a batched update or search is a handful of vectorized numpy
operations per level and never a Python loop per sample. ``branching=2`` gives the classic binary sum tree.
Any capacity works: the leaf level is padded with the operation's neutral element.

Every internal node is recomputed from its children on each update (never patched with a delta), so an
internal node always equals the reduction of its children and the sums cannot drift.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

__all__ = ["MaxTree", "MinTree", "SegmentTree", "SumTree", "update_trees"]


class SegmentTree:
    """A K-ary tree of float64 values reduced by ``reduce`` ("sum", "min" or "max").

    Args:
        capacity: number of leaves (any positive integer).
        reduce: "sum", "min" or "max".
        branching: children per internal node (>= 2).

    Raises:
        ValueError: capacity < 1, branching < 2 or an unknown reduce.
    """

    _OPS: ClassVar[dict] = {"sum": (np.add, 0.0), "min": (np.minimum, np.inf), "max": (np.maximum, -np.inf)}
    #: Updates maintain the levels below the deepest level with at most this many nodes (`_top`); the few small
    #: levels above it are recomputed from it, lazily, when the root or ``levels`` is read.
    TOP_NODES: ClassVar[int] = 4096

    def __init__(self, capacity: int, reduce: str = "sum", branching: int = 16) -> None:
        if int(capacity) < 1:
            raise ValueError(f"tree capacity must be >= 1, got {capacity}")
        if int(branching) < 2:
            raise ValueError(f"tree branching must be >= 2, got {branching}")
        if reduce not in self._OPS:
            raise ValueError(f"reduce must be one of {sorted(self._OPS)}, got {reduce!r}")
        self.capacity = int(capacity)
        self.branching = int(branching)
        self._ufunc, self.neutral = self._OPS[reduce]
        depth = 1
        while self.branching**depth < self.capacity:
            depth += 1
        self.depth = depth
        # _levels[0] is the root (size 1), _levels[depth] the padded leaves.
        self._levels = [np.full(self.branching**d, self.neutral, dtype=np.float64) for d in range(depth + 1)]
        self._child = np.arange(self.branching)
        # _levels[d] seen as rows of `branching` children of the nodes of level d - 1 (views, no copies)
        self._rows = [None] + [lv.reshape(-1, self.branching) for lv in self._levels[1:]]
        self._top = max(d for d in range(depth + 1) if self.branching**d <= self.TOP_NODES)
        self._upper_stale = False

    @property
    def levels(self) -> list[np.ndarray]:
        """The node values by level (root first, padded leaves last), each internal node the reduction of its
        children. Read-only use: write leaves with ``update``."""
        self._sync_upper()
        return self._levels

    def _sync_upper(self) -> None:
        if self._upper_stale:
            for d in range(self._top - 1, -1, -1):
                self._levels[d][:] = self.reduce_rows(self._rows[d + 1])
            self._upper_stale = False

    def reduce_rows(self, children: np.ndarray) -> np.ndarray:
        """The node values of rows of children [N, branching]; the same per row whatever N (exact nodes)."""
        if self._ufunc is np.add:
            return np.add.reduce(children, axis=1)
        # min/max: elementwise over the K columns of a transposed copy is ~2x faster than a row reduction
        return self._ufunc.reduce(np.ascontiguousarray(children.T), axis=0)

    @property
    def leaves(self) -> np.ndarray:
        """View of the ``capacity`` leaf values, shape [capacity], float64 (read it, write via update)."""
        return self._levels[self.depth][: self.capacity]

    @property
    def root(self) -> float:
        """Reduction over all leaves."""
        self._sync_upper()
        return float(self._levels[0][0])

    def __getitem__(self, indices) -> np.ndarray:
        return self._levels[self.depth][np.asarray(indices)]

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
        lo, hi = idx.min(), idx.max()
        if lo < 0 or hi >= self.capacity:
            raise IndexError(f"tree indices must be in [0, {self.capacity}), got [{lo}, {hi}]")
        self._levels[self.depth][idx] = values
        k = self.branching
        for d in range(self.depth - 1, self._top - 1, -1):
            idx = idx // k
            if idx.size > k**d:  # more updates than nodes on this level: rebuild the level whole
                self._levels[d][:] = self.reduce_rows(self._rows[d + 1])
                idx = np.arange(k**d)
            else:
                self._levels[d][idx] = self.reduce_rows(self._rows[d + 1].take(idx, axis=0))
        self._upper_stale = self._top > 0
        self._changed()

    def _changed(self) -> None:
        """Hook called after every write (the sum tree invalidates its cached top-level prefix sums)."""

    def rebuild(self) -> None:
        """Recompute every internal node from the leaves (after bulk writes to ``levels[depth]``)."""
        for d in range(self.depth - 1, -1, -1):
            self._levels[d][:] = self.reduce_rows(self._rows[d + 1])
        self._upper_stale = False
        self._changed()


def update_trees(trees: list[SegmentTree], indices: np.ndarray, values: np.ndarray) -> None:
    """``tree.update(indices, values)`` for several trees of the same shape in one pass over the levels.

    Raises:
        ValueError: the trees differ in capacity or branching, or a value is NaN, infinite or negative.
        IndexError: an index outside [0, capacity).
    """
    first = trees[0]
    if any(t.capacity != first.capacity or t.branching != first.branching for t in trees):
        raise ValueError("update_trees needs trees of the same capacity and branching")
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    if idx.size == 0:
        return
    v = np.asarray(values, dtype=np.float64)
    if v.size and not (v.min() >= 0 and np.isfinite(v.max())):
        raise ValueError(f"priorities must be finite and >= 0, got {v[~(np.isfinite(v) & (v >= 0))][:5].tolist()}")
    lo, hi = idx.min(), idx.max()
    if lo < 0 or hi >= first.capacity:
        raise IndexError(f"tree indices must be in [0, {first.capacity}), got [{lo}, {hi}]")
    if idx.size > first.branching ** (first.depth - 1):  # large batch: plain per-tree updates rebuild levels
        for t in trees:
            t.update(idx, v)
        return
    for t in trees:
        t._levels[t.depth][idx] = v
    for d in range(first.depth - 1, first._top - 1, -1):
        idx = idx // first.branching
        for t in trees:
            t._levels[d][idx] = t.reduce_rows(t._rows[d + 1].take(idx, axis=0))
    for t in trees:
        t._upper_stale = t._top > 0
        t._changed()


class SumTree(SegmentTree):
    """Sum tree with a batched prefix-sum search (``find``). Leaf values must be finite and >= 0."""

    def __init__(self, capacity: int, branching: int = 16) -> None:
        super().__init__(capacity, "sum", branching)
        # ``find`` starts with one binary search over the prefix sums of level `_top` (recomputed after updates,
        # once per ``find``), which replaces the descent through the levels above it.
        self._top_prefix: np.ndarray | None = None
        self._upper = np.triu(np.ones((self.branching, self.branching)))

    def _changed(self) -> None:
        self._top_prefix = None

    @property
    def total(self) -> float:
        return self.root

    def update(self, indices: np.ndarray, values: np.ndarray) -> None:
        """Set leaf priorities; refuses NaN, infinite or negative values with a ValueError."""
        v = np.asarray(values, dtype=np.float64)
        if v.size and not (v.min() >= 0 and np.isfinite(v.max())):  # NaN fails the first test
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
        if not self.root > 0:
            raise ValueError("cannot sample from a sum tree whose total priority is 0 (no items)")
        mass = np.maximum(np.asarray(prefix_masses, dtype=np.float64).reshape(-1), 0.0)
        rows = np.arange(mass.shape[0])
        # Top levels: one binary search over the prefix sums of level `_top` (empty nodes have empty intervals).
        top = self._levels[self._top]
        if self._top_prefix is None:
            self._top_prefix = np.concatenate([[0.0], np.cumsum(top)])
        prefix = self._top_prefix
        idx = np.searchsorted(prefix, mass, side="right") - 1
        if idx.max() >= len(top):  # a mass at or past the total (rounding): the last node with mass
            idx = np.minimum(idx, int(np.flatnonzero(top > 0)[-1]))
        mass -= prefix[idx]
        np.maximum(mass, 0.0, out=mass)
        # Lower levels: pick the first child whose running sum passes the mass.
        k = self.branching
        for d in range(self._top + 1, self.depth + 1):
            children = self._rows[d].take(idx, axis=0)  # [B, K]
            csum = children @ self._upper  # running sums (a BLAS product: 3x faster than np.cumsum here)
            np.minimum(mass, np.nextafter(csum[:, -1], 0.0), out=mass)  # stay inside this node
            j = (csum > mass[:, None]).argmax(axis=1)  # its child is positive: csum[j-1] <= mass < csum[j]
            mass -= csum[rows, j] - children[rows, j]
            np.maximum(mass, 0.0, out=mass)
            idx = idx * k + j
        return idx


class MinTree(SegmentTree):
    """Min tree; empty leaves hold +inf so they never count as the minimum."""

    def __init__(self, capacity: int, branching: int = 16) -> None:
        super().__init__(capacity, "min", branching)


class MaxTree(SegmentTree):
    """Max tree; empty leaves hold -inf."""

    def __init__(self, capacity: int, branching: int = 16) -> None:
        super().__init__(capacity, "max", branching)
