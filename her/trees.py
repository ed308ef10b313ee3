"""Batched segment trees for proportional prioritized replay (Schaul et al. 2016, Appendix B.2.1).

The trees are K-ary (``branching`` children per node, 16 by default) instead of binary: a 1,000,000-leaf
tree is 5 levels deep instead of 20, so a batched update or search is a handful of vectorized numpy
operations per level and never a Python loop per sample. ``branching=2`` gives the classic binary sum tree.
Any capacity works: the leaf level is padded with the operation's neutral element.

Every internal node is recomputed from its children on each update (never patched with a delta), so an
internal node always equals the reduction of its children and the sums cannot drift.
"""

from __future__ import annotations

import math
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
        """The node values of rows of children [N, branching]; the same per row whatever N (exact nodes).

        The K columns of a transposed copy are reduced elementwise, in column order (faster than a row
        reduction, and a sum is then the sequential sum ``((c_0 + c_1) + c_2) + ...`` that ``find`` relies on).
        """
        if len(children) == 1:  # numpy would sum one row pairwise: reduce two copies to keep the column order
            return self._ufunc.reduce(np.ascontiguousarray(np.repeat(children, 2, axis=0).T), axis=0)[:1]
        return self._ufunc.reduce(np.ascontiguousarray(children.T), axis=0)

    @property
    def leaves(self) -> np.ndarray:
        """View of the ``capacity`` leaf values, shape [capacity], float64 (read it, write via update)."""
        return self._levels[self.depth][: self.capacity]

    @property
    def root(self) -> float:
        """Reduction over all leaves."""
        if self._upper_stale and self._ufunc is not np.add:  # min/max are exact in any order: skip the sync
            return float(self._ufunc.reduce(self._levels[self._top]))
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
        self.write_trusted(idx, values)

    def write_trusted(self, idx: np.ndarray, values: np.ndarray | float) -> None:
        """``update`` without the checks, for a caller that made them (the prioritized sampler): ``idx`` int64
        [B] in range, ``values`` valid for this tree."""
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


