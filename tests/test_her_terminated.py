"""Goal envs that end the episode on success: ``HerReplayBuffer(..., compute_terminated=)`` recomputes
``terminated`` for the sampled goal (1-step and n-step, uniform and prioritized), and ``her-train`` passes the
env's own compute_terminated when it defines a vectorized one (docs/semantics.md, "Which return")."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from conftest import TagRun, add_tag_episode, make_tag_storage, tag_reward, tag_terminated

import her

# ---------------------------------------------------------------------------------------------------------
# A small goal env that ends on success
# ---------------------------------------------------------------------------------------------------------


def _box(n, low=-10.0, high=10.0):
    return gym.spaces.Box(low, high, (n,), np.float32)


def _reached(achieved_goal, desired_goal):
    return np.abs(np.asarray(achieved_goal)[..., 0] - np.asarray(desired_goal)[..., 0]) <= 0.05


class LineGoalEnv(gym.Env):
    """A point on a line moved by the action (``pos += a``, ``a`` in [-1, 1]); the episode terminates when the
    point is within 0.05 of the goal (reward 0, else -1). ``reset(options={"goal": g})`` sets the goal."""

    def __init__(self):
        self.observation_space = gym.spaces.Dict({"observation": _box(1), "achieved_goal": _box(1),
                                                  "desired_goal": _box(1)})
        self.action_space = _box(1, -1.0, 1.0)
        self.pos, self.goal = np.zeros(1, np.float32), np.full(1, 3.0, np.float32)

    def _obs(self):
        return {"observation": self.pos.copy(), "achieved_goal": self.pos.copy(), "desired_goal": self.goal.copy()}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = np.zeros(1, np.float32)
        self.goal = np.full(1, (options or {}).get("goal", 3.0), np.float32)
        return self._obs(), {}

    def step(self, action):
        self.pos = (self.pos + np.asarray(action, np.float32).reshape(1)).astype(np.float32)
        obs = self._obs()
        reward = float(self.compute_reward(obs["achieved_goal"], obs["desired_goal"], {}))
        terminated = bool(self.compute_terminated(obs["achieved_goal"], obs["desired_goal"], {}))
        return obs, reward, terminated, False, {}

    def compute_reward(self, achieved_goal, desired_goal, info):
        return -(~_reached(achieved_goal, desired_goal)).astype(np.float32)

    def compute_terminated(self, achieved_goal, desired_goal, info):
        return _reached(achieved_goal, desired_goal)


class ScalarTerminatedLineEnv(LineGoalEnv):
    """Ends on success, but its compute_terminated is not vectorized (one bool for a whole batch)."""

    def compute_terminated(self, achieved_goal, desired_goal, info):
        return bool(np.linalg.norm(np.asarray(achieved_goal) - np.asarray(desired_goal)) <= 0.05)


class NeverTerminatingLineEnv(LineGoalEnv):
    """A continuing task: its own compute_terminated is a constant False (not vectorized, and never ends)."""

    def compute_terminated(self, achieved_goal, desired_goal, info):
        return False


ENVS = {"TestLineGoal-v0": LineGoalEnv, "TestScalarTerminatedLine-v0": ScalarTerminatedLineEnv,
        "TestNeverTerminatingLine-v0": NeverTerminatingLineEnv}
for _id, _cls in ENVS.items():
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=_cls, max_episode_steps=5)

# The two scripted episodes: A reaches its goal 3 at the third step (terminated); B, goal 5, walks 1, 2, 1, 2, 1
# and is cut by the time limit at step 5 (truncated), achieving 2 at steps 2 and 4.
EPISODES = {"A": (3.0, [1, 1, 1]), "B": (5.0, [1, 1, -1, 1, -1])}
POSITIONS = {"A": [0, 1, 2, 3], "B": [0, 1, 2, 1, 2, 1]}


def _fill(storage):
    """Step the env through episodes A and B into ``storage`` with an ``EpisodeWriter`` (one env)."""
    env = gym.make("TestLineGoal-v0")
    writer = her.EpisodeWriter(storage)
    for goal, actions in EPISODES.values():
        obs, _ = env.reset(options={"goal": goal})
        for a in actions:
            nxt, reward, terminated, truncated, _ = env.step(np.array([a], np.float32))
            rows = {k: v[None] for k, v in obs.items()}, {k: v[None] for k, v in nxt.items()}
            writer.add(rows[0], np.array([[a]], np.float32), np.array([reward]), rows[1], np.array([terminated]),
                       np.array([truncated]))
            obs = nxt
    env.close()
    assert storage.n_episodes == 2 and storage.terminated.sum() == 1  # A's last transition only


def _buffer(strategy="future", n_step=1, prioritized=False, terminated=True, seed=0):
    env = LineGoalEnv()
    storage = her.EpisodeStorage(100, (1,), (1,), (1,), max_episode_steps=5)
    _fill(storage)
    sampler = her.PrioritizedSampler(storage) if prioritized else None
    buf = her.HerReplayBuffer(storage, env.compute_reward, strategy=strategy, n_sampled_goal=4, n_step=n_step,
                              gamma=0.5, sampler=sampler, seed=seed,
                              compute_terminated=env.compute_terminated if terminated else None)
    return buf


def _sample(buf, n=4000):
    """A batch, the episode ("A" / "B") and step t of each row (A fills slots 0..3, B slots 4..9)."""
    b = buf.sample(n)
    ep = np.where(b.index < 4, "A", "B")
    return b, ep, np.where(ep == "A", b.index, b.index - 4)


def _reference(ep, t, g, n):
    """(m, terminated, return) of a window by the book, gamma 0.5."""
    pos = POSITIONS[ep]
    m = min(n, len(pos) - 1 - t)
    ret = 0.0
    for j in range(m):
        reached = abs(pos[t + j + 1] - g) <= 0.05
        ret += 0.5**j * (0.0 if reached else -1.0)
        if reached:
            return j + 1, True, ret
    return m, False, ret


# ---------------------------------------------------------------------------------------------------------
# The buffer
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("prioritized", [False, True])
@pytest.mark.parametrize("n_step", [1, 5])
@pytest.mark.parametrize("strategy", ["future", "episode"])
def test_every_row_terminates_exactly_where_its_goal_is_first_reached(strategy, n_step, prioritized):
    buf = _buffer(strategy, n_step, prioritized)
    for _ in range(2):
        b, ep, t = _sample(buf)
        for i in range(len(b)):
            m, term, ret = _reference(ep[i], int(t[i]), float(b.desired_goal[i, 0]), n_step)
            assert (b.n_steps[i], bool(b.terminated[i])) == (m, term), (ep[i], t[i], b.desired_goal[i])
            assert b.reward[i] == pytest.approx(ret) and b.discount[i] == pytest.approx(0.5**m)
            assert b.next_observation[i, 0] == POSITIONS[ep[i]][t[i] + m]
        if prioritized:  # train on it and draw again
            buf.update_priorities(b.index, np.abs(b.reward) + 0.1)


@pytest.mark.parametrize("n_step", [1, 3])
def test_a_relabeled_success_terminates(n_step):
    """A's first transition relabeled to the goal it reaches (1): terminal after one step. The stored flags
    (without compute_terminated) bootstrap there, or run the window on to A's real end."""
    b, ep, t = _sample(_buffer("future", n_step))
    sel = (ep == "A") & (t == 0) & (b.desired_goal[:, 0] == 1.0)
    assert sel.sum() > 50 and b.terminated[sel].all() and (b.n_steps[sel] == 1).all()
    np.testing.assert_array_equal(b.reward[sel], 0.0)
    b, ep, t = _sample(_buffer("future", n_step, terminated=False))
    sel = (ep == "A") & (t == 0) & (b.desired_goal[:, 0] == 1.0)
    assert sel.sum() > 50 and (b.n_steps[sel] == n_step).all()
    assert (b.terminated[sel] == (n_step == 3)).all()  # only at A's real end


