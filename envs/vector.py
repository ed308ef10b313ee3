"""Vector goal envs: construction, SAME_STEP autoreset undone per step, and the sub-envs' RNG states.

Vector envs use gymnasium's own ``SyncVectorEnv`` / ``AsyncVectorEnv`` in ``AutoresetMode.SAME_STEP``
([`make_vector_env`][her_envs.vector.make_vector_env]): when an episode ends, ``step`` already returns the
reset observation, and the real
last observation is in ``infos["final_obs"]``. [`split_autoreset`][her_envs.vector.split_autoreset] recovers
it, so no transition ever crosses
a reset; [`step_info`][her_envs.vector.step_info] does the same for the info entries ``compute_reward`` needs.
Their sub-envs keep the
RNG state their current episode started from ([`her_envs.EpisodeStartRNG`][]), which a checkpoint saves and a
resume restores ([`vector_rng_states`][her_envs.vector.vector_rng_states],
[`set_vector_rng_states`][her_envs.vector.set_vector_rng_states]).
"""

from __future__ import annotations

import ctypes
import functools
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium.vector.async_vector_env import AsyncState

from .make import goal_env_spec, make_env
from .wrappers import BehaviourGoal, EpisodeStartRNG, GraspedStart, RareStateStart

__all__ = [
    "EnvWorkerDied", "VectorStep", "generator_from_state", "make_vector_env", "set_vector_rng_states", "split_autoreset",
    "step_info", "vector_rng_states",
]


# Async workers are forked where the platform can: a forked worker knows every env registered in this process
# (tests, notebooks, a user's script), and the choice does not follow the global start method, which importing
# torchrl sets to "spawn".
_ASYNC_START_METHOD = "fork" if "fork" in multiprocessing.get_all_start_methods() else None


def make_vector_env(
    env_id: str, n_envs: int, vectorization: str = "sync", seed: int | None = None, grasped_start: float = 0.0,
    behaviour_goals: bool = False, rare_state_start: float = 0.0, rare_state_cell: float = 0.05,
) -> gym.vector.VectorEnv:
    """``n_envs`` copies of ``env_id`` in gymnasium's Sync/AsyncVectorEnv with SAME_STEP autoreset.

    The env is validated once in this process first (clear errors before any worker starts). With
    ``seed``, sub-env ``i`` is reset with ``seed + i`` and the action spaces are seeded with ``seed``.
    Async workers are forked where the platform can, whatever the global start method (torchrl sets "spawn"),
    so envs registered at run time work in them.
    Use [`split_autoreset`][her_envs.vector.split_autoreset] on each step's output to get the real next
    observations. Each sub-env is
    wrapped in [`EpisodeStartRNG`][her_envs.vector.EpisodeStartRNG], and in
    [`GraspedStart`][her_envs.vector.GraspedStart] with ``grasped_start`` > 0 (the share of
    episodes that start with the object in the gripper; for training envs only), in
    [`RareStateStart`][her_envs.vector.RareStateStart] with
    ``rare_state_start`` > 0 (the share of episodes that start from a rarely reached archived state, cells of
    ``rare_state_cell``; training envs only), and with ``behaviour_goals`` in
    [`BehaviourGoal`][her_envs.vector.BehaviourGoal]
    (``set_attr("behaviour_goal", ...)`` replaces the goal of an episode that just began).

    Raises:
        TypeError: ``n_envs`` is not an int, or the env's spaces do not fit
            ([`make_env`][her_envs.vector.make_env]).
        ValueError: ``n_envs`` < 1, an unknown ``vectorization`` or env id, a ``grasped_start`` the env cannot
            do ([`GraspedStart`][her_envs.vector.GraspedStart]), a ``rare_state_start`` the env cannot do
            ([`RareStateStart`][her_envs.vector.RareStateStart]), or
            ``behaviour_goals`` for an env without a settable goal
            ([`BehaviourGoal`][her_envs.vector.BehaviourGoal]).
    """
    if isinstance(n_envs, bool) or not isinstance(n_envs, (int, np.integer)):
        raise TypeError(f"n_envs must be an int >= 1, got {type(n_envs).__name__}: {n_envs!r}")
    if n_envs < 1:
        raise ValueError(f"n_envs must be >= 1, got {n_envs}")
    classes = {"sync": gym.vector.SyncVectorEnv, "async": _AsyncVectorEnv}
    if vectorization not in classes:
        raise ValueError(f"vectorization must be one of {sorted(classes)}, got {vectorization!r}")
    goal_env_spec(env_id)  # validates id, spaces and reward here, not inside a worker
    if grasped_start:
        GraspedStart(make_env(env_id), grasped_start).close()  # its errors here, not inside a worker
    if rare_state_start:
        RareStateStart(make_env(env_id), rare_state_start, rare_state_cell).close()
    if behaviour_goals:
        check = BehaviourGoal(make_env(env_id))
        try:
            check.reset(seed=0)
        finally:
            check.close()
    fns = [functools.partial(_vector_sub_env, env_id, grasped_start, behaviour_goals, rare_state_start,
                             rare_state_cell) for _ in range(int(n_envs))]
    kwargs: dict[str, Any] = {}
    if vectorization == "async":
        fns = [_WorkerEnvFn(fn) for fn in fns]
        kwargs["context"] = _ASYNC_START_METHOD
    venv = classes[vectorization](fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP, **kwargs)
    if seed is not None:
        venv.reset(seed=seed)
        venv.action_space.seed(seed)
        venv.single_action_space.seed(seed)
    return venv


