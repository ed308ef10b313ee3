"""``make_agent(algo, obs_dim, goal_dim, action_dim, **kwargs)``: the one factory the loop and CLI use, and the
algorithm names with their agent classes (the names with their config dataclasses, torch-free, are
``her_agents.algos.configs``'s, re-exported here)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from .base import GoalConditionedAgentBase, q_clip_for_env
from .configs import CONFIGS, AgentConfig, algo_name, config_class, config_fields
from .ddpg import DDPGAgent, DDPGConfig
from .sac import SACAgent, SACConfig
from .td3 import TD3Agent, TD3Config
from .tqc import TQCAgent, TQCConfig

__all__ = [
    "AGENTS", "AGENT_KWARGS", "agent_from_checkpoint", "algo_name", "config_class", "config_fields",
    "make_agent",
]

AGENTS: dict[str, tuple[type[GoalConditionedAgentBase], type[AgentConfig]]] = {
    "ddpg": (DDPGAgent, DDPGConfig),
    "td3": (TD3Agent, TD3Config),
    "sac": (SACAgent, SACConfig),
    "tqc": (TQCAgent, TQCConfig),
}
assert {k: c for k, (_, c) in AGENTS.items()} == CONFIGS, "every algorithm has its agent class and its config"

if TYPE_CHECKING:  # for mypy: each agent class satisfies the Agent protocol, what the loop uses of an agent
    from .base import Agent

    _AGENT_CLASSES: tuple[type[Agent], ...] = (DDPGAgent, TD3Agent, SACAgent, TQCAgent)

#: keyword arguments that go to the agent constructor rather than its config
AGENT_KWARGS = ("device", "n_threads")


def make_agent(algo: str, obs_dim: int, goal_dim: int, action_dim: int, config: AgentConfig | None = None,
               **kwargs: Any) -> GoalConditionedAgentBase:
    """Build a ``"ddpg"``, ``"td3"``, ``"sac"`` or ``"tqc"`` agent.

    Args:
        algo: the algorithm's name (case-insensitive).
        obs_dim: size of the flat observation.
        goal_dim: size of the goal.
        action_dim: size of the action.
        config: the algorithm's config dataclass (e.g. from [`her_agents.config.agent_config`][]); then
            ``kwargs`` may hold only ``device`` and ``n_threads``.
        kwargs: without ``config``, the algorithm's config fields (e.g. ``actor_lr=1e-3``,
            ``hidden=[256, 256, 256]``), validated by its dataclass; and ``device`` (``"auto"|"cpu"|"cuda"``)
            and ``n_threads`` for the agent constructor.

    Raises:
        ValueError: an unknown algo or option name (listing the valid ones), an option the config dataclass
            refuses (wrong type or out of range), or ``config`` together with config fields.
        TypeError: ``config`` is not the algorithm's config dataclass.
    """
    agent_cls, config_cls = AGENTS[algo_name(algo)]
    agent_kw = {k: kwargs.pop(k) for k in AGENT_KWARGS if k in kwargs}
    if config is None:
        valid = [f.name for f in dataclasses.fields(config_cls)]
        unknown = sorted(set(kwargs) - set(valid))
        if unknown:
            raise ValueError(
                f"unknown option(s) for {algo!r}: {unknown}; valid options: {sorted(valid + list(AGENT_KWARGS))}"
            )
        config = config_cls(**kwargs)
    elif kwargs:
        raise ValueError(f"pass config= or config options, not both (got config and {sorted(kwargs)})")
    elif not isinstance(config, config_cls):
        raise TypeError(f"config of {algo!r} must be a {config_cls.__name__}, got {type(config).__name__}")
    return agent_cls(obs_dim, goal_dim, action_dim, config, **agent_kw)


def agent_from_checkpoint(state: dict[str, Any], device: str = "cpu", **overrides: Any) -> GoalConditionedAgentBase:
    """The agent a checkpoint holds: built from its config's ``algo`` and ``agent`` section for its env's spaces
    (``q_clip``, where the section leaves it out, derived from the env's reward range as the training loop did),
    then loaded with its weights and normalizers.

    Args:
        state: a checkpoint as [`her_agents.run.checkpoint.load_checkpoint`][] returns it.
        device: ``"auto"``, ``"cpu"`` or ``"cuda"``.
        overrides: agent config fields replaced before the agent is built (e.g. ``compile=False`` for a short
            evaluation that would not pay back the compilation).

    Raises:
        ValueError: as [`make_agent`][her_agents.algos.registry.make_agent], for an override it refuses.
    """
    from her_envs import goal_env_spec  # agents may import envs; kept local so the registry stays light

    cfg = state["config"]
    spec = goal_env_spec(cfg["env"]["id"])
    section = dict(cfg["agent"])
    if "q_clip" not in section:
        section["q_clip"] = q_clip_for_env(spec.reward_range, cfg["train"]["gamma"], cfg["env"]["id"])
    agent = make_agent(cfg["algo"], spec.observation_dim, spec.goal_dim, spec.action_dim, device=device,
                       **{**section, **overrides})
    agent.load_state_dict(state["agent"])
    return agent
