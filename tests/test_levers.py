"""The agent levers for many updates per env step (issue 55), each one config key, default off:

- ``agent.target_subset``: REDQ's minimum over a random subset of the target critics (Chen et al. 2021);
- ``agent.reset_every`` / ``agent.reset_layers``: periodic resets against the primacy bias (Nikishin et al. 2022);
- ``agent.actor_weight_decay`` / ``agent.critic_weight_decay``: AdamW's decoupled weight decay (Loshchilov &
  Hutter 2019), in ``her_agents.algos.compiled.adam_step`` eagerly and compiled.

Each: its config check, that it does what it says, and that a run with it stopped and resumed ends as the
uninterrupted run (FetchReach, a tiny budget). The compiled-against-eager equality of the levers is in
``tests/test_agents.py`` (``test_compiled_update_matches_eager_and_keeps_checkpoint_keys``).
"""

from __future__ import annotations

import math
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from her_agents.algos.compiled import CompiledOrEager, adam_step, init_adam_state, make_adam
from her_agents.algos.networks import EnsembleCritic, EnsembleLayerNorm
from her_agents.algos.registry import make_agent
from her_agents.config import load_config
from her_agents.loop.train import train

sys.path.insert(0, str(Path(__file__).parent))
from run_compare import killed_at_200, run_differences
from test_agents import ACT, GOAL, NEEDS_CXX, OBS, SMALL, _one_torch_thread, make_batch  # noqa: F401 (autouse fixture)


def _fed(agent, batch_size: int = 32):
    batch = make_batch(batch_size)
    agent.update_normalizer(batch.observation, batch.desired_goal)
    return batch


# ------------------------------------------------------------------------------------------------ config checks
@pytest.mark.parametrize("overrides, expect", [
    (["algo=sac", "agent.target_subset=3"],
     "agent.target_subset must be 0 (all critics) or in [1, n_critics] (n_critics is 2), got 3"),
    (["algo=td3", "agent.target_subset=-1"],
     "agent.target_subset must be 0 (all critics) or in [1, n_critics] (n_critics is 2), got -1"),
    (["algo=td3", "agent.target_subset=1", "agent.clipped_double_q=false"],
     "agent.target_subset must be 0 with clipped_double_q false (the subset's minimum is the clipped double-Q "
     "target), got 1"),
    (["algo=tqc", "agent.target_subset=1"],
     "agent.target_subset must be 0 for TQC (its target drops the largest pooled quantiles instead: "
     "top_quantiles_to_drop_per_net), got 1"),
    (["agent.target_subset=1"], "unknown key 'agent.target_subset' for algo 'ddpg'"),
    (["agent.reset_every=-5"], "agent.reset_every must be >= 0, got -5"),
    (["agent.reset_layers=first"], "agent.reset_layers must be one of ['last', 'all'], got 'first' (str)"),
    (["agent.critic_weight_decay=-0.1"], "agent.critic_weight_decay must be >= 0, got -0.1"),
    (["agent.actor_weight_decay=-1"], "agent.actor_weight_decay must be >= 0, got -1.0"),
])
def test_bad_lever_values_are_one_line_naming_the_key(overrides, expect):
    with pytest.raises(ValueError) as info:
        load_config("fetch_reach_ddpg", overrides)
    assert str(info.value).startswith(expect) and "\n" not in str(info.value)


@pytest.mark.parametrize("algo", ["ddpg", "td3", "sac", "tqc"])
def test_levers_are_off_in_every_reach_config(algo):
    from her_agents.config import config_dict
    cfg = load_config(f"fetch_reach_{algo}")
    agent = config_dict(cfg)["agent"]
    assert agent["reset_every"] == 0 and agent["reset_layers"] == "last"
    assert agent["actor_weight_decay"] == agent["critic_weight_decay"] == 0.0
    assert agent.get("target_subset", 0) == 0 and ("target_subset" in agent) == (algo != "ddpg")


