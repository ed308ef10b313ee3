"""Goal relabeling: which goal each sampled transition gets (Andrychowicz et al. 2017, "Hindsight Experience
Replay", Sec. 3.3 and 4.5).

For a transition ``t`` of an episode with ``T`` transitions and achieved goals ``ag_0..ag_T``, with
probability ``k / (k + 1)`` (``k = n_sampled_goal``) the desired goal is replaced by:

- ``future``:  ``ag_{t'}``, ``t'`` uniform in ``{t+1, ..., T}`` (the state right after the transition counts);
- ``final``:   ``ag_T``;
- ``episode``: ``ag_{t'}``, ``t'`` uniform in ``{1, ..., T}``;
- ``mixed``:   a share ``other_desired_fraction`` (f) of the relabeled transitions gets the desired goal of a stored
  state drawn uniformly over the live states (another episode's goal, or with probability about
  ``1 / n_episodes`` its own), the rest ``future``. With k = 4 and f = 0.5: 40% future, 40% other episodes'
  desired goals, 20% the real goal. This is the "futureactual" relabeling of Pitis et al.'s mrl
  (``mrl/modules/replay/her_relabel``; Pitis et al. 2020, "Maximum Entropy Gain Exploration for Long Horizon
  Multi-goal Reinforcement Learning", Sec. 5): desired goals teach the critic about the goals the task will ask
  for, not only those the policy happens to reach.

Relabeling is done at sample time, so the same stored episode serves every strategy and ``k``.
"""

from __future__ import annotations

import numpy as np

from .storage import EpisodeStorage

__all__ = ["STRATEGIES", "GoalRelabeler"]

STRATEGIES = ("future", "final", "episode", "mixed")


class GoalRelabeler:
    """Replace desired goals of sampled transitions by achieved goals of the same episode.

    Args:
        strategy: "future", "final", "episode" or "mixed".
        n_sampled_goal: k >= 0; the relabel probability is ``k / (k + 1)`` (k = 4 gives 0.8). k = 0 disables.
        other_desired_fraction: f in [0, 1], strategy "mixed" only: the share of relabeled goals taken from
            the desired goals of stored states (other episodes'), the rest are ``future`` goals.

    Raises:
        ValueError: unknown strategy, a negative / non-integer k, or f outside [0, 1].
    """

    def __init__(self, strategy: str = "future", n_sampled_goal: int = 4, other_desired_fraction: float = 0.5) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"relabel strategy must be one of {STRATEGIES}, got {strategy!r}")
        if isinstance(n_sampled_goal, bool) or int(n_sampled_goal) != n_sampled_goal or n_sampled_goal < 0:
            raise ValueError(f"n_sampled_goal (k) must be an integer >= 0, got {n_sampled_goal!r}")
        if isinstance(other_desired_fraction, bool) or not 0.0 <= float(other_desired_fraction) <= 1.0:
            raise ValueError(f"other_desired_fraction must be a number in [0, 1], got {other_desired_fraction!r}")
        self.strategy = strategy
        self.n_sampled_goal = int(n_sampled_goal)
        self.relabel_probability = self.n_sampled_goal / (self.n_sampled_goal + 1)
        self.other_desired_fraction = float(other_desired_fraction)

    def relabel(
        self,
        storage: EpisodeStorage,
        slots: np.ndarray,
        records: np.ndarray,
        rng: np.random.Generator,
        next_slots: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Goals for the transitions in ``slots``.

        Args:
            storage: a goal storage.
            slots: int64 [B] transition slots.
            records: ``storage.data.take(slots)`` (their step ``t``, length ``T`` and desired goal are used).
            rng: numpy Generator.
            next_slots: ``slots + 1`` if the caller has it (saves an array operation).
        Returns:
            goals: float32 [B, *goal_shape] (the stored desired goal where not relabeled); relabeled: bool [B].
        """
        u = rng.random((3 if self.strategy == "mixed" else 2, len(slots)))
        relabeled = u[0] < self.relabel_probability
        t, T = records["step"], records["length"]
        nxt = slots + 1 if next_slots is None else next_slots
        # goal_slot = slot of ag_{t'} = slots + 1 + (t' - t - 1); take(mode="wrap") applies the ring's modulo
        if self.strategy in ("future", "mixed"):
            goal_slot = (u[1] * (T - t)).astype(np.int64)  # t' - t - 1 uniform in {0..T-t-1}
            goal_slot += nxt
        elif self.strategy == "final":
            goal_slot = slots + (T - t)
        else:
            goal_slot = (u[1] * T).astype(np.int64)  # t' - 1 uniform in {0..T-1}
            goal_slot += nxt
            goal_slot -= t
        mask = relabeled[(slice(None),) + (None,) * len(storage.goal_shape)]  # [B, 1, ...]: broadcasts over goals
        goals = np.where(mask, storage.achieved_goal.take(goal_slot, axis=0, mode="wrap"), records["desired_goal"])
        if self.strategy == "mixed":
            other = np.flatnonzero(relabeled & (u[2] < self.other_desired_fraction))
            if other.size:  # desired goals of live states, uniform (the live states are contiguous in the ring)
                draw = (rng.random(other.size) * storage.n_live_states).astype(np.int64)
                draw += storage.oldest_slot
                goals[other] = storage.desired_goal.take(draw, axis=0, mode="wrap")
        return goals, relabeled
