"""When the loop updates: ``UpdateSchedule`` turns env steps collected into due updates."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["UpdateSchedule"]


@dataclass
class UpdateSchedule:
    """How many updates are due: ``updates_per_step`` per env step collected once ``learning_starts`` env steps
    are and the replay can sample; none are earned before. Fractions carry over (``pending``), so any ratio is
    kept on average; the loop does the due updates in blocks every ``train.update_every`` env steps."""

    updates_per_step: float
    learning_starts: int
    pending: float = 0.0
    """Updates earned and not done yet."""
    can_learn: bool = False
    """Whether the last [`collect`][her_agents.loop.schedule.UpdateSchedule.collect] allowed updates."""

    def collect(self, n_steps: int, env_steps: int, can_sample: bool = True) -> None:
        """Earn the updates of ``n_steps`` new env steps; ``env_steps``: the run's count after them."""
        self.can_learn = env_steps >= self.learning_starts and can_sample
        self.pending = self.pending + n_steps * self.updates_per_step if self.can_learn else 0.0

    def take(self, limit: int | None = None) -> int:
        """The number of whole updates to do now (at most ``limit``), removed from ``pending``."""
        n = int(self.pending) if self.can_learn else 0
        if limit is not None and n > limit:
            n = limit
        self.pending -= n
        return n

    def state_dict(self) -> dict[str, Any]:
        return {"pending": self.pending, "can_learn": self.can_learn}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pending, self.can_learn = float(state["pending"]), bool(state["can_learn"])