def test_plain_adam_is_unchanged_without_weight_decay():
    p = nn.Parameter(torch.ones(3))
    group = make_adam([p], 1e-3).param_groups[0]
    assert group["weight_decay"] == 0 and group["decoupled_weight_decay"] is False
    group = make_adam([p], 1e-3, weight_decay=0.5).param_groups[0]
    assert group["weight_decay"] == 0.5 and group["decoupled_weight_decay"] is True


# ------------------------------------------------------------------------------------------------ REDQ subset
def test_ensemble_critic_members_evaluates_those_critics():
    torch.manual_seed(0)
    critic = EnsembleCritic(OBS + GOAL, ACT, (16, 16), n_critics=5, layer_norm=True)
    state, action = torch.randn(6, OBS + GOAL), torch.rand(6, ACT) * 2 - 1
    members = torch.tensor([3, 0])
    alone = torch.cat([critic(state, action, member=i) for i in (3, 0)])
    torch.testing.assert_close(critic(state, action, members=members), alone)
    torch.testing.assert_close(critic(state, action)[members], alone)


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_target_subset_is_drawn_per_update_seeded_and_of_its_size(algo):
    agent = make_agent(algo, OBS, GOAL, ACT, n_critics=5, target_subset=2, seed=3, **SMALL)
    draws = []
    for k in range(60):
        agent.num_updates = k
        subset = agent.target_subset()
        assert subset is not None and subset.dtype == torch.int64 and subset.shape == (2,)
        assert len(set(subset.tolist())) == 2 and all(0 <= i < 5 for i in subset.tolist())
        draws.append(tuple(subset.tolist()))
    assert len(set(draws)) > 5 and {i for d in draws for i in d} == set(range(5))  # anew each update, all critics
    again = make_agent(algo, OBS, GOAL, ACT, n_critics=5, target_subset=2, seed=3, **SMALL)
    other = make_agent(algo, OBS, GOAL, ACT, n_critics=5, target_subset=2, seed=4, **SMALL)
    for k in (0, 7, 59):
        again.num_updates = k
        assert tuple(again.target_subset().tolist()) == draws[k]  # a function of seed and update count
    others = []
    for k in range(60):
        other.num_updates = k
        others.append(tuple(other.target_subset().tolist()))
    assert others != draws  # another seed, other draws
    state = torch.get_rng_state()
    agent.target_subset()
    assert torch.equal(torch.get_rng_state(), state)  # the global torch stream is untouched
    for m in (0, 5):  # all critics: nothing drawn, the minimum over all as before
        assert make_agent(algo, OBS, GOAL, ACT, n_critics=5, target_subset=m, **SMALL).target_subset() is None


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_target_is_the_min_over_the_drawn_subset(algo):
    """The TD target bootstraps from the minimum over the drawn target critics only: with fixed target values
    per critic, ``y`` equals the hand-computed ``r + discount * min_{i in subset} Q'_i`` (SAC: minus
    ``alpha log pi``), which differs from the minimum over all critics."""
    torch.manual_seed(0)
    n, batch_size = 5, 8
    agent = make_agent(algo, OBS, GOAL, ACT, n_critics=n, target_subset=2, seed=1, q_clip=(-50.0, 0.0),
                       **({"policy_noise": 0.0} if algo == "td3" else {}), **SMALL)
    batch = _fed(agent, batch_size)
    b = agent.batch_to_tensors(batch)
    state = agent.preprocess(b.observation, b.desired_goal)
    next_qs = -torch.arange(1.0, n + 1)[:, None].expand(n, batch_size) * 3  # critic i: -3(i+1), all distinct
    asked = []

    def fake_target(s, a, members=None):
        asked.append(members)
        return next_qs if members is None else next_qs[members]

    agent.critic_target = fake_target
    subset = torch.tensor([1, 3])  # minimum -12, where all five give -15
    log_prob = torch.full((batch_size,), -0.5)
    alpha = torch.tensor(0.2)
    if algo == "sac":
        agent.actor = lambda s: (torch.zeros(s.shape[0], ACT), log_prob)
        loss, _, _, td_error = agent.critic_loss(b, state, alpha, subset)
        bootstrap = -12.0 - 0.2 * log_prob
    else:
        loss, _, td_error = agent.critic_loss(b, state, subset)
        bootstrap = torch.full((batch_size,), -12.0)
    assert asked == [subset]
    y = (b.reward + b.discount * (1 - b.terminated) * bootstrap).clamp(-50.0, 0.0)
    z = agent.critic(state, b.action).detach()
    assert loss.item() == pytest.approx((b.weight * (z - y).square()).mean(1).sum().item(), rel=1e-5)
    torch.testing.assert_close(td_error, (y - z).abs().mean(0))


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_target_subset_makes_the_actor_follow_the_mean_of_all_critics(algo):
    torch.manual_seed(0)
    state, action = torch.randn(4, OBS + GOAL), torch.rand(4, ACT) * 2 - 1
    redq = make_agent(algo, OBS, GOAL, ACT, n_critics=4, target_subset=2, **SMALL)
    torch.testing.assert_close(redq._actor_value(state, action), redq.critic(state, action).mean(0))
    plain = make_agent(algo, OBS, GOAL, ACT, n_critics=4, **SMALL)
    q = plain.critic(state, action)
    torch.testing.assert_close(plain._actor_value(state, action), q.min(0).values if algo == "sac" else q[0])


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_updates_with_a_subset_use_the_drawn_critics(algo, monkeypatch):
    agent = make_agent(algo, OBS, GOAL, ACT, n_critics=4, target_subset=2, seed=0, **SMALL)
    batch = _fed(agent)
    seen = []
    real = type(agent).target_critics

    def spy(self, s, a, subset):
        seen.append(subset.tolist())
        return real(self, s, a, subset)

    monkeypatch.setattr(type(agent), "target_critics", spy)
    expected = []
    for _ in range(4):
        agent.num_updates += 1  # the draw of the update about to run
        expected.append(agent.target_subset().tolist())
        agent.num_updates -= 1
        agent.update(batch)
    assert seen == expected


