"""Energy-based prioritization of whole episodes (Zhao & Tresp 2018, "Energy-Based Hindsight Experience
Prioritization", CoRL): ``trajectory_energy`` of an episode's achieved goals read as an object's positions, and
``EnergySampler``, a [`Sampler`][her.samplers.Sampler] that draws episodes in proportion to it. Semantics:
``docs/semantics.md``.
"""

from __future__ import annotations

import math

import numpy as np

from ._util import ParameterError, check_real, filled
from .storage import EpisodeStorage, check_is_storage
from .trees import SumTree

__all__ = ["EnergySampler", "trajectory_energy"]


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
        raise ParameterError("height_axis", f"must be 0, 1 or 2, got {height_axis!r}")
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
            [`trajectory_energy`][her.energy.trajectory_energy]).
        exponent: the priority is ``(energy + eps) ** exponent``, in (0, 10]; above 1 it sharpens the draw toward
            the episodes with the most energy (as prioritized replay's alpha, inverted: alpha < 1 flattens).
        gravity: as in [`trajectory_energy`][her.energy.trajectory_energy].
        height_axis: as in [`trajectory_energy`][her.energy.trajectory_energy].
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
            raise ParameterError("exponent", f"{exponent} with eps {eps}: eps ** exponent underflows to 0, raise eps")
        if isinstance(branching, bool) or int(branching) != branching or branching < 2:
            raise ParameterError("branching", f"must be an integer >= 2, got {branching!r}")
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
        gs = storage.goal_shape
        if gs is None or int(np.prod(gs)) < 3 or len(gs) != 1:
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
            self._tree().update(trans.ravel(), np.repeat(priority / T, T))

    def on_removed(self, storage: EpisodeStorage, slots: np.ndarray) -> None:
        """Transitions that left get priority 0 (never drawn)."""
        self._tree().update(slots, 0.0)

    def _tree(self) -> SumTree:
        assert self.sum_tree is not None, "sized by attach, which runs before any listener call or sample"
        return self.sum_tree

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
        total = self._tree().total
        masses = (np.arange(batch_size) + rng.random(batch_size)) * (total / batch_size)
        slots = self._tree().find(masses)
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
