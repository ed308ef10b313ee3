"""The training loop: collect with a vector env, store episodes, sample HER batches, update, evaluate, log.

``train(cfg)`` is ``start_run`` (set-up, resume) and then a loop of named steps: ``collect`` (act ->
step -> store, one env step of each env) and ``learn`` (the due updates); every ``train.eval_every`` env
steps ``evaluate_and_checkpoint`` (log to stdout, metrics.csv, W&B; checkpoint atomically); a SIGINT /
SIGTERM checkpoints and stops (``checkpoint_on_stop``). It runs in one process; multi-process modes plug in
through ``LoopHooks``, and the loop stays the one loop: ``her_agents.distributed.data_parallel`` averages
gradients across ranks, and the Ape-X learner (``her_agents.distributed.actor_learner``) collects by receiving
its actors' episodes instead of stepping envs (``LoopHooks.collect``). Resume, signals, evaluation and
checkpoints are the loop's in every mode.
"""

from __future__ import annotations

import contextlib
import random
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import gymnasium as gym
import numpy as np
import torch
from tqdm import tqdm

import her
from ..algos.base import Agent, q_clip_for_env
from ..algos.registry import make_agent
from ..config import Config, agent_config, check_device, config_dict, config_yaml
from ..run.checkpoint import (
    ReplayFiles,
    check_world_size,
    load_checkpoint,
    load_process_rng_state,
    load_replay_schedule,
    process_rng_state,
    replay_schedule,
    save_checkpoint,
    write_atomic,
)
from ..run.logger import NullLogger, RunLogger
from ..run.run_control import GracefulStop, RunDirLock, RunFailed, TrainingStopped, prepare_run_dir
from ..tools import allocation_failure
from .collect import (
    MadeVectorEnv,
    NetworksDiverged,
    check_finite_actions,
    choose_action,
    choose_behaviour_goals,
    collect_step,
    learn_step,
    normalize_from_episode,
)
from her_envs import (
    EnvWorkerDied,
    GoalEnvSpec,
    goal_env_spec,
    make_vector_env,
    set_vector_rng_states,
    split_autoreset,
    vector_rng_states,
)

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
]

T = TypeVar("T")


@dataclass
class TrainResult:
    run_dir: Path
    env_steps: int
    eval_success_rate: float
    history: list[dict[str, Any]]


# ---------------------------------------------------------------------------------------------------------
# Set-up
# ---------------------------------------------------------------------------------------------------------


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_agent(cfg: Config, spec: GoalEnvSpec, seed: int | None = None,
                device: str | None = None) -> tuple[Agent, tuple[float, float] | None]:
    """The agent of ``cfg`` (``algo``, ``agent.*``) for the env of ``spec``, and the reward range its rewards
    must keep to (``collect_step``'s ``reward_range``).

    ``agent.q_clip`` unset (in ``cfg.agent_unset``): derived from the env's reward range, which the rewards must
    then keep to; set: it must contain the env's rewards, and no range is returned. ``agent.noise_horizon`` unset:
    the env's episode length (``spec.max_episode_steps``) where it has one. ``seed``: the exploration
    noise's seed (default ``train.seed``); ``device``: default ``train.device``.

    Raises:
        ValueError: an option the agent refuses, a ``q_clip`` that excludes the env's rewards, a device the
            machine does not have, networks (``agent.hidden``) too large for its memory.
    """
    configured = {} if "q_clip" in cfg.agent_unset else {"configured": cfg.agent.q_clip}
    q_clip = q_clip_for_env(spec.reward_range, cfg.train.gamma, cfg.env.id, **configured)
    derived = {}
    if "noise_horizon" in cfg.agent_unset and spec.max_episode_steps:  # one colored sequence per episode
        derived["noise_horizon"] = int(spec.max_episode_steps)
    config = agent_config(cfg, seed=cfg.train.seed if seed is None else seed, q_clip=q_clip, **derived)
    device = cfg.train.device if device is None else device
    check_device(device)
    try:
        agent = make_agent(cfg.algo, spec.observation_dim, spec.goal_dim, spec.action_dim, config=config,
                           device=device, n_threads=cfg.train.torch_threads)
    except (RuntimeError, MemoryError) as exc:
        asked = allocation_failure(exc)
        if asked is None:
            raise
        raise ValueError(f"agent.hidden={list(cfg.agent.hidden)}: the networks do not fit in memory (torch asked "
                         f"for {asked} at once for one layer): use smaller layers") from None
    return agent, (None if configured else spec.reward_range)


