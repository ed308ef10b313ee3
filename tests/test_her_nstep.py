"""n-step returns against a brute-force reference: windows cut at the episode end and at termination, every
reward recomputed for the (relabeled) goal, bootstrap state and discount, n = 1, stop_at_success, terminal flags
recomputed by compute_terminated."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import (
    TagEnvs,
    TagRun,
    add_tag_episode,
    check_batch,
    make_tag_storage,
    reference_live,
    sparse_reward,
    tag_reward,
    tag_setups,
    tag_success,
    tag_terminated,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import her

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def nstep_setups(draw, max_len: int = 9):
    n_envs, schedules, capacity, mes, n_steps = draw(tag_setups(max_len, min_steps=max_len))
    return {"n_envs": n_envs, "schedules": schedules, "capacity": capacity, "mes": mes, "n_steps": n_steps,
            "n": draw(st.integers(1, 6)), "gamma": draw(st.sampled_from([0.5, 0.9, 0.98, 1.0])),
            "strategy": draw(st.sampled_from(list(her.RelabelStrategy))), "k": draw(st.integers(0, 4)),
            "prioritized": draw(st.booleans()), "seed": draw(st.integers(0, 2**31 - 1))}


def _buffer(p, storage, **kw):
    sampler = her.PrioritizedSampler(storage, alpha=0.7, beta0=0.5) if p["prioritized"] else None
    return her.HerReplayBuffer(storage, tag_reward, strategy=p["strategy"], n_sampled_goal=p["k"], n_step=p["n"],
                               gamma=p["gamma"], sampler=sampler, seed=p["seed"], **kw)


@SETTINGS
@given(nstep_setups())
def test_nstep_return_matches_the_reference_across_wrap_terminations_strategies_and_samplers(p):
    storage = make_tag_storage(p["capacity"], p["n_envs"], p["mes"])
    run = TagEnvs(storage, p["schedules"]).step(p["n_steps"])
    live = reference_live(run, storage.n_slots)
    if not live:
        return
    buf = _buffer(p, storage)
    batch = buf.sample(128)
    check_batch(batch, run, live, strategy=p["strategy"], n=p["n"], gamma=p["gamma"])
    if p["prioritized"]:  # train on the batch and draw again: still by the book
        buf.update_priorities(batch.index, np.random.default_rng(p["seed"]).normal(size=len(batch)))
        check_batch(buf.sample(128), run, live, strategy=p["strategy"], n=p["n"], gamma=p["gamma"])


@SETTINGS
@given(nstep_setups())
def test_stop_at_success_ends_the_window_at_the_first_success(p):
    storage = make_tag_storage(p["capacity"], p["n_envs"], p["mes"])
    run = TagEnvs(storage, p["schedules"]).step(p["n_steps"])
    live = reference_live(run, storage.n_slots)
    if not live:
        return
    buf = _buffer(p, storage, stop_at_success=True, compute_success=tag_success)
    batch = buf.sample(128)
    check_batch(batch, run, live, strategy=p["strategy"], n=p["n"], gamma=p["gamma"], stop_at_success=True)


@SETTINGS
@given(nstep_setups(), st.booleans(), st.booleans())
def test_compute_terminated_recomputes_every_terminal_flag_and_ends_windows_at_the_first(p, use_info, success):
    """With compute_terminated the stored ends are ignored: every row's windows end at the first step terminal for
    its goal (reached, or the info-borne w == 4), across wrap, strategies, samplers, n and stop_at_success."""
    storage = make_tag_storage(p["capacity"], p["n_envs"], p["mes"], info=use_info)
    run = TagEnvs(storage, p["schedules"]).step(p["n_steps"])
    live = reference_live(run, storage.n_slots)
    if not live:
        return
    kw = {"stop_at_success": True, "compute_success": tag_success} if success else {}
    buf = _buffer(p, storage, compute_terminated=tag_terminated, **kw)
    ref = {"strategy": p["strategy"], "n": p["n"], "gamma": p["gamma"], "use_info": use_info,
           "stop_at_success": success, "terminated_fn": tag_terminated}
    batch = buf.sample(128)
    check_batch(batch, run, live, **ref)
    if p["prioritized"]:
        buf.update_priorities(batch.index, np.random.default_rng(p["seed"]).normal(size=len(batch)))
        check_batch(buf.sample(128), run, live, **ref)


def test_stop_at_success_with_final_goal_example():
    """L = 6, final goal (0, 6): from t = 1 with n = 3 no success inside the window (m = 3); with the future
    goal hitting at step 3 the window from t = 1 ends after 2 steps."""
    storage = make_tag_storage(50, info=False)
    add_tag_episode(storage, TagRun(), 6)
    buf = her.HerReplayBuffer(storage, sparse_reward, strategy="future", n_sampled_goal=4, n_step=3, gamma=0.5,
                              stop_at_success=True, compute_success=tag_success, seed=0)
    b = buf.sample(5000)
    t, g = b.observation[:, 1].astype(int), b.desired_goal[:, 1].astype(int)
    sel = b.relabeled & (t == 1) & (g == 3)
    assert sel.sum() > 50
    assert (b.n_steps[sel] == 2).all() and (b.next_observation[sel, 1] == 3).all()
    np.testing.assert_allclose(b.reward[sel], -1.0 + 0.5 * 0.0)
    np.testing.assert_allclose(b.discount[sel], 0.25)
    sel = b.relabeled & (t == 1) & (g == 6)
    assert (b.n_steps[sel] == 3).all()
    np.testing.assert_allclose(b.reward[sel], -1.0 - 0.5 - 0.25)
    with pytest.raises(ValueError, match="stop_at_success needs"):
        her.HerReplayBuffer(storage, sparse_reward, n_step=3, stop_at_success=True)


@pytest.mark.parametrize("strategy", list(her.RelabelStrategy))
@pytest.mark.parametrize("prioritized", [False, True])
def test_n_step_1_is_exactly_the_one_step_batch(strategy, prioritized):
    """Same seed: the n = 1 batch and an n = 4 batch draw the same transitions and goals; where the n = 4
    window has length 1 (the last transition) everything equals; the n = 1 batch is the 1-step reference."""
    storage = make_tag_storage(60, n_envs=2, max_episode_steps=5)
    run = TagEnvs(storage, [[(5, True), (3, False)], [(4, False), (6, True)]]).step(40)
    live = reference_live(run, storage.n_slots)

    def make(n):
        sampler = her.PrioritizedSampler(storage) if prioritized else None
        return her.HerReplayBuffer(storage, tag_reward, strategy=strategy, n_step=n, sampler=sampler, seed=9)

    b1, b4 = make(1).sample(2000), make(4).sample(2000)
    check_batch(b1, run, live, strategy=strategy, n=1)
    check_batch(b4, run, live, strategy=strategy, n=4)
    for name in ("index", "observation", "action", "desired_goal", "relabeled", "weight"):
        np.testing.assert_array_equal(getattr(b1, name), getattr(b4, name), err_msg=name)
    assert (b1.n_steps == 1).all()
    np.testing.assert_array_equal(b1.discount, np.float32(0.98))
    one = b4.n_steps == 1
    assert one.sum() > 100
    for name in ("reward", "next_observation", "discount", "terminated"):
        np.testing.assert_array_equal(getattr(b1, name)[one], getattr(b4, name)[one], err_msg=name)
    # first term of the n-step return is the 1-step reward: R4 - r = gamma * (rest) for the rows with m >= 2
    assert not np.array_equal(b1.reward, b4.reward)


def test_goal_free_storage_nstep_uses_stored_rewards():
    storage = her.EpisodeStorage(40, (2,), (1,), max_episode_steps=5)
    T = 5
    obs = np.stack([np.arange(T + 1), np.zeros(T + 1)], 1)
    storage.add_episode(obs, np.zeros((T, 1)), np.arange(1, T + 1, dtype=np.float32), terminated=True)
    buf = her.HerReplayBuffer(storage, n_step=3, gamma=0.5, seed=0)
    b = buf.sample(500)
    assert b.desired_goal is None and not b.relabeled.any()
    t = b.observation[:, 0].astype(int)
    m = np.minimum(3, T - t)
    ref = np.array([sum(0.5**j * (tt + j + 1) for j in range(mm)) for tt, mm in zip(t, m)])
    np.testing.assert_array_equal(b.n_steps, m)
    np.testing.assert_allclose(b.reward, ref, rtol=1e-6)
    np.testing.assert_array_equal(b.next_observation[:, 0], t + m)
    np.testing.assert_array_equal(b.terminated, t + m == T)
    b1 = her.HerReplayBuffer(storage, seed=0).sample(500)
    np.testing.assert_array_equal(b1.reward, b1.observation[:, 0] + 1)


@pytest.mark.parametrize("n_step", [0, -1, 1.5, True])
def test_n_step_below_one_or_not_an_integer_is_refused(n_step):
    storage = make_tag_storage(50)
    with pytest.raises(ValueError, match=rf"n_step must be an integer >= 1, got {n_step!r}"):
        her.HerReplayBuffer(storage, tag_reward, n_step=n_step)
