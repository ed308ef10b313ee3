"""Correctness on goal envs that are not Fetch: envs that reuse their observation arrays, action boxes other than
[-1, 1], info entries of any shape, episodes of different lengths, rewards other than -1/0, and the SB3 adapter
with VecNormalize, image goals and SubprocVecEnv. Each fault has its own small test env below."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest
import torch

import her
from her_agents.algos.base import q_clip_for_env, td_target_bounds
from her_agents.config import load_config
from her_agents.distributed.actor_learner import _episode
from her_agents.loop.collect import choose_action, collect_step
from her_agents.loop.train import build_replay, evaluate
from her_envs import (
    check_rewards,
    from_env_action,
    goal_env_spec,
    make_env,
    make_vector_env,
    step_info,
    to_env_action,
)

# ---------------------------------------------------------------------------------------------------------
# Test envs
# ---------------------------------------------------------------------------------------------------------


def _box(n, low=-10.0, high=10.0):
    return gym.spaces.Box(low, high, (n,), np.float32)


def sparse_reward(achieved_goal, desired_goal, info=None):
    """-1 / 0 within 0.05, vectorized."""
    return -(np.linalg.norm(np.asarray(achieved_goal) - np.asarray(desired_goal), axis=-1) > 0.05).astype(np.float32)


class ReusedArrayGoalEnv(gym.Env):
    """Returns the same observation arrays at every reset and step and mutates them in place. The achieved goal
    of step k of this instance's episode e is (e, k); the desired goal (-1, -1) is never reached."""

    def __init__(self):
        self.observation_space = gym.spaces.Dict({"observation": _box(3, -100, 100),
                                                  "achieved_goal": _box(2, -100, 100),
                                                  "desired_goal": _box(2, -100, 100)})
        self.action_space = _box(1, -1.0, 1.0)
        self._obs = {k: np.zeros(s.shape, np.float32) for k, s in self.observation_space.spaces.items()}
        self.episode, self.k = -1, 0

    def _write(self):
        self._obs["observation"][:] = (self.episode, self.k, 0.0)
        self._obs["achieved_goal"][:] = (self.episode, self.k)
        self._obs["desired_goal"][:] = (-1.0, -1.0)
        return self._obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.k = self.episode + 1, 0
        return self._write(), {}

    def step(self, action):
        self.k += 1
        obs = self._write()
        return obs, float(sparse_reward(obs["achieved_goal"], obs["desired_goal"])), False, False, {}

    def compute_reward(self, achieved_goal, desired_goal, info):
        return sparse_reward(achieved_goal, desired_goal)


BOX_ENVS: list[BoxActionGoalEnv] = []  # every instance, to read the actions each one received


class BoxActionGoalEnv(gym.Env):
    """Actions in Box(0, 4); the achieved goal is the last action received, the desired goal uniform in [0, 4]."""

    def __init__(self):
        self.observation_space = gym.spaces.Dict({"observation": _box(1), "achieved_goal": _box(1),
                                                  "desired_goal": _box(1)})
        self.action_space = gym.spaces.Box(0.0, 4.0, (1,), np.float32)
        self.received: list[float] = []
        self.ag, self.goal = np.zeros(1, np.float32), np.zeros(1, np.float32)
        BOX_ENVS.append(self)

    def _obs(self):
        return {"observation": self.ag.copy(), "achieved_goal": self.ag.copy(), "desired_goal": self.goal.copy()}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.ag = np.zeros(1, np.float32)
        self.goal = self.np_random.uniform(0, 4, 1).astype(np.float32)
        return self._obs(), {}

    def step(self, action):
        a = np.asarray(action, np.float32).reshape(1)
        self.received.append(float(a[0]))
        self.ag = a.copy()
        ok = bool(abs(a[0] - self.goal[0]) <= 0.05)
        return self._obs(), -float(not ok), False, False, {"is_success": float(ok)}

    def compute_reward(self, achieved_goal, desired_goal, info):
        return sparse_reward(achieved_goal, desired_goal)


