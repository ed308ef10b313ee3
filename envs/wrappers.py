"""Wrappers of the goal envs the package builds, and the action mapping they use.

Every env the package builds (:func:`her_envs.make_env`, so also the vector envs, evaluation and videos) is wrapped
by :func:`wrap_goal_env` so that

- observations are copied on receipt (:class:`CopyObservation`): an env that returns the same arrays every step
  and mutates them in place cannot change an observation already handed out (a stored last state, a
  ``final_obs``);
- the agents act in ``[-1, 1]`` (:class:`NormalizeAction`): actions are mapped affinely to the env's own Box
  bounds (:func:`to_env_action` / :func:`from_env_action`), so the replay holds one action space whatever the
  env's bounds. Unbounded action boxes are refused.

The sub-envs of the training vector envs (:func:`her_envs.make_vector_env`) are also wrapped in
:class:`EpisodeStartRNG` (the RNG state their current episode started from, for checkpoints) and, on request, in
:class:`GraspedStart` (episodes that start with the object in the gripper) and :class:`BehaviourGoal` (the
training loop replaces the goal of an episode that just began).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.utils import seeding

__all__ = [
    "BehaviourGoal", "CopyObservation", "EpisodeStartRNG", "GraspedStart", "NormalizeAction", "from_env_action",
    "to_env_action", "wrap_goal_env",
]


# ---------------------------------------------------------------------------------------------------------
# Actions in [-1, 1] and observations copied on receipt
# ---------------------------------------------------------------------------------------------------------


def to_env_action(action: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Map actions ``[..., A]`` from ``[-1, 1]`` affinely onto ``[low, high]`` (``-1 -> low``, ``1 -> high``).

    Inputs outside ``[-1, 1]`` are clipped first, and the result is clipped to ``[low, high]`` so rounding never
    leaves the box. Returns float64 (cast to the env's dtype where it is used).
    """
    a = np.clip(np.asarray(action, np.float64), -1.0, 1.0)
    low, high = np.asarray(low, np.float64), np.asarray(high, np.float64)
    return np.clip(low + (a + 1.0) * 0.5 * (high - low), low, high)


