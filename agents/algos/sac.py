"""SAC for goal-conditioned tasks (Haarnoja et al. 2018) with the openai/baselines HER input normalization.

Squashed (tanh) Gaussian policy, twin critics as one batched ``EnsembleCritic``, soft target with the min
of the twin target critics, learned temperature with target entropy ``-action_dim`` (or a fixed ``alpha``).
Target Q clipped to ``q_clip`` like DDPG/TD3. Exploration is the policy's own sampling: ``noise_std`` and
``random_eps`` default to 0 here.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
from torch import nn

from .base import GoalConditionedAgentBase, freeze, make_adam, td_target
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
        self.actor_optim = make_adam(self.actor.parameters(), cfg.actor_lr)
        self.critic_optim = make_adam(self.critic.parameters(), cfg.critic_lr)
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

    def update(self, batch) -> dict[str, float | np.ndarray]:
        """One critic, actor and temperature step. Returns ``critic_loss`` (mean over critics),
        ``actor_loss``, ``q_mean``, ``alpha``, ``entropy`` (``-mean log pi``) and ``td_error``
        (``|y - Q_i|`` averaged over the critics, ``[B]`` float32)."""
        self.set_training(True)
        cfg = self.config
        b = self.batch_to_tensors(batch)
        if self.compiles_whole_update():
            return self._update_whole(b)
        state = self.preprocess(b.observation, b.desired_goal)
        alpha = self.temperature.log_alpha.detach().exp()

        critic_loss, reported_critic_loss, q_mean, td_error = self.loss_fn(self._critic_loss)(b, state, alpha)
        self.critic_optim.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_optim.step()

        freeze(self.params(self.critic), True)
        actor_loss, log_prob = self.loss_fn(self._policy_loss)(state, alpha)
        self.actor_optim.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_optim.step()
        freeze(self.params(self.critic), False)

        # --- temperature: drive the entropy -E[log pi] towards target_entropy
        log_prob = log_prob.detach()
        if cfg.autotune:
            alpha_loss = -(self.temperature.log_alpha * (log_prob + self.target_entropy)).mean()
            self.alpha_optim.zero_grad(set_to_none=True)
            alpha_loss.backward()
            self.alpha_optim.step()

        self.num_updates += 1
        if cfg.target_update_interval and self.num_updates % cfg.target_update_interval == 0:
            self.update_targets()
        return self._metrics(
            {
                "critic_loss": reported_critic_loss,
                "actor_loss": actor_loss,
                "q_mean": q_mean,
                "alpha": alpha,
                "entropy": -log_prob.mean(),
            },
            td_error,
        )

    def _update_whole(self, b) -> dict[str, float | np.ndarray]:
        """[`update`][her_agents.algos.sac.SACAgent.update] as one compiled graph
        ([`whole_update`][her_agents.algos.sac.SACAgent.whole_update]); the same steps in the same order."""
        cfg = self.config
        self.num_updates += 1
        target_step = bool(cfg.target_update_interval) and self.num_updates % cfg.target_update_interval == 0
        optims = (self.critic_optim, self.actor_optim) + ((self.alpha_optim,) if cfg.autotune else ())
        self.polyak_params()  # listed outside the graph
        flat = self.whole_update(self._whole_step)(b, self.adam_scalars(*optims), target_step)
        return self._metrics_from_flat(("critic_loss", "actor_loss", "q_mean", "alpha", "entropy"), flat)

    def _whole_step(self, b, scalars: torch.Tensor, target_step: bool) -> torch.Tensor:
        """Critic, actor and (``autotune``) temperature steps, then (``target_step``) the polyak update: the
        ``_flat_metrics`` of ``critic_loss / n_critics``, ``actor_loss``, ``q_mean``, ``alpha``, ``entropy``
        and ``td_error [B]``."""
        state = self.preprocess(b.observation, b.desired_goal)
        alpha = self.temperature.log_alpha.detach().exp()
        critic_loss, reported_critic_loss, q_mean, td_error = self._critic_loss(b, state, alpha)
        self.adam_step_(self.critic_optim, critic_loss, scalars[0:2])
        actor_loss, log_prob = self._policy_loss(state, alpha)
        self.adam_step_(self.actor_optim, actor_loss, scalars[2:4])
        log_prob = log_prob.detach()
        if self.config.autotune:
            alpha_loss = -(self.temperature.log_alpha * (log_prob + self.target_entropy)).mean()
            self.adam_step_(self.alpha_optim, alpha_loss, scalars[4:6])
        if target_step:
            self.update_targets()
        return self._flat_metrics([reported_critic_loss, actor_loss, q_mean, alpha, -log_prob.mean()], td_error)

    def _critic_loss(self, b, state: torch.Tensor, alpha: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(loss, reported loss, Q mean, td_error [B])`` of the soft TD step:
        ``y = r + discount * (1 - terminated) * (min_i Q'_i(s', a') - alpha log pi(a'|s'))``, ``a' ~ pi``."""
        cfg = self.config
        with torch.no_grad():
            next_state = self.preprocess(b.next_observation, b.desired_goal)
            with self.autocast():
                next_action, next_log_prob = self.actor(next_state)
                next_q = self.critic_target(next_state, next_action).min(0).values  # [B] float32
            next_q = next_q - alpha * next_log_prob
            y = td_target(b.reward, b.discount, b.terminated, next_q, cfg.q_clip)
        loss, q, td_error = self._critic_regression(b, state, y)
        return loss, loss.detach() / cfg.n_critics, q.mean(), td_error

    def _policy_loss(self, state: torch.Tensor, alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loss, log_prob [B])``: minimize ``alpha log pi(a|s) - V(s, a)`` with ``a ~ pi`` reparameterized
        (Haarnoja et al. 2018, Eq. 12; ``V`` is ``_actor_value``), plus ``action_l2 * mean(a^2)``."""
        with self.autocast():
            pi, log_prob = self.actor(state)
            q_pi = self._actor_value(state, pi)
        loss = (alpha * log_prob - q_pi).mean() + self.config.action_l2 * pi.square().mean()
        return loss, log_prob

    def _actor_value(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """The value the actor maximizes, ``min_i Q_i(s, a)`` ``[B]``."""
        return self.critic(state, action).min(0).values

    def _target_pairs(self):
        return [(self.critic_target, self.critic)]

    def _checkpoint_items(self):
        return {
            "actor": self.actor,
            "critic": self.critic,
            "critic_target": self.critic_target,
            "temperature": self.temperature,
            "actor_optim": self.actor_optim,
            "critic_optim": self.critic_optim,
            "alpha_optim": self.alpha_optim,
        }
