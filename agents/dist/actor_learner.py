"""Actor-learner training (Ape-X, Horgan et al. 2018) over ``torch.distributed.rpc``.

Launch with ``dist.mode=actor_learner`` under torchrun; rank 0 is the learner, ranks 1.. are actors::

    torchrun --standalone --nproc_per_node=3 -m her_agents.cli fetch_reach_ddpg dist.mode=actor_learner

- **Actors** step their own vector envs (``env.n_envs``, seeds ``train.seed + rank``) with their own
  exploration noise (agent seed ``train.seed + rank``), stage steps per env until an episode ends, and send each
  complete episode to the learner with ``rpc_async`` (fire and forget; the futures are checked, and awaited
  at the end). After each finished episode an actor asks the learner for the newest weights (actor network +
  observation/goal normalizers) and loads them when their version is newer. The first
  ``train.warmup_steps / n_actors`` steps of each actor use uniform random actions.
- **The learner** owns the replay (HER relabeling; prioritized and n-step when configured), the agent, the
  evaluation, the log (stdout, ``metrics.csv``, W&B) and the checkpoints. The RPC target
  ``_rpc_add_episode`` puts an episode in a queue; the learner thread drains it between updates and calls
  ``storage.add_episode`` (a prioritized sampler gives the new transitions the maximum priority on add) and
  updates the normalizers with relabeled samples of the episode, like the single-process loop. Keeping every
  storage/sampler call on the learner thread avoids locking the numpy structures. It does
  ``train.updates_per_step`` updates per received env step (the replay ratio of the single-process loop), and
  publishes new weights every ``dist.weight_sync_every`` updates.
- **Env steps** are counted on the learner from the episodes it received (all actors). When they reach
  ``train.total_env_steps`` the learner tells the actors to stop (answer of their next weight fetch), finishes
  its pending updates, evaluates, checkpoints and everyone calls ``rpc.shutdown()`` (graceful: outstanding
  episodes are delivered first and are stored; they are counted in ``episodes``).

All ranks must be launched with the same config (checked over RPC at start: a mismatch names the differing
ranks and keys). Resume is not supported in this mode.

The learner is built from the training loop's public pieces (``her_agents.loop.train``): the agent and replay of
the config, the run directory (default name ``<env>-<algo>-apex-s<seed>-<time>``, locked like the loop's),
the update schedule, the evaluation rows and the checkpoints; weights travel as the agent's
``policy_state_dict()``.

Debug hook: with ``HER_DIST_DUMP=<dir>`` the learner writes ``<dir>/learner.json`` (episodes received per actor,
``storage.n_episodes_added``, the hash of every published weight version) and each actor ``actor<r>.json``
(episodes sent, hash of every weight version it loaded).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import queue
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed import rpc

import her
from ..algos.base import Agent
from ..config import Config
from ..loop import (EvalLog, LoopHooks, TrainingState, TrainResult, UpdateSchedule, build_agent, build_replay,
                    choose_action, collect_step, learn_step, normalize_from_episode)
from ..loop.train import new_counters, open_run_dir, save_training_state, seed_everything
from ..run.logger import RunLogger
from ..run.run_control import LaunchError
from .distributed import config_digest, config_mismatch_message, flat_config, rendezvous_env, state_hash
from her_envs import goal_env_spec, make_vector_env

__all__ = ["train_actor_learner"]

LEARNER = "learner"

# Per-process state the RPC targets read (each process sets its own before init_rpc).
_CONFIG: dict[str, Any] = {}
_LEARNER_STATE: _LearnerState | None = None


def _worker_name(rank: int) -> str:
    return LEARNER if rank == 0 else f"actor{rank}"


# ---------------------------------------------------------------------------------------------------------
# RPC targets (module level so they pickle by name)
# ---------------------------------------------------------------------------------------------------------


def _rpc_config() -> tuple[str, dict[str, Any]]:
    return _CONFIG["digest"], _CONFIG["flat"]


def _rpc_add_episode(actor_rank: int, seq: int, episode: dict[str, Any]) -> int:
    """Learner side: queue one complete episode for ``storage.add_episode``. Returns the weights version."""
    st = _LEARNER_STATE
    with st.lock:  # env steps are counted on receipt, so the actors stop right at the budget
        st.inbox.put((actor_rank, seq, episode))
        st.received_steps += len(episode["action"])
        if st.received_steps >= st.total_env_steps:
            st.stop = True
    return st.version


def _rpc_fetch_weights(have_version: int) -> tuple[int, dict[str, Any] | None, bool]:
    """Learner side: ``(version, weights or None if not newer, stop)``."""
    st = _LEARNER_STATE
    weights = st.weights  # one reference read: a consistent snapshot
    version, payload = weights
    return version, (payload if version > have_version else None), st.stop


# ---------------------------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------------------------


def _policy_hash(state: dict[str, Any]) -> str:
    """Hash of every tensor / array in a ``policy_state_dict()`` (keys sorted)."""
    leaves: list[Any] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k in sorted(node):
                walk(node[k])
        elif isinstance(node, (torch.Tensor, np.ndarray)):
            leaves.append(node)

    walk(state)
    return state_hash(leaves)


# ---------------------------------------------------------------------------------------------------------
# Learner
# ---------------------------------------------------------------------------------------------------------


class _LearnerState:
    def __init__(self, total_env_steps: int) -> None:
        self.lock = threading.Lock()
        self.total_env_steps = int(total_env_steps)
        self.received_steps = 0
        self.inbox: queue.Queue = queue.Queue()
        self.version = 0
        self.weights: tuple[int, dict[str, Any] | None] = (0, None)
        self.stop = False
        self.published: dict[int, str] = {}

    def publish(self, agent: Agent) -> None:
        state = agent.policy_state_dict()
        version = self.version + 1
        self.published[version] = _policy_hash(state)
        self.weights = (version, state)
        self.version = version


def _run_learner(cfg: Config, world: int, overwrite: bool) -> TrainResult:
    t_cfg = cfg.train
    seed_everything(t_cfg.seed)
    spec = goal_env_spec(cfg.env.id)
    total_updates = int(t_cfg.total_env_steps * t_cfg.updates_per_step)
    agent, _ = build_agent(cfg, spec)
    # the learner's storage receives whole episodes only (add_episode): one staging env is enough
    replay = build_replay(dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, n_envs=1)), spec, total_updates)
    lock = open_run_dir(cfg, t_cfg.seed, None, overwrite, algo_name=f"{cfg.algo}-apex")
    try:
        return _learn(cfg, world, agent, replay, lock.run_dir)
    finally:
        lock.release()


def _learn(cfg: Config, world: int, agent: Agent, replay: her.HerReplayBuffer, run_dir: Path) -> TrainResult:
    global _LEARNER_STATE
    t_cfg = cfg.train
    eval_env = make_vector_env(cfg.env.id, cfg.env.eval_envs, "sync", seed=t_cfg.seed + 10_000)
    st = _LearnerState(t_cfg.total_env_steps)
    st.publish(agent)  # version 1: the actors start from the learner's initial weights
    _LEARNER_STATE = st
    _init_rpc(cfg, 0, world)

    counters = new_counters()
    schedule = UpdateSchedule(t_cfg.updates_per_step, t_cfg.learning_starts)
    evals = EvalLog(counters)
    state = TrainingState(agent, replay, eval_env, counters, schedule, evals)
    hooks = LoopHooks()
    received = {r: 0 for r in range(1, world)}
    last_seq = {r: 0 for r in range(1, world)}
    duplicates = 0
    next_eval = t_cfg.eval_every
    logger = RunLogger(cfg, run_dir)

    def ingest(block: bool = False) -> int:
        nonlocal duplicates
        n_steps = 0
        while True:
            try:
                actor, seq, ep = st.inbox.get(timeout=0.05) if block else st.inbox.get_nowait()
            except queue.Empty:
                return n_steps
            block = False
            if seq <= last_seq[actor]:  # an RPC delivered twice: never store an episode twice
                duplicates += 1
                continue
            last_seq[actor] = seq
            start, T = replay.storage.add_episode(
                ep["observation"], ep["action"], ep["reward"], achieved_goal=ep["achieved_goal"],
                desired_goal=ep["desired_goal"], terminated=ep["terminated"], info=ep["info"])
            normalize_from_episode(agent, replay, start, T, t_cfg.normalizer_relabeled)
            received[actor] += 1
            counters["episodes"] += 1
            counters["env_steps"] += T
            n_steps += T
            evals.train_successes.append(float(ep["is_success"]))
            schedule.collect(T, counters["env_steps"])

    def do_eval() -> None:
        evals.log(agent, eval_env, t_cfg.eval_episodes, logger, hooks,
                  extras={"dist/world_size": world, "dist/weights_version": st.version})
        evals.start_window()
        if cfg.log.checkpoint:
            state.extra["wandb_id"] = logger.run_id
            try:
                save_training_state(run_dir, cfg, state, hooks, cfg.log.save_replay)
            except OSError:  # e.g. a full disk: metrics.csv keeps only the rows the previous checkpoint covers
                logger.checkpoint_failed()
                raise
            logger.checkpointed()  # W&B gets the row once the checkpoint covers it

    try:
        while True:
            got = ingest(block=schedule.pending < 1)
            n = schedule.take(limit=10) if len(replay) > 0 else 0  # a few updates, then look at the inbox again
            for _ in range(n):
                learn_step(agent, replay, t_cfg.batch_size, evals.metrics)
                counters["updates"] += 1
                if counters["updates"] % cfg.dist.weight_sync_every == 0:
                    st.publish(agent)
            if next_eval <= counters["env_steps"] < t_cfg.total_env_steps:  # the final one comes after
                next_eval = (counters["env_steps"] // t_cfg.eval_every + 1) * t_cfg.eval_every
                do_eval()
            if st.stop and schedule.pending < 1 and not got:
                break
        st.publish(agent)
        do_eval()
    except BaseException as exc:
        logger.finish("interrupted" if isinstance(exc, KeyboardInterrupt) else "crashed", exc)
        eval_env.close()
        rpc.shutdown(graceful=False)
        raise
    rpc.shutdown()  # waits for every actor; their last episodes are delivered before it returns
    ingest()  # ... and stored here
    logger.finish()
    eval_env.close()
    _dump("learner", {"received": {str(k): v for k, v in received.items()}, "duplicates": duplicates,
                      "n_episodes_added": replay.storage.n_episodes_added, "env_steps": counters["env_steps"],
                      "updates": counters["updates"], "published": {str(k): v for k, v in st.published.items()}})
    return TrainResult(run_dir, counters["env_steps"], evals.last_eval.get("success_rate", float("nan")),
                       evals.history)


# ---------------------------------------------------------------------------------------------------------
# Actor
# ---------------------------------------------------------------------------------------------------------


def _episode(storage: her.EpisodeStorage, start: int, T: int, is_success: bool) -> dict[str, Any]:
    """Copy one episode out of the actor's staging ring."""
    states = (start + np.arange(T + 1)) % storage.n_slots
    trans = states[:-1]
    return {
        "observation": storage.observation[states], "achieved_goal": storage.achieved_goal[states],
        "desired_goal": storage.desired_goal[states], "action": storage.action[trans],
        "reward": storage.reward[trans], "terminated": bool(storage.terminated[trans[-1]]),
        "info": {k: v[trans] for k, v in storage.info.items()}, "is_success": bool(is_success),
    }