def build_replay(cfg: Config, spec: Any, total_updates: int) -> her.HerReplayBuffer:
    """The HER replay of the config: storage, sampler (uniform, TD-error prioritized or energy-based), relabeling
    and n-step returns.

    Raises:
        ValueError: a capacity under one episode; ``replay.energy`` for an env without a ``dt`` or without
            3-D goals.
    """
    r = cfg.replay
    if spec.max_episode_steps and r.capacity < spec.max_episode_steps:
        raise ValueError(f"replay.capacity must hold at least one episode of {cfg.env.id} "
                         f"({spec.max_episode_steps} steps), got {r.capacity}")
    storage = her.EpisodeStorage(
        r.capacity, (spec.observation_dim,), (spec.action_dim,), (spec.goal_dim,),
        max_episode_steps=spec.max_episode_steps or 50, n_envs=cfg.env.n_envs,
        info_shapes=dict(spec.info_shapes),
    )
    sampler: her.Sampler | None = None
    if r.prioritized:
        sampler = her.PrioritizedSampler(
            alpha=r.alpha, beta0=r.beta0, beta_annealing_steps=total_updates, eps=r.eps,
            td_error_clip=r.td_error_clip, rank_based=r.rank_based,
        )
    elif r.energy:
        if spec.dt is None:
            raise ValueError(f"replay.energy needs an env with a dt (seconds per step) to read velocities; "
                             f"{cfg.env.id} has none: set replay.energy=false")
        if spec.goal_dim < 3:
            raise ValueError(f"replay.energy needs goals that start with a 3-D position; {cfg.env.id}'s goals have "
                             f"{spec.goal_dim} coordinates: set replay.energy=false")
        sampler = her.EnergySampler(dt=spec.dt, clip_energy=r.energy_clip, eps=r.energy_eps,
                                    kinetic_weight=r.energy_kinetic_weight, exponent=r.energy_exponent)
    return her.HerReplayBuffer(
        storage, spec.compute_reward, strategy=r.strategy, n_sampled_goal=r.n_sampled_goal,
        other_desired_fraction=r.other_desired_fraction, n_step=r.n_step, gamma=cfg.train.gamma, sampler=sampler,
        stop_at_success=r.stop_at_success, compute_success=spec.compute_success, seed=cfg.train.seed,
        compute_terminated=getattr(spec, "compute_terminated", None),  # envs that end episodes on success
    )


def open_run_dir(cfg: Config, seed: int, resume: str | None, overwrite: bool,
                 algo_name: str | None = None) -> RunDirLock:
    """Pick, create and lock the run directory ([`her_agents.run.run_control.prepare_run_dir`][]; the default
    name has ``algo_name``, default ``algo``) and write the resolved config to ``config.yaml`` in it (a resume
    rewrites it with its overrides). Returns the held lock; ``.run_dir`` is the directory.

    Raises:
        ValueError: as ``prepare_run_dir`` (a directory that holds a run, cannot be written, is locked).
        OSError: ``config.yaml`` cannot be written.
    """
    lock = prepare_run_dir(cfg.env.id, algo_name or cfg.algo, seed, cfg.log.run_dir, resume, overwrite)
    try:
        text = config_yaml(cfg).encode()
        write_atomic(lock.run_dir / "config.yaml", lambda f: f.write(text))
    except BaseException:
        lock.release()
        raise
    return lock


def new_counters() -> dict[str, Any]:
    """The run's counters, saved in every checkpoint: ``env_steps``, ``episodes``, ``updates``, ``evals``
    (ints) and ``wall_time`` (seconds, float)."""
    return {"env_steps": 0, "episodes": 0, "updates": 0, "evals": 0, "wall_time": 0.0}


# ---------------------------------------------------------------------------------------------------------
# Updates, evaluation, checkpoints
# ---------------------------------------------------------------------------------------------------------