class UnboundedActionGoalEnv(BoxActionGoalEnv):
    def __init__(self):
        super().__init__()
        self.action_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)


class BonusInfoGoalEnv(gym.Env):
    """A 2-D point; the step info holds ``bonus`` of shape (2,) (the reset info does not), and the reward is
    ``-(|ag - g| > 0.05) - 0.25 * info["bonus"][..., 0]``: -0.25 at the goal, -1.25 elsewhere."""

    BONUS = np.array([1.0, 0.5], np.float32)

    def __init__(self):
        self.observation_space = gym.spaces.Dict({"observation": _box(2), "achieved_goal": _box(2),
                                                  "desired_goal": _box(2)})
        self.action_space = _box(2, -1.0, 1.0)
        self.pos, self.goal = np.zeros(2, np.float32), np.zeros(2, np.float32)

    def _obs(self):
        return {"observation": self.pos.copy(), "achieved_goal": self.pos.copy(), "desired_goal": self.goal.copy()}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = np.zeros(2, np.float32)
        self.goal = self.np_random.uniform(-0.5, 0.5, 2).astype(np.float32)
        return self._obs(), {}

    def step(self, action):
        self.pos = (self.pos + 0.2 * np.asarray(action, np.float32)).astype(np.float32)
        info = {"bonus": self.BONUS.copy()}
        reward = float(self.compute_reward(self.pos, self.goal, info))
        return self._obs(), reward, False, False, info

    def compute_reward(self, achieved_goal, desired_goal, info):
        bonus = np.asarray(info["bonus"], np.float32)  # info=None raises: the reward needs the info entry
        far = np.linalg.norm(np.asarray(achieved_goal) - np.asarray(desired_goal), axis=-1) > 0.05
        return -far.astype(np.float32) - 0.25 * bonus[..., 0]


class CoinGoalEnv(gym.Env):
    """A coin at reset decides the episode: heads, a 1-step success (terminated); tails, a 20-step failure
    (truncated by the time limit). The true success rate is 0.5 whatever the policy does."""

    def __init__(self):
        self.observation_space = gym.spaces.Dict({"observation": _box(1), "achieved_goal": _box(1),
                                                  "desired_goal": _box(1)})
        self.action_space = _box(1, -1.0, 1.0)
        self.heads = False

    def _obs(self, ag):
        a = np.array([ag], np.float32)
        return {"observation": a.copy(), "achieved_goal": a, "desired_goal": np.ones(1, np.float32)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.heads = bool(self.np_random.random() < 0.5)
        return self._obs(0.0), {}

    def step(self, action):
        obs = self._obs(1.0 if self.heads else 0.0)
        return obs, -float(not self.heads), self.heads, False, {"is_success": float(self.heads)}

    def compute_reward(self, achieved_goal, desired_goal, info):
        return sparse_reward(achieved_goal, desired_goal)


class ZeroOneGoalEnv(BonusInfoGoalEnv):
    """A maze-style reward: 1 at the goal, 0 elsewhere."""

    def step(self, action):
        self.pos = (self.pos + 0.2 * np.asarray(action, np.float32)).astype(np.float32)
        return self._obs(), float(self.compute_reward(self.pos, self.goal, None)), False, False, {}

    def compute_reward(self, achieved_goal, desired_goal, info):
        return (np.linalg.norm(np.asarray(achieved_goal) - np.asarray(desired_goal), axis=-1) <= 0.05).astype(
            np.float32)


class DenseGoalEnv(ZeroOneGoalEnv):
    def compute_reward(self, achieved_goal, desired_goal, info):
        return -np.linalg.norm(np.asarray(achieved_goal) - np.asarray(desired_goal), axis=-1).astype(np.float32)


class DeclaredRangeGoalEnv(DenseGoalEnv):
    reward_range = (-3.0, 0.0)


class ShiftedRewardGoalEnv(ZeroOneGoalEnv):
    """compute_reward is 0/1 (what the probe sees), but the env's own step reward is 2 (a wrong reward_range)."""

    def step(self, action):
        obs, _, terminated, truncated, info = super().step(action)
        return obs, 2.0, terminated, truncated, info


ENVS = {
    "TestReusedArrayGoal-v0": (ReusedArrayGoalEnv, 3),
    "TestBoxActionGoal-v0": (BoxActionGoalEnv, 10),
    "TestUnboundedActionGoal-v0": (UnboundedActionGoalEnv, 10),
    "TestBonusInfoGoal-v0": (BonusInfoGoalEnv, 5),
    "TestCoinGoal-v0": (CoinGoalEnv, 20),
    "TestZeroOneGoal-v0": (ZeroOneGoalEnv, 5),
    "TestDenseGoal-v0": (DenseGoalEnv, 5),
    "TestDeclaredRangeGoal-v0": (DeclaredRangeGoalEnv, 5),
    "TestShiftedRewardGoal-v0": (ShiftedRewardGoalEnv, 5),
}
for _id, (_cls, _steps) in ENVS.items():
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=_cls, max_episode_steps=_steps)


