"""The training loop: collect with a vector env, store episodes, sample HER batches, update, evaluate, log.

One function, ``train(cfg)``, reads top to bottom: set-up, then per env step: act -> step -> store -> update;
every ``train.eval_every`` env steps: evaluate, log (stdout, metrics.csv, W&B) and checkpoint atomically.
"""

from __future__ import annotations

import contextlib
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

import her
from her_agents.base import q_clip_for_env
from her_agents.config import check_device
from her_agents.collect import choose_action, collect_step, learn_step, normalize_from_episode
from her_agents.checkpoint import load_checkpoint, load_replay_arrays, save_run_state, write_atomic
from her_agents.distributed import NullLogger, init_distributed  # DIST
from her_agents.logger import RunLogger
from her_agents.registry import make_agent
from her_agents.run_control import GracefulStop, TrainingStopped, prepare_run_dir
from her_envs import goal_env_spec, make_vector_env, split_autoreset

__all__ = ["TrainResult", "build_replay", "evaluate", "train"]


@dataclass
class TrainResult:
    run_dir: Path
    env_steps: int
    eval_success_rate: float
    history: list[dict[str, Any]]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_replay(cfg: DictConfig, spec: Any, total_updates: int) -> her.HerReplayBuffer:
    """The HER replay of the config: storage, (prioritized) sampler, relabeling and n-step returns."""
    r = cfg.replay
    if spec.max_episode_steps and r.capacity < spec.max_episode_steps:
        raise ValueError(f"replay.capacity must hold at least one episode of {cfg.env.id} "
                         f"({spec.max_episode_steps} steps), got {r.capacity}")
    storage = her.EpisodeStorage(
        r.capacity, (spec.observation_dim,), (spec.action_dim,), (spec.goal_dim,),
        max_episode_steps=spec.max_episode_steps or 50, n_envs=cfg.env.n_envs,
        info_shapes=dict(spec.info_shapes),
    )
    sampler = None
    if r.prioritized:
        sampler = her.PrioritizedSampler(
            storage, alpha=r.alpha, beta0=r.beta0, beta_annealing_steps=total_updates, eps=r.eps,
            td_error_clip=r.td_error_clip, rank_based=r.rank_based,
        )
    return her.HerReplayBuffer(
        storage, spec.compute_reward, strategy=r.strategy, n_sampled_goal=r.n_sampled_goal,
        other_desired_fraction=r.other_desired_fraction, n_step=r.n_step, gamma=cfg.train.gamma, sampler=sampler,
        stop_at_success=r.stop_at_success, compute_success=spec.compute_success, seed=cfg.train.seed,
    )


def evaluate(agent: Any, env: Any, n_episodes: int, seed: int | None = None) -> dict[str, float]:
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
        action = agent.act(obs["observation"], obs["desired_goal"], deterministic=True)
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


def train(cfg: DictConfig, resume: str | None = None, overwrite: bool = False) -> TrainResult:
    """Train ``cfg.algo`` with HER on ``cfg.env.id``.

    Args:
        cfg: a config from :func:`her_agents.config.load_config`.
        resume: a run directory to continue from (its ``checkpoint.pt``).
        overwrite: allow a fresh run into a ``log.run_dir`` that holds another run (its files are replaced as
            this run writes its own, nothing is deleted before).

    Returns:
        TrainResult: run directory, env steps, the last eval success rate and the evaluation rows.

    Raises:
        ValueError: a config the agent, replay or env refuse; a run directory that holds a run (without
            ``overwrite``), cannot be written or is locked by a live run (:class:`RunDirInUse`).
        TrainingStopped: SIGINT or SIGTERM arrived; a checkpoint of the current state was written and the W&B
            run finished as interrupted / terminated.
    """
    if cfg.dist.mode == "actor_learner":  # DIST: Ape-X learner (rank 0) + actors over torch.distributed.rpc
        from her_agents.actor_learner import train_actor_learner

        return train_actor_learner(cfg, resume)
    with GracefulStop() as stop, contextlib.ExitStack() as cleanup:
        return _train(cfg, resume, overwrite, stop, cleanup)


