"""Everything before the first env step: the agent and the replay of a config, the run directory, the envs, a
resume's checkpoint; ``start_run`` returns the started ``Run`` the loop's steps read and advance."""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tqdm import tqdm

import her
from ..algos.base import Agent, q_clip_for_env
from ..algos.registry import make_agent
from ..config import Config, agent_config, check_device, config_yaml, torch_thread_count
from ..run.checkpoint import ReplayFiles, check_world_size, load_checkpoint, write_atomic
from ..run.logger import NullLogger, RunLogger
from ..run.run_control import RunDirLock, prepare_run_dir
from ..tools import allocation_failure
from .collect import MadeVectorEnv, choose_behaviour_goals
from .evaluation import EvalLog
from .schedule import UpdateSchedule
from .state import TrainingState, new_counters
from her_envs import GoalEnvSpec, goal_env_spec, make_vector_env

if TYPE_CHECKING:
    from .hooks import LoopHooks

__all__ = ["Run", "build_agent", "build_replay", "env_workers", "open_run_dir", "seed_everything", "start_run",
           "use_threads"]


def use_threads(cfg: Config) -> int:
    """Size this process's torch from ``train.torch_threads``
    ([`torch_thread_count`][her_agents.config.torch_thread_count]): its intra-op threads and, with
    ``agent.compile``, Inductor's compile workers (a pool of processes, by default one per core of the
    machine), so that runs limited to one thread each stay within one core each. Returns the thread count."""
    n = torch_thread_count(cfg.train.torch_threads, env_workers(cfg))
    torch.set_num_threads(n)
    if cfg.agent.compile:
        import torch._inductor.config as inductor_config  # only with compile: importing it costs a second

        inductor_config.compile_threads = n
    return n


def env_workers(cfg: Config) -> int:
    """The env worker processes that step while the updates run: ``env.n_envs`` with ``train.overlap_env``
    (not in the actor-learner mode's learner, which steps no envs), else 0."""
    return cfg.env.n_envs if cfg.train.overlap_env and cfg.dist.mode != "actor_learner" else 0


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
                           device=device, n_threads=torch_thread_count(cfg.train.torch_threads, env_workers(cfg)))
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
    overlap_env: bool = False
    """The loop steps the training envs while it updates (``train.overlap_env``, with training envs)."""
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
    use_threads(cfg)
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
    logger = (RunLogger(cfg, run_dir, resume_id=wandb_id, resume_step=counters["env_steps"] if resume else None,
                        video_steps=saved["video_steps"] if saved is not None else ())
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
               cfg.env.id, cfg.env.n_envs, overlap_env=cfg.train.overlap_env and env is not None,
               checkpoint_steps=counters["env_steps"] if resume else None)


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
        vectorization = "async" if cfg.train.overlap_env else cfg.env.vectorization  # workers step meanwhile
        env = make_vector_env(cfg.env.id, cfg.env.n_envs, vectorization, seed=seed,
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
    ([`TrainingState.restore`][her_agents.loop.state.TrainingState.restore])."""
    if saved is None:
        return None, False
    own = hooks.checkpoint_part(saved)
    missing = state.restore(saved, own, ReplayFiles(run_dir, state.replay, hooks.replay_name), hooks)
    if missing is not None and hooks.is_main:  # learning restarts from fewer episodes
        tqdm.write(f"her-train: no replay to restore in {run_dir}: {missing}; the replay buffer starts empty, the "
                   "agent, normalizers and counters continue")
    return saved["wandb_id"], state.envs_restored