def _cfg(env_id, tmp_path, *overrides):
    """A tiny training run: 200 env steps, small networks, no W&B, no progress bar."""
    return load_config(None, [
        f"env.id={env_id}", "env.eval_envs=2", "algo=ddpg", "train.total_env_steps=200", "train.warmup_steps=100",
        "train.learning_starts=100", "train.eval_every=200", "train.eval_episodes=2", "train.batch_size=32",
        "train.device=cpu", "agent.hidden=[16,16]", f"log.run_dir={tmp_path / 'run'}", "log.progress=false",
        "log.wandb.mode=disabled", "replay.capacity=1000", *overrides])


@pytest.fixture
def captured(monkeypatch):
    """Run ``her_agents.loop.train.train`` and keep the replay and agent it built."""
    import her_agents.loop.start as start_mod

    monkeypatch.setenv("WANDB_MODE", "disabled")
    out = {}

    def keep(name, fn):
        def wrapper(*args, **kwargs):
            out[name] = fn(*args, **kwargs)
            return out[name]

        monkeypatch.setattr(start_mod, name, wrapper)

    keep("build_replay", start_mod.build_replay)
    keep("make_agent", start_mod.make_agent)
    return out


# ---------------------------------------------------------------------------------------------------------
# 1. Observations are copied on receipt
# ---------------------------------------------------------------------------------------------------------


# the reused-array env is the very fault gymnasium's checker warns about
reuses_arrays = pytest.mark.filterwarnings("ignore:.*share an object:UserWarning")


def _assert_tag_episodes(storage, episodes):
    """Each stored episode's states are (e, 0..T) of one episode e: none holds the next episode's start."""
    assert episodes
    for start, T in episodes:
        ag = storage.achieved_goal[(start + np.arange(T + 1)) % storage.n_slots]
        assert (ag[:, 0] == ag[0, 0]).all(), ag
        np.testing.assert_array_equal(ag[:, 1], np.arange(T + 1))


@reuses_arrays
@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_env_reusing_its_arrays_stores_real_last_states(vectorization):
    spec = goal_env_spec("TestReusedArrayGoal-v0")
    env = make_vector_env("TestReusedArrayGoal-v0", 2, vectorization, seed=0)
    storage = her.EpisodeStorage(200, (3,), (1,), (2,), max_episode_steps=3, n_envs=2)
    writer = her.EpisodeWriter(storage)
    obs, _ = env.reset(seed=0)
    episodes = []
    for _ in range(10):
        obs, step, stored = collect_step(env, obs, np.zeros((2, 1), np.float32), writer, spec.info_shapes)
        episodes += stored
        if step.done.any():  # the real last state is (e, 3), the reset one (e + 1, 0)
            np.testing.assert_array_equal(step.real_next_obs["achieved_goal"][step.done, 1], 3)
    env.close()
    assert len(episodes) == 6
    _assert_tag_episodes(storage, episodes)


