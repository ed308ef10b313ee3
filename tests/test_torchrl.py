"""``her.torchrl``: the TorchRL adapter. Its batches equal ``her``'s for the same stored episodes and seed, envs of a
batched collector stay apart, priorities follow TorchRL's update calls, TorchRL's own SAC pieces learn a goal task
on it, and the TorchRL ``HERReplayBuffer`` differences quoted in ``docs/torchrl.md`` hold (its example runs in
``tests/test_docs.py``).

Skipped without torchrl (``pip install -e ".[test,torchrl]"`` installs it; CI does).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

torchrl = pytest.importorskip("torchrl")

import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torchrl.data import Bounded, Categorical, Composite, Unbounded  # noqa: E402
from torchrl.envs import EnvBase  # noqa: E402

import her  # noqa: E402
from her.torchrl import HerTorchRLReplayBuffer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ------------------------------------------------------------------------------------------------ tag data
# Env e's episode k, step t: observation (e, k, t), achieved goal (100 e + k, t), desired goal (100 e + k, -1),
# action (k, t), info "bonus" t. Every value tells where it came from.


def tag_reward(achieved_goal, desired_goal, info=None):
    r = -(np.abs(np.asarray(achieved_goal) - np.asarray(desired_goal)).sum(-1) > 0.5).astype(np.float32)
    if info is not None:
        r = r + 0.01 * np.asarray(info["bonus"]).reshape(r.shape)
    return r


def tag_rollout(lengths: list[list[int]], n_steps: int) -> TensorDict:
    """``[n_envs, n_steps]`` steps as a TorchRL collector lays them out; env ``e`` runs episodes of lengths
    ``lengths[e]`` (cycled); episodes with odd ``k`` end terminated, the others truncated (time limit)."""
    n = len(lengths)
    obs, ag, dg, act, nobs, nag, bonus, term, trunc = ([] for _ in range(9))
    for e in range(n):
        rows = {key: [] for key in ("obs", "ag", "dg", "act", "nobs", "nag", "bonus", "term", "trunc")}
        k = t = 0
        for _ in range(n_steps):
            L = lengths[e][k % len(lengths[e])]
            rows["obs"].append((e, k, t))
            rows["ag"].append((100 * e + k, t))
            rows["dg"].append((100 * e + k, -1))
            rows["act"].append((k, t))
            rows["nobs"].append((e, k, t + 1))
            rows["nag"].append((100 * e + k, t + 1))
            rows["bonus"].append(t)
            end = t + 1 == L
            rows["term"].append(end and k % 2 == 1)
            rows["trunc"].append(end and k % 2 == 0)
            k, t = (k + 1, 0) if end else (k, t + 1)
        for lst, key in ((obs, "obs"), (ag, "ag"), (dg, "dg"), (act, "act"), (nobs, "nobs"), (nag, "nag"),
                         (bonus, "bonus"), (term, "term"), (trunc, "trunc")):
            lst.append(rows[key])
    f = lambda x: torch.tensor(x, dtype=torch.float32)
    b = lambda x: torch.tensor(x, dtype=torch.bool).unsqueeze(-1)
    ag_, nag_, dg_ = f(ag), f(nag), f(dg)
    info = {"bonus": np.asarray(bonus, np.float32).reshape(-1)}
    reward = tag_reward(nag_.reshape(-1, 2).numpy(), dg_.reshape(-1, 2).numpy(), info).reshape(n, n_steps, 1)
    return TensorDict({
        "observation": f(obs), "achieved_goal": ag_, "desired_goal": dg_, "action": f(act),
        "done": b([[False] * n_steps] * n), "terminated": b([[False] * n_steps] * n),
        "truncated": b([[False] * n_steps] * n),
        "next": {"observation": f(nobs), "achieved_goal": nag_, "desired_goal": dg_.clone(),
                 "reward": torch.from_numpy(reward), "bonus": f(bonus),
                 "done": b(term) | b(trunc), "terminated": b(term), "truncated": b(trunc)},
    }, batch_size=[n, n_steps])


LENGTHS = [[5, 3, 7], [4], [6, 2, 9, 1]]
CAPACITY = 400


def reference(td: TensorDict, prioritized: bool, **kw) -> her.HerReplayBuffer:
    """``her`` fed the same steps one at a time through ``HerReplayBuffer.add`` (its writer's per-env staging)."""
    n, T = td.batch_size
    storage = her.EpisodeStorage(CAPACITY, (3,), (2,), (2,), max_episode_steps=50, n_envs=n,
                                 info_shapes={"bonus": ()})
    sampler = her.PrioritizedSampler() if prioritized else her.UniformSampler()
    buf = her.HerReplayBuffer(storage, tag_reward, sampler=sampler, **kw)
    a = {k: td.get(k).numpy() for k in td.keys(True, True)}
    for t in range(T):
        state = lambda p: {k: a[(*p, k) if p else k][:, t] for k in ("observation", "achieved_goal", "desired_goal")}
        buf.add(state(()), a["action"][:, t], a[("next", "reward")][:, t, 0], state(("next",)),
                a[("next", "terminated")][:, t, 0], a[("next", "truncated")][:, t, 0],
                {"bonus": a[("next", "bonus")][:, t]})
    return buf


def adapter(prioritized: bool = False, **kw) -> HerTorchRLReplayBuffer:
    return HerTorchRLReplayBuffer(CAPACITY, tag_reward, max_episode_steps=50, prioritized=prioritized,
                                  info_keys={"bonus": ("next", "bonus")}, **kw)


def extend_in_chunks(rb: HerTorchRLReplayBuffer, td: TensorDict, cuts=(7, 8, 23)) -> None:
    bounds = [0, *cuts, td.batch_size[-1]]
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        rb.extend(td[:, lo:hi])


def assert_same_storage(a: her.EpisodeStorage, b: her.EpisodeStorage) -> None:
    assert a.episodes() == b.episodes()
    for name in a.dtype.names:
        np.testing.assert_array_equal(a.data[name], b.data[name], err_msg=name)
    np.testing.assert_array_equal(a.achieved_goal, b.achieved_goal)


def assert_batch_equals(td: TensorDict, b: her.Batch, st: her.EpisodeStorage, gamma: float) -> None:
    eq = np.testing.assert_array_equal
    eq(td["observation"].numpy(), b.observation)
    eq(td["desired_goal"].numpy(), b.desired_goal)
    eq(td["next", "desired_goal"].numpy(), b.desired_goal)
    eq(td["action"].numpy(), b.action)
    eq(td["next", "reward"].numpy()[:, 0], b.reward)
    eq(td["next", "observation"].numpy(), b.next_observation)
    eq(td["next", "terminated"].numpy()[:, 0], b.terminated)
    eq(td["gamma"].numpy()[:, 0], b.discount)
    np.testing.assert_allclose(b.discount, gamma ** b.n_steps.astype(np.float64), rtol=1e-6)
    eq(td["steps_to_next_obs"].numpy()[:, 0], b.n_steps)
    eq(td["priority_weight"].numpy(), b.weight)
    eq(td["index"].numpy(), b.index)
    eq(td["relabeled"].numpy(), b.relabeled)
    eq(td["achieved_goal"].numpy(), st.achieved_goal[b.index])
    eq(td["next", "achieved_goal"].numpy(), st.achieved_goal[(b.index + b.n_steps) % st.n_slots])
    last = st.step[b.index] + b.n_steps == st.episode_length[b.index]
    eq(td["next", "done"].numpy()[:, 0], last | b.terminated)
    eq(td["next", "truncated"].numpy()[:, 0], last & ~b.terminated)
    for k in ("done", "terminated", "truncated"):
        assert not td[k].any()


# ------------------------------------------------------------------------------------------------ equality
@pytest.mark.parametrize(("strategy", "n_step", "prioritized"),
                         [("future", 1, False), ("final", 3, False), ("episode", 2, True), ("future", 3, True)])
def test_batches_equal_her_for_the_same_episodes_and_seed(strategy, n_step, prioritized):
    td = tag_rollout(LENGTHS, 40)
    kw = dict(strategy=strategy, n_sampled_goal=4, n_step=n_step, gamma=0.9, seed=3)
    rb = adapter(prioritized, **kw)
    extend_in_chunks(rb, td)
    ref = reference(td, prioritized, **kw)
    assert_same_storage(rb.storage, ref.storage)
    assert len(rb) == len(ref) > 0 and rb.write_count == 3 * 40
    rng = np.random.default_rng(0)
    for B in (64, 1, 300):
        got, want = rb.sample(B), ref.sample(B)
        assert got.batch_size == torch.Size([B])
        assert_batch_equals(got, want, ref.storage, 0.9)
        td_error = rng.normal(size=B).astype(np.float32)
        got["td_error"] = torch.from_numpy(td_error)
        rb.update_tensordict_priority(got)  # ignored without prioritized, as in TorchRL
        if prioritized:
            ref.update_priorities(want.index, td_error)


def test_add_one_step_at_a_time_equals_extend():
    td = tag_rollout(LENGTHS, 30)
    whole, steps = adapter(seed=1), adapter(seed=1)
    whole.extend(td)
    for t in range(30):
        steps.add(td[:, t])  # what a batched env.step returns: [n_envs]
    assert_same_storage(whole.storage, steps.storage)
    one = adapter(seed=1)
    for t in range(30):
        one.add(td[1, t])  # a single env: []
    single = adapter(seed=1)
    single.extend(td[1])  # [T]
    assert_same_storage(one.storage, single.storage)
    assert [T for _, T in one.storage.episodes()] == [4] * 7


def test_envs_of_a_batched_collector_stay_apart():
    td = tag_rollout(LENGTHS, 60)
    rb = adapter(strategy="future", n_sampled_goal=4, n_step=3, gamma=0.9, seed=0)
    extend_in_chunks(rb, td, cuts=(1, 13, 14, 37))
    st = rb.storage
    # every stored episode is one env's one episode, whole, in order
    for start, T in st.episodes():
        states = st.observation[(start + np.arange(T + 1)) % st.n_slots]
        e, k = states[0, 0], states[0, 1]
        assert (states[:, 0] == e).all() and (states[:, 1] == k).all()
        np.testing.assert_array_equal(states[:, 2], np.arange(T + 1))
        assert T == LENGTHS[int(e)][int(k) % len(LENGTHS[int(e)])]
    # per env, the complete episodes are all stored; the unfinished last one is staged
    for e, lengths in enumerate(LENGTHS):
        ends, t, k = 0, 0, 0
        while t + lengths[k % len(lengths)] <= 60:
            t += lengths[k % len(lengths)]
            k += 1
            ends += 1
        stored = sum(1 for s, _ in st.episodes() if st.observation[s, 0] == e)
        assert stored == ends
    b = rb.sample(4000)
    o, no = b["observation"].numpy(), b["next", "observation"].numpy()
    g, m = b["desired_goal"].numpy(), b["steps_to_next_obs"].numpy()[:, 0]
    assert (o[:, :2] == no[:, :2]).all()  # same env, same episode
    np.testing.assert_array_equal(no[:, 2], o[:, 2] + m)
    same_episode = g[:, 0] == 100 * o[:, 0] + o[:, 1]
    assert same_episode.all()
    rel = b["relabeled"].numpy()
    assert (g[~rel, 1] == -1).all() and 0.7 < rel.mean() < 0.9
    lengths = np.array([LENGTHS[int(e)][int(k) % len(LENGTHS[int(e)])] for e, k in o[rel, :2]])
    assert (g[rel, 1] > o[rel, 2]).all() and (g[rel, 1] <= lengths).all()  # future goals: t' in t+1..T_e


def test_done_flags_and_n_step_keys_follow_torchrl_conventions():
    td = tag_rollout([[3, 4]], 7)  # episode 0 truncated after 3 steps, episode 1 terminated after 4
    rb = adapter(n_sampled_goal=0, n_step=3, gamma=0.5, seed=0)
    rb.extend(td)
    b = rb.sample(500)
    k, t = b["observation"][:, 1].long(), b["observation"][:, 2].long()
    m = b["steps_to_next_obs"][:, 0]
    T = torch.where(k == 0, 3, 4)
    assert (m == torch.minimum(torch.tensor(3), T - t)).all()
    assert torch.equal(b["gamma"][:, 0], 0.5 ** m.float())
    ends = t + m == T
    assert torch.equal(b["next", "done"][:, 0], ends)
    assert torch.equal(b["next", "terminated"][:, 0], ends & (k == 1))
    assert torch.equal(b["next", "truncated"][:, 0], ends & (k == 0))
    # n-step return of the rewards recomputed for the (real) goal, info included: sum_j 0.5^j (-1 + 0.01 (t+j))
    want = sum(torch.where(j < m, 0.5 ** j * (-1 + 0.01 * (t + j)), 0.0) for j in range(3))
    torch.testing.assert_close(b["next", "reward"][:, 0], want.float())


def test_custom_keys_and_done_only_data():
    td = tag_rollout([[4]], 8)
    td.rename_key_("observation", "pos")
    td.rename_key_(("next", "observation"), ("next", "pos"))
    td.rename_key_(("next", "reward"), ("next", "r"))
    del td["next", "terminated"]
    del td["next", "truncated"]
    rb = HerTorchRLReplayBuffer(100, tag_reward, observation_key="pos", reward_key="r", batch_size=16, seed=0)
    rb.extend(td)
    s = rb.sample()
    assert "pos" in s.keys() and ("next", "r") in s.keys(True) and "observation" not in s.keys()
    # without terminated / truncated every done is a true termination
    assert rb.storage.data["episode_terminated"][[s for s, _ in rb.storage.episodes()]].all()


def test_an_env_restarted_mid_episode_drops_its_unfinished_episode():
    td = tag_rollout([[5], [5]], 10)
    rb = adapter(seed=0)
    rb.extend(td[:, :3])
    restart = td[:, 5:].clone()  # env 1 continues from step 3 in truth; env 0 gets a new episode's start
    restart[1] = td[1, 3:8]
    rb.extend(restart)
    eps = [(int(rb.storage.observation[s, 0]), int(rb.storage.observation[s, 1]), T) for s, T in rb.storage.episodes()]
    assert eps == [(1, 0, 5), (0, 1, 5)]  # env 0's first 3 steps were dropped, env 1's episode glued right


def test_errors_name_the_problem():
    rb = adapter(batch_size=8)
    with pytest.raises(ValueError, match="no complete episode"):
        rb.sample()
    td = tag_rollout(LENGTHS, 10)
    with pytest.raises(ValueError, match="use add"):
        rb.extend(td[0, 0])
    with pytest.raises(KeyError, match="achieved_goal"):
        rb.extend(td.exclude("achieved_goal"))
    rb.extend(td)
    with pytest.raises(ValueError, match="3 env"):
        rb.extend(td[:2])
    with pytest.raises(ValueError, match="batch_size"):
        adapter().sample()
    with pytest.raises(KeyError, match="td_error"):
        rb.update_tensordict_priority(rb.sample())
    bad = tag_rollout(LENGTHS, 10)
    bad["next", "observation"][0, 2, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        adapter().extend(bad)


def test_a_flattened_batched_collector_output_is_refused():
    from torchrl.collectors import Collector, RandomPolicy

    env = PointGoalEnv(3, max_steps=5)
    collector = Collector(env, RandomPolicy(env.action_spec), frames_per_batch=3 * 8, total_frames=3 * 8)
    data = next(iter(collector)).clone()
    collector.shutdown()
    rb = HerTorchRLReplayBuffer(1000, point_reward, seed=0)
    with pytest.raises(ValueError, match="reshape"):
        rb.extend(data.reshape(-1))
    rb.extend(data)  # as the collector lays it out: [3 envs, 8 steps]
    assert len(rb) == 3 * 5 and rb.n_envs == 3


def test_priorities_follow_torchrl_updates():
    td = tag_rollout(LENGTHS, 40)
    rb = adapter(prioritized=True, alpha=0.7, beta=0.5, eps=1e-3, batch_size=32, seed=0)
    rb.extend(td)
    sampler = rb.her.sampler
    s = rb.sample()
    assert torch.equal(s["priority_weight"], torch.ones(32))  # all new: max priority
    err = torch.linspace(-2, 2, 32)
    s["td_error"] = err
    rb.update_tensordict_priority(s)
    slots, last = np.unique(s["index"].numpy()[::-1], return_index=True)  # a slot drawn twice: its last error
    np.testing.assert_allclose(sampler.priorities(slots), (err.abs().double().numpy()[::-1][last] + 1e-3) ** 0.7)
    # update_priority(index, priority): several values per transition are reduced by their max (TorchRL's default)
    s2 = rb.sample()
    two = torch.stack([torch.full((32,), 0.5), torch.full((32,), 3.0)], -1)
    rb.update_priority(s2["index"], two)
    np.testing.assert_allclose(sampler.priorities(s2["index"].numpy()), (3.0 + 1e-3) ** 0.7)
    # the importance weights are her's (p_i / p_min) ** -beta
    s3 = rb.sample(256)
    p = sampler.priorities(s3["index"].numpy())
    np.testing.assert_allclose(s3["priority_weight"].numpy(), (p / sampler.min_priority) ** -0.5, rtol=1e-5)
    # without prioritized: accepted and ignored, as TorchRL's uniform buffers do
    plain = adapter(batch_size=8)
    plain.extend(td)
    b = plain.sample()
    b["td_error"] = torch.ones(8)
    plain.update_tensordict_priority(b)


def test_state_dict_round_trip_and_empty():
    td = tag_rollout(LENGTHS, 40)
    rb = adapter(prioritized=True, seed=5)
    rb.extend(td)
    s = rb.sample(16)
    s["td_error"] = torch.arange(16.0)
    rb.update_tensordict_priority(s)
    state = rb.state_dict()
    copy = adapter(prioritized=True, seed=99)
    copy.load_state_dict(state)
    assert_same_storage(copy.storage, rb.storage)
    assert copy.write_count == rb.write_count and copy.n_envs == 3
    a, b = rb.sample(64), copy.sample(64)
    assert (a == b).all()
    rb.empty()
    assert len(rb) == 0 and rb.write_count == 0


def test_import_her_stays_free_of_torch_and_torchrl():
    code = ("import sys, her\n"
            "bad = [m for m in ('torch', 'tensordict', 'torchrl', 'her.torchrl') if m in sys.modules]\n"
            "assert not bad, bad\n"
            "sys.modules['torch'] = sys.modules['tensordict'] = None  # as if not installed\n"
            "try:\n"
            "    import her.torchrl\n"
            "except ImportError as e:\n"
            "    print('MSG', e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "pip install -e '.[torchrl]'" in r.stdout


# ------------------------------------------------------------------------------------------------ learning
class PointGoalEnv(EnvBase):
    """A batched TorchRL goal env: a point in [-1, 1]^2 starts at the origin and must end within 0.1 of a goal drawn
    uniformly in [-0.8, 0.8]^2; actions in [-1, 1]^2 move it by 0.15 a; sparse reward -1 / 0; a time limit of
    ``max_steps`` (truncated, never terminated). Success: the last state within 0.1 of the goal."""

    def __init__(self, n_envs: int = 1, max_steps: int = 20, seed: int = 0):
        super().__init__(batch_size=torch.Size([n_envs]))
        self.max_steps = max_steps
        b = self.batch_size
        box = lambda: Bounded(-1.0, 1.0, shape=(*b, 2), dtype=torch.float32)
        self.observation_spec = Composite(observation=box(), achieved_goal=box(), desired_goal=box(), shape=b)
        self.action_spec = box()
        self.reward_spec = Unbounded(shape=(*b, 1), dtype=torch.float32)
        flag = lambda: Categorical(2, shape=(*b, 1), dtype=torch.bool)
        self.full_done_spec = Composite(done=flag(), terminated=flag(), truncated=flag(), shape=b)
        self.pos, self.goal = torch.zeros(*b, 2), torch.zeros(*b, 2)
        self.t = torch.zeros(b, dtype=torch.int64)
        self._set_seed(seed)

    def _set_seed(self, seed):
        self.rng = torch.Generator().manual_seed(int(seed or 0))

    def _obs(self, **extra) -> TensorDict:
        return TensorDict({"observation": self.pos.clone(), "achieved_goal": self.pos.clone(),
                           "desired_goal": self.goal.clone(), **extra}, batch_size=self.batch_size)

    def _reset(self, td):
        mask = torch.ones(self.batch_size, dtype=torch.bool)
        if td is not None and "_reset" in td.keys():
            mask = td["_reset"].reshape(self.batch_size)
        self.pos[mask] = 0.0
        self.goal[mask] = (torch.rand(int(mask.sum()), 2, generator=self.rng) * 2 - 1) * 0.8
        self.t[mask] = 0
        no = torch.zeros(*self.batch_size, 1, dtype=torch.bool)
        return self._obs(done=no, terminated=no.clone(), truncated=no.clone())

    def _step(self, td):
        self.pos = (self.pos + 0.15 * td["action"].clamp(-1, 1)).clamp(-1, 1)
        self.t += 1
        dist = (self.pos - self.goal).norm(dim=-1, keepdim=True)
        end = (self.t >= self.max_steps).unsqueeze(-1)
        return self._obs(reward=-(dist > 0.1).float(), done=end.clone(), terminated=torch.zeros_like(end),
                         truncated=end)


def point_reward(achieved_goal, desired_goal, info=None):
    return -(np.linalg.norm(achieved_goal - desired_goal, axis=-1) > 0.1).astype(np.float32)


def test_torchrl_sac_learns_a_goal_task_on_our_buffer():
    """TorchRL's collector, SACLoss, SoftUpdate and modules; our buffer. Seeds 0-3 reach 0.97-1.00 greedy success
    (100 evaluation episodes) after 440-540 updates (2000-2400 env steps); the budget is 1200 updates."""
    from tensordict.nn import NormalParamExtractor, TensorDictModule
    from torch import nn
    from torchrl.collectors import Collector
    from torchrl.envs.utils import ExplorationType, set_exploration_type
    from torchrl.modules import MLP, ProbabilisticActor, TanhNormal, ValueOperator
    from torchrl.objectives import SACLoss, SoftUpdate

    torch.manual_seed(0)
    n_envs, T, gamma = 4, 20, 0.98

    class Actor(nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = MLP(in_features=4, out_features=4, num_cells=[64, 64], activation_class=nn.ReLU)
            self.split = NormalParamExtractor()

        def forward(self, observation, goal):
            return self.split(self.mlp(torch.cat([observation, goal], -1)))

    class Critic(nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = MLP(in_features=6, out_features=1, num_cells=[64, 64], activation_class=nn.ReLU)

        def forward(self, observation, goal, action):
            return self.mlp(torch.cat([observation, goal, action], -1))

    env = PointGoalEnv(n_envs, T, seed=0)
    actor = ProbabilisticActor(
        TensorDictModule(Actor(), in_keys=["observation", "desired_goal"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"], distribution_class=TanhNormal, spec=env.action_spec)
    qvalue = ValueOperator(Critic(), in_keys=["observation", "desired_goal", "action"])
    loss = SACLoss(actor, qvalue, num_qvalue_nets=2, alpha_init=0.1, target_entropy=-2.0)
    loss.make_value_estimator(gamma=gamma)
    target = SoftUpdate(loss, tau=0.05)
    opt = torch.optim.Adam(loss.parameters(), lr=1e-3)

    rb = HerTorchRLReplayBuffer(100_000, point_reward, batch_size=256, strategy="future", n_sampled_goal=4,
                                gamma=gamma, max_episode_steps=T, seed=0)
    # The collector writes each [n_envs, T] rollout into our buffer itself (and yields None).
    collector = Collector(env, actor, frames_per_batch=n_envs * T, total_frames=n_envs * T * 60,
                          init_random_frames=2 * n_envs * T, replay_buffer=rb, auto_register_policy_transforms=False)
    eval_env = PointGoalEnv(100, T, seed=1000)

    def success() -> float:
        with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
            td = eval_env.rollout(T, actor)
        dist = (td["next", "achieved_goal"][:, -1] - td["next", "desired_goal"][:, -1]).norm(dim=-1)
        return float((dist < 0.1).float().mean())

    t0, updates, history = time.perf_counter(), 0, []
    for i, _ in enumerate(collector):
        assert len(rb) == (i + 1) * n_envs * T  # whole episodes, each env's apart
        if len(rb) < rb.batch_size:
            continue
        for _ in range(20):
            batch = rb.sample()
            out = loss(batch)
            opt.zero_grad()
            (out["loss_actor"] + out["loss_qvalue"] + out["loss_alpha"]).backward()
            opt.step()
            target.step()
            updates += 1
        if i % 5 == 4:
            history.append(success())
            if history[-1] >= 0.9:
                break
    collector.shutdown()
    assert history[-1] >= 0.9, (history, updates, time.perf_counter() - t0)
    assert rb.storage.n_episodes == rb.write_count // T


def test_sac_loss_td_errors_update_our_priorities():
    from tensordict.nn import NormalParamExtractor, TensorDictModule
    from torch import nn
    from torchrl.modules import MLP, ProbabilisticActor, TanhNormal, ValueOperator
    from torchrl.objectives import SACLoss

    torch.manual_seed(0)
    env = PointGoalEnv(2, max_steps=5)
    rb = HerTorchRLReplayBuffer(1000, point_reward, batch_size=32, prioritized=True, seed=0)
    rb.extend(env.rollout(10, break_when_any_done=False))
    net = nn.Sequential(MLP(in_features=2, out_features=4, num_cells=[16]), NormalParamExtractor())
    actor = ProbabilisticActor(TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"]),
                               in_keys=["loc", "scale"], distribution_class=TanhNormal, spec=env.action_spec)
    qvalue = ValueOperator(MLP(in_features=4, out_features=1, num_cells=[16]), in_keys=["observation", "action"])
    loss = SACLoss(actor, qvalue, num_qvalue_nets=2)
    batch = rb.sample()
    loss(batch)  # writes "td_error"
    rb.update_tensordict_priority(batch)
    index, td_error = batch["index"].numpy(), batch["td_error"].double().numpy()
    slots, last = np.unique(index[::-1], return_index=True)  # a slot drawn twice keeps its last TD error
    p = rb.her.sampler.priorities(slots)
    np.testing.assert_allclose(p, (td_error[::-1][last] + 1e-6) ** 0.6, rtol=1e-6)
    assert len(set(p.tolist())) > 1


# ------------------------------------------------------------------------------------------------ docs
# docs/torchrl.md's example runs in tests/test_docs.py (every python block of docs/*.md).


def test_torchrl_her_buffer_differences_quoted_in_the_docs():
    """Each difference of ``torchrl.data.HERReplayBuffer`` that docs/torchrl.md quotes, shown by its small script
    (``tests/benchmarks/torchrl_her_semantics.py``), on the pinned torchrl."""
    if torchrl.__version__ != "0.14.1":
        pytest.skip(f"the differences were checked on torchrl 0.14.1, this is {torchrl.__version__}")
    sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))
    try:
        import torchrl_her_semantics as sem
    finally:
        sys.path.pop(0)
    future = sem.future_goals()
    assert future["torchrl_offsets"] == list(range(10)) and future["ours_offsets"] == list(range(1, 11))
    final = sem.final_goal()
    assert final["torchrl_goal_steps"] == [9] and final["ours_goal_steps"] == [10]
    assert "Boolean value of Tensor" in sem.extend_into_full_buffer()["torchrl_error"]
    wrap = sem.episode_across_the_ring_end()
    assert wrap["torchrl_goal_is_own_state"] == 1.0 and wrap["ours_goal_is_own_state"] == 0.0
    assert wrap["torchrl_orphan_rows"] > 0 and wrap["ours_orphan_rows"] == 0
    nstep = sem.n_step_with_relabeling()
    assert set(nstep["torchrl_relabeled_rewards"]) <= {-1.0, 0.0} and nstep["torchrl_steps_to_next_obs"] == [3]
    assert nstep["torchrl_relabeled_max_abs_error"] >= 1.0 and nstep["ours_relabeled_max_abs_error"] < 1e-6
    assert sem.prioritized_sampler()["torchrl_error"] is not None or torch.__version__ != "2.13.0+cpu"


def test_dumps_and_loads_round_trip_as_torchrls_checkpoint_api(tmp_path):
    """``rb.dumps(dir)`` / ``rb.loads(dir)``, TorchRL's ``ReplayBuffer`` checkpoint API: the same storage,
    priorities and sampling RNG; the files load without unpickling; a bad dump is one line."""
    import json

    td = tag_rollout(LENGTHS, 40)
    rb = adapter(prioritized=True, seed=5)
    rb.extend(td)
    s = rb.sample(16)
    s["td_error"] = torch.arange(16.0)
    rb.update_tensordict_priority(s)
    rb.dumps(tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["buffer.npz", "meta.json"]
    with np.load(tmp_path / "ckpt" / "buffer.npz", allow_pickle=False) as z:
        assert len(z.files) > 5
    copy = adapter(prioritized=True, seed=99)
    copy.loads(tmp_path / "ckpt")
    assert_same_storage(copy.storage, rb.storage)
    assert copy.write_count == rb.write_count and copy.n_envs == 3
    assert (rb.sample(64) == copy.sample(64)).all()

    empty = adapter()
    empty.dumps(tmp_path / "empty")
    again = adapter()
    again.loads(tmp_path / "empty")
    assert len(again) == 0 and again.write_count == 0

    with pytest.raises(FileNotFoundError, match=r"loads\(.*'\): no meta.json there; expected a directory written by "):
        adapter().loads(tmp_path / "nothing")
    meta = json.loads((tmp_path / "ckpt" / "meta.json").read_text())
    (tmp_path / "ckpt" / "meta.json").write_text(json.dumps({**meta, "format": 7}))
    with pytest.raises(ValueError, match=r"a dump of format 7; this version reads format 1$"):
        adapter().loads(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "buffer.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match=r"the dump cannot be read \("):
        adapter().loads(tmp_path / "ckpt")


def test_indexing_reads_the_stored_transitions_oldest_first():
    """``rb[i]``, ``rb[a:b]``, ``rb[tensor]``, ``len(rb)``: the transitions of the complete episodes as they were
    collected (the episode's goal, the env's reward, done flags of their last step), no relabeling."""
    td = tag_rollout(LENGTHS, 40)
    rb = adapter()
    with pytest.raises(IndexError, match="nothing stored yet"):
        rb[0]
    rb.extend(td)
    n = len(rb)
    flat = td.reshape(-1)
    collected = {(tuple(flat["observation"][i].tolist()), tuple(flat["next", "observation"][i].tolist()))
                 : i for i in range(flat.shape[0])}
    everything = rb[:]
    assert everything.batch_size == torch.Size([n]) and n > 0
    seen = set()
    for j in range(n):
        key = (tuple(everything["observation"][j].tolist()), tuple(everything["next", "observation"][j].tolist()))
        i = collected[key]  # a transition that was collected ...
        seen.add(key)
        for name in ("action", "desired_goal", "achieved_goal", ("next", "achieved_goal"), ("next", "reward"),
                     ("next", "terminated"), ("next", "truncated"), ("next", "done")):
            assert torch.equal(everything[name][j], flat[name][i]), (name, j)  # ... exactly as collected
    assert len(seen) == n
    one = rb[0]
    assert one.batch_size == torch.Size([]) and torch.equal(one["observation"], everything["observation"][0])
    assert one["observation"][1].item() == 0 and one["observation"][2].item() == 0  # the oldest: episode 0, step 0
    assert torch.equal(rb[-1]["index"], everything["index"][n - 1])
    picked = rb[torch.tensor([2, 0, -1])]
    assert picked.batch_size == torch.Size([3]) and torch.equal(picked["index"], everything["index"][[2, 0, n - 1]])
    assert rb[np.arange(3)].batch_size == torch.Size([3])
    with pytest.raises(IndexError, match=rf"rb\[{n}\]: index out of range for {n} stored transitions"):
        rb[n]
    with pytest.raises(TypeError, match="expected integers"):
        rb[torch.tensor([0.5])]


def _zero_reward(achieved_goal, desired_goal, info):
    return np.zeros(len(achieved_goal), np.float32)


@pytest.mark.parametrize("kwargs, message", [
    (dict(capacity=0), "capacity must be a positive integer, got 0"),
    (dict(capacity=2.5), "capacity must be a positive integer, got 2.5"),
    (dict(max_episode_steps=0), "max_episode_steps must be a positive integer, got 0"),
    (dict(strategy="bogus"), "relabel strategy must be one of"),
    (dict(n_step=0), "n_step must be an integer >= 1, got 0"),
    (dict(gamma=1.5, n_step=3), "gamma must be in (0, 1], got 1.5"),
    (dict(prioritized=True, alpha=-1), "alpha must be a finite number >= 0, got -1"),
])
def test_bad_arguments_are_refused_by_the_constructor_not_at_the_first_write(kwargs, message):
    # the storage is built lazily from the first TensorDict's shapes; its arguments are checked up front
    kwargs = {"capacity": 100, **kwargs}
    with pytest.raises(ValueError) as info:
        HerTorchRLReplayBuffer(kwargs.pop("capacity"), _zero_reward, **kwargs)
    assert message in str(info.value), str(info.value)
