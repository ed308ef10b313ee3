"""Behaviour goals (MEGA, Pitis et al. 2020): the chooser in `her` (density ranking, value cutoff and its
adaptation, state), the env wrapper that pursues a chosen goal, the agents' value, and the training loop's use."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch

import her
from her_agents.run.checkpoint import read_replay
from her_agents.algos.registry import make_agent
from her_agents.config import load_config
from her_agents.loop.train import train
from her_agents.run.checkpoint import load_checkpoint
from her_envs import BehaviourGoal, make_env, make_vector_env


def storage_with(achieved: np.ndarray, T: int = 4) -> her.EpisodeStorage:
    """A goal storage whose episodes' states have the achieved goals ``achieved [E, T + 1, 3]``."""
    storage = her.EpisodeStorage(10_000, (2,), (1,), (3,), max_episode_steps=T)
    for ag in achieved:
        storage.add_episode(np.zeros((T + 1, 2)), np.zeros((T, 1)), np.zeros(T), achieved_goal=ag, desired_goal=ag[-1])
    return storage


def clustered(rng: np.random.Generator, outlier=(2.0, 2.0, 2.0), episodes: int = 200, T: int = 4) -> np.ndarray:
    ag = rng.normal(0.0, 0.01, (episodes, T + 1, 3))
    ag[0, 0] = outlier  # one state far from all others (a transition's state: step 0 of episode 0)
    return ag


def test_the_rarest_achieved_goal_is_chosen_without_a_value():
    rng = np.random.default_rng(0)
    storage = storage_with(clustered(rng))
    goals = her.MinDensityGoals(n_candidates=2000, n_fit=500)
    chosen = goals.select(storage, np.zeros((3, 2)), rng)
    assert chosen.shape == (3, 3) and chosen.dtype == np.float32
    np.testing.assert_allclose(chosen, np.full((3, 3), 2.0))  # 2000 draws of 800 states: the outlier is among them


def test_the_cutoff_drops_goals_valued_below_it_and_falls_back_to_the_highest_value():
    rng = np.random.default_rng(1)
    storage = storage_with(clustered(rng))
    goals = her.MinDensityGoals(n_candidates=2000, n_fit=500, initial_cutoff=-3.0)

    def far_is_unreachable(obs, g):  # the outlier is valued -10, everything else -1
        assert obs.shape == (g.shape[0], 2)
        return np.where(np.linalg.norm(g, axis=1) > 1.0, -10.0, -1.0)

    chosen = goals.select(storage, np.zeros((2, 2)), rng, far_is_unreachable)
    assert np.all(np.linalg.norm(chosen, axis=1) < 1.0)  # the outlier is below the cutoff
    # no candidate clears the cutoff: the one of highest value (the one nearest the origin here)
    chosen = goals.select(storage, np.zeros((1, 2)), rng, lambda obs, g: -100.0 - np.linalg.norm(g, axis=1))
    pool = storage.achieved_goal[np.flatnonzero(storage.sampleable)]
    assert np.linalg.norm(chosen[0]) <= np.quantile(np.linalg.norm(pool, axis=1), 0.01)


def test_with_a_desired_support_the_rarest_goal_the_env_would_ask_for_comes_first():
    rng = np.random.default_rng(2)
    ag = clustered(rng, outlier=(2.0, 2.0, 2.0)) * 0.01  # a tight cluster: a rare state is rare even in the fit
    ag[0, 0] = (2.0, 2.0, 2.0)
    ag[1, 0] = (0.0, 0.0, 0.5)  # a second rare state, inside the desired goals' support
    storage = storage_with(ag)
    desired = np.concatenate([rng.normal(0.0, 0.01, (500, 3)), rng.uniform((-0.02, -0.02, 0.0), (0.02, 0.02, 0.6),
                                                                           (500, 3))])
    plain = her.MinDensityGoals(n_candidates=2000, n_fit=500)
    supported = her.MinDensityGoals(n_candidates=2000, n_fit=500, desired_support=1.0, n_desired=800)
    for goals in (plain, supported):
        goals.observe_desired(desired[:300])
        goals.observe_desired(desired[300:])
    assert supported.state_dict()["desired"].shape == (800, 3)  # the most recent n_desired
    np.testing.assert_allclose(plain.select(storage, np.zeros((1, 2)), rng)[0], (2.0, 2.0, 2.0))
    np.testing.assert_allclose(supported.select(storage, np.zeros((1, 2)), rng)[0], (0.0, 0.0, 0.5))
    # a support with nothing viable inside: the viable candidates outside it are chosen from
    only_far = supported.select(storage, np.zeros((1, 2)), rng, lambda o, g: np.where(g[:, 0] > 1.0, 0.0, -100.0))
    np.testing.assert_allclose(only_far[0], (2.0, 2.0, 2.0))