@reuses_arrays
def test_single_env_and_actor_staging_get_copies():
    env = make_env("TestReusedArrayGoal-v0", seed=0)
    first, _ = env.reset()
    later, *_ = env.step(np.zeros(1, np.float32))
    env.step(np.zeros(1, np.float32))
    np.testing.assert_array_equal(first["achieved_goal"], [1, 0])  # this instance's 2nd episode (make_env resets)
    np.testing.assert_array_equal(later["achieved_goal"], [1, 1])
    env.close()
    # an actor of the actor-learner stages through collect_step and sends _episode copies
    spec = goal_env_spec("TestReusedArrayGoal-v0")
    venv = make_vector_env("TestReusedArrayGoal-v0", 1, seed=0)
    staging = her.EpisodeWriter(her.EpisodeStorage(24, (3,), (1,), (2,), max_episode_steps=3, n_envs=1))
    obs, _ = venv.reset(seed=0)
    sent = []
    for _ in range(9):
        obs, step, stored = collect_step(venv, obs, np.zeros((1, 1), np.float32), staging, spec.info_shapes)
        sent += [_episode(staging.storage, s, T, False) for s, T in stored]
    venv.close()
    assert len(sent) == 3
    for ep in sent:
        assert (ep["achieved_goal"][:, 0] == ep["achieved_goal"][0, 0]).all()
        np.testing.assert_array_equal(ep["achieved_goal"][:, 1], [0, 1, 2, 3])


@reuses_arrays
def test_evaluation_reads_the_real_last_state():
    class Policy:
        def act(self, observation, desired_goal, deterministic=True):
            return np.zeros((len(observation), 1), np.float32)

    env = make_vector_env("TestReusedArrayGoal-v0", 2, seed=0)
    ev = evaluate(Policy(), env, 4)
    env.close()
    # the last state of an episode is (e, 3) against the goal (-1, -1); a reset state would be (e + 1, 0)
    expected = np.mean([np.linalg.norm(np.array([e, 3.0]) - [-1, -1]) for e in (1, 1, 2, 2)])
    assert ev["final_distance"] == pytest.approx(expected, rel=1e-6)


# ---------------------------------------------------------------------------------------------------------
# 2. Actions: [-1, 1] for agents and replay, the env's own bounds for the env (case A1)
# ---------------------------------------------------------------------------------------------------------


def test_saturated_actions_reach_the_env_at_its_bounds():
    env = make_env("TestBoxActionGoal-v0", seed=0)
    assert env.action_space == gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    for a, expected in ((1.0, 4.0), (-1.0, 0.0), (0.0, 2.0), (1.5, 4.0)):
        env.step(np.array([a], np.float32))
        assert env.unwrapped.received[-1] == expected
    env.close()
    low, high = np.array([0.0, -2.0]), np.array([4.0, 6.0])
    a = np.array([[-1.0, 1.0], [0.5, -0.25]])
    np.testing.assert_allclose(to_env_action(a, low, high), [[0.0, 6.0], [3.0, 1.0]])
    np.testing.assert_allclose(from_env_action(to_env_action(a, low, high), low, high), a, rtol=1e-6)
    spec = goal_env_spec("TestBoxActionGoal-v0")  # the spec keeps the env's own bounds
    assert spec.action_low.tolist() == [0.0] and spec.action_high.tolist() == [4.0]
    np.testing.assert_allclose(spec.to_env_action(np.array([1.0])), [4.0])


