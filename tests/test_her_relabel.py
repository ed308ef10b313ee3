"""Goal relabeling (future / final / episode, k), rewards via compute_reward, terminated vs truncated."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import (
    DESIRED,
    TagEnvs,
    TagRun,
    add_tag_episode,
    check_batch,
    goal_steps,
    make_tag_storage,
    reference_live,
    reference_probabilities,
    reference_sample,
    sparse_reward,
    tag_reward,
    tag_setups,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

import her

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ALPHA = 1e-4  # significance level of the statistical tests (fixed seeds make them deterministic anyway)


def _filled(setup):
    n_envs, schedules, capacity, mes, n_steps = setup
    storage = make_tag_storage(capacity, n_envs, mes)
    run = TagEnvs(storage, schedules).step(n_steps)
    return storage, run, reference_live(run, storage.n_slots)


def _goal_steps_of(batch):
    return batch.desired_goal[:, 1].astype(int)


# ---------------------------------------------------------------------------------------------------------
# Semantics as properties: goal ranges, rewards, done flags, across n_envs and the wrap
# ---------------------------------------------------------------------------------------------------------


@SETTINGS
@given(tag_setups(min_steps=8), st.sampled_from(list(her.RelabelStrategy)), st.integers(0, 6), st.integers(0, 2**31 - 1))
def test_every_sampled_goal_reward_and_done_follow_the_semantics(setup, strategy, k, seed):
    storage, run, live = _filled(setup)
    if not live:
        return
    buf = her.HerReplayBuffer(storage, tag_reward, strategy=strategy, n_sampled_goal=k, seed=seed)
    batch = buf.sample(256)
    # goal of the own episode, step in the strategy's range; reward == compute_reward(ag_{t+1}, g', info_t);
    # next state s_{t+1} of the same episode; terminated only on the last transition of a terminated episode
    check_batch(batch, run, live, strategy=strategy)
    if k == 0:
        assert not batch.relabeled.any()
    np.testing.assert_array_equal(batch.weight, 1.0)
    np.testing.assert_allclose(batch.discount, np.float32(0.98))
    assert (batch.n_steps == 1).all()


@SETTINGS
@given(tag_setups(min_steps=8), st.sampled_from(list(her.RelabelStrategy)), st.integers(0, 2**31 - 1))
def test_sampled_pairs_follow_the_reference_distribution(setup, strategy, seed):
    """Chi-square of (episode, t, goal step) counts against the brute-force enumeration of the semantics."""
    storage, run, live = _filled(setup)
    if not live:
        return
    k = 3
    probs = reference_probabilities(run, live, strategy, k)
    buf = her.HerReplayBuffer(storage, tag_reward, strategy=strategy, n_sampled_goal=k, seed=seed)
    n = 40 * len(probs)
    b = buf.sample(n)
    keys = list(probs)
    pos = {key: i for i, key in enumerate(keys)}
    counts = np.zeros(len(keys))
    e, t = b.observation[:, 0].astype(int), b.observation[:, 1].astype(int)
    g = np.where(b.relabeled, _goal_steps_of(b), -1)
    for key in zip(e.tolist(), t.tolist(), g.tolist()):
        counts[pos[key]] += 1  # KeyError: a pair the semantics never produce
    expected = np.array([probs[key] for key in keys]) * n
    assert stats.chisquare(counts, expected).pvalue > ALPHA


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_relabeled_share_is_k_over_k_plus_1(k):
    storage = make_tag_storage(200, n_envs=2, max_episode_steps=7)
    TagEnvs(storage, [[(5, False), (7, True)], [(3, True)]]).step(120)
    buf = her.HerReplayBuffer(storage, tag_reward, strategy="future", n_sampled_goal=k, seed=k)
    n = 100_000
    hits = int(buf.sample(n).relabeled.sum())
    assert stats.binomtest(hits, n, k / (k + 1)).pvalue > ALPHA
    assert her.make_relabeler("future", k).relabel_probability == k / (k + 1)


def test_relabeled_flag_matches_the_goal():
    storage = make_tag_storage(100)
    run = TagRun()
    for T in (3, 6, 1):
        add_tag_episode(storage, run, T)
    b = her.HerReplayBuffer(storage, tag_reward, strategy="episode", n_sampled_goal=2, seed=3).sample(3000)
    assert (b.desired_goal[~b.relabeled] == DESIRED).all()
    assert (b.desired_goal[b.relabeled, 0] == b.observation[b.relabeled, 0]).all()


# ---------------------------------------------------------------------------------------------------------
# Case: the goal pool starts at the next state (L = 4, relabel probability 1, 20,000 samples)
# ---------------------------------------------------------------------------------------------------------


def _one_episode_buffer(strategy, L=4, seed=0, reward=sparse_reward):
    storage = make_tag_storage(50, info=False)
    add_tag_episode(storage, TagRun(), L)
    relabeler = her.make_relabeler(strategy, n_sampled_goal=4)
    relabeler.relabel_probability = 1.0  # "relabel probability 1"
    buf = her.HerReplayBuffer(storage, reward, strategy=strategy, seed=seed)
    buf.relabeler = relabeler
    return buf


def test_final_goal_is_the_last_state():
    b = _one_episode_buffer("final").sample(20_000)
    assert b.relabeled.all()
    assert (b.desired_goal == [0, 4]).all()
    np.testing.assert_array_equal(b.reward, np.where(b.observation[:, 1] == 3, 0.0, -1.0))


def test_future_goal_is_uniform_over_the_next_states_up_to_the_last():
    b = _one_episode_buffer("future").sample(20_000)
    assert b.relabeled.all()
    t, k = b.observation[:, 1].astype(int), _goal_steps_of(b)
    for step in range(4):
        ks = k[t == step]
        counts = np.array([(ks == j).sum() for j in range(step + 1, 5)])
        assert counts.sum() == len(ks) > 3000  # nothing outside {t+1..4}
        if len(counts) > 1:
            assert stats.chisquare(counts).pvalue > ALPHA, (step, counts)
    assert (k[t == 3] == 4).all()
    assert (b.reward[t == 3] == 0.0).all()  # success reward


def test_episode_goal_is_uniform_over_steps_1_to_L():
    b = _one_episode_buffer("episode").sample(20_000)
    k = _goal_steps_of(b)
    counts = np.array([(k == j).sum() for j in range(1, 5)])
    assert counts.sum() == len(k)
    assert stats.chisquare(counts).pvalue > ALPHA


@pytest.mark.parametrize("strategy", ["future", "final"])
def test_relabeled_goal_never_equals_the_transitions_own_achieved_goal(strategy):
    # ("episode" draws t' uniformly in {1..T}, which includes t itself for t >= 1, by its definition.)
    b = _one_episode_buffer(strategy, L=6).sample(20_000)
    own = b.observation[:, :2]
    assert not (b.desired_goal == own).all(axis=1).any()


# ---------------------------------------------------------------------------------------------------------
# Case: parallel envs never mix episodes (2 envs, lengths 3 and 7, 120 steps, buffer of 200, both wrap)
# ---------------------------------------------------------------------------------------------------------


def test_parallel_envs_never_mix_episodes_and_are_sampled_by_their_share():
    storage = make_tag_storage(200, n_envs=2, max_episode_steps=7)
    run = TagEnvs(storage, [[(3, False)], [(7, False)]]).step(120)
    assert storage.n_episodes_added > storage.n_episodes  # wrapped
    live = reference_live(run, storage.n_slots)
    assert {run.episodes[e].env for e in run.completed[: len(run.completed) - len(live)]} == {0, 1}  # both evicted
    buf = her.HerReplayBuffer(storage, tag_reward, strategy="future", n_sampled_goal=4, seed=0)
    b = buf.sample(200_000)
    e, t = b.observation[:, 0].astype(int), b.observation[:, 1].astype(int)
    L = np.array([run.episodes[i].length for i in e])
    rel = b.relabeled
    assert (b.desired_goal[rel, 0] == e[rel]).all()
    gk = _goal_steps_of(b)[rel]
    assert ((gk >= t[rel] + 1) & (gk <= L[rel])).all()
    assert (b.next_observation[:, 0] == e).all() and (b.next_observation[:, 1] == t + 1).all()
    # per-transition counts within +-10% of the mean
    key = e * 100 + t
    _, counts = np.unique(key, return_counts=True)
    assert len(counts) == len(storage)
    assert np.abs(counts / counts.mean() - 1).max() < 0.10
    # env 0's share of samples equals its share of stored transitions
    env = b.observation[:, 2].astype(int)
    share_stored = sum(run.episodes[i].length for i in live if run.episodes[i].env == 0) / len(storage)
    assert abs((env == 0).mean() - share_stored) < 0.005


# ---------------------------------------------------------------------------------------------------------
# Case: compute_reward gets (next achieved goal, new desired goal, info), in that order
# ---------------------------------------------------------------------------------------------------------


class RecordingReward:
    """Asymmetric reward ``achieved[..., 0] - desired[..., 0]`` that records its calls."""

    def __init__(self):
        self.calls = []

    def __call__(self, achieved_goal, desired_goal, info):
        self.calls.append((np.array(achieved_goal), np.array(desired_goal), info))
        return (achieved_goal[..., 0] - desired_goal[..., 0]).astype(np.float32)


@pytest.mark.parametrize("with_info", [True, False])
@pytest.mark.parametrize("n_step", [1, 3])
def test_compute_reward_gets_next_achieved_goal_new_goal_and_info(with_info, n_step):
    storage = make_tag_storage(100, n_envs=2, info=with_info)
    run = TagEnvs(storage, [[(4, True)], [(6, False)]]).step(20)
    fn = RecordingReward()
    buf = her.HerReplayBuffer(storage, fn, strategy="future", n_sampled_goal=4, n_step=n_step, seed=0)
    fn.calls.clear()  # drop the set-up check
    b = buf.sample(64)
    assert len(fn.calls) == 1  # one vectorized call per batch
    ag, dg, info = fn.calls[0]
    N = 64 * n_step
    assert ag.shape == dg.shape == (N, 2)
    e, t = b.observation[:, 0].astype(int), b.observation[:, 1].astype(int)
    first = np.arange(64) * n_step  # row i's window starts at i * n_step
    np.testing.assert_array_equal(ag[first], np.stack([e, t + 1], 1))
    np.testing.assert_array_equal(dg[first], b.desired_goal)
    if with_info:
        assert set(info) == {"w"} and info["w"].shape == (N, 1)
        np.testing.assert_array_equal(info["w"][first, 0], [run.episodes[i].info(s) for i, s in zip(e, t)])
    else:
        assert info is None
    if n_step == 1:
        np.testing.assert_array_equal(b.reward, e - b.desired_goal[:, 0])


def test_non_vectorized_reward_is_refused_at_set_up():
    storage = make_tag_storage(100)

    def scalar_reward(achieved_goal, desired_goal, info):
        return -float(np.linalg.norm(achieved_goal - desired_goal) > 0.05)

    def column_reward(achieved_goal, desired_goal, info):
        return sparse_reward(achieved_goal, desired_goal)[:, None]

    def crashing_reward(achieved_goal, desired_goal, info):
        if achieved_goal.ndim > 1:
            raise TypeError("only one goal at a time")
        return 0.0

    with pytest.raises(ValueError, match=r"must return shape \(7,\), got shape \(\)"):
        her.HerReplayBuffer(storage, scalar_reward)
    with pytest.raises(ValueError, match=r"must return shape \(7,\), got shape \(7, 1\)"):
        her.HerReplayBuffer(storage, column_reward)
    with pytest.raises(ValueError, match="must be vectorized.*only one goal at a time"):
        her.HerReplayBuffer(storage, crashing_reward)
    with pytest.raises(TypeError, match="must be callable"):
        her.check_compute_reward("reward", (2,))
    with pytest.raises(ValueError, match="needs compute_reward"):
        her.HerReplayBuffer(storage, None)
    her.check_compute_reward(sparse_reward, (3,))  # a vectorized one passes
    r = sparse_reward(np.zeros((7, 3)), np.ones((7, 3)), None)
    assert r.shape == (7,) and r.dtype == np.float32


def test_reward_function_returning_a_wrong_shape_during_sampling_raises():
    storage = make_tag_storage(100)
    add_tag_episode(storage, TagRun(), 5)
    state = {"n": 0}

    def flaky(ag, dg, info):
        state["n"] += 1
        return tag_reward(ag, dg, info) if state["n"] == 1 else tag_reward(ag, dg, info)[:-1]

    buf = her.HerReplayBuffer(storage, flaky, seed=0)
    with pytest.raises(ValueError, match=r"compute_reward returned shape \(15,\), expected \(16,\)"):
        buf.sample(16)


@pytest.mark.parametrize("n_step", [1, 3])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_compute_reward_returning_nan_or_inf_is_refused_at_sampling_naming_the_count(n_step, bad):
    """Stored NaN rewards are refused when stored; recomputed ones must not reach the batch either."""
    storage = make_tag_storage(100)
    add_tag_episode(storage, TagRun(), 5)

    def bad_for_real_goals(achieved_goal, desired_goal, info):  # finite on the set-up probe's goals
        r = tag_reward(achieved_goal, desired_goal, info)
        return np.where(np.asarray(desired_goal)[:, 0] == DESIRED[0], np.float32(bad), r)

    buf = her.HerReplayBuffer(storage, bad_for_real_goals, n_sampled_goal=1, n_step=n_step, seed=0)
    with pytest.raises(ValueError) as err:
        buf.sample(64)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("compute_reward returned NaN or inf rewards: ")
    b = her.HerReplayBuffer(storage, tag_reward, n_sampled_goal=1, n_step=n_step, seed=0).sample(64)
    real = np.flatnonzero(~b.relabeled)  # same seed, same draws: the rows that got NaN / inf
    assert f"{real.size} of 64 sampled transitions" in msg and f"first at batch row {real[0]}," in msg


def test_nan_rewards_outside_every_n_step_window_are_not_refused():
    """The n-step call also covers steps past an episode's end (masked out): NaN there is never used."""
    storage = make_tag_storage(100, info=False)
    add_tag_episode(storage, TagRun(), 5)

    def nan_past_the_end(achieved_goal, desired_goal, info):  # the empty slots after the episode: ag (0, 0)
        r = sparse_reward(achieved_goal, desired_goal)
        return np.where(np.all(np.asarray(achieved_goal) == 0, axis=-1), np.float32(np.nan), r)

    b = her.HerReplayBuffer(storage, nan_past_the_end, n_step=4, seed=0).sample(500)
    assert np.isfinite(b.reward).all() and (b.n_steps < 4).any()


