"""Unit tests of agents/: normalizer, networks, exploration, TD targets, DDPG/TD3/SAC/TQC updates, checkpoints."""

from __future__ import annotations

import copy
import gc
import math
import pickle
import shutil
import warnings
from typing import Any
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from her_agents.algos.base import Agent, GoalConditionedAgentBase, resolve_device, td_target
from her_agents.algos.ddpg import DDPGAgent, DDPGConfig
from her_agents.algos.networks import (
    EnsembleCritic, EnsembleLinear, SquashedGaussianActor, mlp, tanh_log_det_jacobian,
)
from her_agents.algos.normalizer import RunningNormalizer
from her_agents.algos.registry import make_agent
from her_agents.algos.sac import SACAgent, SACConfig
from her_agents.algos.td3 import TD3Agent, TD3Config, smoothed_target_action
from her_agents.algos.tqc import TQCAgent, TQCConfig, quantile_huber_loss

OBS, GOAL, ACT = 7, 3, 2
SMALL = {"hidden": (32, 32), "device": "cpu"}
ALGOS = ["ddpg", "td3", "sac", "tqc"]
STOCHASTIC = ("sac", "tqc")  # policies that sample their actions


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """Small nets: one thread is fastest and avoids oversubscription when other jobs share the CPU."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def make_batch(batch_size: int = 32, seed: int = 0, terminated: bool = False) -> SimpleNamespace:
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(batch_size, OBS)).astype(np.float32)
    return SimpleNamespace(
        observation=obs,
        desired_goal=rng.normal(size=(batch_size, GOAL)).astype(np.float32),
        action=rng.uniform(-1, 1, (batch_size, ACT)).astype(np.float32),
        # a fixed, learnable regression target: -1 where the first feature is negative
        reward=-(obs[:, 0] < 0).astype(np.float32),
        next_observation=rng.normal(size=(batch_size, OBS)).astype(np.float32),
        discount=np.full(batch_size, 0.98, np.float32),
        terminated=np.full(batch_size, terminated),
        weight=np.ones(batch_size, np.float32),
    )


# ---------------------------------------------------------------------------------------------- normalizer
def test_normalizer_matches_numpy_mean_std():
    rng = np.random.default_rng(0)
    data = rng.normal(loc=[1.0, -3.0, 10.0], scale=[0.5, 2.0, 4.0], size=(1000, 3))
    norm = RunningNormalizer(3)
    for chunk in np.array_split(data, 7):
        norm.update(chunk)
    np.testing.assert_allclose(norm.mean, data.mean(0), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(norm.std, data.std(0), rtol=1e-8)
    x = torch.as_tensor(data[:10], dtype=torch.float32)
    expected = np.clip((data[:10] - data.mean(0)) / data.std(0), -5, 5)
    np.testing.assert_allclose(norm.normalize(x).numpy(), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(norm.normalize_np(data[:10]), expected, rtol=1e-5, atol=1e-5)


def test_normalizer_clips_and_floors():
    norm = RunningNormalizer(2, eps=1e-2)
    data = np.zeros((100, 2))
    data[:, 1] = np.linspace(-1, 1, 100)
    norm.update(data)
    assert norm.std[0] == pytest.approx(1e-2)  # constant feature: std floor
    out = norm.normalize(torch.tensor([[1.0, 100.0], [-1.0, -100.0]]))
    assert out.abs().max().item() == pytest.approx(5.0)
    # raw inputs are clipped to +-200 before the statistics
    big = RunningNormalizer(1)
    big.update(np.array([[1e6], [-1e6], [1e6]]))
    assert big.mean[0] == pytest.approx(200.0 / 3)


def test_normalizer_state_dict_and_distributed_hook():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(50, 4)), rng.normal(size=(70, 4))
    # two "workers" all-reduce their partial sums
    w1, w2 = RunningNormalizer(4), RunningNormalizer(4)
    parts = [w1.partial_stats(a), w2.partial_stats(b)]
    total = [parts[0][i] + parts[1][i] for i in range(3)]
    w1.add_stats(*total)
    single = RunningNormalizer(4)
    single.update(np.concatenate([a, b]))
    np.testing.assert_allclose(w1.mean, single.mean)
    np.testing.assert_allclose(w1.std, single.std)
    restored = RunningNormalizer(4)
    restored.load_state_dict(pickle.loads(pickle.dumps(single.state_dict())))
    x = torch.randn(5, 4)
    assert torch.equal(restored.normalize(x), single.normalize(x))


# ----------------------------------------------------------------------------------------------- networks
def _copy_into_sequential(critic: EnsembleCritic, member: int, seq: nn.Sequential) -> None:
    ens_layers = [*critic.linears, critic.head]
    linears = [m for m in seq if isinstance(m, nn.Linear)]
    norms = [m for m in seq if isinstance(m, nn.LayerNorm)]
    with torch.no_grad():
        for lin, ens in zip(linears, ens_layers, strict=True):
            lin.weight.copy_(ens.weight[member])
            lin.bias.copy_(ens.bias[member, 0])
        for ln, ens_ln in zip(norms, critic.norms or [], strict=True):
            ln.weight.copy_(ens_ln.weight[member, 0])
            ln.bias.copy_(ens_ln.bias[member, 0])


@pytest.mark.parametrize("layer_norm", [False, True])
def test_single_critic_runs_as_plain_layers_with_the_same_values_and_gradients(layer_norm):
    torch.manual_seed(1)
    S, A, B, hidden = 6, 2, 16, (32, 24)
    critic = EnsembleCritic(S, A, hidden, n_critics=1, layer_norm=layer_norm)
    ref = mlp(S + A, 1, hidden, layer_norm)
    _copy_into_sequential(critic, 0, ref)
    s, a = torch.randn(B, S), torch.randn(B, A)
    q, q_ref = critic(s, a), ref(torch.cat([s, a], 1)).squeeze(-1)
    assert q.shape == (1, B)
    torch.testing.assert_close(q[0], q_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(critic(s, a, member=0), q, rtol=0, atol=0)
    coef = torch.randn(B)
    (coef * q[0]).sum().backward()
    (coef * q_ref).sum().backward()
    grads = [p.grad for p in critic.parameters()]
    assert all(g is not None and g.shape == p.shape for g, p in zip(grads, critic.parameters()))
    linears = [x for x in ref if isinstance(x, nn.Linear)]
    for ens, lin in zip([*critic.linears, critic.head], linears):
        torch.testing.assert_close(ens.weight.grad[0], lin.weight.grad, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ens.bias.grad[0, 0], lin.bias.grad, rtol=1e-5, atol=1e-5)
    for bad in (1, -1):
        with pytest.raises(IndexError, match="member"):
            critic(s, a, member=bad)


@pytest.mark.parametrize("layer_norm", [False, True])
def test_ensemble_critic_equals_separate_critics(layer_norm):
    torch.manual_seed(0)
    S, A, B, hidden = 6, 2, 16, (32, 24)
    critic = EnsembleCritic(S, A, hidden, n_critics=2, layer_norm=layer_norm)
    refs = [mlp(S + A, 1, hidden, layer_norm) for _ in range(2)]
    for m, ref in enumerate(refs):
        _copy_into_sequential(critic, m, ref)
    s, a = torch.randn(B, S), torch.randn(B, A)
    coef = torch.randn(2, B)
    q = critic(s, a)
    assert q.shape == (2, B)
    q_ref = torch.stack([ref(torch.cat([s, a], 1)).squeeze(-1) for ref in refs])
    torch.testing.assert_close(q, q_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(critic(s, a, member=1), q[1:], rtol=1e-5, atol=1e-5)
    (coef * q).sum().backward()
    (coef * q_ref).sum().backward()
    for m, ref in enumerate(refs):
        linears = [x for x in ref if isinstance(x, nn.Linear)]
        for lin, ens in zip(linears, [*critic.linears, critic.head], strict=True):
            torch.testing.assert_close(ens.weight.grad[m], lin.weight.grad, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(ens.bias.grad[m, 0], lin.bias.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_ensemble_layer_matches_baddbmm_and_gives_its_weight_gradient_in_the_weight_layout(precision):
    """The ensemble layer's own backward (weight gradient as ``grad^T @ x``) against autograd through
    ``baddbmm(bias, x, W^T)``: same outputs and gradients, in float32 and under bf16 autocast (the operands cast to
    bf16 as ``bmm`` would cast them), and a contiguous weight gradient for the optimizer step."""
    torch.manual_seed(0)
    layer = EnsembleLinear(2, 12, 16)
    x = torch.randn(8, 12, requires_grad=True)
    grad_out = torch.randn(2, 8, 16)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    with autocast:
        y = layer(x)
    gx, gw, gb = torch.autograd.grad(y.float(), (x, layer.weight, layer.bias), grad_out)
    with autocast:
        y_ref = torch.baddbmm(layer.bias, x.expand(2, 8, 12), layer.weight.transpose(1, 2))
    gx_ref, gw_ref, gb_ref = torch.autograd.grad(y_ref.float(), (x, layer.weight, layer.bias), grad_out)
    tol = {"rtol": 2e-2, "atol": 2e-2} if precision == "bf16" else {"rtol": 1e-5, "atol": 1e-5}
    assert y.dtype == torch.float32  # the bias (float32) added after the bf16 matmul
    torch.testing.assert_close(y.float(), y_ref.float(), **tol)
    for g, g_ref in ((gx, gx_ref), (gw, gw_ref), (gb, gb_ref)):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, g_ref, **tol)
    assert gw.is_contiguous() and not gw_ref.is_contiguous()


def test_sac_log_prob_matches_transformed_distribution():
    torch.manual_seed(0)
    actor = SquashedGaussianActor(5, 3, (16, 16)).double()
    state = torch.randn(64, 5, dtype=torch.float64)
    torch.manual_seed(1)
    action, log_prob = actor(state)
    torch.manual_seed(1)
    mu, log_std = actor.distribution_params(state)
    u = mu + torch.randn_like(mu) * log_std.exp()
    # change of variables by hand: log N(u) - sum log(1 - tanh(u)^2)
    by_hand = torch.distributions.Normal(mu, log_std.exp()).log_prob(u).sum(-1) - torch.log1p(
        -torch.tanh(u) ** 2
    ).sum(-1)
    torch.testing.assert_close(action, torch.tanh(u))
    torch.testing.assert_close(log_prob, by_hand, rtol=1e-8, atol=1e-8)
    # torch.distributions reference with TanhTransform (on moderate u so atanh is exact enough)
    ref = torch.distributions.TransformedDistribution(
        torch.distributions.Independent(torch.distributions.Normal(mu, log_std.exp()), 1),
        [torch.distributions.transforms.TanhTransform()],
    )
    ok = u.abs().max(-1).values < 3
    torch.testing.assert_close(log_prob[ok], ref.log_prob(torch.tanh(u))[ok], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(
        SquashedGaussianActor.log_prob_of_pre_tanh(mu, log_std, u), log_prob, rtol=1e-10, atol=1e-10
    )


def test_tanh_correction_is_stable_for_large_inputs():
    u = torch.tensor([0.0, 5.0, -20.0, 50.0], dtype=torch.float32)
    val = tanh_log_det_jacobian(u)
    assert torch.isfinite(val).all()
    torch.testing.assert_close(val[:2], torch.log1p(-torch.tanh(u[:2].double()) ** 2).float(), rtol=1e-4, atol=1e-5)
    assert val[3].item() == pytest.approx(2 * (math.log(2) - 50.0), rel=1e-6)


def test_sac_log_std_is_clamped():
    actor = SquashedGaussianActor(4, 2, (8,), log_std_min=-5.0, log_std_max=2.0)
    with torch.no_grad():
        actor.net[-1].bias.fill_(100.0)
    _, log_std = actor.distribution_params(torch.randn(3, 4))
    assert (log_std == 2.0).all()


# ---------------------------------------------------------------------------------------------- TD3 / targets
def test_td3_smoothing_noise_stays_within_clip():
    torch.manual_seed(0)
    a = torch.zeros(10000, 4)
    smoothed = smoothed_target_action(a, policy_noise=1.0, noise_clip=0.5)
    assert smoothed.abs().max().item() <= 0.5
    assert smoothed.abs().max().item() == pytest.approx(0.5)  # the clip is reached with std 1
    near_edge = smoothed_target_action(torch.full((1000, 4), 0.9), 0.2, 0.5)
    assert near_edge.max().item() <= 1.0 and near_edge.min().item() >= 0.4 - 1e-6
    assert smoothed_target_action(a, 0.2, 0.5).std().item() == pytest.approx(0.2, rel=0.1)


def test_td_target_shapes_and_clip():
    B = 8
    r, d, t, q = torch.full((B,), -1.0), torch.full((B,), 0.9), torch.zeros(B), torch.full((B,), -100.0)
    t[0] = 1.0
    y = td_target(r, d, t, q, (-50.0, 0.0))
    assert y.shape == (B,)
    assert y[0].item() == -1.0 and (y[1:] == -50.0).all()
    with pytest.raises(AssertionError):
        td_target(r, d, t, q.unsqueeze(1), None)  # [B, 1] vs [B] would broadcast to [B, B]


@pytest.mark.parametrize("algo", ALGOS)
def test_column_shaped_batch_fields_give_same_update(algo):
    batch = make_batch(16)
    col = SimpleNamespace(**vars(batch))
    for k in ("reward", "discount", "terminated", "weight"):
        setattr(col, k, getattr(batch, k)[:, None])
    metrics = []
    for b in (batch, col):
        torch.manual_seed(0)
        agent = make_agent(algo, OBS, GOAL, ACT, **SMALL)
        metrics.append(agent.update(b))
    assert metrics[1]["td_error"].shape == (16,)
    assert metrics[0]["critic_loss"] == metrics[1]["critic_loss"]


# ---------------------------------------------------------------------------------------------- updates
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("algo", ALGOS)
def test_update_reduces_critic_loss_on_fixed_target(algo, precision):
    torch.manual_seed(0)
    agent = make_agent(algo, OBS, GOAL, ACT, critic_lr=3e-3, precision=precision, **SMALL)
    batch = make_batch(64, terminated=True)  # y = r exactly: a fixed regression target
    agent.update_normalizer(batch.observation, batch.desired_goal)
    first = agent.update(batch)
    for _ in range(300):
        last = agent.update(batch)
    assert last["critic_loss"] < 0.1 * first["critic_loss"]
    expected = {"critic_loss", "actor_loss", "q_mean", "td_error"}
    if algo in STOCHASTIC:
        expected |= {"alpha", "entropy"}
    assert set(last) == expected
    assert last["td_error"].dtype == np.float32 and last["td_error"].shape == (64,)
    assert all(isinstance(v, float) for k, v in last.items() if k != "td_error")
    assert agent.num_updates == 301


@pytest.mark.parametrize("layer_norm", [False, True])
@pytest.mark.parametrize("algo", ALGOS)
def test_bf16_update_is_mixed_precision_with_float32_state(algo, layer_norm):
    batch = make_batch(32)
    first = {}
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        agent = make_agent(algo, OBS, GOAL, ACT, precision=precision, layer_norm=layer_norm, **SMALL)
        agent.update_normalizer(batch.observation, batch.desired_goal)
        first[precision] = agent.update(batch)
        agent.update(batch)  # TD3: the delayed actor step
    assert not torch.is_autocast_enabled("cpu")
    m, ref = first["bf16"], first["fp32"]
    assert m["td_error"].dtype == np.float32 and m["td_error"].shape == (32,)
    # same initial weights: bf16 matmuls change the numbers by rounding only
    assert m["critic_loss"] != ref["critic_loss"]
    assert m["critic_loss"] == pytest.approx(ref["critic_loss"], rel=0.05, abs=1e-3)
    np.testing.assert_allclose(m["td_error"], ref["td_error"], atol=0.05)
    # parameters, gradients and optimizer state stay float32
    modules = [v for v in agent._checkpoint_items().values() if isinstance(v, nn.Module)]
    assert all(p.dtype == torch.float32 for mod in modules for p in mod.parameters())
    assert all(p.grad is None or p.grad.dtype == torch.float32 for mod in modules for p in mod.parameters())
    optims = [v for v in agent._checkpoint_items().values() if isinstance(v, torch.optim.Optimizer)]
    states = [t for o in optims for st in o.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
    assert states and all(t.dtype == torch.float32 for t in states)
    assert agent.act(batch.observation, batch.desired_goal, deterministic=True).dtype == np.float32


def test_precision_is_validated():
    with pytest.raises(ValueError, match=r"precision must be one of \['fp32', 'bf16', 'auto'\], got 'fp16'"):
        make_agent("ddpg", OBS, GOAL, ACT, precision="fp16")
    assert make_agent("sac", OBS, GOAL, ACT, precision="bf16", **SMALL).config.precision == "bf16"


@pytest.mark.parametrize("native", [True, False])
def test_auto_precision_is_bf16_only_where_the_device_has_native_bf16(monkeypatch, native):
    import her_agents.algos.device as device

    monkeypatch.setattr(device, "native_bf16", lambda device: native)
    agent = make_agent("ddpg", OBS, GOAL, ACT, precision="auto", **SMALL)
    assert agent.config.precision == "auto"  # the config keeps what was asked (checkpoints resume anywhere)
    assert agent.precision == ("bf16" if native else "fp32")
    assert make_agent("ddpg", OBS, GOAL, ACT, precision="fp32", **SMALL).precision == "fp32"
    assert make_agent("ddpg", OBS, GOAL, ACT, precision="bf16", **SMALL).precision == "bf16"


@pytest.mark.parametrize("algo", ALGOS)
def test_update_accepts_torch_tensors_and_mappings(algo):
    batch = make_batch(16)
    as_torch = SimpleNamespace(**{k: torch.as_tensor(v) for k, v in vars(batch).items()})
    no_weight = {k: v for k, v in vars(batch).items() if k != "weight"}
    results = []
    for b in (batch, as_torch, no_weight):
        torch.manual_seed(0)
        agent = make_agent(algo, OBS, GOAL, ACT, **SMALL)
        results.append(agent.update(b))
    for r in results[1:]:
        assert r["critic_loss"] == results[0]["critic_loss"]
        np.testing.assert_array_equal(r["td_error"], results[0]["td_error"])


def test_td3_delays_the_actor():
    torch.manual_seed(0)
    agent = TD3Agent(OBS, GOAL, ACT, TD3Config(hidden=(16,), policy_delay=2), device="cpu")
    before = [p.detach().clone() for p in agent.actor.parameters()]
    target_before = [p.detach().clone() for p in agent.critic_target.parameters()]
    batch = make_batch(8)
    agent.update(batch)
    assert all(torch.equal(a, b) for a, b in zip(before, agent.actor.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(target_before, agent.critic_target.parameters()))
    agent.update(batch)
    assert not all(torch.equal(a, b) for a, b in zip(before, agent.actor.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(target_before, agent.critic_target.parameters()))


def test_polyak_target_update():
    agent = DDPGAgent(OBS, GOAL, ACT, DDPGConfig(hidden=(8,), polyak=0.9), device="cpu")
    with torch.no_grad():
        for p in agent.actor.parameters():
            p.fill_(1.0)
        for p in agent.actor_target.parameters():
            p.fill_(0.0)
    agent.update_targets()
    for p in agent.actor_target.parameters():
        torch.testing.assert_close(p, torch.full_like(p, 0.1))


def test_sac_fixed_alpha_and_autotune():
    batch = make_batch(16)
    fixed = SACAgent(OBS, GOAL, ACT, SACConfig(hidden=(16,), autotune=False, alpha=0.05), device="cpu")
    for _ in range(3):
        m = fixed.update(batch)
    assert m["alpha"] == pytest.approx(0.05)
    tuned = SACAgent(OBS, GOAL, ACT, SACConfig(hidden=(16,), alpha=0.5), device="cpu")
    for _ in range(3):
        tuned.update(batch)
    assert tuned.alpha != pytest.approx(0.5)
    assert tuned.target_entropy == -ACT



def _quantile_huber_by_loops(z: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    """The quantile Huber loss written out term by term (Dabney et al. 2018, Eq. 9-10, kappa = 1)."""
    n, batch, m = z.shape
    total = 0.0
    for i in range(n):
        per_critic = 0.0
        for b in range(batch):
            terms = []
            for j in range(m):
                tau = (2 * j + 1) / (2 * m)
                for target in y[b]:
                    u = target - z[i, b, j]
                    huber = 0.5 * u * u if abs(u) <= 1 else abs(u) - 0.5
                    terms.append(abs(tau - (u < 0)) * huber)
            per_critic += w[b] * np.mean(terms)
        total += per_critic / batch
    return total


def test_quantile_huber_loss_matches_the_term_by_term_sum():
    rng = np.random.default_rng(0)
    z = rng.normal(scale=2.0, size=(2, 5, 4)).astype(np.float32)  # |u| on both sides of kappa = 1
    y = rng.normal(scale=2.0, size=(5, 6)).astype(np.float32)
    w = rng.uniform(0.2, 1.5, size=5).astype(np.float32)
    got = quantile_huber_loss(torch.as_tensor(z), torch.as_tensor(y), torch.as_tensor(w)).item()
    assert got == pytest.approx(_quantile_huber_by_loops(z, y, w), rel=1e-5)


@pytest.mark.parametrize("clipped", [True, False])
def test_td3_target_is_the_min_or_the_mean_over_target_critics(clipped):
    """``clipped_double_q``: the TD target bootstraps from the minimum over the target critics (TD3), or from their
    mean; the loss and TD errors of :meth:`TD3Agent.critic_loss` against a target computed by hand."""
    torch.manual_seed(0)
    batch_size = 8
    agent = TD3Agent(OBS, GOAL, ACT, TD3Config(hidden=(16,), n_critics=3, policy_noise=0.0, clipped_double_q=clipped,
                                               q_clip=(-50.0, 0.0)), device="cpu")
    batch = make_batch(batch_size)
    agent.update_normalizer(batch.observation, batch.desired_goal)
    b = agent.batch_to_tensors(batch)
    state = agent.preprocess(b.observation, b.desired_goal)
    next_qs = -torch.rand(3, batch_size) * 10
    agent.critic_target = lambda s, a: next_qs
    loss, q, td_error = agent.critic_loss(b, state)
    bootstrap = next_qs.min(0).values if clipped else next_qs.mean(0)
    y = (b.reward + b.discount * (1 - b.terminated) * bootstrap).clamp(-50.0, 0.0)
    z = agent.critic(state, b.action).detach()
    torch.testing.assert_close(q, z)
    assert loss.item() == pytest.approx((b.weight * (z - y).square()).mean(1).sum().item(), rel=1e-5)
    torch.testing.assert_close(td_error, (y - z).abs().mean(0))


def test_tqc_target_drops_the_largest_pooled_atoms():
    """The critic loss of :meth:`TQCAgent.critic_loss` against atoms computed by hand: the target critics' atoms
    pooled over critics, sorted, the top ``d * N`` dropped, then ``r + discount * (z - alpha log pi)``, clipped."""
    torch.manual_seed(0)
    n, m, d, batch_size = 2, 5, 2, 8
    agent = TQCAgent(OBS, GOAL, ACT, TQCConfig(hidden=(16,), n_critics=n, n_quantiles=m,
                                               top_quantiles_to_drop_per_net=d, q_clip=(-3.0, 0.0)), device="cpu")
    batch = make_batch(batch_size)
    agent.update_normalizer(batch.observation, batch.desired_goal)
    b = agent.batch_to_tensors(batch)
    state = agent.preprocess(b.observation, b.desired_goal)
    atoms = torch.randn(n, batch_size, m) * 2 - 1
    log_prob = torch.randn(batch_size)
    agent.critic_target = lambda s, a: atoms
    agent.actor = lambda s: (torch.zeros(s.shape[0], ACT), log_prob)
    alpha = torch.tensor(0.3)
    loss, _, _, td_error = agent.critic_loss(b, state, alpha)

    expected_y = []
    for j in range(batch_size):
        pooled = np.sort(atoms[:, j, :].numpy().ravel())[: n * (m - d)]
        y = b.reward[j].item() + b.discount[j].item() * (pooled - 0.3 * log_prob[j].item())
        expected_y.append(np.clip(y, -3.0, 0.0))
    expected_y = np.asarray(expected_y, np.float32)
    z = agent.critic(state, b.action).detach().numpy()
    assert loss.item() == pytest.approx(_quantile_huber_by_loops(z, expected_y, batch.weight), rel=1e-5)
    np.testing.assert_allclose(td_error.numpy(), np.abs(expected_y.mean(1)[None] - z.mean(2)).mean(0), rtol=1e-5)


def test_tqc_actor_maximizes_the_mean_of_all_atoms_and_options_are_checked():
    agent = make_agent("tqc", OBS, GOAL, ACT, n_quantiles=7, **SMALL)
    state, action = torch.randn(4, OBS + GOAL), torch.rand(4, ACT) * 2 - 1
    z = agent.critic(state, action)
    assert z.shape == (2, 4, 7)
    torch.testing.assert_close(agent._actor_value(state, action), z.mean(dim=(0, 2)))
    with pytest.raises(ValueError, match=r"top_quantiles_to_drop_per_net must be >= 0 and < n_quantiles, got 7"):
        make_agent("tqc", OBS, GOAL, ACT, n_quantiles=7, top_quantiles_to_drop_per_net=7)
    with pytest.raises(ValueError, match="n_quantiles must be >= 1"):
        make_agent("tqc", OBS, GOAL, ACT, n_quantiles=0)


@pytest.mark.parametrize("compile_", [False, True])
def test_tqc_with_one_quantile_per_critic_updates(compile_):
    """``n_quantiles=1`` (documented as valid): each critic's one atom keeps its quantile axis, and the update runs
    (it was an AssertionError at the first update)."""
    agent = make_agent("tqc", OBS, GOAL, ACT, n_quantiles=1, top_quantiles_to_drop_per_net=0, compile=compile_,
                       **SMALL)
    state, action = torch.randn(4, OBS + GOAL), torch.rand(4, ACT) * 2 - 1
    assert agent.critic(state, action).shape == (2, 4, 1)
    batch = make_batch(16)
    agent.update_normalizer(batch.observation, batch.desired_goal)
    for _ in range(2):
        m = agent.update(batch)
    assert all(math.isfinite(float(v)) for k, v in m.items() if k != "td_error")
    assert m["td_error"].shape == (16,)

# ---------------------------------------------------------------------------------------------- checkpoints
def trained_with_state(algo: str, n_updates: int) -> tuple[Any, Any, dict]:
    """A small agent of ``algo`` after ``n_updates`` updates on one batch, that batch, and its state dict
    through a pickle round trip (as a checkpoint holds it)."""
    torch.manual_seed(0)
    agent = make_agent(algo, OBS, GOAL, ACT, **SMALL)
    batch = make_batch(16)
    agent.update_normalizer(batch.observation * 3 + 1, batch.desired_goal)
    for _ in range(n_updates):
        agent.update(batch)
    return agent, batch, pickle.loads(pickle.dumps(agent.state_dict()))


@pytest.mark.parametrize("algo", ALGOS)
def test_state_dict_round_trip(algo):
    agent, batch, state = trained_with_state(algo, 3)
    torch.manual_seed(123)
    clone = make_agent(algo, OBS, GOAL, ACT, **SMALL)
    clone.load_state_dict(state)
    assert clone.num_updates == 3
    np.testing.assert_array_equal(
        clone.act(batch.observation, batch.desired_goal, deterministic=True),
        agent.act(batch.observation, batch.desired_goal, deterministic=True),
    )
    # exploration rng restored too
    np.testing.assert_array_equal(
        clone.act(batch.observation, batch.desired_goal, deterministic=algo in STOCHASTIC),
        agent.act(batch.observation, batch.desired_goal, deterministic=algo in STOCHASTIC),
    )
    # optimizers restored: one more update stays identical
    results = []
    for a in (agent, clone):
        torch.manual_seed(7)
        results.append(a.update(batch))
    assert results[0]["critic_loss"] == results[1]["critic_loss"]
    for p, q in zip(agent.critic.parameters(), clone.critic.parameters()):
        assert torch.equal(p, q)


@pytest.mark.parametrize("algo", ALGOS)
def test_loaded_state_keeps_the_configs_learning_rates_weight_decay_and_normalizer_settings(algo):
    """A state saved at one set of settings, loaded into an agent built with others (a run resumed with
    ``agent.critic_lr=...``): the optimizers' param groups and the normalizers keep the loading agent's settings,
    the Adam moments and statistics are the state's (the settings of the saved groups were loaded before)."""
    agent, batch, state = trained_with_state(algo, 2)
    lrs = {"actor_lr": 2e-4, "critic_lr": 3e-4, **({"alpha_lr": 5e-5} if algo in STOCHASTIC else {})}
    other = make_agent(algo, OBS, GOAL, ACT, **lrs, actor_weight_decay=0.01, critic_weight_decay=0.02,
                       norm_eps=0.05, norm_clip_obs=50.0, norm_clip_range=3.0, **SMALL)
    other.load_state_dict(state)
    want = {"actor_optim": (2e-4, 0.01), "critic_optim": (3e-4, 0.02), "alpha_optim": (5e-5, 0.0)}
    assert other.optimizers().keys() == agent.optimizers().keys()
    for name, opt in other.optimizers().items():
        (group,) = opt.param_groups
        lr, decay = want[name]
        assert (group["lr"], group["weight_decay"], group["decoupled_weight_decay"]) == (lr, decay, bool(decay)), name
        for p, q in zip(opt.param_groups[0]["params"], agent.optimizers()[name].param_groups[0]["params"]):
            torch.testing.assert_close(opt.state[p]["exp_avg"], agent.optimizers()[name].state[q]["exp_avg"])
    for name in ("obs_normalizer", "goal_normalizer"):
        norm, saved = getattr(other, name), getattr(agent, name)
        assert (norm.eps, norm.clip_obs, norm.clip_range) == (0.05, 50.0, 3.0)
        np.testing.assert_array_equal(norm.mean, saved.mean)
    assert other.update(batch)["critic_loss"] > 0  # the loaded state trains on at its own settings


