"""The two steps of off-policy training, shared by the training loop and the Ape-X learner and actors:
collect one env step into the storage, and learn from one HER batch."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import cast

import gymnasium as gym
import numpy as np

import her
from ..algos.base import Agent
from her_envs import GoalEnvSpec, VectorStep, check_rewards, split_autoreset, step_info

__all__ = ["DIVERGED_Q_FACTOR", "MadeVectorEnv", "NetworksDiverged", "check_finite_actions", "choose_action", "choose_behaviour_goals", "collect_step",
           "learn_step", "normalize_from_episode", "store_step"]


MadeVectorEnv = gym.vector.SyncVectorEnv | gym.vector.AsyncVectorEnv
"""The vector envs ``her_envs.make_vector_env`` builds; the loop reads and sets their sub-envs' attributes
(``get_attr``, ``set_attr``), which gymnasium's ``VectorEnv`` base does not have."""

DIVERGED_Q_FACTOR = 1000.0
"""A critic whose mean Q is this many times farther from zero than the largest return the env allows
(``agent.q_clip``) has diverged: a healthy one overshoots that range by a fraction of it."""


class NetworksDiverged(FloatingPointError):
    """An update's loss, or the policy's action, is not finite: the networks diverged (most often a learning rate
    far too large), and training on would only store NaN actions and weights.

    Attributes: ``what`` (e.g. ``"critic_loss is nan"``), ``updates`` (the agent's update count then).
    """

    def __init__(self, what: str, updates: int) -> None:
        self.what, self.updates = what, updates
        super().__init__(f"the networks diverged ({what} after {updates} update{'' if updates == 1 else 's'})")


def check_finite_actions(agent: Agent, action: np.ndarray) -> np.ndarray:
    """``action`` itself; raises ``NetworksDiverged`` when an entry is NaN or infinite."""
    if not np.isfinite(action).all():
        raise NetworksDiverged("the policy's action is " + ("nan" if np.isnan(action).any() else "inf"),
                               int(agent.num_updates))
    return action


def choose_action(agent: Agent, obs: dict[str, np.ndarray], spec: GoalEnvSpec, n_envs: int, warmup: bool,
                  rng: np.random.Generator) -> np.ndarray:
    """Uniform random actions in ``[-1, 1]`` during warm-up (the agents' action space, which the env layer maps
    onto the env's bounds), else the agent's exploring action; float32 [n_envs, action_dim]."""
    if warmup:
        return rng.uniform(-1.0, 1.0, (n_envs, spec.action_dim)).astype(np.float32)
    return check_finite_actions(agent, agent.act(obs["observation"], obs["desired_goal"], deterministic=False))


def collect_step(env: gym.vector.VectorEnv, obs: dict[str, np.ndarray], action: np.ndarray,
                 writer: her.EpisodeWriter | her.HerReplayBuffer,
                 info_shapes: Mapping[str, tuple[int, ...]], reward_range: tuple[float, float] | None = None,
                 env_id: str = "the env") -> tuple[dict[str, np.ndarray], VectorStep, list[tuple[int, int]]]:
    """Step a SAME_STEP-autoreset vector env and store the transition of every env.

    The stored next state is the real one (``final_obs`` where an episode ended), never the reset observation;
    the stored info entries (``info_shapes``: ``{key: shape}``, any shape) are the step's own, from
    ``final_info`` where an episode ended. ``action``: float32 ``[n_envs, action_dim]`` in ``[-1, 1]``, stored
    as given. With ``reward_range``, an env reward outside it raises ``ValueError`` (see ``her_envs.check_rewards``).

    Returns:
        the next observation to act on, the ``VectorStep`` (real next obs, success, done) and the
        ``(start slot, T)`` of each episode the writer completed (in its storage).
    """
    return store_step(env.step(action), obs, action, writer, info_shapes, reward_range, env_id)


def store_step(result: tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray, dict],
               obs: dict[str, np.ndarray], action: np.ndarray, writer: her.EpisodeWriter | her.HerReplayBuffer,
               info_shapes: Mapping[str, tuple[int, ...]], reward_range: tuple[float, float] | None = None,
               env_id: str = "the env") -> tuple[dict[str, np.ndarray], VectorStep, list[tuple[int, int]]]:
    """The storing half of [`collect_step`][her_agents.loop.collect.collect_step]: ``result`` is what the
    vector env's ``step(action)`` (or ``step_wait()`` after ``step_async(action)``) returned from ``obs``;
    the arguments and what is returned are ``collect_step``'s."""
    next_obs, reward, terminated, truncated, infos = result
    step = split_autoreset(next_obs, terminated, truncated, infos)
    check_rewards(reward, reward_range, env_id)
    info = step_info(infos, step.done, info_shapes)
    stored = writer.add(obs, action, reward, step.real_next_obs, terminated, truncated, info)
    return next_obs, step, stored