def two_args(achieved_goal, desired_goal):
    return sparse_reward(achieved_goal, desired_goal)


def keyword_only_info(achieved_goal, desired_goal, *, info):
    return sparse_reward(achieved_goal, desired_goal)


class CallableWithInfo:
    def __call__(self, achieved_goal, desired_goal, info):
        return sparse_reward(achieved_goal, desired_goal)


@pytest.mark.parametrize("fn, shown", [(two_args, "two_args(achieved_goal, desired_goal)"),
                                       (keyword_only_info, "keyword_only_info(achieved_goal, desired_goal, *, info)"),
                                       (lambda ag, dg: sparse_reward(ag, dg), "<lambda>(ag, dg)")])
def test_a_compute_reward_without_an_info_parameter_is_refused_at_construction(fn, shown):
    storage = make_tag_storage(100)
    with pytest.raises(TypeError) as err:
        her.HerReplayBuffer(storage, fn)
    assert str(err.value) == (f"compute_reward must take three positional arguments (achieved_goal, desired_goal, "
                              f"info), got {shown}; add an info parameter (info=None if it is not used)")


@pytest.mark.parametrize("fn", [sparse_reward, tag_reward, CallableWithInfo(), lambda *args: sparse_reward(*args[:2]),
                                lambda ag, dg, info, extra=1.0: sparse_reward(ag, dg) * extra])
