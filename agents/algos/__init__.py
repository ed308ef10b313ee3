"""The algorithms: the ``Agent`` protocol and the shared base (``base``), networks, the running normalizer, one
file per algorithm (``td3``; ``ddpg``, TD3 with one critic, no smoothing and no delay; ``sac``; ``tqc``) and the
registry that builds an agent from its ``algo`` name or from a checkpoint."""

from .base import Agent, AgentConfig, GoalConditionedAgentBase
from .ddpg import DDPGAgent, DDPGConfig
from .registry import AGENTS, agent_from_checkpoint, config_class, make_agent
from .sac import SACAgent, SACConfig
from .td3 import TD3Agent, TD3Config
from .tqc import TQCAgent, TQCConfig

__all__ = [
    "AGENTS", "Agent", "AgentConfig", "DDPGAgent", "DDPGConfig", "GoalConditionedAgentBase", "SACAgent",
    "SACConfig", "TD3Agent", "TD3Config", "TQCAgent", "TQCConfig", "agent_from_checkpoint", "config_class",
    "make_agent",
]