def _run_actor(cfg: Config, rank: int, world: int) -> TrainResult:
    t_cfg = cfg.train
    seed = t_cfg.seed + rank
    seed_everything(seed)
    spec = goal_env_spec(cfg.env.id)
    n_envs = cfg.env.n_envs
    agent, reward_guard = build_agent(cfg, spec, seed=seed, device="cpu")  # own exploration noise
    max_T = spec.max_episode_steps or 50
    staging = her.EpisodeWriter(her.EpisodeStorage(4 * max_T * n_envs, (spec.observation_dim,), (spec.action_dim,), (spec.goal_dim,),
                                 max_episode_steps=max_T, n_envs=n_envs, info_shapes=dict(spec.info_shapes)))
    env = make_vector_env(cfg.env.id, n_envs, cfg.env.vectorization, seed=seed * 1000,
                          grasped_start=cfg.env.grasped_start, rare_state_start=cfg.env.rare_state_start,
                          rare_state_cell=cfg.env.rare_state_cell)  # an actor's archive is its own, not checkpointed
    rng = np.random.default_rng(seed)
    warmup = math.ceil(t_cfg.warmup_steps / max(1, world - 1))
    _init_rpc(cfg, rank, world)

    version, loaded, sent, steps, stop = 0, {}, 0, 0, False
    futures: list[Any] = []

    def fetch() -> None:
        nonlocal version, stop
        v, weights, stop = rpc.rpc_sync(LEARNER, _rpc_fetch_weights, args=(version,))
        if weights is not None:
            agent.load_policy_state_dict(weights)
            version = v
            loaded[v] = _policy_hash(agent.policy_state_dict())

    try:
        fetch()
        obs, _ = env.reset(seed=seed * 1000)
        while not stop:
            action = choose_action(agent, obs, spec, n_envs, steps < warmup, rng)
            obs, step, stored = collect_step(env, obs, action, staging, spec.info_shapes, reward_guard, cfg.env.id)
            steps += n_envs
            if step.done.any():
                agent.reset_noise(step.done)
            if stored:
                success = step.is_success[np.flatnonzero(step.done)]
                for (start, T), ok in zip(stored, success):
                    sent += 1
                    futures.append(rpc.rpc_async(LEARNER, _rpc_add_episode,
                                                 args=(rank, sent, _episode(staging.storage, start, T, ok))))
                for f in [f for f in futures if f.done()]:
                    f.wait()  # raises if the learner refused the episode
                futures = [f for f in futures if not f.done()]
                fetch()
        torch.futures.wait_all(futures)
    except BaseException:
        env.close()
        rpc.shutdown(graceful=False)
        raise
    env.close()
    rpc.shutdown()
    _dump(f"actor{rank}", {"rank": rank, "sent": sent, "env_steps": steps,
                           "loaded": {str(k): v for k, v in loaded.items()}})
    return TrainResult(Path(cfg.log.run_dir or "."), steps, float("nan"), [])