def test_compute_reward_signatures_taking_three_positional_arguments_are_accepted(fn):
    storage = make_tag_storage(100)
    add_tag_episode(storage, TagRun(), 3)
    assert her.HerReplayBuffer(storage, fn, seed=0).sample(8).reward.shape == (8,)


# ---------------------------------------------------------------------------------------------------------
# Case: every sampled reward is consistent
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", list(her.RelabelStrategy))
def test_every_reward_equals_compute_reward_and_real_rewards_equal_the_env_rewards(strategy):
    storage = make_tag_storage(60, n_envs=3, max_episode_steps=5)
    run = TagEnvs(storage, [[(5, True), (2, False)], [(4, False)], [(1, True), (6, False)]]).step(50)
    live = reference_live(run, storage.n_slots)
    buf = her.HerReplayBuffer(storage, tag_reward, strategy=strategy, n_sampled_goal=2, seed=11)
    b = buf.sample(5000)
    check_batch(b, run, live, strategy=strategy)
    e, t = b.observation[:, 0].astype(int), b.observation[:, 1].astype(int)
    ag_next = np.stack([e, t + 1], 1).astype(np.float32)
    info = {"w": np.array([[run.episodes[i].info(s)] for i, s in zip(e, t)], np.float32)}
    np.testing.assert_array_equal(b.reward, tag_reward(ag_next, b.desired_goal, info))  # exactly
    real = ~b.relabeled
    env_r = np.array([run.episodes[i].env_reward(s) for i, s in zip(e[real], t[real])], np.float32)
    np.testing.assert_array_equal(b.reward[real], env_r)
    np.testing.assert_array_equal(b.reward[real], storage.reward[b.index[real]])