@pytest.mark.parametrize("n_step", [1, 3])
def test_a_real_terminal_relabeled_to_a_goal_it_does_not_reach_bootstraps(n_step):
    """A's last transition (a real terminal) relabeled to A's first achieved goal (1, strategy "episode"): not
    terminal with compute_terminated; the stored flag (without it) stops bootstrapping."""
    for terminated in (True, False):
        b, ep, t = _sample(_buffer("episode", n_step, terminated=terminated))
        sel = (ep == "A") & (t == 2) & (b.desired_goal[:, 0] == 1.0)
        assert sel.sum() > 50
        assert (b.terminated[sel] != terminated).all()
        assert (b.n_steps[sel] == 1).all() and (b.next_observation[sel, 0] == 3.0).all()
    # the real goal there: terminal either way (the env's flag and compute_terminated agree)
    b, ep, t = _sample(_buffer("episode", n_step))
    sel = (ep == "A") & (t == 2) & ~b.relabeled
    assert sel.sum() > 20 and b.terminated[sel].all()


@pytest.mark.parametrize("prioritized", [False, True])
def test_an_n_step_window_stops_at_the_first_terminal_step_for_its_goal(prioritized):
    """B (1, 2, 1, 2, 1) with goal 2, n = 5: from t = 0 (and 2) the window is two steps, terminated at the first
    2 (return -1 + 0.5 * 0), not run on past it to the second; from t = 1 (and 3) one step."""
    buf = _buffer("future", 5, prioritized)
    b, ep, t = _sample(buf, 8000)
    for start, m in ((0, 2), (1, 1), (2, 2), (3, 1)):
        sel = (ep == "B") & (t == start) & (b.desired_goal[:, 0] == 2.0)
        assert sel.sum() > 20
        assert (b.n_steps[sel] == m).all() and b.terminated[sel].all()
        assert (b.next_observation[sel, 0] == 2.0).all()
        np.testing.assert_allclose(b.reward[sel], -1.0 if m == 2 else 0.0)
        np.testing.assert_allclose(b.discount[sel], 0.5**m)
    # goal 5 (B's own, never reached): the whole episode, truncated, bootstraps
    sel = (ep == "B") & (t == 0) & ~b.relabeled
    assert sel.sum() > 20 and (b.n_steps[sel] == 5).all() and not b.terminated[sel].any()
    if prioritized:
        buf.update_priorities(b.index, np.ones(len(b)))


