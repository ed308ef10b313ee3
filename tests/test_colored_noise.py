"""Colored exploration noise (``agent.noise_beta``): the sequences' statistics, their per-row bookkeeping, and how
the agents and the training loop use them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from her_agents.algos.noise import ColoredNoise, colored_noise
from her_agents.algos.registry import make_agent

OBS, GOAL, ACT = 6, 3, 4
SMALL = {"hidden": (16, 16)}


def lag1_autocorrelation(x: np.ndarray) -> float:
    """Mean over sequences ``x [..., T]`` of the lag-1 autocorrelation about the sequence's own mean."""
    x = x - x.mean(-1, keepdims=True)
    return float(((x[..., 1:] * x[..., :-1]).mean(-1) / (x * x).mean(-1)).mean())


@pytest.mark.parametrize("horizon", [50, 51])
def test_colored_noise_has_unit_variance_and_the_color_sets_its_correlation(horizon):
    rng = np.random.default_rng(0)
    by_beta = {beta: colored_noise(beta, (4000,), horizon, rng) for beta in (0.0, 1.0, 2.0)}
    for beta, x in by_beta.items():
        assert x.shape == (4000, horizon) and x.dtype == np.float32
        assert abs(x.mean()) < 0.05, beta
        assert abs(x.var() - 1.0) < 0.05, (beta, x.var())  # per-step variance 1, whatever the color
    white, pink, red = (lag1_autocorrelation(by_beta[b]) for b in (0.0, 1.0, 2.0))
    assert abs(white) < 0.05  # about -1/T for white noise about its own mean
    assert 0.3 < pink < red  # slower components keep a noisy move going


def test_colored_noise_refuses_a_negative_exponent_or_an_empty_horizon():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="beta: expected >= 0, got -1"):
        colored_noise(-1.0, (2,), 50, rng)
    with pytest.raises(ValueError, match="horizon: expected >= 1, got 0"):
        colored_noise(1.0, (2,), 0, rng)
    assert colored_noise(1.0, (3, 2), 1, rng).shape == (3, 2, 1)


def test_colored_noise_rows_follow_their_sequences_and_restart_on_reset_or_at_the_end():
    noise = ColoredNoise(1.0, dim=2, horizon=5, rng=np.random.default_rng(0))
    first = noise.sample(3)
    seq = noise._seq.copy()  # [3, 2, 5]
    np.testing.assert_array_equal(first, seq[:, :, 0])
    np.testing.assert_array_equal(noise.sample(3), seq[:, :, 1])
    noise.reset(np.array([False, True, False]))
    third = noise.sample(3)
    np.testing.assert_array_equal(third[[0, 2]], seq[[0, 2], :, 2])  # the other rows go on
    np.testing.assert_array_equal(third[1], noise._seq[1, :, 0])  # row 1 starts a new sequence
    assert not np.array_equal(noise._seq[1], seq[1])
    for _ in range(2):
        noise.sample(3)
    before = noise._seq.copy()
    noise.sample(3)  # rows 0 and 2 ran out of their 5 steps: new sequences
    assert not np.array_equal(noise._seq[0], before[0]) and not np.array_equal(noise._seq[2], before[2])
    np.testing.assert_array_equal(noise._seq[1], before[1])
    noise.reset(np.array([True, False]))  # a mask of another length is ignored
    assert noise.sample(2).shape == (2, 2)  # another row count starts every row afresh