def test_loaded_sac_state_keeps_a_learned_temperature_unless_the_config_fixes_or_changes_it():
    batch = make_batch(16)
    agent = make_agent("sac", OBS, GOAL, ACT, alpha=0.2, alpha_lr=0.05, **SMALL)
    for _ in range(3):
        agent.update(batch)
    learned = agent.alpha
    assert learned != pytest.approx(0.2)
    state = agent.state_dict()
    for kwargs, alpha in (({"alpha": 0.2}, learned),  # autotune, same alpha: the learned temperature goes on
                          ({"alpha": 0.05}, 0.05),  # autotune, another alpha (a resume with agent.alpha=0.05)
                          ({"alpha": 0.2, "autotune": False}, 0.2)):  # a fixed temperature is the config's
        other = make_agent("sac", OBS, GOAL, ACT, **kwargs, **SMALL)
        other.load_state_dict(state)
        assert other.alpha == pytest.approx(alpha), kwargs


@pytest.mark.parametrize("algo", ALGOS)
def test_agent_protocol_networks_optimizers_and_policy_state(algo):
    """What the loop, the data-parallel wrapper and the actor-learner use: the ``Agent`` protocol, the networks
    and optimizers by name, and the policy state an actor loads (acting identically afterwards)."""
    from her_agents.distributed.data_parallel import DataParallelAgent

    agent = make_agent(algo, OBS, GOAL, ACT, **SMALL)
    assert isinstance(agent, Agent) and isinstance(DataParallelAgent(agent, {}), Agent)
    nets, opts = agent.networks(), agent.optimizers()
    assert "actor" in nets and "critic" in nets and all(isinstance(m, nn.Module) for m in nets.values())
    assert opts and all(isinstance(o, torch.optim.Optimizer) for o in opts.values())
    batch = make_batch(16)
    agent.update_normalizer(batch.observation * 3 + 1, batch.desired_goal)
    agent.update(batch)
    policy = pickle.loads(pickle.dumps(agent.policy_state_dict()))
    assert all(t.device.type == "cpu" for t in policy["actor"].values())
    actor = make_agent(algo, OBS, GOAL, ACT, seed=5, **SMALL)
    actor.load_policy_state_dict(policy)
    np.testing.assert_array_equal(actor.act(batch.observation, batch.desired_goal, deterministic=True),
                                  agent.act(batch.observation, batch.desired_goal, deterministic=True))