# ---------------------------------------------------------------------------------------------------------
# Case: truncation is not termination
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", list(her.RelabelStrategy))
@pytest.mark.parametrize("n_step", [1, 3])
def test_truncation_is_not_termination(strategy, n_step):
    storage = make_tag_storage(50)
    run = TagRun()
    a = add_tag_episode(storage, run, 5, terminated=False)
    b_ = add_tag_episode(storage, run, 5, terminated=True)
    buf = her.HerReplayBuffer(storage, tag_reward, strategy=strategy, n_sampled_goal=1, n_step=n_step, seed=5)
    b = buf.sample(4000)
    e, t = b.observation[:, 0].astype(int), b.observation[:, 1].astype(int)
    last = t + b.n_steps == 5
    assert not b.terminated[e == a.id].any()
    np.testing.assert_array_equal(b.terminated[e == b_.id], last[e == b_.id])
    for rel in (True, False):
        sel = (e == b_.id) & (t == 4) & (b.relabeled == rel)
        assert sel.sum() > 50 and b.terminated[sel].all()
        sel = (e == a.id) & (t == 4) & (b.relabeled == rel)
        assert sel.sum() > 50 and not b.terminated[sel].any()


def test_reference_sampler_and_buffer_agree_on_goal_step_marginals():
    """The brute-force reference sampler and the buffer give the same distribution of (t, goal step - t)."""
    storage = make_tag_storage(80, n_envs=2, max_episode_steps=6)
    run = TagEnvs(storage, [[(6, False), (2, True)], [(5, True)]]).step(60)
    live = reference_live(run, storage.n_slots)
    for strategy in list(her.RelabelStrategy):
        ref = reference_sample(run, live, 20_000, np.random.default_rng(1), strategy, 4)
        b = her.HerReplayBuffer(storage, tag_reward, strategy=strategy, n_sampled_goal=4, seed=2).sample(20_000)
        rel = b.relabeled
        own = rel & (b.desired_goal[:, 0] >= 0)  # "mixed" also relabels with DESIRED (other episodes' goal)
        got = np.where(own, _goal_steps_of(b) - b.observation[:, 1].astype(int), -99)
        want = np.array([int(g[1]) - t if g[0] >= 0 else -99 for _, t, g in ref])
        values = np.union1d(got, want)
        table = np.array([[(got == v).sum() for v in values], [(want == v).sum() for v in values]])
        table = table[:, table.sum(0) >= 5]
        assert stats.chi2_contingency(table).pvalue > ALPHA, (strategy, table)
        for _, t, g in ref[:200]:
            assert g[0] < 0 or int(g[1]) in goal_steps(strategy, t, run.episodes[int(g[0])].length)


