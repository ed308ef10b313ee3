"""Actor-learner training (Ape-X, Horgan et al. 2018) over ``torch.distributed.rpc``.

Launch with ``dist.mode=actor_learner`` under torchrun; rank 0 is the learner, ranks 1.. are actors::

    torchrun --standalone --nproc_per_node=3 -m her_agents.cli fetch_reach_ddpg dist.mode=actor_learner

- **Actors** step their own vector envs (``env.n_envs``, seeds ``train.seed + rank``) with their own
  exploration noise (agent seed ``train.seed + rank``), stage steps per env until an episode ends, and send each
  complete episode to the learner with ``rpc_async`` (fire and forget; the futures are checked, and awaited
  at the end). After each finished episode an actor asks the learner for the newest weights (actor network +
  observation/goal normalizers) and loads them when their version is newer. The first
  ``train.warmup_steps / n_actors`` steps of each actor use uniform random actions.
- **The learner** runs the training loop itself (``her_agents.loop.train.train`` with
  ``LearnerHooks``): its collection step stores the episodes its actors sent instead of stepping envs.
  The RPC target ``_rpc_add_episode`` puts an episode in a queue; the loop's collect step drains it and
  calls ``storage.add_episode`` (a prioritized sampler gives the new transitions the maximum priority on add)
  and updates the normalizers with relabeled samples of the episode, as the single-process loop does. Keeping
  every storage/sampler call on the learner's main thread avoids locking the numpy structures. The rest is the
  loop's own: ``train.updates_per_step`` updates per received env step, the evaluations, ``metrics.csv`` and
  W&B, checkpoints, resume (``her-train --resume``, any number of actors), signals, the run directory (default
  name ``<env>-<algo>-apex-s<seed>-<time>``, locked). It publishes new weights every ``dist.weight_sync_every``
  updates; weights travel as the agent's ``policy_state_dict()``.
- **Env steps** are counted on the learner from the episodes it received (all actors). When they reach
  ``train.total_env_steps`` the learner tells the actors to stop (answer of their next weight fetch), the loop
  evaluates and checkpoints, and everyone calls ``rpc.shutdown()`` (graceful: outstanding episodes are
  delivered first and are stored, after the last checkpoint).
- **Signals**: SIGINT / SIGTERM to the learner stop the loop as in one process (checkpoint, W&B finished as
  interrupted / terminated, exit 130 / 143); to an actor, it asks the learner to do the same, then returns.
  The checkpoint is the learner's alone: on ``--resume`` the actors start afresh (their envs reseeded, past
  the warm-up the run has done).

All ranks must be launched with the same config (checked over RPC at start: a mismatch names the differing
ranks and keys).

Debug hook: with ``HER_DIST_DUMP=<dir>`` the learner writes ``<dir>/learner.json`` (episodes received per actor,
``storage.n_episodes_added``, the hash of every published weight version) and each actor ``actor<r>.json``
(episodes sent, hash of every weight version it loaded).
"""

from __future__ import annotations

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
from ..loop import LoopHooks, TrainResult, build_agent, choose_action, collect_step, normalize_from_episode
from ..loop.train import Run, seed_everything, train, use_threads
from ..run.run_control import GracefulStop, LaunchError, TrainingStopped
from .launch import config_digest, config_mismatch_message, flat_config, rendezvous_env, state_hash
from her_envs import goal_env_spec, make_vector_env

__all__ = ["LearnerHooks", "train_actor_learner"]

LEARNER = "learner"

# Per-process state the RPC targets read (each process sets its own before init_rpc).
_CONFIG: dict[str, Any] = {}
_LEARNER_STATE: _LearnerState | None = None


def _worker_name(rank: int) -> str:
    return LEARNER if rank == 0 else f"actor{rank}"


# ---------------------------------------------------------------------------------------------------------
# RPC targets (module level so they pickle by name)
# ---------------------------------------------------------------------------------------------------------


def _learner_state() -> _LearnerState:
    """The learner's state, set (``LearnerHooks.start``) before the learner joins the RPC group."""
    assert _LEARNER_STATE is not None, "the learner serves RPCs only once started"
    return _LEARNER_STATE


def _rpc_config() -> tuple[str, dict[str, Any]]:
    return _CONFIG["digest"], _CONFIG["flat"]


def _rpc_add_episode(actor_rank: int, seq: int, episode: dict[str, Any]) -> int:
    """Learner side: queue one complete episode for ``storage.add_episode``. Returns the weights version."""
    st = _learner_state()
    with st.lock:  # env steps are counted on receipt, so the actors stop right at the budget
        st.inbox.put((actor_rank, seq, episode))
        st.received_steps += len(episode["action"])
        if st.received_steps >= st.total_env_steps:
            st.stop = True
    return st.version


def _rpc_start_steps() -> int:
    """Learner side: the run's env steps when the learner started (a resume's checkpoint; 0 for a new run)."""
    return _learner_state().start_steps


