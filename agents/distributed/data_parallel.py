"""Data-parallel training under ``torchrun``: every rank collects with its own envs and learns; gradients,
normalizer statistics and evaluation results are averaged across ranks.

Launch (one machine, 2 processes)::

    torchrun --standalone --nproc_per_node=2 -m her_agents.cli fetch_push_ddpg train.total_env_steps=100000

``torchrun`` sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``. Without them
(plain ``her-train``) [`train_data_parallel`][her_agents.distributed.data_parallel.train_data_parallel] runs the
single-process loop.

Every rank runs the plain loop (``her_agents.loop.train.train``) with a
[`DistContext`][her_agents.distributed.data_parallel.DistContext] as its
[`LoopHooks`][her_agents.loop.hooks.LoopHooks], and trains a
[`DataParallelAgent`][her_agents.distributed.data_parallel.DataParallelAgent] wrapped around its agent.
A one-process run never enters this code, and the context reaches the other ranks only through the few
operations of ``her_agents.distributed.collective.Collective``:

- ``init_distributed``: checks the rendezvous env vars, forms the process group (gloo on CPU, nccl on
  GPU) within ``dist.timeout_s``;
  [`DistContext.prepare_config`][her_agents.distributed.data_parallel.DistContext.prepare_config]: all ranks must hold
  the same resolved
  config (a hash is all-gathered; a mismatch names the ranks and keys that differ), then ``train.seed`` becomes
  ``seed + rank`` so every rank's envs, exploration noise and replay sampling differ;
- [`DistContext.wrap_agent`][her_agents.distributed.data_parallel.DistContext.wrap_agent]: rank 0's networks (and
  normalizers) are broadcast to all ranks; an
  optimizer step pre-hook averages the gradients of every optimizer of the agent (one flattened all-reduce per
  optimizer step), so DDPG/TD3/SAC ``update()`` run unchanged and all ranks keep identical parameters; the
  wrapper's ``update_normalizer`` only records the local (sum, sumsq, count) deltas;
- [`DistContext.before_updates`][her_agents.distributed.data_parallel.DistContext.before_updates]: before each block of
  updates (a fixed point: every rank reaches it at the
  same env step) the ranks all-gather their normalizer deltas (added in rank order: bit-identical statistics
  everywhere), whether they can learn and how many updates are pending (the minimum wins), so the number of
  updates, hence of gradient all-reduces, is the same on every rank and nobody deadlocks, also with episodes of
  variable length; a SIGINT / SIGTERM on any rank stops all of them at the next block
  ([`should_stop`][her_agents.distributed.data_parallel.DistContext.should_stop]);
- [`DistContext.average_eval`][her_agents.distributed.data_parallel.DistContext.average_eval]: evaluation metrics are
  averaged over ranks (each rank evaluates
  ``train.eval_episodes`` episodes on its own eval envs); rank 0 alone logs (stdout, ``metrics.csv``, W&B);
- [`DistContext.save_checkpoint`][her_agents.distributed.data_parallel.DistContext.save_checkpoint]: each rank's own
  state (RNGs, env RNGs, replay schedules, pending
  updates and normalizer deltas) is gathered into rank 0's ``checkpoint.pt``, and each rank writes its own
  replay (``replay.npz`` for rank 0, ``replay-rank<r>.npz``) with ``log.save_replay``, in the crash-safe order
  of ``her_agents.run.checkpoint``; a resume restores every rank's own state and refuses another world size.

Step counts (``train.total_env_steps``, ``warmup_steps``, ``learning_starts``, ``eval_every``,
``updates_per_step``) are **per rank**: each rank runs the single-process loop on its own envs, so a run
collects ``world_size x total_env_steps`` env steps; ``env_steps`` in ``metrics.csv`` is rank 0's count and
``dist/global_env_steps`` / ``dist/global_env_steps_per_s`` the sums over ranks.

Learning rate and number of ranks: gradients are *averaged*, so one update is a step on the mean loss of a
``world_size x batch_size`` batch with the configured learning rate: the effective step size is unchanged
(same lr, less gradient noise), and the number of updates per rank-local env step is the single-process one.
Keep the lr for a few ranks; with many ranks (a much larger effective batch) a larger lr (linear or sqrt
scaling with ``world_size``) can be tried but is not needed for the Fetch tasks.

Debug hook: with ``HER_DIST_DUMP=<dir>`` each rank writes ``<dir>/rank<r>.json`` at the end (hashes of all
parameters and of the normalizer statistics, update count), which the tests compare across ranks.
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ..algos.base import Agent, GoalConditionedAgentBase
from ..algos.normalizer import RunningNormalizer
from ..config import Config
from ..loop.train import LoopHooks, TrainResult, UpdateSchedule, train
from ..run.checkpoint import ReplayFiles, replay_name, save_checkpoint
from ..run.run_control import LaunchError
from .collective import Collective
from .launch import config_digest, config_mismatch_message, flat_config, rendezvous_env, state_hash

__all__ = [
    "DataParallelAgent",
    "DistContext",
    "config_digest",
    "config_mismatch_message",
    "flat_config",
    "init_distributed",
    "rendezvous_env",
    "state_hash",
    "train_data_parallel",
]
NORMALIZERS = ("obs_normalizer", "goal_normalizer")

T = TypeVar("T")


class DataParallelAgent:
    """An agent as one data-parallel rank trains it: every call goes to the wrapped agent, except
    ``update_normalizer``, which records this rank's statistics in ``deltas`` (``{normalizer name: [sum,
    sumsq, count]}``, float64) for
    [`DistContext.before_updates`][her_agents.distributed.data_parallel.DistContext.before_updates] to merge across
    ranks."""

    def __init__(self, agent: Agent, deltas: dict[str, list[np.ndarray]],
                 sync_networks: Callable[[Agent], None] | None = None) -> None:
        self.agent = agent
        self.deltas = deltas
        self.sync_networks = sync_networks
        """Called after an update the agent followed with a reset (``agent.reset_every``): the ranks drew their
        new layers from their own seeds, rank 0's go to all (``DistContext.broadcast_networks``)."""

    @property
    def obs_normalizer(self) -> RunningNormalizer:
        return self.agent.obs_normalizer

    @property
    def goal_normalizer(self) -> RunningNormalizer:
        return self.agent.goal_normalizer

    @property
    def rng(self) -> np.random.Generator:
        return self.agent.rng

    @property
    def num_updates(self) -> int:
        return self.agent.num_updates

    @property
    def config(self) -> Any:
        """The wrapped agent's config (the loop reads ``q_clip`` from it to notice diverged networks)."""
        return getattr(self.agent, "config", None)

    def act(self, observation: np.ndarray, desired_goal: np.ndarray, deterministic: bool = False) -> np.ndarray:
        return self.agent.act(observation, desired_goal, deterministic)

    def reset_noise(self, done: np.ndarray) -> None:
        self.agent.reset_noise(done)

    def value(self, observation: np.ndarray, desired_goal: np.ndarray) -> np.ndarray:
        return self.agent.value(observation, desired_goal)

    def update(self, batch: Any) -> dict[str, float | np.ndarray]:
        metrics = self.agent.update(batch)
        if (self.sync_networks is not None and isinstance(self.agent, GoalConditionedAgentBase)
                and self.agent.reset_due()):
            self.sync_networks(self.agent)
        return metrics

    def update_normalizer(self, observation: np.ndarray, desired_goal: np.ndarray) -> None:
        for name, x in (("obs_normalizer", observation), ("goal_normalizer", desired_goal)):
            if np.size(x):
                for acc, part in zip(self.deltas[name], getattr(self.agent, name).partial_stats(x)):
                    acc += part

    def networks(self) -> dict[str, nn.Module]:
        return self.agent.networks()

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return self.agent.optimizers()

    def policy_state_dict(self) -> dict[str, Any]:
        return self.agent.policy_state_dict()

    def load_policy_state_dict(self, state: dict[str, Any]) -> None:
        self.agent.load_policy_state_dict(state)

    def state_dict(self) -> dict[str, Any]:
        return self.agent.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.agent.load_state_dict(state)


