"""``her.sb3``: the optional Stable-Baselines3 adapter, and ``import her`` staying free of heavy imports.

The SB3 tests skip when stable-baselines3 is not installed (it is not a dependency of this project).
"""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pytest


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120)


def test_import_her_pulls_in_no_heavy_module():
    r = _run("import sys, her\n"
             "bad = [m for m in ('stable_baselines3', 'torch', 'gymnasium', 'wandb', 'her.sb3') if m in sys.modules]\n"
             "print(bad)\n"
             "assert not bad, bad")
    assert r.returncode == 0, r.stdout + r.stderr


def test_her_sb3_without_sb3_raises_a_clear_import_error():
    r = _run("import sys\n"
             "sys.modules['stable_baselines3'] = None  # as if not installed\n"
             "try:\n"
             "    import her.sb3\n"
             "except ImportError as e:\n"
             "    print('MSG', e)\n"
             "else:\n"
             "    raise SystemExit('no ImportError')")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "her.sb3 needs stable-baselines3" in r.stdout and "pip install" in r.stdout


# ------------------------------------------------------------------------------------------------- with SB3

RESET = -7.0  # every coordinate of a reset observation: must never be stored as a next state
GOAL = np.array([9.0, 9.0], np.float32)  # never achieved


def sparse_reward(achieved_goal, desired_goal, info=None):
    return -np.any(np.asarray(achieved_goal) != np.asarray(desired_goal), axis=-1).astype(np.float32)


def _spaces():
    from gymnasium import spaces

    box = lambda n: spaces.Box(-100, 100, (n,), np.float32)
    return spaces.Dict({"observation": box(3), "achieved_goal": box(2), "desired_goal": box(2)}), box(2)


def _obs(env_ids, steps, episode_ids):
    """Tag observations: observation (episode, step, env), achieved goal (episode, step)."""
    e, k, ep = (np.asarray(x, np.float32) for x in (env_ids, steps, episode_ids))
    return {"observation": np.stack([ep, k, e], 1), "achieved_goal": np.stack([ep, k], 1),
            "desired_goal": np.tile(GOAL, (len(e), 1))}


def _reset_obs(n):
    return {"observation": np.full((n, 3), RESET, np.float32), "achieved_goal": np.full((n, 2), RESET, np.float32),
            "desired_goal": np.tile(GOAL, (n, 1))}


def _feed(buf, lengths, ends):
    """Step ``len(lengths)`` envs through one episode each, SB3-style: a done env's ``next_obs`` is the reset
    observation, the real one is in ``infos[i]["terminal_observation"]``; ``ends[i]`` is "terminated" or
    "truncated". Episode id of env i is i."""
    n = len(lengths)
    for k in range(max(lengths)):
        active = [k < L for L in lengths]
        if not all(active):  # keep it simple: all episodes in one call have the same length
            raise AssertionError("use equal lengths")
        obs = _obs(range(n), [k] * n, range(n))
        nxt = _obs(range(n), [k + 1] * n, range(n))
        done = np.array([k + 1 == L for L in lengths])
        infos = [{} for _ in range(n)]
        for i in np.flatnonzero(done):
            infos[i]["terminal_observation"] = {key: v[i].copy() for key, v in nxt.items()}
            infos[i]["TimeLimit.truncated"] = ends[i] == "truncated"
            for key, v in _reset_obs(1).items():
                nxt[key][i] = v[0]
        action = np.tile(np.arange(n, dtype=np.float32)[:, None], (1, 2))
        buf.add(obs, nxt, action, np.full(n, -1.0, np.float32), done, infos)


@pytest.fixture
def sb3():
    return pytest.importorskip("stable_baselines3")


def _buffer(n_envs=2, **kw):
    from her.sb3 import HerSB3ReplayBuffer

    obs_space, act_space = _spaces()
    kw.setdefault("compute_reward", sparse_reward)
    kw.setdefault("seed", 0)
    return HerSB3ReplayBuffer(1000, obs_space, act_space, device="cpu", n_envs=n_envs, **kw)


