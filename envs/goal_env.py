"""Goal-conditioned gymnasium environments: construction, validation, spec and vector stepping.

Everything HER needs to know about an environment lives in a :class:`GoalEnvSpec`: the sizes of the
observation, goal and action vectors, and a *vectorized* ``compute_reward`` / ``compute_success`` that
the replay library calls once per batch for relabeled goals.

Every env the package builds (:func:`make_env`, so also the vector envs, evaluation and videos) is wrapped so
that

- observations are copied on receipt (:class:`CopyObservation`): an env that returns the same arrays every step
  and mutates them in place cannot change an observation already handed out (a stored last state, a
  ``final_obs``);
- the agents act in ``[-1, 1]`` (:class:`NormalizeAction`): actions are mapped affinely to the env's own Box
  bounds, so the replay holds one action space whatever the env's bounds. Unbounded action boxes are refused.

Vector envs use gymnasium's own ``SyncVectorEnv`` / ``AsyncVectorEnv`` in ``AutoresetMode.SAME_STEP``:
when an episode ends, ``step`` already returns the reset observation, and the real last observation is in
``infos["final_obs"]``. :func:`split_autoreset` recovers it, so no transition ever crosses a reset;
:func:`step_info` does the same for the info entries ``compute_reward`` needs. Their sub-envs keep the RNG state
their current episode started from (:class:`EpisodeStartRNG`), which a checkpoint saves and a resume restores
(:func:`vector_rng_states`, :func:`set_vector_rng_states`).
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import io
import multiprocessing
import warnings
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import parse_env_id
from gymnasium.utils import seeding

FETCH_TASKS: tuple[str, ...] = ("FetchReach-v4", "FetchPush-v4", "FetchSlide-v4", "FetchPickAndPlace-v4")
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
    agents and the replay use ``[-1, 1]``, mapped by :func:`to_env_action` / :func:`from_env_action`.
    ``reward_range``: ``(low, high)`` bounds of one step's reward (``-inf`` / ``inf`` for an unknown side), or
    ``None`` when nothing is known; see :func:`spec_from_env` for where it comes from.
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

    def to_env_action(self, action: np.ndarray) -> np.ndarray:
        """Agent actions ``[..., action_dim]`` in ``[-1, 1]`` -> the env's units (see :func:`to_env_action`)."""
        return to_env_action(action, self.action_low, self.action_high)

    def from_env_action(self, action: np.ndarray) -> np.ndarray:
        """Actions in the env's units -> ``[-1, 1]`` (see :func:`from_env_action`)."""
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
# Construction
# ---------------------------------------------------------------------------------------------------------


def _buildable(env_id: str) -> bool:
    """False for a registered id whose env needs mujoco_py (gymnasium_robotics' ``-v1`` Fetch tasks, its
    ``MujocoPy*`` classes) where mujoco_py is not installed."""
    entry = gym.registry[env_id].entry_point
    return not (isinstance(entry, str) and ":MujocoPy" in entry and importlib.util.find_spec("mujoco_py") is None)