def test_training_stores_normalized_actions_and_drives_env_in_its_bounds(captured, tmp_path):
    from her_agents.loop.train import train

    BOX_ENVS.clear()
    train(_cfg("TestBoxActionGoal-v0", tmp_path))
    storage = captured["build_replay"].storage
    slots = storage.transition_slots()
    stored = storage.action[slots, 0]
    trainer_env = next(e for e in BOX_ENVS if len(e.received) >= 200)
    received = np.array(trainer_env.received[:200])
    assert len(slots) == 200
    assert stored.min() >= -1.0 and stored.max() <= 1.0
    assert received.min() >= 0.0 and received.max() <= 4.0
    # warm-up actions (the first 100) are drawn in [-1, 1] too, spread over all of it
    assert stored[:100].min() < -0.8 and stored[:100].max() > 0.8
    np.testing.assert_allclose(received, 2.0 * (stored + 1.0), atol=1e-5)  # env action = affine map of stored


def test_warmup_actions_are_normalized():
    spec = goal_env_spec("TestBoxActionGoal-v0")
    a = choose_action(None, {}, spec, 3, True, np.random.default_rng(0))
    assert a.shape == (3, 1) and a.dtype == np.float32 and (np.abs(a) <= 1).all()


def test_unbounded_action_box_is_refused():
    for build in (make_env, goal_env_spec):
        with pytest.raises(TypeError, match=r"action space must be a Box with finite bounds.*got low=\[-inf\]"):
            build("TestUnboundedActionGoal-v0")


# ---------------------------------------------------------------------------------------------------------
# 3. Info entries of any shape reach compute_reward (case A2)
# ---------------------------------------------------------------------------------------------------------


def test_spec_records_info_shapes():
    spec = goal_env_spec("TestBonusInfoGoal-v0")
    assert spec.info_keys == ("bonus",) and dict(spec.info_shapes) == {"bonus": (2,)}


def test_vector_info_of_shape_2_reaches_compute_reward_in_training(captured, tmp_path):
    from her_agents.loop.train import train

    train(_cfg("TestBonusInfoGoal-v0", tmp_path))
    replay = captured["build_replay"]
    st = replay.storage
    slots = st.transition_slots()
    assert st.info_shapes == {"bonus": (2,)}
    # every transition, episode ends included (read from final_info, the reset info has no bonus)
    np.testing.assert_array_equal(st.info["bonus"][slots], np.tile(BonusInfoGoalEnv.BONUS, (len(slots), 1)))
    r = replay.sample(2000).reward
    assert set(np.unique(r).tolist()) <= {-1.25, -0.25} and (r == -0.25).any() and (r == -1.25).any()


def test_actor_learner_episodes_carry_vector_info():
    cfg = load_config(None, ["env.id=TestBonusInfoGoal-v0", "replay.capacity=200", "train.batch_size=32",
                             "env.n_envs=1"])
    spec = goal_env_spec("TestBonusInfoGoal-v0")
    venv = make_vector_env("TestBonusInfoGoal-v0", 2, seed=0)
    staging = her.EpisodeWriter(her.EpisodeStorage(40, (2,), (2,), (2,), max_episode_steps=5, n_envs=2,
                                                   info_shapes=dict(spec.info_shapes)))
    learner = build_replay(cfg, spec, total_updates=1)
    obs, _ = venv.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(15):
        action = rng.uniform(-1, 1, (2, 2)).astype(np.float32)
        obs, _, stored = collect_step(venv, obs, action, staging, spec.info_shapes, spec.reward_range)
        for s, T in stored:  # the actor sends each episode, the learner adds it
            ep = _episode(staging.storage, s, T, False)
            learner.storage.add_episode(ep["observation"], ep["action"], ep["reward"],
                                        achieved_goal=ep["achieved_goal"], desired_goal=ep["desired_goal"],
                                        terminated=ep["terminated"], info=ep["info"])
    venv.close()
    assert learner.storage.n_episodes == 6
    r = learner.sample(1000).reward
    assert set(np.unique(r).tolist()) <= {-1.25, -0.25} and (r == -0.25).any()


