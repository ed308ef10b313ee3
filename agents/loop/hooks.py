"""``LoopHooks``: where a multi-process wrapper plugs into the loop; the defaults are the single process's."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..algos.base import Agent
from ..run.checkpoint import ReplayFiles, save_checkpoint
from .schedule import UpdateSchedule
from .steps import collect

if TYPE_CHECKING:
    from .start import Run

__all__ = ["LoopHooks"]

T = TypeVar("T")


class LoopHooks:
    """Where a multi-process wrapper plugs into [`train`][her_agents.loop.train.train]; these defaults are the
    single process's.

    ``her_agents.distributed.data_parallel.DistContext`` subclasses it for data-parallel training. The loop calls
    ``should_stop`` once per env step and ``before_updates`` once per block of updates; the others at
    set-up, evaluations and checkpoints.
    """

    is_main: bool = True
    """This process picks and locks the run directory and logs (stdout, ``metrics.csv``, W&B)."""
    world_size: int = 1
    """Processes in the run that hold state of their own: a checkpoint is resumed by as many."""
    steps_envs: bool = True
    """This process steps training envs (``collect``); False: ``collect`` brings the env steps from
    elsewhere and the loop opens no training envs (the actor-learner's learner)."""
    run_label: str | None = None
    """The algorithm's part of a default run directory name (None: ``algo``)."""

    def start(self, run: Run) -> None:
        """After ``start_run`` (a resume's checkpoint loaded), before the first step."""

    def collect(self, run: Run) -> int:
        """One collection step of the loop; returns the env steps it stored (``collect``: one per env). Not called
        with ``train.overlap_env`` (and training envs), whose step collects and learns at once."""
        return collect(run)

    def share(self, obj: T) -> T:
        """The main process's ``obj`` on every process (the run directory, a refusal)."""
        return obj

    def wrap_agent(self, agent: Agent) -> Agent:
        """The agent the loop trains, built from the one of the config (before a checkpoint is loaded into it)."""
        return agent

    def should_stop(self, requested: bool, env_steps: int) -> bool:
        """Stop before the next env step? ``requested``: a SIGINT / SIGTERM arrived in this process."""
        return requested

    def before_updates(self, schedule: UpdateSchedule) -> None:
        """At each block of updates, before ``schedule.take()``."""

    def average_eval(self, ev: dict[str, float]) -> dict[str, float]:
        """The evaluation result a row logs ([`evaluate`][her_agents.loop.evaluation.evaluate] of this process's
        eval envs)."""
        return ev

    def row_extras(self, row: dict[str, Any]) -> dict[str, Any]:
        """Columns added to each evaluation row."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """This process's state of the hooks, saved with its part of the checkpoint."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    replay_name: str = "replay"
    """This process's replay files (``her_agents.run.checkpoint.replay_name``)."""

    def save_checkpoint(self, run_dir: Path, shared: dict[str, Any], own: dict[str, Any],
                        replay: ReplayFiles) -> None:
        """Write ``shared`` (the agent, config, counters: the same on every process) and this process's ``own``
        state to ``checkpoint.pt``, with ``replay`` (or without: ``replay.saving`` False, ``log.save_replay``
        off) in the crash-safe order of ``her_agents.run.checkpoint.ReplayFiles``."""
        if not replay.saving:  # replay files of an overwritten run or of earlier checkpoints: not this state
            save_checkpoint(run_dir / "checkpoint.pt", {**shared, **own, "world_size": 1})
            replay.remove()
            return
        own = {**own, **replay.prepare(int(shared["counters"]["env_steps"]))}
        try:
            save_checkpoint(run_dir / "checkpoint.pt", {**shared, **own, "world_size": 1})
        except BaseException:
            replay.abort()
            raise
        replay.commit()

    def checkpoint_part(self, state: dict[str, Any]) -> dict[str, Any]:
        """This process's own state in ``state`` (a loaded ``checkpoint.pt`` of a run of as many processes)."""
        return state