# ------------------------------------------------------------------------------------------------ resets
def _snapshot(agent) -> dict[str, dict[str, torch.Tensor]]:
    return {name: {k: v.detach().clone() for k, v in net.state_dict().items()} for name, net in agent.networks().items()}


def _head_names(agent, net: str) -> set[str]:
    """The state-dict keys of the output layer of the actor (``net.<last>``) or the critic (``head``)."""
    module = agent.networks()[net]
    if net.startswith("actor"):
        last = max(int(k.split(".")[1]) for k in module.state_dict())
        return {f"net.{last}.weight", f"net.{last}.bias"}
    return {"head.weight", "head.bias"}


@pytest.mark.parametrize("algo", ["ddpg", "td3", "sac", "tqc"])
def test_reset_last_redraws_the_output_layers_their_targets_and_their_adam_state(algo):
    torch.manual_seed(0)
    agent = make_agent(algo, OBS, GOAL, ACT, layer_norm=True, reset_every=1000, seed=2,
                       **({"alpha": 0.3} if algo in ("sac", "tqc") else {}), **SMALL)
    batch = _fed(agent)
    for _ in range(6):
        agent.update(batch)
    before = _snapshot(agent)
    steps = {id(p): float(st["step"]) for opt in agent.optimizers().values() for p, st in opt.state.items()}
    if algo in ("sac", "tqc"):
        assert agent.alpha != pytest.approx(0.3)  # tuned away from its start
    fresh = agent.reset_networks()
    after = _snapshot(agent)
    for net in ("actor", "critic"):
        heads = _head_names(agent, net)
        for k in before[net]:
            if k in heads:
                assert not torch.equal(before[net][k], after[net][k]), (net, k)
                fan_in = agent.networks()[net].state_dict()[k.replace("bias", "weight")].shape[-1]
                assert after[net][k].abs().max() <= 1 / math.sqrt(fan_in)  # the constructor's distribution
                target = after.get(f"{net}_target")
                if target is not None:
                    assert torch.equal(target[k], after[net][k])  # the targets take the new layer
            else:
                assert torch.equal(before[net][k], after[net][k]), (net, k)  # the rest is kept
                if f"{net}_target" in after:
                    assert torch.equal(before[f"{net}_target"][k], after[f"{net}_target"][k])
    fresh_ids = {id(p) for p in fresh}
    for name, opt in agent.optimizers().items():
        for p in opt.param_groups[0]["params"]:
            st = opt.state[p]
            if id(p) in fresh_ids:
                assert float(st["step"]) == 0 and not st["exp_avg"].any() and not st["exp_avg_sq"].any(), name
            else:
                assert float(st["step"]) == steps[id(p)] > 0 and st["exp_avg_sq"].any(), name
    if algo in ("sac", "tqc"):
        assert agent.alpha == pytest.approx(0.3)
    metrics = agent.update(batch)  # the next step is a first Adam step for the new layers
    assert all(np.isfinite(v) for k, v in metrics.items() if k != "td_error")
    st = agent.critic_optim.state[agent.critic.head.weight]
    assert float(st["step"]) == 1


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_reset_all_redraws_every_layer_and_restarts_every_adam_state(algo):
    torch.manual_seed(0)
    agent = make_agent(algo, OBS, GOAL, ACT, layer_norm=True, reset_every=1000, reset_layers="all", seed=2,
                       **SMALL)
    batch = _fed(agent)
    for _ in range(4):
        agent.update(batch)
    before = _snapshot(agent)
    agent.reset_networks()
    after = _snapshot(agent)
    for net in ("actor", "critic"):
        for k, v in after[net].items():
            assert not torch.equal(before[net][k], v), (net, k)
        norms = [m for m in agent.networks()[net].modules() if isinstance(m, (nn.LayerNorm, EnsembleLayerNorm))]
        assert norms and all(torch.equal(m.weight, torch.ones_like(m.weight)) and not m.bias.any() for m in norms)
        target = after.get(f"{net}_target")
        if target is not None:
            assert all(torch.equal(target[k], after[net][k]) for k in target)
    for opt in agent.optimizers().values():
        for st in opt.state.values():
            assert float(st["step"]) == 0 and not st["exp_avg"].any() and not st["exp_avg_sq"].any()


