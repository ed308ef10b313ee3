"""DDPG for goal-conditioned tasks (Lillicrap et al. 2016) with the openai/baselines HER techniques.

DDPG is TD3 (``her_agents.algos.td3``) with one critic, no target policy smoothing and no delay (Fujimoto et
al.
2018, Sec. 6.1 name the three pieces TD3 adds): one deterministic tanh actor, one critic, target networks with
polyak averaging, target Q clipped to ``q_clip``, action L2 penalty on the actor's tanh output. Only the config differs;
the update is [`TD3Agent.update`][her_agents.algos.td3.TD3Agent.update].
"""

from __future__ import annotations


import torch

from .configs import DDPGConfig
from .td3 import TD3Agent

__all__ = ["DDPGAgent", "DDPGConfig"]


class DDPGAgent(TD3Agent):
    """Goal-conditioned DDPG: [`TD3Agent`][her_agents.algos.ddpg.TD3Agent] run with a
    [`DDPGConfig`][her_agents.algos.ddpg.DDPGConfig]. See
    [`her_agents.algos.base.GoalConditionedAgentBase`][] for the constructor arguments."""

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