@pytest.mark.parametrize("algo", ["ddpg", "td3", "sac", "tqc"])
def test_agents_act_on_colored_noise_one_sequence_step_per_call(algo):
    # noise_std only: DDPG/TD3's actions are mu + noise_std * z, SAC's tanh(mu + std * z); z is the colored draw
    extra = {"noise_std": 0.1} if algo in ("ddpg", "td3") else {"noise_std": 0.0}
    agent = make_agent(algo, OBS, GOAL, ACT, random_eps=0.0, noise_beta=1.0, noise_horizon=8, seed=0, **extra,
                       **SMALL)
    rng = np.random.default_rng(1)
    obs = rng.standard_normal((2, OBS)).astype(np.float32)
    goal = rng.standard_normal((2, GOAL)).astype(np.float32)
    mean = agent.act(obs, goal, deterministic=True)
    actions = np.stack([agent.act(obs, goal) for _ in range(8)])  # [8, 2, ACT]
    z = agent._noise_source._seq.transpose(2, 0, 1)  # [8, 2, ACT]: the steps the calls used
    if algo in ("ddpg", "td3"):
        np.testing.assert_allclose(actions, np.clip(mean + 0.1 * z, -1.0, 1.0), atol=1e-6)
    else:  # SAC/TQC's own sample: u = mu + std * z
        with torch.no_grad():
            state = agent.preprocess(torch.as_tensor(obs), torch.as_tensor(goal))
            mu, log_std = agent.actor.distribution_params(state)
        expected = np.tanh(mu.numpy() + log_std.exp().numpy() * z)
        np.testing.assert_allclose(actions, expected, atol=1e-5)
        torch_path = agent.actor(state, False, torch.as_tensor(z[0]))[0].detach().numpy()
        np.testing.assert_allclose(torch_path, expected[0], atol=1e-5)  # the torch policy takes the same sample
    agent.reset_noise(np.array([True, False]))
    assert agent._noise_source._pos.tolist() == [0, 8]


def test_white_noise_keeps_the_exploration_stream_of_before():
    # noise_beta = 0 draws as before: no sequence, the same numbers from the same seed
    a = make_agent("ddpg", OBS, GOAL, ACT, noise_std=0.2, random_eps=0.0, seed=3, **SMALL)
    obs, goal = np.zeros((3, OBS), np.float32), np.zeros((3, GOAL), np.float32)
    mean = a.act(obs, goal, deterministic=True)
    z = np.random.default_rng(3).standard_normal((3, ACT), dtype=np.float32)
    np.testing.assert_allclose(a.act(obs, goal), np.clip(mean + 0.2 * z, -1, 1), atol=1e-6)
    a.reset_noise(np.array([True, True, True]))  # a no-op
    assert "_noise_source" not in a.__dict__


@pytest.mark.parametrize("field, value, expected", [("noise_beta", -0.5, ">= 0"), ("noise_horizon", 0, ">= 1")])
def test_noise_options_out_of_range_are_refused_by_name(field, value, expected):
    with pytest.raises(ValueError, match=f"^{field}.*{expected}"):
        make_agent("sac", OBS, GOAL, ACT, **{field: value}, **SMALL)


def test_training_loop_gives_each_episode_its_own_sequence_of_the_episode_length(tmp_path, monkeypatch):
    from her_agents.algos.base import GoalConditionedAgentBase
    from her_agents.config import config_yaml, load_config
    from her_agents.loop.train import train

    resets = []
    real = GoalConditionedAgentBase.reset_noise

    def recording(self, done):
        source = self.__dict__.get("_noise_source")  # none yet while warm-up acts at random
        resets.append(None if source is None else (source.horizon, source._pos.tolist(), np.asarray(done).tolist()))
        real(self, done)

    monkeypatch.setattr(GoalConditionedAgentBase, "reset_noise", recording)
    cfg = load_config("fetch_reach_sac", [
        "agent.noise_beta=1", "agent.compile=false", "train.total_env_steps=300", "train.warmup_steps=100",
        "train.learning_starts=100", "train.eval_every=300", "train.eval_episodes=2", "env.eval_envs=2",
        f"log.run_dir={tmp_path}", "log.progress=false", "log.wandb.mode=disabled", "replay.capacity=2000"])
    assert "noise_horizon" not in config_yaml(cfg)  # derived from the env, so not printed unless set
    result = train(cfg)
    assert result.env_steps == 300
    # 6 FetchReach episodes of 50 steps: 2 of warm-up, then 4 on the policy, each ending its 50-step sequence
    assert resets == [None, None] + [(50, [50], [True])] * 4