def test_add_uses_terminal_observation_and_timeouts(sb3):
    buf = _buffer(strategy="final", n_sampled_goal=0)
    _feed(buf, [3, 3], ["truncated", "terminated"])
    assert buf.size() == 6
    s = buf.sample(400)
    obs, nxt = s.observations, s.next_observations
    assert (nxt["observation"] != RESET).all() and (obs["observation"] != RESET).all()
    ep, t = obs["observation"][:, 0].numpy(), obs["observation"][:, 1].numpy()
    np.testing.assert_array_equal(nxt["observation"][:, 1].numpy(), t + 1)
    np.testing.assert_array_equal(nxt["achieved_goal"].numpy(), np.stack([ep, t + 1], 1))
    np.testing.assert_array_equal(obs["achieved_goal"].numpy(), np.stack([ep, t], 1))
    # Only env 1's last transition (a true termination) is terminal; env 0's time-limit end bootstraps.
    expect_done = (ep == 1) & (t == 2)
    np.testing.assert_array_equal(s.dones.numpy()[:, 0], expect_done.astype(np.float32))
    assert s.dones.shape == s.rewards.shape == (400, 1) and s.discounts is None
    np.testing.assert_array_equal(s.rewards.numpy(), -1.0)
    np.testing.assert_array_equal(s.actions.numpy()[:, 0], ep)


def test_timeouts_are_terminal_without_handle_timeout_termination(sb3):
    buf = _buffer(strategy="final", n_sampled_goal=0, handle_timeout_termination=False)
    _feed(buf, [3, 3], ["truncated", "terminated"])
    s = buf.sample(200)
    t = s.observations["observation"][:, 1].numpy()
    np.testing.assert_array_equal(s.dones.numpy()[:, 0], (t == 2).astype(np.float32))


def test_relabeled_goals_and_rewards(sb3):
    buf = _buffer(strategy="future", n_sampled_goal=4)
    _feed(buf, [4, 4], ["truncated", "truncated"])
    s = buf.sample(2000)
    ep = s.observations["observation"][:, 0].numpy()
    t = s.observations["observation"][:, 1].numpy()
    g = s.observations["desired_goal"].numpy()
    np.testing.assert_array_equal(g, s.next_observations["desired_goal"].numpy())
    relabeled = (g != GOAL).any(1)
    assert 0.75 < relabeled.mean() < 0.85
    assert (g[relabeled, 0] == ep[relabeled]).all() and (g[relabeled, 1] > t[relabeled]).all()
    hit = (g == s.next_observations["achieved_goal"].numpy()).all(1)
    np.testing.assert_array_equal(s.rewards.numpy()[:, 0], np.where(hit, 0.0, -1.0))


def test_n_step_returns_and_discounts(sb3):
    from her.sb3 import SB3_HAS_DISCOUNTS

    if not SB3_HAS_DISCOUNTS:
        with pytest.raises(ValueError, match="discounts"):
            _buffer(n_step=3, gamma=0.5)
        return
    with pytest.raises(ValueError, match="gamma"):
        _buffer(n_step=3)
    buf = _buffer(n_envs=1, n_step=3, gamma=0.5, n_sampled_goal=0)
    _feed(buf, [5], ["terminated"])
    s = buf.sample(500)
    t = s.observations["observation"][:, 1].numpy()
    m = np.minimum(3, 5 - t)
    np.testing.assert_allclose(s.discounts.numpy()[:, 0], 0.5**m)
    np.testing.assert_allclose(s.rewards.numpy()[:, 0], -(1 - 0.5**m) / 0.5)
    np.testing.assert_array_equal(s.next_observations["observation"][:, 1].numpy(), t + m)
    np.testing.assert_array_equal(s.next_observations["achieved_goal"][:, 1].numpy(), t + m)
    np.testing.assert_array_equal(s.dones.numpy()[:, 0], (t + m == 5).astype(np.float32))


def test_reset_without_done_drops_the_partial_episode(sb3):
    buf = _buffer(n_envs=1, n_sampled_goal=0)
    buf.add(_obs([0], [0], [5]), _obs([0], [1], [5]), np.zeros((1, 2)), np.array([-1.0]), np.array([False]), [{}])
    # the env was reset (a new learn() call): episode 6 starts from step 0
    _feed(buf, [2], ["truncated"])
    assert buf.size() == 2 and buf.storage.n_episodes == 1
    s = buf.sample(50)
    assert (s.observations["observation"][:, 0].numpy() == 0).all()


