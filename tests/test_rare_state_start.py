"""Rare-state starts (Go-Explore's return-then-explore on achieved-goal cells inside the desired-goal support):
the archive, the restore, the choice of cell, the settings, and the training loop's use."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

from her_agents.run.checkpoint import read_replay
from her_agents.config import load_config
from her_agents.loop.train import train
from her_agents.run.checkpoint import load_checkpoint
from her_envs import RareStateStart, make_env, make_vector_env


def _walk(env, episodes: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(episodes):
        env.reset()
        for _ in range(env.spec.max_episode_steps):
            env.step(rng.uniform(-1, 1, 4).astype(np.float32))


def test_a_restart_restores_an_archived_state_and_keeps_the_episodes_goal():
    env = RareStateStart(make_env("FetchPickAndPlace-v4"), probability=0.0, cell_size=0.1, states_per_cell=1)
    env.reset(seed=0)
    _walk(env, 10)
    u = env.unwrapped
    assert [c for c in env.support if c in env.states], "the box starts in cells desired goals fall in"
    env.probability = 1.0
    for _ in range(20):  # a start inside the only such cell restarts nothing: reset again
        obs, _ = env.reset()
        if env.restarts:
            break
    assert env.restarts == 1
    np.testing.assert_array_equal(obs["desired_goal"], u.goal)
    assert env._cell(obs["achieved_goal"]) in env.support
    # the observation is the archived state's: replaying that state gives the same observation
    kept = env.states[env._cell(obs["achieved_goal"])]
    assert len(kept) == 1
    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    now = np.empty(mujoco.mj_stateSize(u.model, spec))
    mujoco.mj_getState(u.model, u.data, now, spec)
    np.testing.assert_array_equal(now, kept[0])
    env.close()


def test_rarely_visited_support_cells_are_chosen_more_often_and_cells_outside_it_never():
    env = RareStateStart(make_env("FetchPickAndPlace-v4"), probability=1.0)
    env.reset(seed=1)
    u = env.unwrapped
    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    state = np.empty(mujoco.mj_stateSize(u.model, spec))
    mujoco.mj_getState(u.model, u.data, state, spec)
    # three hand-made cells: visited 3 times, 10,000 times, and a rare one no desired goal fell in
    rare, common, outside = (100, 100, 100), (101, 100, 100), (102, 100, 100)
    env.visits, env.states, env.support = {rare: 3, common: 10_000, outside: 1}, {}, {rare, common}
    for cell in (rare, common, outside):
        s = state.copy()
        s[1 + u.model.jnt_qposadr[mujoco.mj_name2id(u.model, mujoco.mjtObj.mjOBJ_JOINT, "object0:joint")]] = cell[0]
        env.states[cell] = [s]
    picks = {"rare": 0, "common": 0}
    for _ in range(200):
        env.support |= {rare, common}
        env.visits[rare], env.visits[common] = 3, 10_000  # as they were: the restarts' own visits undone
        x = env.reset()[0]["achieved_goal"][0]
        assert x in (100.0, 101.0), "only support cells are restart cells"
        picks["rare" if x == 100.0 else "common"] += 1
    # weights 1/sqrt(4) against 1/sqrt(10001): the rare cell in about 98% of the draws
    assert 180 <= picks["rare"] < 200, picks
    env.close()


def test_probability_zero_is_the_plain_env_and_one_half_repeats_with_the_seed():
    plain, never = make_env("FetchPickAndPlace-v4"), RareStateStart(make_env("FetchPickAndPlace-v4"), 0.0)
    rng = np.random.default_rng(0)
    for first in (True, False, False):
        kwargs = {"seed": 5} if first else {}
        for a, b in zip(plain.reset(**kwargs)[0].values(), never.reset(**kwargs)[0].values(), strict=True):
            np.testing.assert_array_equal(a, b)
        for _ in range(50):  # the archive's reservoir draws do not touch the env's RNG stream
            action = rng.uniform(-1, 1, 4).astype(np.float32)
            np.testing.assert_array_equal(plain.step(action)[0]["observation"], never.step(action)[0]["observation"])

    def starts(seed):
        env = RareStateStart(make_env("FetchPickAndPlace-v4"), 0.5)
        env.reset(seed=seed)
        _walk(env, 12, seed)
        out = [env.reset()[0]["achieved_goal"].tolist() for _ in range(10)]
        env.close()
        return out, env.restarts

    first, restarts = starts(7)
    assert (first, restarts) == starts(7)
    assert 0 < restarts < 22
    plain.close()
    never.close()


@pytest.mark.parametrize("kwargs, match", [
    ({"probability": 1.5}, "rare state start probability must be in \\[0, 1\\], got 1.5"),
    ({"cell_size": 0.0}, "rare state start cell_size must be > 0, got 0.0"),
    ({"states_per_cell": 0}, "rare state start states_per_cell must be an int >= 1, got 0"),
])
def test_bad_wrapper_settings_are_one_line(kwargs, match):
    env = make_env("FetchPickAndPlace-v4")
    with pytest.raises(ValueError, match=match):
        RareStateStart(env, **kwargs)
    env.close()


def _push_cfg(run_dir, *extra):
    return load_config("fetch_push_sac", [  # Push: every desired goal on the table, where the box is
        "train.total_env_steps=400", "train.warmup_steps=100", "train.learning_starts=100", "train.eval_every=200",
        "train.eval_episodes=2", "env.eval_envs=2", "env.n_envs=2", f"log.run_dir={run_dir}",
        "log.progress=false", "log.wandb.mode=disabled", "replay.capacity=2000", "agent.compile=false",
        "env.rare_state_start=1.0", "env.rare_state_cell=0.15", "log.save_replay=true", *extra])


def test_the_training_loop_starts_episodes_from_archived_states_and_checkpoints_the_archive(tmp_path):
    venv = make_vector_env("FetchPickAndPlace-v4", 2, seed=0, rare_state_start=1.0)
    assert venv.get_attr("restarts") == (0, 0)
    venv.close()
    assert train(_push_cfg(tmp_path / "run")).env_steps == 400
    z = read_replay(tmp_path / "run")  # the storage as saved: base and episode log
    n = int(z["storage/scalars"][2])
    step = z["storage/field.step"][:n]
    achieved = z["storage/field.achieved_goal"][:n]
    starts = np.flatnonzero(step == 0)
    # episodes after the first two (one per env) began where an earlier one had been: their first achieved goal
    # is one stored before, which a fresh start (the box placed at random) almost surely is not
    again = [np.any(np.all(achieved[:i] == achieved[i], axis=1)) for i in starts[2:]]
    assert len(again) == 6 and sum(again) >= 3, again
    # the archives are checkpointed, and a resume goes on from them instead of building them anew
    before = load_checkpoint(tmp_path / "run" / "checkpoint.pt")["envs"]["train_archive"]
    assert len(before) == 2 and sum(a["restarts"] for a in before) >= 3
    assert train(_push_cfg(tmp_path / "run", "train.total_env_steps=600"), resume=str(tmp_path / "run")).env_steps == 600
    after = load_checkpoint(tmp_path / "run" / "checkpoint.pt")["envs"]["train_archive"]
    for old, new in zip(before, after, strict=True):
        assert new["visits"].sum() >= old["visits"].sum() + 100  # 100 more steps per env on top of the old counts
        assert new["restarts"] > old["restarts"]


def test_the_archive_round_trips_and_a_wrong_one_is_one_line():
    env = RareStateStart(make_env("FetchPickAndPlace-v4"), probability=0.5)
    env.reset(seed=2)
    _walk(env, 4)
    archive = env.rare_state_archive
    other = RareStateStart(make_env("FetchPickAndPlace-v4"), probability=0.5)
    other.rare_state_archive = archive
    again = other.rare_state_archive
    for key in ("cells", "visits", "kept", "states", "support"):
        np.testing.assert_array_equal(again[key], archive[key])
    assert again["restarts"] == archive["restarts"] and again["rng"] == archive["rng"]
    with pytest.raises(ValueError, match="rare_state_archive states must have shape"):
        other.rare_state_archive = {**archive, "states": archive["states"][..., :10]}
    env.close()
    other.close()


@pytest.mark.parametrize("overrides, match", [
    (["env.rare_state_start=2"], "env.rare_state_start must be"),
    (["env.rare_state_cell=0"], "env.rare_state_cell must be"),
])
def test_bad_rare_state_settings_are_one_line(overrides, match):
    with pytest.raises(ValueError, match=match):
        load_config("fetch_pick_and_place_sac", overrides)

