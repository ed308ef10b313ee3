"""Replay benchmarks, measured in one run on 1,000,000 FetchPush-shaped transitions (obs 25, goal 3, action 4).

    python tests/benchmarks/bench_replay.py                    # every section
    python tests/benchmarks/bench_replay.py --sections sampler # ours vs the gather floor (vs SB3 if installed)

Sections:
- ``sampler``: HER sample throughput at B = 256, 1024, 4096, each batch
  ending in torch tensors on the CPU, for our ``HerReplayBuffer``, a plain numpy gather of B random rows of a flat
  transition table (observation, next observation, action, desired goal, next achieved goal as separate float32
  arrays) plus one vectorized reward (the floor), and Stable-Baselines3's ``HerReplayBuffer`` when SB3 is importable (a
  benchmark-only dependency); at B = 256 also a lean one-function reference doing our sampler's work without its
  checks and call structure (the per-call overhead of the composed library code); ``add()`` cost per transition
  and bytes per stored transition.
- ``prioritized``: prioritized HER sample + priority update at B = 256 against a
  uniform HER sample, and our batched sum tree against a sum tree walked one sample at a time in a Python loop
  (the textbook implementation, written here as the reference).
- ``nstep``: an n = 3 HER sample against an n = 1 sample at B = 256.
- ``torchrl`` (needs the ``[torchrl]`` extra): ours through the adapter ``her.torchrl.HerTorchRLReplayBuffer``
  against ``torchrl.data.HERReplayBuffer`` (``LazyTensorStorage``, its default ``RandomSampler``), both filled
  with the same episodes by ``extend``, both returning TensorDicts: ``sample(B)`` at B = 256, 1024, 4096 (and our
  plain ``her`` sample ending in torch tensors, for the adapter's own cost), a sample right after a one-episode
  ``extend``, ``extend`` of whole episodes and a one-step ``add()`` per transition, bytes per stored transition.
  ``--transitions`` sets the number stored (default 1,000,000).

Timings are medians of per-call CPU time of this thread (``time.thread_time``: the shared machine's other
processes don't inflate it the way they inflate wall time) over repeated calls with fresh random indices (so the
gathers miss the cache as in training), with BLAS and torch at one thread. Compare the ratios printed, which
are measured side by side.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import statistics
import sys
import time

import numpy as np

import her
from her.trees import SumTree

N_TRANSITIONS = 1_000_000
T = 50
OBS, GOAL, ACT = 25, 3, 4
THRESHOLD = 0.05


def fetch_reward(achieved_goal: np.ndarray, desired_goal: np.ndarray, info=None) -> np.ndarray:
    """FetchPush's sparse reward: -(distance > 0.05), vectorized."""
    d = np.linalg.norm(achieved_goal - desired_goal, axis=-1)
    return -(d > THRESHOLD).astype(np.float32)


def fetch_success(achieved_goal: np.ndarray, desired_goal: np.ndarray) -> np.ndarray:
    return np.linalg.norm(achieved_goal - desired_goal, axis=-1) <= THRESHOLD


def timeit(fn, repeats: int = 200, warmup: int = 10) -> float:
    """Median seconds per call."""
    return timeit_many([fn], repeats, warmup)[0]