class SumTree(SegmentTree):
    """Sum tree with a batched prefix-sum search (``find``). Leaf values must be finite and >= 0.

    With ``track_min=True`` it also keeps the smallest positive leaf (``min_positive``; a prioritized sampler's
    ``p_min`` for the importance-sampling weights) and how many leaves hold it, exact, in O(B) per write of B
    leaves: a write can only lower the minimum to one of its own values, and it changes the count only through
    its own leaves. When the last leaf holding the minimum is overwritten, the minimum is recounted from the
    leaves on the next read (O(capacity); in prioritized replay the minimum's transitions are the ones least
    likely to be drawn, so this is rare).
    """

    def __init__(self, capacity: int, branching: int = 16, track_min: bool = False) -> None:
        super().__init__(capacity, "sum", branching)
        self.track_min = bool(track_min)
        self._min: float | None = math.inf  # smallest positive leaf; None: unknown, recounted when read
        self._min_count = 0  # leaves holding it
        # ``find`` starts with one binary search over the prefix sums of level `_top` (recomputed lazily after
        # updates), which replaces the descent through the levels above it.
        self._top_prefix: np.ndarray | None = None
        # running sums of K children as one BLAS product: each column j sums the children 0..j in order (the
        # kernel accumulates over the inner dimension sequentially), so the sums never decrease along a row
        self._upper = np.triu(np.ones((self.branching, self.branching)))

    def _changed(self) -> None:
        self._top_prefix = None

    def _prefix(self) -> np.ndarray:
        """Prefix sums ``[0, x_0, x_0 + x_1, ...]`` of level `_top`, non-decreasing, cached until the next write."""
        if self._top_prefix is None:
            top = self._levels[self._top]
            k = self.branching
            prefix = np.empty(len(top) + 1)
            prefix[0] = 0.0
            if len(top) % k or len(top) < 2 * k:
                np.cumsum(top, out=prefix[1:])
            else:  # np.cumsum is a scalar loop: within-row running sums (BLAS) plus cumulated row offsets
                within = top.reshape(-1, k) @ self._upper  # [rows, K]
                offset = np.cumsum(within[:-1, -1])
                body = prefix[1:].reshape(-1, k)
                body[0] = within[0]
                # fl(offset_r + within_r,j) is non-decreasing in j, and the row's last one is offset_{r+1}
                np.add(within[1:], offset[:, None], out=body[1:])
            self._top_prefix = prefix
        return self._top_prefix

    @property
    def total(self) -> float:
        """The total mass ``find`` searches: the sum of all leaves (the last prefix sum of level `_top`)."""
        return float(self._prefix()[-1])

    @property
    def min_positive(self) -> float:
        """The smallest positive leaf (``inf`` when no leaf is positive). Needs ``track_min=True``."""
        if not self.track_min:
            raise RuntimeError("min_positive needs a SumTree built with track_min=True")
        if self._min is None:
            leaves = self.leaves
            low = float(np.min(leaves, where=leaves > 0, initial=np.inf))
            self._min, self._min_count = low, int(np.count_nonzero(leaves == low)) if low < math.inf else 0
        return self._min

    def update(self, indices: np.ndarray, values: np.ndarray) -> None:
        """Set leaf priorities; refuses NaN, infinite or negative values with a ValueError."""
        v = np.asarray(values, dtype=np.float64)
        if v.size and not (v.min() >= 0 and np.isfinite(v.max())):  # NaN fails the first test
            bad = v[~(np.isfinite(v) & (v >= 0))].ravel()[:5]
            raise ValueError(f"priorities must be finite and >= 0, got {bad.tolist()}")
        super().update(indices, v)

    def write_trusted(self, idx: np.ndarray, values: np.ndarray | float) -> None:
        m = self._min if self.track_min else None
        if m is None:
            super().write_trusted(idx, values)
            return
        leaves = self._levels[self.depth]
        held = leaves[idx] == m  # leaves that held the minimum before the write
        super().write_trusted(idx, values)
        stored = leaves[idx]  # the values as written (a repeated index keeps its last value)
        low = stored.min()
        if low == 0.0:  # emptied leaves never count: filtered only for a write that empties one (no `min(where=)`)
            positive = stored[stored > 0]
            low = positive.min() if positive.size else math.inf
        if low < m:
            self._min, self._min_count = float(low), np.unique(idx[stored == low]).size
            return
        now = stored == m
        if held.any():  # (a repeated index appears once in the unique count: the masks agree on its entries)
            self._min_count -= np.unique(idx[held & ~now]).size
        if now.any():
            self._min_count += np.unique(idx[now & ~held]).size
        if self._min_count <= 0 and m < math.inf:  # the last leaf holding it was overwritten
            self._min = None

    def rebuild(self) -> None:
        super().rebuild()
        self._min = None

    def find(self, prefix_masses: np.ndarray, return_values: bool = False):
        """For each mass ``m``, the leaf ``i`` with ``sum(leaves[:i]) <= m < sum(leaves[:i+1])``.

        Args:
            prefix_masses: float array [B] in [0, total).
            return_values: also return the leaves' values (read on the way down, no second gather).
        Returns:
            int64 array [B] of leaf indices; never a leaf of value 0 while ``total > 0`` (masses at or past
            the total, from rounding, land on the last positive leaf). With ``return_values``, a tuple
            ``(indices, float64 values [B])``.
        Raises:
            ValueError: the tree is empty (total == 0), or a mass is NaN.
        """
        prefix = self._prefix()
        if not prefix[-1] > 0:
            raise ValueError("cannot sample from a sum tree whose total priority is 0 (no items)")
        mass = np.maximum(np.asarray(prefix_masses, dtype=np.float64).reshape(-1), 0.0)  # a fresh array
        # a mass at or past the total (rounding) lands in the last node with mass
        np.minimum(mass, np.nextafter(prefix[-1], 0.0), out=mass)
        if not mass.max() < prefix[-1]:  # only a NaN mass fails this after the clamps
            raise ValueError(f"masses must be numbers in [0, total), got {prefix_masses!r}")
        # Top levels: one binary search over the prefix sums of level `_top`; the node found has mass > 0
        # because the prefix sums never decrease and the node's interval [prefix_i, prefix_i+1) holds m.
        idx = prefix.searchsorted(mass, side="right")
        idx -= 1
        mass -= prefix[idx]  # >= 0
        # Lower levels: pick the first child whose running sum passes the mass.
        k = self.branching
        rows = np.arange(len(idx))
        value = None
        for d in range(self._top + 1, self.depth + 1):
            children = self._rows[d].take(idx, axis=0)  # [B, K]
            csum = children @ self._upper  # [B, K] running sums
            np.minimum(mass, np.nextafter(csum[:, -1], 0.0), out=mass)  # stay inside this node (rounding)
            j = (csum > mass[:, None]).argmax(axis=1)  # csum[j-1] <= mass < csum[j]: child j has mass > 0
            value = children[rows, j]
            mass -= csum[rows, j] - value  # minus csum[j-1]; >= 0 up to rounding
            np.maximum(mass, 0.0, out=mass)
            idx = idx * k + j
        if return_values:
            return idx, (self._levels[self.depth][idx] if value is None else value)
        return idx


class MinTree(SegmentTree):
    """Min tree; empty leaves hold +inf so they never count as the minimum."""

    def __init__(self, capacity: int, branching: int = 16) -> None:
        super().__init__(capacity, "min", branching)


class MaxTree(SegmentTree):
    """Max tree; empty leaves hold -inf."""

    def __init__(self, capacity: int, branching: int = 16) -> None:
        super().__init__(capacity, "max", branching)