# ---------------------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------------------


def test_invalid_strategy_or_k_is_refused_with_a_clear_message():
    storage = make_tag_storage(50)
    with pytest.raises(ValueError, match=r"one of \('future', 'final', 'episode', 'mixed'\), got 'futur'"):
        her.HerReplayBuffer(storage, tag_reward, strategy="futur")
    for k in (-1, 1.5, True, "4"):
        with pytest.raises(ValueError, match=rf"integer >= 0, got {k!r}"):
            her.HerReplayBuffer(storage, tag_reward, n_sampled_goal=k)
    with pytest.raises(ValueError, match=r"batch_size must be an integer >= 1, got 0"):
        add_tag_episode(storage, TagRun(), 3)
        her.HerReplayBuffer(storage, tag_reward).sample(0)
    with pytest.raises(ValueError, match=r"gamma must be in \(0, 1\], got 1.5"):
        her.HerReplayBuffer(storage, tag_reward, gamma=1.5)


def test_batch_from_slots_relabels_given_transitions_and_refuses_dead_slots():
    storage = make_tag_storage(50)
    run = TagRun()
    add_tag_episode(storage, run, 4)
    buf = her.HerReplayBuffer(storage, tag_reward, strategy="final", n_sampled_goal=4, seed=0)
    slots = storage.transition_slots()
    b = buf.batch_from_slots(slots)
    check_batch(b, run, [0], strategy="final")
    with pytest.raises(ValueError, match="hold no stored transition"):
        buf.batch_from_slots(np.array([slots[-1] + 1]))  # the episode's last state is no transition


