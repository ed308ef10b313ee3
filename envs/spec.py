"""What HER needs to know about a goal env: [`GoalEnvSpec`][her_envs.spec.GoalEnvSpec], read and validated by
[`spec_from_env`][her_envs.spec.spec_from_env].

A [`GoalEnvSpec`][her_envs.spec.GoalEnvSpec] holds the sizes of the observation, goal and action vectors, and
a *vectorized*
``compute_reward`` / ``compute_success`` that the replay library calls once per batch for relabeled goals.
[`spec_from_env`][her_envs.spec.spec_from_env] checks at set-up, on a small batch of probe goals, that the
env's own functions are
vectorized, and finds the info entries ``compute_reward`` needs and the range of one step's reward;
[`check_rewards`][her_envs.spec.check_rewards] refuses env rewards outside that range during training.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from .wrappers import _check_action_box, _is_fetch, from_env_action, to_env_action

__all__ = [
    "GOAL_KEYS", "GoalEnvSpec", "RewardFn", "SuccessFn", "ThresholdReward", "ThresholdSuccess",
    "check_rewards", "spec_from_env",
]


GOAL_KEYS: tuple[str, ...] = ("observation", "achieved_goal", "desired_goal")
_PROBE_BATCH = 7  # batch size used to check at set-up that compute_reward is vectorized

RewardFn = Callable[[np.ndarray, np.ndarray, Any], np.ndarray]
SuccessFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class GoalEnvSpec:
    """Static description of a goal env, enough to build networks and relabel goals.

    ``compute_reward(achieved_goal [B, G], desired_goal [B, G], info) -> [B] float32``, where ``info`` is
    ``None`` or a dict ``{key: [B, *info_shapes[key]]}`` holding at least ``info_keys``.
    ``compute_success(achieved_goal [B, G], desired_goal [B, G]) -> [B] bool``, or ``None`` when the env
    offers no vectorized success test (then read ``info["is_success"]`` from the env).
    ``compute_terminated(achieved_goal [B, G], desired_goal [B, G], info) -> [B] bool``: the env's own
    (gymnasium-robotics ``GoalEnv`` API) when it defines a vectorized one of its own, for the replay to
    recompute ``terminated`` for relabeled goals; ``None`` otherwise (Fetch: never terminates).

    ``action_low`` / ``action_high`` are the env's own Box bounds (float32 ``[action_dim]``, finite); the
    agents and the replay use ``[-1, 1]``, mapped by
    [`to_env_action`][her_envs.spec.GoalEnvSpec.to_env_action] /
    [`from_env_action`][her_envs.spec.GoalEnvSpec.from_env_action].
    ``reward_range``: ``(low, high)`` bounds of one step's reward (``-inf`` / ``inf`` for an unknown side), or
    ``None`` when nothing is known; see [`spec_from_env`][her_envs.spec.spec_from_env] for where it comes
    from.
    ``dt``: seconds of simulated time per env step (the env's own ``dt``, Fetch 0.04), ``None`` when it has none;
    the energy-based sampler (``her.EnergySampler``) needs it.
    """

    env_id: str
    observation_dim: int
    goal_dim: int
    action_dim: int
    action_low: np.ndarray
    action_high: np.ndarray
    max_episode_steps: int | None
    compute_reward: RewardFn
    compute_success: SuccessFn | None
    info_keys: tuple[str, ...] = ()
    info_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    reward_range: tuple[float, float] | None = None
    compute_terminated: RewardFn | None = None
    dt: float | None = None

    def to_env_action(self, action: np.ndarray) -> np.ndarray:
        """Agent actions ``[..., action_dim]`` in ``[-1, 1]`` -> the env's units (see
        [`to_env_action`][her_envs.spec.GoalEnvSpec.to_env_action])."""
        return to_env_action(action, self.action_low, self.action_high)

    def from_env_action(self, action: np.ndarray) -> np.ndarray:
        """Actions in the env's units -> ``[-1, 1]`` (see
        [`from_env_action`][her_envs.spec.GoalEnvSpec.from_env_action])."""
        return from_env_action(action, self.action_low, self.action_high)


@dataclass(frozen=True)
class ThresholdReward:
    """The Fetch reward as a small picklable function: ``-(|ag - g| > threshold)`` (sparse) or ``-|ag - g|``."""

    distance_threshold: float
    sparse: bool = True

    def __call__(self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any = None) -> np.ndarray:
        d = np.linalg.norm(np.asarray(achieved_goal) - np.asarray(desired_goal), axis=-1)
        return -(d > self.distance_threshold).astype(np.float32) if self.sparse else (-d).astype(np.float32)


@dataclass(frozen=True)
class ThresholdSuccess:
    """The Fetch success test, vectorized: ``|ag - g| < threshold``."""

    distance_threshold: float

    def __call__(self, achieved_goal: np.ndarray, desired_goal: np.ndarray) -> np.ndarray:
        d = np.linalg.norm(np.asarray(achieved_goal) - np.asarray(desired_goal), axis=-1)
        return d < self.distance_threshold


# ---------------------------------------------------------------------------------------------------------
# Validation and spec
# ---------------------------------------------------------------------------------------------------------


def _check_goal_spaces(env: gym.Env, env_id: str) -> tuple[int, int]:
    space = env.observation_space
    expected = f"expected a gymnasium.spaces.Dict observation space with 1-D Box entries {list(GOAL_KEYS)}"
    if not isinstance(space, gym.spaces.Dict) or not set(GOAL_KEYS) <= set(space.spaces):
        got = list(space.spaces) if isinstance(space, gym.spaces.Dict) else space
        raise TypeError(f"{env_id} is not a goal env: {expected}; got {got}.")
    for key in GOAL_KEYS:
        sub = space[key]
        if not isinstance(sub, gym.spaces.Box) or len(sub.shape) != 1:
            raise TypeError(f"{env_id} is not a supported goal env: {expected}; got {key!r}: {sub}.")
    if space["achieved_goal"].shape != space["desired_goal"].shape:
        raise TypeError(
            f"{env_id}: achieved_goal and desired_goal must have the same shape, got "
            f"{space['achieved_goal'].shape} and {space['desired_goal'].shape}."
        )
    _check_action_box(env.action_space, env_id)
    return space["observation"].shape[0], space["desired_goal"].shape[0]


def _probe_goals(env: gym.Env) -> tuple[np.ndarray, np.ndarray]:
    """Two distinct batches of ``_PROBE_BATCH`` goals inside the goal space (no env RNG is used)."""
    box = env.observation_space["desired_goal"]
    rng = np.random.default_rng(0)
    ag, dg = (
        np.clip(rng.normal(size=(_PROBE_BATCH, *box.shape)), box.low, box.high).astype(box.dtype)
        for _ in range(2)
    )
    return ag, dg


def _probe_info(env: gym.Env) -> dict[str, np.ndarray]:
    """Batch the numeric entries of one real step's info (only for envs whose reward reads ``info``)."""
    env.reset()
    _, _, _, _, info = env.step(env.action_space.sample())
    return {
        k: np.repeat(np.asarray(v)[None], _PROBE_BATCH, axis=0)
        for k, v in info.items()
        if np.asarray(v).dtype.kind in "biuf"
    }


