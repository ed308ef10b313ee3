"""Prioritized experience replay (Schaul et al. 2016, "Prioritized Experience Replay", Sec. 3.3 and 3.4): a
[`Sampler`][her.samplers.Sampler] that draws stored transitions in proportion to priorities from their TD errors,
proportional or rank-based, with importance-sampling weights. Semantics: ``docs/semantics.md``.
"""

from __future__ import annotations

import math

import numpy as np

from ._util import ParameterError, check_real
from .storage import EpisodeStorage, check_is_storage
from .trees import SumTree

__all__ = ["PrioritizedSampler"]


def _check_slots_and_td_errors(slots: np.ndarray, td_error: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(slots int64 [B], |td_error| float64 [B])``; ValueError for non-integer slots, lengths that differ, or a
    NaN or infinite TD error."""
    slots = np.asarray(slots)
    if slots.ndim != 1:
        raise ValueError(f"slots must be a 1-D array [B] (a batch's `index`), got shape {slots.shape}")
    if slots.dtype.kind not in "iu":
        raise ValueError(f"slots must be integers (a batch's `index`), got dtype {slots.dtype}")
    delta = np.asarray(td_error, np.float64)
    if delta.shape not in ((slots.shape[0],), (slots.shape[0], 1)):
        raise ValueError(f"td_error must have shape [B] or [B, 1] with B = {slots.shape[0]} slots, got shape "
                         f"{delta.shape}")
    delta = np.abs(delta.reshape(-1))
    if delta.size and not np.isfinite(delta.max()):  # NaN propagates through the max: one check for NaN and inf
        raise ValueError(f"TD errors must be finite, got {delta[~np.isfinite(delta)][:5].tolist()}")
    return slots.astype(np.int64, copy=False), delta


class PrioritizedSampler:
    """Proportional prioritized replay with stratified sampling (Schaul et al. 2016, Alg. 1 and Sec. 3.3-3.4).

    Each stored transition ``i`` has a priority ``p_i = (min(|delta_i|, td_error_clip) + eps) ** alpha`` from the
    TD error ``delta_i`` of the goal it was last trained with; a new transition gets the largest priority
    computed so far (1.0 before the first update), so it can be drawn at once. ``P(i) = p_i / sum_k p_k``; the batch is
    drawn stratified: one draw in each of ``B`` equal segments of the total mass. Importance-sampling weights
    ``w_i = (N P(i)) ** -beta / max_j w_j`` with the max over all ``N`` stored transitions (Eq. in Sec. 3.4),
    i.e. ``w_i = (p_i / p_min) ** -beta``; ``beta`` rises linearly from ``beta0`` to 1 over
    ``beta_annealing_steps`` calls of ``sample``. Priorities of transitions that leave the storage are reset.

    With ``rank_based=True`` the priority is ``(1 / rank(i)) ** alpha``, ranks by ``|delta|`` (Sec. 3.3, rank
    variant); ranks are recomputed every ``rank_resort_interval`` priority updates.

    The sampler is built without a storage; ``attach(storage)`` (``HerReplayBuffer`` calls it) sizes the tree to
    the storage's slots and registers the sampler as the storage's listener. One sampler serves one storage.

    Args:
        storage: optional, a shortcut for ``attach(storage)`` right after construction:
            ``PrioritizedSampler(storage, 0.6, 0.4)`` is ``PrioritizedSampler(alpha=0.6, beta0=0.4)`` attached.
        alpha: prioritization exponent, 0 = uniform. Default 0.6.
        beta0: initial importance-sampling exponent. Default 0.4.
        beta_annealing_steps: calls of ``sample`` over which beta rises linearly from beta0 to 1; pass the run's
            number of updates (the training loop does). 0 keeps beta at beta0.
        eps: added to ``|delta|`` so a zero TD error keeps a transition sampleable. Default 1e-6.
        td_error_clip: optional upper clip of ``|delta|`` (the seed's ``abs_err_upper``). Default None.
        rank_based: rank-based priorities instead of proportional ones.
        rank_resort_interval: rank-based: priority updates between re-sorts of the ranks.
        branching: tree branching factor (see ``her.trees``).

    Raises:
        ValueError: alpha not a finite number >= 0, beta0 not in [0, 1], eps not finite and > 0, td_error_clip not
            finite and > 0, beta_annealing_steps not an integer >= 0, eps ** alpha underflowing to 0, branching
            not an integer >= 2.
        TypeError: ``storage`` given and not an ``EpisodeStorage``; alpha, beta0, eps or td_error_clip not a real
            number.
    """

    prioritized = True

    def __init__(
        self,
        storage: EpisodeStorage | None = None,
        alpha: float = 0.6,
        beta0: float = 0.4,
        beta_annealing_steps: int = 0,
        eps: float = 1e-6,
        td_error_clip: float | None = None,
        rank_based: bool = False,
        rank_resort_interval: int = 100,
        branching: int = 16,
    ) -> None:
        if int(beta_annealing_steps) != beta_annealing_steps or beta_annealing_steps < 0:
            raise ParameterError("beta_annealing_steps", f"must be an integer >= 0 (0: no annealing), got "
                                 f"{beta_annealing_steps!r}")
        check_real("alpha", alpha, "a finite number >= 0", 0.0, math.inf, False, True)
        check_real("beta0", beta0, "in [0, 1]", 0.0, 1.0)
        check_real("eps", eps, "a finite number > 0", 0.0, math.inf, True, True)
        if td_error_clip is not None:
            check_real("td_error_clip", td_error_clip, "a finite number > 0 or None", 0.0, math.inf, True, True)
        if not float(eps) ** float(alpha) > 0:  # a zero priority would make a stored transition unsampleable
            raise ParameterError("eps", f"** alpha underflows to 0 (eps = {eps}, alpha = {alpha}): raise eps")
        if int(branching) != branching or branching < 2:
            raise ParameterError("branching", f"must be an integer >= 2, got {branching!r}")
        self.alpha, self.beta0, self.eps = float(alpha), float(beta0), float(eps)
        self.beta_annealing_steps = int(beta_annealing_steps)
        self.td_error_clip = td_error_clip
        self.rank_based = rank_based
        self.rank_resort_interval = int(rank_resort_interval)
        self.branching = int(branching)
        self.max_priority: float | None = None  # largest p_i computed from TD errors so far
        self.n_samples = 0
        self._n_updates = 0
        self._storage: EpisodeStorage | None = None  # set by attach
        self.sum_tree: SumTree | None = None  # priorities by slot (0 = no transition), sized by attach
        self._abs_td: np.ndarray | None = None  # rank-based only: last |delta| per slot, sized by attach
        if storage is not None:
            self.attach(storage)

    def attach(self, storage: EpisodeStorage) -> None:
        """Size the priorities to ``storage``'s slots and register as its listener (the transitions it already
        holds get the largest priority). Attaching the attached storage again does nothing.

        Raises:
            TypeError: ``storage`` is not an ``EpisodeStorage``.
            ValueError: the sampler is attached to another storage (priorities are per slot of one storage).
        """
        check_is_storage(storage)
        if storage is self._storage:
            return
        if self._storage is not None:
            raise ValueError("this PrioritizedSampler is attached to another storage (its priorities are per slot "
                             "of one storage): build one sampler per storage")
        n = storage.n_slots
        self.sum_tree = SumTree(n, self.branching, track_min=True)
        self._abs_td = np.zeros(n, np.float64)
        self._storage = storage
        storage.add_listener(self)

    def _attached(self, storage: EpisodeStorage | None = None) -> SumTree:
        """The tree, after attaching ``storage`` to an unattached sampler; ValueError for another storage or
        none at all."""
        if storage is not None and storage is not self._storage:
            self.attach(storage)
        if self.sum_tree is None:
            raise ValueError("this PrioritizedSampler is not attached to a storage yet: pass it to "
                             "her.HerReplayBuffer(storage, sampler=...) or call sampler.attach(storage)")
        return self.sum_tree

    def _rank_abs_td(self) -> np.ndarray:
        """The last |delta| per slot (sized by ``attach``, like the tree)."""
        assert self._abs_td is not None, "sized by attach"
        return self._abs_td

    # -- storage listener
    def on_added(self, storage: EpisodeStorage, slots: np.ndarray) -> None:
        """New transitions get the largest priority computed so far (1.0 before the first update)."""
        p = 1.0 if self.max_priority is None else self.max_priority
        self._attached().update(slots, p)
        if self.rank_based:
            self._rank_abs_td()[slots] = np.inf  # new transitions rank first

    def on_removed(self, storage: EpisodeStorage, slots: np.ndarray) -> None:
        """Transitions that left get priority 0 (never drawn)."""
        self._attached().update(slots, 0.0)

    @property
    def beta(self) -> float:
        """Current importance-sampling exponent."""
        if self.beta_annealing_steps <= 0:
            return self.beta0
        frac = min(1.0, self.n_samples / self.beta_annealing_steps)
        return self.beta0 + (1.0 - self.beta0) * frac

    @property
    def min_priority(self) -> float:
        """The smallest priority of a stored transition, ``p_min`` of the IS weights (inf when none).

        Raises:
            ValueError: not attached to a storage.
        """
        return self._attached().min_positive

    def priorities(self, slots: np.ndarray) -> np.ndarray:
        """Stored priorities ``p_i`` of the given slots (int [N]), float64 [N].

        Raises:
            ValueError: not attached to a storage.
        """
        return self._attached()[slots]

    def sample(self, storage: EpisodeStorage, batch_size: int,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``batch_size`` slots of ``storage``, stratified over the priority mass, with IS weights. An
        unattached sampler attaches ``storage`` first.

        Returns:
            slots: int64 [B]; weights: float32 [B] in (0, 1].
        Raises:
            ValueError: no complete episode is stored yet, the sampler is attached to another storage, or the
                total priority overflowed.
        """
        tree = self._attached(storage)
        if storage.n_transitions == 0:
            raise ValueError("cannot sample: the storage holds no complete episode yet")
        total = tree.total
        if not total < math.inf:
            raise ValueError(f"the total priority overflowed to {total}: lower alpha or clip the TD errors "
                             "(td_error_clip)")
        masses = (np.arange(batch_size) + rng.random(batch_size)) * (total / batch_size)
        slots, p = tree.find(masses, return_values=True)
        weights = (p / tree.min_positive) ** (-self.beta)
        self.n_samples += 1
        return slots, weights.astype(np.float32)

    def update_priorities(self, slots: np.ndarray, td_error: np.ndarray) -> None:
        """Set ``p_i = (|delta_i| + eps) ** alpha`` for the sampled slots.

        Args:
            slots: int [B] the ``index`` field of the batch that was trained on.
            td_error: float [B] TD errors (sign ignored).
        Raises:
            ValueError: non-integer slots, lengths that differ, a TD error is NaN or infinite, or the sampler is
                not attached to a storage.
            IndexError: a slot outside the storage.
        """
        slots, delta = _check_slots_and_td_errors(slots, td_error)
        tree = self._attached()
        if slots.size == 0:
            return
        if slots.min() < 0 or slots.max() >= tree.capacity:
            raise IndexError(f"slots must be in [0, {tree.capacity}), got [{slots.min()}, {slots.max()}]")
        live = tree.leaves[slots] > 0  # a slot may have been dropped since it was sampled
        if not live.all():
            slots, delta = slots[live], delta[live]
            if not slots.size:
                return
        if self.td_error_clip is not None:
            delta = np.minimum(delta, self.td_error_clip)
        if self.rank_based:
            self._rank_abs_td()[slots] = delta
            self._n_updates += 1
            if self._n_updates % self.rank_resort_interval == 0:
                self._rerank()
            return
        p = (delta + self.eps) ** self.alpha  # >= eps ** alpha > 0 (checked at construction)
        top = p.max()
        if not np.isfinite(top):
            raise ValueError(f"priorities (|delta| + eps) ** alpha overflow for |delta| = "
                             f"{delta[~np.isfinite(p)][:5].tolist()} (alpha = {self.alpha})")
        self._set(slots, p, float(top))

    def _set(self, slots: np.ndarray, priorities: np.ndarray, top: float) -> None:
        # slots in range, priorities finite and > 0, top their max: checked and computed by the callers
        if len(priorities):
            self._attached().write_trusted(slots, priorities)
            self.max_priority = top if self.max_priority is None else max(self.max_priority, top)

    def _rerank(self) -> None:
        assert self._storage is not None, "re-ranked only once attached"
        slots = self._storage.transition_slots()
        order = np.argsort(-self._rank_abs_td()[slots], kind="stable")
        p = np.empty(len(slots))
        p[order] = (1.0 / np.arange(1, len(slots) + 1)) ** self.alpha
        self._set(slots, p, float(p.max()) if len(p) else 0.0)

    def state_dict(self) -> dict:
        """Priorities (``leaves``, float64 [n_slots]), the beta schedule and the rank state.

        Raises:
            ValueError: not attached to a storage.
        """
        return {"leaves": self._attached().leaves.copy(), "n_samples": self.n_samples,
                "abs_td": self._rank_abs_td().copy(),
                "max_priority": -1.0 if self.max_priority is None else self.max_priority,
                "n_updates": self._n_updates}  # rank-based: when the next re-sort happens

    def load_state_dict(self, state: dict) -> None:
        """Restore from ``state_dict()``.

        Raises:
            ValueError: not attached to a storage.
        """
        tree = self._attached()
        leaves = np.asarray(state["leaves"], np.float64)
        live = leaves > 0
        tree.levels[tree.depth][: tree.capacity] = np.where(live, leaves, 0.0)
        tree.rebuild()
        self.n_samples = int(state["n_samples"])
        self._rank_abs_td()[:] = state["abs_td"]
        self._n_updates = int(state.get("n_updates", 0))  # states saved before this key: re-sort schedule restarts
        mp = float(state["max_priority"])
        self.max_priority = None if mp < 0 else mp

    def __repr__(self) -> str:
        return (f"PrioritizedSampler(alpha={self.alpha}, beta0={self.beta0}, beta_annealing_steps="
                f"{self.beta_annealing_steps}, eps={self.eps}, td_error_clip={self.td_error_clip}, rank_based="
                f"{self.rank_based}, attached={self._storage is not None})")