def test_resets_happen_after_every_reset_every_th_update_and_repeat_with_the_seed(monkeypatch):
    def run(seed: int) -> tuple[list[int], dict]:
        torch.manual_seed(0)
        agent = make_agent("td3", OBS, GOAL, ACT, reset_every=3, seed=seed, **SMALL)
        batch = _fed(agent)
        at = []
        real = type(agent).reset_networks

        def spy(self):
            at.append(self.num_updates)
            return real(self)

        monkeypatch.setattr(type(agent), "reset_networks", spy)
        for _ in range(10):
            agent.update(batch)
        monkeypatch.undo()
        return at, _snapshot(agent)

    at, first = run(5)
    assert at == [3, 6, 9]
    again, second = run(5)
    assert all(torch.equal(first[n][k], second[n][k]) for n in first for k in first[n])
    _, other = run(6)
    assert not torch.equal(first["actor"]["net.4.weight"], other["actor"]["net.4.weight"])


def test_reset_keeps_the_numpy_actor_in_step():
    """The numpy actor acts on views of the actor's parameters: a reset writes them in place."""
    agent = make_agent("ddpg", OBS, GOAL, ACT, reset_every=2, seed=0, **SMALL)
    batch = _fed(agent)
    agent.act(batch.observation[:1], batch.desired_goal[:1], deterministic=True)  # builds the numpy actor
    agent.update(batch)
    agent.update(batch)  # reset here
    s = agent.preprocess(torch.as_tensor(batch.observation[:1]), torch.as_tensor(batch.desired_goal[:1]))
    np.testing.assert_allclose(agent.act(batch.observation[:1], batch.desired_goal[:1], deterministic=True),
                               agent.actor(s).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_a_pickled_agent_with_levers_still_draws_the_same():
    agent = make_agent("sac", OBS, GOAL, ACT, n_critics=3, target_subset=2, reset_every=2, seed=4, **SMALL)
    batch = _fed(agent)
    agent.update(batch)
    clone = pickle.loads(pickle.dumps(agent))
    assert torch.equal(clone.target_subset(), agent.target_subset())


# ------------------------------------------------------------------------------------------------ weight decay
@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=NEEDS_CXX)])
def test_weight_decay_shrinks_weights_that_have_no_gradient(compiled):
    """A zero gradient leaves Adam's step at zero: what remains is AdamW's ``p * (1 - lr * weight_decay)`` per
    step, eagerly (torch's fused AdamW) and in a compiled update (``adam_step``'s own step)."""
    p = nn.Parameter(torch.full((4, 3), 2.0))
    q = nn.Parameter(torch.full((3,), -1.0))
    opt = make_adam([p, q], lr=0.1, weight_decay=0.5)

    def step(x: torch.Tensor) -> torch.Tensor:
        adam_step(opt, (p.sum() + q.sum()) * x)  # x = 0: zero gradients
        return p.detach().sum()

    fn = step
    if compiled:
        init_adam_state(opt)
        fn = CompiledOrEager(step, "weight_decay_step", cpp_wrapper=False)
    for _ in range(3):
        fn(torch.zeros(()))
    if compiled:
        assert fn.compiled_ok
    torch.testing.assert_close(p.detach(), torch.full((4, 3), 2.0 * 0.95**3))
    torch.testing.assert_close(q.detach(), torch.full((3,), -1.0 * 0.95**3))
    assert all(float(opt.state[t]["step"]) == 3 for t in (p, q))