def _rpc_request_stop(signum: int) -> None:
    """Learner side: an actor received ``signum``: stop the run (checkpoint) as a signal to the learner would."""
    _learner_state().stop_requested = signum


def _rpc_fetch_weights(have_version: int) -> tuple[int, dict[str, Any] | None, bool]:
    """Learner side: ``(version, weights or None if not newer, stop)``."""
    st = _learner_state()
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
    """What the RPC targets share with the learner's loop (they run on RPC threads)."""

    def __init__(self, total_env_steps: int, start_steps: int, version: int) -> None:
        self.lock = threading.Lock()
        self.total_env_steps = int(total_env_steps)
        self.start_steps = int(start_steps)
        """Env steps of the run when this process started (a resume's checkpoint)."""
        self.received_steps = int(start_steps)
        self.inbox: queue.Queue = queue.Queue()
        self.version = version
        self.weights: tuple[int, dict[str, Any] | None] = (version, None)
        self.stop = start_steps >= total_env_steps
        self.stop_requested: int | None = None
        """The signal an actor received (it asks the learner to stop the run)."""
        self.published: dict[int, str] = {}

    def publish(self, agent: Agent) -> None:
        state = agent.policy_state_dict()
        version = self.version + 1
        self.published[version] = _policy_hash(state)
        self.weights = (version, state)
        self.version = version


