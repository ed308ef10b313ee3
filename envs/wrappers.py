"""Wrappers of the goal envs the package builds, and the action mapping they use.

Every env the package builds ([`her_envs.make_env`][], so also the vector envs, evaluation and videos) is
wrapped
by [`wrap_goal_env`][her_envs.wrappers.wrap_goal_env] so that

- observations are copied on receipt ([`CopyObservation`][her_envs.wrappers.CopyObservation]): an env that
  returns the same arrays every step
  and mutates them in place cannot change an observation already handed out (a stored last state, a
  ``final_obs``);
- the agents act in ``[-1, 1]`` ([`NormalizeAction`][her_envs.wrappers.NormalizeAction]): actions are mapped
  affinely to the env's own Box
  bounds ([`to_env_action`][her_envs.wrappers.to_env_action] /
  [`from_env_action`][her_envs.wrappers.from_env_action]), so the replay holds one action space whatever the
  env's bounds. Unbounded action boxes are refused.

The sub-envs of the training vector envs ([`her_envs.make_vector_env`][]) are also wrapped in
[`EpisodeStartRNG`][her_envs.wrappers.EpisodeStartRNG] (the RNG state their current episode started from, for
checkpoints) and, on request, in
[`GraspedStart`][her_envs.wrappers.GraspedStart] (episodes that start with the object in the gripper),
[`RareStateStart`][her_envs.wrappers.RareStateStart] (episodes
that start from a rarely reached state the env visited before) and
[`BehaviourGoal`][her_envs.wrappers.BehaviourGoal] (the training loop
replaces the goal of an episode that just began).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.utils import seeding

__all__ = [
    "BehaviourGoal", "CopyObservation", "EpisodeStartRNG", "GraspedStart", "NormalizeAction", "RareStateStart",
    "from_env_action", "to_env_action", "wrap_goal_env",
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
    """The inverse of [`to_env_action`][her_envs.wrappers.to_env_action]: actions in ``[low, high]`` ->
    float32 ``[-1, 1]`` (clipped)."""
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
    """Wrap an env as the package uses it: observations copied on receipt
    ([`CopyObservation`][her_envs.wrappers.CopyObservation]) and
    actions in ``[-1, 1]`` ([`NormalizeAction`][her_envs.wrappers.NormalizeAction]; skipped where the bounds
    already are ``[-1, 1]``)."""
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
    taken between episodes saves for the training envs ([`vector_rng_states`][her_envs.vector_rng_states]).
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


class RareStateStart(gym.Wrapper):
    """Start a share of the episodes from a state the env reached before whose achieved goal was rarely reached:
    Go-Explore's "return, then explore" (Ecoffet, Huizinga, Lehman, Stanley & Clune 2021, "First return, then
    explore", Nature 590; cells of the achieved-goal space, a cell chosen with weight ``1 / sqrt(visits + 1)``),
    with the cells limited to those the env's own desired goals fall in (the desired-goal support, as OMEGA's in
    Pitis et al. 2020), so that a rare state the task never asks for (an object knocked off the table) is not one
    to start from. No knowledge of the task is used beyond the goal spaces and a simulator whose state can be
    saved and restored; a box that went up by chance is then where later episodes start, where grasped starts
    ([`GraspedStart`][her_envs.wrappers.GraspedStart]) put it by hand.

    Every step's simulator state (MuJoCo's integration state: time, qpos, qvel, actuator, control and mocap
    state) is kept in the cell of its achieved goal (``floor(achieved_goal / cell_size)`` per coordinate), up to
    ``states_per_cell`` per cell (a reservoir: a uniform sample of the cell's visits), and every cell's visits are
    counted. Each reset's desired goal marks its cell as in the support. After the env's own reset (its goal
    kept), with probability ``probability`` (drawn from the env's ``np_random``, so seeded runs repeat; none at 0),
    a support cell other than the start's is drawn with weight ``1 / sqrt(visits + 1)``, one of its states is restored and the observation is
    read again. The archive ([`rare_state_archive`][her_envs.wrappers.RareStateStart.rare_state_archive],
    arrays only) goes into the training loop's checkpoints.
    Meant for training envs only; evaluate on the plain env.

    For gymnasium-robotics MuJoCo goal envs (``unwrapped.model``, ``unwrapped.data``, ``unwrapped._get_obs()``).

    Args:
        env: the goal env.
        probability: share of the episodes that start from an archived state (in [0, 1]).
        cell_size: edge of a cell, in the achieved goal's units (> 0; metres for Fetch).
        states_per_cell: states kept per cell (>= 1).

    Raises:
        ValueError: a setting out of its range, or an env without a MuJoCo state.
    """

    def __init__(self, env: gym.Env, probability: float = 0.5, cell_size: float = 0.05,
                 states_per_cell: int = 4) -> None:
        super().__init__(env)
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"rare state start probability must be in [0, 1], got {probability!r}")
        if not cell_size > 0.0:
            raise ValueError(f"rare state start cell_size must be > 0, got {cell_size!r}")
        if isinstance(states_per_cell, bool) or not isinstance(states_per_cell, int) or states_per_cell < 1:
            raise ValueError(f"rare state start states_per_cell must be an int >= 1, got {states_per_cell!r}")
        u = env.unwrapped
        if not all(hasattr(u, name) for name in ("model", "data", "_get_obs")):
            raise ValueError(f"a rare state start needs a gymnasium-robotics MuJoCo goal env (model, data, _get_obs), "
                             f"got {_env_name(env)}")
        import mujoco  # the env is a MuJoCo one: mujoco is there

        self._mujoco = mujoco
        self._spec = mujoco.mjtState.mjSTATE_INTEGRATION
        self._state_size = mujoco.mj_stateSize(u.model, self._spec)
        self.probability = float(probability)
        self.cell_size = float(cell_size)
        self.states_per_cell = states_per_cell
        self.visits: dict[tuple[int, ...], int] = {}
        self.states: dict[tuple[int, ...], list[np.ndarray]] = {}
        self.support: set[tuple[int, ...]] = set()
        self.restarts = 0
        self._rng = np.random.default_rng()  # the reservoir's draws: the env's own RNG stream stays untouched

    def _cell(self, goal: np.ndarray) -> tuple[int, ...]:
        return tuple(np.floor(np.asarray(goal, dtype=np.float64).ravel() / self.cell_size).astype(np.int64).tolist())

    def _keep(self, achieved_goal: np.ndarray) -> None:
        u = self.env.unwrapped
        cell = self._cell(achieved_goal)
        n = self.visits.get(cell, 0) + 1
        self.visits[cell] = n
        kept = self.states.setdefault(cell, [])
        slot = len(kept) if len(kept) < self.states_per_cell else int(self._rng.integers(n))
        if slot < self.states_per_cell:
            state = np.empty(self._state_size, dtype=np.float64)
            self._mujoco.mj_getState(u.model, u.data, state, self._spec)
            if slot == len(kept):
                kept.append(state)
            else:
                kept[slot] = state

    @property
    def rare_state_archive(self) -> dict[str, Any]:
        """The archive as arrays: ``cells`` int64 [C, goal_dim], ``visits`` int64 [C], ``kept`` int64 [C] (states
        kept per cell), ``states`` float64 [C, states_per_cell, state_size] (MuJoCo integration states),
        ``support`` int64 [D, goal_dim], ``restarts``, and the reservoir's RNG state ``rng``."""
        cells = list(self.visits)
        dim = len(cells[0]) if cells else len(next(iter(self.support), ()))
        states = np.zeros((len(cells), self.states_per_cell, self._state_size))
        kept = np.zeros(len(cells), dtype=np.int64)
        for i, cell in enumerate(cells):
            for j, state in enumerate(self.states.get(cell, ())):
                states[i, j] = state
            kept[i] = len(self.states.get(cell, ()))
        return {"cells": np.array(cells, dtype=np.int64).reshape(len(cells), dim),
                "visits": np.array([self.visits[c] for c in cells], dtype=np.int64), "kept": kept, "states": states,
                "support": np.array(sorted(self.support), dtype=np.int64).reshape(len(self.support), dim),
                "restarts": self.restarts, "rng": self._rng.bit_generator.state}

    @rare_state_archive.setter
    def rare_state_archive(self, archive: Mapping[str, Any]) -> None:
        states = np.asarray(archive["states"], dtype=np.float64)
        if states.ndim != 3 or states.shape[2] != self._state_size:
            raise ValueError(f"rare_state_archive states must have shape [cells, states_per_cell, "
                             f"{self._state_size}] for this env, got {states.shape}")
        cells = [tuple(c) for c in np.asarray(archive["cells"]).tolist()]
        self.visits = {c: int(n) for c, n in zip(cells, archive["visits"], strict=True)}
        self.states = {c: [states[i, j].copy() for j in range(min(int(k), self.states_per_cell))]
                       for i, (c, k) in enumerate(zip(cells, archive["kept"], strict=True)) if k > 0}
        self.support = {tuple(c) for c in np.asarray(archive["support"]).tolist()}
        self.restarts = int(archive["restarts"])
        self._rng.bit_generator.state = archive["rng"]

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._keep(obs["achieved_goal"])
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        obs, info = self.env.reset(seed=seed, options=options)
        self.support.add(self._cell(obs["desired_goal"]))
        start = self._cell(obs["achieved_goal"])
        u = self.env.unwrapped
        p = self.probability  # no draw at 0: the env's RNG stream stays the plain env's
        # sorted: a set's order depends on its insertion history, which a restored archive does not keep
        cells = [c for c in sorted(self.support) if c in self.states and c != start] \
            if p > 0.0 and u.np_random.random() < p else []
        if cells:
            weights = 1.0 / np.sqrt(np.array([self.visits[c] for c in cells], dtype=np.float64) + 1.0)
            kept = self.states[cells[int(u.np_random.choice(len(cells), p=weights / weights.sum()))]]
            goal = np.array(u.goal, copy=True)
            self._mujoco.mj_setState(u.model, u.data, kept[int(u.np_random.integers(len(kept)))], self._spec)
            self._mujoco.mj_forward(u.model, u.data)
            u.goal = goal
            self.restarts += 1
            obs = {k: np.array(v, copy=True) for k, v in u._get_obs().items()}
        self._keep(obs["achieved_goal"])
        return obs, info


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
