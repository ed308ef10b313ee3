"""Transition samplers: which transitions are drawn. Semantics: ``docs/semantics.md``.

A sampler returns slots of stored transitions and their importance-sampling weights. ``UniformSampler`` draws
uniformly over all stored transitions; ``PrioritizedSampler`` draws in proportion to priorities (Schaul et al.
2016, "Prioritized Experience Replay", Sec. 3.3 and 3.4); ``EnergySampler`` draws whole episodes in proportion to
the energy their achieved goal (an object's position) gained (Zhao & Tresp 2018). Any object with the
[`Sampler`][her.samplers.Sampler] methods plugs
into ``HerReplayBuffer``.

The storage is an argument of every call (``sample(storage, batch_size, rng)``, ``on_added(storage, slots)``),
never of the constructor, so a sampler is built (and its settings checked) without one. A sampler with state per
slot (priorities) is bound to one storage by ``attach(storage)``, which ``HerReplayBuffer`` calls.
"""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

import numpy as np

from ._util import check_real, filled
from .storage import EpisodeStorage, check_is_storage
from .trees import SumTree

__all__ = ["EnergySampler", "PrioritizedSampler", "Sampler", "UniformSampler", "trajectory_energy"]


@runtime_checkable
class Sampler(Protocol):
    """Which stored transitions a batch holds, and their importance-sampling weights.

    ``HerReplayBuffer`` calls ``attach(storage)`` once, then ``sample(storage, batch_size, rng)`` per batch. The
    storage calls ``on_added`` / ``on_removed`` of an attached sampler that registered itself
    (``storage.add_listener``) when transitions enter or leave it.
    """

    prioritized: bool

    def attach(self, storage: EpisodeStorage) -> None:
        """Prepare for ``storage`` (size per-slot state, register as its listener). Raises ValueError when the
        sampler already serves another storage."""
        ...

    def sample(self, storage: EpisodeStorage, batch_size: int,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``(slots int64 [B], weights float32 [B])`` of ``batch_size`` stored transitions of ``storage`` (slots
        where ``storage.is_transition``). Raises ValueError when nothing is sampleable."""
        ...

    def on_added(self, storage: EpisodeStorage, slots: np.ndarray) -> None:
        """Transitions ``slots`` (int64 [N]) entered ``storage``."""
        ...

    def on_removed(self, storage: EpisodeStorage, slots: np.ndarray) -> None:
        """Transitions ``slots`` (int64 [N]) left ``storage``."""
        ...

    def update_priorities(self, slots: np.ndarray, td_error: np.ndarray) -> None:
        """TD errors of the trained batch; ``HerReplayBuffer`` calls it only when ``prioritized`` is True (and
        raises ValueError otherwise)."""
        ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class UniformSampler:
    """Uniform draws over the sampleable transitions of an ``EpisodeStorage``. Stateless: one instance serves
    any storage, ``attach`` only checks the type.

    Weights are all ones. ``update_priorities`` raises ValueError: priorities would be ignored, and a silent
    no-op hides a prioritized replay that was meant but not built (a loop for either sampler calls it only when
    ``sampler.prioritized`` / ``buffer.prioritized``).
    """

    prioritized = False

    def attach(self, storage: EpisodeStorage) -> None:
        """Check ``storage`` (nothing is kept).

        Raises:
            TypeError: not an ``EpisodeStorage``.
        """
        check_is_storage(storage)

    def on_added(self, storage: EpisodeStorage, slots: np.ndarray) -> None:
        pass

    def on_removed(self, storage: EpisodeStorage, slots: np.ndarray) -> None:
        pass

    def sample(self, storage: EpisodeStorage, batch_size: int,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``batch_size`` transition slots of ``storage``.

        Returns:
            slots: int64 [B]; weights: float32 [B] of ones.
        Raises:
            ValueError: no complete episode is stored yet.
        """
        if storage.n_transitions == 0:
            raise ValueError("cannot sample: the storage holds no complete episode yet (steps of unfinished "
                             "episodes are not sampleable)")
        # Rejection sampling over the live state slots (contiguous in the ring): draw a few more candidates than
        # needed, keep the ones that start a transition (not an episode's last state), in draw order, take the
        # first B. Uniform over transitions; a shortfall (rare) draws again.
        slots = self._accepted(storage, batch_size, rng)
        while len(slots) < batch_size:
            slots = np.concatenate([slots, self._accepted(storage, batch_size - len(slots), rng)])
        slots = slots[:batch_size]
        return slots, filled(batch_size, 1.0, "float32")

    @staticmethod
    def _accepted(st: EpisodeStorage, need: int, rng: np.random.Generator) -> np.ndarray:
        base, n_live = st.oldest_slot, st.n_live_states
        accept = st.n_transitions / n_live
        extra = 3.0 * math.sqrt(need * (1.0 - accept)) / accept + 8.0  # 3 sigma of the rejected count, and some
        cand = (rng.random(int(need / accept + extra)) * n_live).astype(np.int64)
        cand += base
        if base + n_live > st.n_slots:  # st.wraps, inlined: property calls are a visible share of this call
            cand %= st.n_slots
        return cand[st.sampleable.take(cand)]

    def update_priorities(self, slots: np.ndarray, td_error: np.ndarray) -> None:
        """Refused: uniform sampling has no priorities.

        Raises:
            ValueError: always.
        """
        raise ValueError("update_priorities: a UniformSampler has no priorities; use her.PrioritizedSampler() "
                         "for prioritized replay, or skip the call when not sampler.prioritized")

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def __repr__(self) -> str:
        return "UniformSampler()"


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
            raise ValueError(f"beta_annealing_steps must be an integer >= 0 (0: no annealing), got "
                             f"{beta_annealing_steps!r}")
        check_real("alpha", alpha, "a finite number >= 0", 0.0, math.inf, False, True)
        check_real("beta0", beta0, "in [0, 1]", 0.0, 1.0)
        check_real("eps", eps, "a finite number > 0", 0.0, math.inf, True, True)
        if td_error_clip is not None:
            check_real("td_error_clip", td_error_clip, "a finite number > 0 or None", 0.0, math.inf, True, True)
        if not float(eps) ** float(alpha) > 0:  # a zero priority would make a stored transition unsampleable
            raise ValueError(f"eps ** alpha underflows to 0 (eps = {eps}, alpha = {alpha}): raise eps")
        if int(branching) != branching or branching < 2:
            raise ValueError(f"branching must be an integer >= 2, got {branching!r}")
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

    # -- storage listener
    def on_added(self, storage: EpisodeStorage, slots: np.ndarray) -> None:
        """New transitions get the largest priority computed so far (1.0 before the first update)."""
        p = 1.0 if self.max_priority is None else self.max_priority
        self.sum_tree.update(slots, p)
        if self.rank_based:
            self._abs_td[slots] = np.inf  # new transitions rank first

    def on_removed(self, storage: EpisodeStorage, slots: np.ndarray) -> None:
        """Transitions that left get priority 0 (never drawn)."""
        self.sum_tree.update(slots, 0.0)

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
        if storage is not self._storage:
            self._attached(storage)
        if storage.n_transitions == 0:
            raise ValueError("cannot sample: the storage holds no complete episode yet")
        total = self.sum_tree.total
        if not total < math.inf:
            raise ValueError(f"the total priority overflowed to {total}: lower alpha or clip the TD errors "
                             "(td_error_clip)")
        masses = (np.arange(batch_size) + rng.random(batch_size)) * (total / batch_size)
        slots, p = self.sum_tree.find(masses, return_values=True)
        weights = (p / self.sum_tree.min_positive) ** (-self.beta)
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
        self._attached()
        if slots.size == 0:
            return
        if slots.min() < 0 or slots.max() >= self.sum_tree.capacity:
            raise IndexError(f"slots must be in [0, {self.sum_tree.capacity}), got [{slots.min()}, {slots.max()}]")
        live = self.sum_tree.leaves[slots] > 0  # a slot may have been dropped since it was sampled
        if not live.all():
            slots, delta = slots[live], delta[live]
            if not slots.size:
                return
        if self.td_error_clip is not None:
            delta = np.minimum(delta, self.td_error_clip)
        if self.rank_based:
            self._abs_td[slots] = delta
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
            self.sum_tree.write_trusted(slots, priorities)
            self.max_priority = top if self.max_priority is None else max(self.max_priority, top)

    def _rerank(self) -> None:
        slots = self._storage.transition_slots()
        order = np.argsort(-self._abs_td[slots], kind="stable")
        p = np.empty(len(slots))
        p[order] = (1.0 / np.arange(1, len(slots) + 1)) ** self.alpha
        self._set(slots, p, float(p.max()) if len(p) else 0.0)

    def state_dict(self) -> dict:
        """Priorities (``leaves``, float64 [n_slots]), the beta schedule and the rank state.

        Raises:
            ValueError: not attached to a storage.
        """
        return {"leaves": self._attached().leaves.copy(), "n_samples": self.n_samples, "abs_td": self._abs_td.copy(),
                "max_priority": -1.0 if self.max_priority is None else self.max_priority,
                "n_updates": self._n_updates}  # rank-based: when the next re-sort happens

    def load_state_dict(self, state: dict) -> None:
        """Restore from ``state_dict()``.

        Raises:
            ValueError: not attached to a storage.
        """
        self._attached()
        leaves = np.asarray(state["leaves"], np.float64)
        live = leaves > 0
        self.sum_tree.levels[self.sum_tree.depth][: self.sum_tree.capacity] = np.where(live, leaves, 0.0)
        self.sum_tree.rebuild()
        self.n_samples = int(state["n_samples"])
        self._abs_td[:] = state["abs_td"]
        self._n_updates = int(state.get("n_updates", 0))  # states saved before this key: re-sort schedule restarts
        mp = float(state["max_priority"])
        self.max_priority = None if mp < 0 else mp

    def __repr__(self) -> str:
        return (f"PrioritizedSampler(alpha={self.alpha}, beta0={self.beta0}, beta_annealing_steps="
                f"{self.beta_annealing_steps}, eps={self.eps}, td_error_clip={self.td_error_clip}, rank_based="
                f"{self.rank_based}, attached={self._storage is not None})")


def trajectory_energy(achieved_goal: np.ndarray, dt: float, clip_energy: float = 0.5, gravity: float = 9.81,
                      height_axis: int = 2, kinetic_weight: float = 1.0) -> np.ndarray:
    """Trajectory energy of episodes' achieved goals read as an object's positions (Zhao & Tresp 2018,
    "Energy-Based Hindsight Experience Prioritization", Sec. 3.2, Eq. 1-5, unit mass, no rotation term).

    With ``p_t`` the first three goal coordinates of state ``t`` (metres), ``E_t = gravity * (p_t[height_axis] -
    p_0[height_axis]) + |p_t - p_{t-1}|^2 / (2 dt^2)`` for ``t >= 1`` and ``E_0 = 0``; the trajectory energy is
    ``sum_{t=1..T} clip(E_t - E_{t-1}, 0, clip_energy)``: the energy the object gained, per step at most
    ``clip_energy``, so that a lift or a push counts and a fall or a stop does not.

    Args:
        achieved_goal: float [E, T + 1, G] (G >= 3) or [T + 1, G]: the achieved goals of the states of E episodes
            of T transitions.
        dt: seconds between two states (the env's ``dt``; Fetch 0.04), > 0.
        clip_energy: per-step clip (J per kg), > 0 (the paper's 0.5 for Fetch).
        gravity: m/s^2 along ``+height_axis``.
        height_axis: which of the three coordinates points up.
        kinetic_weight: weight of the kinetic term, finite and >= 0.

    Returns:
        float64 [E] (or a float64 scalar array for one episode), >= 0.
    Raises:
        ValueError: fewer than 2 states or 3 goal coordinates, NaN or inf positions, dt / clip_energy not finite
            and > 0, kinetic_weight not finite and >= 0, gravity not finite, height_axis not 0, 1 or 2.
        TypeError: a setting that is not a real number.
    """
    p = np.asarray(achieved_goal, np.float64)
    if p.ndim not in (2, 3) or p.shape[-1] < 3 or p.shape[-2] < 2:
        raise ValueError(f"achieved_goal must be [E, T + 1, G] or [T + 1, G] with T >= 1 and G >= 3 (a position), "
                         f"got shape {p.shape}")
    check_real("dt", dt, "a finite number > 0 (seconds per env step)", 0.0, math.inf, True, True)
    check_real("clip_energy", clip_energy, "a finite number > 0", 0.0, math.inf, True, True)
    check_real("gravity", gravity, "a finite number", -math.inf, math.inf, True, True)
    check_real("kinetic_weight", kinetic_weight, "a finite number >= 0", 0.0, math.inf, False, True)
    if isinstance(height_axis, (bool, np.bool_)) or height_axis not in (0, 1, 2):
        raise ValueError(f"height_axis must be 0, 1 or 2, got {height_axis!r}")
    if not np.isfinite(p[..., :3]).all():
        raise ValueError("achieved_goal must be finite, got NaN or inf in the positions")
    p = p[..., :3]
    potential = gravity * (p[..., 1:, height_axis] - p[..., :1, height_axis])
    kinetic = kinetic_weight * 0.5 * np.square(np.diff(p, axis=-2)).sum(-1) / (dt * dt)
    energy = potential + kinetic  # E_1..E_T
    gained = np.diff(energy, axis=-1, prepend=0.0)  # E_t - E_{t-1}, E_0 = 0
    return np.clip(gained, 0.0, clip_energy).sum(-1)


class EnergySampler:
    """Energy-based prioritization of whole episodes (Zhao & Tresp 2018, "Energy-Based Hindsight Experience
    Prioritization", CoRL, Sec. 3.3): an episode is drawn with probability proportional to ``(trajectory_energy(its
    achieved goals) + eps) ** exponent`` (the paper: exponent 1), then one of its transitions uniformly. Episodes in which the object did not move
    (most of them early on in pushing and picking tasks) are drawn rarely; ``eps`` keeps them sampleable.

    The priority is computed once, when the episode enters the storage; nothing is fed back from training
    (``prioritized`` is False: ``update_priorities`` raises). As in the paper the sampling bias is not corrected:
    the weights are ones. Draws are stratified over the priority mass (as ``PrioritizedSampler``'s).

    Args:
        dt: seconds between two states (the env's ``dt``; Fetch 0.04), > 0.
        clip_energy: per-step clip of the gained energy, > 0 (the paper's 0.5 for Fetch).
        eps: added to every episode's energy, > 0 (a random FetchPickAndPlace episode that touches the box gains
            about 0.2-1.5, one that does not about 2e-7).
        kinetic_weight: weight of the kinetic term, >= 0 (the paper: 1; see
            [`trajectory_energy`][her.samplers.trajectory_energy]).
        exponent: the priority is ``(energy + eps) ** exponent``, in (0, 10]; above 1 it sharpens the draw toward
            the episodes with the most energy (as prioritized replay's alpha, inverted: alpha < 1 flattens).
        gravity: as in [`trajectory_energy`][her.samplers.trajectory_energy].
        height_axis: as in [`trajectory_energy`][her.samplers.trajectory_energy].
        branching: tree branching factor (see ``her.trees``).

    Raises:
        ValueError: a setting out of range (exponent outside (0, 10], eps ** exponent underflowing to 0); at
            ``attach``, a storage whose goals have fewer than 3 coordinates; when an episode enters, a priority
            that overflows (a huge clip_energy).
        TypeError: a setting that is not a real number.
    """

    prioritized = False

    def __init__(self, dt: float, clip_energy: float = 0.5, eps: float = 0.01, gravity: float = 9.81,
                 height_axis: int = 2, branching: int = 16, kinetic_weight: float = 1.0,
                 exponent: float = 1.0) -> None:
        # dt, clip_energy, gravity, kinetic_weight and height_axis are trajectory_energy's checks
        trajectory_energy(np.zeros((2, 3)), dt, clip_energy, gravity, height_axis, kinetic_weight)
        check_real("eps", eps, "a finite number > 0", 0.0, math.inf, True, True)
        check_real("exponent", exponent, "a number in (0, 10]", 0.0, 10.0, True, False)
        if not float(eps) ** float(exponent) > 0:  # a zero priority would make a stored episode unsampleable
            raise ValueError(f"exponent {exponent} with eps {eps}: eps ** exponent underflows to 0, raise eps")
        if isinstance(branching, bool) or int(branching) != branching or branching < 2:
            raise ValueError(f"branching must be an integer >= 2, got {branching!r}")
        self.dt, self.clip_energy, self.eps = float(dt), float(clip_energy), float(eps)
        self.gravity, self.height_axis, self.branching = float(gravity), int(height_axis), int(branching)
        self.kinetic_weight, self.exponent = float(kinetic_weight), float(exponent)
        self._storage: EpisodeStorage | None = None
        self.sum_tree: SumTree | None = None

    def attach(self, storage: EpisodeStorage) -> None:
        """Size the per-slot priorities to ``storage`` and register as its listener (episodes already stored get
        their priority now). Attaching the attached storage again does nothing.

        Raises:
            TypeError: not an ``EpisodeStorage``.
            ValueError: attached to another storage, or goals with fewer than 3 coordinates (no position).
        """
        check_is_storage(storage)
        if storage is self._storage:
            return
        if self._storage is not None:
            raise ValueError("this EnergySampler is attached to another storage: build one sampler per storage")
        if not storage.has_goals or int(np.prod(storage.goal_shape)) < 3 or len(storage.goal_shape) != 1:
            raise ValueError(f"EnergySampler needs achieved goals that start with a 3-D position, got goal shape "
                             f"{storage.goal_shape}")
        self.sum_tree = SumTree(storage.n_slots, self.branching)
        self._storage = storage
        storage.add_listener(self)

    def on_added(self, storage: EpisodeStorage, slots: np.ndarray) -> None:
        """Give the transitions of the episodes in ``slots`` their episode's priority divided by its length (so
        that the episode's share of the mass is its priority)."""
        rec = storage.gather(slots)
        starts = np.unique((slots - rec["step"].astype(np.int64)) % storage.n_slots)
        lengths = storage.gather(starts)["length"].astype(np.int64)
        for T in np.unique(lengths):
            s = starts[lengths == T]
            states = (s[:, None] + np.arange(T + 1)) % storage.n_slots
            energy = trajectory_energy(storage.achieved_goal[states], self.dt, self.clip_energy, self.gravity,
                                       self.height_axis, self.kinetic_weight)
            with np.errstate(over="ignore"):
                priority = (energy + self.eps) ** self.exponent
            if not np.isfinite(priority).all():
                raise ValueError(f"EnergySampler: an episode's priority (energy + eps) ** exponent overflows (energy "
                                 f"{energy.max():.3g}, exponent {self.exponent}): lower clip_energy or exponent")
            trans = (s[:, None] + np.arange(T)) % storage.n_slots
            self.sum_tree.update(trans.ravel(), np.repeat(priority / T, T))

    def on_removed(self, storage: EpisodeStorage, slots: np.ndarray) -> None:
        """Transitions that left get priority 0 (never drawn)."""
        self.sum_tree.update(slots, 0.0)

    def priorities(self, slots: np.ndarray) -> np.ndarray:
        """Per-transition priorities (episode priority / its length) of ``slots``, float64 [N].

        Raises:
            ValueError: not attached to a storage.
        """
        if self.sum_tree is None:
            raise ValueError("this EnergySampler is not attached to a storage yet")
        return self.sum_tree[slots]

    def sample(self, storage: EpisodeStorage, batch_size: int,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``batch_size`` transition slots, stratified over the energy mass (an unattached sampler attaches
        ``storage`` first).

        Returns:
            slots: int64 [B]; weights: float32 [B] of ones.
        Raises:
            ValueError: no complete episode is stored yet, or attached to another storage.
        """
        if storage is not self._storage:
            self.attach(storage)
        if storage.n_transitions == 0:
            raise ValueError("cannot sample: the storage holds no complete episode yet")
        total = self.sum_tree.total
        masses = (np.arange(batch_size) + rng.random(batch_size)) * (total / batch_size)
        slots = self.sum_tree.find(masses)
        return np.asarray(slots, np.int64), filled(batch_size, 1.0, "float32")

    def update_priorities(self, slots: np.ndarray, td_error: np.ndarray) -> None:
        """Refused: the priorities come from the episodes' energy, not from TD errors.

        Raises:
            ValueError: always.
        """
        raise ValueError("update_priorities: an EnergySampler's priorities come from the episodes' energy, not TD "
                         "errors; skip the call when not sampler.prioritized")

    def state_dict(self) -> dict:
        """Empty: the priorities are a function of the stored episodes, recomputed when a storage is loaded."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def __repr__(self) -> str:
        return (f"EnergySampler(dt={self.dt}, clip_energy={self.clip_energy}, eps={self.eps}, kinetic_weight="
                f"{self.kinetic_weight}, exponent={self.exponent}, gravity={self.gravity}, height_axis="
                f"{self.height_axis}, attached={self._storage is not None})")
