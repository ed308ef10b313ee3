"""Prioritized replay: segment trees, P(i) and IS weights, new/zero/overwritten priorities, beta annealing,
rank-based variant, and composition with goal relabeling."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import (
    TagEnvs,
    TagRun,
    add_tag_episode,
    check_batch,
    make_tag_storage,
    reference_live,
    tag_reward,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

import her
from her.trees import MaxTree, MinTree, SegmentTree, SumTree

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ALPHA = 1e-4


def one_step_storage(capacity: int) -> her.EpisodeStorage:
    """Goal-free storage whose items are one-transition episodes (the item i is observation[0] == i)."""
    return her.EpisodeStorage(capacity, (1,), (1,), max_episode_steps=1)


def add_items(storage: her.EpisodeStorage, ids) -> list[int]:
    """Add one-transition episodes; return their slots."""
    return [storage.add_episode(np.array([[i], [i]], np.float32), np.zeros((1, 1)), np.zeros(1))[0] for i in ids]


def live_priorities(sampler: her.PrioritizedSampler, storage: her.EpisodeStorage) -> tuple[np.ndarray, np.ndarray]:
    slots = storage.transition_slots()
    return slots, sampler.priorities(slots)


# ---------------------------------------------------------------------------------------------------------
# Segment trees
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("branching", [2, 3, 32])
def test_any_capacity_prefix_search_finds_the_right_leaf(branching):
    tree = SumTree(3, branching)
    tree.update(np.arange(3), 1.0)
    np.testing.assert_array_equal(tree.find(np.array([0.5, 1.5, 2.5])), [0, 1, 2])
    rng = np.random.default_rng(0)
    for capacity in (3, 5, 6, 8):
        tree = SumTree(capacity, branching)
        p = np.arange(1, capacity + 1, dtype=float)
        tree.update(np.arange(capacity), p)
        idx = tree.find(rng.random(60_000) * tree.total)
        freq = np.bincount(idx, minlength=capacity) / 60_000
        np.testing.assert_allclose(freq, p / p.sum(), atol=0.01)


@pytest.mark.parametrize("branching", [2, 32])
def test_million_leaf_tree_finds_exact_indices(branching):
    n = 1_000_000
    tree = SumTree(n, branching)
    tree.update(np.arange(n), 1.0)
    assert tree.total == n
    k = np.array([0, 1, 499_999, 999_999])
    np.testing.assert_array_equal(tree.find(k + 0.5), k)


def small_top(cls, top_nodes: int):
    """``cls`` with updates maintaining levels only up to ``top_nodes`` nodes (the default, 4096, covers every
    tree of these tests whole), so that small trees go through the code paths of large ones."""
    return type(cls.__name__, (cls,), {"TOP_NODES": top_nodes})


@SETTINGS
@given(st.integers(1, 300), st.sampled_from([2, 3, 32]), st.sampled_from([1, 4, 4096]), st.data())
def test_tree_nodes_stay_exact_reductions_under_random_batched_updates(capacity, branching, top_nodes, data):
    trees = {"sum": small_top(SumTree, top_nodes)(capacity, branching),
             "sum+min": small_top(SumTree, top_nodes)(capacity, branching, track_min=True),
             "min": small_top(MinTree, top_nodes)(capacity, branching),
             "max": small_top(MaxTree, top_nodes)(capacity, branching)}
    ops = {"sum": np.sum, "sum+min": np.sum, "min": np.min, "max": np.max}
    leaves = {name: np.full(capacity, t.neutral) for name, t in trees.items()}
    for _ in range(data.draw(st.integers(1, 6))):
        idx = np.array(data.draw(st.lists(st.integers(0, capacity - 1), min_size=1, max_size=2 * capacity)))
        vals = np.array(data.draw(st.lists(st.sampled_from([0.0, 1e-3, 1.0, 7.5]) | st.floats(0, 1e6),
                                           min_size=len(idx), max_size=len(idx))))
        for name, tree in trees.items():
            tree.update(idx, vals)
            leaves[name][idx] = vals  # same (last-wins) semantics for repeated indices
        positive = leaves["sum"][leaves["sum"] > 0]
        assert trees["sum+min"].min_positive == (positive.min() if positive.size else np.inf)
    for name, tree in trees.items():
        np.testing.assert_array_equal(tree.leaves, leaves[name])
        for d in range(tree.depth):  # every internal node is the reduction of its children
            children = tree.levels[d + 1].reshape(-1, branching)
            np.testing.assert_array_equal(tree.levels[d], tree.reduce_rows(children))
            np.testing.assert_allclose(tree.levels[d], ops[name](children, axis=1), rtol=1e-12)
        assert np.all(tree.levels[tree.depth][capacity:] == tree.neutral)
    assert math.isclose(trees["sum"].root, math.fsum(leaves["sum"]), rel_tol=1e-12, abs_tol=1e-9)
    assert trees["min"].root == leaves["min"].min() and trees["max"].root == leaves["max"].max()


def test_tracked_minimum_survives_ties_overwrites_of_the_minimum_and_rebuilds():
    tree = SumTree(100, 4, track_min=True)
    assert tree.min_positive == np.inf
    tree.update(np.arange(10), np.full(10, 0.5))  # ten leaves tie at the minimum
    assert tree.min_positive == 0.5
    tree.update(np.array([3]), np.array([2.0]))  # one of the tied leaves leaves the minimum: still 0.5
    assert tree.min_positive == 0.5
    tree.update(np.arange(10), np.full(10, 3.0))  # every leaf holding it overwritten
    assert tree.min_positive == 3.0
    tree.update(np.array([7, 7]), np.array([0.1, 4.0]))  # repeated index: the last value counts, not 0.1
    assert tree.min_positive == 3.0
    tree.update(np.array([5]), np.array([0.0]))  # emptied leaves never count
    tree.update(np.array([50]), np.array([0.25]))
    assert tree.min_positive == 0.25
    tree.levels[tree.depth][:100] = 0.0
    tree.levels[tree.depth][42] = 9.0
    tree.rebuild()  # bulk writes to the leaves
    assert tree.min_positive == 9.0


def test_tied_minimum_is_kept_by_count_without_recounting_the_leaves(monkeypatch):
    # alpha = 0: every priority ties at the minimum; overwriting some of them must not force an O(capacity) recount
    tree = SumTree(1000, 16, track_min=True)
    tree.update(np.arange(1000), np.ones(1000))
    assert tree.min_positive == 1.0
    recounts = []
    real_min = np.min
    monkeypatch.setattr(np, "min", lambda *a, **k: recounts.append(1) or real_min(*a, **k))
    rng = np.random.default_rng(0)
    for _ in range(50):
        tree.update(rng.integers(0, 1000, 64), np.ones(64))  # repeated indices included
        assert tree.min_positive == 1.0
    tree.update(np.arange(990), np.zeros(990))  # evictions leave ten tied leaves
    assert tree.min_positive == 1.0
    assert not recounts
    tree.update(np.arange(990, 1000), np.full(10, 2.0))  # the last of them overwritten: one recount
    assert tree.min_positive == 2.0 and len(recounts) == 1


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_find_refuses_a_nan_mass_and_the_sampler_an_overflowed_total():
    tree = SumTree(100, 4)
    tree.update(np.arange(100), np.ones(100))
    with pytest.raises(ValueError, match="masses"):
        tree.find(np.array([1.0, np.nan]))
    storage = make_tag_storage(50)
    add_tag_episode(storage, TagRun(), 5)
    sampler = her.PrioritizedSampler(storage, alpha=1.0)
    sampler.update_priorities(np.array([0, 1]), np.array([1.7e308, 1.7e308]))
    with pytest.raises(ValueError, match="overflowed"):
        sampler.sample(storage, 4, np.random.default_rng(0))


@SETTINGS
@given(st.integers(1, 200), st.sampled_from([2, 32]), st.sampled_from([1, 4, 64, 4096]), st.data())
def test_find_returns_the_leaf_whose_prefix_interval_holds_the_mass_and_never_an_empty_one(capacity, branching,
                                                                                           top_nodes, data):
    vals = np.array(data.draw(st.lists(st.sampled_from([0.0, 1e-3, 0.5, 1.0, 7.0, 1e4]), min_size=capacity,
                                       max_size=capacity)))
    if vals.sum() == 0:
        vals[-1] = 1.0
    tree = small_top(SumTree, top_nodes)(capacity, branching)
    tree.update(np.arange(capacity), vals)
    u = np.array(data.draw(st.lists(st.floats(0, 1, exclude_max=True), min_size=1, max_size=50)))
    masses = np.concatenate([u * tree.total, [tree.total, np.nextafter(tree.total, 0)]])
    idx = tree.find(masses)
    assert (vals[idx] > 0).all()
    cum = np.concatenate([[0.0], np.cumsum(vals)])
    tol = 1e-9 * tree.total
    for m, i in zip(masses[:-2], idx[:-2]):
        assert cum[i] - tol <= m <= cum[i + 1] + tol


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, -1.0])
def test_invalid_priorities_are_refused_with_a_clear_error(bad):
    tree = SumTree(10)
    with pytest.raises(ValueError, match=r"priorities must be finite and >= 0, got \[" + ("-" if bad < 0 else "")):
        tree.update(np.array([1, 2]), np.array([1.0, bad]))
    assert tree.total == 0
    storage = one_step_storage(10)
    slots = add_items(storage, range(3))
    sampler = her.PrioritizedSampler(storage)
    if not bad < 0:
        with pytest.raises(ValueError, match="TD errors must be finite, got"):
            sampler.update_priorities(slots, [0.1, bad, 0.2])
    with pytest.raises(ValueError, match=r"td_error must have shape \[B\] or \[B, 1\] with B = 3 slots, got shape \(2,\)"):
        sampler.update_priorities(slots, [0.1, 0.2])
    with pytest.raises(ValueError, match=r"with B = 3 slots, got shape \(3, 3\)"):  # not flattened into 9 values
        sampler.update_priorities(slots, np.ones((3, 3)))
    with pytest.raises(ValueError, match=r"slots must be a 1-D array \[B\] \(a batch's `index`\), got shape \(3, 1\)"):
        sampler.update_priorities(np.asarray(slots)[:, None], [0.1, 0.2, 0.3])
    with pytest.raises(IndexError, match=r"must be in \[0, 10\)"):
        tree.update(np.array([10]), np.array([1.0]))
    with pytest.raises(IndexError, match=r"slots must be in \[0, "):
        sampler.update_priorities([-1, 0, 1], [0.1, 0.2, 0.3])
    if not bad < 0:  # refused before the clip (which would hide an inf) and for slots dropped since sampling
        clipped = her.PrioritizedSampler(storage, td_error_clip=1.0)
        with pytest.raises(ValueError, match="TD errors must be finite, got"):
            clipped.update_priorities(slots, [0.1, bad, 0.2])
        add_items(storage, range(3, 20))  # the ring wraps: the first items are gone
        assert not storage.is_transition(np.array(slots)).any()
        with pytest.raises(ValueError, match="TD errors must be finite, got"):
            sampler.update_priorities(slots, [0.1, bad, 0.2])


def test_bad_tree_and_sampler_arguments_are_refused():
    with pytest.raises(ValueError, match="eps \\*\\* alpha underflows to 0"):
        her.PrioritizedSampler(one_step_storage(5), alpha=2.0, eps=1e-200)
    with pytest.raises(ValueError, match="capacity must be >= 1, got 0"):
        SumTree(0)
    with pytest.raises(ValueError, match="branching must be >= 2, got 1"):
        SumTree(5, 1)
    with pytest.raises(ValueError, match="reduce must be one of"):
        SegmentTree(5, "mean")
    with pytest.raises(ValueError, match="cannot sample from a sum tree whose total priority is 0"):
        SumTree(5).find(np.array([0.0]))
    storage = one_step_storage(10)
    for kw, msg in (({"alpha": -0.1}, "alpha must be a finite number >= 0"),
                    ({"beta0": 1.5}, r"beta0 must be in \[0, 1\]"), ({"eps": 0.0}, "eps must be a finite number > 0")):
        with pytest.raises(ValueError, match=msg):
            her.PrioritizedSampler(storage, **kw)
    with pytest.raises(ValueError, match="attached to another storage"):
        her.HerReplayBuffer(storage, sampler=her.PrioritizedSampler(one_step_storage(10)))


# ---------------------------------------------------------------------------------------------------------
# New items, zero errors and IS weights (alpha 0.6, beta 0.4, capacity 1,000)
# ---------------------------------------------------------------------------------------------------------


def test_new_item_gets_the_current_maximum_priority_not_one():
    storage = one_step_storage(1000)
    sampler = her.PrioritizedSampler(storage, alpha=0.6, beta0=0.4)
    slots = add_items(storage, range(100))
    sampler.update_priorities(slots, np.full(100, 0.01))
    (new,) = add_items(storage, [100])
    expected = (0.01 + sampler.eps) ** 0.6
    assert sampler.priorities([new])[0] == pytest.approx(expected, rel=1e-12)
    assert sampler.priorities([new])[0] != 1.0
    np.testing.assert_allclose(sampler.priorities(slots), expected, rtol=1e-12)


def test_zero_td_error_keeps_an_item_sampleable():
    storage = one_step_storage(1000)
    sampler = her.PrioritizedSampler(storage, alpha=0.6, beta0=0.4)
    slots = add_items(storage, range(5))
    sampler.update_priorities(slots, np.zeros(5))
    p = sampler.priorities(slots)
    np.testing.assert_allclose(p, sampler.eps**0.6)
    assert (p > 0).all()
    drawn, w = sampler.sample(storage, 5000, np.random.default_rng(0))
    assert set(drawn.tolist()) == set(slots)
    np.testing.assert_allclose(w, 1.0)


def test_is_weights_are_finite_in_0_1_with_100_of_1000_slots_filled():
    storage = one_step_storage(1000)
    sampler = her.PrioritizedSampler(storage, alpha=0.6, beta0=0.4)
    slots = np.array(add_items(storage, range(100)))
    td = np.random.default_rng(1).exponential(size=100)
    sampler.update_priorities(slots, td)
    drawn, w = sampler.sample(storage, 20_000, np.random.default_rng(2))
    assert np.isfinite(w).all() and (w > 0).all() and (w <= 1).all()
    p = (np.abs(td) + sampler.eps) ** 0.6
    # the largest possible weight is 1 (the lowest-priority item's); drawn weights are the by-hand ones
    _, w_hand = _weights_by_hand(sampler, p, slots)
    assert w_hand.max() == 1.0 and w_hand[np.argmin(p)] == 1.0
    np.testing.assert_allclose(w, w_hand[np.searchsorted(slots, drawn)], rtol=1e-5)
    assert sampler.min_priority == pytest.approx(p.min())  # empty slots never count as the minimum


def _weights_by_hand(sampler, p, slots):
    N = len(slots)
    P = p / p.sum()
    w = (N * P) ** (-sampler.beta)
    return P, w / w.max()


def test_distinct_priorities_read_back_by_index():
    storage = one_step_storage(1000)
    sampler = her.PrioritizedSampler(storage, alpha=0.6)
    slots = add_items(storage, range(5))
    td = np.array([0.3, 2.0, 0.0, 1.1, 0.05])
    sampler.update_priorities(slots, td)
    np.testing.assert_allclose(sampler.priorities(slots), (td + sampler.eps) ** 0.6, rtol=1e-12)
    sampler.update_priorities(np.array(slots)[::-1], -td)  # sign ignored, order by index
    np.testing.assert_allclose(sampler.priorities(slots), (td[::-1] + sampler.eps) ** 0.6, rtol=1e-12)


# ---------------------------------------------------------------------------------------------------------
# P(i) and IS weights by hand, over tag episodes
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("capacity,branching", [(7, 2), (23, 32), (64, 2), (150, 32)])
def test_sampling_frequencies_match_priorities_by_chi_square(capacity, branching):
    storage = make_tag_storage(capacity, n_envs=2, max_episode_steps=4)
    TagEnvs(storage, [[(3, False), (5, True)], [(2, False), (4, False)]]).step(3 * capacity)
    sampler = her.PrioritizedSampler(storage, alpha=0.7, branching=branching)
    rng = np.random.default_rng(capacity)
    slots = storage.transition_slots()
    sampler.update_priorities(slots, rng.exponential(size=len(slots)))
    _, p = live_priorities(sampler, storage)
    counts = np.zeros(storage.n_slots)
    n_batches, B = 400, 256
    for _ in range(n_batches):
        drawn, _ = sampler.sample(storage, B, rng)
        assert storage.is_transition(drawn).all()
        counts += np.bincount(drawn, minlength=storage.n_slots)
    expected = p / p.sum() * n_batches * B
    assert counts.sum() == counts[slots].sum()  # no mass on a non-transition slot
    assert stats.chisquare(counts[slots], expected).pvalue > ALPHA


@pytest.mark.parametrize("beta0", [0.0, 0.4, 1.0])
def test_is_weights_equal_n_p_to_minus_beta_over_the_buffer_max(beta0):
    storage = make_tag_storage(40, n_envs=3, max_episode_steps=3)
    TagEnvs(storage, [[(3, False)], [(1, True), (2, False)], [(4, True)]]).step(50)
    sampler = her.PrioritizedSampler(storage, alpha=0.6, beta0=beta0)
    rng = np.random.default_rng(3)
    slots = storage.transition_slots()
    sampler.update_priorities(slots, rng.normal(size=len(slots)) * 3)
    live, p = live_priorities(sampler, storage)
    N = len(storage)
    P = p / p.sum()
    w_all = (N * P) ** (-beta0)
    w_by_slot = dict(zip(live.tolist(), (w_all / w_all.max()).tolist()))
    drawn, w = sampler.sample(storage, 1000, rng)
    np.testing.assert_allclose(w, [w_by_slot[s] for s in drawn.tolist()], rtol=1e-5)
    assert w.dtype == np.float32 and (w <= 1).all() and (w > 0).all()


def test_beta_anneals_linearly_to_one():
    storage = one_step_storage(50)
    add_items(storage, range(10))
    sampler = her.PrioritizedSampler(storage, beta0=0.4, beta_annealing_steps=10)
    sampler.update_priorities(np.array(storage.transition_slots()), np.arange(10.0))
    rng = np.random.default_rng(0)
    for i in range(15):
        expected_beta = 0.4 + 0.6 * min(i, 10) / 10
        assert sampler.beta == pytest.approx(expected_beta)
        drawn, w = sampler.sample(storage, 64, rng)
        p = sampler.priorities(drawn)
        np.testing.assert_allclose(w, (p / sampler.min_priority) ** -expected_beta, rtol=1e-6)
    assert sampler.beta == 1.0
    assert her.PrioritizedSampler(storage, beta0=0.4).beta == 0.4  # no annealing


def test_rank_based_samples_larger_td_errors_more_often():
    storage = one_step_storage(100)
    slots = np.array(add_items(storage, range(30)))
    sampler = her.PrioritizedSampler(storage, alpha=0.7, rank_based=True, rank_resort_interval=1)
    td = np.linspace(0.0, 3.0, 30)
    sampler.update_priorities(slots, td)
    ranks = 30 - np.arange(30)  # the largest |delta| has rank 1
    np.testing.assert_allclose(sampler.priorities(slots), (1.0 / ranks) ** 0.7, rtol=1e-12)
    counts = np.zeros(storage.n_slots)
    rng = np.random.default_rng(0)
    for _ in range(200):
        counts += np.bincount(sampler.sample(storage, 256, rng)[0], minlength=storage.n_slots)
    c = counts[slots]
    assert stats.spearmanr(td, c).statistic > 0.95
    expected = (1.0 / ranks) ** 0.7
    assert stats.chisquare(c, expected / expected.sum() * c.sum()).pvalue > ALPHA


# ---------------------------------------------------------------------------------------------------------
# Wraparound and persistence
# ---------------------------------------------------------------------------------------------------------


def test_overwritten_transitions_lose_their_priorities():
    storage = make_tag_storage(12, max_episode_steps=4)
    run = TagRun()
    sampler = her.PrioritizedSampler(storage, alpha=1.0)
    for _ in range(3):
        add_tag_episode(storage, run, 4)
    sampler.update_priorities(storage.transition_slots(), np.arange(12.0) * 10)  # old episode: small priorities
    assert sampler.max_priority == pytest.approx(110 + sampler.eps)
    add_tag_episode(storage, run, 4)
    add_tag_episode(storage, run, 4)  # the ring wraps: the oldest episodes are gone
    live = storage.transition_slots()
    dead = np.setdiff1d(np.arange(storage.n_slots), live)
    assert set(storage.observation[live, 0].astype(int).tolist()) == {2, 3, 4}
    assert (sampler.sum_tree.leaves[dead] == 0).all()
    new = live[-8:]  # the two new episodes: the max priority seen
    np.testing.assert_allclose(sampler.priorities(new), sampler.max_priority)
    assert sampler.sum_tree.total == pytest.approx(sampler.priorities(live).sum())
    drawn, _w = sampler.sample(storage, 4000, np.random.default_rng(0))
    assert storage.is_transition(drawn).all()
    assert set(storage.observation[drawn, 0].astype(int).tolist()) == {2, 3, 4}
    # a stale update of an overwritten slot is ignored
    before = sampler.sum_tree.leaves.copy()
    sampler.update_priorities(dead[:3], np.ones(3))
    np.testing.assert_array_equal(sampler.sum_tree.leaves, before)


@SETTINGS
@given(st.integers(5, 40), st.lists(st.integers(1, 6), min_size=1, max_size=30), st.integers(0, 2**31 - 1))
def test_priority_mass_always_sits_exactly_on_live_transitions(capacity, lengths, seed):
    storage = make_tag_storage(max(capacity, max(lengths)), max_episode_steps=3)
    sampler = her.PrioritizedSampler(storage, branching=2)
    run, rng = TagRun(), np.random.default_rng(seed)
    for T in lengths:
        add_tag_episode(storage, run, T)
        live = storage.transition_slots()
        drawn, _w = sampler.sample(storage, 16, rng)
        sampler.update_priorities(drawn, rng.normal(size=16))
        mask = np.zeros(storage.n_slots, bool)
        mask[live] = True
        assert (sampler.sum_tree.leaves[mask] > 0).all() and (sampler.sum_tree.leaves[~mask] == 0).all()
        assert sampler.min_priority == sampler.sum_tree.leaves[mask].min()


def test_buffer_state_round_trip_restores_priorities_and_draws(tmp_path):
    storage = make_tag_storage(60, n_envs=2, max_episode_steps=5)
    TagEnvs(storage, [[(5, True)], [(3, False)]]).step(40)
    buf = her.HerReplayBuffer(storage, tag_reward, sampler=her.PrioritizedSampler(storage), seed=1)
    b = buf.sample(64)
    buf.update_priorities(b.index, np.linspace(0, 5, 64))
    state = buf.state_dict()
    storage2 = make_tag_storage(60, n_envs=2, max_episode_steps=5)
    buf2 = her.HerReplayBuffer(storage2, tag_reward, sampler=her.PrioritizedSampler(storage2), seed=99)
    buf2.load_state_dict(state)
    np.testing.assert_array_equal(buf2.sampler.sum_tree.leaves, buf.sampler.sum_tree.leaves)
    assert buf2.sampler.min_priority == buf.sampler.min_priority
    x, y = buf.sample(128), buf2.sample(128)
    for name in ("index", "weight", "desired_goal", "reward"):
        np.testing.assert_array_equal(getattr(x, name), getattr(y, name))


# ---------------------------------------------------------------------------------------------------------
# Composition: prioritized transitions -> goals -> returns
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", list(her.RelabelStrategy))
def test_prioritized_sampling_keeps_every_relabeling_property(strategy):
    storage = make_tag_storage(80, n_envs=3, max_episode_steps=5)
    run = TagEnvs(storage, [[(5, True), (2, False)], [(4, False)], [(6, True), (1, True)]]).step(60)
    live = reference_live(run, storage.n_slots)
    sampler = her.PrioritizedSampler(storage, alpha=1.0)
    buf = her.HerReplayBuffer(storage, tag_reward, strategy=strategy, n_sampled_goal=4, sampler=sampler, seed=4)
    slots = storage.transition_slots()
    # all priority on the first step of each episode: goal ranges are then the widest
    td = np.where(storage.step[slots] == 0, 100.0, 0.0)
    buf.update_priorities(slots, td)
    b = buf.sample(3000)
    check_batch(b, run, live, strategy=strategy)
    assert (b.observation[:, 1] == 0).mean() > 0.95
    rel = b.relabeled & (b.observation[:, 1] == 0) & (b.desired_goal[:, 0] >= 0)  # own-episode goals
    steps = b.desired_goal[rel, 1].astype(int)
    lengths = np.array([run.episodes[e].length for e in b.observation[rel, 0].astype(int)])
    if strategy == "final":
        np.testing.assert_array_equal(steps, lengths)
    else:
        assert ((steps >= 1) & (steps <= lengths)).all()
    assert stats.binomtest(int(b.relabeled.sum()), len(b), 0.8).pvalue > ALPHA


@pytest.mark.parametrize("kw,match", [
    ({"alpha": float("nan")}, "alpha must be a finite number >= 0"),
    ({"alpha": -1.0}, "alpha must be a finite number >= 0"),
    ({"eps": float("nan")}, "eps must be a finite number > 0"),
    ({"td_error_clip": -1.0}, "td_error_clip must be a finite number > 0"),
    ({"beta0": float("nan")}, "beta0 must be in"),
])
def test_prioritized_sampler_refuses_bad_settings(kw, match):
    with pytest.raises(ValueError, match=match):
        her.PrioritizedSampler(make_tag_storage(50), **kw)


def test_update_priorities_checks_its_arguments():
    storage = make_tag_storage(50)
    add_tag_episode(storage, TagRun(), 5)
    buf = her.HerReplayBuffer(storage, tag_reward, sampler=her.PrioritizedSampler(storage), seed=0)
    assert buf.prioritized
    b = buf.sample(4)
    with pytest.raises(ValueError, match=r"with B = 4 slots, got shape \(3,\)"):
        buf.update_priorities(b.index, np.ones(3))
    with pytest.raises(ValueError, match="TD errors must be finite"):
        buf.update_priorities(b.index, np.array([1.0, np.nan, 1.0, 1.0]))
    with pytest.raises(ValueError, match="slots must be integers"):
        buf.update_priorities(b.index + 0.5, np.ones(4))
    with pytest.raises(IndexError, match=r"slots must be in \[0, "):
        buf.update_priorities(np.array([10**9]), np.ones(1))
    buf.update_priorities(b.index, np.ones(4))


def test_update_priorities_on_a_uniform_buffer_is_an_error_not_a_silent_no_op():
    storage = make_tag_storage(50)
    add_tag_episode(storage, TagRun(), 5)
    buf = her.HerReplayBuffer(storage, tag_reward, seed=0)
    assert not buf.prioritized
    b = buf.sample(4)
    with pytest.raises(ValueError) as err:
        buf.update_priorities(b.index, np.ones(4))
    assert str(err.value) == ("update_priorities: this buffer samples uniformly (UniformSampler), so priorities "
                              "would be ignored; pass sampler=her.PrioritizedSampler() for prioritized "
                              "replay, or skip the call when not buffer.prioritized")
    with pytest.raises(ValueError, match="a UniformSampler has no priorities"):
        buf.sampler.update_priorities(b.index, np.ones(4))


@pytest.mark.parametrize("prioritized", [False, True])
def test_the_training_loops_learn_step_updates_priorities_only_when_prioritized(prioritized):
    from her_agents.loop.collect import learn_step

    storage = make_tag_storage(50)
    add_tag_episode(storage, TagRun(), 5)
    sampler = her.PrioritizedSampler(storage) if prioritized else None
    buf = her.HerReplayBuffer(storage, tag_reward, sampler=sampler, seed=0)

    class Agent:
        def update(self, batch):
            return {"critic_loss": 1.0, "td_error": np.full(len(batch), 3.0, np.float32)}

    metrics = {}
    learn_step(Agent(), buf, 8, metrics)
    assert metrics == {"critic_loss": [1.0]}
    if prioritized:
        assert buf.sampler.max_priority == pytest.approx((3.0 + 1e-6) ** 0.6)


def test_sample_and_batch_from_slots_refuse_bad_arguments():
    storage = make_tag_storage(50)
    add_tag_episode(storage, TagRun(), 5)
    buf = her.HerReplayBuffer(storage, tag_reward, seed=0)
    for bad in (2.7, "8", None, 0, -3, True):
        with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
            buf.sample(bad)
    assert len(buf.sample(np.int64(3))) == 3
    with pytest.raises(ValueError, match="slots must be integers in"):
        buf.batch_from_slots([10**9])
    with pytest.raises(ValueError, match="slots must be integers in"):
        buf.batch_from_slots([0.5])


def test_goal_free_buffer_still_checks_the_relabel_settings():
    storage = her.EpisodeStorage(20, (3,), (2,))
    with pytest.raises(ValueError, match="relabel strategy"):
        her.HerReplayBuffer(storage, strategy="bogus")


def test_rank_based_state_dict_keeps_the_resort_schedule():
    """A restored rank-based sampler re-sorts after the same number of further updates as the original."""
    rng = np.random.default_rng(1)
    samplers, slots = [], None
    for _ in range(2):
        storage = one_step_storage(50)
        slots = np.array(add_items(storage, range(20)))
        samplers.append(her.PrioritizedSampler(storage, alpha=0.7, rank_based=True, rank_resort_interval=3))
    original, restored = samplers
    for _ in range(2):  # 2 of 3 updates towards the next re-sort
        original.update_priorities(slots, rng.random(20))
    restored.load_state_dict(original.state_dict())
    td = rng.random(20)
    for s in (original, restored):
        s.update_priorities(slots, td)  # the third: both re-sort now
    np.testing.assert_array_equal(restored.priorities(slots), original.priorities(slots))
    assert not np.allclose(original.priorities(slots), original.priorities(slots)[0])  # it did re-sort


@pytest.mark.parametrize("kwargs", [{"alpha": "1"}, {"alpha": True}, {"eps": None}, {"beta0": [0.4]},
                                    {"td_error_clip": "2"}])
def test_settings_that_are_not_numbers_are_refused_by_name(kwargs):
    (name,) = kwargs
    with pytest.raises(TypeError, match=rf"^{name} must be"):
        her.PrioritizedSampler(**kwargs)