def _train(cfg: DictConfig, resume: str | None, overwrite: bool, stop: GracefulStop,
           cleanup: contextlib.ExitStack) -> TrainResult:
    dist_ctx = init_distributed(cfg.dist.backend, cfg.dist.timeout_s)  # DIST: 1-process no-op without torchrun
    cfg = dist_ctx.prepare_config(cfg)  # DIST: same config on all ranks, then train.seed + rank
    t_cfg = OmegaConf.to_object(cfg.train)  # a plain TrainConfig: read in the loop, where DictConfig access is slow
    torch.set_num_threads(max(1, int(t_cfg.torch_threads)))
    seed_everything(t_cfg.seed)
    spec = goal_env_spec(cfg.env.id)
    n_envs = cfg.env.n_envs
    total_updates = int(t_cfg.total_env_steps * t_cfg.updates_per_step)

    # Everything that can refuse the config comes before the run directory, W&B and the envs.
    agent_kwargs = OmegaConf.to_container(cfg.agent, resolve=True)
    agent_kwargs.setdefault("seed", t_cfg.seed)  # exploration noise
    configured = {"configured": agent_kwargs["q_clip"]} if "q_clip" in agent_kwargs else {}  # unset: from the env
    agent_kwargs["q_clip"] = q_clip_for_env(spec.reward_range, t_cfg.gamma, cfg.env.id, **configured)
    reward_guard = None if configured else spec.reward_range  # a derived bound needs rewards inside the range
    check_device(t_cfg.device)
    agent = make_agent(cfg.algo, spec.observation_dim, spec.goal_dim, spec.action_dim,
                       device=t_cfg.device, n_threads=t_cfg.torch_threads, **agent_kwargs)
    replay = build_replay(cfg, spec, total_updates)
    lock, refusal = None, None
    if dist_ctx.is_main:  # DIST: rank 0 alone picks, creates and locks the run directory
        try:
            lock = prepare_run_dir(cfg.env.id, cfg.algo, t_cfg.seed, cfg.log.run_dir, resume, overwrite)
            cleanup.callback(lock.release)
        except ValueError as exc:
            refusal = exc
    run_dir, refusal = dist_ctx.broadcast_object((lock.run_dir if lock else None, refusal))  # DIST: rank 0's
    if refusal is not None:
        raise refusal
    if dist_ctx.is_main:  # the resolved config beside metrics.csv (a resume rewrites it with its overrides)
        text = OmegaConf.to_yaml(cfg).encode()
        write_atomic(run_dir / "config.yaml", lambda f: f.write(text))
    env = make_vector_env(cfg.env.id, n_envs, cfg.env.vectorization, seed=t_cfg.seed)
    eval_env = make_vector_env(cfg.env.id, cfg.env.eval_envs, "sync", seed=t_cfg.seed + 10_000)
    rng = np.random.default_rng(t_cfg.seed)

    counters = {"env_steps": 0, "episodes": 0, "updates": 0, "evals": 0, "wall_time": 0.0}
    wandb_id = None
    if resume:
        state = load_checkpoint(run_dir / "checkpoint.pt")
        agent.load_state_dict(state["agent"])
        counters.update(state["counters"])
        rng.bit_generator.state = state["rng"]["numpy"]
        torch.set_rng_state(state["rng"]["torch"])
        wandb_id = state.get("wandb_id")
        replay_arrays = load_replay_arrays(run_dir, counters["env_steps"])  # the replay of this checkpoint
        if replay_arrays is not None:
            replay.load_state_dict(_unflatten(replay_arrays))
        elif "replay_schedule" in state:  # no replay file: the storage restarts empty, its schedules continue
            _load_replay_schedule(replay, state["replay_schedule"])
    # metrics.csv keeps the rows up to the checkpoint; later ones are logged again (see RunLogger)
    dist_ctx.setup_agent(agent)  # DIST: broadcast rank 0's weights, average gradients, buffer normalizer deltas
    logger = (RunLogger(cfg, run_dir, resume_id=wandb_id, resume_step=counters["env_steps"] if resume else None)
              if dist_ctx.is_main else NullLogger())  # DIST: rank 0 alone logs
    pending_updates = 0.0
    train_successes: list[float] = []
    metrics_acc: dict[str, list[float]] = {}
    history: list[dict[str, Any]] = []
    last_eval: dict[str, float] = {}
    progress = logger.progress(t_cfg.total_env_steps, initial=counters["env_steps"])
    t_start, wall0 = time.perf_counter(), counters["wall_time"]
    steps_at_window, time_at_window = counters["env_steps"], t_start
    next_eval = (counters["env_steps"] // t_cfg.eval_every + 1) * t_cfg.eval_every

    obs, _ = env.reset(seed=t_cfg.seed + counters["episodes"])
    replay.storage.discard_in_progress()
    status, crash = "crashed", None
    try:
        while counters["env_steps"] < t_cfg.total_env_steps:
            if (stop.signum is not None and not dist_ctx.active) or (  # DIST: all ranks stop at one block start
                    dist_ctx.active and counters["env_steps"] % t_cfg.update_every < n_envs
                    and dist_ctx.any_rank(stop.signum is not None)):
                break
            # -- act, step, store (the real next state, never the autoreset one)
            action = choose_action(agent, obs, spec, n_envs, counters["env_steps"] < t_cfg.warmup_steps, rng)
            obs, step, stored = collect_step(env, obs, action, replay.storage, spec.info_shapes, reward_guard,
                                             cfg.env.id)
            counters["env_steps"] += n_envs
            if step.done.any():
                train_successes += step.is_success[step.done].astype(float).tolist()
                counters["episodes"] += int(step.done.sum())
            for start, T in stored:  # normalizer statistics from the new episodes, with relabeled goals
                normalize_from_episode(agent, replay, start, T, t_cfg.normalizer_relabeled)

            # -- update
            pending_updates += n_envs * t_cfg.updates_per_step
            can_learn = counters["env_steps"] >= t_cfg.learning_starts and len(replay) > 0
            if dist_ctx.active and counters["env_steps"] % t_cfg.update_every < n_envs:  # DIST: merge normalizer
                can_learn, pending_updates = dist_ctx.sync_block(agent, can_learn, pending_updates)  # deltas, agree
            if can_learn and counters["env_steps"] % t_cfg.update_every < n_envs:
                for _ in range(int(pending_updates)):
                    learn_step(agent, replay, t_cfg.batch_size, metrics_acc)
                    counters["updates"] += 1
                pending_updates -= int(pending_updates)
            elif not can_learn:
                pending_updates = 0.0
            progress.update(n_envs)

            # -- evaluate, log, checkpoint
            done_training = counters["env_steps"] >= t_cfg.total_env_steps
            if counters["env_steps"] >= next_eval or done_training:
                next_eval += t_cfg.eval_every
                now = time.perf_counter()
                ev = dist_ctx.average_eval(evaluate(agent, eval_env, t_cfg.eval_episodes))  # DIST: mean over ranks
                counters["evals"] += 1
                counters["wall_time"] = wall0 + time.perf_counter() - t_start
                row = {
                    "env_steps": counters["env_steps"], "episodes": counters["episodes"],
                    "updates": counters["updates"], "wall_time": round(counters["wall_time"], 2),
                    "eval/success_rate": ev["success_rate"], "eval/final_distance": ev["final_distance"],
                    "eval/return": ev["return"],
                    "train/success_rate": float(np.mean(train_successes)) if train_successes else float("nan"),
                    "env_steps_per_s": (counters["env_steps"] - steps_at_window) / max(now - time_at_window, 1e-9),
                }
                row.update({f"train/{k}": float(np.mean(v)) for k, v in metrics_acc.items()})
                row.update(dist_ctx.row_extras(row))  # DIST: global env steps (/s) summed over ranks
                logger.log(row, step=counters["env_steps"])
                if cfg.log.video_every and counters["evals"] % cfg.log.video_every == 0:
                    logger.log_video(agent, cfg.env.id, step=counters["env_steps"])
                progress.set_postfix(eval_success=f"{ev['success_rate']:.2f}")
                history.append(row)
                last_eval = ev
                train_successes, metrics_acc = [], {}
                steps_at_window, time_at_window = counters["env_steps"], time.perf_counter()
                if cfg.log.checkpoint and dist_ctx.is_main:  # DIST: rank 0 alone writes checkpoints
                    _checkpoint(run_dir, cfg, agent, replay, counters, rng, logger.run_id or wandb_id)
                    logger.checkpointed()  # W&B gets a row once a resume would not redo it
        if counters["env_steps"] < t_cfg.total_env_steps:  # stopped by SIGINT / SIGTERM: save the current state
            counters["wall_time"] = wall0 + time.perf_counter() - t_start
            ckpt = None
            if cfg.log.checkpoint and dist_ctx.is_main:
                _checkpoint(run_dir, cfg, agent, replay, counters, rng, logger.run_id or wandb_id)
                logger.checkpointed()
                ckpt = run_dir / "checkpoint.pt"
            status = stop.status
            raise TrainingStopped(stop.signum or 2, run_dir, counters["env_steps"], ckpt)
        status = "finished"
    except KeyboardInterrupt:  # a second signal: stop now
        status = "interrupted"
        raise
    except BaseException as exc:
        crash = exc
        raise
    finally:
        progress.close()
        env.close()
        eval_env.close()
        logger.finish(status, crash if status == "crashed" else None)
        dist_ctx.close()  # DIST
    return TrainResult(run_dir, counters["env_steps"], last_eval.get("success_rate", float("nan")), history)


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}/") if v else {f"{prefix}{k}/": np.zeros(0)})  # keep {} (sampler)
        else:
            out[f"{prefix}{k}"] = np.asarray(v)
    return out