def test_the_cutoff_adapts_to_the_behaviour_goals_success_within_its_bounds():
    goals = her.MinDensityGoals(initial_cutoff=-3.0, min_cutoff=-5.0, window=10)
    goals.record(np.ones(10, bool))  # 100% success: reach further
    assert goals.cutoff == -4.0
    goals.record(np.ones(9, bool))
    assert goals.cutoff == -4.0  # a window is not full yet
    goals.record(np.ones(21, bool))
    assert goals.cutoff == -5.0  # clipped at min_cutoff
    goals.record(np.zeros(50, bool))
    assert goals.cutoff == -3.0  # back up, clipped at initial_cutoff
    goals.record(np.array([True] * 5 + [False] * 5))  # 50%: within the band, unchanged
    assert goals.cutoff == -3.0
    goals.observe_desired(np.ones((4, 3)))
    state = goals.state_dict()
    other = her.MinDensityGoals(initial_cutoff=-3.0, min_cutoff=-5.0, window=10)
    other.load_state_dict(state)
    assert other.cutoff == goals.cutoff and other.state_dict()["outcomes"] == state["outcomes"]
    np.testing.assert_array_equal(other.state_dict()["desired"], np.ones((4, 3)))
    assert her.MinDensityGoals.min_cutoff_for(0.98, 50) == pytest.approx(-(1 - 0.98 ** 40) / 0.02)
    assert her.MinDensityGoals.min_cutoff_for(1.0, 50) == -40.0


def test_an_empty_storage_gives_no_goal_and_bad_inputs_are_one_line():
    rng = np.random.default_rng(0)
    empty = her.EpisodeStorage(100, (2,), (1,), (3,), max_episode_steps=4)
    assert her.MinDensityGoals().select(empty, np.zeros((1, 2)), rng) is None
    storage = storage_with(clustered(rng, episodes=5))
    goals = her.MinDensityGoals(n_candidates=8, n_fit=8)
    with pytest.raises(ValueError, match=r"observation must be \[N, \*\(2,\)\], got shape \(1, 3\)"):
        goals.select(storage, np.zeros((1, 3)), rng)
    with pytest.raises(ValueError, match="value_fn must return 16 finite values, got shape \\(8,\\)"):
        goals.select(storage, np.zeros((2, 2)), rng, lambda o, g: np.zeros(8))
    with pytest.raises(ValueError, match="with NaN or inf"):
        goals.select(storage, np.zeros((1, 2)), rng, lambda o, g: np.full(8, np.nan))
    with pytest.raises(ValueError, match="needs a goal storage"):
        goals.select(her.EpisodeStorage(100, (2,), (1,), None, max_episode_steps=4), np.zeros((1, 2)), rng)
    with pytest.raises(TypeError, match="storage must be an her.EpisodeStorage"):
        goals.select("storage", np.zeros((1, 2)), rng)


@pytest.mark.parametrize("kwargs, match", [
    ({"n_candidates": 0}, "n_candidates must be an int >= 1"), ({"n_fit": 1.5}, "n_fit must be an int >= 1"),
    ({"bandwidth": 0.0}, "bandwidth must be a finite number > 0"), ({"initial_cutoff": np.inf}, "initial_cutoff"),
    ({"min_cutoff": 0.0}, "min_cutoff must be a finite number <= initial_cutoff"), ({"window": True}, "window"),
    ({"success_band": (0.7, 0.3)}, r"success_band\[1\] must be a number in \[0.7, 1\]"),
    ({"success_band": 0.5}, "success_band must be"), ({"desired_support": -1.0}, "desired_support must be"),
    ({"n_desired": 0}, "n_desired must be an int >= 1"),
])
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        her.MinDensityGoals(**kwargs)