@dataclass
class DistContext(LoopHooks):
    """The data-parallel hooks of the training loop for one rank of a process group of ``world_size > 1``
    (a one-process run never builds one: ``init_distributed`` returns None). It reaches the other ranks
    only through ``comm``."""

    comm: Collective
    local_rank: int = 0
    backend: str = "gloo"
    timeout_s: float = 300.0
    owns_group: bool = False
    agent: Agent | None = None
    update_every: int = 1
    n_envs: int = 1
    _pending: dict[str, list[np.ndarray]] = field(default_factory=dict)
    _hooks: list[Any] = field(default_factory=list)

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def world_size(self) -> int:  # type: ignore[override]
        return self.comm.world_size

    @property
    def is_main(self) -> bool:  # type: ignore[override]
        return self.rank == 0

    @property
    def device(self) -> torch.device:
        return self.comm.device

    # ------------------------------------------------------------------ set-up
    def prepare_config(self, cfg: Config) -> Config:
        """Refuse different configs across ranks; return a copy with ``train.seed + rank`` (and the rank's GPU).

        Raises:
            ValueError: the ranks hold different configs (names the ranks and keys).
        """
        self.update_every, self.n_envs = cfg.train.update_every, cfg.env.n_envs
        digests = self.comm.all_gather_object(config_digest(cfg))
        if len(set(digests)) > 1:
            raise ValueError(config_mismatch_message(self.comm.all_gather_object(flat_config(cfg)), digests))
        device = cfg.train.device
        # a resumed run's config names rank 0's GPU (cuda:0): every rank takes its own again
        if self.backend == "nccl" and device.startswith(("auto", "cuda")):
            device = f"cuda:{self.local_rank}"
        train = dataclasses.replace(cfg.train, seed=cfg.train.seed + self.rank, device=device)
        return dataclasses.replace(cfg, train=train)

    def share(self, obj: T) -> T:
        """Rank 0's ``obj`` on every rank (e.g. the run directory, whose default name has a time stamp)."""
        return self.comm.broadcast_object(obj)

    def wrap_agent(self, agent: Agent) -> Agent:
        """Broadcast rank 0's networks and normalizers, hook gradient averaging into the optimizers; the
        returned [`DataParallelAgent`][her_agents.distributed.data_parallel.DataParallelAgent] records normalizer
        statistics for [`before_updates`][her_agents.distributed.data_parallel.DistContext.before_updates]."""
        self.agent = agent
        self.broadcast_networks(agent)
        for name in NORMALIZERS:
            norm = getattr(agent, name)
            norm.load_state_dict(self.share(norm.state_dict()))
            self._pending[name] = [np.zeros(norm.size), np.zeros(norm.size), np.zeros(1)]
        if isinstance(agent, GoalConditionedAgentBase):  # its compiled update: the averaging below hooks
            agent.whole_update_ok = False  # optimizer.step(), which a whole-update graph skips
        for opt in agent.optimizers().values():
            self._hooks.append(opt.register_step_pre_hook(self._average_gradients))
        return DataParallelAgent(agent, self._pending, self.broadcast_networks)

    def broadcast_networks(self, agent: Agent) -> None:
        """Rank 0's parameters and buffers of every network of ``agent`` on all ranks, in place."""
        with torch.no_grad():
            for module in agent.networks().values():
                for t in list(module.parameters()) + list(module.buffers()):
                    self.comm.broadcast_(t)

    def _average_gradients(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads]).to(self.device)
        self.comm.mean_(flat)
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset:offset + n].view_as(g))
            offset += n

    # ------------------------------------------------------------------ loop hooks
    def should_stop(self, requested: bool, env_steps: int) -> bool:
        """All ranks stop together, at the start of a block of updates, when any rank was asked to."""
        return env_steps % self.update_every < self.n_envs and self.any_rank(requested)

    def before_updates(self, schedule: UpdateSchedule) -> None:
        """Merge the ranks' normalizer deltas; all ranks learn, the same number of updates, or none does."""
        schedule.can_learn, schedule.pending = self.sync_block(self.agent, schedule.can_learn, schedule.pending)
        if not schedule.can_learn:
            schedule.pending = 0.0

    def sync_block(self, agent: Agent | None, can_learn: bool, pending_updates: float) -> tuple[bool, float]:
        """Add the sum of every rank's normalizer deltas to ``agent``'s normalizers (in rank order) and reset
        the deltas. Returns ``(every rank can learn, the fewest pending updates of any rank)``."""
        names = list(self._pending)
        local = np.concatenate([np.concatenate(self._pending[n]) for n in names]
                               + [[float(can_learn), float(pending_updates)]])
        rows = self.comm.all_gather(local)  # [world, L], summed in rank order on every rank
        total = rows[0].copy()
        for r in range(1, self.world_size):
            total += rows[r]
        offset = 0
        for n in names:
            norm = getattr(agent, n)
            s, sq, c = (total[offset:offset + norm.size], total[offset + norm.size:offset + 2 * norm.size],
                        total[offset + 2 * norm.size:offset + 2 * norm.size + 1])
            offset += 2 * norm.size + 1
            if c[0] > 0:
                norm.add_stats(s, sq, c)
            for acc in self._pending[n]:
                acc[...] = 0.0
        return bool(rows[:, -2].min() > 0), float(rows[:, -1].min())

    def any_rank(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is true on any (a collective: all ranks call it at the same step)."""
        return bool(self.comm.all_reduce([float(flag)], op="max")[0] > 0)

    def average_eval(self, ev: dict[str, float]) -> dict[str, float]:
        """Evaluation metrics averaged over ranks (each evaluated the same number of episodes)."""
        keys = sorted(ev)
        total = self.comm.all_reduce([ev[k] for k in keys])
        return {k: float(v) / self.world_size for k, v in zip(keys, total)}

    def row_extras(self, row: dict[str, Any]) -> dict[str, Any]:
        """``dist/world_size``, ``dist/global_env_steps`` and ``dist/global_env_steps_per_s`` (sums over ranks)."""
        steps, rate = self.comm.all_reduce([row["env_steps"], row["env_steps_per_s"]])
        return {"dist/world_size": self.world_size, "dist/global_env_steps": int(steps),
                "dist/global_env_steps_per_s": float(rate)}

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The normalizer deltas not merged yet (a checkpoint between blocks of updates)."""
        return {"normalizer_deltas": {n: [a.copy() for a in v] for n, v in self._pending.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for n, arrays in state.get("normalizer_deltas", {}).items():
            for acc, saved in zip(self._pending[n], arrays):
                acc[...] = saved

    @property
    def replay_name(self) -> str:  # type: ignore[override]
        """This rank's replay files (``her_agents.run.checkpoint.replay_name``)."""
        return replay_name(self.rank)

    def save_checkpoint(self, run_dir: Path, shared: dict[str, Any], own: dict[str, Any],
                        replay: ReplayFiles) -> None:
        """Every rank's ``own`` state gathered into rank 0's ``checkpoint.pt`` (``ranks``, in rank order), each
        rank's replay in its own files (``her_agents.run.checkpoint.ReplayFiles``): every rank prepares its
        replay before the checkpoint and commits it after, so every kill point leaves matching files.

        Raises:
            OSError: this rank's write failed (or what the failing write raised).
            RuntimeError: another rank's write failed (the previous checkpoint stays valid).
        """
        steps = int(shared["counters"]["env_steps"])
        error = None
        try:
            if replay.saving:
                own = {**own, **replay.prepare(steps)}
        except Exception as exc:
            error = exc
        parts = self.comm.gather_object((own, error is None))
        written = False
        if parts is not None and all(ok for _, ok in parts):
            try:
                save_checkpoint(run_dir / "checkpoint.pt", {**shared, **own, "world_size": self.world_size,
                                                            "ranks": [o for o, _ in parts]})
                written = True
            except Exception as exc:
                error = exc
        if not self.share(written):
            if replay.saving:
                replay.abort()  # the previous checkpoint and replays stay a matching set
            raise error or RuntimeError(f"rank {self.rank}: no checkpoint written at {steps} env steps: another "
                                        "rank could not write its part (see its error)")
        if replay.saving:
            replay.commit()
        else:  # replay files of an overwritten run or of earlier checkpoints: not this state
            replay.remove()

    def checkpoint_part(self, state: dict[str, Any]) -> dict[str, Any]:
        """This rank's entry of ``state["ranks"]``."""
        return state["ranks"][self.rank] if "ranks" in state else state  # an older checkpoint: rank 0's for all

    # ------------------------------------------------------------------ end
    def dump(self) -> None:
        """With ``HER_DIST_DUMP=<dir>``: write this rank's parameter/normalizer hashes to ``<dir>/rank<r>.json``."""
        out = os.environ.get("HER_DIST_DUMP")
        if not out or self.agent is None:
            return
        agent = self.agent
        norms = {n: getattr(agent, n) for n in NORMALIZERS}
        info = {
            "rank": self.rank, "world_size": self.world_size, "num_updates": int(agent.num_updates),
            "params": {k: state_hash(list(m.state_dict().values())) for k, m in agent.networks().items()},
            "normalizers": {n: state_hash([v.sum, v.sumsq, v.count]) for n, v in norms.items()},
            "normalizer_count": float(agent.obs_normalizer.count[0]),
        }
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"rank{self.rank}.json").write_text(json.dumps(info, indent=1))

    def close(self, finished: bool = False) -> None:
        """Dump (debug hook), remove the hooks and destroy the process group this context created.

        Args:
            finished: every rank ended its loop normally: wait for all of them before tearing down, so that no
                rank exits (and has torchrun stop the others) while rank 0 still writes its last files.
        """
        self.dump()
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        if self.owns_group and dist.is_initialized():
            if finished:
                self.comm.barrier()
            dist.destroy_process_group()
            self.owns_group = False
            gc.collect()  # the group's gloo threads end now, not in the interpreter's teardown


def init_distributed(backend: str = "auto", timeout_s: float = 300.0) -> DistContext | None:
    """Form the data-parallel process group from torchrun's env vars; None for one process (no such vars).

    Args:
        backend: ``auto`` (nccl when CUDA is available, else gloo), ``gloo`` or ``nccl``.
        timeout_s: how long to wait for all ranks at the rendezvous (and for each collective).

    Raises:
        LaunchError: ``WORLD_SIZE > 1`` with missing rendezvous variables, ``nccl`` without a CUDA GPU for this
            rank, or the group could not form in time.
    """
    env = rendezvous_env()
    if env["world_size"] == 1:
        return None
    rank, world = env["rank"], env["world_size"]
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"
    device = torch.device("cpu")
    if backend == "nccl":
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not dist.is_nccl_available() or env["local_rank"] >= gpus:
            have = ("this torch has no NCCL" if not dist.is_nccl_available() else
                    f"LOCAL_RANK={env['local_rank']} but this machine has {gpus} CUDA GPU(s)")
            raise LaunchError(f"rank {rank}: dist.backend=nccl needs a CUDA GPU per process on each node and a torch "
                              f"built with NCCL ({have}): use dist.backend=gloo (or auto), or launch at most as "
                              "many processes per node as it has GPUs")
        device = torch.device("cuda", env["local_rank"])
        torch.cuda.set_device(device)
    ctx = DistContext(Collective(rank, world, device), local_rank=env["local_rank"], backend=backend,
                      timeout_s=timeout_s)
    if dist.is_initialized():  # someone else formed it (e.g. a test harness): use it, do not destroy it
        if dist.get_world_size() != world or dist.get_rank() != rank:
            raise LaunchError(f"a process group of world size {dist.get_world_size()} / rank {dist.get_rank()} "
                               f"exists but the env says WORLD_SIZE={world} RANK={rank}")
        return ctx
    where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    try:
        dist.init_process_group(backend, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        # init is lazy for some backends: a first collective proves every rank is there
        probe = torch.ones(1, device=device)
        dist.all_reduce(probe)
        if int(probe.item()) != world:
            raise RuntimeError(f"probe all-reduce gave {probe.item()}, expected {world}")
    except Exception as exc:
        if dist.is_initialized():
            dist.destroy_process_group()
        raise LaunchError(
            f"rank {rank}: could not form the {backend} process group of WORLD_SIZE={world} at "
            f"{where} within {timeout_s:.0f} s ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})."
            " Check that every rank was started (same --nproc_per_node/--nnodes), that MASTER_ADDR/MASTER_PORT "
            "are reachable from all nodes, and raise dist.timeout_s for slow starts."
        ) from exc
    ctx.owns_group = True
    return ctx


def train_data_parallel(cfg: Config, resume: str | None = None, overwrite: bool = False) -> TrainResult:
    """This rank's part of a data-parallel run under torchrun (``her_agents.loop.train.train`` with a
    [`DistContext`][her_agents.distributed.data_parallel.DistContext]); the plain single-process loop without
    torchrun's env vars.

    Raises:
        LaunchError: a rendezvous that cannot form (see ``init_distributed``).
        ValueError: the ranks hold different configs, and what ``train`` raises.
    """
    ctx = init_distributed(cfg.dist.backend, cfg.dist.timeout_s)
    if ctx is None:
        return train(cfg, resume, overwrite)
    try:
        result = train(ctx.prepare_config(cfg), resume, overwrite, hooks=ctx)
    except BaseException:
        ctx.close()
        raise
    ctx.close(finished=True)
    return result
