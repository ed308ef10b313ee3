"""Goal relabeling: which goal each sampled transition gets (Andrychowicz et al. 2017, "Hindsight Experience
Replay", Sec. 3.3 and 4.5). Semantics: ``docs/semantics.md``.

For a transition ``t`` of an episode with ``T`` transitions and achieved goals ``ag_0..ag_T``, with
probability ``k / (k + 1)`` (``k = n_sampled_goal``) the desired goal is replaced by:

- ``future`` ([`FutureGoals`][her.relabel.FutureGoals]): ``ag_{t'}``, ``t'`` uniform in ``{t+1, ..., T}`` (the
  state right after the
  transition counts);
- ``final`` ([`FinalGoal`][her.relabel.FinalGoal]): ``ag_T``;
- ``episode`` ([`EpisodeGoals`][her.relabel.EpisodeGoals]): ``ag_{t'}``, ``t'`` uniform in ``{1, ..., T}``;
- ``mixed`` ([`MixedGoals`][her.relabel.MixedGoals]): a share ``other_desired_fraction`` (f) of the relabeled
  transitions gets the
  desired goal of a stored state drawn uniformly over the live states (another episode's goal, or with
  probability about ``1 / n_episodes`` its own), the rest ``future``. With k = 4 and f = 0.5: 40% future, 40%
  other episodes' desired goals, 20% the real goal. This is the "futureactual" relabeling of Pitis et al.'s mrl
  (``mrl/modules/replay/her_relabel``; Pitis et al. 2020, "Maximum Entropy Gain Exploration for Long Horizon
  Multi-goal Reinforcement Learning", Sec. 5): desired goals teach the critic about the goals the task will ask
  for, not only those the policy happens to reach.

[`NoRelabel`][her.relabel.NoRelabel] keeps every stored goal. Relabeling is done at sample time, so the same
stored episode serves
every strategy and ``k``. Any object with the [`Relabeler`][her.relabel.Relabeler] method plugs into
``HerReplayBuffer``.
"""

from __future__ import annotations

import sys
from enum import Enum
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from .storage import EpisodeStorage

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10

    class StrEnum(str, Enum):
        """``enum.StrEnum`` of Python 3.11: members are their strings."""

        def __str__(self) -> str:
            return str(self.value)


__all__ = [
    "EpisodeGoals",
    "FinalGoal",
    "FutureGoals",
    "HindsightRelabeler",
    "MixedGoals",
    "NoRelabel",
    "RelabelStrategy",
    "Relabeler",
    "make_relabeler",
]


