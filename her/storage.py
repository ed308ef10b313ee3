"""Episode storage: where the data lives.

Episodes are kept whole in one ring of *state slots*. An episode ``e`` with ``T_e`` transitions occupies
``T_e + 1`` consecutive slots (modulo the ring size) holding the states ``s_0..s_{T_e}``, each stored once
(no ``obs``/``next_obs`` copies). Slot ``i`` with step ``t < T_e`` also holds transition ``t``: the action,
the env's reward, the per-step info arrays a reward function needs, whether it ended the episode by a
true termination and (goal storages) a copy of the next state's achieved goal, which the 1-step reward reads
without another random access. The next state of the transition in slot ``i`` is slot ``i + 1`` (mod the ring size).

The storage takes complete episodes only (``add_episode``). Steps coming from parallel envs are staged per env by
an ``her.EpisodeWriter`` (``her/writer.py``, which holds the storage; this module never imports it) and handed
over when their episode ends, so only complete episodes are ever sampled and episodes never mix. When the ring is
full the oldest whole episodes are dropped; listeners (e.g. a prioritized sampler) are told which transitions
entered and left. Semantics: ``docs/semantics.md``. The saved format and its migration: ``her/storage_format.py``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from ._util import as_shape, positive_int, real_float32
from .storage_format import STORAGE_FORMAT, load_npz, migrate_storage_state, save_npz

__all__ = ["STORAGE_FORMAT", "EpisodeStorage", "StorageListener", "migrate_storage_state", "storage_from_env"]


class StorageListener(Protocol):
    """Told about the transitions that enter or leave a storage (``storage.add_listener``; a prioritized sampler
    is one). ``slots``: int64 [N] transition slots."""

    def on_added(self, storage: EpisodeStorage, slots: np.ndarray) -> None: ...

    def on_removed(self, storage: EpisodeStorage, slots: np.ndarray) -> None: ...


#: the step-wise API the storage had before the writer became its own piece -> where it is now
_MOVED = {
    "add": "buffer.add(...) of an her.HerReplayBuffer, or her.EpisodeWriter(storage).add(...)",
    "discard_in_progress": "buffer.discard_in_progress() or writer.discard_in_progress()",
    "in_progress_lengths": "buffer.in_progress_lengths() or writer.in_progress_lengths()",
    "writer": "buffer.writer, or her.EpisodeWriter(storage)",
}


class EpisodeStorage:
    """Ring storage of whole episodes, states stored once, float32.

    Args:
        capacity: transitions held when episodes are ``max_episode_steps`` long (the ring has
            ``capacity + ceil(capacity / max_episode_steps)`` state slots; shorter episodes use one extra slot
            each for their last state, so slightly fewer transitions fit).
        observation_shape: shape of one observation, e.g. ``(25,)`` for FetchPush.
        action_shape: shape of one action, e.g. ``(4,)``; ``()`` for a discrete action (stored as float32).
        goal_shape: shape of one goal, e.g. ``(3,)``; ``None`` for plain, goal-free transitions.
        max_episode_steps: the usual episode length (the env's time limit). Longer episodes are accepted up
            to ``capacity`` transitions.
        n_envs: number of parallel envs an ``EpisodeWriter`` over this storage stages by default (the storage
            itself holds complete episodes only).
        info_shapes: per-step info arrays to keep for the reward function, ``{key: shape}``; stored as float32.
        validate: check NaN/inf at every ``add_episode`` (and a writer's shapes at every step); cheap, on by default.

    Raises:
        ValueError: non-positive capacity, max_episode_steps or n_envs.

    Episodes longer than ``capacity`` transitions are refused with a ValueError (see ``add_episode`` and
    ``EpisodeWriter``).
    """

    n_restores = 0  # times load_state_dict replaced the contents

    def __init__(
        self,
        capacity: int,
        observation_shape: tuple[int, ...],
        action_shape: tuple[int, ...],
        goal_shape: tuple[int, ...] | None = None,
        *,
        max_episode_steps: int = 50,
        n_envs: int = 1,
        info_shapes: Mapping[str, tuple[int, ...]] | None = None,
        validate: bool = True,
    ) -> None:
        self.capacity = positive_int(capacity, "capacity")
        self.max_episode_steps = positive_int(max_episode_steps, "max_episode_steps")
        self.n_envs = positive_int(n_envs, "n_envs")
        self.observation_shape = as_shape(observation_shape, "observation_shape")
        self.action_shape = as_shape(action_shape, "action_shape")
        self.goal_shape = None if goal_shape is None else as_shape(goal_shape, "goal_shape")
        self.info_shapes = {k: as_shape(v, f"info_shapes[{k!r}]") for k, v in (info_shapes or {}).items()}
        self.validate = validate
        self.n_slots = self.capacity + -(-self.capacity // self.max_episode_steps) + 1
        S = self.n_slots

        # One record per slot, so that a sampled transition costs one random memory access instead of one per
        # array (the sampler is bound by cache misses and numpy call overhead, not arithmetic). Achieved goals
        # are read at other slots than the sampled one (relabeled goals, n-step windows): they live in a
        # separate contiguous array, which `take` gathers fastest. The record also keeps a copy of ag_{t+1}:
        # the 1-step reward reads it from the sampled record, one random gather fewer.
        self.dtype = self._record_dtype()
        self.data = np.zeros(S, self.dtype)
        if self.goal_shape is not None:
            self.achieved_goal = np.zeros((S, *self.goal_shape), np.float32)
        self._bind_fields()
        # 1 byte per slot, True where the slot holds a sampleable transition: samplers test candidate slots
        # here (1 MB per million slots, mostly in cache) before gathering the records of the accepted ones.
        self.sampleable = np.zeros(S, np.bool_)

        self._head = 0  # next slot to write
        self._episodes: deque[tuple[int, int]] = deque()  # live episodes (start slot, T), oldest first
        self._n_live_states = 0
        self.n_transitions = 0
        self.n_episodes_added = 0
        self._listeners: list[StorageListener] = []

    def _record_dtype(self) -> np.dtype:
        fields: list[tuple[str, Any, tuple[int, ...]]] = [("observation", np.float32, self.observation_shape)]
        if self.goal_shape is not None:
            fields += [("desired_goal", np.float32, self.goal_shape),
                       ("next_achieved_goal", np.float32, self.goal_shape)]
        fields += [("action", np.float32, self.action_shape), ("reward", np.float32, ())]
        fields += [("info." + k, np.float32, shp) for k, shp in self.info_shapes.items()]
        # step t within the episode and its length T (0 = empty slot); terminated: this transition ended the
        # episode by a true termination; episode_terminated: its episode ended so.
        fields += [("step", np.int32, ()), ("length", np.int32, ()), ("terminated", np.bool_, ()),
                   ("episode_terminated", np.bool_, ())]
        return np.dtype(fields, align=True)

    def _bind_fields(self) -> None:
        """Field views of the records, shape [n_slots, ...]; writes go through to ``data``."""
        self.observation = self.data["observation"]
        if self.goal_shape is not None:
            self.desired_goal = self.data["desired_goal"]
        self.action, self.reward = self.data["action"], self.data["reward"]
        self.terminated, self.step, self.episode_length = self.data["terminated"], self.data["step"], self.data["length"]
        self.info = {k: self.data["info." + k] for k in self.info_shapes}

    def __getattr__(self, name: str) -> Any:  # only reached for a missing attribute
        if name in _MOVED:
            raise AttributeError(f"EpisodeStorage.{name} is gone: the storage holds complete episodes only; step-wise "
                                 f"writing is an her.EpisodeWriter's ({_MOVED[name]})")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # ------------------------------------------------------------------ queries
    @property
    def has_goals(self) -> bool:
        return self.goal_shape is not None

    @property
    def n_episodes(self) -> int:
        """Complete episodes currently stored."""
        return len(self._episodes)

    def __len__(self) -> int:
        """Sampleable transitions (of complete episodes) currently stored."""
        return self.n_transitions

    @property
    def oldest_slot(self) -> int:
        return self._episodes[0][0] if self._episodes else self._head

    @property
    def wraps(self) -> bool:
        """True when the live slots run past the end of the ring (slot arithmetic then needs ``% n_slots``)."""
        return self.oldest_slot + self._n_live_states > self.n_slots

    @property
    def n_live_states(self) -> int:
        return self._n_live_states

    def gather(self, slots: np.ndarray) -> np.ndarray:
        """The records of ``slots`` (int [B], modulo the ring): a structured array [B] with the fields
        ``observation``, ``action``, ``reward``, ``terminated``, ``step``, ``length``, ``episode_terminated``,
        ``achieved_goal``, ``desired_goal``, ``next_achieved_goal`` (goal storages) and ``info.<key>``, one
        gather for all of them."""
        return self.data.take(slots, mode="wrap")

    def is_transition(self, slots: np.ndarray) -> np.ndarray:
        """True where a slot holds a sampleable transition (live episode, not its last state)."""
        return self.sampleable[slots]

    def transition_slots(self) -> np.ndarray:
        """All slots holding sampleable transitions, oldest first, int64 [len(self)]."""
        if not self._episodes:
            return np.zeros(0, np.int64)
        return np.concatenate([(s + np.arange(T)) % self.n_slots for s, T in self._episodes])

    def episodes(self) -> list[tuple[int, int]]:
        """Live episodes as (start slot, number of transitions T), oldest first."""
        return list(self._episodes)

    def add_listener(self, listener: StorageListener) -> None:
        """Register an object told about transitions entering and leaving (e.g. a prioritized sampler, which
        ``attach`` registers). It is told at once about the transitions already stored."""
        self._listeners.append(listener)
        if self.n_transitions:
            listener.on_added(self, self.transition_slots())

    # ------------------------------------------------------------------ writing
    def add_episode(
        self,
        observation: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        *,
        achieved_goal: np.ndarray | None = None,
        desired_goal: np.ndarray | None = None,
        terminated: bool = False,
        info: Mapping[str, np.ndarray] | None = None,
    ) -> tuple[int, int]:
        """Store one complete episode of ``T`` transitions.

        Args:
            observation: [T+1, *observation_shape] states s_0..s_T.
            action: [T, *action_shape].
            reward: [T] rewards the env returned.
            achieved_goal: [T+1, *goal_shape] (goal storages only).
            desired_goal: [T+1, *goal_shape], [T, *goal_shape] or [*goal_shape] (the episode's goal).
            terminated: whether the last transition was a true termination (False for a time limit).
            info: ``{key: [T, *info_shapes[key]]}`` for the keys given at construction.

        Returns:
            (start slot, T) of the stored episode.

        Raises:
            ValueError: wrong shapes, NaN/inf or complex values, T < 1, T > capacity, missing goals or info keys.
            TypeError: ``terminated`` is not a bool.
        """
        obs = real_float32(observation, "observation")
        T = obs.shape[0] - 1 if obs.ndim >= 1 else -1
        if T < 1:
            raise ValueError(f"an episode needs at least 2 states (1 transition), got observation shape {obs.shape}")
        if T > self.capacity:
            raise ValueError(
                f"episode of {T} transitions is longer than the storage capacity {self.capacity}: "
                "raise `capacity` or shorten episodes"
            )
        data = {"observation": obs, "action": real_float32(action, "action"), "reward": real_float32(reward, "reward")}
        expect = {"observation": (T + 1, *self.observation_shape), "action": (T, *self.action_shape), "reward": (T,)}
        if self.goal_shape is not None:
            if achieved_goal is None or desired_goal is None:
                raise ValueError("this storage keeps goals: add_episode needs achieved_goal and desired_goal")
            dg = real_float32(desired_goal, "desired_goal")
            if dg.shape == self.goal_shape:
                dg = np.broadcast_to(dg, (T + 1, *self.goal_shape))
            elif dg.shape == (T, *self.goal_shape):
                dg = np.concatenate([dg, dg[-1:]])
            data["achieved_goal"] = real_float32(achieved_goal, "achieved_goal")
            data["desired_goal"] = dg
            expect["achieved_goal"] = expect["desired_goal"] = (T + 1, *self.goal_shape)
        elif achieved_goal is not None or desired_goal is not None:
            raise ValueError("this storage was built without goal_shape: pass no achieved_goal/desired_goal")
        info = info or {}
        missing = set(self.info_shapes) - set(info)
        if missing:
            raise ValueError(f"info is missing keys {sorted(missing)} (expected keys {sorted(self.info_shapes)})")
        for k, shp in self.info_shapes.items():
            data["info." + k] = real_float32(info[k], "info." + k)
            expect["info." + k] = (T, *shp)
        for k, arr in data.items():
            if arr.shape != expect[k]:
                why = (f" (T = {T} transitions, from the {T + 1} states of observation: an episode of T transitions "
                       "has T + 1 states s_0..s_T)") if k != "observation" and arr.shape[:1] != expect[k][:1] else ""
                raise ValueError(f"{k}: expected shape {expect[k]}, got {arr.shape}{why}")
            if self.validate and not np.isfinite(arr).all():
                bad = np.argwhere(~np.isfinite(arr.reshape(arr.shape[0], -1)).all(axis=1)).ravel()[:5]
                raise ValueError(f"{k} contains NaN or inf (at steps {bad.tolist()}); refusing to store the episode")
        if not isinstance(terminated, (bool, np.bool_)):
            raise TypeError("terminated must be a bool (did the last transition end the episode by a true "
                            f"termination?), got {type(terminated).__name__}: {terminated!r}")
        return self._write(data, T, bool(terminated))

    def _write(self, data: dict[str, np.ndarray], T: int, terminated: bool) -> tuple[int, int]:
        S, n = self.n_slots, T + 1
        while self.n_slots - self._n_live_states < n:
            self._evict_oldest()
        start = self._head
        end = start + n
        states: slice | np.ndarray
        trans: slice | np.ndarray
        if end <= S:
            states, trans = slice(start, end), slice(start, end - 1)
        else:
            ring = np.arange(start, end) % S
            states, trans = ring, ring[:-1]
        d = self.data
        d["observation"][states] = data["observation"]
        if self.has_goals:
            self.achieved_goal[states] = data["achieved_goal"]
            d["desired_goal"][states] = data["desired_goal"]
            d["next_achieved_goal"][trans] = data["achieved_goal"][1:]
        d["action"][trans] = data["action"]
        d["reward"][trans] = data["reward"]
        for k in self.info_shapes:
            d["info." + k][trans] = data["info." + k]
        d["step"][states] = np.arange(n, dtype=np.int32)
        d["length"][states] = T
        self.sampleable[states] = True
        self.sampleable[(start + T) % S] = False  # the last state starts no transition
        d["terminated"][states] = False
        d["episode_terminated"][states] = terminated
        if terminated:
            d["terminated"][(start + T - 1) % S] = True
        self._head = end % S
        self._episodes.append((start, T))
        self._n_live_states += n
        self.n_transitions += T
        self.n_episodes_added += 1
        if self._listeners:
            slots = (start + np.arange(T)) % S
            for listener in self._listeners:
                listener.on_added(self, slots)
        return start, T

    def _evict_oldest(self) -> None:
        start, T = self._episodes.popleft()
        states = (start + np.arange(T + 1)) % self.n_slots
        self.data["length"][states] = 0
        self.sampleable[states] = False
        self._n_live_states -= T + 1
        self.n_transitions -= T
        for listener in self._listeners:
            listener.on_removed(self, states[:-1])

    # ------------------------------------------------------------------ persistence
    def state_dict(self, copy: bool = True) -> dict[str, Any]:
        """Everything needed to restore the stored episodes exactly (not the unfinished ones: after a load the
        envs restart, so an in-progress episode would otherwise be glued onto the next one).

        Args:
            copy: return copies (a snapshot that later adds do not change); ``False`` returns views of the ring
                (what ``save`` uses, to write without doubling the memory).
        """
        state: dict[str, Any] = {"field." + k: a.copy() if copy else a for k, a in self._arrays().items()}
        state["format"] = np.asarray(STORAGE_FORMAT, np.int64)
        state["episodes"] = np.asarray(list(self._episodes), np.int64).reshape(-1, 2)
        state["scalars"] = np.asarray([self._head, self._n_live_states, self.n_transitions, self.n_episodes_added,
                                       self.n_slots], np.int64)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from ``state_dict()``. ``n_restores`` counts up, so that the writers of this storage drop their
        unfinished staged episodes at their next call (the envs restart).

        Raises:
            ValueError: the state was saved from a storage of another size or layout, or in a format this version
                does not read (``migrate_storage_state``).
        """
        state = migrate_storage_state(state)
        head, live, n_tr, n_added, n_slots = (int(x) for x in state["scalars"])
        if n_slots != self.n_slots:
            raise ValueError(f"saved storage has {n_slots} slots, this one {self.n_slots}: use the same capacity")
        arrays = self._arrays()
        extra = sorted(k[len("field."):] for k in state if k.startswith("field.") and k[len("field."):] not in
                       arrays)
        if extra:
            raise ValueError(f"saved fields {extra} are not in this storage (another storage layout)")
        for k, a in arrays.items():
            saved = state.get("field." + k)
            if saved is None or saved.shape != a.shape:
                got = None if saved is None else saved.shape
                raise ValueError(f"{k}: saved shape {got}, expected {a.shape} (another storage layout)")
            a[...] = saved
        self.sampleable[:] = self.data["step"] < self.data["length"]
        self._episodes = deque((int(s), int(T)) for s, T in np.asarray(state["episodes"]).reshape(-1, 2))
        self._head, self._n_live_states, self.n_transitions, self.n_episodes_added = head, live, n_tr, n_added
        self.n_restores += 1
        for listener in self._listeners:
            listener.on_removed(self, np.arange(self.n_slots))
            listener.on_added(self, self.transition_slots())

    def save(self, path: str) -> None:
        """Write the storage compressed (``.npz``) atomically: a temp file, fsync, then ``os.replace``; the file
        gets the permissions ``open()`` would give it (the umask's). See ``her.storage_format.save_npz``."""
        save_npz(path, self.state_dict(copy=False))

    def load(self, path: str) -> None:
        """Load a file written by ``save`` (of any format ``migrate_storage_state`` reads).

        Raises:
            ValueError: a file of another storage size or layout, or of an unknown format."""
        self.load_state_dict(load_npz(path))

    # ------------------------------------------------------------------ append-only episode log
    def episodes_after(self, n_added: int) -> dict[str, np.ndarray] | None:
        """The episodes added after the first ``n_added`` (``n_episodes_added`` at some earlier moment), oldest
        first, as ``add_episodes`` takes them: ``records`` (the storage's structured records of their
        ``T + 1`` state slots each, concatenated), ``achieved_goal`` [sum(T + 1), *goal_shape] (goal storages)
        and ``lengths`` int64 [episodes] (each ``T``). ``None`` when some of them were already evicted (more
        than the storage holds were added since): only a full ``state_dict`` then describes the storage.

        Raises:
            ValueError: ``n_added`` is negative or above ``n_episodes_added``.
        """
        k = self.n_episodes_added - int(n_added)
        if int(n_added) < 0 or k < 0:
            raise ValueError(f"n_added must be in [0, {self.n_episodes_added}] (episodes added so far), got {n_added}")
        if k > len(self._episodes):
            return None
        episodes = list(self._episodes)[len(self._episodes) - k:]
        slots = (np.concatenate([(s + np.arange(T + 1)) % self.n_slots for s, T in episodes]) if episodes
                 else np.zeros(0, np.int64))
        out = {"records": self.data[slots], "lengths": np.asarray([T for _, T in episodes], np.int64).reshape(-1)}
        if self.has_goals:
            out["achieved_goal"] = self.achieved_goal[slots]
        return out

    def add_episodes(self, chunk: Mapping[str, np.ndarray]) -> None:
        """Add again, in order, the episodes of ``episodes_after`` (of a storage of the same layout): a
        storage that held the same episodes before them ends up equal to the one they came from (slots, eviction,
        counters), and the listeners hear of each as of a new episode.

        Raises:
            ValueError: records of another layout, or lengths that do not add up to the records.
        """
        records, lengths = np.asarray(chunk["records"]), np.asarray(chunk["lengths"], np.int64).reshape(-1)
        if records.dtype != self.dtype:
            raise ValueError(f"episode records of another storage layout: fields {records.dtype.names}, this "
                             f"storage has {self.dtype.names}")
        if int((lengths + 1).sum()) != len(records) or (lengths < 1).any() or (lengths > self.capacity).any():
            raise ValueError(f"episode lengths {lengths.tolist()[:8]} do not match {len(records)} records")
        ag = np.asarray(chunk["achieved_goal"]) if self.has_goals else None
        off = 0
        for T in lengths.tolist():
            r = records[off:off + T + 1]
            data = {"observation": r["observation"], "action": r["action"][:T], "reward": r["reward"][:T]}
            if ag is not None:
                data["achieved_goal"], data["desired_goal"] = ag[off:off + T + 1], r["desired_goal"]
            for k in self.info_shapes:
                data["info." + k] = r["info." + k][:T]
            self._write(data, T, bool(r["episode_terminated"][0]))
            off += T + 1

    @property
    def nbytes(self) -> int:
        """Bytes held by the ring arrays."""
        return int(self.data.nbytes + self.sampleable.nbytes + (self.achieved_goal.nbytes if self.has_goals else 0))

    def _arrays(self) -> dict[str, np.ndarray]:
        """Every stored array by name: the record fields and the achieved goals."""
        arrays = {k: self.data[k] for k in self.dtype.names or ()}
        if self.has_goals:
            arrays["achieved_goal"] = self.achieved_goal
        return arrays


def check_is_storage(storage: object, name: str = "storage") -> None:
    """Raises:
        TypeError: ``storage`` is not an [`EpisodeStorage`][her.storage.EpisodeStorage]."""
    if not isinstance(storage, EpisodeStorage):
        raise TypeError(f"{name} must be an her.EpisodeStorage (e.g. her.storage_from_env(env, capacity)), got "
                        f"{type(storage).__name__}")


def storage_from_env(env: Any, capacity: int, n_envs: int = 1, **kwargs: Any) -> EpisodeStorage:
    """Build an ``EpisodeStorage`` from a gymnasium (goal) env's spaces, without importing gymnasium.

    A Dict observation space with ``observation``/``achieved_goal``/``desired_goal`` gives a goal storage; any
    other space a goal-free one. ``max_episode_steps`` comes from ``env.spec`` when it has one. A vector env
    works too (its ``single_observation_space``/``single_action_space`` are used and ``n_envs`` defaults to
    ``env.num_envs``).

    Raises:
        TypeError: ``env`` has no observation and action spaces.
        ValueError: a Dict space without the three goal-env keys.
    """
    if not hasattr(env, "observation_space") or not hasattr(env, "action_space"):
        raise TypeError(f"env must be a gymnasium env or vector env (with observation_space and action_space), "
                        f"got {type(env).__name__}")
    obs_space = getattr(env, "single_observation_space", None) or env.observation_space
    act_space = getattr(env, "single_action_space", None) or env.action_space
    if hasattr(env, "num_envs") and n_envs == 1:
        n_envs = int(env.num_envs)
    spaces = getattr(obs_space, "spaces", None)
    if spaces is not None:
        need = {"observation", "achieved_goal", "desired_goal"}
        if not need <= set(spaces):
            raise ValueError(f"a Dict observation space needs keys {sorted(need)}, got {sorted(spaces)}")
        obs_shape, goal_shape = spaces["observation"].shape, spaces["achieved_goal"].shape
    else:
        obs_shape, goal_shape = obs_space.shape, None
    spec = getattr(env, "spec", None)
    if "max_episode_steps" not in kwargs and spec is not None and getattr(spec, "max_episode_steps", None):
        kwargs["max_episode_steps"] = int(spec.max_episode_steps)
    action_shape = act_space.shape if act_space.shape is not None else ()
    return EpisodeStorage(capacity, obs_shape, action_shape, goal_shape, n_envs=n_envs, **kwargs)