NEEDS_CXX = pytest.mark.skipif(not any(shutil.which(c) for c in ("g++", "c++", "clang++")),
                               reason="torch.compile on a CPU needs a C++ compiler (none on PATH)")


@NEEDS_CXX
@pytest.mark.parametrize("algo, whole, extra", [
    ("ddpg", True, {}),
    ("ddpg", False, {}),  # the optimizer steps outside the graph, as under data-parallel training
    ("td3", True, {"policy_noise": 0.0, "policy_delay": 2}),  # twin critics, an update without an actor step
    ("ddpg", True, {"actor_weight_decay": 0.5, "critic_weight_decay": 2.0}),  # AdamW's decay in the graph
    # REDQ's subset of 2 of 3 target critics; a reset of the output layers after update 2, so that update 3 steps
    # parameters of different Adam step counts (adam_step's same_steps=False)
    ("td3", True, {"policy_noise": 0.0, "policy_delay": 1, "n_critics": 3, "target_subset": 2, "reset_every": 2}),
])
def test_compiled_update_matches_eager_and_keeps_checkpoint_keys(algo, whole, extra):
    """agent.compile (no sampling noise in the update): the same initial weights give the same losses, TD errors,
    weights and Adam state after three updates as eager, and the state dict has the eager agent's keys. On the CPU
    the whole update is one graph (losses, gradients, Adam steps, polyak); with ``whole_update_ok`` off the
    optimizer steps run outside it (``optimizer.step()``, as data-parallel training needs)."""
    batch = make_batch(32)
    agents, metrics = {}, {}
    for compiled in (False, True):
        torch.manual_seed(0)
        agent = make_agent(algo, OBS, GOAL, ACT, compile=compiled, layer_norm=True, **extra, **SMALL)
        agent.whole_update_ok = whole
        agent.update_normalizer(batch.observation, batch.desired_goal)
        metrics[compiled] = [agent.update(batch) for _ in range(3)]
        agents[compiled] = agent
    fast = agents[True]
    assert fast.compiled(fast.train_step).compiled_ok is True
    for eager, comp in zip(metrics[False], metrics[True]):
        assert comp.keys() == eager.keys()
        for k in ("critic_loss", "actor_loss", "q_mean"):
            assert comp[k] == pytest.approx(eager[k], rel=1e-4, abs=1e-6), k
        np.testing.assert_allclose(comp["td_error"], eager["td_error"], rtol=1e-4, atol=1e-5)
    assert agents[True].state_dict().keys() == agents[False].state_dict().keys()
    for name, net in agents[True].networks().items():
        ref = agents[False].networks()[name].state_dict()
        assert net.state_dict().keys() == ref.keys()
        for k, t in net.state_dict().items():
            torch.testing.assert_close(t, ref[k], rtol=1e-4, atol=1e-5)
    for name, opt in agents[True].optimizers().items():  # torch.optim.Adam's state, so checkpoints are unchanged
        ref = agents[False].optimizers()[name].state_dict()
        got = opt.state_dict()
        assert got["state"].keys() == ref["state"].keys() and got["param_groups"] == ref["param_groups"]
        for i, st in got["state"].items():
            assert st.keys() == ref["state"][i].keys()
            for k, t in st.items():
                torch.testing.assert_close(t, ref["state"][i][k], rtol=1e-4, atol=1e-6)
    pickle.dumps(agents[True])  # the compiled functions are a cache, left out of pickles