@pytest.mark.parametrize("algo", ["ddpg", "sac"])
def test_agent_weight_decay_reaches_its_optimizers(algo):
    agent = make_agent(algo, OBS, GOAL, ACT, actor_weight_decay=0.25, critic_weight_decay=0.5, **SMALL)
    assert agent.actor_optim.param_groups[0]["weight_decay"] == 0.25
    assert agent.critic_optim.param_groups[0]["weight_decay"] == 0.5
    assert all(g["decoupled_weight_decay"] for o in (agent.actor_optim, agent.critic_optim) for g in o.param_groups)
    if algo == "sac":
        assert agent.alpha_optim.param_groups[0]["weight_decay"] == 0  # not the temperature


# ------------------------------------------------------------------------------------------------ resume
FAST = ["train.warmup_steps=100", "train.learning_starts=100", "train.eval_episodes=2", "env.eval_envs=2",
        "agent.hidden=[64,64]", "train.batch_size=64", "replay.capacity=5000", "log.progress=false",
        "agent.compile=false"]


@pytest.mark.parametrize("config, levers", [
    # 120 updates, 40 by the checkpoint: resets at 25, 50, 75, 100 fall on both sides of it
    ("fetch_reach_sac", ["agent.n_critics=3", "agent.target_subset=2", "agent.reset_every=25",
                         "agent.critic_weight_decay=0.1", "agent.actor_weight_decay=0.1"]),
    ("fetch_reach_td3", ["agent.n_critics=4", "agent.target_subset=2", "agent.reset_every=25",
                         "agent.reset_layers=all", "agent.critic_weight_decay=0.1"]),
])
def test_a_resumed_run_with_the_levers_equals_the_uninterrupted_run(tmp_path, monkeypatch, config, levers):
    """As ``tests/test_resume.py``'s exact resume, with the levers set: 400 env steps uninterrupted against the
    same run killed right after its checkpoint at 200 env steps and resumed end bit-identical (parameters,
    optimizers, RNGs, replay, metrics rows)."""
    import her_agents.loop.steps as steps_mod

    def cfg(run_dir: Path):
        return load_config(config, ["train.total_env_steps=400", "train.eval_every=100", "log.save_replay=true",
                                    "log.wandb.mode=disabled", f"log.run_dir={run_dir}", *FAST, *levers])

    full, resumed = tmp_path / "full", tmp_path / "resumed"
    result = train(cfg(full))
    assert result.env_steps == 400
    monkeypatch.setattr(steps_mod, "save_training_state", killed_at_200(steps_mod.save_training_state))
    with pytest.raises(RuntimeError, match="simulated kill"):
        train(cfg(resumed))
    monkeypatch.undo()
    train(cfg(resumed), resume=str(resumed))
    assert run_differences(full, resumed) == []