def test_step_info_reads_ended_envs_from_final_info_and_names_missing_keys():
    done = np.array([False, True])
    infos = {"bonus": np.array([[1.0, 2.0], [0.0, 0.0]]), "_bonus": np.array([True, False]),
             "final_info": {"bonus": np.array([[0.0, 0.0], [3.0, 4.0]]), "_bonus": np.array([False, True])}}
    np.testing.assert_array_equal(step_info(infos, done, {"bonus": (2,)})["bonus"], [[1, 2], [3, 4]])
    with pytest.raises(ValueError, match=r"info\['bonus'\]: expected shape \(3,\) per env, got \(2,\)"):
        step_info(infos, done, {"bonus": (3,)})
    with pytest.raises(ValueError, match=r"info\['other'\]: compute_reward needs it .* env\(s\) \[0\]"):
        step_info(infos, done, {"other": ()})


# ---------------------------------------------------------------------------------------------------------
# 4. Evaluation is unbiased with parallel envs (case A3)
# ---------------------------------------------------------------------------------------------------------


class _ZeroPolicy:
    def act(self, observation, desired_goal, deterministic=True):
        return np.zeros((len(observation), 1), np.float32)


def _coins(seed, n_envs, per_env):
    """heads [n_envs, per_env]: the coins of the first ``per_env`` episodes of sub-env i reset with seed + i."""
    out = np.zeros((n_envs, per_env), bool)
    for i in range(n_envs):
        env = CoinGoalEnv()
        env.reset(seed=seed + i)
        for k in range(per_env):
            out[i, k] = env.heads
            env.reset()
    return out


def test_evaluation_over_parallel_envs_is_unbiased_by_episode_length():
    env = make_vector_env("TestCoinGoal-v0", 10, seed=0)
    ev = evaluate(_ZeroPolicy(), env, 100)
    assert abs(ev["success_rate"] - 0.5) <= 0.15, ev
    # each env runs its share, in the order its episodes started: exactly these coins count, whatever the lengths
    coins = _coins(5, 10, 3)
    for n_episodes in (10, 25, 3):
        share = n_episodes // 10 + (np.arange(10) < n_episodes % 10)
        expected = np.mean(np.concatenate([coins[i, :share[i]] for i in range(10)]))
        assert evaluate(_ZeroPolicy(), env, n_episodes, seed=5)["success_rate"] == pytest.approx(expected)
    env.close()


def test_her_train_and_her_eval_report_unbiased_success(captured, tmp_path, capsys):
    from her_agents.cli import eval_main
    from her_agents.loop.train import train

    result = train(_cfg("TestCoinGoal-v0", tmp_path, "env.eval_envs=10", "train.eval_episodes=100"))
    assert abs(result.eval_success_rate - 0.5) <= 0.15, result.eval_success_rate
    assert eval_main([str(result.run_dir), "--episodes", "100"]) == 0
    rate = float(re.search(r"success rate ([0-9.]+) over 100 episodes", capsys.readouterr().out).group(1))
    assert abs(rate - 0.5) <= 0.15, rate


# ---------------------------------------------------------------------------------------------------------
# 5. TD-target bounds from the env's reward range
# ---------------------------------------------------------------------------------------------------------


def test_td_target_bounds_follow_the_reward_range():
    assert td_target_bounds((-1.0, 0.0), 0.98) == (-50.0, 0.0)  # Fetch's [-50, 0]
    assert td_target_bounds((0.0, 1.0), 0.98) == (0.0, 50.0)
    assert td_target_bounds((-1.25, -0.25), 0.98) == (-62.5, -0.25)
    assert td_target_bounds((-np.inf, 0.0), 0.98) == (-np.inf, 0.0)
    assert td_target_bounds((-1.0, 0.0), 1.0) == (-np.inf, 0.0)
    assert td_target_bounds(None, 0.98) is None
    assert td_target_bounds((-np.inf, np.inf), 0.98) is None