def timeit_many(fns, repeats: int = 300, warmup: int = 10) -> list[float]:
    """Median seconds per call of each function, calls interleaved round-robin so that every function sees the
    same machine conditions (the ratios are what matters on a shared machine)."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times):
            t0 = time.thread_time()
            fn()
            ts.append(time.thread_time() - t0)
    return [statistics.median(ts) for ts in times]


def make_episodes(n_episodes: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    for _ in range(n_episodes):
        ag = (1.3 + 0.1 * rng.standard_normal((T + 1, GOAL))).astype(np.float32)
        yield dict(
            observation=rng.standard_normal((T + 1, OBS), dtype=np.float32),
            action=rng.uniform(-1, 1, (T, ACT)).astype(np.float32),
            reward=fetch_reward(ag[1:], np.broadcast_to(ag[-1], (T, GOAL))),
            achieved_goal=ag,
            desired_goal=(1.3 + 0.1 * rng.standard_normal(GOAL)).astype(np.float32),
        )


def fill_ours(capacity: int = N_TRANSITIONS) -> her.EpisodeStorage:
    storage = her.EpisodeStorage(capacity, (OBS,), (ACT,), (GOAL,), max_episode_steps=T)
    for ep in make_episodes(capacity // T):
        storage.add_episode(ep["observation"], ep["action"], ep["reward"], achieved_goal=ep["achieved_goal"],
                            desired_goal=ep["desired_goal"])
    return storage


def section_sampler(storage: her.EpisodeStorage) -> None:
    import torch

    torch.set_num_threads(1)
    rng = np.random.default_rng(1)
    buffer = her.HerReplayBuffer(storage, fetch_reward, strategy="future", n_sampled_goal=4, seed=0)
    # The floor: a plain transition table (one row per transition: observation, next observation, action, desired
    # goal, next achieved goal; float32, separate arrays as a flat replay buffer keeps them), B random rows
    # gathered, one vectorized reward, to torch. No relabeling, no episode bookkeeping.
    n = len(storage) - 1
    obs = storage.observation[:n].copy()
    next_obs = storage.observation[1:n + 1].copy()
    act = storage.action[:n].copy()
    dg = storage.desired_goal[:n].copy()
    next_ag = storage.achieved_goal[1:n + 1].copy()

    def floor(B: int):
        i = rng.integers(0, n, B)
        g = dg.take(i, axis=0)
        r = fetch_reward(next_ag.take(i, axis=0), g)
        return [torch.from_numpy(x) for x in (obs.take(i, axis=0), next_obs.take(i, axis=0), act.take(i, axis=0),
                                               g, r)]

    def ours(B: int):
        return buffer.sample(B).to_torch()

    def lean(B: int):
        # Our sampler's work (uniform draw with rejection of episode ends, `future` relabeling with k = 4,
        # next states, rewards, the 8 training tensors) written as one function: no checks, one random draw,
        # no Batch object. It tells the per-call overhead of the composed library code from the work itself.
        st = storage
        base, n_live = st.oldest_slot, st.n_live_states
        n_cand = int(B * n_live / st.n_transitions) + 24
        u = rng.random(n_cand + 2 * B)
        cand = (u[:n_cand] * n_live).astype(np.int64)
        cand += base
        cand %= st.n_slots
        slots = cand[st.sampleable.take(cand)][:B]
        rec = st.data.take(slots)
        nxt = slots + 1
        offset = (u[n_cand:n_cand + B] * (rec["length"] - rec["step"])).astype(np.int64)
        goal_slot = nxt + offset
        relabel = u[n_cand + B:] < 0.8
        g = np.where(relabel[:, None], st.achieved_goal.take(goal_slot, axis=0, mode="wrap"), rec["desired_goal"])
        r = fetch_reward(rec["next_achieved_goal"], g)
        nrec = st.data.take(nxt, mode="wrap")
        return [torch.from_numpy(x) for x in (rec["observation"], g, rec["action"], r, nrec["observation"],
                                               np.full(B, 0.98, np.float32), rec["terminated"],
                                               np.ones(B, np.float32))]

    sb3 = _sb3_buffer()
    print(f"\n== HER sample, B random transitions from {len(storage):,} stored, ending in torch tensors ==")
    print(f"{'B':>6} {'floor us':>10} {'ours us':>10} {'ours/floor':>11} {'SB3 us':>10} {'SB3/ours':>9}")
    for B in (256, 1024, 4096):
        t_floor, t_ours = timeit_many([lambda: floor(B), lambda: ours(B)])
        t_sb3 = timeit(lambda: sb3.sample(B), repeats=30, warmup=3) if sb3 is not None else float("nan")
        print(f"{B:>6} {t_floor * 1e6:>10.0f} {t_ours * 1e6:>10.0f} {t_ours / t_floor:>11.2f} "
              f"{t_sb3 * 1e6:>10.0f} {t_sb3 / t_ours:>9.1f}")

    t_floor, t_lean = timeit_many([lambda: floor(256), lambda: lean(256)])
    print(f"   256 lean one-function reference (same work, no checks): {t_lean * 1e6:.0f} us, "
          f"{t_lean / t_floor:.2f}x the floor ({t_floor * 1e6:.0f} us)")

    # add(): one step of one env at a time, as a training loop does.
    steps = _step_rows(2000)
    ours_add, sb3_add = [], []
    for _ in range(5):  # best of 5 passes over 2000 steps, interleaved with SB3's
        small = her.EpisodeWriter(her.EpisodeStorage(100_000, (OBS,), (ACT,), (GOAL,), max_episode_steps=T))
        t0 = time.thread_time()
        for row in steps:
            small.add(*row)
        ours_add.append((time.thread_time() - t0) / len(steps))
        if sb3 is not None:
            sb3_add.append(_sb3_add_cost(steps))
    print(f"\nadd(), one step of one env: ours {min(ours_add) * 1e6:.1f} us per transition", end="")
    print(f"; SB3 {min(sb3_add) * 1e6:.1f} us per transition" if sb3_add else "; SB3 not installed")
    print(f"bytes per stored transition: ours {storage.nbytes / len(storage):.1f}", end="")
    if sb3 is not None:
        nbytes = sum(v.nbytes for v in sb3.observations.values()) + sum(v.nbytes for v in sb3.next_observations.values())
        nbytes += sum(getattr(sb3, k).nbytes for k in ("actions", "rewards", "dones", "timeouts"))
        nbytes += sum(getattr(sb3, k).nbytes for k in ("ep_start", "ep_length"))
        print(f"; SB3 {nbytes / sb3.buffer_size:.1f}")
    else:
        print()


def _step_rows(n_steps: int):
    rows = []
    for ep in make_episodes(n_steps // T, seed=5):
        for t in range(T):
            o = {"observation": ep["observation"][t:t + 1], "achieved_goal": ep["achieved_goal"][t:t + 1],
                 "desired_goal": ep["desired_goal"][None]}
            no = {"observation": ep["observation"][t + 1:t + 2], "achieved_goal": ep["achieved_goal"][t + 1:t + 2],
                  "desired_goal": ep["desired_goal"][None]}
            rows.append((o, ep["action"][t:t + 1], ep["reward"][t:t + 1], no, np.array([False]),
                         np.array([t == T - 1])))
    return rows


def _sb3_env():
    import gymnasium as gym
    from gymnasium import spaces

    class PushShaped(gym.Env):
        observation_space = spaces.Dict({
            "observation": spaces.Box(-np.inf, np.inf, (OBS,), np.float32),
            "achieved_goal": spaces.Box(-np.inf, np.inf, (GOAL,), np.float32),
            "desired_goal": spaces.Box(-np.inf, np.inf, (GOAL,), np.float32)})
        action_space = spaces.Box(-1, 1, (ACT,), np.float32)

        def compute_reward(self, achieved_goal, desired_goal, info):
            return fetch_reward(achieved_goal, desired_goal)

        def reset(self, *, seed=None, options=None):
            return self.observation_space.sample(), {}

        def step(self, action):
            return self.observation_space.sample(), -1.0, False, False, {}

    from stable_baselines3.common.vec_env import DummyVecEnv

    return DummyVecEnv([PushShaped])


def _sb3_buffer():
    try:
        from stable_baselines3 import HerReplayBuffer
    except ImportError:
        print("(stable_baselines3 not installed: SB3 columns skipped; pip install -e '.[test]' installs it)")
        return None
    env = _sb3_env()
    buf = HerReplayBuffer(N_TRANSITIONS, env.observation_space, env.action_space, env=env, device="cpu",
                          n_sampled_goal=4, goal_selection_strategy="future")
    t0 = time.perf_counter()
    for ep in make_episodes(N_TRANSITIONS // T):
        for t in range(T):
            o = {"observation": ep["observation"][t:t + 1], "achieved_goal": ep["achieved_goal"][t:t + 1],
                 "desired_goal": ep["desired_goal"][None]}
            no = {"observation": ep["observation"][t + 1:t + 2], "achieved_goal": ep["achieved_goal"][t + 1:t + 2],
                  "desired_goal": ep["desired_goal"][None]}
            done = np.array([t == T - 1])
            buf.add(o, no, ep["action"][t:t + 1], ep["reward"][t:t + 1], done,
                    [{"TimeLimit.truncated": bool(done[0])}])
    print(f"(SB3 buffer filled in {time.perf_counter() - t0:.0f} s)")
    return buf


def _sb3_add_cost(steps) -> float:
    from stable_baselines3 import HerReplayBuffer

    env = _sb3_env()
    buf = HerReplayBuffer(100_000, env.observation_space, env.action_space, env=env, device="cpu")
    t0 = time.thread_time()
    for o, a, r, no, term, trunc in steps:
        buf.add(o, no, a, r, term | trunc, [{"TimeLimit.truncated": bool(trunc[0])}])
    return (time.thread_time() - t0) / len(steps)


class LoopSumTree:
    """The textbook sum tree: a binary tree in one array, updated and searched one sample at a time."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.tree = np.zeros(2 * capacity - 1)

    def update(self, leaf: int, p: float) -> None:
        i = leaf + self.capacity - 1
        change = p - self.tree[i]
        self.tree[i] = p
        while i != 0:
            i = (i - 1) // 2
            self.tree[i] += change

    def get_leaf(self, v: float) -> int:
        parent = 0
        while True:
            left, right = 2 * parent + 1, 2 * parent + 2
            if left >= len(self.tree):
                return parent - self.capacity + 1
            if v <= self.tree[left]:
                parent = left
            else:
                v -= self.tree[left]
                parent = right


