"""Goal-conditioned gymnasium environments: construction, validation, spec and vector stepping.

Everything HER needs to know about an environment lives in a :class:`GoalEnvSpec`: the sizes of the
observation, goal and action vectors, and a *vectorized* ``compute_reward`` / ``compute_success`` that
the replay library calls once per batch for relabeled goals.

Vector envs use gymnasium's own ``SyncVectorEnv`` / ``AsyncVectorEnv`` in ``AutoresetMode.SAME_STEP``:
when an episode ends, ``step`` already returns the reset observation, and the real last observation is in
``infos["final_obs"]``. :func:`split_autoreset` recovers it, so no transition ever crosses a reset.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

FETCH_TASKS: tuple[str, ...] = ("FetchReach-v4", "FetchPush-v4", "FetchSlide-v4", "FetchPickAndPlace-v4")
GOAL_KEYS: tuple[str, ...] = ("observation", "achieved_goal", "desired_goal")
_PROBE_BATCH = 7  # batch size used to check at set-up that compute_reward is vectorized

RewardFn = Callable[[np.ndarray, np.ndarray, Any], np.ndarray]
SuccessFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class GoalEnvSpec:
    """Static description of a goal env, enough to build networks and relabel goals.

    ``compute_reward(achieved_goal [B, G], desired_goal [B, G], info) -> [B] float32``, where ``info`` is
    ``None`` or a dict of ``[B, ...]`` arrays holding at least ``info_keys``.
    ``compute_success(achieved_goal [B, G], desired_goal [B, G]) -> [B] bool``, or ``None`` when the env
    offers no vectorized success test (then read ``info["is_success"]`` from the env).
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
# Construction
# ---------------------------------------------------------------------------------------------------------


def _resolve_env_id(env_id: str) -> None:
    """Make sure ``env_id`` is registered, importing gymnasium_robotics only if it is needed."""
    if not isinstance(env_id, str):
        raise TypeError(
            f"env_id must be a str such as 'FetchReach-v4', got {type(env_id).__name__}: {env_id!r}"
        )
    if env_id in gym.registry:
        return
    try:
        # gymnasium-robotics prints a notice about its Adroit envs to stderr at import; it is not about Fetch.
        with contextlib.redirect_stderr(io.StringIO()):
            import gymnasium_robotics
    except ImportError:  # pragma: no cover - it is a dependency of the package
        gymnasium_robotics = None
    if gymnasium_robotics is not None:
        gym.register_envs(gymnasium_robotics)
    if env_id in gym.registry:
        return
    close = difflib.get_close_matches(env_id, list(FETCH_TASKS) + list(gym.registry), n=5, cutoff=0.5)
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

    Raises:
        ValueError: unknown env id.
        TypeError: the observation space is not a Dict with ``observation``, ``achieved_goal`` and
            ``desired_goal`` 1-D boxes, or ``compute_reward`` is missing or not vectorized.
    """
    _resolve_env_id(env_id)
    env = gym.make(env_id, **({} if render_mode is None else {"render_mode": render_mode}))
    try:
        spec_from_env(env, env_id)
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
    if not isinstance(env.action_space, gym.spaces.Box) or len(env.action_space.shape) != 1:
        raise TypeError(f"{env_id}: expected a 1-D Box action space, got {env.action_space}.")
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


def _is_fetch(unwrapped: Any) -> bool:
    return type(unwrapped).__module__.startswith("gymnasium_robotics.envs.fetch") and hasattr(
        unwrapped, "distance_threshold"
    )


def spec_from_env(env: gym.Env, env_id: str | None = None) -> GoalEnvSpec:
    """Validate an open goal env and describe it. Raises ``TypeError`` when HER cannot use it."""
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
    try:
        unwrapped.compute_reward(ag, dg, None)
    except Exception:
        info = _probe_info(env)
        _check_vectorized(unwrapped.compute_reward, (ag, dg, info), env_id, "compute_reward")
        info_keys = tuple(k for k in info if not _accepts_info(unwrapped, ag, dg, info, without=k))
    else:
        _check_vectorized(unwrapped.compute_reward, (ag, dg, None), env_id, "compute_reward")

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
    )


# ---------------------------------------------------------------------------------------------------------
# Vector envs
# ---------------------------------------------------------------------------------------------------------


def make_vector_env(
    env_id: str, n_envs: int, vectorization: str = "sync", seed: int | None = None
) -> gym.vector.VectorEnv:
    """``n_envs`` copies of ``env_id`` in gymnasium's Sync/AsyncVectorEnv with SAME_STEP autoreset.

    The env is validated once in this process first (clear errors before any worker starts). With
    ``seed``, sub-env ``i`` is reset with ``seed + i`` and the action spaces are seeded with ``seed``.
    Use :func:`split_autoreset` on each step's output to get the real next observations.
    """
    if isinstance(n_envs, bool) or not isinstance(n_envs, (int, np.integer)):
        raise TypeError(f"n_envs must be an int >= 1, got {type(n_envs).__name__}: {n_envs!r}")
    if n_envs < 1:
        raise ValueError(f"n_envs must be >= 1, got {n_envs}")
    classes = {"sync": gym.vector.SyncVectorEnv, "async": gym.vector.AsyncVectorEnv}
    if vectorization not in classes:
        raise ValueError(f"vectorization must be one of {sorted(classes)}, got {vectorization!r}")
    goal_env_spec(env_id)  # validates id, spaces and reward here, not inside a worker
    fns = [functools.partial(make_env, env_id) for _ in range(int(n_envs))]
    venv = classes[vectorization](fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    if seed is not None:
        venv.reset(seed=seed)
        venv.action_space.seed(seed)
        venv.single_action_space.seed(seed)
    return venv


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