def test_compute_terminated_is_called_once_per_batch_with_the_rewards_arguments():
    calls = []

    def recording(achieved_goal, desired_goal, info):
        calls.append((achieved_goal.shape, desired_goal.shape, info))
        return tag_terminated(achieved_goal, desired_goal, info)

    storage = make_tag_storage(100)
    add_tag_episode(storage, TagRun(), 6)
    for n in (1, 3):
        buf = her.HerReplayBuffer(storage, tag_reward, n_step=n, compute_terminated=recording, seed=0)
        calls.clear()
        buf.sample(32)
        assert len(calls) == 1
        (ag, dg, info), = calls
        assert ag == dg == (32 * n, 2) and set(info) == {"w"} and info["w"].shape == (32 * n, 1)


def test_bad_compute_terminated_is_refused_naming_it():
    storage = make_tag_storage(100)
    add_tag_episode(storage, TagRun(), 4)

    def scalar(achieved_goal, desired_goal, info):
        return False

    def no_info(achieved_goal, desired_goal):
        return tag_terminated(achieved_goal, desired_goal)

    with pytest.raises(ValueError, match=r"^compute_terminated must be vectorized: .* got shape \(\)$"):
        her.HerReplayBuffer(storage, tag_reward, compute_terminated=scalar)
    with pytest.raises(TypeError, match=r"^compute_terminated must take three positional arguments .* "
                                        r"got no_info\(achieved_goal, desired_goal\)"):
        her.HerReplayBuffer(storage, tag_reward, compute_terminated=no_info)
    plain = her.EpisodeStorage(20, (2,), (1,))
    with pytest.raises(ValueError, match="compute_terminated needs a goal storage"):
        her.HerReplayBuffer(plain, compute_terminated=tag_terminated)

    class OldReturns(her.OneStepReturn):  # a user's returns class written before compute_terminated
        def build(self, storage, slots, records, goals, compute_reward):
            return super().build(storage, slots, records, goals, compute_reward)

    with pytest.raises(TypeError, match="OldReturns.build does not take compute_terminated"):
        her.HerReplayBuffer(storage, tag_reward, returns=OldReturns(), compute_terminated=tag_terminated)
    assert len(her.HerReplayBuffer(storage, tag_reward, returns=OldReturns(), seed=0).sample(4)) == 4

    state = {"n": 0}

    def turns_scalar(achieved_goal, desired_goal, info):  # passes the set-up probe, then returns one bool
        state["n"] += 1
        return tag_terminated(achieved_goal, desired_goal, info) if state["n"] == 1 else np.False_

    buf = her.HerReplayBuffer(storage, tag_reward, compute_terminated=turns_scalar, seed=0)
    with pytest.raises(ValueError, match=r"^compute_terminated returned shape \(\), expected \(16,\): it must be "):
        buf.sample(16)