def test_batches_own_their_arrays_writing_one_changes_no_later_batch():
    # weights, discounts and n_steps are copies of cached constant arrays: a learner scaling them in place must
    # not reach the next batch
    storage = make_tag_storage(50)
    add_tag_episode(storage, TagRun(), 6)
    buf = her.HerReplayBuffer(storage, tag_reward, gamma=0.9, seed=0)
    first = buf.sample(16)
    for name in ("weight", "discount", "n_steps", "reward", "observation"):
        arr = getattr(first, name)
        assert arr.flags.writeable, name
        arr *= 3
    second = buf.sample(16)
    np.testing.assert_array_equal(second.weight, np.ones(16, np.float32))
    np.testing.assert_array_equal(second.discount, np.full(16, 0.9, np.float32))
    np.testing.assert_array_equal(second.n_steps, np.ones(16, np.int64))


# ---------------------------------------------------------------------------------------------------------
# Case: the mixed strategy (future + other episodes' desired goals): its goal pool, its share, its rewards
# ---------------------------------------------------------------------------------------------------------


def _mixed_storage(n_episodes=6, length=5, capacity=60):
    """Episodes e = 0.. with achieved goals (100 e + k, 0) and desired goal (-1 - e, 7); ring of ``capacity``."""
    storage = her.EpisodeStorage(capacity, (2,), (1,), (2,))
    for e in range(n_episodes):
        ag = np.stack([100.0 * e + np.arange(length + 1), np.zeros(length + 1)], 1)
        storage.add_episode(np.stack([np.full(length + 1, e), np.arange(length + 1)], 1), np.zeros((length, 1)),
                            np.zeros(length), achieved_goal=ag, desired_goal=np.array([-1.0 - e, 7.0]))
    return storage