def section_prioritized(storage: her.EpisodeStorage) -> None:
    rng = np.random.default_rng(2)
    uniform = her.HerReplayBuffer(storage, fetch_reward, seed=0)
    per_sampler = her.PrioritizedSampler(storage, alpha=0.6, beta0=0.4, beta_annealing_steps=10_000)
    per = her.HerReplayBuffer(storage, fetch_reward, sampler=per_sampler, seed=0)
    B = 256

    def per_step():
        b = per.sample(B)
        per.update_priorities(b.index, rng.random(B))

    t_uniform, t_per = timeit_many([lambda: uniform.sample(B), per_step])
    print(f"\n== Prioritized HER sample + priority update, B = {B}, {len(storage):,} stored ==")
    print(f"uniform HER sample {t_uniform * 1e6:.0f} us; prioritized sample + update {t_per * 1e6:.0f} us; "
          f"ratio {t_per / t_uniform:.2f}")

    # Trees alone: batched K-ary tree vs the textbook loop tree, same capacity, same work (stratified find + update).
    cap = storage.n_slots
    loop_tree = LoopSumTree(cap)
    leaves = per_sampler.sum_tree.leaves
    loop_tree.tree[cap - 1:] = leaves
    for level_start in range(cap - 2, -1, -1):  # build internal nodes bottom-up
        loop_tree.tree[level_start] = loop_tree.tree[2 * level_start + 1] + loop_tree.tree[2 * level_start + 2]
    total = loop_tree.tree[0]

    def loop_step():
        seg = total / B
        idx = [loop_tree.get_leaf(rng.uniform(seg * i, seg * (i + 1))) for i in range(B)]
        for i in idx:
            loop_tree.update(i, float(rng.random()))

    tree = SumTree(cap)  # a plain sum tree like the loop one (the sampler's also tracks the minimum)
    tree.update(np.arange(cap), leaves)

    def batched_step():
        masses = (np.arange(B) + rng.random(B)) * (tree.total / B)
        idx = tree.find(masses)
        tree.update(idx, rng.random(B))

    t_loop, t_batched = timeit(loop_step, repeats=20, warmup=2), timeit(batched_step)
    print(f"sum tree find + update of {B}: Python loop {t_loop * 1e6:.0f} us; batched {t_batched * 1e6:.0f} us;"
          f" speed-up {t_loop / t_batched:.1f}x")