# ---------------------------------------------------------------------------------------------------------
# Async workers: signals, and a worker that dies
# ---------------------------------------------------------------------------------------------------------

_CLOSE_TIMEOUT_S = 5.0
"""How long a closing async vector env waits for a worker to answer ``close`` and exit before killing it."""
_PR_SET_PDEATHSIG = 1


class EnvWorkerDied(RuntimeError):
    """A worker process of an async vector env died (SIGKILL from the out-of-memory killer, a crash in the
    simulator's C code, a ``kill``): its env and the episode it was in are gone.

    Attributes: ``index`` (the sub-env), ``pid``, ``exitcode`` (``multiprocessing``'s: ``-N`` for signal N,
    None if it had not been reaped yet).
    """

    def __init__(self, index: int, pid: int | None, exitcode: int | None) -> None:
        self.index, self.pid, self.exitcode = index, pid, exitcode
        if exitcode is not None and exitcode < 0:
            name = signal.Signals(-exitcode).name if -exitcode in signal.valid_signals() else f"signal {-exitcode}"
            how = f"was killed by {name}" + (" (the out-of-memory killer sends it: see `dmesg`)"
                                               if -exitcode == signal.SIGKILL else "")
        elif exitcode is not None:
            how = f"exited with status {exitcode}"
        else:
            how = "closed its pipe"
        super().__init__(f"env worker {index} (pid {pid}) {how}")


class _WorkerEnvFn:
    """An async worker's env factory that first detaches the worker from the trainer's signal handling.

    A forked worker inherits the trainer's Python signal handlers (its graceful stop) and, as a member of the
    same process group, gets the terminal's SIGINT / SIGHUP and a scheduler's group SIGTERM too. It ignores all
    three: the trainer coordinates a stop (it checkpoints, reading the workers' RNG states, then closes them),
    and a worker that died on its own signal would break that. It ends with the trainer whatever ends it: it
    asks the kernel for SIGKILL when its parent dies (Linux), and a closing vector env kills a worker that does
    not answer (``_AsyncVectorEnv.close_extras``)."""

    def __init__(self, fn: Callable[[], gym.Env]) -> None:
        self.fn = fn
        self.parent_pid = os.getpid()
        self.parent_is_main_thread = threading.current_thread() is threading.main_thread()

    def __call__(self) -> gym.Env:
        if os.getpid() != self.parent_pid:  # in the worker (never change the trainer's own handlers)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)
            # the kernel signals the worker when the *thread* that forked it ends: only tie it to a main thread
            if sys.platform.startswith("linux") and self.parent_is_main_thread:
                try:
                    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
                except (OSError, AttributeError):
                    pass
                if os.getppid() != self.parent_pid:  # the trainer died before prctl took effect
                    os._exit(1)
        return self.fn()