def _accepts_info(unwrapped: Any, ag: np.ndarray, dg: np.ndarray, info: dict, without: str) -> bool:
    """Whether ``compute_reward`` still works with ``info`` less the key ``without`` (so it is not needed)."""
    try:
        unwrapped.compute_reward(ag, dg, {k: v for k, v in info.items() if k != without})
    except Exception:
        return False
    return True


def _check_vectorized(fn: Callable, args: tuple, env_id: str, name: str) -> np.ndarray:
    ag = args[0]
    try:
        out = fn(*args)
    except Exception as exc:
        raise TypeError(
            f"{env_id}: {name} is not vectorized: called with achieved_goal and desired_goal of shape "
            f"{ag.shape} it raised {type(exc).__name__}: {exc}. HER recomputes rewards for whole batches "
            f"of relabeled goals, so {name} must accept [B, G] arrays and return shape ({_PROBE_BATCH},)."
        ) from exc
    shape = np.shape(out)
    if shape != (_PROBE_BATCH,):
        kind = "a scalar" if shape == () else f"shape {shape}"
        raise TypeError(
            f"{env_id}: {name} is not vectorized: called with achieved_goal and desired_goal of shape "
            f"{ag.shape} it returned {kind}; expected shape ({_PROBE_BATCH},), one value per goal."
        )
    return np.asarray(out)


def _float32_reward(fn: RewardFn) -> RewardFn:
    @functools.wraps(fn)
    def compute_reward(achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any = None) -> np.ndarray:
        return np.asarray(fn(achieved_goal, desired_goal, info), dtype=np.float32)

    return compute_reward


def _bool_success(fn: SuccessFn) -> SuccessFn:
    @functools.wraps(fn)
    def compute_success(achieved_goal: np.ndarray, desired_goal: np.ndarray) -> np.ndarray:
        return np.asarray(fn(achieved_goal, desired_goal)).astype(bool)

    return compute_success