def section_nstep(storage: her.EpisodeStorage) -> None:
    B = 256
    one = her.HerReplayBuffer(storage, fetch_reward, n_step=1, seed=0)
    three = her.HerReplayBuffer(storage, fetch_reward, n_step=3, seed=0)
    three_stop = her.HerReplayBuffer(storage, fetch_reward, n_step=3, seed=0, stop_at_success=True,
                                     compute_success=fetch_success)
    t1, t3, t3s = timeit_many([lambda: one.sample(B), lambda: three.sample(B), lambda: three_stop.sample(B)])
    print(f"\n== n-step HER sample, B = {B}, {len(storage):,} stored ==")
    print(f"n = 1: {t1 * 1e6:.0f} us; n = 3: {t3 * 1e6:.0f} us (ratio {t3 / t1:.2f}); "
          f"n = 3 stop at success: {t3s * 1e6:.0f} us (ratio {t3s / t1:.2f})")


def _episode_chunk(episodes: list[dict]):
    """Episodes of ``make_episodes`` as one TorchRL TensorDict [n * T] (root and ("next", ...) keys), what a
    single-env collector yields."""
    import torch
    from tensordict import TensorDict

    cat = lambda key, sl: torch.from_numpy(np.concatenate([ep[key][sl] for ep in episodes]))
    goal = torch.from_numpy(np.repeat(np.stack([ep["desired_goal"] for ep in episodes]), T, axis=0))
    done = torch.zeros(len(episodes), T, 1, dtype=torch.bool)
    done[:, -1] = True
    done = done.reshape(-1, 1)
    return TensorDict({
        "observation": cat("observation", slice(None, -1)), "achieved_goal": cat("achieved_goal", slice(None, -1)),
        "desired_goal": goal, "action": cat("action", slice(None)),
        "next": {"observation": cat("observation", slice(1, None)),
                 "achieved_goal": cat("achieved_goal", slice(1, None)), "desired_goal": goal.clone(),
                 "reward": cat("reward", slice(None)).unsqueeze(-1), "done": done,
                 "terminated": torch.zeros_like(done), "truncated": done.clone()},
    }, batch_size=[len(episodes) * T])