# ---------------------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------------------


def _dump(name: str, info: dict[str, Any]) -> None:
    out = os.environ.get("HER_DIST_DUMP")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{name}.json").write_text(json.dumps(info, indent=1))


def _init_rpc(cfg: Config, rank: int, world: int) -> None:
    """Join the RPC group, then refuse to go on if any rank's config differs from the learner's."""
    _CONFIG["digest"], _CONFIG["flat"] = config_digest(cfg), flat_config(cfg)
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=cfg.dist.timeout_s,
                                           init_method="env://")
    try:
        rpc.init_rpc(_worker_name(rank), rank=rank, world_size=world, rpc_backend_options=opts)
    except Exception as exc:
        raise LaunchError(
            f"rank {rank}: could not join the RPC group of WORLD_SIZE={world} at "
            f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} ({type(exc).__name__}: {exc}). "
            "Check that every rank was started and the address is reachable."
        ) from exc
    if rank == 0:
        got = [rpc.rpc_sync(_worker_name(r), _rpc_config) for r in range(1, world)]
        digests = [_CONFIG["digest"]] + [d for d, _ in got]
        flats = [_CONFIG["flat"]] + [f for _, f in got]
    else:
        d0, f0 = rpc.rpc_sync(LEARNER, _rpc_config)
        digests, flats = [d0] + [None] * (rank - 1) + [_CONFIG["digest"]], [f0] + [{}] * (rank - 1) + [_CONFIG["flat"]]
        digests = [d if d is not None else d0 for d in digests]
    if len(set(digests)) > 1:
        msg = config_mismatch_message(flats, digests)
        rpc.shutdown(graceful=False)
        raise ValueError(msg)


def train_actor_learner(cfg: Config, resume: str | None = None, overwrite: bool = False) -> TrainResult:
    """Run this process's role (learner on rank 0, actor elsewhere) until the learner's env-step budget.

    Raises:
        ValueError: fewer than 2 processes, ``resume``, ranks with different configs, a config or run
            directory the loop's pieces refuse.
    """
    env = rendezvous_env()
    if env["world_size"] < 2:
        raise ValueError("dist.mode=actor_learner needs at least 2 processes (rank 0 learns, the others act): "
                         "launch with `torchrun --standalone --nproc_per_node=3 -m her_agents.cli ... "
                         "dist.mode=actor_learner`")
    if resume:
        raise ValueError("resume is not supported with dist.mode=actor_learner")
    torch.set_num_threads(max(1, cfg.train.torch_threads))
    if env["rank"] == 0:
        return _run_learner(cfg, env["world_size"], overwrite)
    return _run_actor(cfg, env["rank"], env["world_size"])
