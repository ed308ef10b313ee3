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

from .base import GoalConditionedAgentBase, freeze, make_adam, td_target
from .configs import TD3Config
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

    config: TD3Config

    def __init__(
        self,
        obs_dim: int,
        goal_dim: int,
        action_dim: int,
        config: TD3Config | None = None,
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
        self.actor_optim = make_adam(self.actor.parameters(), cfg.actor_lr)
        self.critic_optim = make_adam(self.critic.parameters(), cfg.critic_lr)
        self._last_actor_loss = torch.zeros((), device=self.device)  # last actor loss, reported between delays

    def _policy(self, state: torch.Tensor, deterministic: bool, noise: torch.Tensor | None = None) -> torch.Tensor:
        return self.actor(state)

    def update(self, batch) -> dict[str, float | np.ndarray]:
        """One critic step; every ``policy_delay`` updates also an actor step and target update.

        Returns ``critic_loss`` (mean over critics), ``actor_loss`` (latest), ``q_mean`` and ``td_error``
        (``|y - Q_i|`` averaged over the critics, ``[B]`` float32).
        """
        self.set_training(True)
        cfg = self.config
        b = self.batch_to_tensors(batch)
        if self.compiles_whole_update():
            return self._update_whole(b)
        state = self.preprocess(b.observation, b.desired_goal)

        critic_loss, q, td_error = self.loss_fn(self._critic_loss)(b, state)
        self.critic_optim.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_optim.step()
        self.num_updates += 1

        # --- delayed actor step, then targets
        if self.num_updates % cfg.policy_delay == 0:
            freeze(self.params(self.critic), True)
            actor_loss = self.loss_fn(self._policy_loss)(state)
            self.actor_optim.zero_grad(set_to_none=True)
            actor_loss.backward()
            self.actor_optim.step()
            freeze(self.params(self.critic), False)
            # a clone: under CUDA graphs (compile on CUDA) actor_loss lives in the graphs' memory, which the
            # next update's replay overwrites, and updates between actor steps report this value
            self._last_actor_loss = actor_loss.detach().clone()
            interval = cfg.target_update_interval
            if interval and self.num_updates % (cfg.policy_delay * interval) == 0:
                self.update_targets()

        return self._metrics(
            {
                "critic_loss": critic_loss.detach() / cfg.n_critics,
                "actor_loss": self._last_actor_loss,
                "q_mean": q.mean(),
            },
            td_error,
        )

    def _update_whole(self, b) -> dict[str, float | np.ndarray]:
        """[`update`][her_agents.algos.td3.TD3Agent.update] as one compiled graph
        ([`whole_update`][her_agents.algos.td3.TD3Agent.whole_update]); the same steps in the same order."""
        cfg = self.config
        self.num_updates += 1
        actor_step = self.num_updates % cfg.policy_delay == 0
        interval = cfg.target_update_interval
        target_step = actor_step and bool(interval) and self.num_updates % (cfg.policy_delay * interval) == 0
        optims = (self.critic_optim, self.actor_optim) if actor_step else (self.critic_optim,)
        self.polyak_params()  # listed outside the graph
        flat = self.whole_update(self._whole_step)(
            b, self.adam_scalars(*optims), self._last_actor_loss, actor_step, target_step)
        self._last_actor_loss = flat[1].clone()  # not a view of this update's output (next call's input)
        return self._metrics_from_flat(("critic_loss", "actor_loss", "q_mean"), flat)

    def _whole_step(self, b, scalars: torch.Tensor, last_actor_loss: torch.Tensor, actor_step: bool,
                    target_step: bool) -> torch.Tensor:
        """Critic step, then (``actor_step``) actor step and (``target_step``) polyak update: the
        ``_flat_metrics`` of ``critic_loss / n_critics``, ``actor_loss`` (``last_actor_loss`` without an actor
        step), ``q_mean`` and ``td_error [B]``."""
        state = self.preprocess(b.observation, b.desired_goal)
        critic_loss, q, td_error = self._critic_loss(b, state)
        self.adam_step_(self.critic_optim, critic_loss, scalars[0:2])
        actor_loss = last_actor_loss
        if actor_step:
            actor_loss = self._policy_loss(state)
            self.adam_step_(self.actor_optim, actor_loss, scalars[2:4])
            if target_step:
                self.update_targets()
        return self._flat_metrics([critic_loss / self.config.n_critics, actor_loss, q.mean()], td_error)

    def _critic_loss(self, b, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(loss, Q [n_critics, B] detached, td_error [B])`` (Fujimoto et al. 2018, Eq. 10 and 15):
        ``y = clip(r + discount * (1 - terminated) * min_i Q'_i(s', smooth(mu'(s'))))`` (``mean_i`` without
        ``clipped_double_q``); the loss is the sum over critics of each critic's ``mean(weight * (Q_i - y)^2)``;
        ``td_error = |y - Q_i|`` averaged over critics."""
        cfg = self.config
        with torch.no_grad():
            next_state = self.preprocess(b.next_observation, b.desired_goal)
            with self.autocast():
                next_action = smoothed_target_action(
                    self.actor_target(next_state), cfg.policy_noise, cfg.noise_clip
                )
                next_qs = self.critic_target(next_state, next_action)  # [n_critics, B] float32
                next_q = next_qs.min(0).values if cfg.clipped_double_q else next_qs.mean(0)
            y = td_target(b.reward, b.discount, b.terminated, next_q, cfg.q_clip)
        return self._critic_regression(b, state, y)

    def _policy_loss(self, state: torch.Tensor) -> torch.Tensor:
        """Maximize ``Q_1(s, mu(s))`` (deterministic policy gradient, Silver et al. 2014) with the action L2 penalty
        ``action_l2 * mean(mu(s)^2)`` of openai/baselines HER."""
        with self.autocast():
            pi = self.actor(state)
            q_pi = self._actor_value(state, pi)
        return -q_pi.mean() + self.config.action_l2 * pi.square().mean()

    def _actor_value(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """``Q_1(s, a)`` ``[B]``, the first critic (Fujimoto et al. 2018, Alg. 1: the actor follows ``Q_theta1``)."""
        return self.critic(state, action, member=0)[0]

    def _target_pairs(self):
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

    def _checkpoint_items(self):
        return {
            "actor": self.actor,
            "critic": self.critic,
            "actor_target": self.actor_target,
            "critic_target": self.critic_target,
            "actor_optim": self.actor_optim,
            "critic_optim": self.critic_optim,
        }