def section_torchrl(storage: her.EpisodeStorage | None, n_transitions: int = N_TRANSITIONS) -> None:
    try:
        import torch
        import torchrl
        from torchrl.data import HERReplayBuffer, LazyTensorStorage

        from her.torchrl import HerTorchRLReplayBuffer
    except ImportError:
        print("(torchrl not installed: TorchRL section skipped; pip install -e '.[torchrl]' installs it)")
        return
    import logging

    logging.getLogger("torchrl").setLevel(logging.WARNING)
    torch.set_num_threads(1)

    def torchrl_reward(td):
        d = (td["next", "achieved_goal"] - td["desired_goal"]).norm(dim=-1, keepdim=True)
        return -(d > THRESHOLD).float()

    spare = 200 * T  # TorchRL's buffer must never fill up: a sample after an extend into a full one raises
    ours = HerTorchRLReplayBuffer(n_transitions, fetch_reward, strategy="future", n_sampled_goal=4,
                                  max_episode_steps=T, seed=0)
    theirs = HERReplayBuffer(torchrl_reward, her_ratio=0.8, strategy="future",
                             storage=LazyTensorStorage(n_transitions + spare))
    t_ours = t_theirs = 0.0
    chunk = 1000  # episodes per extend call
    for first in range(0, n_transitions // T, chunk):
        td = _episode_chunk(list(make_episodes(min(chunk, n_transitions // T - first), seed=first + 1)))
        t0 = time.thread_time()
        ours.extend(td)
        t1 = time.thread_time()
        theirs.extend(td)
        t_ours, t_theirs = t_ours + t1 - t0, t_theirs + time.thread_time() - t1
    n = len(ours)
    plain_her = ours.her
    print(f"\n== TorchRL {torchrl.__version__} (torch {torch.__version__}): ours through her.torchrl vs "
          f"torchrl.data.HERReplayBuffer, {n:,} stored, TensorDicts out ==")
    print(f"{'B':>6} {'ours us':>9} {'TorchRL us':>11} {'TorchRL/ours':>13} {'her (to torch) us':>18}")
    theirs.sample(256)  # builds its episode cache once (a write invalidates it: see below)
    for B in (256, 1024, 4096):
        t_o, t_t, t_h = timeit_many([lambda: ours.sample(B), lambda: theirs.sample(B),
                                     lambda: plain_her.sample(B).to_torch()], repeats=100)
        print(f"{B:>6} {t_o * 1e6:>9.0f} {t_t * 1e6:>11.0f} {t_t / t_o:>13.1f} {t_h * 1e6:>18.0f}")

    one = _episode_chunk(list(make_episodes(1, seed=10**6)))
    t_o, t_t = timeit_many([lambda: (ours.extend(one), ours.sample(256)),
                            lambda: (theirs.extend(one), theirs.sample(256))], repeats=30, warmup=2)
    print(f"extend of one episode then sample(256): ours {t_o * 1e6:.0f} us, TorchRL {t_t * 1e6:.0f} us "
          f"({t_t / t_o:.1f}x)")
    print(f"extend of whole episodes ({chunk} per call): ours {t_ours / n * 1e6:.2f} us per transition, "
          f"TorchRL {t_theirs / n * 1e6:.2f} us ({t_theirs / t_ours:.1f}x)")

    steps = _episode_chunk(list(make_episodes(2000 // T, seed=5)))
    rows = [steps[i] for i in range(len(steps))]
    best_o, best_t = [], []
    for _ in range(3):
        small_o = HerTorchRLReplayBuffer(100_000, fetch_reward, max_episode_steps=T)
        small_t = HERReplayBuffer(torchrl_reward, storage=LazyTensorStorage(100_000))
        t0 = time.thread_time()
        for row in rows:
            small_o.add(row)
        t1 = time.thread_time()
        for row in rows:
            small_t.add(row)
        best_o.append((t1 - t0) / len(rows))
        best_t.append((time.thread_time() - t1) / len(rows))
    print(f"add(), one step of one env: ours {min(best_o) * 1e6:.1f} us, TorchRL {min(best_t) * 1e6:.1f} us "
          f"({min(best_t) / min(best_o):.1f}x)")
    data = theirs._storage._storage
    bytes_t = sum(t.numel() * t.element_size() for t in data.values(True, True)) / (n_transitions + spare)
    bytes_o = ours.storage.nbytes / n
    print(f"bytes per stored transition: ours {bytes_o:.0f}, TorchRL {bytes_t:.0f} ({bytes_t / bytes_o:.2f}x)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", nargs="+", default=["sampler", "prioritized", "nstep", "torchrl"],
                        choices=["sampler", "prioritized", "nstep", "torchrl"])
    parser.add_argument("--transitions", type=int, default=N_TRANSITIONS,
                        help="transitions stored (default %(default)s)")
    args = parser.parse_args(argv)
    storage = None
    if set(args.sections) - {"torchrl"}:
        t0 = time.perf_counter()
        storage = fill_ours(args.transitions)
        print(f"filled our storage with {len(storage):,} transitions in {time.perf_counter() - t0:.1f} s")
    for name in args.sections:
        if name == "torchrl":
            section_torchrl(storage, args.transitions)
        else:
            globals()[f"section_{name}"](storage)
    return 0


if __name__ == "__main__":
    sys.exit(main())
