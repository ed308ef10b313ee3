"""DDPG for goal-conditioned tasks (Lillicrap et al. 2016) with the openai/baselines HER techniques.

DDPG is TD3 (``her_agents.algos.td3``) with one critic, no target policy smoothing and no delay (Fujimoto et
al.
2018, Sec. 6.1 name the three pieces TD3 adds): one deterministic tanh actor, one critic, target networks with
polyak averaging, target Q clipped to ``q_clip``, action L2 penalty on the actor's tanh output. Only the config differs;
the update is [`TD3Agent.update`][her_agents.algos.td3.TD3Agent.update].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..fields import NON_NEGATIVE, check_ranges
from .base import AgentConfig
from .td3 import TD3Agent

__all__ = ["DDPGAgent", "DDPGConfig"]


@dataclass
class DDPGConfig(AgentConfig):
    """DDPG options (see [`her_agents.algos.base.AgentConfig`][] for the shared ones)."""

    action_l2: float = 1.0
    """Weight (>= 0) of ``mean(a^2)`` (a = the actor's tanh output in ``[-1, 1]``) added to the actor loss."""

    # TD3's pieces, fixed off (class constants, not config keys): one critic, no smoothing, no delay
    n_critics: ClassVar[int] = 1
    policy_noise: ClassVar[float] = 0.0
    noise_clip: ClassVar[float] = 0.0
    policy_delay: ClassVar[int] = 1
    clipped_double_q: ClassVar[bool] = True  # over one critic: the critic itself

    def __post_init__(self) -> None:
        """Raises:
            ValueError: as ``AgentConfig.__post_init__``, and a negative ``action_l2``."""
        super().__post_init__()
        check_ranges(self, {"action_l2": NON_NEGATIVE})


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
