"""Step-wise writing: per-env staging of the episodes in progress, handed to the storage whole when they end.

An ``EpisodeWriter`` holds the ``EpisodeStorage`` it writes to and gives it complete episodes only
(``storage.add_episode``); the storage knows nothing of writers. ``HerReplayBuffer`` owns one (``buffer.writer``,
``buffer.add``); a loop without a buffer builds its own: ``EpisodeWriter(storage).add(...)``. Semantics:
``docs/semantics.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ._util import positive_int, refuse_complex
from .storage import EpisodeStorage, check_is_storage  # one way: storage.py never imports this

__all__ = ["EpisodeWriter"]

_GOAL_KEYS = ("observation", "achieved_goal", "desired_goal")


class _EnvStage:
    """The staged episode of one env: arrays for states ``s_0..s_t`` and transitions ``0..t-1`` (grown by
    doubling up to the storage capacity), its length and whether it was refused."""

    def __init__(self, storage: EpisodeStorage, size: int | None = None) -> None:
        L = size or storage.max_episode_steps
        self.size = L
        self.arrays: dict[str, np.ndarray] = {"observation": np.zeros((L + 1, *storage.observation_shape), np.float32)}
        if storage.goal_shape is not None:
            self.arrays["achieved_goal"] = np.zeros((L + 1, *storage.goal_shape), np.float32)
            self.arrays["desired_goal"] = np.zeros((L + 1, *storage.goal_shape), np.float32)
        self.arrays["action"] = np.zeros((L, *storage.action_shape), np.float32)
        self.arrays["reward"] = np.zeros(L, np.float32)
        for k, shp in storage.info_shapes.items():
            self.arrays["info." + k] = np.zeros((L, *shp), np.float32)
        self.reset()

    def reset(self) -> None:
        self.length = 0  # transitions staged so far
        self.started = False  # s_0 staged
        self.too_long = False  # passed the capacity: refused, its remaining steps are dropped until it ends

    def grown(self, storage: EpisodeStorage, env: int) -> _EnvStage:
        """A stage of twice the size holding this one's data.

        Raises:
            ValueError: the episode already has ``storage.capacity`` transitions.
        """
        if self.size >= storage.capacity:
            raise ValueError(
                f"env {env}: episode passed the storage capacity of {storage.capacity} transitions without ending; "
                "raise `capacity` or end episodes sooner"
            )
        new = _EnvStage(storage, min(2 * self.size, storage.capacity))
        for k, arr in self.arrays.items():
            n = self.length + (1 if arr.shape[0] == self.size + 1 else 0)  # states: one more than transitions
            new.arrays[k][:n] = arr[:n]
        new.length, new.started, new.too_long = self.length, self.started, self.too_long
        return new


def _check_shape(name: str, arr: Any, shape: tuple[int, ...]) -> None:
    if type(arr) is np.ndarray:  # the per-step path: two attribute reads, no call
        got = arr.shape
        if arr.dtype.kind == "c":
            refuse_complex(arr, name)
    else:
        got = np.shape(arr)
        refuse_complex(arr, name)
    if got != shape:
        raise ValueError(f"{name}: expected shape {shape} ([n_envs, ...]), got {got}")


class EpisodeWriter:
    """Stages one step of every env at a time and stores each env's episode in the storage when it ends.

    Only complete episodes reach the storage, so only they are ever sampled and episodes of different envs never
    mix. An episode longer than ``storage.capacity`` transitions is refused with a ValueError as soon as it passes
    the capacity, once; its remaining steps are then dropped up to its end, and the other envs' steps are kept.
    After ``storage.load_state_dict`` (or ``load``) the staged steps are dropped at the next call: the envs
    restart, and an episode in progress would otherwise be glued onto the next one.

    Args:
        storage: the ``EpisodeStorage`` to write complete episodes to (``storage.add_episode``).
        n_envs: number of parallel envs whose steps ``add`` receives; default ``storage.n_envs``.

    Raises:
        ValueError: ``n_envs`` not a positive integer.
        TypeError: ``storage`` is not an ``EpisodeStorage``.
    """

    _restores = 0  # storage.n_restores when the stages were last valid (class default: writers pickled before it)

    def __init__(self, storage: EpisodeStorage, n_envs: int | None = None) -> None:
        check_is_storage(storage)
        self.storage = storage
        self.n_envs = storage.n_envs if n_envs is None else positive_int(n_envs, "n_envs")
        self._stages = [_EnvStage(storage) for _ in range(self.n_envs)]
        self._restores = storage.n_restores

    def add(
        self,
        observation: Mapping[str, np.ndarray] | np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        next_observation: Mapping[str, np.ndarray] | np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        info: Mapping[str, np.ndarray] | None = None,
    ) -> list[tuple[int, int]]:
        """Add one step of every env (``n_envs`` rows); an env's episode is stored when it ends.

        Args:
            observation: s_t. A goal env's dict ``{"observation": [n_envs, *obs], "achieved_goal": [n_envs, *g],
                "desired_goal": [n_envs, *g]}``, or an array [n_envs, *obs] for goal-free storage.
            action: [n_envs, *action_shape].
            reward: [n_envs].
            next_observation: s_{t+1} in the same layout: the *real* next state, also at an episode end (with
                gymnasium vector envs, the ``final_obs`` of an autoreset env, not the reset observation).
            terminated: [n_envs] bool (or 0/1 numbers), true end of the episode (no bootstrapping).
            truncated: [n_envs] bool (or 0/1 numbers), time-limit end (bootstrapping continues).
            info: ``{key: [n_envs, *shape]}`` for the storage's ``info_shapes`` keys.

        Returns:
            (start slot, T) of each episode stored by this call.
        Raises:
            ValueError: wrong shapes, missing keys, complex values, flags that are not bools, an episode longer
                than the capacity, NaN/inf (detected when the episode is stored, with the storage's ``validate``).
                One env's refused episode does not cost the other envs their step.
        """
        st = self.storage
        if st.n_restores != self._restores:
            self.discard_in_progress()
        states = self._states(observation, next_observation)
        if st.validate:
            self._validate(states, action, reward, terminated, truncated, info)
        done = np.logical_or(terminated, truncated)
        error: ValueError | None = None
        for e in range(self.n_envs):
            try:
                self._stage(e, states, action, reward, info, bool(done[e]))
            except ValueError as exc:
                error = error or exc
        stored = []
        for e in np.flatnonzero(done).tolist() if done.any() else ():
            if self._stages[e].length == 0:  # a refused too-long episode ended here
                continue
            try:
                stored.append(self._commit(int(e), bool(terminated[e])))
            except ValueError as exc:
                error = error or exc
        if error is not None:
            raise error
        return stored

    def _states(self, observation: Any, next_observation: Any) -> tuple:
        """(observation, achieved_goal, desired_goal) of s_t, then of s_{t+1}; goals None for goal-free storage.

        Raises:
            ValueError: a goal storage given observations that are not dicts with the three keys.
        """
        if not self.storage.has_goals:
            return observation, None, None, next_observation, None, None
        try:  # the happy path costs three lookups a dict
            return (observation["observation"], observation["achieved_goal"], observation["desired_goal"],
                    next_observation["observation"], next_observation["achieved_goal"],
                    next_observation["desired_goal"])
        except (KeyError, IndexError, TypeError, ValueError):
            for which, d in (("observation", observation), ("next_observation", next_observation)):
                if not isinstance(d, Mapping):
                    raise ValueError("this storage keeps goals: observations must be dicts with keys "
                                     "'observation', 'achieved_goal', 'desired_goal'") from None
                missing = sorted(set(_GOAL_KEYS) - set(d))
                if missing:
                    raise ValueError(f"{which} dict lacks the keys {missing} (a goal storage needs "
                                     f"'observation', 'achieved_goal', 'desired_goal'; got {sorted(d)})") from None
            raise

    def _validate(self, states: tuple, action, reward, terminated, truncated, info) -> None:
        st, n, check = self.storage, self.n_envs, _check_shape
        obs, ag, dg, nobs, nag, ndg = states
        check("observation", obs, (n, *st.observation_shape))
        check("next_observation", nobs, (n, *st.observation_shape))
        if ag is not None:
            assert st.goal_shape is not None, "_states gives goals only for a goal storage"
            g = (n, *st.goal_shape)
            check("achieved_goal", ag, g)
            check("desired_goal", dg, g)
            check("next achieved_goal", nag, g)
            check("next desired_goal", ndg, g)
        check("action", action, (n, *st.action_shape))
        check("reward", reward, (n,))
        check("terminated", terminated, (n,))
        check("truncated", truncated, (n,))
        for name, flags in (("terminated", terminated), ("truncated", truncated)):
            flags = np.asarray(flags)
            if flags.dtype != np.bool_ and not (flags.dtype.kind in "iuf" and ((flags == 0) | (flags == 1)).all()):
                raise ValueError(f"{name} must be a bool array (or 0/1 numbers), got {flags.tolist()[:5]} "
                                 f"(dtype {flags.dtype})")
        if st.info_shapes:
            missing = set(st.info_shapes) - set(info or {})
            if missing:
                raise ValueError(f"info is missing keys {sorted(missing)} (expected {sorted(st.info_shapes)})")
            for k, shp in st.info_shapes.items():
                check("info." + k, info[k], (n, *shp))

    def _stage(self, e: int, states: tuple, action, reward, info, done: bool) -> None:
        """Write env ``e``'s step into its stage (a refused episode's steps are dropped until it ends).
        ``states``: observation, achieved and desired goal of s_t, then of s_{t+1} (goals None goal-free)."""
        stage = self._stages[e]
        if stage.too_long:
            if done:
                stage.reset()
            return
        if stage.length >= stage.size:
            try:
                stage = self._stages[e] = stage.grown(self.storage, e)
            except ValueError:
                stage.too_long = True
                if done:
                    stage.reset()
                raise
        a, t = stage.arrays, stage.length
        obs, ag, dg, nobs, nag, ndg = states
        if not stage.started:
            a["observation"][0] = obs[e]
            if ag is not None:
                a["achieved_goal"][0] = ag[e]
                a["desired_goal"][0] = dg[e]
            stage.started = True
        a["observation"][t + 1] = nobs[e]
        if nag is not None:
            a["achieved_goal"][t + 1] = nag[e]
            a["desired_goal"][t + 1] = ndg[e]
        a["action"][t] = action[e]
        a["reward"][t] = reward[e]
        for k in self.storage.info_shapes:
            a["info." + k][t] = info[k][e]
        stage.length = t + 1

    def _commit(self, env: int, terminated: bool) -> tuple[int, int]:
        stage = self._stages[env]
        a, T = stage.arrays, stage.length
        stage.reset()
        kw: dict[str, Any] = {}
        if self.storage.has_goals:
            kw = {"achieved_goal": a["achieved_goal"][: T + 1], "desired_goal": a["desired_goal"][: T + 1]}
        info = {k: a["info." + k][:T] for k in self.storage.info_shapes}
        return self.storage.add_episode(a["observation"][: T + 1], a["action"][:T], a["reward"][:T],
                                        terminated=terminated, info=info, **kw)

    def discard_in_progress(self, env: int | None = None) -> None:
        """Drop the staged, unfinished episode of one env (or of all envs), e.g. after an env reset.

        Raises:
            IndexError: ``env`` not in ``[0, n_envs)``.
        """
        if env is not None and not 0 <= env < self.n_envs:
            raise IndexError(f"env must be in [0, {self.n_envs}), got {env}")
        for e in range(self.n_envs) if env is None else [env]:
            self._stages[e].reset()
        self._restores = self.storage.n_restores

    def in_progress_lengths(self) -> list[int]:
        """Transitions staged per env for episodes not yet ended (int, ``n_envs`` of them)."""
        if self.storage.n_restores != self._restores:
            self.discard_in_progress()
        return [stage.length for stage in self._stages]

    def __repr__(self) -> str:
        return f"EpisodeWriter(n_envs={self.n_envs}, in_progress={self.in_progress_lengths()})"
