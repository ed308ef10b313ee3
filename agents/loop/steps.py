"""The loop's named steps on a started ``Run``: ``collect`` (one env step of every training env), ``learn``
(the due updates), or both at once with the env step overlapped (``collect_and_learn_overlapped``),
``evaluate_and_checkpoint`` and ``checkpoint_on_stop``."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from tqdm import tqdm

import her
from ..run.run_control import GracefulStop, TrainingStopped
from .collect import choose_action, choose_behaviour_goals, learn_step, normalize_from_episode, store_step
from .state import check_finite_parameters, save_training_state

if TYPE_CHECKING:
    from .start import Run

__all__ = ["checkpoint_on_stop", "collect", "collect_and_learn_overlapped", "eval_due", "evaluate_and_checkpoint", "first_learn_step", "learn",
           "write_checkpoint"]


def collect(run: Run) -> int:
    """One env step of every training env: act, step, store the real next state (never the autoreset one),
    count finished episodes and their successes, and feed the normalizers the episodes completed. Returns the
    env steps stored (``env.n_envs``)."""
    assert run.state.env is not None, "a process that collects has training envs"
    action = _act(run)
    return _store(run, action, run.state.env.step(action))


def collect_and_learn_overlapped(run: Run, stop: GracefulStop) -> int:
    """[`collect`][her_agents.loop.steps.collect] and [`learn`][her_agents.loop.steps.learn] with the env
    step overlapped (``train.overlap_env``): act, hand the actions to the env worker processes
    (``step_async``), do this step's due updates while they step, then wait for the step (``step_wait``) and
    store it. The updates see the replay and normalizers without this step's transition (a one-step lag: an
    episode this step ends joins them after its updates); the same RNG draws happen in the same order every
    time, so a seed gives one run and a resume continues it exactly. Returns the env steps stored (``env.n_envs``)."""
    env = run.state.env
    assert isinstance(env, gym.vector.AsyncVectorEnv), "train.overlap_env steps the envs in worker processes"
    action = _act(run)
    env.step_async(action)
    learn(run, stop, run.n_envs, env_steps=run.state.counters["env_steps"] + run.n_envs)
    return _store(run, action, env.step_wait())


def _act(run: Run) -> np.ndarray:
    """The actions of this env step: uniform during ``train.warmup_steps``, then the agent's exploring ones."""
    s = run.state
    assert s.rng is not None, "a process that collects has its RNG"
    warmup = s.counters["env_steps"] < run.cfg.train.warmup_steps
    return choose_action(s.agent, run.obs, run.spec, run.n_envs, warmup, s.rng)


def _store(run: Run, action: np.ndarray, result: Any) -> int:
    """Store the env step ``result`` (of ``action`` from ``run.obs``) and do its bookkeeping (``collect``)."""
    s, t_cfg = run.state, run.cfg.train
    assert s.env is not None and s.rng is not None, "a process that collects has training envs"
    run.obs, step, stored = store_step(result, run.obs, action, s.replay, run.spec.info_shapes, run.reward_guard,
                                       run.env_id)
    s.counters["env_steps"] += run.n_envs
    if step.done.any():
        s.agent.reset_noise(step.done)
        s.evals.train_successes.extend(step.is_success[step.done].astype(float).tolist())  # in place: EvalLog's
        s.counters["episodes"] += int(step.done.sum())
        if s.goals is not None:  # MEGA's cutoff follows the behaviour-goal episodes' success
            assert s.goal_given is not None, "set with the goals"
            s.goals.record(step.is_success[step.done & s.goal_given])
            s.goal_given[step.done] = choose_behaviour_goals(s.agent, s.replay, s.env, run.obs, step.done,
                                                             run.cfg.env.behaviour_goals, s.goals, s.rng)[step.done]
    for start, T in stored:  # normalizer statistics from the new episodes, with relabeled goals
        normalize_from_episode(s.agent, s.replay, start, T, t_cfg.normalizer_relabeled)
    return run.n_envs


def learn(run: Run, stop: GracefulStop, n_steps: int | None = None, env_steps: int | None = None) -> None:
    """Earn the updates of the ``n_steps`` env steps just collected (default one per env); do the due ones each
    time the env steps pass a multiple of ``train.update_every``. ``env_steps``: the run's env steps with
    these (default the counter's; ``collect_and_learn_overlapped`` learns before it stores them)."""
    s = run.state
    env_steps = s.counters["env_steps"] if env_steps is None else env_steps
    n_steps = run.n_envs if n_steps is None else n_steps
    s.schedule.collect(n_steps, env_steps, len(s.replay) > 0)
    every = run.cfg.train.update_every
    if env_steps // every == (env_steps - n_steps) // every:  # none passed
        return
    run.hooks.before_updates(s.schedule)
    n_updates = s.schedule.take()
    for _ in range(n_updates):
        if run.first_update:
            _first_update(run, stop)
        else:
            learn_step(s.agent, s.replay, run.cfg.train.batch_size, s.evals.metrics)
    s.counters["updates"] += n_updates