@NEEDS_CXX
@pytest.mark.parametrize("algo, extra", [("ddpg", {}), ("td3", {"policy_noise": 0.0, "policy_delay": 2})])
def test_compiled_update_skips_guards_and_follows_a_loaded_state(algo, extra):
    """Once compiled, the whole update runs with Dynamo's guard checks skipped; loading another agent's state into
    the warm agent (new Adam state tensors, new normalizer statistics) must still drive the next updates, as an
    eager agent that loaded the same state computes them."""
    batch, other_batch = make_batch(32), make_batch(32, seed=1)
    torch.manual_seed(0)
    warm = make_agent(algo, OBS, GOAL, ACT, compile=True, layer_norm=True, **extra, **SMALL)
    warm.update_normalizer(batch.observation, batch.desired_goal)
    for _ in range(4):
        warm.update(batch)
    assert warm.compiled(warm.train_step).skip_guards and warm.compiled(warm.train_step).compiled_ok
    source = make_agent(algo, OBS, GOAL, ACT, layer_norm=True, **extra, **SMALL)
    source.update_normalizer(other_batch.observation, other_batch.desired_goal)
    for _ in range(3):
        source.update(other_batch)
    state = source.state_dict()
    eager = make_agent(algo, OBS, GOAL, ACT, layer_norm=True, **extra, **SMALL)
    eager.load_state_dict(copy.deepcopy(state))
    warm.load_state_dict(copy.deepcopy(state))
    for _ in range(3):
        got, ref = warm.update(batch), eager.update(batch)
        assert got["critic_loss"] == pytest.approx(ref["critic_loss"], rel=1e-4, abs=1e-6)
    for name, net in warm.networks().items():
        for k, t in net.state_dict().items():
            torch.testing.assert_close(t, eager.networks()[name].state_dict()[k], rtol=1e-4, atol=1e-5)


