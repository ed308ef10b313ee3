"""Behaviour goals: which goal a training episode pursues (relabeling decides which goal a stored transition is
learned with; this decides what the agent tries while collecting).

``MinDensityGoals`` is the goal choice of Maximum Entropy Gain Exploration (MEGA; Pitis, Chan, Zhao, Stadie & Ba
2020, "Maximum Entropy Gain Exploration for Long Horizon Multi-goal Reinforcement Learning", Sec. 4 and Alg. 1):
at the start of an episode, pursue the achieved goal of lowest estimated density among the stored ones the agent
believes it can reach, so that the frontier of what has been achieved (a box that went up a few centimetres) is
practised again instead of left to chance.
"""

from __future__ import annotations

import math
import numbers
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from ._util import check_real
from .storage import EpisodeStorage, check_is_storage

__all__ = ["MinDensityGoals", "ValueFn"]

ValueFn = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""``value_fn(observation [N, *obs_shape], desired_goal [N, *goal_shape]) -> float [N]``: the agent's value of
pursuing each goal from each observation (e.g. ``Q(s, pi(s, g), g)``)."""


def _count(value: object, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


class MinDensityGoals:
    """MEGA's behaviour goal (Pitis et al. 2020, Sec. 4.2, Eq. 4 and Alg. 1): the stored achieved goal of lowest
    density among those whose value clears a cutoff.

    For each episode that starts ([`select`][her.goals.MinDensityGoals.select]): ``n_candidates`` achieved
    goals are drawn uniformly from the
    stored transitions' states; their density is a Gaussian kernel density estimate over ``n_fit`` other stored
    achieved goals, standardized by that sample's mean and standard deviation (kernel width ``bandwidth``); with a
    ``value_fn``, candidates whose value from the episode's first observation is below ``cutoff`` are dropped
    (MEGA's Q cutoff: goals the agent cannot reach yet are no use to practise), and the rarest of the rest is the
    behaviour goal (when none clears the cutoff, the candidate of highest value).

    With ``desired_support`` > 0, the candidates inside the support of the env's own desired goals (those
    [`observe_desired`][her.goals.MinDensityGoals.observe_desired] was given) come first: a candidate within
    ``desired_support`` of one of them, both
    standardized by the desired goals' mean and standard deviation (a top-hat kernel, as OMEGA's desired-goal
    density in Pitis et al. 2020, Sec. 5); the rest only where no viable candidate is inside. Achieved goals
    the task never asks for (an object knocked off the table) are then not practised for being rare.

    The cutoff adapts as MEGA's does ([`record`][her.goals.MinDensityGoals.record]): over the last ``window``
    behaviour-goal episodes, a
    success rate >= ``success_band[1]`` lowers it by 1 (reach further), <= ``success_band[0]`` raises it by 1,
    within ``[min_cutoff, initial_cutoff]``.

    Args:
        n_candidates: achieved goals drawn per episode (>= 1; MEGA 500).
        n_fit: stored achieved goals the density is estimated from at each call (>= 1).
        bandwidth: kernel width on standardized goals (> 0; MEGA 0.1).
        initial_cutoff: the cutoff to start from and its largest value (a value: with rewards -1 / 0, minus
            the expected steps to the goal, roughly; MEGA -3).
        min_cutoff: its smallest value (<= ``initial_cutoff``; MEGA ``-(1 - gamma^(0.8 T)) / (1 - gamma)``,
            [`min_cutoff_for`][her.goals.MinDensityGoals.min_cutoff_for]).
        window: behaviour-goal episodes the success rate is taken over (>= 1; MEGA 10).
        success_band: ``(low, high)`` success rates, ``0 <= low <= high <= 1`` (MEGA ``(0.3, 0.7)``).
        desired_support: radius (>= 0; 0: off) of the desired-goal support, in standard deviations of the
            desired goals.
        n_desired: env desired goals kept for it (>= 1; the most recent).

    Raises:
        ValueError / TypeError: a setting out of its range, naming it.
    """

    def __init__(self, n_candidates: int = 500, n_fit: int = 2000, bandwidth: float = 0.1,
                 initial_cutoff: float = -3.0, min_cutoff: float = -27.7, window: int = 10,
                 success_band: tuple[float, float] = (0.3, 0.7), desired_support: float = 0.0,
                 n_desired: int = 10_000) -> None:
        self.n_candidates = _count(n_candidates, "n_candidates")
        self.n_fit = _count(n_fit, "n_fit")
        self.bandwidth = check_real("bandwidth", bandwidth, "a finite number > 0", 0.0, math.inf, True, True)
        self.initial_cutoff = check_real("initial_cutoff", initial_cutoff, "a finite number", -math.inf, math.inf,
                                         True, True)
        self.min_cutoff = check_real("min_cutoff", min_cutoff, f"a finite number <= initial_cutoff "
                                     f"({self.initial_cutoff})", -math.inf, self.initial_cutoff, True)
        self.window = _count(window, "window")
        if not (isinstance(success_band, (tuple, list)) and len(success_band) == 2):
            raise ValueError(f"success_band must be (low, high), got {success_band!r}")
        low = check_real("success_band[0]", success_band[0], "a number in [0, 1]", 0.0, 1.0)
        high = check_real("success_band[1]", success_band[1], f"a number in [{low}, 1]", low, 1.0)
        self.success_band = (low, high)
        self.desired_support = check_real("desired_support", desired_support, "a finite number >= 0", 0.0, math.inf,
                                          False, True)
        self.n_desired = _count(n_desired, "n_desired")
        self.cutoff = self.initial_cutoff
        self._outcomes: deque[float] = deque(maxlen=self.window)
        self._desired: np.ndarray | None = None  # the kept env desired goals [K, D], the newest last

    @staticmethod
    def min_cutoff_for(gamma: float, max_episode_steps: int) -> float:
        """MEGA's lowest cutoff: the value of a goal reached after 80% of an episode of -1 rewards,
        ``-(1 - gamma^(0.8 T)) / (1 - gamma)`` (``-0.8 T`` at ``gamma = 1``)."""
        check_real("gamma", gamma, "a number in (0, 1]", 0.0, 1.0, True)
        steps = 0.8 * _count(max_episode_steps, "max_episode_steps")
        return -steps if gamma == 1.0 else -(1.0 - gamma ** steps) / (1.0 - gamma)

    def observe_desired(self, desired_goal: np.ndarray) -> None:
        """Keep the env's own desired goals ``[K, *goal_shape]`` (before any is replaced) for ``desired_support``;
        the most recent ``n_desired`` are kept."""
        g = np.asarray(desired_goal, np.float32)
        if g.size == 0:
            return
        g = g.reshape(g.shape[0], -1)
        kept = g if self._desired is None else np.concatenate([self._desired, g])
        self._desired = kept[-self.n_desired:].copy()

    def select(self, storage: EpisodeStorage, observation: np.ndarray, rng: np.random.Generator,
               value_fn: ValueFn | None = None) -> np.ndarray | None:
        """Behaviour goals for the episodes starting at ``observation``.

        Args:
            storage: a goal storage (``goal_shape`` set); its stored transitions' achieved goals are the pool.
            observation: float ``[N, *observation_shape]``, the first observation of each episode.
            rng: the numpy Generator the candidates are drawn with.
            value_fn: see [`ValueFn`][her.goals.ValueFn]; None: no cutoff (the rarest candidate).

        Returns:
            float32 ``[N, *goal_shape]``, or None while the storage holds no transition.

        Raises:
            ValueError: a storage without goals, an observation of another shape, or a ``value_fn`` that does
                not return ``N * n_candidates`` finite values.
        """
        check_is_storage(storage)
        if not storage.has_goals:
            raise ValueError("MinDensityGoals needs a goal storage (goal_shape set)")
        observation = np.asarray(observation, np.float32)
        if observation.shape[1:] != storage.observation_shape or observation.ndim < 2:
            raise ValueError(f"observation must be [N, *{storage.observation_shape}], got shape {observation.shape}")
        pool = np.flatnonzero(storage.sampleable)
        if pool.size == 0:
            return None
        n, m = observation.shape[0], self.n_candidates
        goals = storage.achieved_goal
        candidates = goals[pool[rng.integers(pool.size, size=n * m)]].reshape(n * m, -1)
        fit = goals[pool[rng.integers(pool.size, size=self.n_fit)]].reshape(self.n_fit, -1).astype(np.float64)
        mean, std = fit.mean(0), fit.std(0) + 1e-4  # +1e-4: a coordinate that never moved
        log_density = _log_kde((candidates - mean) / std, (fit - mean) / std, self.bandwidth).reshape(n, m)
        score = log_density  # lower is chosen
        if value_fn is not None:
            states = np.repeat(observation, m, axis=0)
            value = np.asarray(value_fn(states, candidates.reshape(n * m, *storage.goal_shape)), np.float64)
            if value.shape != (n * m,) or not np.isfinite(value).all():
                raise ValueError(f"value_fn must return {n * m} finite values, got shape {value.shape}"
                                 + ("" if value.shape != (n * m,) else " with NaN or inf"))
            value = value.reshape(n, m)
            viable = value >= self.cutoff
        else:
            value, viable = np.zeros((n, m)), np.ones((n, m), bool)
        if self.desired_support > 0 and self._desired is not None:
            inside = self._in_desired_support(candidates).reshape(n, m)
            first = viable & inside
            viable = np.where(first.any(1, keepdims=True), first, viable)
        # rarest viable candidate; where none is viable, the one of highest value
        score = np.where(viable, log_density, np.inf)
        score[~viable.any(1)] = -value[~viable.any(1)]
        pick = score.argmin(1)
        chosen = candidates.reshape(n, m, -1)[np.arange(n), pick]
        return chosen.reshape(n, *storage.goal_shape).astype(np.float32, copy=False)

    def record(self, success: np.ndarray) -> None:
        """The outcomes (bool ``[K]``) of behaviour-goal episodes that ended; adapts ``cutoff``."""
        for s in np.asarray(success, bool).reshape(-1):
            self._outcomes.append(float(s))
            if len(self._outcomes) < self.window:
                continue
            rate = sum(self._outcomes) / self.window
            if rate >= self.success_band[1]:
                self.cutoff = max(self.min_cutoff, self.cutoff - 1.0)
                self._outcomes.clear()
            elif rate <= self.success_band[0]:
                self.cutoff = min(self.initial_cutoff, self.cutoff + 1.0)
                self._outcomes.clear()

    def _in_desired_support(self, candidates: np.ndarray) -> np.ndarray:
        """bool [M]: candidates ``[M, D]`` within ``desired_support`` standard deviations of a kept desired goal."""
        desired = self._desired.astype(np.float64)
        mean, std = desired.mean(0), desired.std(0) + 1e-4
        x, d = (candidates - mean) / std, (desired - mean) / std
        inside = np.zeros(len(x), bool)
        for i in range(0, len(x), 512):  # [512, K] distances at a time
            c = x[i:i + 512]
            sq = (c * c).sum(1)[:, None] + (d * d).sum(1)[None, :] - 2.0 * c @ d.T
            inside[i:i + 512] = sq.min(1) <= self.desired_support ** 2
        return inside

    def state_dict(self) -> dict[str, Any]:
        """The adaptive part (cutoff, recent outcomes, kept desired goals), for checkpoints."""
        return {"cutoff": self.cutoff, "outcomes": list(self._outcomes),
                "desired": self._desired.copy() if self._desired is not None else np.zeros((0, 0), np.float32)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cutoff = float(np.clip(state["cutoff"], self.min_cutoff, self.initial_cutoff))
        self._outcomes = deque((float(v) for v in state["outcomes"]), maxlen=self.window)
        desired = np.asarray(state.get("desired", np.zeros((0, 0))), np.float32)
        self._desired = desired[-self.n_desired:].copy() if desired.size else None


def _log_kde(x: np.ndarray, data: np.ndarray, bandwidth: float) -> np.ndarray:
    """Log of a Gaussian kernel density estimate at ``x [M, D]`` from ``data [F, D]``, up to a constant (which
    does not change an argmin), float64 [M]. Points of ``data`` equal to the evaluated one are left out (a
    candidate drawn into the fitted sample too would otherwise look as dense as a cluster); ``-inf`` where
    nothing else is left."""
    sq = (x * x).sum(1)[:, None] + (data * data).sum(1)[None, :] - 2.0 * x @ data.T  # [M, F]
    same = sq <= 1e-9 * (1.0 + (x * x).sum(1)[:, None])  # equal up to the rounding of the expansion above
    z = np.where(same, -np.inf, -np.maximum(sq, 0.0) / (2.0 * bandwidth * bandwidth))
    top = z.max(1, keepdims=True)
    finite = np.isfinite(top[:, 0])
    out = np.full(len(x), -np.inf)
    out[finite] = (top[finite] + np.log(np.exp(z[finite] - top[finite]).sum(1, keepdims=True)))[:, 0]
    return out