def test_reward_ranges_of_goal_envs():
    assert goal_env_spec("FetchReach-v4").reward_range == (-1.0, 0.0)
    assert goal_env_spec("TestZeroOneGoal-v0").reward_range == (0.0, 1.0)
    assert goal_env_spec("TestBonusInfoGoal-v0").reward_range == (-1.25, -0.25)
    assert goal_env_spec("TestDenseGoal-v0").reward_range is None
    assert goal_env_spec("TestDeclaredRangeGoal-v0").reward_range == (-3.0, 0.0)


def test_q_clip_comes_from_the_env_and_a_bound_excluding_rewards_is_refused(captured, tmp_path):
    from her_agents.loop.train import train

    fetch = goal_env_spec("FetchReach-v4")
    assert q_clip_for_env(fetch.reward_range, 0.98, "FetchReach-v4") == (-50.0, 0.0)  # unchanged for Fetch
    assert q_clip_for_env(fetch.reward_range, 0.98, "FetchReach-v4", configured=[-50, 0]) == (-50.0, 0.0)
    assert q_clip_for_env((0.0, 1.0), 0.98, "maze", configured=None) is None
    assert q_clip_for_env(None, 0.98, "dense") is None
    train(_cfg("TestZeroOneGoal-v0", tmp_path))  # 0/1 rewards: Q in [0, 50], not clipped to [-50, 0]
    assert captured["make_agent"].config.q_clip == (0.0, 50.0)
    msg = (r"agent.q_clip must contain the rewards of TestZeroOneGoal-v0 \(reward range \[0.0, 1.0\]\), "
           r"got \[-50.0, 0.0\]; use \[0.0, 50.0\]")
    with pytest.raises(ValueError, match=msg):
        train(_cfg("TestZeroOneGoal-v0", tmp_path / "refused", "agent.q_clip=[-50,0]"))
    assert not (tmp_path / "refused").exists()  # refused before the run directory


def test_env_rewards_outside_the_probed_range_stop_training(tmp_path, monkeypatch):
    from her_agents.loop.train import train

    monkeypatch.setenv("WANDB_MODE", "disabled")
    with pytest.raises(ValueError, match=r"returned reward 2.0, outside the reward range \[0.0, 1.0\]"):
        train(_cfg("TestShiftedRewardGoal-v0", tmp_path))
    check_rewards(np.array([0.0, 1.0]), (0.0, 1.0), "maze")  # inside: no error
    check_rewards(np.array([7.0]), None, "dense")  # nothing known: nothing checked


# ---------------------------------------------------------------------------------------------------------
# 6. The SB3 adapter: VecNormalize, image goals, SubprocVecEnv, a compute_reward that needs a reset
# ---------------------------------------------------------------------------------------------------------


