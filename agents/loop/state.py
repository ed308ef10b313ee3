"""What a checkpoint holds: the run's counters (``new_counters``), ``TrainingState`` (the objects a checkpoint
saves and a resume restores), ``save_training_state`` and the finiteness check before a checkpoint."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

import her
from ..algos.base import Agent
from ..config import Config, config_dict
from ..run.checkpoint import (
    ReplayFiles,
    load_process_rng_state,
    load_replay_schedule,
    process_rng_state,
    replay_schedule,
)
from .collect import MadeVectorEnv, NetworksDiverged
from .evaluation import EvalLog
from .schedule import UpdateSchedule
from her_envs import set_vector_rng_states, vector_rng_states

if TYPE_CHECKING:
    from .hooks import LoopHooks

__all__ = ["TrainingState", "check_finite_parameters", "new_counters", "save_training_state"]


def new_counters() -> dict[str, Any]:
    """The run's counters, saved in every checkpoint: ``env_steps``, ``episodes``, ``updates``, ``evals``
    (ints) and ``wall_time`` (seconds, float)."""
    return {"env_steps": 0, "episodes": 0, "updates": 0, "evals": 0, "wall_time": 0.0}



@dataclass
class TrainingState:
    """The objects a checkpoint saves and a resume restores (the config aside).

    Shared by all processes of a run (``shared``): the agent and the counters. Each process's own
    (``own``): its RNGs (the loop's, torch's, the agent's exploration noise), the training envs' RNGs at
    the start of their current episodes and the eval envs' RNGs, the replay's schedules, the pending updates,
    the evaluation window and the hooks' state; the replay storage goes in a file of its own.
    ``env`` is None in a process without training envs (the Ape-X learner: ``LoopHooks.steps_envs`` False).
    """

    agent: Agent
    replay: her.HerReplayBuffer
    eval_env: MadeVectorEnv
    counters: dict[str, Any]
    schedule: UpdateSchedule
    evals: EvalLog
    rng: np.random.Generator | None = None
    env: MadeVectorEnv | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    """More entries for ``checkpoint.pt`` (e.g. the W&B run id)."""
    goals: her.MinDensityGoals | None = None
    """The behaviour-goal chooser (``env.behaviour_goals`` > 0), else None."""
    goal_given: np.ndarray | None = None
    """bool [n_envs]: which training envs pursue a behaviour goal in their current episode."""
    rare_states: bool = False
    """Whether the training envs archive states for rare-state starts (``env.rare_state_start`` > 0): their
    archives go into checkpoints."""
    replay_files: ReplayFiles | None = None
    """The replay on disk (made at the first checkpoint or the resume)."""
    envs_restored: bool = False
    """Whether ``restore`` restored the training envs' RNGs."""

    def shared(self, cfg: Config) -> dict[str, Any]:
        return {"agent": self.agent.state_dict(), "config": config_dict(cfg),
                "counters": dict(self.counters), **self.extra}

    def own(self, hooks: LoopHooks) -> dict[str, Any]:
        envs = {"eval": vector_rng_states(self.eval_env)}
        if self.env is not None:  # their next reset() redoes the one that began the current episodes
            envs["train"] = vector_rng_states(self.env, episode_start=True)
            if self.rare_states:
                envs["train_archive"] = list(self.env.get_attr("rare_state_archive"))
        return {
            "rng": process_rng_state(self.rng), "agent_rng": self.agent.rng.bit_generator.state, "envs": envs,
            "replay_schedule": replay_schedule(self.replay), "update_schedule": self.schedule.state_dict(),
            "eval_window": self.evals.state_dict(), "hooks": hooks.state_dict(),
            **({"behaviour_goals": self.goals.state_dict()} if self.goals is not None else {}),
        }

    def restore(self, state: dict[str, Any], own: dict[str, Any], replay_files: ReplayFiles,
                hooks: LoopHooks) -> str | None:
        """Load a checkpoint: ``state`` (``checkpoint.pt``, migrated to the current format), this process's
        ``own`` part of it and its replay files (none saved: the storage restarts empty, its sampling RNG and
        prioritized schedules continue). Returns why no replay was restored (None: it was).

        ``envs_restored`` says whether the training envs' RNGs were restored: then ``env.reset()`` redoes
        the resets that began their episodes at the checkpoint, as the uninterrupted run had them (a checkpoint
        of an older version has none). Entries None (a format-0 checkpoint without them,
        ``her_agents.run.checkpoint.migrate_checkpoint``) leave the freshly built values.
        """
        self.agent.load_state_dict(state["agent"])
        self.counters.update(state["counters"])
        load_process_rng_state(own["rng"], self.rng)
        if own["agent_rng"] is not None:
            self.agent.rng.bit_generator.state = own["agent_rng"]
        if own["replay_schedule"] is not None:
            load_replay_schedule(self.replay, own["replay_schedule"])
        missing = replay_files.load(own, int(state["counters"]["env_steps"]))
        self.replay_files = replay_files
        if own["update_schedule"] is not None:
            self.schedule.load_state_dict(own["update_schedule"])
        if own["eval_window"] is not None:
            self.evals.load_state_dict(own["eval_window"])
        hooks.load_state_dict(own["hooks"])
        if self.goals is not None and "behaviour_goals" in own:  # saved by runs with behaviour goals
            self.goals.load_state_dict(own["behaviour_goals"])
        envs = own["envs"]
        if len(envs.get("eval", ())) == self.eval_env.num_envs:  # env.eval_envs may change on resume
            set_vector_rng_states(self.eval_env, envs["eval"])
        if self.env is not None and self.rare_states and len(envs.get("train_archive", ())) == self.env.num_envs:
            self.env.set_attr("rare_state_archive", envs["train_archive"])
        self.envs_restored = self.env is not None and "train" in envs
        if self.envs_restored and self.env is not None:
            set_vector_rng_states(self.env, envs["train"])
        return missing


def save_training_state(run_dir: Path, cfg: Config, state: TrainingState, hooks: LoopHooks,
                        save_replay: bool) -> None:
    """Checkpoint ``state`` into ``run_dir`` through ``hooks.save_checkpoint`` (with ``save_replay``, the replay
    storage too)."""
    if state.replay_files is None:
        state.replay_files = ReplayFiles(run_dir, state.replay, hooks.replay_name)
    state.replay_files.saving = save_replay
    hooks.save_checkpoint(run_dir, state.shared(cfg), state.own(hooks), state.replay_files)


def check_finite_parameters(agent: Agent) -> None:
    """Raises ``NetworksDiverged`` when a floating-point tensor of ``agent.state_dict()`` (networks,
    optimizer moments, normalizers) holds a NaN or an infinity."""
    def walk(node: Any, path: str) -> None:
        if isinstance(node, torch.Tensor):
            if node.is_floating_point() and not bool(torch.isfinite(node).all()):
                raise NetworksDiverged(f"{path} is not finite", int(agent.num_updates))
        elif isinstance(node, np.ndarray):
            if node.dtype.kind == "f" and not np.isfinite(node).all():
                raise NetworksDiverged(f"{path} is not finite", int(agent.num_updates))
        elif isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{path}.{k}" if path else str(k))
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")

    walk(agent.state_dict(), "")
