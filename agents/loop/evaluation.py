"""Evaluation: ``evaluate`` (deterministic episodes on a vector env) and ``EvalLog`` (the rows of a run: each
evaluation with the training window's successes, update metrics, env steps/s and wall time)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from ..algos.base import Agent
from ..run.logger import NullLogger, RunLogger
from .collect import check_finite_actions
from her_envs import split_autoreset

if TYPE_CHECKING:
    from .hooks import LoopHooks

__all__ = ["EvalLog", "evaluate"]


def evaluate(agent: Agent, env: gym.vector.VectorEnv, n_episodes: int, seed: int | None = None) -> dict[str, float]:
    """Run ``n_episodes`` deterministic episodes on a vector env (SAME_STEP autoreset).

    Env ``i`` of the ``n`` envs runs its share, ``n_episodes // n`` episodes plus one for ``i < n_episodes % n``,
    and its later episodes are not counted: keeping the first episodes to *finish* instead would over-count
    short episodes when lengths differ. Success is ``info["is_success"]`` at each episode's last step.

    Returns:
        ``success_rate``, ``final_distance`` (mean distance achieved-desired goal at the end, in the goal's units,
        metres for Fetch) and ``return`` (mean undiscounted episode return), each a float over the
        ``n_episodes`` episodes.
    """
    obs, _ = env.reset(seed=seed)
    n = env.num_envs
    share = n_episodes // n + (np.arange(n) < n_episodes % n)
    finished = np.zeros(n, np.int64)
    successes: list[float] = []
    distances: list[float] = []
    returns: list[float] = []
    ep_return = np.zeros(n)
    while (finished < share).any():
        action = check_finite_actions(agent, agent.act(obs["observation"], obs["desired_goal"], deterministic=True))
        obs, reward, terminated, truncated, infos = env.step(action)
        ep_return += reward
        step = split_autoreset(obs, terminated, truncated, infos)
        for i in np.flatnonzero(step.done):
            if finished[i] < share[i]:
                successes.append(float(step.is_success[i]))
                ag, dg = step.real_next_obs["achieved_goal"][i], step.real_next_obs["desired_goal"][i]
                distances.append(float(np.linalg.norm(ag - dg)))
                returns.append(float(ep_return[i]))
            finished[i] += 1
            ep_return[i] = 0.0
    return {
        "success_rate": float(np.mean(successes)),
        "final_distance": float(np.mean(distances)),
        "return": float(np.mean(returns)),
    }

class EvalLog:
    """The evaluation rows of a run and what they report of the env steps since the previous evaluation: the
    exploring policy's episode successes (``train_successes``), the updates' scalar metrics
    (``metrics``, the ``metrics`` argument of ``learn_step``), env steps/s and wall time.

    ``counters``: the run's counters (``new_counters``); [`log`][her_agents.loop.evaluation.EvalLog.log] advances
    ``evals`` and ``wall_time``.
    """

    def __init__(self, counters: dict[str, Any]) -> None:
        self.counters = counters
        self.train_successes: list[float] = []
        self.metrics: dict[str, list[float]] = {}
        self.history: list[dict[str, Any]] = []
        self.last_eval: dict[str, float] = {}
        self.start()

    def start(self) -> None:
        """Start the clocks at the counters' ``wall_time`` and ``env_steps`` (once a checkpoint is loaded)."""
        self._wall0, self._t0 = float(self.counters["wall_time"]), time.perf_counter()
        self.start_window()

    def start_window(self) -> None:
        """Start measuring env steps/s (after an evaluation, so that evaluating is not counted)."""
        self._window_steps, self._window_t = int(self.counters["env_steps"]), time.perf_counter()

    def wall_time(self) -> float:
        """Seconds of training so far, over all resumes; also stored in ``counters["wall_time"]``."""
        self.counters["wall_time"] = self._wall0 + time.perf_counter() - self._t0
        return self.counters["wall_time"]

    def log(self, agent: Agent, eval_env: gym.vector.VectorEnv, n_episodes: int, logger: RunLogger | NullLogger,
            hooks: LoopHooks, extras: dict[str, Any] | None = None) -> dict[str, Any]:
        """Evaluate ``n_episodes`` episodes, log the row (``logger.log``) and clear the window's successes and
        metrics. Returns the row: counters, ``eval/*``, ``train/success_rate``, ``train/<metric>`` means,
        ``env_steps_per_s``, then ``extras`` and ``hooks.row_extras``."""
        c = self.counters
        now = time.perf_counter()
        ev = hooks.average_eval(evaluate(agent, eval_env, n_episodes))
        c["evals"] += 1
        row = {
            "env_steps": c["env_steps"], "episodes": c["episodes"], "updates": c["updates"],
            "wall_time": round(self.wall_time(), 2), "eval/success_rate": ev["success_rate"],
            "eval/final_distance": ev["final_distance"], "eval/return": ev["return"],
            "train/success_rate": float(np.mean(self.train_successes)) if self.train_successes else float("nan"),
            "env_steps_per_s": (c["env_steps"] - self._window_steps) / max(now - self._window_t, 1e-9),
        }
        row.update({f"train/{k}": float(np.mean(v)) for k, v in self.metrics.items()})
        row.update(extras or {})
        row.update(hooks.row_extras(row))
        logger.log(row, step=c["env_steps"])
        self.history.append(row)
        self.last_eval = ev
        self.train_successes.clear()  # in place: the loop holds these lists
        self.metrics.clear()
        return row

    def state_dict(self) -> dict[str, Any]:
        """The window's successes and metrics (empty right after an evaluation)."""
        return {"train_successes": list(self.train_successes),
                "metrics": {k: list(v) for k, v in self.metrics.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.train_successes[:] = state["train_successes"]
        self.metrics.clear()
        self.metrics.update({k: list(v) for k, v in state["metrics"].items()})

