"""EpisodeStorage: only complete episodes, whole-episode ring overwrite, parallel envs, bad input, save/load."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import (
    DESIRED,
    GOAL_DIM,
    INFO_SHAPES,
    OBS_DIM,
    TagEnvs,
    TagRun,
    add_tag_episode,
    check_batch,
    make_tag_storage,
    reference_live,
    tag_reward,
    tag_setups,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import her

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------------------------------------------------
# Semantics: only complete episodes; the oldest whole episode is dropped; no sample mixes episodes
# ---------------------------------------------------------------------------------------------------------


@SETTINGS
@given(tag_setups())
def test_storage_holds_exactly_the_newest_complete_episodes_that_fit(setup):
    n_envs, schedules, capacity, mes, n_steps = setup
    storage = make_tag_storage(capacity, n_envs, mes)
    env = TagEnvs(storage, schedules)
    run = env.step(n_steps)
    live = reference_live(run, storage.n_slots)
    assert [T for _, T in storage.episodes()] == [run.episodes[e].length for e in live]
    assert len(storage) == sum(run.episodes[e].length for e in live)
    assert storage.n_episodes == len(live)
    assert storage.n_live_states == len(storage) + len(live) <= storage.n_slots
    # every live episode is stored whole, in order, in consecutive ring slots
    slots = storage.transition_slots()
    assert len(slots) == len(storage)
    ids = storage.observation[slots, 0].astype(int)
    steps = storage.observation[slots, 1].astype(int)
    expect = [(e, t) for e in live for t in range(run.episodes[e].length)]
    assert list(zip(ids.tolist(), steps.tolist())) == expect
    assert env.writer.in_progress_lengths() == [step for _, step in env.state]


@SETTINGS
@given(tag_setups(), st.integers(0, 2**31 - 1))
def test_samples_come_only_from_complete_live_episodes_and_never_mix_episodes(setup, seed):
    n_envs, schedules, capacity, mes, n_steps = setup
    storage = make_tag_storage(capacity, n_envs, mes)
    run = TagEnvs(storage, schedules).step(n_steps)
    live = reference_live(run, storage.n_slots)
    buf = her.HerReplayBuffer(storage, tag_reward, n_sampled_goal=0, seed=seed)
    if not live:
        with pytest.raises(ValueError, match="no complete episode"):
            buf.sample(8)
        return
    batch = buf.sample(200)
    check_batch(batch, run, live, strategy="future")  # raises on a dead/unfinished episode or a mixed row
    # nothing of an unfinished episode
    assert not set(batch.observation[:, 0].astype(int)) & set(run.in_progress.values())
    # the next state is the next step of the same episode
    np.testing.assert_array_equal(batch.next_observation[:, 0], batch.observation[:, 0])
    np.testing.assert_array_equal(batch.next_observation[:, 1], batch.observation[:, 1] + 1)


def test_in_progress_lengths_count_staged_steps_per_env():
    storage = make_tag_storage(100, n_envs=2)
    env = TagEnvs(storage, [[(3, False)], [(5, True)]])
    env.step(4)
    assert env.writer.in_progress_lengths() == [1, 4]
    assert [T for _, T in storage.episodes()] == [3]


# ---------------------------------------------------------------------------------------------------------
# Unfinished episodes, capacity limits (case: unfinished episodes are never sampled)
# ---------------------------------------------------------------------------------------------------------


def test_unfinished_episode_is_never_sampled_next_to_a_finished_one():
    storage = make_tag_storage(60)
    env = TagEnvs(storage, [[(5, False), (50, False)]])
    env.step(5 + 3)
    assert env.writer.in_progress_lengths() == [3]
    buf = her.HerReplayBuffer(storage, tag_reward, strategy="future", n_sampled_goal=4, seed=0)
    batch = buf.sample(5000)
    assert set(batch.observation[:, 0].astype(int)) == {0}
    assert set(batch.next_observation[:, 0].astype(int)) == {0}
    assert set(batch.desired_goal[batch.relabeled, 0].astype(int)) == {0}
    assert batch.observation[:, 1].max() == 4 and batch.next_observation[:, 1].max() == 5


def test_sampling_with_only_an_unfinished_episode_raises_a_clear_error():
    storage = make_tag_storage(60)
    buf = her.HerReplayBuffer(storage, tag_reward, seed=0)
    TagEnvs(buf, [[(10, False)]]).step(3)  # through the buffer's writer
    with pytest.raises(ValueError, match=r"no complete episode.*3 steps of unfinished"):
        buf.sample(4)
    for sampler in (her.PrioritizedSampler(), her.UniformSampler()):
        with pytest.raises(ValueError, match="no complete episode"):
            sampler.sample(storage, 4, np.random.default_rng(0))


def test_capacity_equal_to_episode_length_keeps_the_latest_episode_whole():
    storage = make_tag_storage(10, max_episode_steps=10)
    run = TagRun()
    for _ in range(3):
        add_tag_episode(storage, run, 10)
    assert storage.episodes()[-1][1] == 10 and storage.n_episodes == 1
    buf = her.HerReplayBuffer(storage, tag_reward, n_sampled_goal=0, seed=1)
    batch = buf.sample(2000)
    assert set(batch.observation[:, 0].astype(int)) == {2}
    assert sorted(set(batch.observation[:, 1].astype(int))) == list(range(10))


def test_episode_longer_than_capacity_is_refused_by_add_episode():
    storage = make_tag_storage(10)
    with pytest.raises(ValueError, match=r"episode of 11 transitions is longer than the storage capacity 10"):
        add_tag_episode(storage, TagRun(), 11)
    assert len(storage) == 0
    add_tag_episode(storage, TagRun(), 10)  # exactly the capacity fits
    assert len(storage) == 10


@pytest.mark.parametrize("max_episode_steps", [3, 10, 50])
def test_episode_longer_than_capacity_is_refused_by_add_once_without_harming_other_envs(max_episode_steps):
    storage = make_tag_storage(10, n_envs=2, max_episode_steps=max_episode_steps)
    env = TagEnvs(storage, [[(12, False), (2, True)], [(3, False)]])
    errors = 0
    for _ in range(14):
        try:
            env.step(1)
        except ValueError as exc:
            assert "storage capacity of 10" in str(exc) or "longer than the storage capacity 10" in str(exc)
            errors += 1
            for e, s in enumerate(env.state):  # TagEnvs did not advance: do it as a caller catching the error would
                s[1] += 1
                if s[1] == s[0].length:
                    env.run.completed.append(s[0].id)
                    env.state[e] = env._new_episode(e)
    assert errors == 1
    eps = [int(storage.observation[s, 0]) for s, _ in storage.episodes()]
    long_id = 0
    assert long_id not in eps
    # env 1's episodes of 3 steps are all whole, and env 0's next episode (2 steps) is stored whole
    for start, T in storage.episodes():
        ids = storage.observation[(start + np.arange(T + 1)) % storage.n_slots]
        assert (ids[:, 0] == ids[0, 0]).all() and (ids[:, 1] == np.arange(T + 1)).all()
    assert sorted({T for _, T in storage.episodes()}) == [2, 3]


# ---------------------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------------------


def _episode(T=3):
    return {"observation": np.zeros((T + 1, OBS_DIM)), "action": np.zeros((T, 2)), "reward": np.zeros(T),
                "achieved_goal": np.zeros((T + 1, GOAL_DIM)), "desired_goal": DESIRED, "info": {"w": np.zeros((T, 1))}}


@pytest.mark.parametrize("key,bad,expected,got", [
    ("observation", np.zeros((4, OBS_DIM + 1)), "(4, 3)", "(4, 4)"),
    ("action", np.zeros((3, 5)), "(3, 2)", "(3, 5)"),
    ("reward", np.zeros((3, 1)), "(3,)", "(3, 1)"),
    ("achieved_goal", np.zeros((3, GOAL_DIM)), "(4, 2)", "(3, 2)"),
    ("desired_goal", np.zeros((2, GOAL_DIM)), "(4, 2)", "(2, 2)"),
])
def test_add_episode_wrong_shape_names_expected_and_given_shape(key, bad, expected, got):
    storage = make_tag_storage(20)
    ep = _episode()
    ep[key] = bad
    with pytest.raises(ValueError) as exc:
        storage.add_episode(**ep)
    msg = str(exc.value)
    assert expected in msg and got in msg
    assert len(storage) == 0


def test_add_episode_wrong_info_shape_and_missing_info_key():
    storage = make_tag_storage(20)
    ep = _episode()
    ep["info"] = {"w": np.zeros((3, 2))}
    with pytest.raises(ValueError, match=r"info\.w: expected shape \(3, 1\), got \(3, 2\)"):
        storage.add_episode(**ep)
    ep["info"] = {}
    with pytest.raises(ValueError, match=r"missing keys \['w'\]"):
        storage.add_episode(**ep)


def test_add_episode_refuses_goals_mismatch_and_too_short_episodes():
    storage = make_tag_storage(20)
    ep = _episode()
    del ep["achieved_goal"]
    with pytest.raises(ValueError, match="needs achieved_goal and desired_goal"):
        storage.add_episode(**ep)
    plain = her.EpisodeStorage(20, (OBS_DIM,), (2,))
    with pytest.raises(ValueError, match="without goal_shape"):
        plain.add_episode(**{k: v for k, v in _episode().items() if k != "info"})
    with pytest.raises(ValueError, match=r"at least 2 states .* got observation shape \(1, 3\)"):
        storage.add_episode(**_episode(0))


@pytest.mark.parametrize("key", ["observation", "action", "reward", "achieved_goal"])
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_add_episode_refuses_nan_and_inf(key, value):
    storage = make_tag_storage(20)
    ep = _episode()
    ep[key] = np.array(ep[key], np.float64)
    ep[key][1] = value
    with pytest.raises(ValueError, match=rf"{key} contains NaN or inf \(at steps \[1\]\)"):
        storage.add_episode(**ep)
    assert len(storage) == 0


def _step_arrays(n=2):
    obs = {"observation": np.zeros((n, OBS_DIM)), "achieved_goal": np.zeros((n, GOAL_DIM)),
           "desired_goal": np.zeros((n, GOAL_DIM))}
    return {"observation": obs, "action": np.zeros((n, 2)), "reward": np.zeros(n),
                "next_observation": {k: v.copy() for k, v in obs.items()}, "terminated": np.zeros(n, bool),
                "truncated": np.zeros(n, bool), "info": {"w": np.zeros((n, 1))}}


@pytest.mark.parametrize("path,bad,expected,got", [
    (("observation", "observation"), np.zeros((2, 4)), "(2, 3)", "(2, 4)"),
    (("next_observation", "observation"), np.zeros((1, 3)), "(2, 3)", "(1, 3)"),
    (("observation", "achieved_goal"), np.zeros((2, 3)), "(2, 2)", "(2, 3)"),
    (("next_observation", "achieved_goal"), np.zeros((2,)), "(2, 2)", "(2,)"),
    (("next_observation", "desired_goal"), np.zeros((2, 5)), "(2, 2)", "(2, 5)"),
    (("action",), np.zeros((2, 3)), "(2, 2)", "(2, 3)"),
    (("action",), np.zeros((4,)), "(2, 2)", "(4,)"),
    (("reward",), np.zeros((2, 1)), "(2,)", "(2, 1)"),
    (("terminated",), np.zeros(3, bool), "(2,)", "(3,)"),
    (("truncated",), np.zeros(1, bool), "(2,)", "(1,)"),
    (("info", "w"), np.zeros((2,)), "(2, 1)", "(2,)"),
])
def test_add_wrong_shape_names_expected_and_given_shape(path, bad, expected, got):
    storage = make_tag_storage(20, n_envs=2)
    writer = her.EpisodeWriter(storage)
    kw = _step_arrays()
    if len(path) == 1:
        kw[path[0]] = bad
    else:
        kw[path[0]][path[1]] = bad
    with pytest.raises(ValueError) as exc:
        writer.add(**kw)
    msg = str(exc.value)
    assert expected in msg and got in msg and path[-1].split("_")[0] in msg, msg
    assert writer.in_progress_lengths() == [0, 0]


@pytest.mark.parametrize("key, bad", [
    ("terminated", np.array([0.5, 0.0])),
    ("terminated", np.array([2, 0])),
    ("truncated", np.array(["yes", "no"])),
])
def test_add_refuses_flags_that_are_not_bools_or_0_1(key, bad):
    storage = make_tag_storage(20, n_envs=2)
    writer = her.EpisodeWriter(storage)
    kw = _step_arrays()
    kw[key] = bad
    with pytest.raises(ValueError, match=f"{key} must be a bool array \\(or 0/1 numbers\\), got"):
        writer.add(**kw)
    assert writer.in_progress_lengths() == [0, 0]
    kw[key] = np.array([1.0, 0.0])  # 0/1 numbers (e.g. SB3's float dones) are flags
    writer.add(**kw)
    assert writer.in_progress_lengths() == [0, 1]


def test_add_refuses_non_dict_observations_and_missing_info_keys():
    storage = make_tag_storage(20, n_envs=2)
    writer = her.EpisodeWriter(storage)
    kw = _step_arrays()
    kw["observation"] = np.zeros((2, OBS_DIM))
    with pytest.raises(ValueError, match="observations must be dicts"):
        writer.add(**kw)
    kw = _step_arrays()
    kw["info"] = None
    with pytest.raises(ValueError, match=r"missing keys \['w'\]"):
        writer.add(**kw)


def test_nan_reaching_the_storage_through_add_is_refused_when_the_episode_ends():
    storage = make_tag_storage(20, n_envs=1)
    writer = her.EpisodeWriter(storage)
    kw = _step_arrays(1)
    kw["next_observation"]["observation"][0, 1] = np.nan
    writer.add(**kw)
    kw = _step_arrays(1)
    kw["truncated"][:] = True
    with pytest.raises(ValueError, match=r"observation contains NaN or inf \(at steps \[1\]\)"):
        writer.add(**kw)
    assert len(storage) == 0
    assert writer.in_progress_lengths() == [0]


def test_a_refused_episode_of_one_env_does_not_corrupt_the_other_envs():
    """A NaN episode of env 0 ending in the same step as env 1 steps: env 1 keeps every step of its episode."""
    storage = make_tag_storage(40, n_envs=2)
    writer = her.EpisodeWriter(storage)
    env = TagEnvs(writer, [[(2, False)], [(4, False)]])
    env.step(1)
    ep0, ep1 = env.state[0][0], env.state[1][0]
    kw = _step_arrays()
    kw["observation"]["observation"][:] = [ep0.obs(1), ep1.obs(1)]
    kw["observation"]["achieved_goal"][:] = [ep0.ag(1), ep1.ag(1)]
    kw["next_observation"]["observation"][:] = [ep0.obs(2), ep1.obs(2)]
    kw["next_observation"]["achieved_goal"][:] = [[np.nan, 0], ep1.ag(2)]
    kw["action"][:] = [[ep0.id, 1], [ep1.id, 1]]
    kw["truncated"][:] = [True, False]
    with pytest.raises(ValueError, match="NaN"):
        writer.add(**kw)
    assert writer.in_progress_lengths() == [0, 2]  # env 1's step was staged despite env 0's error


@pytest.mark.parametrize("kw,match", [
    ({"capacity": 0}, "capacity must be a positive integer, got 0"),
    ({"max_episode_steps": 0}, "max_episode_steps must be a positive integer, got 0"),
    ({"n_envs": 0}, "n_envs must be a positive integer, got 0"),
    ({"capacity": 1.7}, "capacity must be a positive integer, got 1.7"),
    ({"capacity": float("inf")}, "capacity must be a positive integer, got inf"),
    ({"capacity": True}, "capacity must be a positive integer, got True"),
    ({"n_envs": np.True_}, "n_envs must be a positive integer, got "),
    ({"observation_shape": (-1,)}, r"observation_shape must be a tuple of non-negative ints, e.g. \(25,\), got \(-1,\)"),
    ({"observation_shape": 5}, "observation_shape must be a tuple of non-negative ints, e.g. .*, got 5"),
    ({"action_shape": (2.5,)}, "action_shape must be a tuple of non-negative ints"),
    ({"goal_shape": "3"}, "goal_shape must be a tuple of non-negative ints"),
])
def test_bad_construction_arguments(kw, match):
    args = {"capacity": 10, "observation_shape": (3,), "action_shape": (2,)} | kw
    with pytest.raises(ValueError, match=match):
        her.EpisodeStorage(**args)


def test_add_episode_terminated_must_be_a_bool_and_add_names_missing_goal_keys():
    storage = make_tag_storage(20)
    writer = her.EpisodeWriter(storage)
    ep = _episode()
    for bad in ("no", np.zeros(3, bool), None):
        with pytest.raises(TypeError, match="terminated must be a bool"):
            storage.add_episode(ep["observation"], ep["action"], ep["reward"], achieved_goal=ep["achieved_goal"],
                                desired_goal=ep["desired_goal"], info=ep["info"], terminated=bad)
    assert len(storage) == 0
    kw = _step_arrays(1)
    storage = make_tag_storage(20)
    writer = her.EpisodeWriter(storage)
    del kw["next_observation"]["achieved_goal"]
    with pytest.raises(ValueError, match=r"next_observation dict lacks the keys \['achieved_goal'\]"):
        writer.add(**kw)


def test_complex_arrays_are_refused_not_cast():
    storage = make_tag_storage(20)
    writer = her.EpisodeWriter(storage)
    ep = _episode()
    with pytest.raises(ValueError, match=r"action must be real numbers, got a complex array \(dtype complex128\)"):
        storage.add_episode(ep["observation"], ep["action"] + 1j, ep["reward"], achieved_goal=ep["achieved_goal"],
                            desired_goal=ep["desired_goal"], info=ep["info"], terminated=False)
    assert len(storage) == 0
    kw = _step_arrays(1)
    kw["reward"] = kw["reward"].astype(np.complex64)
    with pytest.raises(ValueError, match="reward must be real numbers"):
        writer.add(**kw)
    assert writer.in_progress_lengths() == [0]


# ---------------------------------------------------------------------------------------------------------
# Save / load
# ---------------------------------------------------------------------------------------------------------


@SETTINGS
@given(tag_setups())
def test_each_transition_record_holds_the_next_states_achieved_goal(setup):
    # the 1-step reward reads ag_{t+1} from record t: it must equal the compact array's row of s_{t+1}, ring wrap
    # and several envs included
    n_envs, schedules, capacity, mes, n_steps = setup
    storage = make_tag_storage(capacity, n_envs, mes)
    TagEnvs(storage, schedules).step(n_steps)
    slots = storage.transition_slots()
    np.testing.assert_array_equal(storage.data["next_achieved_goal"][slots],
                                  storage.achieved_goal[(slots + 1) % storage.n_slots])


def test_a_storage_state_of_format_0_without_the_next_achieved_goal_loads_and_samples_the_same(tmp_path):
    """Format 0 (no ``format`` entry), some saved before the records kept ``next_achieved_goal``: the one
    migration (``her.storage.migrate_storage_state``) derives it; the state loads, also from a file."""
    storage = make_tag_storage(30, n_envs=3, max_episode_steps=4)
    TagEnvs(storage, [[(3, True), (5, False)], [(7, False)], [(1, True), (2, False)]]).step(37)
    old = storage.state_dict()
    assert int(old.pop("format")) == her.storage.STORAGE_FORMAT
    del old["field.next_achieved_goal"]
    np.savez(tmp_path / "old.npz", **old)
    restored = make_tag_storage(30, n_envs=3, max_episode_steps=4)
    restored.load(str(tmp_path / "old.npz"))
    slots = storage.transition_slots()
    np.testing.assert_array_equal(restored.data[slots], storage.data[slots])
    b1 = her.HerReplayBuffer(storage, tag_reward, seed=5).sample(200)
    b2 = her.HerReplayBuffer(restored, tag_reward, seed=5).sample(200)
    for name in ("observation", "desired_goal", "reward", "next_observation", "index"):
        np.testing.assert_array_equal(getattr(b1, name), getattr(b2, name))


def test_a_storage_state_of_an_unknown_format_is_one_line_naming_it():
    storage = make_tag_storage(30, n_envs=3, max_episode_steps=4)
    state = storage.state_dict()
    state["format"] = np.asarray(7)
    with pytest.raises(ValueError, match=r"^a replay storage of format 7: this version of her reads formats 0 to 1 "):
        storage.load_state_dict(state)


def test_episodes_after_and_add_episodes_rebuild_the_storage_across_wraps():
    """The append-only episode log: the episodes added since a moment, added again to a copy of the storage of
    that moment, give the same storage (slots, eviction, counters) and the same samples."""
    src = make_tag_storage(30, n_envs=3, max_episode_steps=4)
    envs = TagEnvs(src, [[(3, True), (5, False)], [(7, False)], [(1, True), (2, False)]])
    envs.step(9)
    copy = make_tag_storage(30, n_envs=3, max_episode_steps=4)
    copy.load_state_dict(src.state_dict())
    mark = src.n_episodes_added
    envs.step(8)
    chunk = src.episodes_after(mark)
    assert chunk is not None and len(chunk["lengths"]) == src.n_episodes_added - mark > 0
    copy.add_episodes(chunk)
    for k, v in src.state_dict().items():
        np.testing.assert_array_equal(copy.state_dict()[k], v, err_msg=k)
    assert src.episodes_after(src.n_episodes_added)["lengths"].size == 0
    envs.step(60)  # more than the storage holds since mark: only a full state describes it
    assert src.episodes_after(mark) is None
    with pytest.raises(ValueError, match=r"n_added must be in \[0, "):
        src.episodes_after(src.n_episodes_added + 1)


def test_save_load_round_trip_is_exact(tmp_path):
    storage = make_tag_storage(30, n_envs=3, max_episode_steps=4)
    TagEnvs(storage, [[(3, True), (5, False)], [(7, False)], [(1, True), (2, False)]]).step(37)
    assert storage.n_episodes_added > storage.n_episodes  # wrapped
    path = tmp_path / "buffer.npz"
    storage.save(str(path))
    assert path.exists() and not list(tmp_path.glob("*.tmp"))
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask  # as open() would make it, not mkstemp's 0600
    other = make_tag_storage(30, n_envs=3, max_episode_steps=4)
    other.load(str(path))
    assert other.data.tobytes() == storage.data.tobytes()
    assert other.episodes() == storage.episodes()
    assert (len(other), other.n_live_states, other.n_episodes_added, other.oldest_slot) == (
        len(storage), storage.n_live_states, storage.n_episodes_added, storage.oldest_slot)
    b1 = her.HerReplayBuffer(storage, tag_reward, seed=7).sample(300)
    b2 = her.HerReplayBuffer(other, tag_reward, seed=7).sample(300)
    for name in ("observation", "desired_goal", "reward", "next_observation", "index", "terminated"):
        np.testing.assert_array_equal(getattr(b1, name), getattr(b2, name))


def test_load_refuses_a_storage_of_another_size(tmp_path):
    storage = make_tag_storage(30)
    add_tag_episode(storage, TagRun(), 4)
    storage.save(str(tmp_path / "a.npz"))
    with pytest.raises(ValueError, match="slots"):
        make_tag_storage(40).load(str(tmp_path / "a.npz"))
    with pytest.raises(ValueError, match="another storage layout"):
        make_tag_storage(30, info=False).load(str(tmp_path / "a.npz"))


@pytest.mark.parametrize("same_object", [True, False])
@pytest.mark.parametrize("through", ["storage", "buffer"])
def test_staged_episode_is_not_glued_onto_the_next_one_after_load(tmp_path, same_object, through):
    storage = make_tag_storage(50, n_envs=1)
    buf = her.HerReplayBuffer(storage, tag_reward, seed=0)
    env = TagEnvs(buf, [[(4, False), (6, False)]])
    env.step(4 + 3)  # one complete episode, 3 steps of the next one staged
    assert buf.in_progress_lengths() == [3]
    storage.save(str(tmp_path / "s.npz"))
    state = buf.state_dict()
    target = buf if same_object else her.HerReplayBuffer(make_tag_storage(50, n_envs=1), tag_reward, seed=0)
    if through == "storage":  # the writer notices the storage's load (storage.n_restores) at its next call
        target.storage.load(str(tmp_path / "s.npz"))
    else:
        target.load_state_dict(state)
    assert target.in_progress_lengths() == [0]
    # the env restarts: a fresh 2-step episode (id 99) is added after the load
    run = TagRun(episodes=dict(env.run.episodes), completed=list(env.run.completed))
    fresh = TagEnvs(target, [[(2, True)]], run=run)
    fresh.step(2)
    new_id = fresh.run.completed[-1]
    assert [T for _, T in target.storage.episodes()] == [4, 2]
    start, T = target.storage.episodes()[-1]
    ids = target.storage.observation[(start + np.arange(T + 1)) % target.storage.n_slots, 0]
    assert set(ids.astype(int)) == {new_id}


def test_a_writer_stages_until_a_load_and_then_drops_its_steps_at_its_next_add():
    storage = make_tag_storage(50, n_envs=1)
    env = TagEnvs(storage, [[(4, False), (6, False)]])
    env.step(4 + 3)
    state = storage.state_dict()
    storage.load_state_dict(state)
    assert storage.n_restores == 1
    env.writer.add(**_step_arrays(1))  # the 3 staged steps are dropped, this step starts a new episode
    assert env.writer.in_progress_lengths() == [1]


# ---------------------------------------------------------------------------------------------------------
# The writer is its own piece: the storage takes complete episodes only and never imports the writer
# ---------------------------------------------------------------------------------------------------------


def test_the_storage_module_does_not_import_the_writer():
    import ast
    import pathlib

    import her.storage_format

    for module in (her.storage, her.storage_format):  # the storage and the format it saves in
        tree = ast.parse(pathlib.Path(module.__file__).read_text())
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        assert not {m for m in imported if m and "writer" in m}, (module.__name__, imported)


def test_the_storage_names_where_the_step_wise_api_went():
    storage = make_tag_storage(20)
    for name in ("add", "discard_in_progress", "in_progress_lengths", "writer"):
        with pytest.raises(AttributeError, match=f"EpisodeStorage.{name} is gone.*EpisodeWriter"):
            getattr(storage, name)
    assert not hasattr(storage, "writer")
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        storage.nope  # noqa: B018


def test_writers_of_their_own_n_envs_share_one_storage():
    storage = make_tag_storage(60, n_envs=1)
    two, one = her.EpisodeWriter(storage, n_envs=2), her.EpisodeWriter(storage)
    assert (two.n_envs, one.n_envs) == (2, 1)
    a, b = TagEnvs(two, [[(3, False)], [(5, True)]]), TagEnvs(one, [[(2, True)]])
    b.run = a.run  # one id space
    a.step(5)
    b.step(2)
    assert sorted(T for _, T in storage.episodes()) == [2, 3, 5]
    with pytest.raises(ValueError, match="n_envs must be a positive integer"):
        her.EpisodeWriter(storage, n_envs=0)
    with pytest.raises(TypeError, match="storage must be an her.EpisodeStorage"):
        her.EpisodeWriter([])
    with pytest.raises(IndexError, match=r"env must be in \[0, 2\)"):
        two.discard_in_progress(2)


def test_buffer_add_discard_and_in_progress_go_through_its_writer():
    storage = make_tag_storage(40, n_envs=2)
    buf = her.HerReplayBuffer(storage, tag_reward, seed=0)
    env = TagEnvs(buf, [[(4, False)], [(6, False)]])
    assert env.writer is buf.writer and buf.writer.storage is storage
    env.step(3)
    assert buf.in_progress_lengths() == [3, 3]
    buf.discard_in_progress(1)
    assert buf.in_progress_lengths() == [3, 0]
    buf.discard_in_progress()
    assert buf.in_progress_lengths() == [0, 0]


def test_import_her_does_not_import_torch_gymnasium_or_wandb():
    code = textwrap.dedent("""
        import sys
        import her
        bad = [m for m in ("torch", "gymnasium", "wandb", "scipy") if m in sys.modules]
        print("BAD", bad)
        assert not bad, bad
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_storage_from_env_reads_spaces_without_gymnasium():
    class Box:
        def __init__(self, shape):
            self.shape = shape

    class Dict:
        def __init__(self, **spaces):
            self.spaces = spaces

    class Spec:
        max_episode_steps = 17

    class Env:
        observation_space = Dict(observation=Box((5,)), achieved_goal=Box((2,)), desired_goal=Box((2,)))
        action_space = Box((3,))
        spec = Spec()

    s = her.storage_from_env(Env(), 100, info_shapes=INFO_SHAPES)
    assert (s.observation_shape, s.action_shape, s.goal_shape, s.max_episode_steps) == ((5,), (3,), (2,), 17)
    Env.observation_space = Dict(observation=Box((5,)), achieved_goal=Box((2,)))
    with pytest.raises(ValueError, match="needs keys"):
        her.storage_from_env(Env(), 100)


