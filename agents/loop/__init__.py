"""The training loop of one process (``train``: collect, learn, evaluate, checkpoint) and its steps on a vector
env (``collect``); the pieces are public for the multi-process wrappers in [`her_agents.distributed`][].

Modules by concern: ``train`` (the loop), ``start`` (set-up and resume: ``start_run``, the agent and replay of a
config), ``steps`` (the loop's named steps on a started run), ``schedule`` (due updates), ``evaluation``,
``state`` (what a checkpoint holds), ``hooks`` (where multi-process wrappers plug in), ``collect`` (acting,
stepping and storing, one HER update). ``her_agents.loop.train`` binds every public name of them as before.

The loop itself, ``her_agents.train`` (``her_agents.loop.train.train``), is not bound here: ``train`` here is
the module, so that ``her_agents.loop.train.<name>`` reaches it. To replace a function the loop calls (tests'
``monkeypatch``), patch it in the module that calls it (e.g. ``her_agents.loop.steps.learn_step``)."""

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
