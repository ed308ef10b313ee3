"""DDPG for goal-conditioned tasks (Lillicrap et al. 2016) with the openai/baselines HER techniques.

One deterministic tanh actor, one critic (an ensemble of 1), target networks with polyak averaging, target Q
clipped to ``q_clip``, action L2 penalty on the actor's tanh output.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

from her_agents.base import AgentConfig, GoalConditionedAgentBase, freeze, make_adam, td_target
from her_agents.fields import NON_NEGATIVE, check_ranges
from her_agents.networks import DeterministicActor, EnsembleCritic


@dataclass
class DDPGConfig(AgentConfig):
    """DDPG options (see :class:`her_agents.base.AgentConfig` for the shared ones)."""

    action_l2: float = 1.0
    """Weight (>= 0) of ``mean(a^2)`` (a = the actor's tanh output in ``[-1, 1]``) added to the actor loss."""

    def __post_init__(self) -> None:
        """Raises:
            ValueError: as :meth:`AgentConfig.__post_init__`, and a negative ``action_l2``."""
        super().__post_init__()
        check_ranges(self, {"action_l2": NON_NEGATIVE})


class DDPGAgent(GoalConditionedAgentBase):
    """Goal-conditioned DDPG. See :class:`GoalConditionedAgentBase` for the constructor arguments."""

    config: DDPGConfig

    def __init__(
        self,
        obs_dim: int,
        goal_dim: int,
        action_dim: int,
        config: DDPGConfig | None = None,
        device: str | torch.device = "auto",
        n_threads: int | None = None,
    ) -> None:
        super().__init__(obs_dim, goal_dim, action_dim, config or DDPGConfig(), device, n_threads)
        cfg = self.config
        self.actor = DeterministicActor(self.state_dim, action_dim, cfg.hidden, cfg.layer_norm).to(self.device)
        self.critic = EnsembleCritic(self.state_dim, action_dim, cfg.hidden, 1, cfg.layer_norm).to(self.device)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_optim = make_adam(self.actor.parameters(), cfg.actor_lr)
        self.critic_optim = make_adam(self.critic.parameters(), cfg.critic_lr)

    def _policy(self, state: torch.Tensor, deterministic: bool) -> torch.Tensor:
        return self.actor(state)

    def update(self, batch) -> dict[str, float | np.ndarray]:
        """One critic and one actor step. Returns ``critic_loss``, ``actor_loss``, ``q_mean`` and ``td_error``
        (``|y - Q|``, ``[B]`` float32)."""
        self.set_training(True)
        cfg = self.config
        b = self.batch_to_tensors(batch)
        state = self.preprocess(b.observation, b.desired_goal)

        critic_loss, q, td_error = self.loss_fn("_critic_loss")(b, state)
        self.critic_optim.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_optim.step()

        freeze(self.params(self.critic), True)
        actor_loss = self.loss_fn("_policy_loss")(state)
        self.actor_optim.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_optim.step()
        freeze(self.params(self.critic), False)

        self.num_updates += 1
        if cfg.target_update_interval and self.num_updates % cfg.target_update_interval == 0:
            self.update_targets()
        return self._metrics({"critic_loss": critic_loss, "actor_loss": actor_loss, "q_mean": q.mean()}, td_error)

    def _critic_loss(self, b, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(loss, Q [1, B] detached, td_error [B])`` of the TD step (Lillicrap et al. 2016, Eq. 4-5):
        ``y = clip(r + discount * (1 - terminated) * Q'(s', mu'(s')))``, loss ``mean(weight * (Q - y)^2)``."""
        cfg = self.config
        with torch.no_grad():
            next_state = self.preprocess(b.next_observation, b.desired_goal)
            with self.autocast():
                next_q = self.critic_target(next_state, self.actor_target(next_state))[0]  # [B] float32
            y = td_target(b.reward, b.discount, b.terminated, next_q, cfg.q_clip)
        return self._critic_regression(b, state, y)

    def _policy_loss(self, state: torch.Tensor) -> torch.Tensor:
        """Maximize ``Q(s, mu(s))`` (deterministic policy gradient, Silver et al. 2014) with the action L2 penalty
        ``action_l2 * mean(mu(s)^2)`` of openai/baselines HER."""
        with self.autocast():
            pi = self.actor(state)
            q_pi = self.critic(state, pi)
        return -q_pi.mean() + self.config.action_l2 * pi.square().mean()

    def _target_pairs(self):
        return [(self.actor_target, self.actor), (self.critic_target, self.critic)]

    def _checkpoint_items(self):
        return {
            "actor": self.actor,
            "critic": self.critic,
            "actor_target": self.actor_target,
            "critic_target": self.critic_target,
            "actor_optim": self.actor_optim,
            "critic_optim": self.critic_optim,
        }