def test_state_dict_is_a_snapshot_that_later_adds_do_not_change():
    storage = make_tag_storage(20, max_episode_steps=4)
    run = TagRun()
    for _ in range(3):
        add_tag_episode(storage, run, 4)
    snapshot = TagRun(episodes=dict(run.episodes), completed=list(run.completed))
    state = storage.state_dict()
    before = storage.data.tobytes()
    for _ in range(3):  # the ring wraps: the snapshot's slots are overwritten
        add_tag_episode(storage, run, 3)
    storage.load_state_dict(state)
    assert storage.data.tobytes() == before
    live = reference_live(snapshot, storage.n_slots)
    assert [T for _, T in storage.episodes()] == [4, 4, 4]
    check_batch(her.HerReplayBuffer(storage, tag_reward, seed=0).sample(500), snapshot, live, strategy="future")


def test_add_episode_with_as_many_states_as_actions_says_t_plus_1_states():
    storage = her.EpisodeStorage(100, observation_shape=(2,), action_shape=(2,), goal_shape=(2,),
                                 max_episode_steps=20)
    states = np.zeros((20, 2))  # s_0..s_19: one short for 20 actions
    with pytest.raises(ValueError) as exc:
        storage.add_episode(states, np.zeros((20, 2)), np.zeros(20), achieved_goal=states, desired_goal=np.ones(2))
    assert str(exc.value) == ("action: expected shape (19, 2), got (20, 2) (T = 19 transitions, from the 20 states of "
                              "observation: an episode of T transitions has T + 1 states s_0..s_T)")
    assert len(storage) == 0