@dataclass
class UpdateSchedule:
    """How many updates are due: ``updates_per_step`` per env step collected once ``learning_starts`` env steps
    are and the replay can sample; none are earned before. Fractions carry over (``pending``), so any ratio is
    kept on average; the loop does the due updates in blocks every ``train.update_every`` env steps."""

    updates_per_step: float
    learning_starts: int
    pending: float = 0.0
    """Updates earned and not done yet."""
    can_learn: bool = False
    """Whether the last [`collect`][her_agents.loop.train.UpdateSchedule.collect] allowed updates."""

    def collect(self, n_steps: int, env_steps: int, can_sample: bool = True) -> None:
        """Earn the updates of ``n_steps`` new env steps; ``env_steps``: the run's count after them."""
        self.can_learn = env_steps >= self.learning_starts and can_sample
        self.pending = self.pending + n_steps * self.updates_per_step if self.can_learn else 0.0

    def take(self, limit: int | None = None) -> int:
        """The number of whole updates to do now (at most ``limit``), removed from ``pending``."""
        n = int(self.pending) if self.can_learn else 0
        if limit is not None and n > limit:
            n = limit
        self.pending -= n
        return n

    def state_dict(self) -> dict[str, Any]:
        return {"pending": self.pending, "can_learn": self.can_learn}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pending, self.can_learn = float(state["pending"]), bool(state["can_learn"])