@NEEDS_CXX
@pytest.mark.parametrize("algo", ALGOS)
def test_many_compiled_agents_in_one_process(algo):
    """Ten compiled agents of one algorithm, one after the other in one process (as ``her-tune``'s trials): each
    compiles its own update, freed agents' variants do not count against Dynamo's ``recompile_limit`` (8) on the
    ``train_step`` the agents share, and the guard-skipping calls of the later agents run (they raised
    "Recompilation triggered with skip_guard_eval_unsafe stance" from the 5th DDPG/TD3 agent on)."""
    extra = {"policy_delay": 2} if algo == "td3" else {}
    for i in range(10):
        agent = make_agent(algo, OBS, GOAL, ACT, compile=True, hidden=(16,), device="cpu", seed=i, **extra)
        for k in range(4):  # TD3: with and without the actor step, each twice (the second call skips guards)
            metrics = agent.update(make_batch(32, seed=k))
        step = agent.compiled(agent.train_step)
        assert step.compiled_ok and step.skip_guards, i
        assert np.isfinite(metrics["critic_loss"])
        del agent, step
        gc.collect()  # freed as a finished trial's agent is


@NEEDS_CXX
def test_compiled_agent_past_the_recompile_limit_checks_every_guard():
    """An agent whose update reaches Dynamo's ``recompile_limit`` (lowered to 1 here: TD3's update without and
    with the actor step are two variants) runs the variant left without a compiled entry eagerly, checking every
    guard from then on: a guard-skipping call would run the other variant's graph in its place (the actor would
    not move in its steps)."""
    agent = make_agent("td3", OBS, GOAL, ACT, compile=True, hidden=(16,), device="cpu", policy_delay=2)
    with torch._dynamo.config.patch(recompile_limit=1):  # (pytest's monkeypatch deletes a config key on undo)
        for k in range(6):
            before = [p.detach().clone() for p in agent.actor.parameters()]
            agent.update(make_batch(32, seed=k))
            moved = any(not torch.equal(b, p) for b, p in zip(before, agent.actor.parameters()))
            assert moved == (agent.num_updates % 2 == 0), agent.num_updates  # the actor steps every second update
    step = agent.compiled(agent.train_step)
    assert step.compiled_ok and not step.skip_guards