def test_sampling_before_an_episode_ends_says_why(sb3):
    buf = _buffer(n_envs=1)
    buf.add(_obs([0], [0], [0]), _obs([0], [1], [0]), np.zeros((1, 2)), np.array([-1.0]), np.array([False]), [{}])
    with pytest.raises(ValueError, match="learning_starts"):
        buf.sample(4)


def test_prioritized_needs_priority_updates(sb3):
    buf = _buffer(prioritized=True, alpha=0.6, beta0=0.4)
    _feed(buf, [3, 3], ["truncated", "truncated"])
    buf.sample(8)
    assert buf.last_weights.shape == (8, 1) and buf.last_index.shape == (8,)
    with pytest.raises(RuntimeError, match="update_priorities"):
        buf.sample(8)  # SB3's stock train() would do this
    import torch

    buf.update_priorities(torch.linspace(0, 2, 8)[:, None])
    buf.sample(8)
    buf.update_priorities(np.ones(8))
    assert buf.her.sampler.max_priority > 0


def test_bad_settings_are_refused(sb3):
    from gymnasium import spaces

    from her.sb3 import HerSB3ReplayBuffer

    obs_space, act_space = _spaces()
    with pytest.raises(ValueError, match="Dict observation space"):
        HerSB3ReplayBuffer(100, spaces.Box(-1, 1, (3,)), act_space, compute_reward=sparse_reward)
    with pytest.raises(ValueError, match="compute_reward"):
        HerSB3ReplayBuffer(100, obs_space, act_space)
    with pytest.raises(ValueError, match="optimize_memory_usage"):
        HerSB3ReplayBuffer(100, obs_space, act_space, optimize_memory_usage=True, compute_reward=sparse_reward)
    with pytest.raises(ValueError, match="strategy"):
        HerSB3ReplayBuffer(100, obs_space, act_space, strategy="nope", compute_reward=sparse_reward)


def test_pickle_round_trip(sb3):
    buf = _buffer(strategy="final")
    _feed(buf, [3, 3], ["truncated", "terminated"])
    buf2 = pickle.loads(pickle.dumps(buf))
    assert buf2.size() == 6
    a, b = buf.sample(16), buf2.sample(16)  # same RNG state: same batch
    np.testing.assert_array_equal(a.observations["observation"].numpy(), b.observations["observation"].numpy())


@pytest.mark.parametrize("algo", ["SAC", "TD3", "DDPG", "DQN", "SAC-nstep"])
def test_sb3_algorithms_train_with_the_buffer(sb3, algo, tmp_path):
    import torch
    from stable_baselines3.common.envs import BitFlippingEnv

    from her.sb3 import SB3_HAS_DISCOUNTS, HerSB3ReplayBuffer

    torch.set_num_threads(1)
    name = algo.split("-")[0]
    if algo == "SAC-nstep" and not SB3_HAS_DISCOUNTS:
        pytest.skip("this SB3 has no `discounts` field")
    env = BitFlippingEnv(n_bits=4, continuous=name != "DQN", max_steps=4)
    kwargs = dict(strategy="future", n_sampled_goal=4)
    if algo == "SAC-nstep":
        kwargs.update(n_step=3, gamma=0.9)
    cls = getattr(sb3, name)
    extra = {"policy_kwargs": dict(net_arch=[16])}
    model = cls("MultiInputPolicy", env, learning_starts=20, batch_size=16, gamma=0.9, seed=0,
                replay_buffer_class=HerSB3ReplayBuffer, replay_buffer_kwargs=kwargs, device="cpu", **extra)
    model.learn(80)
    buf = model.replay_buffer
    assert isinstance(buf, HerSB3ReplayBuffer) and buf.size() > 20
    s = buf.sample(8)
    assert s.actions.shape == (8, 1 if name == "DQN" else 4)
    # save / load the replay buffer (the env-derived compute_reward is dropped and restored by set_env)
    model.save_replay_buffer(tmp_path / "rb.pkl")
    model.load_replay_buffer(tmp_path / "rb.pkl")
    assert model.replay_buffer.size() == buf.size()
    model.learn(20, reset_num_timesteps=False)