def _unflatten(flat: dict[str, Any]) -> dict:
    out: dict = {}
    for k, v in flat.items():
        node = out
        *parents, leaf = k.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        if leaf:  # "a/" marks an empty dict
            node[leaf] = v.item() if v.dtype == object or v.ndim == 0 else v
    return out


def _replay_schedule(replay: her.HerReplayBuffer) -> dict[str, Any]:
    """What the replay needs to continue without its storage: the sampling RNG and the prioritized sampler's
    schedules (``n_samples``, which anneals beta, and the priority new transitions enter at)."""
    sampler = replay.sampler
    out: dict[str, Any] = {"rng": replay.rng.bit_generator.state}
    if hasattr(sampler, "n_samples"):
        out["n_samples"] = int(sampler.n_samples)
        out["max_priority"] = sampler.max_priority
    return out


def _load_replay_schedule(replay: her.HerReplayBuffer, schedule: dict[str, Any]) -> None:
    replay.rng.bit_generator.state = schedule["rng"]
    if "n_samples" in schedule and hasattr(replay.sampler, "n_samples"):
        replay.sampler.n_samples = int(schedule["n_samples"])
        replay.sampler.max_priority = schedule["max_priority"]


def _checkpoint(run_dir: Path, cfg: DictConfig, agent: Any, replay: her.HerReplayBuffer, counters: dict,
                rng: np.random.Generator, wandb_id: str | None) -> None:
    # checkpoint.pt and replay.npz, written so that a kill at any point leaves a matching pair
    save_run_state(run_dir, {
        "agent": agent.state_dict(),
        "config": OmegaConf.to_container(cfg, resolve=True),
        "counters": dict(counters),
        "rng": {"numpy": rng.bit_generator.state, "torch": torch.get_rng_state()},
        "wandb_id": wandb_id,
        "replay_schedule": _replay_schedule(replay),
    }, _flatten(replay.state_dict()) if cfg.log.save_replay else None)
    if not cfg.log.save_replay:  # a replay.npz of an overwritten run or of earlier checkpoints: not this state
        (run_dir / "replay.npz").unlink(missing_ok=True)
