"""The two steps of off-policy training, shared by the training loop and the Ape-X learner and actors:
collect one env step into the storage, and learn from one HER batch."""

from __future__ import annotations

from typing import Any

import numpy as np

from envs import VectorStep, split_autoreset

__all__ = ["choose_action", "collect_step", "learn_step", "normalize_from_episode"]


def choose_action(agent: Any, obs: dict[str, np.ndarray], spec: Any, n_envs: int, warmup: bool,
                  rng: np.random.Generator) -> np.ndarray:
    """Uniform random actions during warm-up, else the agent's exploring action; float32 [n_envs, action_dim]."""
    if warmup:
        return rng.uniform(spec.action_low, spec.action_high, (n_envs, spec.action_dim)).astype(np.float32)
    return agent.act(obs["observation"], obs["desired_goal"], deterministic=False)


def collect_step(env: Any, obs: dict[str, np.ndarray], action: np.ndarray, storage: Any,
                 info_keys: tuple[str, ...]) -> tuple[dict[str, np.ndarray], VectorStep, list[tuple[int, int]]]:
    """Step a SAME_STEP-autoreset vector env and store the transition of every env.

    The stored next state is the real one (``final_obs`` where an episode ended), never the reset observation.

    Returns:
        the next observation to act on, the ``VectorStep`` (real next obs, success, done) and the
        ``(start slot, T)`` of each episode the storage completed.
    """
    next_obs, reward, terminated, truncated, infos = env.step(action)
    step = split_autoreset(next_obs, terminated, truncated, infos)
    info = {k: np.asarray(infos[k], np.float32) for k in info_keys}
    stored = storage.add(obs, action, reward, step.real_next_obs, terminated, truncated, info)
    return next_obs, step, stored


def learn_step(agent: Any, replay: Any, batch_size: int, metrics: dict[str, list[float]]) -> None:
    """Sample a batch, update the agent, feed its TD errors back to the sampler (prioritized replay) and append
    the scalar metrics to ``metrics``."""
    batch = replay.sample(batch_size)
    m = agent.update(batch)
    replay.update_priorities(batch.index, m["td_error"])
    for k, v in m.items():
        if k != "td_error":
            metrics.setdefault(k, []).append(float(v))


def normalize_from_episode(agent: Any, replay: Any, start: int, T: int, relabeled: bool = True) -> None:
    """Feed the agent's normalizers the observations and goals of a newly stored episode: with ``relabeled``,
    a HER-relabeled batch of its transitions (openai/baselines, so goal statistics include relabeled goals),
    else the stored desired goals."""
    slots = (start + np.arange(T)) % replay.storage.n_slots
    if relabeled:
        b = replay.batch_from_slots(slots)
        agent.update_normalizer(b.observation, b.desired_goal)
    else:
        agent.update_normalizer(replay.storage.observation[slots], replay.storage.desired_goal[slots])