class TagGoalEnv(gym.Env):
    """Achieved goal of step k of episode e is (10 e, k) (raw, far from normalized values); 4-step episodes."""

    def __init__(self):
        self.observation_space = gym.spaces.Dict({"observation": _box(2, -1e3, 1e3),
                                                  "achieved_goal": _box(2, -1e3, 1e3),
                                                  "desired_goal": _box(2, -1e3, 1e3)})
        self.action_space = _box(1, -1.0, 1.0)
        self.episode, self.k = -1, 0

    def _obs(self):
        ag = np.array([10.0 * self.episode, self.k], np.float32)
        return {"observation": ag.copy(), "achieved_goal": ag, "desired_goal": np.full(2, -1.0, np.float32)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.k = self.episode + 1, 0
        return self._obs(), {}

    def step(self, action):
        self.k += 1
        return self._obs(), -1.0, False, self.k == 4, {}

    def compute_reward(self, achieved_goal, desired_goal, info):
        return sparse_reward(achieved_goal, desired_goal)


class NeedsResetBitFlipping:
    """Factory of SB3's image BitFlippingEnv, whose compute_reward fails before the first reset."""

    def __call__(self):
        from stable_baselines3.common.envs import BitFlippingEnv

        return BitFlippingEnv(n_bits=4, continuous=True, image_obs_space=True, max_steps=4)


@pytest.fixture
def sb3():
    return pytest.importorskip("stable_baselines3")


def test_sb3_stores_raw_terminal_observations_under_vec_normalize(sb3):
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    from her.sb3 import HerSB3ReplayBuffer

    torch.set_num_threads(1)
    # clip_obs wide: un-normalizing (SB3's way too) is then exact up to float rounding
    venv = VecNormalize(DummyVecEnv([TagGoalEnv]), norm_obs=True, norm_reward=False, clip_obs=1e6)
    model = sb3.SAC("MultiInputPolicy", venv, learning_starts=1000, seed=0, device="cpu",
                    policy_kwargs=dict(net_arch=[8]), replay_buffer_class=HerSB3ReplayBuffer)
    model.learn(20)
    st = model.replay_buffer.storage
    assert st.n_episodes == 5
    for start, T in st.episodes():
        states = (start + np.arange(T + 1)) % st.n_slots
        e = st.achieved_goal[states[0], 0] / 10
        np.testing.assert_allclose(st.achieved_goal[states], [[10 * e, k] for k in range(5)], atol=1e-3)
        np.testing.assert_allclose(st.observation[states[-1]], [10 * e, 4], atol=1e-3)  # raw, not normalized


@pytest.mark.parametrize("vec_env", ["dummy", "subproc"])
def test_sb3_image_goals_and_compute_reward_needing_a_reset(sb3, vec_env):
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    from her.sb3 import HerSB3ReplayBuffer

    torch.set_num_threads(1)
    kwargs = {"vec_env_cls": DummyVecEnv} if vec_env == "dummy" else {
        "vec_env_cls": SubprocVecEnv, "vec_env_kwargs": {"start_method": "fork"}}
    venv = make_vec_env(NeedsResetBitFlipping(), n_envs=2, **kwargs)
    model = sb3.TD3("MultiInputPolicy", venv, learning_starts=16, batch_size=8, train_freq=4, seed=0,
                    device="cpu", policy_kwargs=dict(net_arch=[8]), replay_buffer_class=HerSB3ReplayBuffer,
                    replay_buffer_kwargs=dict(n_sampled_goal=4))
    model.learn(40)
    buf = model.replay_buffer
    assert buf.storage.goal_shape == (1, 36, 36)
    s = buf.sample(64)
    next_ag, goal = s.next_observations["achieved_goal"].numpy(), s.observations["desired_goal"].numpy()
    assert next_ag.shape == (64, 1, 36, 36)
    expected = NeedsResetBitFlipping()()  # a reset env gives the reference reward
    expected.reset(seed=0)
    np.testing.assert_array_equal(s.rewards.numpy()[:, 0], expected.compute_reward(next_ag, goal, None))
    venv.close()


def test_reward_check_waits_for_an_env_that_needs_a_reset():
    state = {}

    def reward_after_reset(achieved_goal, desired_goal, info):
        return sparse_reward(achieved_goal, desired_goal) * state["scale"]  # KeyError before the "reset"

    storage = her.EpisodeStorage(20, (2,), (1,), (2,), max_episode_steps=2)
    assert her.check_compute_reward(reward_after_reset, (2,)) is False
    buf = her.HerReplayBuffer(storage, reward_after_reset)  # set-up does not fail
    state["scale"] = 1.0
    assert her.check_compute_reward(reward_after_reset, (2,)) is True
    buf.add_episode(np.zeros((3, 2)), np.zeros((2, 1)), np.full(2, -1.0), achieved_goal=np.zeros((3, 2)),
                    desired_goal=np.ones(2))
    assert set(np.unique(buf.sample(16).reward).tolist()) <= {-1.0, 0.0}