@runtime_checkable
class Relabeler(Protocol):
    """Which goal each sampled transition is trained with."""

    def relabel(self, storage: EpisodeStorage, slots: np.ndarray, records: np.ndarray,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Goals for the transitions in ``slots``.

        Args:
            storage: a goal storage (``storage.achieved_goal``, ``storage.desired_goal``: float32 [n_slots, *g]).
            slots: int64 [B] transition slots.
            records: ``storage.gather(slots)``, the storage's records of the slots (fields ``step``, ``length``,
                ``desired_goal``, ... see ``EpisodeStorage``).
            rng: numpy Generator (the buffer's).
        Returns:
            goals: float32 [B, *goal_shape], a fresh array; relabeled: bool [B].
        """
        ...


class RelabelStrategy(StrEnum):
    """The built-in strategies by name, the one spelling of each (``HerReplayBuffer(strategy=...)``,
    [`make_relabeler`][her.relabel.make_relabeler], the training config's ``replay.strategy``). Members are
    their strings:
    ``RelabelStrategy.FUTURE == "future"``; ``list(RelabelStrategy)`` lists them all."""

    FUTURE = "future"
    FINAL = "final"
    EPISODE = "episode"
    MIXED = "mixed"


def _check_k(n_sampled_goal: object) -> int:
    if (isinstance(n_sampled_goal, bool) or not isinstance(n_sampled_goal, (int, float, np.integer, np.floating))
            or int(n_sampled_goal) != n_sampled_goal or n_sampled_goal < 0):
        raise ValueError(f"n_sampled_goal (k) must be an integer >= 0, got {n_sampled_goal!r}")
    return int(n_sampled_goal)


class HindsightRelabeler:
    """Base of the achieved-goal strategies: relabel with probability ``k / (k + 1)``, the goal being the achieved
    goal at the slot [`goal_slots`][her.relabel.HindsightRelabeler.goal_slots] picks.

    Args:
        n_sampled_goal: k >= 0; the relabel probability is ``k / (k + 1)`` (k = 4 gives 0.8). k = 0 disables.

    Raises:
        ValueError: a negative or non-integer k.
    """

    strategy: ClassVar[RelabelStrategy]

    def __init__(self, n_sampled_goal: int = 4) -> None:
        self.n_sampled_goal = _check_k(n_sampled_goal)
        self.relabel_probability = self.n_sampled_goal / (self.n_sampled_goal + 1)

    def goal_slots(self, slots: np.ndarray, records: np.ndarray, u: np.ndarray, next_slots: np.ndarray) -> np.ndarray:
        """int64 [B]: slots (before the ring's modulo) of the achieved goals to use; ``u`` float64 [B] uniform in
        [0, 1), ``next_slots`` = ``slots + 1``."""
        raise NotImplementedError

    def relabel(self, storage: EpisodeStorage, slots: np.ndarray, records: np.ndarray, rng: np.random.Generator,
                next_slots: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """See [`Relabeler`][her.relabel.Relabeler]; ``next_slots`` (``slots + 1``) may be passed if the
        caller has it."""
        u = rng.random((2, len(slots)))
        relabeled = u[0] < self.relabel_probability
        nxt = slots + 1 if next_slots is None else next_slots
        goal_slot = self.goal_slots(slots, records, u[1], nxt)
        mask = relabeled[(slice(None),) + (None,) * len(storage.goal_shape)]  # [B, 1, ...]: broadcasts over goals
        # take(mode="wrap") applies the ring's modulo; np.where returns a fresh array
        goals = np.where(mask, storage.achieved_goal.take(goal_slot, axis=0, mode="wrap"), records["desired_goal"])
        return goals, relabeled

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n_sampled_goal={self.n_sampled_goal})"


class FutureGoals(HindsightRelabeler):
    """``future``: ``ag_{t'}``, ``t'`` uniform in ``{t+1..T}`` (HER paper Sec. 4.5, the strategy it recommends)."""

    strategy = RelabelStrategy.FUTURE

    def goal_slots(self, slots, records, u, next_slots):
        goal_slot = (u * (records["length"] - records["step"])).astype(np.int64)  # t' - t - 1 in {0..T-t-1}
        goal_slot += next_slots
        return goal_slot


class FinalGoal(HindsightRelabeler):
    """``final``: ``ag_T``, the episode's last achieved goal (HER paper Sec. 3.3)."""

    strategy = RelabelStrategy.FINAL

    def goal_slots(self, slots, records, u, next_slots):
        return slots + (records["length"] - records["step"])


class EpisodeGoals(HindsightRelabeler):
    """``episode``: ``ag_{t'}``, ``t'`` uniform in ``{1..T}`` (HER paper Sec. 4.5)."""

    strategy = RelabelStrategy.EPISODE

    def goal_slots(self, slots, records, u, next_slots):
        goal_slot = (u * records["length"]).astype(np.int64)  # t' - 1 in {0..T-1}
        goal_slot += next_slots
        goal_slot -= records["step"]
        return goal_slot


class MixedGoals(FutureGoals):
    """``mixed``: future goals and, for a share ``other_desired_fraction`` of the relabeled transitions, the desired
    goal of a stored state drawn uniformly over the live states (mrl's "futureactual"; see the module docstring).

    Args:
        n_sampled_goal: k >= 0 (relabel probability k / (k + 1)).
        other_desired_fraction: f in [0, 1], the share of relabeled goals drawn from stored desired goals.

    Raises:
        ValueError: a bad k, or f not a number in [0, 1].
    """

    strategy = RelabelStrategy.MIXED

    def __init__(self, n_sampled_goal: int = 4, other_desired_fraction: float = 0.5) -> None:
        super().__init__(n_sampled_goal)
        f = other_desired_fraction
        if isinstance(f, bool) or not isinstance(f, (int, float, np.number)) or not 0.0 <= float(f) <= 1.0:
            raise ValueError(f"other_desired_fraction must be a number in [0, 1], got {f!r}")
        self.other_desired_fraction = float(f)

    def relabel(self, storage, slots, records, rng, next_slots=None):
        goals, relabeled = super().relabel(storage, slots, records, rng, next_slots)
        other = np.flatnonzero(relabeled & (rng.random(len(slots)) < self.other_desired_fraction))
        if other.size:  # desired goals of live states, uniform (the live states are contiguous in the ring)
            draw = (rng.random(other.size) * storage.n_live_states).astype(np.int64)
            draw += storage.oldest_slot
            draw %= storage.n_slots
            # indexing, not take(): desired_goal is a strided field of the records, which take() would first
            # copy whole into a contiguous array
            goals[other] = storage.desired_goal[draw]
        return goals, relabeled

    def __repr__(self) -> str:
        return f"MixedGoals(n_sampled_goal={self.n_sampled_goal}, other_desired_fraction={self.other_desired_fraction})"


class NoRelabel:
    """Keep every stored desired goal (plain replay of a goal-conditioned task)."""

    n_sampled_goal = 0
    relabel_probability = 0.0

    def relabel(self, storage, slots, records, rng, next_slots=None):
        return records["desired_goal"].copy(), np.zeros(len(slots), bool)


_CLASSES: dict[RelabelStrategy, type[HindsightRelabeler]] = {
    c.strategy: c for c in (FutureGoals, FinalGoal, EpisodeGoals, MixedGoals)
}


def make_relabeler(strategy: RelabelStrategy | str = RelabelStrategy.FUTURE, n_sampled_goal: int = 4,
                   other_desired_fraction: float = 0.5) -> HindsightRelabeler:
    """The built-in relabeler of a strategy: ``make_relabeler("future", 4)`` is ``FutureGoals(4)``.

    Args:
        strategy: a [`RelabelStrategy`][her.relabel.RelabelStrategy], or its value "future", "final",
            "episode" or "mixed".
        n_sampled_goal: k >= 0.
        other_desired_fraction: strategy "mixed" only (see [`MixedGoals`][her.relabel.MixedGoals]).

    Raises:
        ValueError: unknown strategy, bad k or fraction.
    """
    try:
        name = RelabelStrategy(strategy)
    except (ValueError, TypeError):
        raise ValueError(f"relabel strategy must be one of {tuple(s.value for s in RelabelStrategy)}, got "
                         f"{strategy!r}") from None
    if name is RelabelStrategy.MIXED:
        return MixedGoals(n_sampled_goal, other_desired_fraction)
    return _CLASSES[name](n_sampled_goal)