def test_the_wrapped_env_pursues_the_goal_set_after_reset():
    env = BehaviourGoal(make_env("FetchReach-v4"))
    obs, _ = env.reset(seed=0)
    goal = obs["achieved_goal"] + np.array([0.0, 0.0, 0.001])  # within the 5 cm threshold of where the gripper is
    env.behaviour_goal = goal
    np.testing.assert_allclose(env.behaviour_goal, goal)
    obs, reward, *_, info = env.step(np.zeros(4, np.float32))
    np.testing.assert_allclose(obs["desired_goal"], goal)
    assert reward == 0.0 and info["is_success"] == 1.0
    env.behaviour_goal = None  # changes nothing
    np.testing.assert_allclose(env.behaviour_goal, goal)
    with pytest.raises(ValueError, match=r"behaviour_goal must have the env's goal shape \(3,\), got \(2,\)"):
        env.behaviour_goal = np.zeros(2)
    env.close()
    venv = make_vector_env("FetchReach-v4", 2, seed=0, behaviour_goals=True)
    venv.set_attr("behaviour_goal", [None, np.array([1.0, 0.5, 0.4])])
    np.testing.assert_allclose(venv.get_attr("behaviour_goal")[1], [1.0, 0.5, 0.4])
    venv.close()


@pytest.mark.parametrize("algo", ["ddpg", "td3", "sac", "tqc"])
def test_the_agents_value_is_the_critic_at_the_deterministic_action(algo):
    agent = make_agent(algo, 5, 3, 2, seed=0, device="cpu")
    obs, goal = np.random.default_rng(0).normal(size=(7, 5)), np.zeros((7, 3))
    v = agent.value(obs, goal)
    assert v.shape == (7,) and v.dtype == np.float32 and np.isfinite(v).all()
    if algo in ("ddpg", "td3"):
        state = agent.preprocess(torch.as_tensor(obs, dtype=torch.float32), torch.as_tensor(goal, dtype=torch.float32))
        with torch.no_grad():
            q = agent.critic(state, agent.actor(state), member=0)[0]  # Q_1 (DDPG: its one critic)
        np.testing.assert_allclose(v, q.numpy(), rtol=1e-5, atol=1e-6)


def _small_cfg(run_dir: Path, *extra: str):
    return load_config("fetch_pick_and_place_sac", [
        "train.total_env_steps=400", "train.warmup_steps=100", "train.learning_starts=100", "train.eval_every=200",
        "train.eval_episodes=2", "env.eval_envs=2", "env.n_envs=2", f"log.run_dir={run_dir}", "log.progress=false",
        "log.wandb.mode=disabled", "replay.capacity=2000", "agent.compile=false", "env.grasped_start=0",
        "log.save_replay=true", *extra])


def test_training_episodes_pursue_stored_achieved_goals_and_the_chooser_is_checkpointed(tmp_path):
    train(_small_cfg(tmp_path / "run", "env.behaviour_goals=1.0", "env.behaviour_goal_support=0.2"))
    z = read_replay(tmp_path / "run")  # the storage as saved: base and episode log
    n = int(z["storage/scalars"][2])
    step = z["storage/field.step"][:n]
    desired = z["storage/field.desired_goal"][:n][step == 0]
    achieved = z["storage/field.achieved_goal"][:n]
    # the first two episodes (one per env) began with an empty replay: the env's goals; every later one pursues
    # an achieved goal already stored
    assert len(desired) == 8
    later = desired[2:]
    assert all(np.any(np.all(achieved == g, axis=1)) for g in later)
    saved = load_checkpoint(tmp_path / "run" / "checkpoint.pt")["behaviour_goals"]  # the chooser's state
    assert saved["cutoff"] <= -3.0 and len(saved["outcomes"]) <= 10
    assert saved["desired"].shape == (10, 3)  # the env's goals of the 8 stored episodes and the 2 begun at the end
    with open(tmp_path / "run" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert float(rows[-1]["explore/goal_cutoff"]) == saved["cutoff"]
    # a resume restores it and goes on
    result = train(_small_cfg(tmp_path / "run", "env.behaviour_goals=1.0", "env.behaviour_goal_support=0.2",
                              "train.total_env_steps=600"),
                   resume=str(tmp_path / "run"))
    assert result.env_steps == 600


@pytest.mark.parametrize("overrides, match", [
    (["env.behaviour_goals=1.5"], "env.behaviour_goals must be"),
    (["env.behaviour_goal_support=-0.1"], "env.behaviour_goal_support must be"),
    (["env.behaviour_goals=0.5", "dist.mode=actor_learner"], "env.behaviour_goals must be 0 with dist.mode=actor_learner"),
])
def test_bad_behaviour_goal_settings_are_one_line(overrides, match):
    with pytest.raises(ValueError, match=match):
        load_config("fetch_pick_and_place_sac", overrides)

