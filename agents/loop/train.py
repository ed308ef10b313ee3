"""The training loop: collect with a vector env, store episodes, sample HER batches, update, evaluate, log.

``train(cfg)`` is ``start_run`` (set-up, resume) and then a loop of named steps: ``collect`` (act ->
step -> store, one env step of each env) and ``learn`` (the due updates), or with ``train.overlap_env`` both
at once, the updates done while env worker processes step (``collect_and_learn_overlapped``); every
``train.eval_every`` env
steps ``evaluate_and_checkpoint`` (log to stdout, metrics.csv, W&B; checkpoint atomically); a SIGINT /
SIGTERM checkpoints and stops (``checkpoint_on_stop``). It runs in one process; multi-process modes plug in
through ``LoopHooks``, and the loop stays the one loop: ``her_agents.distributed.data_parallel`` averages
gradients across ranks, and the Ape-X learner (``her_agents.distributed.actor_learner``) collects by receiving
its actors' episodes instead of stepping envs (``LoopHooks.collect``). Resume, signals, evaluation and
checkpoints are the loop's in every mode.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import Config
from ..run.run_control import GracefulStop, RunFailed
from .collect import NetworksDiverged
from .evaluation import EvalLog, evaluate
from .hooks import LoopHooks
from .schedule import UpdateSchedule
from .start import Run, build_agent, build_replay, open_run_dir, seed_everything, start_run, use_threads
from .state import TrainingState, check_finite_parameters, new_counters, save_training_state
from .steps import checkpoint_on_stop, collect_and_learn_overlapped, eval_due, evaluate_and_checkpoint, learn
from her_envs import EnvWorkerDied

# The loop's pieces live in the modules beside this one, by concern (start, steps, schedule, evaluation, state,
# hooks); they are bound here too, so that ``her_agents.loop.train.<name>`` reaches each.
__all__ = [
    "EvalLog",
    "LoopHooks",
    "Run",
    "TrainResult",
    "TrainingState",
    "UpdateSchedule",
    "build_agent",
    "build_replay",
    "check_finite_parameters",
    "evaluate",
    "new_counters",
    "open_run_dir",
    "save_training_state",
    "seed_everything",
    "start_run",
    "train",
    "use_threads",
]


@dataclass
class TrainResult:
    run_dir: Path
    env_steps: int
    eval_success_rate: float
    history: list[dict[str, Any]]



def train(cfg: Config, resume: str | None = None, overwrite: bool = False,
          hooks: LoopHooks | None = None) -> TrainResult:
    """Train ``cfg.algo`` with HER on ``cfg.env.id`` in this process.

    Args:
        cfg: a config from [`her_agents.config.load_config`][].
        resume: a run directory to continue from (its ``checkpoint.pt``).
        overwrite: allow a fresh run into a ``log.run_dir`` that holds another run (its files are replaced as
            this run writes its own, nothing is deleted before).
        hooks: a multi-process wrapper's hooks (``her_agents.distributed.data_parallel``); default: one process.

    Returns:
        TrainResult: run directory, env steps, the last eval success rate and the evaluation rows.

    Raises:
        ValueError: a config the agent, replay or env refuse; a run directory that holds a run (without
            ``overwrite``), cannot be written or is locked by a live run
            ([`RunDirInUse`][her_agents.run.run_control.RunDirInUse]); a checkpoint of
            a run of another number of processes.
        TrainingStopped: SIGINT or SIGTERM arrived; a checkpoint of the current state was written and the W&B
            run finished as interrupted / terminated.
    """
    hooks = hooks or LoopHooks()
    with GracefulStop(announce=hooks.is_main) as stop, contextlib.ExitStack() as cleanup:
        return _train(cfg, resume, overwrite, hooks, stop, cleanup)


def _train(cfg: Config, resume: str | None, overwrite: bool, hooks: LoopHooks, stop: GracefulStop,
           cleanup: contextlib.ExitStack) -> TrainResult:
    """``start_run``, then the loop's steps until ``train.total_env_steps`` or a stop; the logger finishes
    the run (``status``) whichever way the loop ends."""
    run = start_run(cfg, resume, overwrite, hooks, cleanup)
    status = "crashed"
    crash: BaseException | None = None
    try:
        hooks.start(run)
        while run.env_steps < run.cfg.train.total_env_steps:
            if hooks.should_stop(stop.signum is not None, run.env_steps):
                break
            if run.overlap_env:
                n_steps = collect_and_learn_overlapped(run, stop)
            else:
                n_steps = hooks.collect(run)
                learn(run, stop, n_steps)
            run.progress.update(n_steps)
            if eval_due(run):
                evaluate_and_checkpoint(run, stop)
        if run.env_steps < run.cfg.train.total_env_steps:  # stopped by SIGINT / SIGTERM
            stopped = checkpoint_on_stop(run, stop)
            status = stop.status  # only once the checkpoint is written: a failed one is a crash
            raise stopped
        status = "finished"
    except KeyboardInterrupt:  # a second signal: stop now
        status = "interrupted"
        raise
    except (EnvWorkerDied, NetworksDiverged) as exc:  # no checkpoint of this state: the last one stays
        crash = exc
        raise _run_failed(run, exc) from exc
    except BaseException as exc:
        crash = exc
        raise
    finally:
        run.progress.close()
        run.logger.finish(status, crash if status == "crashed" else None)
    return TrainResult(run.run_dir, run.env_steps, run.state.evals.last_eval.get("success_rate", float("nan")),
                       run.state.evals.history)


def _run_failed(run: Run, exc: EnvWorkerDied | NetworksDiverged) -> RunFailed:
    """The ``RunFailed`` of a fault the loop cannot go on from, saying what to change."""
    if isinstance(exc, NetworksDiverged):
        keys = [k for k in ("actor_lr", "critic_lr", "alpha_lr") if hasattr(run.cfg.agent, k)]
        now = ", ".join(f"{getattr(run.cfg.agent, k):g}" for k in keys)
        reason = f"{exc}: lower {', '.join('agent.' + k for k in keys)} (now {now}) and start a new run"
        if run.checkpoint_steps is not None:  # a resume applies the learning rates given to it
            reason += (f", or continue the last checkpoint with them lowered (`her-train --resume {run.run_dir} "
                       "agent.critic_lr=...`)")
        return RunFailed(reason, run.run_dir, run.env_steps, run.checkpoint_steps, resumable=False)
    reason = f"training {exc}"
    return RunFailed(reason, run.run_dir, run.env_steps, run.checkpoint_steps)