def _bool_terminated(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def compute_terminated(achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any = None) -> np.ndarray:
        return np.asarray(fn(achieved_goal, desired_goal, info)).astype(bool)

    return compute_terminated


# gymnasium-robotics' GoalEnv (abstract) and robot base classes (constant False): no termination of their own
_BASE_TERMINATED_MODULES = ("gymnasium_robotics.core", "gymnasium_robotics.envs.robot_env")


def _compute_terminated(unwrapped: Any, ag: np.ndarray, dg: np.ndarray, info: dict[str, np.ndarray] | None,
                        env_id: str) -> Callable | None:
    """The env's own ``compute_terminated`` when it defines a non-trivial, vectorized one, else None.

    Non-trivial: defined by the env's class rather than gymnasium-robotics' base classes (Fetch's returns a
    constant False). Vectorized: it returns one flag per goal for the probe batch (apart and achieved goals,
    with the info keys ``compute_reward`` needs). One that raises on that batch, or returns another shape and
    ends episodes (True for one achieved == desired goal), is warned about: the replay then keeps the stored
    flags, and a relabeled success still bootstraps.
    """
    fn = getattr(unwrapped, "compute_terminated", None)
    owner = next((c for c in type(unwrapped).__mro__ if "compute_terminated" in vars(c)), None)
    if not callable(fn) or owner is None or owner.__module__ in _BASE_TERMINATED_MODULES or _is_fetch(unwrapped):
        return None
    goals = np.concatenate([ag, ag]), np.concatenate([dg, ag])  # apart, and achieved
    batch = None if info is None else {k: np.concatenate([v, v]) for k, v in info.items()}
    n = len(goals[0])
    try:
        out = np.asarray(fn(*goals, batch))
    except Exception as exc:
        problem = f"called with {n} goals it raised {type(exc).__name__}: {exc}"
    else:
        if out.shape == (n,):
            return _bool_terminated(fn)
        try:  # a scalar for a batch: does it end episodes at all (one achieved goal)?
            one = None if info is None else {k: v[0] for k, v in info.items()}
            if not bool(np.asarray(fn(ag[0], ag[0], one))):
                return None  # never ends one (a continuing task): the stored flags are right
        except Exception:
            return None
        problem = f"for {n} goals it returned shape {out.shape}, not ({n},)"
    warnings.warn(f"{env_id}: compute_terminated is not vectorized ({problem}); relabeled transitions keep the "
                  "stored terminated flags", stacklevel=3)
    return None


def spec_from_env(env: gym.Env, env_id: str | None = None) -> GoalEnvSpec:
    """Validate an open goal env (not yet wrapped by [`wrap_goal_env`][her_envs.wrap_goal_env]) and describe
    it.

    ``info_keys`` / ``info_shapes``: the numeric entries of a real step's info that ``compute_reward`` needs,
    and each one's shape (any shape). ``reward_range`` (see [`GoalEnvSpec`][her_envs.spec.GoalEnvSpec]): the
    env's ``reward_range``
    attribute where it bounds a side; Fetch's; else, when ``compute_reward`` takes exactly two values on the
    probe goals and on achieved == desired (a sparse reward), those two; else ``None``. A probed range is a
    guess from a few goals: [`check_rewards`][her_envs.spec.check_rewards] refuses an env reward outside it
    during training.

    Raises:
        TypeError: HER cannot use the env (spaces, action bounds, a missing or non-vectorized reward).
    """
    env_id = env_id or (env.spec.id if env.spec is not None else type(env.unwrapped).__name__)
    obs_dim, goal_dim = _check_goal_spaces(env, env_id)
    unwrapped = env.unwrapped
    if not callable(getattr(unwrapped, "compute_reward", None)):
        raise TypeError(
            f"{env_id} has no compute_reward(achieved_goal, desired_goal, info) method; HER needs one."
        )
    ag, dg = _probe_goals(env)

    # The env's own compute_reward must be vectorized; try info=None first, then a batched real info.
    info_keys: tuple[str, ...] = ()
    info: dict[str, np.ndarray] | None = None
    try:
        unwrapped.compute_reward(ag, dg, None)
    except Exception:
        info = _probe_info(env)
        _check_vectorized(unwrapped.compute_reward, (ag, dg, info), env_id, "compute_reward")
        info_keys = tuple(k for k in info if not _accepts_info(unwrapped, ag, dg, info, without=k))
        info = {k: info[k] for k in info_keys}
    else:
        _check_vectorized(unwrapped.compute_reward, (ag, dg, None), env_id, "compute_reward")
    info_shapes = {k: tuple(info[k].shape[1:]) for k in info_keys}

    compute_success: SuccessFn | None
    if _is_fetch(unwrapped):
        threshold = float(unwrapped.distance_threshold)
        compute_reward: RewardFn = ThresholdReward(threshold, sparse=unwrapped.reward_type == "sparse")
        compute_success = ThresholdSuccess(threshold)
    else:
        compute_reward = _float32_reward(unwrapped.compute_reward)
        compute_success = None
        is_success = getattr(unwrapped, "_is_success", None)
        if callable(is_success):
            try:
                _check_vectorized(is_success, (ag, dg), env_id, "_is_success")
                compute_success = _bool_success(is_success)
            except TypeError:
                compute_success = None

    reward_range = _reward_range(unwrapped, compute_reward, ag, dg, info)
    compute_terminated = _compute_terminated(unwrapped, ag, dg, info, env_id)
    max_steps = env.spec.max_episode_steps if env.spec is not None else None
    dt = getattr(unwrapped, "dt", None)
    dt = float(dt) if isinstance(dt, (int, float)) and 0 < dt < np.inf else None
    return GoalEnvSpec(
        env_id=env_id,
        observation_dim=int(obs_dim),
        goal_dim=int(goal_dim),
        action_dim=int(env.action_space.shape[0]),
        action_low=np.asarray(env.action_space.low, dtype=np.float32).copy(),
        action_high=np.asarray(env.action_space.high, dtype=np.float32).copy(),
        max_episode_steps=max_steps,
        compute_reward=compute_reward,
        compute_success=compute_success,
        info_keys=info_keys,
        info_shapes=info_shapes,
        reward_range=reward_range,
        compute_terminated=compute_terminated,
        dt=dt,
    )


def _reward_range(unwrapped: Any, compute_reward: RewardFn, ag: np.ndarray, dg: np.ndarray,
                  info: dict[str, np.ndarray] | None) -> tuple[float, float] | None:
    """Bounds of one step's reward: the env's own ``reward_range`` attribute where it bounds a side; Fetch's
    (``(-1, 0)`` sparse, ``(-inf, 0)`` dense); else, for a sparse reward, the two values ``compute_reward``
    takes on the probe goals and on achieved == desired; ``None`` when none of these applies (dense rewards, or
    a probe that did not tell success from failure)."""
    declared = getattr(unwrapped, "reward_range", None)
    if declared is not None:
        try:
            low, high = (float(v) for v in declared)
        except (TypeError, ValueError):
            low, high = -np.inf, np.inf
        if low <= high and (np.isfinite(low) or np.isfinite(high)):
            return low, high
    if _is_fetch(unwrapped):
        return (-1.0, 0.0) if unwrapped.reward_type == "sparse" else (-np.inf, 0.0)
    goals = np.concatenate([ag, ag, dg]), np.concatenate([dg, ag, dg])  # apart, and achieved
    batch = None if info is None else {k: np.concatenate([v, v, v]) for k, v in info.items()}
    try:
        values = np.unique(np.asarray(compute_reward(*goals, batch), np.float64))
    except Exception:
        return None
    if values.size == 2 and np.isfinite(values).all():  # failure / success
        return float(values[0]), float(values[1])
    return None


def check_rewards(reward: np.ndarray, reward_range: tuple[float, float] | None, env_id: str) -> None:
    """Refuse env rewards outside ``reward_range`` (``GoalEnvSpec.reward_range``; the TD-target bounds derived
    from it hold only for rewards inside). No-op when ``reward_range`` is None.

    Args:
        reward: the rewards of one step, ``[N]``.
        reward_range: ``(low, high)``; a relative tolerance of 1e-5 absorbs float32 / float64 rounding.
        env_id: named in the message.

    Raises:
        ValueError: some reward lies outside ``[low, high]``.
    """
    if reward_range is None:
        return
    r = np.asarray(reward, np.float64)
    low, high = reward_range
    tol = 1e-5 * max(1.0, *(abs(v) for v in reward_range if np.isfinite(v)))  # float32 probe vs float64 env
    if r.size and (r.min() < low - tol or r.max() > high + tol):
        bad = r[(r < low - tol) | (r > high + tol)]
        raise ValueError(
            f"{env_id}: the env returned reward {float(bad[0])!r}, outside the reward range [{low}, {high}] read "
            "at set-up (from the env's reward_range or from compute_reward on probe goals), which bounds the TD "
            "targets; declare the env's true range as its `reward_range` attribute, or set agent.q_clip "
            "yourself (null disables the bound)."
        )