class LearnerHooks(LoopHooks):
    """The learner's part of the training loop (``her_agents.loop.train.train``): it collects by storing the
    episodes its actors send, and publishes the policy every ``dist.weight_sync_every`` updates. Everything
    else (set-up, resume, updates, evaluation, checkpoints, signals, W&B) is the loop's own; the checkpoint is
    the learner's alone (the actors hold no state worth resuming: they start afresh, their envs reseeded)."""

    steps_envs = False

    def __init__(self, cfg: Config, world: int) -> None:
        self.cfg, self.world = cfg, world
        self.run_label = f"{cfg.algo}-apex"
        self.run: Run | None = None
        self.st: _LearnerState | None = None
        self._version = 0  # the weights version a resumed checkpoint reached
        self._published_at = 0  # updates at the last publication
        self.received = {r: 0 for r in range(1, world)}
        self.last_seq = {r: 0 for r in range(1, world)}
        self.duplicates = 0

    def start(self, run: Run) -> None:
        """Publish the first weights and join the RPC group (the actors wait in it until then)."""
        global _LEARNER_STATE
        self.run = run
        st = _LearnerState(self.cfg.train.total_env_steps, run.env_steps, self._version)
        st.publish(run.state.agent)  # the actors start from the learner's weights
        self._published_at = run.state.counters["updates"]
        self.st = _LEARNER_STATE = st
        _init_rpc(self.cfg, 0, self.world)

    def _started(self) -> tuple[Run, _LearnerState]:
        """The run and the learner's state, set by ``start`` (the loop's first call of the hooks that use them)."""
        assert self.run is not None and self.st is not None, "LearnerHooks.start runs first"
        return self.run, self.st

    def should_stop(self, requested: bool, env_steps: int) -> bool:
        _, st = self._started()
        if requested or st.stop_requested is not None:
            st.stop = True  # the actors stop at their next weight fetch
            return True
        return False

    def collect(self, run: Run) -> int:
        """Publish the weights when ``dist.weight_sync_every`` updates have passed, then store the episodes
        received (waiting up to 50 ms for the first); returns their env steps."""
        updates = run.state.counters["updates"]
        if updates - self._published_at >= self.cfg.dist.weight_sync_every:
            self._started()[1].publish(run.state.agent)
            self._published_at = updates
        return self.ingest(block=True)

    def ingest(self, block: bool = False) -> int:
        """Store the episodes in the inbox as the loop stores its own (counters, successes, normalizers)."""
        run, st = self._started()
        s, t_cfg = run.state, self.cfg.train
        n_steps = 0
        while True:
            try:
                actor, seq, ep = st.inbox.get(timeout=0.05) if block else st.inbox.get_nowait()
            except queue.Empty:
                return n_steps
            block = False
            if seq <= self.last_seq[actor]:  # an RPC delivered twice: never store an episode twice
                self.duplicates += 1
                continue
            self.last_seq[actor] = seq
            start, T = s.replay.storage.add_episode(
                ep["observation"], ep["action"], ep["reward"], achieved_goal=ep["achieved_goal"],
                desired_goal=ep["desired_goal"], terminated=ep["terminated"], info=ep["info"])
            normalize_from_episode(s.agent, s.replay, start, T, t_cfg.normalizer_relabeled)
            self.received[actor] += 1
            s.counters["episodes"] += 1
            s.counters["env_steps"] += T
            n_steps += T
            s.evals.train_successes.append(float(ep["is_success"]))

    def row_extras(self, row: dict[str, Any]) -> dict[str, Any]:
        return {"dist/world_size": self.world, "dist/weights_version": self._started()[1].version}

    def state_dict(self) -> dict[str, Any]:
        return {"weights_version": self.st.version if self.st else self._version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._version = int(state.get("weights_version", 0))

    def finish(self, graceful: bool) -> None:
        """Leave the RPC group: ``graceful``, once every actor has stopped (the episodes they sent last are
        delivered and stored, not checkpointed); else at once (a crash)."""
        if self.st is None:  # the loop refused before the learner joined the group
            return
        run, st = self._started()
        st.stop = True
        if not graceful:
            rpc.shutdown(graceful=False)
            return
        st.publish(run.state.agent)
        rpc.shutdown()  # waits for every actor; their last episodes are delivered before it returns
        self.ingest()  # ... and stored here
        c = run.state.counters
        _dump("learner", {"received": {str(k): v for k, v in self.received.items()}, "duplicates": self.duplicates,
                          "n_episodes_added": run.state.replay.storage.n_episodes_added,
                          "env_steps": c["env_steps"], "updates": c["updates"],
                          "published": {str(k): v for k, v in st.published.items()}})


def _run_learner(cfg: Config, world: int, resume: str | None, overwrite: bool) -> TrainResult:
    hooks = LearnerHooks(cfg, world)
    try:
        result = train(cfg, resume, overwrite, hooks=hooks)
    except TrainingStopped:
        hooks.finish(graceful=True)  # the checkpoint is written; the actors stop at their next fetch
        raise
    except BaseException:
        hooks.finish(graceful=False)
        raise
    hooks.finish(graceful=True)
    return result


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
    """Collect with this actor's own envs and exploration, sending each finished episode to the learner, until
    the learner says stop (its budget reached, or a signal anywhere in the run). A signal to this process asks
    the learner to stop the run (it checkpoints); the actor then returns."""
    t_cfg = cfg.train
    seed = t_cfg.seed + rank
    seed_everything(seed)
    spec = goal_env_spec(cfg.env.id)
    n_envs = cfg.env.n_envs
    agent, reward_guard = build_agent(cfg, spec, seed=seed, device="cpu")  # own exploration noise
    max_T = spec.max_episode_steps or 50
    staging = her.EpisodeWriter(her.EpisodeStorage(
        4 * max_T * n_envs, (spec.observation_dim,), (spec.action_dim,), (spec.goal_dim,),
        max_episode_steps=max_T, n_envs=n_envs, info_shapes=dict(spec.info_shapes)))
    env = make_vector_env(cfg.env.id, n_envs, cfg.env.vectorization, seed=seed * 1000,
                          grasped_start=cfg.env.grasped_start, rare_state_start=cfg.env.rare_state_start,
                          rare_state_cell=cfg.env.rare_state_cell)  # an actor's archive is its own, not checkpointed
    rng = np.random.default_rng(seed)
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
        with GracefulStop(announce=False) as signals:
            start_steps = rpc.rpc_sync(LEARNER, _rpc_start_steps)  # a resumed run: past its warm-up, envs reseeded
            warmup = math.ceil(max(0, t_cfg.warmup_steps - start_steps) / max(1, world - 1))
            fetch()
            obs, _ = env.reset(seed=seed * 1000 + start_steps)
            while not stop:
                if signals.signum is not None:  # the learner checkpoints and stops the run
                    rpc.rpc_sync(LEARNER, _rpc_request_stop, args=(signals.signum,))
                    break
                action = choose_action(agent, obs, spec, n_envs, steps < warmup, rng)
                obs, step, stored = collect_step(env, obs, action, staging, spec.info_shapes, reward_guard,
                                                 cfg.env.id)
                steps += n_envs
                if step.done.any():
                    agent.reset_noise(step.done)
                if stored:
                    success = step.is_success[np.flatnonzero(step.done)]
                    for (first, T), ok in zip(stored, success):
                        sent += 1
                        futures.append(rpc.rpc_async(LEARNER, _rpc_add_episode,
                                                     args=(rank, sent, _episode(staging.storage, first, T, ok))))
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
    rpc.shutdown()  # waits for the learner's last checkpoint
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

    Args:
        resume: the run directory to continue (its checkpoint is the learner's; any number of actors resume it).

    Raises:
        ValueError: fewer than 2 processes, ranks with different configs, a config, run directory or
            checkpoint the loop refuses.
        TrainingStopped: on the learner, SIGINT or SIGTERM reached a process of the run: the learner wrote a
            checkpoint (the actors stop and return).
    """
    env = rendezvous_env()
    if env["world_size"] < 2:
        raise ValueError("dist.mode=actor_learner needs at least 2 processes (rank 0 learns, the others act): "
                         "launch with `torchrun --standalone --nproc_per_node=3 -m her_agents.cli ... "
                         "dist.mode=actor_learner`")
    use_threads(cfg)
    if env["rank"] == 0:
        return _run_learner(cfg, env["world_size"], resume, overwrite)
    return _run_actor(cfg, env["rank"], env["world_size"])
