"""``make_agent(algo, obs_dim, goal_dim, action_dim, **kwargs)``: the one factory the loop and CLI use."""

from __future__ import annotations

import dataclasses
from typing import Any

from her_agents.base import AgentConfig, GoalConditionedAgentBase
from her_agents.ddpg import DDPGAgent, DDPGConfig
from her_agents.sac import SACAgent, SACConfig
from her_agents.td3 import TD3Agent, TD3Config

AGENTS: dict[str, tuple[type[GoalConditionedAgentBase], type[AgentConfig]]] = {
    "ddpg": (DDPGAgent, DDPGConfig),
    "td3": (TD3Agent, TD3Config),
    "sac": (SACAgent, SACConfig),
}

#: keyword arguments that go to the agent constructor rather than its config
AGENT_KWARGS = ("device", "n_threads")


def config_fields(algo: str) -> list[str]:
    """Names of the config options of ``algo``."""
    return [f.name for f in dataclasses.fields(_lookup(algo)[1])]


def _lookup(algo: str) -> tuple[type[GoalConditionedAgentBase], type[AgentConfig]]:
    key = str(algo).lower()
    if key not in AGENTS:
        raise ValueError(f"unknown algo {algo!r}; valid algos: {sorted(AGENTS)}")
    return AGENTS[key]


def make_agent(algo: str, obs_dim: int, goal_dim: int, action_dim: int, **kwargs: Any) -> GoalConditionedAgentBase:
    """Build a ``"ddpg"``, ``"td3"`` or ``"sac"`` agent.

    ``kwargs`` are the algorithm's config fields (e.g. ``actor_lr=1e-3``, ``hidden=[256, 256, 256]``) plus
    ``device`` (``"auto"|"cpu"|"cuda"``) and ``n_threads``. Unknown names raise a ValueError listing them
    and the valid ones.
    """
    agent_cls, config_cls = _lookup(algo)
    valid = [f.name for f in dataclasses.fields(config_cls)]
    unknown = sorted(set(kwargs) - set(valid) - set(AGENT_KWARGS))
    if unknown:
        raise ValueError(
            f"unknown option(s) for {algo!r}: {unknown}; valid options: {sorted(valid + list(AGENT_KWARGS))}"
        )
    agent_kw = {k: kwargs.pop(k) for k in AGENT_KWARGS if k in kwargs}
    return agent_cls(obs_dim, goal_dim, action_dim, config_cls(**kwargs), **agent_kw)
