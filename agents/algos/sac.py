"""SAC for goal-conditioned tasks (Haarnoja et al. 2018) with the openai/baselines HER input normalization.

Squashed (tanh) Gaussian policy, twin critics as one batched ``EnsembleCritic``, soft target with the min
of the twin target critics, learned temperature with target entropy ``-action_dim`` (or a fixed ``alpha``).
Target Q clipped to ``q_clip`` like DDPG/TD3. Exploration is the policy's own sampling: ``noise_std`` and
``random_eps`` default to 0 here. With ``target_subset`` (REDQ) the target's minimum runs over a random subset of
the critics and the actor maximizes their mean.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import torch
from torch import nn

from .base import GoalConditionedAgentBase, TensorBatch, td_target
from .compiled import adam_step, freeze, make_adam, reset_adam_state
from .configs import SACConfig
from .networks import EnsembleCritic, SquashedGaussianActor

__all__ = ["SACAgent", "SACConfig", "Temperature"]


class Temperature(nn.Module):
    """Holds ``log_alpha`` (a parameter so it checkpoints and optimizes like the networks)."""

    def __init__(self, alpha: float) -> None:
        super().__init__()
        self.log_alpha = nn.Parameter(torch.tensor(math.log(alpha), dtype=torch.float32))


class SACAgent(GoalConditionedAgentBase):
    """Goal-conditioned SAC. See [`GoalConditionedAgentBase`][her_agents.algos.sac.GoalConditionedAgentBase]
    for the constructor arguments."""

    config: SACConfig

    def __init__(
        self,
        obs_dim: int,
        goal_dim: int,
        action_dim: int,
        config: SACConfig | None = None,
        device: str | torch.device = "auto",
        n_threads: int | None = None,
    ) -> None:
        super().__init__(obs_dim, goal_dim, action_dim, config or SACConfig(), device, n_threads)
        cfg = self.config
        self.actor = SquashedGaussianActor(
            self.state_dim, action_dim, cfg.hidden, cfg.layer_norm, cfg.log_std_min, cfg.log_std_max
        ).to(self.device)
        self.critic = self._build_critic().to(self.device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_optim = make_adam(self.actor.parameters(), cfg.actor_lr, cfg.actor_weight_decay)
        self.critic_optim = make_adam(self.critic.parameters(), cfg.critic_lr, cfg.critic_weight_decay)
        self.temperature = Temperature(cfg.alpha).to(self.device)
        self.temperature.requires_grad_(cfg.autotune)
        self.alpha_optim = make_adam(self.temperature.parameters(), cfg.alpha_lr)
        self.target_entropy = float(-action_dim if cfg.target_entropy is None else cfg.target_entropy)

    def _build_critic(self) -> EnsembleCritic:
        cfg = self.config
        return EnsembleCritic(self.state_dim, self.action_dim, cfg.hidden, cfg.n_critics, cfg.layer_norm)

    @property
    def alpha(self) -> float:
        return float(self.temperature.log_alpha.detach().exp())

    stochastic_policy = True

    def _policy(self, state: torch.Tensor, deterministic: bool, noise: torch.Tensor | None = None) -> torch.Tensor:
        return self.actor(state, deterministic, noise)[0]

    def update(self, batch: Any) -> dict[str, float | np.ndarray]:
        """One critic, actor and temperature step. Returns ``critic_loss`` (mean over critics),
        ``actor_loss``, ``q_mean``, ``alpha``, ``entropy`` (``-mean log pi``) and ``td_error``
        (``|y - Q_i|`` averaged over the critics, ``[B]`` float32)."""
        cfg = self.config
        b = self.batch_to_tensors(batch)
        self.num_updates += 1
        target_step = bool(cfg.target_update_interval) and self.num_updates % cfg.target_update_interval == 0
        flat = self.compiled(self.train_step)(b, target_step, self.target_subset())
        metrics = self.metrics_from_flat(("critic_loss", "actor_loss", "q_mean", "alpha", "entropy"), flat)
        if self.reset_due():
            self.reset_networks()
        return metrics

    def train_step(self, b: TensorBatch, target_step: bool, subset: torch.Tensor | None = None) -> torch.Tensor:
        """SAC's update (Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and Applications", arXiv:1812.05905, Algorithm 1): a
        critic step on the soft TD target (over the target critics ``subset``, ``target_subset``), an actor step,
        with ``autotune`` a temperature step towards the target entropy (Eq. 18), then with ``target_step`` the
        polyak update. Returns the ``flat_metrics`` of ``critic_loss / n_critics``, ``actor_loss``, ``q_mean``,
        ``alpha``, ``entropy`` and ``td_error [B]``. Run eagerly or compiled (``compiled``)."""
        s = self.preprocess(b.observation, b.desired_goal)
        alpha = self.temperature.log_alpha.detach().exp()
        critic_loss, reported_critic_loss, q_mean, td_error = self.critic_loss(b, s, alpha, subset)
        same = self.adam_same_steps
        adam_step(self.critic_optim, critic_loss, self.whole_update_ok, same)
        freeze(self.params(self.critic), True)
        actor_loss, log_prob = self.actor_loss(s, alpha)
        adam_step(self.actor_optim, actor_loss, self.whole_update_ok, same)
        freeze(self.params(self.critic), False)
        log_prob = log_prob.detach()
        if self.config.autotune:  # drive the entropy -E[log pi] towards target_entropy
            alpha_loss = -(self.temperature.log_alpha * (log_prob + self.target_entropy)).mean()
            adam_step(self.alpha_optim, alpha_loss, self.whole_update_ok)
        if target_step:
            self.update_targets()
        return self.flat_metrics([reported_critic_loss, actor_loss, q_mean, alpha, -log_prob.mean()], td_error)

    def critic_loss(self, b: TensorBatch, s: torch.Tensor, alpha: torch.Tensor, subset: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(loss, reported loss, Q mean, td_error [B])`` of the soft TD step:
        ``y = r + discount * (1 - terminated) * (min_i Q'_i(s', a') - alpha log pi(a'|s'))``, ``a' ~ pi``, the
        minimum over the target critics ``subset`` (int64 ``[M]``, REDQ's target, Chen et al. 2021, Algorithm 1), or all of
        them (None)."""
        cfg = self.config
        with torch.no_grad():
            s_next = self.preprocess(b.next_observation, b.desired_goal)
            with self.autocast():
                a_next, log_prob_next = self.actor(s_next)
                q_next = self.target_critics(s_next, a_next, subset).min(0).values  # [B] float32
            q_next = q_next - alpha * log_prob_next
            y = td_target(b.reward, b.discount, b.terminated, q_next, cfg.q_clip)
        loss, q, td_error = self.critic_regression(b, s, y)
        return loss, loss.detach() / cfg.n_critics, q.mean(), td_error

    def actor_loss(self, s: torch.Tensor, alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loss, log_prob [B])``: minimize ``alpha log pi(a|s) - V(s, a)`` with ``a ~ pi`` reparameterized
        (Haarnoja et al. 2018, Eq. 12; ``V`` is ``_actor_value``), plus ``action_l2 * mean(a^2)``."""
        with self.autocast():
            pi, log_prob = self.actor(s)
            q_pi = self._actor_value(s, pi)
        loss = (alpha * log_prob - q_pi).mean() + self.config.action_l2 * pi.square().mean()
        return loss, log_prob

    def _actor_value(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """The value the actor maximizes, ``min_i Q_i(s, a)`` ``[B]``; with ``target_subset``, REDQ's
        ``mean_i Q_i(s, a)`` over all critics (Chen et al. 2021, Algorithm 1's policy update)."""
        q = self.critic(state, action)
        return q.mean(0) if self.config.target_subset else q.min(0).values

    def reset_networks(self) -> list[torch.Tensor]:
        """The base's reset (``reset_layers`` of the actor and the critics), and the temperature back at
        ``alpha`` with its Adam state restarted: the reference code's reset builds a new agent, temperature
        included."""
        fresh = super().reset_networks()
        with torch.no_grad():
            self.temperature.log_alpha.fill_(math.log(self.config.alpha))
        reset_adam_state(self.alpha_optim, [self.temperature.log_alpha])
        return [*fresh, self.temperature.log_alpha]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The base's load, and the temperature as the config has it: fixed at ``alpha`` without ``autotune``;
        with it, the state's learned temperature, or a restart at ``alpha`` where the state's config had another
        (a run resumed with ``agent.alpha=...``)."""
        super().load_state_dict(state)
        saved_alpha = state.get("config", {}).get("alpha", self.config.alpha)
        if not self.config.autotune or saved_alpha != self.config.alpha:
            with torch.no_grad():
                self.temperature.log_alpha.fill_(math.log(self.config.alpha))

    def _target_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        return [(self.critic_target, self.critic)]

    def _checkpoint_items(self) -> dict[str, Any]:
        return {
            "actor": self.actor,
            "critic": self.critic,
            "critic_target": self.critic_target,
            "temperature": self.temperature,
            "actor_optim": self.actor_optim,
            "critic_optim": self.critic_optim,
            "alpha_optim": self.alpha_optim,
        }
