"""The algorithms: the ``Agent`` protocol and the shared base (``base``), networks, the running normalizer, one
file per algorithm (``td3``; ``ddpg``, TD3 with one critic, no smoothing and no delay; ``sac``; ``tqc``), their
config dataclasses (``configs``, torch-free) and the registry that builds an agent from its ``algo`` name or from a
checkpoint.

The names below load on first use: importing ``her_agents.algos.configs`` (what the run config needs) imports
no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .base import Agent, GoalConditionedAgentBase
    from .configs import AgentConfig, DDPGConfig, SACConfig, TD3Config, TQCConfig, config_class
    from .ddpg import DDPGAgent
    from .registry import AGENTS, agent_from_checkpoint, make_agent
    from .sac import SACAgent
    from .td3 import TD3Agent
    from .tqc import TQCAgent

__all__ = [
    "AGENTS", "Agent", "AgentConfig", "DDPGAgent", "DDPGConfig", "GoalConditionedAgentBase", "SACAgent",
    "SACConfig", "TD3Agent", "TD3Config", "TQCAgent", "TQCConfig", "agent_from_checkpoint", "config_class",
    "make_agent",
]

_WHERE = {
    "AGENTS": ".registry", "Agent": ".base", "AgentConfig": ".configs", "DDPGAgent": ".ddpg",
    "DDPGConfig": ".configs", "GoalConditionedAgentBase": ".base", "SACAgent": ".sac", "SACConfig": ".configs",
    "TD3Agent": ".td3", "TD3Config": ".configs", "TQCAgent": ".tqc", "TQCConfig": ".configs",
    "agent_from_checkpoint": ".registry", "config_class": ".configs", "make_agent": ".registry",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