@NEEDS_CXX
def test_compiled_sac_learns_a_fixed_target_in_bf16():
    torch.manual_seed(0)
    agent = make_agent("sac", OBS, GOAL, ACT, compile=True, precision="bf16", layer_norm=True, critic_lr=3e-3,
                       **SMALL)
    batch = make_batch(64, terminated=True)  # y = r: a fixed regression target
    agent.update_normalizer(batch.observation, batch.desired_goal)
    first = agent.update(batch)
    for _ in range(200):
        last = agent.update(batch)
    assert agent.compiled(agent.train_step).compiled_ok
    assert last["critic_loss"] < 0.1 * first["critic_loss"]
    assert np.isfinite(last["actor_loss"]) and last["td_error"].dtype == np.float32


def test_compile_failure_falls_back_to_eager_with_one_warning(monkeypatch):
    def failing_compile(fn, **kwargs):
        def run(*args, **kw):
            raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found\nsecond line")
        return run

    monkeypatch.setattr(torch, "compile", failing_compile)
    batch = make_batch(16)
    torch.manual_seed(0)
    agent = make_agent("ddpg", OBS, GOAL, ACT, compile=True, **SMALL)
    with pytest.warns(RuntimeWarning) as record:
        first = agent.update(batch)
    assert [str(w.message) for w in record] == [  # one warning: the actor loss then runs eagerly without trying
        "agent.compile: torch.compile of DDPGAgent.train_step failed, the update runs eagerly "
        "(RuntimeError: InvalidCxxCompiler: No working C++ compiler found)"
    ]
    torch.manual_seed(0)
    eager = make_agent("ddpg", OBS, GOAL, ACT, **SMALL)
    assert first["critic_loss"] == eager.update(batch)["critic_loss"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        agent.update(batch)  # warned once, then eager for good
    assert agent.compiled(agent.train_step).compiled_ok is False



def test_whole_update_without_a_working_cpp_wrapper_compiles_without_it(monkeypatch):
    """On a CPU the whole update asks Inductor for its C++ wrapper; where that compile fails (e.g. no Python
    headers), it is compiled once more without the wrapper, silently, and does not fall back to eager."""
    calls = []

    def compile_without_cpp_wrapper(fn, **kwargs):
        calls.append(kwargs.get("options", {}).get("cpp_wrapper", False))
        if calls[-1]:
            def run(*args, **kw):
                raise RuntimeError("fatal error: Python.h: No such file or directory")
            return run
        return fn  # stands in for a compiled function that works

    monkeypatch.setattr(torch, "compile", compile_without_cpp_wrapper)
    batch = make_batch(16)
    agent = make_agent("ddpg", OBS, GOAL, ACT, compile=True, **SMALL)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        agent.update(batch)
        agent.update(batch)
    whole = agent.compiled(agent.train_step)
    assert calls == [True, False] and whole.compiled_ok is True and whole.cpp_wrapper is False

def test_td3_checkpoint_keeps_the_actor_loss_reported_between_delayed_steps():
    agent = make_agent("td3", OBS, GOAL, ACT, **SMALL)
    batch = make_batch(16)
    for _ in range(2):  # the second update does the delayed actor step
        agent.update(batch)
    clone = make_agent("td3", OBS, GOAL, ACT, **SMALL)
    clone.load_state_dict(pickle.loads(pickle.dumps(agent.state_dict())))
    results = []
    for a in (agent, clone):
        torch.manual_seed(7)
        results.append(a.update(batch))  # no actor step: reports the last actor loss
    assert results[0]["actor_loss"] == results[1]["actor_loss"] != 0.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("algo", ALGOS)
def test_cuda_update_act_and_checkpoint(algo):
    agent = make_agent(algo, OBS, GOAL, ACT, hidden=(32, 32), device="cuda")
    batch = make_batch(16)
    agent.update_normalizer(batch.observation, batch.desired_goal)
    metrics = agent.update(batch)
    assert metrics["td_error"].shape == (16,) and np.isfinite(metrics["critic_loss"])
    as_cuda = SimpleNamespace(**{k: torch.as_tensor(v, device="cuda") for k, v in vars(batch).items()})
    agent.update(as_cuda)
    actions = agent.act(batch.observation, batch.desired_goal)
    assert actions.shape == (16, ACT) and np.abs(actions).max() <= 1.0
    cpu_clone = make_agent(algo, OBS, GOAL, ACT, hidden=(32, 32), device="cpu")
    cpu_clone.load_state_dict(agent.state_dict())
    np.testing.assert_allclose(
        cpu_clone.act(batch.observation, batch.desired_goal, deterministic=True),
        agent.act(batch.observation, batch.desired_goal, deterministic=True),
        atol=1e-4,
    )


# ---------------------------------------------------------------------------------------------- factory
def test_make_agent_rejects_bad_names():
    with pytest.raises(ValueError, match="valid algos.*ddpg"):
        make_agent("ppo", OBS, GOAL, ACT)
    with pytest.raises(ValueError) as info:
        make_agent("td3", OBS, GOAL, ACT, lr=1e-3, bogus=1)
    msg = str(info.value)
    assert "bogus" in msg and "'lr'" in msg and "actor_lr" in msg and "policy_delay" in msg
    with pytest.raises(ValueError, match="alpha"):
        make_agent("ddpg", OBS, GOAL, ACT, alpha=0.1)


def test_make_agent_builds_each_algo_with_options():
    assert isinstance(make_agent("DDPG", OBS, GOAL, ACT, device="cpu"), DDPGAgent)
    td3 = make_agent("td3", OBS, GOAL, ACT, hidden=[16, 16], q_clip=[-10, 0], device="cpu", n_threads=None)
    assert td3.config.hidden == (16, 16) and td3.config.q_clip == (-10.0, 0.0)
    sac = make_agent("sac", OBS, GOAL, ACT, device="cpu", autotune=False)
    assert isinstance(sac, SACAgent) and isinstance(sac, Agent) and isinstance(sac, GoalConditionedAgentBase)


def test_device_and_threads():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    old = torch.get_num_threads()
    try:
        make_agent("ddpg", OBS, GOAL, ACT, hidden=(8,), device="cpu", n_threads=1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(old)


# ---------------------------------------------------------------------------------------------- exploration
def test_exploration_noise_stays_in_bounds():
    agent = make_agent("td3", OBS, GOAL, ACT, noise_std=5.0, random_eps=0.0, seed=0, **SMALL)
    obs, goal = np.random.default_rng(0).normal(size=(500, OBS)), np.zeros((500, GOAL))
    actions = agent.act(obs, goal)
    assert actions.shape == (500, ACT) and actions.dtype == np.float32
    assert actions.min() >= -1.0 and actions.max() <= 1.0
    assert (np.abs(actions) == 1.0).mean() > 0.5  # big noise saturates at the bounds
    single = agent.act(obs[0], goal[0], deterministic=True)
    assert single.shape == (ACT,)


def test_random_eps_one_gives_uniform_actions():
    agent = make_agent("ddpg", OBS, GOAL, ACT, noise_std=0.0, random_eps=1.0, seed=0, **SMALL)
    obs, goal = np.zeros((4000, OBS)), np.zeros((4000, GOAL))
    actions = agent.act(obs, goal)
    for j in range(ACT):
        assert stats.kstest(actions[:, j], stats.uniform(loc=-1, scale=2).cdf).pvalue > 1e-3
    # deterministic acting ignores exploration; no exploration equals the deterministic action
    quiet = make_agent("ddpg", OBS, GOAL, ACT, noise_std=0.0, random_eps=0.0, **SMALL)
    np.testing.assert_array_equal(quiet.act(obs[:5], goal[:5]), quiet.act(obs[:5], goal[:5], True))


def test_random_eps_is_per_row():
    agent = make_agent("ddpg", OBS, GOAL, ACT, noise_std=0.0, random_eps=0.3, seed=0, **SMALL)
    obs, goal = np.zeros((2000, OBS)), np.zeros((2000, GOAL))
    det = agent.act(obs, goal, deterministic=True)
    replaced = np.any(agent.act(obs, goal) != det, axis=1)
    assert replaced.mean() == pytest.approx(0.3, abs=0.05)


@pytest.mark.parametrize("layer_norm", [False, True])
@pytest.mark.parametrize("algo", ALGOS)
def test_numpy_acting_equals_the_torch_policy_after_updates_and_loads(algo, layer_norm):
    torch.manual_seed(0)
    agent = make_agent(algo, OBS, GOAL, ACT, layer_norm=layer_norm, **SMALL)
    batch = make_batch(64)
    agent.update_normalizer(batch.observation * 3 + 1, batch.desired_goal * 250)  # some goals past clip_obs
    obs, goal = batch.observation * 3 + 1, batch.desired_goal * 250

    def torch_policy() -> np.ndarray:
        with torch.no_grad():
            state = agent.preprocess(torch.as_tensor(obs), torch.as_tensor(goal, dtype=torch.float32))
            return agent._policy(state, deterministic=True).numpy()

    assert agent.numpy_actor() is not None  # the CPU path under test
    np.testing.assert_allclose(agent.act(obs, goal, deterministic=True), torch_policy(), atol=2e-6)
    for _ in range(3):  # in-place optimizer steps are seen through the parameter views
        agent.update(batch)
    np.testing.assert_allclose(agent.act(obs, goal, deterministic=True), torch_policy(), atol=2e-6)
    torch.manual_seed(5)
    agent.load_state_dict(make_agent(algo, OBS, GOAL, ACT, layer_norm=layer_norm, **SMALL).state_dict())
    np.testing.assert_allclose(agent.act(obs, goal, deterministic=True), torch_policy(), atol=2e-6)
    if algo == "sac":  # the stochastic action: tanh(mu + std * noise), not the mean
        quiet = make_agent("sac", OBS, GOAL, ACT, noise_std=0.0, random_eps=0.0, seed=0, **SMALL)
        sampled = quiet.act(np.repeat(obs[:1], 2000, 0), np.repeat(goal[:1], 2000, 0))
        assert sampled.std(0).min() > 1e-3 and np.abs(sampled).max() <= 1.0


@pytest.mark.parametrize("algo", ALGOS)
def test_acting_agents_deep_copy_and_pickle_with_their_own_weights(algo):
    import copy

    agent = make_agent(algo, OBS, GOAL, ACT, **SMALL)
    batch = make_batch(8)
    before = agent.act(batch.observation, batch.desired_goal, deterministic=True)  # builds the numpy views
    clone = copy.deepcopy(agent)
    with torch.no_grad():
        for p in clone.actor.parameters():
            p.add_(0.5)
    np.testing.assert_array_equal(agent.act(batch.observation, batch.desired_goal, deterministic=True), before)
    with torch.no_grad():
        state = clone.preprocess(torch.as_tensor(batch.observation), torch.as_tensor(batch.desired_goal))
        expected = clone._policy(state, deterministic=True).numpy()
    np.testing.assert_allclose(clone.act(batch.observation, batch.desired_goal, deterministic=True), expected,
                               atol=2e-6)
    restored = pickle.loads(pickle.dumps(agent))
    np.testing.assert_array_equal(restored.act(batch.observation, batch.desired_goal, deterministic=True), before)


def test_numpy_acting_follows_normalizer_clips_and_takes_tensors():
    agent = make_agent("ddpg", OBS, GOAL, ACT, **SMALL)
    batch = make_batch(16)
    agent.update_normalizer(batch.observation, batch.desired_goal)
    obs, goal = batch.observation * 10, batch.desired_goal * 10

    def torch_policy() -> np.ndarray:
        with torch.no_grad():
            return agent._policy(agent.preprocess(torch.as_tensor(obs), torch.as_tensor(goal)), True).numpy()

    np.testing.assert_allclose(agent.act(obs, goal, deterministic=True), torch_policy(), atol=2e-6)
    agent.obs_normalizer.clip_range = agent.goal_normalizer.clip_range = 0.5  # set directly, no recompute
    np.testing.assert_allclose(agent.act(obs, goal, deterministic=True), torch_policy(), atol=2e-6)
    t_obs = torch.as_tensor(obs).requires_grad_(True)
    np.testing.assert_allclose(agent.act(t_obs, torch.as_tensor(goal), deterministic=True), torch_policy(),
                               atol=2e-6)


def test_an_actor_numpy_cannot_mirror_acts_through_torch():
    agent = make_agent("td3", OBS, GOAL, ACT, **SMALL)
    agent.actor.net[1] = nn.Tanh()  # a layer numpy_mlp does not know
    batch = make_batch(8)
    assert agent.numpy_actor() is None
    with torch.no_grad():
        state = agent.preprocess(torch.as_tensor(batch.observation), torch.as_tensor(batch.desired_goal))
        expected = agent._policy(state, deterministic=True).numpy()
    np.testing.assert_allclose(agent.act(batch.observation, batch.desired_goal, deterministic=True), expected)


@pytest.mark.parametrize("algo", ALGOS)
def test_update_runs_in_train_mode_and_torch_acting_in_eval_mode(algo):
    """Online networks are in train mode for ``update`` and in eval mode for torch acting (so dropout or batch
    norm in a user's network behave); target networks always in eval mode."""
    agent = make_agent(algo, OBS, GOAL, ACT, **SMALL)
    agent.actor.dropout = nn.Dropout(0.5)  # a submodule a user's variant could add: follows its parent's mode
    agent.numpy_acting = False  # the torch acting path (the numpy mirror handles plain MLPs only)
    items = agent._checkpoint_items().items()
    online = [m for name, m in items if isinstance(m, nn.Module) and "target" not in name]
    targets = [m for name, m in items if isinstance(m, nn.Module) and "target" in name]
    assert online and targets
    agent.update(make_batch(16))
    assert all(m.training for m in online) and agent.actor.dropout.training
    assert not any(m.training for m in targets)
    agent.act(np.ones((4, OBS), np.float32), np.ones((4, GOAL), np.float32), deterministic=True)
    assert not any(m.training for m in online + targets) and not agent.actor.dropout.training
    agent.update(make_batch(16))
    assert all(m.training for m in online) and not any(m.training for m in targets)


@pytest.mark.parametrize("algo", ALGOS)
def test_an_agent_built_directly_clips_no_target_so_positive_rewards_are_learned(algo):
    """Without the training loop (which derives the clip from the env's reward range) no TD target is clipped
    unless asked: the old default [-50, 0] cut every target of a positive reward to 0."""
    assert make_agent(algo, OBS, GOAL, ACT, **SMALL).config.q_clip is None
    assert DDPGAgent(OBS, GOAL, ACT, DDPGConfig(hidden=(8,)), device="cpu").config.q_clip is None
    torch.manual_seed(0)
    agent = make_agent(algo, OBS, GOAL, ACT, critic_lr=3e-3, **SMALL)
    batch = make_batch(64, terminated=True)
    batch.reward = -batch.reward  # +1 where the first feature is negative, else 0: y = r in [0, 1]
    agent.update_normalizer(batch.observation, batch.desired_goal)
    for _ in range(150):
        last = agent.update(batch)
    assert last["q_mean"] == pytest.approx(float(batch.reward.mean()), abs=0.15), last["q_mean"]  # 0.5, not <= 0
