"""TD3 for goal-conditioned tasks (Fujimoto et al. 2018) with the openai/baselines HER techniques.

Clipped double Q (min of the twin target critics), target policy smoothing (clipped Gaussian noise on the
target action), actor and targets updated every ``policy_delay`` critic updates. The twin critics are one
batched ``EnsembleCritic``. Target Q clipped to ``q_clip``; action L2 penalty on the actor.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from torch import nn

from .base import GoalConditionedAgentBase, TensorBatch, td_target
from .compiled import adam_step, freeze, make_adam
from .configs import DDPGConfig, TD3Config
from .networks import DeterministicActor, EnsembleCritic

__all__ = ["TD3Agent", "TD3Config", "smoothed_target_action"]


def smoothed_target_action(
    target_action: torch.Tensor, policy_noise: float, noise_clip: float
) -> torch.Tensor:
    """``clip(a' + clip(N(0, policy_noise), -noise_clip, noise_clip), -1, 1)``; ``a'`` as is at ``policy_noise``
    0 (DDPG), which draws no noise (the torch random stream stays DDPG's)."""
    if policy_noise == 0.0:
        return target_action
    noise = (torch.randn_like(target_action) * policy_noise).clamp_(-noise_clip, noise_clip)
    return (target_action + noise).clamp_(-1.0, 1.0)


class TD3Agent(GoalConditionedAgentBase):
    """Goal-conditioned TD3. See [`GoalConditionedAgentBase`][her_agents.algos.td3.GoalConditionedAgentBase]
    for the constructor arguments."""

    config: TD3Config | DDPGConfig  # DDPGAgent runs this class with TD3's pieces fixed off (DDPGConfig)

    def __init__(
        self,
        obs_dim: int,
        goal_dim: int,
        action_dim: int,
        config: TD3Config | DDPGConfig | None = None,
        device: str | torch.device = "auto",
        n_threads: int | None = None,
    ) -> None:
        super().__init__(obs_dim, goal_dim, action_dim, config or TD3Config(), device, n_threads)
        cfg = self.config
        self.actor = DeterministicActor(self.state_dim, action_dim, cfg.hidden, cfg.layer_norm).to(self.device)
        self.critic = EnsembleCritic(
            self.state_dim, action_dim, cfg.hidden, cfg.n_critics, cfg.layer_norm
        ).to(self.device)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_optim = make_adam(self.actor.parameters(), cfg.actor_lr, cfg.actor_weight_decay)
        self.critic_optim = make_adam(self.critic.parameters(), cfg.critic_lr, cfg.critic_weight_decay)
        self._last_actor_loss = torch.zeros((), device=self.device)  # last actor loss, reported between delays

    def _policy(self, state: torch.Tensor, deterministic: bool, noise: torch.Tensor | None = None) -> torch.Tensor:
        return self.actor(state)

    def update(self, batch: Any) -> dict[str, float | np.ndarray]:
        """One critic step; every ``policy_delay`` updates also an actor step and target update.

        Returns ``critic_loss`` (mean over critics), ``actor_loss`` (latest), ``q_mean`` and ``td_error``
        (``|y - Q_i|`` averaged over the critics, ``[B]`` float32).
        """
        cfg = self.config
        b = self.batch_to_tensors(batch)
        self.num_updates += 1
        actor_step = self.num_updates % cfg.policy_delay == 0
        interval = cfg.target_update_interval
        target_step = actor_step and bool(interval) and self.num_updates % (cfg.policy_delay * interval) == 0
        flat = self.compiled(self.train_step)(b, self._last_actor_loss, actor_step, target_step,
                                              self.target_subset())
        # a clone: not a view of this update's output (the next call's input; CUDA graphs overwrite outputs)
        self._last_actor_loss = flat[1].clone()
        metrics = self.metrics_from_flat(("critic_loss", "actor_loss", "q_mean"), flat)
        if self.reset_due():
            self.reset_networks()
        return metrics

    def train_step(self, b: TensorBatch, last_actor_loss: torch.Tensor, actor_step: bool, target_step: bool,
                   subset: torch.Tensor | None = None) -> torch.Tensor:
        """TD3's update (Fujimoto et al. 2018, Algorithm 1): a critic step on the clipped double-Q target (over the
        target critics ``subset``, ``target_subset``); with ``actor_step`` an actor step on ``Q_1`` (with
        ``target_subset``: the critics' mean), then with ``target_step`` the polyak update. Returns the
        ``flat_metrics`` of ``critic_loss / n_critics``, ``actor_loss`` (``last_actor_loss`` without an actor
        step), ``q_mean`` and ``td_error [B]``. Run eagerly or compiled (``compiled``)."""
        s = self.preprocess(b.observation, b.desired_goal)
        critic_loss, q, td_error = self.critic_loss(b, s, subset)
        same = self.adam_same_steps
        adam_step(self.critic_optim, critic_loss, self.whole_update_ok, same)
        actor_loss = last_actor_loss
        if actor_step:
            freeze(self.params(self.critic), True)
            actor_loss = self.actor_loss(s)
            adam_step(self.actor_optim, actor_loss, self.whole_update_ok, same)
            freeze(self.params(self.critic), False)
            if target_step:
                self.update_targets()
        return self.flat_metrics([critic_loss / self.config.n_critics, actor_loss, q.mean()], td_error)

    def critic_loss(self, b: TensorBatch, s: torch.Tensor, subset: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(loss, Q [n_critics, B] detached, td_error [B])`` (Fujimoto et al. 2018, Eq. 10 and 15):
        ``y = clip(r + discount * (1 - terminated) * min_i Q'_i(s', smooth(mu'(s'))))`` (``mean_i`` without
        ``clipped_double_q``), ``i`` over the target critics ``subset`` (int64 ``[M]``: REDQ, Chen et al. 2021,
        Algorithm 1) or all of them (None); the loss is the sum over critics of each critic's
        ``mean(weight * (Q_i - y)^2)``; ``td_error = |y - Q_i|`` averaged over critics."""
        cfg = self.config
        with torch.no_grad():
            s_next = self.preprocess(b.next_observation, b.desired_goal)
            with self.autocast():
                a_next = smoothed_target_action(self.actor_target(s_next), cfg.policy_noise, cfg.noise_clip)
                q_next = self.target_critics(s_next, a_next, subset)  # [M, B] float32
                q_next = q_next.min(0).values if cfg.clipped_double_q else q_next.mean(0)
            y = td_target(b.reward, b.discount, b.terminated, q_next, cfg.q_clip)
        return self.critic_regression(b, s, y)

    def actor_loss(self, s: torch.Tensor) -> torch.Tensor:
        """Maximize ``Q_1(s, mu(s))`` (deterministic policy gradient, Silver et al. 2014) with the action L2 penalty
        ``action_l2 * mean(mu(s)^2)`` of openai/baselines HER."""
        with self.autocast():
            pi = self.actor(s)
            q_pi = self._actor_value(s, pi)
        return -q_pi.mean() + self.config.action_l2 * pi.square().mean()

    def _actor_value(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """``Q_1(s, a)`` ``[B]``, the first critic (Fujimoto et al. 2018, Alg. 1: the actor follows ``Q_theta1``);
        with ``target_subset``, REDQ's mean over all critics (Chen et al. 2021, Algorithm 1's policy update)."""
        if self.config.target_subset:
            return self.critic(state, action).mean(0)
        return self.critic(state, action, member=0)[0]

    def _target_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        return [(self.actor_target, self.actor), (self.critic_target, self.critic)]

    def state_dict(self) -> dict[str, Any]:
        """The base state plus ``last_actor_loss``: updates between delayed actor steps report it, so a resumed
        run's metrics continue as the uninterrupted run's."""
        state = super().state_dict()
        state["last_actor_loss"] = self._last_actor_loss.detach().cpu().clone()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "last_actor_loss" in state:
            self._last_actor_loss = torch.as_tensor(state["last_actor_loss"]).to(self.device)

    def _checkpoint_items(self) -> dict[str, Any]:
        return {
            "actor": self.actor,
            "critic": self.critic,
            "actor_target": self.actor_target,
            "critic_target": self.critic_target,
            "actor_optim": self.actor_optim,
            "critic_optim": self.critic_optim,
        }