def from_env_action(action: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """The inverse of :func:`to_env_action`: actions in ``[low, high]`` -> float32 ``[-1, 1]`` (clipped)."""
    a = np.asarray(action, np.float64)
    low, high = np.asarray(low, np.float64), np.asarray(high, np.float64)
    return np.clip(2.0 * (a - low) / (high - low) - 1.0, -1.0, 1.0).astype(np.float32)


class NormalizeAction(gym.ActionWrapper):
    """Expose a bounded Box action space as ``Box(-1, 1)`` float32 and map actions to the env's bounds.

    Raises:
        TypeError: the action space is not a Box with finite bounds (``low < high`` everywhere).
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        _check_action_box(env.action_space, _env_name(env))
        box = env.action_space
        self._low, self._high, self._dtype = box.low, box.high, box.dtype
        self.action_space = gym.spaces.Box(-1.0, 1.0, box.shape, np.float32)

    def action(self, action: np.ndarray) -> np.ndarray:
        return to_env_action(action, self._low, self._high).astype(self._dtype, copy=False)


class CopyObservation(gym.ObservationWrapper):
    """Return a copy of every observation array, so an env that reuses its arrays cannot alter one handed out."""

    def observation(self, observation: Any) -> Any:
        if isinstance(observation, Mapping):
            return {k: np.array(v, copy=True) for k, v in observation.items()}
        return np.array(observation, copy=True)


def _env_name(env: gym.Env) -> str:
    return env.spec.id if env.spec is not None else type(env.unwrapped).__name__


def _check_action_box(space: Any, env_id: str) -> None:
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
        raise TypeError(f"{env_id}: expected a 1-D Box action space, got {space}.")
    low, high = np.asarray(space.low, np.float64), np.asarray(space.high, np.float64)
    if not (np.isfinite(low).all() and np.isfinite(high).all() and (low < high).all()):
        raise TypeError(
            f"{env_id}: the action space must be a Box with finite bounds, low < high (the agents act in [-1, 1] "
            f"and the env layer maps that interval onto the bounds), got low={low.tolist()}, high={high.tolist()}."
        )


def wrap_goal_env(env: gym.Env) -> gym.Env:
    """Wrap an env as the package uses it: observations copied on receipt (:class:`CopyObservation`) and
    actions in ``[-1, 1]`` (:class:`NormalizeAction`; skipped where the bounds already are ``[-1, 1]``)."""
    box = env.action_space
    _check_action_box(box, _env_name(env))
    if not (np.all(box.low == -1.0) and np.all(box.high == 1.0)):
        env = NormalizeAction(env)
    return CopyObservation(env)


# ---------------------------------------------------------------------------------------------------------
# Episode-start wrappers (training vector envs)
# ---------------------------------------------------------------------------------------------------------


def _is_fetch(unwrapped: Any) -> bool:
    return type(unwrapped).__module__.startswith("gymnasium_robotics.envs.fetch") and hasattr(
        unwrapped, "distance_threshold"
    )


class EpisodeStartRNG(gym.Wrapper):
    """Keeps the state of the env's ``np_random`` from just before its last ``reset`` drew anything:
    ``episode_start_rng``, a numpy bit-generator state dict (``None`` before the first reset).

    An env whose RNG is set back to that state redoes the reset that began its current episode on its next
    ``reset()`` (same initial state and goal, and the same RNG state after it). Under SAME_STEP autoreset the
    reset of the next episode happens inside the step that ends an episode, so this is the state a checkpoint
    taken between episodes saves for the training envs (:func:`vector_rng_states`).
    """

    episode_start_rng: dict[str, Any] | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        # a seeded reset seeds first, as gymnasium.Env.reset does: keep the state that seeding gives
        rng = seeding.np_random(seed)[0] if seed is not None else self.env.np_random
        self.episode_start_rng = rng.bit_generator.state
        return self.env.reset(seed=seed, options=options)


class GraspedStart(gym.Wrapper):
    """Start a share of the episodes with the object already held in the gripper (Andrychowicz et al. 2017,
    Hindsight Experience Replay, Sec. 4.1: for pick-and-place, "to make exploration in this task easier we recorded
    a single state in which the box is grasped and start half of the training episodes from this state").

    After the env's own reset (which draws the goal and the object's place on the table), with probability
    ``probability`` (drawn from the env's ``np_random``, so seeded runs repeat and a resumed run redoes it), the
    object is put between the open fingers at the gripper's start position, 10 simulator frames close the
    fingers on it with the arm held still, and the observation is read again. Those frames are not env steps:
    the episode keeps all its steps. Meant for training envs only; evaluate on the plain env.

    For gymnasium-robotics MuJoCo Fetch envs with an object and an unlocked gripper (FetchPickAndPlace).

    Raises:
        ValueError: ``probability`` outside [0, 1], or an env without an object or with a locked gripper.
    """

    _FINGERS = ("robot0:l_gripper_finger_joint", "robot0:r_gripper_finger_joint")
    _SETTLE_FRAMES = 10  # simulator frames of n_substeps each: enough for the fingers to close on the box

    def __init__(self, env: gym.Env, probability: float = 0.5) -> None:
        super().__init__(env)
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"grasped start probability must be in [0, 1], got {probability!r}")
        u = env.unwrapped
        if not (_is_fetch(u) and getattr(u, "has_object", False) and not getattr(u, "block_gripper", True)):
            raise ValueError(f"a grasped start needs a MuJoCo Fetch env with an object and an unlocked gripper "
                             f"(FetchPickAndPlace), got {_env_name(env)}")
        self.probability = float(probability)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        obs, info = self.env.reset(seed=seed, options=options)
        u = self.env.unwrapped
        p = self.probability  # no draw at 0 or 1: the env's RNG stream stays the plain env's
        if not (p >= 1.0 or (p > 0.0 and u.np_random.random() < p)):
            return obs, info
        utils, model, data = u._utils, u.model, u.data
        box = utils.get_joint_qpos(model, data, "object0:joint").copy()
        box[:3] = utils.get_site_xpos(model, data, "robot0:grip")
        box[3:] = (1.0, 0.0, 0.0, 0.0)
        utils.set_joint_qpos(model, data, "object0:joint", box)
        utils.set_joint_qvel(model, data, "object0:joint", np.zeros(6))
        for joint in self._FINGERS:  # open wider than the 5 cm box, so it does not start inside a finger
            utils.set_joint_qpos(model, data, joint, 0.03)
        u._mujoco.mj_forward(model, data)
        utils.ctrl_set_action(model, data, np.array([0.0, 0.0, 0.0, -1.0]))  # close
        for _ in range(self._SETTLE_FRAMES):
            utils.mocap_set_action(model, data, np.zeros(7))  # hold the arm where it is
            u._mujoco.mj_step(model, data, nstep=u.n_substeps)
        return {k: np.array(v, copy=True) for k, v in u._get_obs().items()}, info


class BehaviourGoal(gym.Wrapper):
    """Lets the training loop replace the desired goal of the episode that just began (behaviour goals, e.g.
    ``her.MinDensityGoals``): setting ``behaviour_goal`` (a goal array; None changes nothing) sets the env's
    ``goal``, which its rewards, ``is_success`` and observations then use until the next reset. Through a vector
    env: ``venv.set_attr("behaviour_goal", [goal or None per env])``.

    For goal envs that keep their goal in ``env.unwrapped.goal`` (gymnasium-robotics: Fetch, hand, maze).
    Set it only right after a reset: the steps already taken were rewarded for the old goal.

    Raises:
        ValueError: an env without a ``goal`` array after reset, or a goal of another shape than the env's.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self._goal_shape: tuple[int, ...] | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        obs, info = self.env.reset(seed=seed, options=options)
        goal = getattr(self.env.unwrapped, "goal", None)
        if not isinstance(goal, np.ndarray):
            raise ValueError(f"{_env_name(self.env)}: behaviour goals need an env that keeps its goal in "
                             f"env.unwrapped.goal (gymnasium-robotics goal envs), got {type(goal).__name__}")
        self._goal_shape = goal.shape
        return obs, info

    @property
    def behaviour_goal(self) -> np.ndarray:
        """The goal the current episode pursues (a copy of the env's ``goal``)."""
        return np.array(self.env.unwrapped.goal, copy=True)

    @behaviour_goal.setter
    def behaviour_goal(self, goal: np.ndarray | None) -> None:
        if goal is None:
            return
        u = self.env.unwrapped
        goal = np.asarray(goal, dtype=u.goal.dtype)
        if goal.shape != u.goal.shape:
            raise ValueError(f"behaviour_goal must have the env's goal shape {u.goal.shape}, got {goal.shape}")
        u.goal = goal.copy()
