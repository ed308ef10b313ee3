"""her_agents: goal-conditioned DDPG, TD3, SAC and TQC trained with HER on the Fetch tasks.

The package face, for a script or a notebook::

    from her_agents import load_config, train

    result = train(load_config("fetch_reach_ddpg", ["train.total_env_steps=2000"]))

The wings behind it: [`her_agents.algos`][] (the ``Agent`` protocol, one file per algorithm, the registry),
[`her_agents.loop`][] (the training loop and collection), [`her_agents.run`][] (run directory, checkpoints,
logging, video), [`her_agents.dist`][] (data-parallel and actor-learner training under torchrun), and
[`her_agents.config`][] (the typed config). The names below load on first use, so that ``import her_agents``
(and the command-line tools) stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .algos.base import Agent, AgentConfig
    from .algos.registry import agent_from_checkpoint, make_agent
    from .config import Config, load_config
    from .loop.train import TrainResult, evaluate, train
    from .run.checkpoint import load_checkpoint

__all__ = [
    "Agent",
    "AgentConfig",
    "Config",
    "TrainResult",
    "agent_from_checkpoint",
    "evaluate",
    "load_checkpoint",
    "load_config",
    "make_agent",
    "train",
]

_WHERE = {
    "Agent": ".algos.base",
    "AgentConfig": ".algos.base",
    "Config": ".config",
    "TrainResult": ".loop.train",
    "agent_from_checkpoint": ".algos.registry",
    "evaluate": ".loop.train",
    "load_checkpoint": ".run.checkpoint",
    "load_config": ".config",
    "make_agent": ".algos.registry",
    "train": ".loop.train",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