def test_save_refuses_a_path_that_is_not_a_regular_file(tmp_path):
    # os.replace onto a device or FIFO (e.g. /dev/full as root) would replace it with a plain file
    storage = her.EpisodeStorage(20, observation_shape=(2,), action_shape=(1,), goal_shape=(1,), max_episode_steps=5)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match=r"^cannot save to .*pipe: expected a regular file path .* got a FIFO"):
        storage.save(str(fifo))
    assert os.path.exists(fifo) and not os.path.isfile(fifo)
    with pytest.raises(IsADirectoryError):
        storage.save(str(tmp_path))
    assert os.path.isdir(tmp_path) and sorted(os.listdir(tmp_path)) == ["pipe"]  # no temp file left


@pytest.mark.parametrize("state, error, message", [
    (5, TypeError, "state must be the mapping HerReplayBuffer.state_dict() returns, got int"),
    ({"x": 1}, ValueError, "state lacks the keys ['storage', 'sampler', 'rng'] of HerReplayBuffer.state_dict()"),
])
def test_buffer_load_state_dict_of_something_else_names_what_it_expects(state, error, message):
    storage = her.EpisodeStorage(20, observation_shape=(2,), action_shape=(1,), goal_shape=(1,), max_episode_steps=5)
    buffer = her.HerReplayBuffer(storage, lambda ag, dg, info: np.zeros(len(ag), np.float32))
    with pytest.raises(error) as info:
        buffer.load_state_dict(state)
    assert message in str(info.value), str(info.value)