def _first_update(run: Run, stop: GracefulStop) -> None:
    """The process's first update: with ``agent.compile`` it compiles, so a signal then waits for it
    (``stop.busy``) and the main process says so first (``first_learn_step``)."""
    run.first_update = False
    compiling = run.cfg.agent.compile
    stop.busy = "the first update's compile (1-2 min on an idle core)" if compiling else None
    first_learn_step(run.state.agent, run.state.replay, run.cfg.train.batch_size, run.state.evals.metrics,
                     compiling and run.hooks.is_main)
    stop.busy = None


def first_learn_step(agent, replay: her.HerReplayBuffer, batch_size: int, metrics: dict[str, list[float]],
                     compile_note: bool) -> None:
    """[`learn_step`][her_agents.loop.collect.learn_step] for a process's first update: with ``compile_note``
    (``agent.compile``), one line first
    says that the update is being compiled (it seems to hang for that long otherwise); the
    warnings the update raises (a failed compile) are written as lines of their own above the progress bar."""
    if compile_note:
        tqdm.write("agent.compile: compiling the update (the first update takes 1-2 min on an idle core, seconds once "
                   "cached on disk, minutes on a busy one)")
    with warnings.catch_warnings(record=True) as caught:  # the filters stay: only what would be shown is written
        learn_step(agent, replay, batch_size, metrics)
    for w in caught:
        tqdm.write(f"{w.category.__name__}: {w.message}")


def eval_due(run: Run) -> bool:
    """Every ``train.eval_every`` env steps, and at the end of training."""
    return run.env_steps >= run.next_eval or run.env_steps >= run.cfg.train.total_env_steps


def evaluate_and_checkpoint(run: Run, stop: GracefulStop | None = None) -> None:
    """Evaluate and log a row, record a video every ``log.video_every`` evaluations, and checkpoint. A signal in
    between waits for all three (``stop.busy`` says so), then the loop stops."""
    s = run.state
    if stop is not None:
        stop.busy = f"the evaluation at {s.counters['env_steps']} env steps (and its checkpoint)"
    run.next_eval = (s.counters["env_steps"] // run.cfg.train.eval_every + 1) * run.cfg.train.eval_every
    extras = {"explore/goal_cutoff": s.goals.cutoff} if s.goals is not None else None  # MEGA's current cutoff
    row = s.evals.log(s.agent, s.eval_env, run.cfg.train.eval_episodes, run.logger, run.hooks, extras)
    if run.cfg.log.video_every and s.counters["evals"] % run.cfg.log.video_every == 0:
        run.logger.log_video(s.agent, run.env_id, step=s.counters["env_steps"])
    run.progress.set_postfix(eval_success=f"{row['eval/success_rate']:.2f}")
    s.evals.start_window()  # evaluating is not counted in env steps/s
    if run.cfg.log.checkpoint:
        write_checkpoint(run)
    if stop is not None:
        stop.busy = None


def checkpoint_on_stop(run: Run, stop: GracefulStop) -> TrainingStopped:
    """After a SIGINT / SIGTERM: checkpoint the current state; returns the
    [`TrainingStopped`][her_agents.run.run_control.TrainingStopped] to raise."""
    run.state.evals.wall_time()
    if run.cfg.log.checkpoint:
        write_checkpoint(run)
    return TrainingStopped(stop.signum or 2, run.run_dir, run.env_steps,
                           run.run_dir / "checkpoint.pt" if run.cfg.log.checkpoint else None)


def write_checkpoint(run: Run) -> None:
    """Checkpoint the run (``save_training_state``) and tell the logger, which keeps metrics.csv and W&B in
    step with what a resume would redo."""
    run.state.extra["wandb_id"] = run.logger.run_id or run.wandb_id
    run.state.extra["video_steps"] = list(run.logger.video_steps)  # a resume sends them again with their rows
    check_finite_parameters(run.state.agent)  # never replace the last good checkpoint by NaN weights
    try:
        save_training_state(run.run_dir, run.cfg, run.state, run.hooks, run.cfg.log.save_replay)
    except OSError:  # e.g. a full disk: metrics.csv keeps only the rows the previous checkpoint covers
        run.logger.checkpoint_failed()
        raise
    run.checkpoint_steps = run.env_steps
    run.logger.checkpointed()  # W&B gets a row once a resume would not redo it