def _near(achieved, desired, info=None):
    return -(np.abs(achieved - desired).max(-1) > 0.5).astype(np.float32)


@pytest.mark.parametrize("f", [0.0, 0.25, 0.5, 1.0])
def test_mixed_share_of_other_desired_goals_and_future_goals(f):
    storage = _mixed_storage()
    buf = her.HerReplayBuffer(storage, _near, strategy="mixed", n_sampled_goal=4, other_desired_fraction=f, seed=3)
    b = buf.sample(40_000)
    e, t = b.observation[:, 0].astype(int), b.observation[:, 1].astype(int)
    g = b.desired_goal
    desired = g[:, 1] == 7.0
    own_desired = desired & (g[:, 0] == -1.0 - e)
    other = b.relabeled & desired
    future = b.relabeled & ~desired
    np.testing.assert_array_equal(own_desired[~b.relabeled], True)  # not relabeled: the episode's own goal
    assert stats.binomtest(int(b.relabeled.sum()), len(b), 0.8).pvalue > ALPHA
    assert stats.binomtest(int(other.sum()), int(b.relabeled.sum()), f).pvalue > ALPHA
    # the future share: an achieved goal of the same episode, step in {t+1..T}
    step = g[future, 0] - 100 * e[future]
    assert ((step >= t[future] + 1) & (step <= 5)).all() and (g[future, 1] == 0).all()


def test_mixed_other_desired_goals_are_uniform_over_the_live_episodes_after_the_wrap():
    storage = _mixed_storage(n_episodes=15, capacity=40)  # the ring keeps only the newest episodes
    live = sorted({int(e) for e in storage.observation[storage.transition_slots(), 0]})
    assert live == list(range(live[0], 15)) and live[0] > 0
    buf = her.HerReplayBuffer(storage, _near, strategy="mixed", n_sampled_goal=4, other_desired_fraction=1.0, seed=5)
    b = buf.sample(30_000)
    goals = b.desired_goal[b.relabeled]
    assert (goals[:, 1] == 7.0).all()
    owner = (-1.0 - goals[:, 0]).astype(int)  # desired goal (-1 - e, 7) -> episode e
    counts = np.array([(owner == e).sum() for e in live])
    assert counts.sum() == len(goals)  # never an evicted episode's goal
    assert stats.chisquare(counts).pvalue > ALPHA


@pytest.mark.parametrize("n_step", [1, 3])
def test_mixed_rewards_are_recomputed_for_the_drawn_goal(n_step):
    storage = _mixed_storage()
    buf = her.HerReplayBuffer(storage, _near, strategy="mixed", n_sampled_goal=4, n_step=n_step, gamma=0.9, seed=7)
    b = buf.sample(5000)
    e, t = b.observation[:, 0].astype(int), b.observation[:, 1].astype(int)
    m = np.minimum(n_step, 5 - t)
    np.testing.assert_array_equal(b.n_steps, m)
    want = np.zeros(len(b), np.float32)
    for j in range(n_step):
        ag = np.stack([100.0 * e + t + 1 + j, np.zeros(len(b))], 1)
        want += np.where(j < m, 0.9**j * _near(ag, b.desired_goal), 0.0).astype(np.float32)
    np.testing.assert_allclose(b.reward, want, rtol=1e-6)
    other = b.relabeled & (b.desired_goal[:, 1] == 7.0)
    assert other.sum() > 1000 and (b.reward[other] < 0).all()  # nobody reaches a desired goal here
    assert (b.reward[b.relabeled & ~other] > -n_step).any()  # future goals are reached


def test_mixed_refuses_a_fraction_outside_0_1():
    for bad in (-0.1, 1.5, float("nan"), True):
        with pytest.raises(ValueError, match="other_desired_fraction must be a number in"):
            her.make_relabeler("mixed", 4, bad)
