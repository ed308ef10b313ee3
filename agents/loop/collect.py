"""The two steps of off-policy training, shared by the training loop and the Ape-X learner and actors:
collect one env step into the storage, and learn from one HER batch."""

from __future__ import annotations

from collections.abc import Mapping

import gymnasium as gym
import numpy as np

import her
from ..algos.base import Agent
from her_envs import GoalEnvSpec, VectorStep, check_rewards, split_autoreset, step_info

__all__ = ["choose_action", "choose_behaviour_goals", "collect_step", "learn_step", "normalize_from_episode"]


def choose_action(agent: Agent, obs: dict[str, np.ndarray], spec: GoalEnvSpec, n_envs: int, warmup: bool,
                  rng: np.random.Generator) -> np.ndarray:
    """Uniform random actions in ``[-1, 1]`` during warm-up (the agents' action space, which the env layer maps
    onto the env's bounds), else the agent's exploring action; float32 [n_envs, action_dim]."""
    if warmup:
        return rng.uniform(-1.0, 1.0, (n_envs, spec.action_dim)).astype(np.float32)
    return agent.act(obs["observation"], obs["desired_goal"], deterministic=False)


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
    next_obs, reward, terminated, truncated, infos = env.step(action)
    step = split_autoreset(next_obs, terminated, truncated, infos)
    check_rewards(reward, reward_range, env_id)
    info = step_info(infos, step.done, info_shapes)
    stored = writer.add(obs, action, reward, step.real_next_obs, terminated, truncated, info)
    return next_obs, step, stored


def learn_step(agent: Agent, replay: her.HerReplayBuffer, batch_size: int, metrics: dict[str, list[float]]) -> None:
    """Sample a batch, update the agent, feed its TD errors back to the sampler (prioritized replay) and append
    the scalar metrics to ``metrics``."""
    batch = replay.sample(batch_size)
    m = agent.update(batch)
    if replay.prioritized:  # a uniform buffer refuses priorities
        replay.update_priorities(batch.index, m["td_error"])
    for k, v in m.items():
        if k != "td_error":
            metrics.setdefault(k, []).append(float(v))


def normalize_from_episode(agent: Agent, replay: her.HerReplayBuffer, start: int, T: int, relabeled: bool = True
                           ) -> None:
    """Feed the agent's normalizers the observations and goals of a newly stored episode: with ``relabeled``,
    a HER-relabeled batch of its transitions (openai/baselines, so goal statistics include relabeled goals),
    else the stored desired goals."""
    slots = (start + np.arange(T)) % replay.storage.n_slots
    if relabeled:
        b = replay.batch_from_slots(slots)
        agent.update_normalizer(b.observation, b.desired_goal)
    else:
        agent.update_normalizer(replay.storage.observation[slots], replay.storage.desired_goal[slots])


def choose_behaviour_goals(agent: Agent, replay: her.HerReplayBuffer, env: gym.vector.VectorEnv,
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