def test_sb3_adapter_passes_compute_terminated_through():
    pytest.importorskip("stable_baselines3")
    from her.sb3 import HerSB3ReplayBuffer

    env = LineGoalEnv()
    buf = HerSB3ReplayBuffer(100, env.observation_space, env.action_space, device="cpu", n_envs=1,
                             compute_reward=env.compute_reward, compute_terminated=env.compute_terminated,
                             max_episode_steps=5, seed=0)
    assert buf.her.compute_terminated == env.compute_terminated
    obs = {k: v[None] for k, v in env.reset(options={"goal": 3.0})[0].items()}
    for _ in range(3):
        nxt, r, term, _trunc, _info = env.step(np.ones(1, np.float32))
        nxt = {key: v[None] for key, v in nxt.items()}
        buf.add(obs, nxt, np.ones((1, 1), np.float32), np.array([r]), np.array([term]), [{}])
        obs = nxt
    s = buf.sample(2000)
    ag_next = s.next_observations["achieved_goal"].numpy()[:, 0]
    goal = s.observations["desired_goal"].numpy()[:, 0]
    np.testing.assert_array_equal(s.dones.numpy()[:, 0], (np.abs(ag_next - goal) <= 0.05).astype(np.float32))
    assert ((s.dones.numpy()[:, 0] == 1) & (goal != 3.0)).sum() > 100  # relabeled successes end too
    with pytest.raises(ValueError, match="samples uniformly, so priorities would be ignored"):
        buf.update_priorities(np.ones(2000))


# ---------------------------------------------------------------------------------------------------------
# her-train: the env's own compute_terminated, when it has a vectorized one
# ---------------------------------------------------------------------------------------------------------


def test_her_train_passes_the_envs_own_vectorized_compute_terminated():
    from her_agents.config import load_config
    from her_agents.loop.train import build_replay
    from her_envs import goal_env_spec

    spec = goal_env_spec("TestLineGoal-v0")
    assert spec.compute_terminated is not None
    ag = np.array([[0.0], [1.0], [3.0]], np.float32)
    np.testing.assert_array_equal(spec.compute_terminated(ag, np.full((3, 1), 3.0, np.float32), None),
                                  [False, False, True])
    cfg = load_config(None, ["env.id=TestLineGoal-v0", "replay.capacity=100", "replay.n_step=3",
                             "train.batch_size=32", "env.n_envs=1"])
    replay = build_replay(cfg, spec, total_updates=1)
    assert replay.compute_terminated is spec.compute_terminated
    _fill(replay.storage)
    b = replay.sample(500)
    ag_last = replay.storage.achieved_goal[(b.index + b.n_steps) % replay.storage.n_slots, 0]
    np.testing.assert_array_equal(b.terminated, np.abs(ag_last - b.desired_goal[:, 0]) <= 0.05)


def test_her_train_passes_none_for_fetch_and_envs_without_a_usable_compute_terminated():
    from her_envs import goal_env_spec

    assert goal_env_spec("FetchReach-v4").compute_terminated is None  # gymnasium-robotics' constant False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a continuing task's constant False: no warning
        assert goal_env_spec("TestNeverTerminatingLine-v0").compute_terminated is None
    with pytest.warns(UserWarning, match=r"TestScalarTerminatedLine-v0: compute_terminated is not vectorized "
                                         r"\(for 14 goals it returned shape \(\), not \(14,\)\); relabeled "
                                         r"transitions keep the stored terminated flags"):
        assert goal_env_spec("TestScalarTerminatedLine-v0").compute_terminated is None