def _resolve_env_id(env_id: str) -> None:
    """Make sure ``env_id`` is registered and can be built, importing gymnasium_robotics only if it is needed.

    Raises:
        ValueError: an unknown id (with the close registered ones), an old id that needs mujoco_py (with the
            maintained version of the task).
    """
    if not isinstance(env_id, str):
        raise TypeError(
            f"env_id must be a str such as 'FetchReach-v4', got {type(env_id).__name__}: {env_id!r}"
        )
    if env_id in gym.registry and _buildable(env_id):
        return
    try:
        # gymnasium-robotics prints a notice about its Adroit envs to stderr at import; it is not about Fetch.
        with contextlib.redirect_stderr(io.StringIO()):
            import gymnasium_robotics
    except ImportError:  # pragma: no cover - it is a dependency of the package
        gymnasium_robotics = None
    if gymnasium_robotics is not None:
        gym.register_envs(gymnasium_robotics)
    if env_id in gym.registry and _buildable(env_id):
        return
    if env_id in gym.registry:  # e.g. FetchReach-v1: gym.make would end in DependencyNotInstalled
        ns, name, _ = parse_env_id(env_id)
        newer = sorted((spec.version or 0, i) for i, spec in gym.registry.items()
                       if (spec.namespace, spec.name) == (ns, name) and _buildable(i))
        use = f"use {newer[-1][1]}, the same task on the maintained mujoco bindings" if newer else "pick another env"
        raise ValueError(f"env id {env_id!r} is an old version that needs mujoco_py, which is not installed "
                         f"(nor supported here): {use}")
    usable = [i for i in dict.fromkeys([*FETCH_TASKS, *gym.registry]) if _buildable(i)]
    close = difflib.get_close_matches(env_id, usable, n=5, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    raise ValueError(
        f"Unknown env id {env_id!r}: it is not registered with gymnasium (gymnasium_robotics included)."
        f"{hint} Fetch tasks: {', '.join(FETCH_TASKS)}."
    )


def make_env(env_id: str, seed: int | None = None, render_mode: str | None = None) -> gym.Env:
    """Build one goal env and check at set-up that HER can use it.

    Args:
        env_id: a registered gymnasium id, e.g. ``"FetchReach-v4"`` (gymnasium_robotics is registered lazily).
        seed: if given, the env is reset once with ``seed`` and its action space is seeded with it; later
            ``reset()`` calls without a seed continue that stream, so the run is reproducible.
        render_mode: passed to ``gym.make`` (``"rgb_array"`` for frames; set ``MUJOCO_GL`` for headless).

    Returns:
        the env wrapped by :func:`wrap_goal_env`: its action space is ``Box(-1, 1)`` float32 (mapped onto the
        env's own bounds) and its observations are fresh arrays at every ``reset`` / ``step``.

    Raises:
        ValueError: unknown env id, or an old one that needs mujoco_py (names the version to use).
        TypeError: the observation space is not a Dict with ``observation``, ``achieved_goal`` and
            ``desired_goal`` 1-D boxes, the action space is not a bounded 1-D Box, or ``compute_reward`` is
            missing or not vectorized.
    """
    _resolve_env_id(env_id)
    env = gym.make(env_id, **({} if render_mode is None else {"render_mode": render_mode}))
    try:
        spec_from_env(env, env_id)
        env = wrap_goal_env(env)
    except Exception:
        env.close()
        raise
    if seed is not None:
        env.reset(seed=seed)
        env.action_space.seed(seed)
    return env


@functools.cache
def goal_env_spec(env_id: str) -> GoalEnvSpec:
    """Build one env, read its :class:`GoalEnvSpec`, close it. Cached per ``env_id``."""
    _resolve_env_id(env_id)
    env = gym.make(env_id)
    try:
        return spec_from_env(env, env_id)
    finally:
        env.close()


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


def _is_fetch(unwrapped: Any) -> bool:
    return type(unwrapped).__module__.startswith("gymnasium_robotics.envs.fetch") and hasattr(
        unwrapped, "distance_threshold"
    )


def spec_from_env(env: gym.Env, env_id: str | None = None) -> GoalEnvSpec:
    """Validate an open goal env (not yet wrapped by :func:`wrap_goal_env`) and describe it.

    ``info_keys`` / ``info_shapes``: the numeric entries of a real step's info that ``compute_reward`` needs,
    and each one's shape (any shape). ``reward_range`` (see :class:`GoalEnvSpec`): the env's ``reward_range``
    attribute where it bounds a side; Fetch's; else, when ``compute_reward`` takes exactly two values on the
    probe goals and on achieved == desired (a sparse reward), those two; else ``None``. A probed range is a
    guess from a few goals: :func:`check_rewards` refuses an env reward outside it during training.

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


# ---------------------------------------------------------------------------------------------------------
# Vector envs
# ---------------------------------------------------------------------------------------------------------


# Async workers are forked where the platform can: a forked worker knows every env registered in this process
# (tests, notebooks, a user's script), and the choice does not follow the global start method, which importing
# torchrl sets to "spawn".
_ASYNC_START_METHOD = "fork" if "fork" in multiprocessing.get_all_start_methods() else None


def make_vector_env(
    env_id: str, n_envs: int, vectorization: str = "sync", seed: int | None = None, grasped_start: float = 0.0
) -> gym.vector.VectorEnv:
    """``n_envs`` copies of ``env_id`` in gymnasium's Sync/AsyncVectorEnv with SAME_STEP autoreset.

    The env is validated once in this process first (clear errors before any worker starts). With
    ``seed``, sub-env ``i`` is reset with ``seed + i`` and the action spaces are seeded with ``seed``.
    Async workers are forked where the platform can, whatever the global start method (torchrl sets "spawn"),
    so envs registered at run time work in them.
    Use :func:`split_autoreset` on each step's output to get the real next observations. Each sub-env is
    wrapped in :class:`EpisodeStartRNG`, and in :class:`GraspedStart` with ``grasped_start`` > 0 (the share of
    episodes that start with the object in the gripper; for training envs only).

    Raises:
        TypeError: ``n_envs`` is not an int, or the env's spaces do not fit (:func:`make_env`).
        ValueError: ``n_envs`` < 1, an unknown ``vectorization`` or env id, or a ``grasped_start`` the env cannot
            do (:class:`GraspedStart`).
    """
    if isinstance(n_envs, bool) or not isinstance(n_envs, (int, np.integer)):
        raise TypeError(f"n_envs must be an int >= 1, got {type(n_envs).__name__}: {n_envs!r}")
    if n_envs < 1:
        raise ValueError(f"n_envs must be >= 1, got {n_envs}")
    classes = {"sync": gym.vector.SyncVectorEnv, "async": gym.vector.AsyncVectorEnv}
    if vectorization not in classes:
        raise ValueError(f"vectorization must be one of {sorted(classes)}, got {vectorization!r}")
    goal_env_spec(env_id)  # validates id, spaces and reward here, not inside a worker
    if grasped_start:
        GraspedStart(make_env(env_id), grasped_start).close()  # its errors here, not inside a worker
    fns = [functools.partial(_vector_sub_env, env_id, grasped_start) for _ in range(int(n_envs))]
    kwargs = {"context": _ASYNC_START_METHOD} if vectorization == "async" else {}
    venv = classes[vectorization](fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP, **kwargs)
    if seed is not None:
        venv.reset(seed=seed)
        venv.action_space.seed(seed)
        venv.single_action_space.seed(seed)
    return venv


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


def _vector_sub_env(env_id: str, grasped_start: float = 0.0) -> gym.Env:
    env = make_env(env_id)
    return EpisodeStartRNG(GraspedStart(env, grasped_start) if grasped_start > 0 else env)


def generator_from_state(state: Mapping[str, Any]) -> np.random.Generator:
    """A numpy ``Generator`` whose bit generator (named in ``state["bit_generator"]``) is in ``state``."""
    bit_generator = getattr(np.random, state["bit_generator"])()
    bit_generator.state = dict(state)
    return np.random.Generator(bit_generator)


def vector_rng_states(venv: gym.vector.VectorEnv, episode_start: bool = False) -> list[dict[str, Any]]:
    """The bit-generator state of each sub-env's ``np_random`` (one dict per sub-env): as it is now, or with
    ``episode_start`` as it was before the reset that began the sub-env's current episode
    (:class:`EpisodeStartRNG`, which :func:`make_vector_env` applies).

    Restore with :func:`set_vector_rng_states`, then (``episode_start``) ``venv.reset()`` redoes those resets.
    """
    if episode_start:
        states = list(venv.get_attr("episode_start_rng"))
        if any(s is None for s in states):
            raise ValueError("vector_rng_states(episode_start=True) needs sub-envs wrapped in EpisodeStartRNG "
                             "that were reset at least once (make_vector_env builds them so)")
        return states
    return [g.bit_generator.state for g in venv.get_attr("np_random")]


def set_vector_rng_states(venv: gym.vector.VectorEnv, states: list[Mapping[str, Any]]) -> None:
    """Set each sub-env's ``np_random`` to a generator in the given state (from :func:`vector_rng_states`).

    Raises:
        ValueError: not one state per sub-env (a run resumed with another ``env.n_envs`` / ``env.eval_envs``).
    """
    if len(states) != venv.num_envs:
        raise ValueError(f"{len(states)} saved env RNG states for {venv.num_envs} envs")
    venv.set_attr("np_random", [generator_from_state(s) for s in states])


class VectorStep(NamedTuple):
    """The real outcome of one vector step, per env.

    ``real_next_obs``: dict of ``[N, ...]`` arrays, the observation the step actually reached (the final
    observation where the episode ended, not the reset one). ``is_success``: ``[N]`` bool, this step's
    ``info["is_success"]`` (from ``final_info`` where the episode ended; False where absent).
    ``done``: ``[N]`` bool, ``terminated | truncated``.
    """

    real_next_obs: dict[str, np.ndarray]
    is_success: np.ndarray
    done: np.ndarray


def _masked_success(info: dict, n: int) -> np.ndarray:
    values = info.get("is_success")
    if values is None:
        return np.zeros(n, dtype=bool)
    mask = np.asarray(info.get("_is_success", np.ones(n, dtype=bool)), dtype=bool)
    return np.asarray(values).astype(bool) & mask


def split_autoreset(
    next_obs: dict[str, np.ndarray], terminated: np.ndarray, truncated: np.ndarray, infos: dict
) -> VectorStep:
    """Undo SAME_STEP autoreset for one vector step.

    gymnasium 1.x SAME_STEP layout, for the envs whose episode ended at this step (mask ``_final_obs``):
    ``infos["final_obs"]`` is an object array ``[N]`` holding that env's last observation dict (``None``
    elsewhere); ``infos["final_info"]`` is a dict of ``[N]`` arrays, each with its own ``"_key"`` mask,
    holding the step info of the ended envs (mask ``infos["_final_info"]``). The top-level ``infos`` of an
    ended env is its *reset* info, so its success is read from ``final_info`` only.
    """
    done = np.logical_or(np.asarray(terminated, dtype=bool), np.asarray(truncated, dtype=bool))
    n = done.shape[0]
    real = {k: np.array(v, copy=True) for k, v in next_obs.items()}
    is_success = _masked_success(infos, n)
    if not done.any():
        return VectorStep(real, is_success, done)
    if "final_obs" not in infos:
        raise ValueError(
            "An episode ended but infos has no 'final_obs': build the vector env with "
            "autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP (see make_vector_env)."
        )
    ended = np.flatnonzero(np.asarray(infos["_final_obs"], dtype=bool))
    if not np.array_equal(ended, np.flatnonzero(done)):
        raise ValueError(
            f"infos['_final_obs'] marks envs {ended.tolist()} but terminated|truncated marks "
            f"{np.flatnonzero(done).tolist()}; expected the same envs."
        )
    for key, arr in real.items():
        arr[ended] = np.stack([infos["final_obs"][i][key] for i in ended])
    final_info = infos.get("final_info", {})
    is_success[ended] = _masked_success(final_info, n)[ended]
    return VectorStep(real, is_success, done)


def step_info(infos: dict, done: np.ndarray, info_shapes: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """The per-step info entries ``compute_reward`` needs, one row per env, for one SAME_STEP vector step.

    For an env whose episode ended at this step the top-level ``infos`` hold its *reset* info, so its entries
    are read from ``infos["final_info"]``.

    Args:
        infos: the vector env's info dict of the step.
        done: bool ``[N]``, ``terminated | truncated`` of the step.
        info_shapes: ``{key: shape}`` (``GoalEnvSpec.info_shapes``).

    Returns:
        ``{key: float32 [N, *shape]}``.

    Raises:
        ValueError: an env's step info lacks a key, or an entry has another shape than ``info_shapes`` says.
    """
    done = np.asarray(done, dtype=bool)
    n = done.shape[0]
    final = infos.get("final_info", {}) if done.any() else {}
    out: dict[str, np.ndarray] = {}
    for key, shape in info_shapes.items():
        rows = np.empty((n, *shape), np.float32)
        for source, envs in ((infos, ~done), (final, done)):
            if not envs.any():
                continue
            mask = np.asarray(source.get("_" + key, np.zeros(n, bool)), dtype=bool)
            missing = np.flatnonzero(envs & ~mask)
            if key not in source or missing.size:
                raise ValueError(
                    f"info[{key!r}]: compute_reward needs it at every step, but the step info of env(s) "
                    f"{(missing if key in source else np.flatnonzero(envs)).tolist()} has no {key!r}"
                )
            values = np.asarray(source[key])[envs]
            try:  # lists and mixed entries arrive as object arrays
                got = (np.stack([np.asarray(v, np.float32) for v in values]) if values.dtype == object
                       else values.astype(np.float32, copy=False))
            except (ValueError, TypeError) as exc:
                raise ValueError(f"info[{key!r}]: expected numeric entries of shape {tuple(shape)}: {exc}") from None
            if got.shape[1:] != tuple(shape):
                raise ValueError(f"info[{key!r}]: expected shape {tuple(shape)} per env, got {got.shape[1:]}")
            rows[envs] = got
        out[key] = rows
    return out


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
