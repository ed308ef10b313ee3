"""The training loop: collect with a vector env, store episodes, sample HER batches, update, evaluate, log.

One function, ``train(cfg)``, reads top to bottom: set-up, then per env step: act -> step -> store -> update;
every ``train.eval_every`` env steps: evaluate, log (stdout, metrics.csv, W&B) and checkpoint atomically.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

import her
from agents.collect import choose_action, collect_step, learn_step, normalize_from_episode
from agents.checkpoint import load_checkpoint, load_replay_arrays, save_run_state
from agents.distributed import NullLogger, init_distributed  # DIST
from agents.logger import RunLogger
from agents.registry import make_agent
from envs import goal_env_spec, make_vector_env, split_autoreset

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
        info_shapes={k: () for k in spec.info_keys},
    )
    sampler = None
    if r.prioritized:
        sampler = her.PrioritizedSampler(
            storage, alpha=r.alpha, beta0=r.beta0, beta_annealing_steps=total_updates, eps=r.eps,
            td_error_clip=r.td_error_clip, rank_based=r.rank_based,
        )
    return her.HerReplayBuffer(
        storage, spec.compute_reward, strategy=r.strategy, n_sampled_goal=r.n_sampled_goal, n_step=r.n_step,
        gamma=cfg.train.gamma, sampler=sampler, stop_at_success=r.stop_at_success,
        compute_success=spec.compute_success, seed=cfg.train.seed,
    )


def evaluate(agent: Any, env: Any, n_episodes: int, seed: int | None = None) -> dict[str, float]:
    """Run ``n_episodes`` deterministic episodes on a vector env (SAME_STEP autoreset).

    Success is ``info["is_success"]`` at each episode's last step. Returns ``success_rate``,
    ``final_distance`` (mean distance achieved-desired goal at the end, in the goal's units, metres for Fetch)
    and ``return``.
    """
    obs, _ = env.reset(seed=seed)
    n = env.num_envs
    successes: list[float] = []
    distances: list[float] = []
    returns: list[float] = []
    ep_return = np.zeros(n)
    started = np.ones(n, bool)  # envs may start more episodes than needed; count only the first n_episodes
    while len(successes) < n_episodes:
        action = agent.act(obs["observation"], obs["desired_goal"], deterministic=True)
        obs, reward, terminated, truncated, infos = env.step(action)
        ep_return += reward
        step = split_autoreset(obs, terminated, truncated, infos)
        for i in np.flatnonzero(step.done & started):
            successes.append(float(step.is_success[i]))
            ag, dg = step.real_next_obs["achieved_goal"][i], step.real_next_obs["desired_goal"][i]
            distances.append(float(np.linalg.norm(ag - dg)))
            returns.append(float(ep_return[i]))
            ep_return[i] = 0.0
    return {
        "success_rate": float(np.mean(successes[:n_episodes])),
        "final_distance": float(np.mean(distances[:n_episodes])),
        "return": float(np.mean(returns[:n_episodes])),
    }


def _default_run_dir(cfg: DictConfig) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{cfg.env.id}-{cfg.algo}-s{cfg.train.seed}-{stamp}"


def train(cfg: DictConfig, resume: str | None = None) -> TrainResult:
    """Train ``cfg.algo`` with HER on ``cfg.env.id``. ``resume``: a run directory to continue from."""
    if cfg.dist.mode == "actor_learner":  # DIST: Ape-X learner (rank 0) + actors over torch.distributed.rpc
        from agents.actor_learner import train_actor_learner

        return train_actor_learner(cfg, resume)
    dist_ctx = init_distributed(cfg.dist.backend, cfg.dist.timeout_s)  # DIST: 1-process no-op without torchrun
    cfg = dist_ctx.prepare_config(cfg)  # DIST: same config on all ranks, then train.seed + rank
    t_cfg = OmegaConf.to_object(cfg.train)  # a plain TrainConfig: read in the loop, where DictConfig access costs ~8 us
    torch.set_num_threads(max(1, int(t_cfg.torch_threads)))
    seed_everything(t_cfg.seed)
    spec = goal_env_spec(cfg.env.id)
    n_envs = cfg.env.n_envs
    total_updates = int(t_cfg.total_env_steps * t_cfg.updates_per_step)

    # Everything that can refuse the config comes before the run directory, W&B and the envs.
    agent_kwargs = OmegaConf.to_container(cfg.agent, resolve=True)
    agent_kwargs.setdefault("seed", t_cfg.seed)  # exploration noise
    agent = make_agent(cfg.algo, spec.observation_dim, spec.goal_dim, spec.action_dim,
                       device=t_cfg.device, n_threads=t_cfg.torch_threads, **agent_kwargs)
    replay = build_replay(cfg, spec, total_updates)
    run_dir = Path(resume) if resume else Path(cfg.log.run_dir) if cfg.log.run_dir else _default_run_dir(cfg)
    run_dir = dist_ctx.broadcast_object(run_dir)  # DIST: rank 0's run directory
    run_dir.mkdir(parents=True, exist_ok=True)
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
    try:
        while counters["env_steps"] < t_cfg.total_env_steps:
            # -- act, step, store (the real next state, never the autoreset one)
            action = choose_action(agent, obs, spec, n_envs, counters["env_steps"] < t_cfg.warmup_steps, rng)
            obs, step, stored = collect_step(env, obs, action, replay.storage, spec.info_keys)
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
    finally:
        progress.close()
        env.close()
        eval_env.close()
        logger.finish()
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


def _checkpoint(run_dir: Path, cfg: DictConfig, agent: Any, replay: her.HerReplayBuffer, counters: dict,
                rng: np.random.Generator, wandb_id: str | None) -> None:
    # checkpoint.pt and replay.npz, written so that a kill at any point leaves a matching pair
    save_run_state(run_dir, {
        "agent": agent.state_dict(),
        "config": OmegaConf.to_container(cfg, resolve=True),
        "counters": dict(counters),
        "rng": {"numpy": rng.bit_generator.state, "torch": torch.get_rng_state()},
        "wandb_id": wandb_id,
    }, _flatten(replay.state_dict()) if cfg.log.save_replay else None)
