"""A goal env of your own, trained by ``her-train`` without installing anything: a point in the plane that must
reach a goal point.

Importing this module registers ``PointGoal-v0`` with gymnasium; ``her-train`` imports it when the env id names
the module (``module.path:EnvId-v0``, gymnasium's convention), from the Python path or the current directory::

    cd examples && her-train fetch_reach_ddpg env.id=point_goal_env:PointGoal-v0 train.total_env_steps=3000

What HER needs from a goal env (``her_envs.spec_from_env`` checks it at set-up, before training starts):

- a ``Dict`` observation space with 1-D ``Box`` entries ``observation``, ``achieved_goal`` and ``desired_goal``;
- a bounded 1-D ``Box`` action space;
- a *vectorized* ``compute_reward(achieved_goal [B, G], desired_goal [B, G], info) -> [B]``: the replay calls it
  once per batch for relabeled goals;
- optionally a vectorized ``_is_success(achieved_goal, desired_goal) -> [B] bool`` and ``info["is_success"]``
  (the eval success rate), and ``max_episode_steps`` at registration (episodes must end).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class PointGoalEnv(gym.Env):
    """A point at ``x`` in ``[-1, 1]^2`` moves by ``0.1 * action`` per step (``action`` in ``[-1, 1]^2``); the goal
    is another point in the square. Sparse reward: ``0`` within ``distance_threshold`` of the goal, else ``-1``
    (the Fetch convention). Episodes never terminate; ``max_episode_steps`` truncates them."""

    metadata = {"render_modes": []}
    distance_threshold = 0.1
    reward_range = (-1.0, 0.0)

    def __init__(self) -> None:
        box = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float64)
        self.observation_space = gym.spaces.Dict({"observation": box, "achieved_goal": box, "desired_goal": box})
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.position = np.zeros(2)
        self.goal = np.zeros(2)

    def _obs(self) -> dict[str, np.ndarray]:
        return {"observation": self.position.copy(), "achieved_goal": self.position.copy(),
                "desired_goal": self.goal.copy()}

    def _is_success(self, achieved_goal: np.ndarray, desired_goal: np.ndarray) -> np.ndarray:
        return np.linalg.norm(achieved_goal - desired_goal, axis=-1) < self.distance_threshold

    def compute_reward(self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info=None) -> np.ndarray:
        return self._is_success(achieved_goal, desired_goal).astype(np.float32) - 1.0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.position = self.np_random.uniform(-1.0, 1.0, size=2)
        self.goal = self.np_random.uniform(-1.0, 1.0, size=2)
        return self._obs(), {"is_success": False}

    def step(self, action):
        self.position = np.clip(self.position + 0.1 * np.clip(action, -1.0, 1.0), -1.0, 1.0)
        success = bool(self._is_success(self.position, self.goal))
        reward = float(self.compute_reward(self.position, self.goal))
        return self._obs(), reward, False, False, {"is_success": success}


gym.register("PointGoal-v0", entry_point=PointGoalEnv, max_episode_steps=30)