def learn_step(agent: Agent, replay: her.HerReplayBuffer, batch_size: int, metrics: dict[str, list[float]]) -> None:
    """Sample a batch, update the agent, feed its TD errors back to the sampler (prioritized replay) and append
    the scalar metrics to ``metrics``.

    Raises:
        NetworksDiverged: a metric (a loss, ``q_mean``...) is NaN or infinite, or ``q_mean`` lies
            ``DIVERGED_Q_FACTOR`` times farther from zero than the returns' range ``agent.config.q_clip``
            allows; checked on the values read back anyway, before the TD errors reach the sampler.
    """
    batch = replay.sample(batch_size)
    m = agent.update(batch)
    values = {k: float(v) for k, v in m.items() if k != "td_error"}
    for k, v in values.items():
        if not math.isfinite(v):
            raise NetworksDiverged(f"{k} is {v}", int(agent.num_updates))
    q_clip = getattr(getattr(agent, "config", None), "q_clip", None)
    if q_clip is not None and "q_mean" in values:
        lo, hi = float(q_clip[0]), float(q_clip[1])
        if abs(values["q_mean"]) > DIVERGED_Q_FACTOR * max(abs(lo), abs(hi), 1.0):
            raise NetworksDiverged(f"q_mean is {values['q_mean']:.3g} where the returns lie in [{lo:g}, {hi:g}]",
                                   int(agent.num_updates))
    if replay.prioritized:  # a uniform buffer refuses priorities
        replay.update_priorities(batch.index, cast(np.ndarray, m["td_error"]))
    for k, v in values.items():
        metrics.setdefault(k, []).append(v)


def normalize_from_episode(agent: Agent, replay: her.HerReplayBuffer, start: int, T: int, relabeled: bool = True
                           ) -> None:
    """Feed the agent's normalizers the observations and goals of a newly stored episode: with ``relabeled``,
    a HER-relabeled batch of its transitions (openai/baselines, so goal statistics include relabeled goals),
    else the stored desired goals."""
    slots = (start + np.arange(T)) % replay.storage.n_slots
    if relabeled:
        b = replay.batch_from_slots(slots)
        assert b.desired_goal is not None, "the loop's storages hold goals"
        agent.update_normalizer(b.observation, b.desired_goal)
    else:
        desired_goal = replay.storage.desired_goal
        assert desired_goal is not None, "the loop's storages hold goals"
        agent.update_normalizer(replay.storage.observation[slots], desired_goal[slots])


def choose_behaviour_goals(agent: Agent, replay: her.HerReplayBuffer, env: MadeVectorEnv,
                           obs: dict[str, np.ndarray], starting: np.ndarray, share: float,
                           goals: her.MinDensityGoals, rng: np.random.Generator) -> np.ndarray:
    """Give a behaviour goal (``goals.select``, the agent's [`value`][her_agents.algos.base.Agent.value] as
    its cutoff) to each env of bool mask
    ``starting [n_envs]`` (its episode just began at ``obs``) with probability ``share`` (all of their env goals go
    to ``goals.observe_desired`` first): the env pursues it
    (``her_envs.BehaviourGoal``) and ``obs["desired_goal"]`` is updated in place. Returns the bool mask
    ``[n_envs]`` of the envs given one (none while the replay is empty)."""
    given = np.zeros(len(starting), bool)
    envs = np.flatnonzero(starting)
    goals.observe_desired(obs["desired_goal"][envs])  # the env's own goals, before any is replaced
    envs = envs[rng.random(envs.size) < share]
    if envs.size == 0:
        return given
    chosen = goals.select(replay.storage, obs["observation"][envs], rng, agent.value)
    if chosen is None:
        return given
    values: list[np.ndarray | None] = [None] * len(starting)
    for i, g in zip(envs, chosen):
        values[i] = g
    env.set_attr("behaviour_goal", values)
    obs["desired_goal"][envs] = chosen
    given[envs] = True
    return given