def evaluate(agent: Agent, env: gym.vector.VectorEnv, n_episodes: int, seed: int | None = None) -> dict[str, float]:
    """Run ``n_episodes`` deterministic episodes on a vector env (SAME_STEP autoreset).

    Env ``i`` of the ``n`` envs runs its share, ``n_episodes // n`` episodes plus one for ``i < n_episodes % n``,
    and its later episodes are not counted: keeping the first episodes to *finish* instead would over-count
    short episodes when lengths differ. Success is ``info["is_success"]`` at each episode's last step.

    Returns:
        ``success_rate``, ``final_distance`` (mean distance achieved-desired goal at the end, in the goal's units,
        metres for Fetch) and ``return`` (mean undiscounted episode return), each a float over the
        ``n_episodes`` episodes.
    """
    obs, _ = env.reset(seed=seed)
    n = env.num_envs
    share = n_episodes // n + (np.arange(n) < n_episodes % n)
    finished = np.zeros(n, np.int64)
    successes: list[float] = []
    distances: list[float] = []
    returns: list[float] = []
    ep_return = np.zeros(n)
    while (finished < share).any():
        action = check_finite_actions(agent, agent.act(obs["observation"], obs["desired_goal"], deterministic=True))
        obs, reward, terminated, truncated, infos = env.step(action)
        ep_return += reward
        step = split_autoreset(obs, terminated, truncated, infos)
        for i in np.flatnonzero(step.done):
            if finished[i] < share[i]:
                successes.append(float(step.is_success[i]))
                ag, dg = step.real_next_obs["achieved_goal"][i], step.real_next_obs["desired_goal"][i]
                distances.append(float(np.linalg.norm(ag - dg)))
                returns.append(float(ep_return[i]))
            finished[i] += 1
            ep_return[i] = 0.0
    return {
        "success_rate": float(np.mean(successes)),
        "final_distance": float(np.mean(distances)),
        "return": float(np.mean(returns)),
    }


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
        """One collection step of the loop; returns the env steps it stored (``collect``: one per env)."""
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
        """The evaluation result a row logs ([`evaluate`][her_agents.loop.train.evaluate] of this process's
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


class EvalLog:
    """The evaluation rows of a run and what they report of the env steps since the previous evaluation: the
    exploring policy's episode successes (``train_successes``), the updates' scalar metrics
    (``metrics``, the ``metrics`` argument of ``learn_step``), env steps/s and wall time.

    ``counters``: the run's counters (``new_counters``); [`log`][her_agents.loop.train.EvalLog.log] advances
    ``evals`` and ``wall_time``.
    """

    def __init__(self, counters: dict[str, Any]) -> None:
        self.counters = counters
        self.train_successes: list[float] = []
        self.metrics: dict[str, list[float]] = {}
        self.history: list[dict[str, Any]] = []
        self.last_eval: dict[str, float] = {}
        self.start()

    def start(self) -> None:
        """Start the clocks at the counters' ``wall_time`` and ``env_steps`` (once a checkpoint is loaded)."""
        self._wall0, self._t0 = float(self.counters["wall_time"]), time.perf_counter()
        self.start_window()

    def start_window(self) -> None:
        """Start measuring env steps/s (after an evaluation, so that evaluating is not counted)."""
        self._window_steps, self._window_t = int(self.counters["env_steps"]), time.perf_counter()

    def wall_time(self) -> float:
        """Seconds of training so far, over all resumes; also stored in ``counters["wall_time"]``."""
        self.counters["wall_time"] = self._wall0 + time.perf_counter() - self._t0
        return self.counters["wall_time"]

    def log(self, agent: Agent, eval_env: gym.vector.VectorEnv, n_episodes: int, logger: RunLogger | NullLogger,
            hooks: LoopHooks, extras: dict[str, Any] | None = None) -> dict[str, Any]:
        """Evaluate ``n_episodes`` episodes, log the row (``logger.log``) and clear the window's successes and
        metrics. Returns the row: counters, ``eval/*``, ``train/success_rate``, ``train/<metric>`` means,
        ``env_steps_per_s``, then ``extras`` and ``hooks.row_extras``."""
        c = self.counters
        now = time.perf_counter()
        ev = hooks.average_eval(evaluate(agent, eval_env, n_episodes))
        c["evals"] += 1
        row = {
            "env_steps": c["env_steps"], "episodes": c["episodes"], "updates": c["updates"],
            "wall_time": round(self.wall_time(), 2), "eval/success_rate": ev["success_rate"],
            "eval/final_distance": ev["final_distance"], "eval/return": ev["return"],
            "train/success_rate": float(np.mean(self.train_successes)) if self.train_successes else float("nan"),
            "env_steps_per_s": (c["env_steps"] - self._window_steps) / max(now - self._window_t, 1e-9),
        }
        row.update({f"train/{k}": float(np.mean(v)) for k, v in self.metrics.items()})
        row.update(extras or {})
        row.update(hooks.row_extras(row))
        logger.log(row, step=c["env_steps"])
        self.history.append(row)
        self.last_eval = ev
        self.train_successes.clear()  # in place: the loop holds these lists
        self.metrics.clear()
        return row

    def state_dict(self) -> dict[str, Any]:
        """The window's successes and metrics (empty right after an evaluation)."""
        return {"train_successes": list(self.train_successes),
                "metrics": {k: list(v) for k, v in self.metrics.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.train_successes[:] = state["train_successes"]
        self.metrics.clear()
        self.metrics.update({k: list(v) for k, v in state["metrics"].items()})


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


# ---------------------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------------------


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
        reason = (f"{exc}: lower {', '.join('agent.' + k for k in keys)} (now {now}) and start a new run "
                  "(a resume keeps the optimizers' learning rates)")
        return RunFailed(reason, run.run_dir, run.env_steps, run.checkpoint_steps, resumable=False)
    reason = f"training {exc}"
    return RunFailed(reason, run.run_dir, run.env_steps, run.checkpoint_steps)


@dataclass
class Run:
    """A started run (``start_run``): its training state and what the loop's steps read and advance."""

    cfg: Config
    hooks: LoopHooks
    spec: GoalEnvSpec
    state: TrainingState
    run_dir: Path
    logger: RunLogger | NullLogger
    progress: Any
    obs: dict[str, np.ndarray]
    """The observation to act on next (empty without training envs)."""
    reward_guard: tuple[float, float] | None
    wandb_id: str | None
    """The W&B run id of the checkpoint resumed (None: a new run)."""
    next_eval: int
    """Env steps at which the next evaluation is due."""
    env_id: str
    n_envs: int
    first_update: bool = True
    checkpoint_steps: int | None = None
    """The env steps of the last checkpoint in the run directory (None: none yet)."""

    @property
    def env_steps(self) -> int:
        return self.state.counters["env_steps"]


def start_run(cfg: Config, resume: str | None, overwrite: bool, hooks: LoopHooks,
              cleanup: contextlib.ExitStack) -> Run:
    """Everything before the first env step: what can refuse the config comes before the run directory, W&B
    and the envs; a resume restores its checkpoint. Closers (run directory lock, envs) go on ``cleanup``."""
    t_cfg = cfg.train
    torch.set_num_threads(max(1, t_cfg.torch_threads))
    seed_everything(t_cfg.seed)
    spec = goal_env_spec(cfg.env.id)
    agent, reward_guard = build_agent(cfg, spec)
    agent = hooks.wrap_agent(agent)
    replay = build_replay(cfg, spec, int(t_cfg.total_env_steps * t_cfg.updates_per_step))
    if not resume and t_cfg.learning_starts >= t_cfg.total_env_steps:  # a resumed run may be past it
        raise ValueError(f"train.learning_starts must be below train.total_env_steps ({t_cfg.total_env_steps}), "
                         f"else no update runs, got {t_cfg.learning_starts}")
    saved = None
    if resume:  # read before the run directory is touched: a checkpoint this run cannot resume changes nothing
        saved = load_checkpoint(Path(resume) / "checkpoint.pt")
        check_world_size(saved, hooks.world_size, resume)
    run_dir = _claim_run_dir(cfg, t_cfg.seed, resume, overwrite, hooks, cleanup)
    env, eval_env = _open_envs(cfg, t_cfg.seed, cleanup, hooks.steps_envs)
    rng = np.random.default_rng(t_cfg.seed)
    counters = new_counters()
    schedule = UpdateSchedule(t_cfg.updates_per_step, t_cfg.learning_starts)
    state = TrainingState(agent, replay, eval_env, counters, schedule, EvalLog(counters), rng, env)
    state.rare_states = cfg.env.rare_state_start > 0
    if cfg.env.behaviour_goals > 0:
        state.goals = her.MinDensityGoals(
            min_cutoff=her.MinDensityGoals.min_cutoff_for(t_cfg.gamma, spec.max_episode_steps or 50),
            desired_support=cfg.env.behaviour_goal_support)
    wandb_id, envs_restored = _restore(state, saved, run_dir, hooks)
    # metrics.csv keeps the rows up to the checkpoint; later ones are logged again (see RunLogger)
    logger = (RunLogger(cfg, run_dir, resume_id=wandb_id, resume_step=counters["env_steps"] if resume else None)
              if hooks.is_main else NullLogger())
    progress = logger.progress(t_cfg.total_env_steps, initial=counters["env_steps"])
    state.evals.start()
    next_eval = (counters["env_steps"] // t_cfg.eval_every + 1) * t_cfg.eval_every
    # restored RNGs: the resets that began the checkpoint's episodes again (else a reseed)
    obs: dict[str, np.ndarray] = {}
    if env is not None:
        obs, _ = env.reset() if envs_restored else env.reset(seed=t_cfg.seed + counters["episodes"])
    replay.discard_in_progress()
    if state.goals is not None:  # every env starts an episode (a resume: with a goal chosen afresh)
        assert env is not None, "behaviour goals need training envs"
        state.goal_given = choose_behaviour_goals(agent, replay, env, obs, np.ones(cfg.env.n_envs, bool),
                                                  cfg.env.behaviour_goals, state.goals, rng)
    return Run(cfg, hooks, spec, state, run_dir, logger, progress, obs, reward_guard, wandb_id, next_eval,
               cfg.env.id, cfg.env.n_envs, checkpoint_steps=counters["env_steps"] if resume else None)


def _claim_run_dir(cfg: Config, seed: int, resume: str | None, overwrite: bool, hooks: LoopHooks,
                   cleanup: contextlib.ExitStack) -> Path:
    """The run directory, locked by the main process; a refusal there is raised on every process."""
    lock, refusal = None, None
    if hooks.is_main:
        try:
            lock = open_run_dir(cfg, seed, resume, overwrite, algo_name=hooks.run_label)
            cleanup.callback(lock.release)
        except (ValueError, OSError) as exc:
            refusal = exc
    run_dir, refusal = hooks.share((lock.run_dir if lock else None, refusal))
    if refusal is not None:
        raise refusal
    assert run_dir is not None, "the main process opened it"
    return run_dir


def _open_envs(cfg: Config, seed: int, cleanup: contextlib.ExitStack,
               training: bool = True) -> tuple[MadeVectorEnv | None, MadeVectorEnv]:
    """The training (None without ``training``) and the evaluation vector envs (seeds ``seed`` and
    ``seed + 10_000``)."""
    env = None
    if training:
        env = make_vector_env(cfg.env.id, cfg.env.n_envs, cfg.env.vectorization, seed=seed,
                              grasped_start=cfg.env.grasped_start, behaviour_goals=cfg.env.behaviour_goals > 0,
                              rare_state_start=cfg.env.rare_state_start, rare_state_cell=cfg.env.rare_state_cell)
        cleanup.callback(env.close)
    eval_env = make_vector_env(cfg.env.id, cfg.env.eval_envs, "sync", seed=seed + 10_000)
    cleanup.callback(eval_env.close)
    return env, eval_env


def _restore(state: TrainingState, saved: dict[str, Any] | None, run_dir: Path,
             hooks: LoopHooks) -> tuple[str | None, bool]:
    """Load ``saved`` (a checkpoint, or None for a new run) into ``state``. Returns its W&B run id and whether
    the training envs' RNGs were restored
    ([`TrainingState.restore`][her_agents.loop.train.TrainingState.restore])."""
    if saved is None:
        return None, False
    own = hooks.checkpoint_part(saved)
    missing = state.restore(saved, own, ReplayFiles(run_dir, state.replay, hooks.replay_name), hooks)
    if missing is not None and hooks.is_main:  # learning restarts from fewer episodes
        tqdm.write(f"her-train: no replay to restore in {run_dir}: {missing}; the replay buffer starts empty, the "
                   "agent, normalizers and counters continue")
    return saved["wandb_id"], state.envs_restored


def collect(run: Run) -> int:
    """One env step of every training env: act, step, store the real next state (never the autoreset one),
    count finished episodes and their successes, and feed the normalizers the episodes completed. Returns the
    env steps stored (``env.n_envs``)."""
    s, t_cfg = run.state, run.cfg.train
    assert s.env is not None and s.rng is not None, "a process that collects has training envs"
    warmup = s.counters["env_steps"] < t_cfg.warmup_steps
    action = choose_action(s.agent, run.obs, run.spec, run.n_envs, warmup, s.rng)
    run.obs, step, stored = collect_step(s.env, run.obs, action, s.replay, run.spec.info_shapes, run.reward_guard,
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


def learn(run: Run, stop: GracefulStop, n_steps: int | None = None) -> None:
    """Earn the updates of the ``n_steps`` env steps just collected (default one per env); do the due ones each
    time the env steps pass a multiple of ``train.update_every``."""
    s, env_steps = run.state, run.state.counters["env_steps"]
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
    """[`learn_step`][her_agents.loop.train.learn_step] for a process's first update: with ``compile_note``
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
    [`TrainingStopped`][her_agents.loop.train.TrainingStopped] to raise."""
    run.state.evals.wall_time()
    if run.cfg.log.checkpoint:
        write_checkpoint(run)
    return TrainingStopped(stop.signum or 2, run.run_dir, run.env_steps,
                           run.run_dir / "checkpoint.pt" if run.cfg.log.checkpoint else None)


def write_checkpoint(run: Run) -> None:
    """Checkpoint the run (``save_training_state``) and tell the logger, which keeps metrics.csv and W&B in
    step with what a resume would redo."""
    run.state.extra["wandb_id"] = run.logger.run_id or run.wandb_id
    check_finite_parameters(run.state.agent)  # never replace the last good checkpoint by NaN weights
    try:
        save_training_state(run.run_dir, run.cfg, run.state, run.hooks, run.cfg.log.save_replay)
    except OSError:  # e.g. a full disk: metrics.csv keeps only the rows the previous checkpoint covers
        run.logger.checkpoint_failed()
        raise
    run.checkpoint_steps = run.env_steps
    run.logger.checkpointed()  # W&B gets a row once a resume would not redo it


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