class _AsyncVectorEnv(gym.vector.AsyncVectorEnv):
    """gymnasium's ``AsyncVectorEnv``, where a worker that dies raises ``EnvWorkerDied`` (naming it)
    instead of a bare ``EOFError`` / ``BrokenPipeError``, and ``close`` never waits on a dead or silent worker:
    after one died, or when a worker does not answer ``close`` within a few seconds, the rest are killed
    (they ignore SIGTERM, see ``_WorkerEnvFn``)."""

    _worker_lost = False

    def _died(self) -> EnvWorkerDied:
        self._worker_lost = True
        deadline = time.monotonic() + 2.0  # the pipe closes as the process dies: reap it to read how
        while True:
            dead = [(i, p) for i, p in enumerate(self.processes) if p.exitcode is not None]
            if dead or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        i, p = dead[0] if dead else next(((i, p) for i, p in enumerate(self.processes)
                                          if self.parent_pipes[i] is None or self.parent_pipes[i].closed),
                                         (0, self.processes[0]))
        return EnvWorkerDied(i, p.pid, p.exitcode)

    def _guard(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except (EOFError, ConnectionError) as exc:  # ConnectionError: BrokenPipeError, ConnectionResetError
            raise self._died() from exc

    def reset_async(self, *args: Any, **kwargs: Any) -> None:
        self._guard(super().reset_async, *args, **kwargs)

    def reset_wait(self, *args: Any, **kwargs: Any) -> Any:
        return self._guard(super().reset_wait, *args, **kwargs)

    def step_async(self, actions: Any) -> None:
        self._guard(super().step_async, actions)

    def step_wait(self, *args: Any, **kwargs: Any) -> Any:
        return self._guard(super().step_wait, *args, **kwargs)

    def call_async(self, name: str, *args: Any, **kwargs: Any) -> None:
        self._guard(super().call_async, name, *args, **kwargs)

    def call_wait(self, *args: Any, **kwargs: Any) -> Any:
        return self._guard(super().call_wait, *args, **kwargs)

    def set_attr(self, name: str, values: Any) -> None:
        self._guard(super().set_attr, name, values)

    def _check_spaces(self) -> Any:
        return self._guard(super()._check_spaces)

    def close_extras(self, timeout: float | None = None, terminate: bool = False) -> None:
        """Close the workers: ask each to close (``timeout``, default a few seconds, for a pending call to
        finish first); kill those that died's siblings, those that do not answer, and all with ``terminate``."""
        wait = _CLOSE_TIMEOUT_S if timeout is None else timeout
        graceful = not (terminate or self._worker_lost)
        if graceful:
            try:
                if self._state != AsyncState.DEFAULT:  # a pending call first
                    getattr(self, f"{self._state.value}_wait")(wait)
                live = [p for p in self.parent_pipes if p is not None and not p.closed]
                for pipe in live:
                    pipe.send(("close", None))
                for pipe in live:
                    if not pipe.poll(wait):
                        raise TimeoutError
                    pipe.recv()
            except Exception:  # a dead, failing or silent worker: kill them all below
                graceful = False
        for pipe in self.parent_pipes:
            if pipe is not None:
                pipe.close()
        for process in self.processes:
            if graceful:
                process.join(wait)
            if process.is_alive():
                process.kill()
            process.join()


def _vector_sub_env(env_id: str, grasped_start: float = 0.0, behaviour_goals: bool = False,
                    rare_state_start: float = 0.0, rare_state_cell: float = 0.05) -> gym.Env:
    env = make_env(env_id)
    if rare_state_start > 0:
        env = RareStateStart(env, rare_state_start, rare_state_cell)
    env = EpisodeStartRNG(GraspedStart(env, grasped_start) if grasped_start > 0 else env)
    return BehaviourGoal(env) if behaviour_goals else env


# ---------------------------------------------------------------------------------------------------------
# RNG states of the sub-envs (checkpoints)
# ---------------------------------------------------------------------------------------------------------


def generator_from_state(state: Mapping[str, Any]) -> np.random.Generator:
    """A numpy ``Generator`` whose bit generator (named in ``state["bit_generator"]``) is in ``state``."""
    bit_generator = getattr(np.random, state["bit_generator"])()
    bit_generator.state = dict(state)
    return np.random.Generator(bit_generator)


def vector_rng_states(venv: gym.vector.VectorEnv, episode_start: bool = False) -> list[dict[str, Any]]:
    """The bit-generator state of each sub-env's ``np_random`` (one dict per sub-env): as it is now, or with
    ``episode_start`` as it was before the reset that began the sub-env's current episode
    ([`EpisodeStartRNG`][her_envs.vector.EpisodeStartRNG], which
    [`make_vector_env`][her_envs.vector.make_vector_env] applies).

    Restore with [`set_vector_rng_states`][her_envs.vector.set_vector_rng_states], then (``episode_start``)
    ``venv.reset()`` redoes those resets.
    """
    if episode_start:
        states = list(venv.get_attr("episode_start_rng"))
        if any(s is None for s in states):
            raise ValueError("vector_rng_states(episode_start=True) needs sub-envs wrapped in EpisodeStartRNG "
                             "that were reset at least once (make_vector_env builds them so)")
        return states
    return [g.bit_generator.state for g in venv.get_attr("np_random")]


def set_vector_rng_states(venv: gym.vector.VectorEnv, states: list[Mapping[str, Any]]) -> None:
    """Set each sub-env's ``np_random`` to a generator in the given state (from
    [`vector_rng_states`][her_envs.vector.vector_rng_states]).

    Raises:
        ValueError: not one state per sub-env (a run resumed with another ``env.n_envs`` / ``env.eval_envs``).
    """
    if len(states) != venv.num_envs:
        raise ValueError(f"{len(states)} saved env RNG states for {venv.num_envs} envs")
    venv.set_attr("np_random", [generator_from_state(s) for s in states])


# ---------------------------------------------------------------------------------------------------------
# One vector step, SAME_STEP autoreset undone
# ---------------------------------------------------------------------------------------------------------


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
