"""The training loop of one process (``train``: collect, learn, evaluate, checkpoint) and its steps on a vector
env (``collect``); the pieces are public for the multi-process wrappers in [`her_agents.dist`][].

The loop itself, ``her_agents.train`` (``her_agents.loop.train.train``), is not bound here: ``train`` here is
the module, so that ``her_agents.loop.train.<name>`` (imports, ``monkeypatch``) reaches it."""

from .collect import choose_action, collect_step, learn_step, normalize_from_episode
from .train import (
    EvalLog,
    LoopHooks,
    TrainingState,
    TrainResult,
    UpdateSchedule,
    build_agent,
    build_replay,
    evaluate,
)

__all__ = [
    "EvalLog", "LoopHooks", "TrainResult", "TrainingState", "UpdateSchedule", "build_agent", "build_replay",
    "choose_action", "collect_step", "evaluate", "learn_step", "normalize_from_episode",
]
