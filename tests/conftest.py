"""Shared helpers for the ``her`` tests: a "tag" goal env driven step by step into an ``EpisodeStorage``, tag
reward/success functions, and a brute-force reference (ring model, goal distributions, n-step returns) written
from docs/semantics.md, independently of ``her``'s internals.

Tag episodes: the achieved goal of step ``k`` of episode ``e`` is ``(e, k)``, the desired goal ``(-1, -1)``,
the observation ``(e, k, env)`` and the action of transition ``t`` is ``(e, t)``, so every sampled array says
which episode and which step it came from. Episode ids count episode *starts* over all envs.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import strategies as st

import her

# Test processes (pytest -n 2 runs two) and the her-train processes they start use one torch thread each
# (train.torch_threads auto reads OMP_NUM_THREADS): OpenMP threads spin-wait for a busy core, so two-thread
# updates on a shared machine run several times slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")

GOAL_DIM = 2
OBS_DIM = 3
ACT_DIM = 2
DESIRED = np.array([-1.0, -1.0], np.float32)
INFO_SHAPES = {"w": (1,)}
MIXED_OTHER_DESIRED = 0.5  # make_relabeler's default other_desired_fraction


def info_w(e: int, t: int) -> float:
    """Per-step info value of transition t of episode e (a small multiple of 1/4's input, exact in float32)."""
    return float((3 * e + t) % 5)


def tag_reward(achieved_goal: np.ndarray, desired_goal: np.ndarray, info=None) -> np.ndarray:
    """Asymmetric, sparse-plus-shaped, info-dependent, vectorized reward; exact in float32 for tag goals.

    ``100`` on success (goals equal), plus ``(ag0 - dg0) + 0.5 (ag1 - 3 dg1)`` (swapping the arguments changes
    it), plus ``0.25 * info["w"]`` when info is given.
    """
    ag = np.asarray(achieved_goal, np.float32)
    dg = np.asarray(desired_goal, np.float32)
    success = np.all(ag == dg, axis=-1)
    r = 100.0 * success + (ag[..., 0] - dg[..., 0]) + 0.5 * (ag[..., 1] - 3.0 * dg[..., 1])
    if info is not None:
        r = r + 0.25 * np.asarray(info["w"], np.float32)[..., 0]
    return np.asarray(r, np.float32)


def sparse_reward(achieved_goal: np.ndarray, desired_goal: np.ndarray, info=None) -> np.ndarray:
    """Fetch-style sparse reward: 0 on success, -1 otherwise (float32, shape [N])."""
    return -np.any(np.asarray(achieved_goal) != np.asarray(desired_goal), axis=-1).astype(np.float32)


def tag_success(achieved_goal: np.ndarray, desired_goal: np.ndarray) -> np.ndarray:
    return np.all(np.asarray(achieved_goal) == np.asarray(desired_goal), axis=-1)


def tag_terminated(achieved_goal: np.ndarray, desired_goal: np.ndarray, info=None) -> np.ndarray:
    """A vectorized compute_terminated: the goal is reached, or (goal-independent, read from info) ``w == 4``."""
    d = np.all(np.asarray(achieved_goal) == np.asarray(desired_goal), axis=-1)
    if info is not None:
        d = d | (np.asarray(info["w"])[..., 0] == 4)
    return d


# ---------------------------------------------------------------------------------------------------------
# Tag episodes, stepped through storage.add from n_envs interleaved envs
# ---------------------------------------------------------------------------------------------------------


@dataclass
class TagEpisode:
    id: int
    env: int
    length: int
    terminated: bool

    def ag(self, k: int) -> np.ndarray:
        return np.array([self.id, k], np.float32)

    def obs(self, k: int) -> np.ndarray:
        return np.array([self.id, k, self.env], np.float32)

    def info(self, t: int) -> float:
        return info_w(self.id, t)

    def env_reward(self, t: int) -> float:
        return float(tag_reward(self.ag(t + 1)[None], DESIRED[None], {"w": np.array([[self.info(t)]])})[0])


@dataclass
class TagRun:
    """What was fed to a storage: episodes by id, ids in the order they were stored (completed)."""

    episodes: dict[int, TagEpisode] = field(default_factory=dict)
    completed: list[int] = field(default_factory=list)
    in_progress: dict[int, int] = field(default_factory=dict)  # env -> id of its unfinished episode


def make_tag_storage(capacity: int, n_envs: int = 1, max_episode_steps: int = 50, info: bool = True,
                     **kw) -> her.EpisodeStorage:
    return her.EpisodeStorage(capacity, (OBS_DIM,), (ACT_DIM,), (GOAL_DIM,), max_episode_steps=max_episode_steps,
                              n_envs=n_envs, info_shapes=INFO_SHAPES if info else None, **kw)


class TagEnvs:
    """``writer.n_envs`` tag envs stepped together through ``writer.add``.

    ``target``: the ``EpisodeWriter`` to step into, or a ``HerReplayBuffer`` (its writer), or an ``EpisodeStorage``
    (a new writer over it). ``schedules[env]`` is a list of (length, terminated) cycled through for that env's
    episodes.
    """

    def __init__(self, target: her.EpisodeWriter | her.HerReplayBuffer | her.EpisodeStorage,
                 schedules: list[list[tuple[int, bool]]], run: TagRun | None = None) -> None:
        if isinstance(target, her.EpisodeStorage):
            target = her.EpisodeWriter(target)
        elif isinstance(target, her.HerReplayBuffer):
            target = target.writer
        self.writer, self.storage, self.schedules = target, target.storage, schedules
        self.run = run or TagRun()
        self.cursor = [0] * target.n_envs
        self.state = [self._new_episode(env) for env in range(target.n_envs)]  # [episode, step]

    def _new_episode(self, env: int) -> list:
        sched = self.schedules[env]
        ln, term = sched[self.cursor[env] % len(sched)]
        self.cursor[env] += 1
        eid = max(self.run.episodes, default=-1) + 1
        ep = TagEpisode(eid, env, ln, term)
        self.run.episodes[eid] = ep
        return [ep, 0]

    def step(self, n_steps: int = 1) -> TagRun:
        storage, n, run = self.storage, self.writer.n_envs, self.run
        use_info = bool(storage.info_shapes)
        for _ in range(n_steps):
            eps = [s[0] for s in self.state]
            ks = [s[1] for s in self.state]
            obs = {"observation": np.stack([ep.obs(k) for ep, k in zip(eps, ks)]),
                   "achieved_goal": np.stack([ep.ag(k) for ep, k in zip(eps, ks)]),
                   "desired_goal": np.stack([DESIRED] * n)}
            nobs = {"observation": np.stack([ep.obs(k + 1) for ep, k in zip(eps, ks)]),
                    "achieved_goal": np.stack([ep.ag(k + 1) for ep, k in zip(eps, ks)]),
                    "desired_goal": np.stack([DESIRED] * n)}
            action = np.array([[ep.id, k] for ep, k in zip(eps, ks)], np.float32)
            reward = np.array([ep.env_reward(k) if use_info else
                               float(tag_reward(ep.ag(k + 1)[None], DESIRED[None])[0])
                               for ep, k in zip(eps, ks)], np.float32)
            last = np.array([k + 1 == ep.length for ep, k in zip(eps, ks)])
            terminated = last & np.array([ep.terminated for ep in eps])
            truncated = last & ~terminated
            info = {"w": np.array([[ep.info(k)] for ep, k in zip(eps, ks)], np.float32)} if use_info else None
            self.writer.add(obs, action, reward, nobs, terminated, truncated, info)
            for env in range(n):
                self.state[env][1] += 1
                if last[env]:
                    run.completed.append(eps[env].id)
                    self.state[env] = self._new_episode(env)
        run.in_progress = {env: s[0].id for env, s in enumerate(self.state) if s[1] > 0}
        return run


def add_tag_episode(storage: her.EpisodeStorage, run: TagRun, length: int, terminated: bool = False) -> TagEpisode:
    """Store one complete tag episode with ``add_episode``."""
    eid = max(run.episodes, default=-1) + 1
    ep = TagEpisode(eid, 0, length, terminated)
    run.episodes[eid] = ep
    kw = {}
    if storage.info_shapes:
        kw["info"] = {"w": np.array([[ep.info(t)] for t in range(length)], np.float32)}
    storage.add_episode(np.stack([ep.obs(k) for k in range(length + 1)]),
                        np.array([[eid, t] for t in range(length)], np.float32),
                        np.array([ep.env_reward(t) for t in range(length)], np.float32),
                        achieved_goal=np.stack([ep.ag(k) for k in range(length + 1)]),
                        desired_goal=DESIRED, terminated=terminated, **kw)
    run.completed.append(eid)
    return ep


# ---------------------------------------------------------------------------------------------------------
# Brute-force reference
# ---------------------------------------------------------------------------------------------------------


def reference_live(run: TagRun, n_slots: int) -> list[int]:
    """Ids of the episodes a ring of ``n_slots`` state slots holds: each episode of T transitions takes T + 1
    slots; when an episode does not fit, the oldest whole episodes are dropped."""
    live: deque[int] = deque()
    used = 0
    for eid in run.completed:
        need = run.episodes[eid].length + 1
        while n_slots - used < need:
            used -= run.episodes[live.popleft()].length + 1
        live.append(eid)
        used += need
    return list(live)


def goal_steps(strategy: str, t: int, T: int) -> list[int]:
    """Steps t' whose achieved goal a relabeled transition t may get (uniform over the list); for "mixed" the
    future share only (the rest get a stored desired goal, ``DESIRED`` in tag storages)."""
    if strategy in ("future", "mixed"):
        return list(range(t + 1, T + 1))
    if strategy == "final":
        return [T]
    if strategy == "episode":
        return list(range(1, T + 1))
    raise ValueError(strategy)


def reference_probabilities(run: TagRun, live: list[int], strategy: str, k: int) -> dict[tuple[int, int, int], float]:
    """Exact probability of each (episode, t, goal step) under uniform transition sampling; goal step -1 means
    the original goal was kept."""
    n_trans = sum(run.episodes[e].length for e in live)
    p_rel = k / (k + 1)
    probs: dict[tuple[int, int, int], float] = {}
    for e in live:
        T = run.episodes[e].length
        for t in range(T):
            if p_rel < 1:
                probs[(e, t, -1)] = (1 - p_rel) / n_trans
            steps = goal_steps(strategy, t, T)
            p_ag = p_rel * (1 - MIXED_OTHER_DESIRED) if strategy == "mixed" else p_rel
            if p_ag < p_rel:  # mixed: another stored episode's desired goal, DESIRED in tag storages
                probs[(e, t, -1)] = probs.get((e, t, -1), 0.0) + (p_rel - p_ag) / n_trans
            for s in steps:
                probs[(e, t, s)] = probs.get((e, t, s), 0.0) + p_ag / n_trans / len(steps)
    return probs


def reference_sample(run: TagRun, live: list[int], batch_size: int, rng: np.random.Generator, strategy: str,
                     k: int) -> list[tuple[int, int, np.ndarray]]:
    """Brute-force sampler: enumerate every live transition, draw uniformly, relabel per the strategy."""
    pairs = [(e, t) for e in live for t in range(run.episodes[e].length)]
    out = []
    for i in rng.integers(len(pairs), size=batch_size):
        e, t = pairs[i]
        ep = run.episodes[e]
        if rng.random() < k / (k + 1) and not (strategy == "mixed" and rng.random() < MIXED_OTHER_DESIRED):
            goal = ep.ag(int(rng.choice(goal_steps(strategy, t, ep.length))))
        else:
            goal = DESIRED.copy()
        out.append((e, t, goal))
    return out


@dataclass
class RefTransition:
    reward: float
    m: int
    next_obs: np.ndarray
    discount: float
    terminated: bool


def reference_transition(ep: TagEpisode, t: int, goal: np.ndarray, n: int, gamma: float, reward_fn,
                         use_info: bool = True, stop_at_success: bool = False,
                         terminated_fn=None) -> RefTransition:
    """n-step return of transition t of ``ep`` for goal ``goal``, by the book:
    ``m = min(n, T - t, steps to the first terminated)`` (a terminated episode ends at T, so the first
    terminated is the last transition), ``R = sum_{j<m} gamma^j r_{t+j}`` with every r recomputed for the goal,
    bootstrap from ``s_{t+m}``; with ``stop_at_success`` the window also ends at the first step whose next
    state achieves the goal. With ``terminated_fn`` (a compute_terminated) the stored ends are ignored: step j is
    terminal when ``terminated_fn(ag_{t+j+1}, goal, info_{t+j})``, the window ends at the first one (its reward
    counted) and is terminated when its last step is terminal."""
    m = min(n, ep.length - t)
    ret = 0.0
    d = False
    for j in range(m):
        info = {"w": np.array([[ep.info(t + j)]], np.float32)} if use_info else None
        r = float(reward_fn(ep.ag(t + j + 1)[None], goal[None], info)[0])
        ret += gamma**j * r
        success = stop_at_success and np.array_equal(ep.ag(t + j + 1), goal)
        d = terminated_fn is not None and bool(terminated_fn(ep.ag(t + j + 1)[None], goal[None], info)[0])
        if success or d:
            m = j + 1
            break
    terminated = d if terminated_fn is not None else ep.terminated and t + m == ep.length
    return RefTransition(ret, m, ep.obs(t + m), gamma**m, terminated)


def check_batch(batch: her.Batch, run: TagRun, live: list[int], *, strategy: str, n: int = 1, gamma: float = 0.98,
                reward_fn=tag_reward, use_info: bool = True, stop_at_success: bool = False,
                terminated_fn=None) -> None:
    """Check every row of a batch against the reference: a live, complete episode; goal drawn from the
    strategy's range (or the original goal); (n-step) return, bootstrap state, discount and terminal flag."""
    live_set = set(live)
    B = len(batch)
    for name in ("observation", "action", "reward", "next_observation", "discount", "terminated", "weight",
                 "index", "relabeled", "n_steps"):
        assert len(getattr(batch, name)) == B, name
    assert batch.desired_goal.shape == (B, GOAL_DIM)
    assert batch.reward.shape == batch.discount.shape == batch.terminated.shape == batch.weight.shape == (B,)
    assert batch.reward.dtype == np.float32 and batch.terminated.dtype == np.bool_
    for i in range(B):
        e, t = int(batch.observation[i, 0]), int(batch.observation[i, 1])
        assert e in live_set, f"row {i}: episode {e} is not (or no longer) stored; live {sorted(live_set)}"
        ep = run.episodes[e]
        assert 0 <= t < ep.length
        np.testing.assert_array_equal(batch.observation[i], ep.obs(t))
        np.testing.assert_array_equal(batch.action[i], [e, t])
        g = batch.desired_goal[i]
        if batch.relabeled[i] and strategy == "mixed" and (g == DESIRED).all():
            pass  # another stored episode's desired goal (all tag episodes share DESIRED)
        elif batch.relabeled[i]:
            assert g[0] == e, f"row {i}: goal {g} of another episode than {e}"
            assert int(g[1]) in goal_steps(strategy, t, ep.length), f"row {i}: t={t} T={ep.length} goal {g}"
        else:
            np.testing.assert_array_equal(g, DESIRED)
        ref = reference_transition(ep, t, g, n, gamma, reward_fn, use_info, stop_at_success, terminated_fn)
        assert batch.n_steps[i] == ref.m, f"row {i}: m {batch.n_steps[i]} != {ref.m} (t={t}, T={ep.length})"
        np.testing.assert_array_equal(batch.next_observation[i], ref.next_obs)
        np.testing.assert_allclose(batch.reward[i], ref.reward, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(batch.discount[i], ref.discount, rtol=1e-6)
        assert bool(batch.terminated[i]) == ref.terminated, f"row {i}: e={e} t={t} m={ref.m}"


@st.composite
def tag_setups(draw, max_len: int = 8, min_steps: int = 1):
    """Random ``(n_envs, schedules, capacity, max_episode_steps, n_steps)``: 1-4 envs, each with a schedule of
    episodes ``[(length <= max_len, terminated)]``, a capacity small enough to wrap the ring, and a number of
    vector steps in ``[min_steps, 40]`` to run them for (``TagEnvs``)."""
    n_envs = draw(st.integers(1, 4))
    schedules = [draw(st.lists(st.tuples(st.integers(1, max_len), st.booleans()), min_size=1, max_size=4))
                 for _ in range(n_envs)]
    longest = max(ln for s in schedules for ln, _ in s)
    capacity = draw(st.integers(longest, longest + 30))
    max_episode_steps = draw(st.integers(1, max_len))
    return n_envs, schedules, capacity, max_episode_steps, draw(st.integers(min_steps, 40))


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)
