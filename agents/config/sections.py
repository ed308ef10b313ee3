"""The run config's sections as typed dataclasses, the documented defaults: ``env``, ``replay``, ``train``,
``log`` (with ``log.wandb``) and ``dist``. Each checks its own values in ``__post_init__``; the replay values
(and ``train.gamma``) are checked by the ``her`` library itself ([`check_replay`][her_agents.config.check_replay]),
a device name here and whether the machine has it when training starts
([`check_device`][her_agents.config.check_device]).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from ..fields import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, UNIT_INTERVAL, check_ranges, check_types, require

__all__ = ["DEVICES", "DistBackend", "DistConfig", "DistMode", "EnvConfig", "LogConfig", "ReplayConfig", "Strategy",
           "TrainConfig", "Vectorization", "WandbConfig", "WandbMode", "check_device", "check_device_name",
           "check_replay", "torch_thread_count", "usable_cores"]

Vectorization = Literal["sync", "async"]
Strategy = Literal["future", "final", "episode", "mixed"]
"""The values of [`her.RelabelStrategy`][]."""
WandbMode = Literal["auto", "online", "offline", "disabled"]
DistMode = Literal["data_parallel", "actor_learner"]
DistBackend = Literal["auto", "gloo", "nccl"]
DEVICES = ("auto", "cpu", "cuda")
"""``train.device``: one of these or ``cuda:N``."""


@dataclass
class EnvConfig:
    id: str = "FetchPush-v4"
    """gymnasium env id: FetchReach/Push/Slide/PickAndPlace-v4 or any registered goal env; ``module.path:EnvId-v0``
    imports ``module.path`` (from the Python path or the current directory), which registers ``EnvId-v0``."""
    n_envs: int = 1
    """Parallel training envs (gymnasium vector env, >= 1); each env step counts n_envs env steps."""
    vectorization: Vectorization = "sync"
    """"sync" (one process) or "async" (a subprocess per env)."""
    eval_envs: int = 10
    """Parallel envs used for evaluation episodes (>= 1)."""
    grasped_start: float = 0.0
    """Share (in [0, 1]) of the training episodes that start with the object held in the gripper, as the HER paper
    did for pick-and-place (``her_envs.GraspedStart``); FetchPickAndPlace only. Evaluation episodes never do."""
    rare_state_start: float = 0.0
    """Share (in [0, 1]) of the training episodes that start from an archived state whose achieved goal was rarely
    reached, among those inside the env's desired-goal support (Go-Explore's return-then-explore,
    ``her_envs.RareStateStart``): an object lifted by chance becomes a start, with no knowledge of the task.
    gymnasium-robotics MuJoCo envs; the archive is in checkpoints (with ``dist.mode=actor_learner`` each actor keeps
    its own, not checkpointed). Evaluation episodes never do."""
    rare_state_cell: float = 0.05
    """With ``rare_state_start``: edge of the achieved-goal cells states are archived and counted in (> 0, the
    goal's units: metres for Fetch)."""
    behaviour_goals: float = 0.0
    """Share (in [0, 1]) of the training episodes whose desired goal is replaced, as the episode begins, by MEGA's
    behaviour goal (``her.MinDensityGoals``; Pitis et al. 2020): the stored achieved goal of lowest density among
    those the critic values above an adaptive cutoff. Their stored desired goal is that goal. Goal envs that keep
    their goal in ``env.unwrapped.goal`` (``her_envs.BehaviourGoal``); not with ``dist.mode=actor_learner``.
    Evaluation episodes never do."""
    behaviour_goal_support: float = 0.0
    """With ``behaviour_goals``: prefer achieved goals within this many standard deviations of one of the env's own
    desired goals (``her.MinDensityGoals(desired_support=...)``, >= 0; 0: any achieved goal), so that a rare goal
    the task never asks for (an object knocked off the table) is not the one practised."""

    def __post_init__(self) -> None:
        """Raises:
            ValueError: a value of the wrong type or choice, fewer than 1 env, a grasped start outside
            FetchPickAndPlace."""
        check_types(self)
        check_ranges(self, {"n_envs": AT_LEAST_ONE, "eval_envs": AT_LEAST_ONE, "grasped_start": UNIT_INTERVAL,
                            "rare_state_start": UNIT_INTERVAL, "rare_state_cell": POSITIVE,
                            "behaviour_goals": UNIT_INTERVAL, "behaviour_goal_support": NON_NEGATIVE})
        require(not self.grasped_start or self.id.startswith("FetchPickAndPlace"), "grasped_start",
                f"0 for {self.id} (it needs an object to hold: FetchPickAndPlace)", self.grasped_start)


@dataclass
class ReplayConfig:
    """The HER replay (``her.HerReplayBuffer`` and its pieces). The ``her`` library checks the ranges of these
    values when it builds the replay; [`check_replay`][her_agents.config.check_replay] runs those checks at
    load time."""

    capacity: int = 1_000_000
    """Transitions kept (>= 1; whole episodes are dropped, oldest first)."""
    strategy: Strategy = "future"
    """HER relabel strategy: future | final | episode | mixed (future + other episodes' desired goals)."""
    n_sampled_goal: int = 4
    """k >= 0: relabel probability k/(k+1). 0 disables HER."""
    other_desired_fraction: float = 0.5
    """Strategy mixed: share (in [0, 1]) of the relabeled goals drawn from stored desired goals (the rest are future
    goals)."""
    n_step: int = 1
    """n-step returns (>= 1; 1 = one-step TD)."""
    stop_at_success: bool = False
    """End the n-step window where the (relabeled) goal is first achieved (Yang et al. 2021)."""
    prioritized: bool = False
    """Proportional prioritized replay (Schaul et al. 2016)."""
    alpha: float = 0.6
    """Prioritization exponent (>= 0)."""
    beta0: float = 0.4
    """Initial importance-sampling exponent (in [0, 1]), annealed linearly to 1 over the run's updates."""
    eps: float = 1e-6
    """Added to |TD error| so no priority is 0 (> 0)."""
    td_error_clip: float | None = None
    """Upper clip (> 0) of |TD error| before the priority (None = no clip)."""
    rank_based: bool = False
    """Rank-based instead of proportional prioritization."""
    energy: bool = False
    """Energy-based episode prioritization (Zhao & Tresp 2018, ``her.EnergySampler``): episodes drawn in proportion
    to the energy their achieved goal (the object's position) gained, plus ``energy_eps``; needs goals that start
    with a position and an env with a ``dt``. Not with ``prioritized``."""
    energy_clip: float = 0.5
    """Per-step clip of the gained energy (> 0; the paper's 0.5 for Fetch)."""
    energy_eps: float = 0.01
    """Added to every episode's energy (> 0), so that episodes where the object did not move stay sampleable."""
    energy_kinetic_weight: float = 1.0
    """Weight of the kinetic term in the energy (>= 0; the paper's 1); below 1 a lift counts more than a push."""
    energy_exponent: float = 1.0
    """An episode is drawn in proportion to ``(energy + energy_eps) ** energy_exponent`` (> 0; the paper's 1)."""

    def __post_init__(self) -> None:
        """Types and choices only (the ranges are ``her``'s, see
        [`check_replay`][her_agents.config.check_replay]); ``capacity`` too, which
        ``her`` checks in its storage, built here without allocating one.

        Raises:
            ValueError: a value of the wrong type or choice, a capacity < 1.
        """
        check_types(self)
        check_ranges(self, {"capacity": AT_LEAST_ONE})


@dataclass
class TrainConfig:
    total_env_steps: int = 200_000
    """Env steps to train for (summed over envs, >= 1)."""
    warmup_steps: int = 1_000
    """Initial env steps with uniform random actions (>= 0)."""
    learning_starts: int = 1_000
    """Env steps before the first update (>= 0; there must also be one complete episode stored)."""
    updates_per_step: float = 0.4
    """Gradient updates per env step (a finite number >= 0; baselines HER: 40 updates per 100 steps)."""
    update_every: int = 1
    """Do the updates in blocks every this many env steps (>= 1; 50 = once per Fetch episode, baselines'
    cycles)."""
    batch_size: int = 256
    """Transitions per update (in [1, replay.capacity])."""
    gamma: float = 0.98
    """Discount factor in (0, 1] (checked by ``her``'s returns, see
    [`check_replay`][her_agents.config.check_replay]; baselines: 1 - 1/T for
    T = 50)."""
    eval_every: int = 20_000
    """Evaluate every this many env steps (>= 1; and at the end)."""
    eval_episodes: int = 50
    """Deterministic evaluation episodes per evaluation (>= 1)."""
    seed: int = 0
    """Seeds envs, numpy, torch and the replay, in [0, 2**32 - 10000) (eval envs use seed + 10000); a CPU run is
    reproducible."""
    device: str = "auto"
    """auto | cpu | cuda | cuda:N (whether this machine has it is checked when training starts,
    [`check_device`][her_agents.config.check_device])."""
    torch_threads: int | Literal["auto"] = "auto"
    """torch intra-op threads: ``auto`` uses every core this process may use (``os.sched_getaffinity``; under
    torchrun, shared among the node's ranks; less one core per training env with ``overlap_env``, whose env
    workers step meanwhile; ``OMP_NUM_THREADS``, where set, wins), so that one run owns the machine; an integer
    >= 1 limits it: 1 to
    train several runs side by side, one core each. The same count sizes what the run starts in the background
    (``agent.compile``'s compile workers). See [`torch_thread_count`][her_agents.config.torch_thread_count]."""
    normalizer_relabeled: bool = True
    """Feed the normalizer HER-relabeled samples of each new episode (baselines), else raw stored goals."""
    overlap_env: bool = False
    """Step the training envs while the updates run: the loop hands each env step's actions to env worker
    processes (``env.vectorization`` is then async, also for ``env.n_envs=1``), does that step's due updates
    while they step, then stores the step. Saves up to the env's time per step (Fetch: about 1 ms of a 3-4 ms
    step) where a core is free for the workers. Its cost: a one-step lag, the updates do not see the step
    being taken (only complete episodes are sampled, so this matters where the step ends an episode: the
    episode joins the replay and the normalizers after that step's updates; a seed still gives one run, and a
    resume continues it exactly), and one process per training env. Ignored in the actor-learner mode (its
    learner steps no envs)."""

    def __post_init__(self) -> None:
        """Raises:
            ValueError: a value of the wrong type, out of range, or a device that is not auto, cpu, cuda or
                cuda:N."""
        check_types(self)
        check_ranges(self, {
            "total_env_steps": AT_LEAST_ONE, "warmup_steps": NON_NEGATIVE, "learning_starts": NON_NEGATIVE,
            "updates_per_step": NON_NEGATIVE, "update_every": AT_LEAST_ONE, "batch_size": AT_LEAST_ONE,
            "eval_every": AT_LEAST_ONE, "eval_episodes": AT_LEAST_ONE,
            "seed": (lambda v: 0 <= v < 2**32 - 10_000, "in [0, 2**32 - 10000)"),
            "torch_threads": (lambda v: v == "auto" or v >= 1, "auto or an integer >= 1"),
        })
        check_device_name(self.device, "device")


def usable_cores() -> int:
    """The number of CPU cores this process may run on: ``len(os.sched_getaffinity(0))`` (a CPU set given by
    ``taskset``, a container or a scheduler counts), else ``os.cpu_count()`` where the platform has no affinity
    (macOS, Windows)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def torch_thread_count(value: int | str | None, env_workers: int = 0) -> int:
    """The torch threads of a ``train.torch_threads`` value (``auto``, an int >= 1; None, a config older
    than the key: 1): ``auto`` is ``OMP_NUM_THREADS`` where it is set to a positive integer (the usual way to
    limit a process's threads; torchrun sets it to 1 for several ranks), else ``usable_cores()`` divided among
    the ranks a torchrun started on this node (``LOCAL_WORLD_SIZE``), less ``env_workers`` (the env worker
    processes that step while the updates run, ``train.overlap_env``: a torch thread that shares a core with
    one spin-waits for it), at least 1."""
    if value is None:
        return 1
    if value == "auto":
        omp = os.environ.get("OMP_NUM_THREADS", "").strip()
        if omp.isdigit() and int(omp) >= 1:
            return int(omp)
        try:
            ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        except ValueError:
            ranks = 1
        return max(1, usable_cores() // ranks - max(0, int(env_workers)))
    return max(1, int(value))


_WANDB_PROJECT_FORBIDDEN = "/\\#?%:"  # wandb.sdk.wandb_settings.Settings.validate_project


@dataclass
class WandbConfig:
    mode: WandbMode = "auto"
    """auto | online | offline | disabled. auto: WANDB_MODE if set, online with an API key, else offline."""
    project: str = "her-robotics"
    """W&B project the run is logged to."""
    entity: str | None = None
    """W&B user or team; null: the API key's default entity."""
    tags: list[str] = field(default_factory=list)
    """Tags of the W&B run (e.g. ``[push, ablation]``)."""
    group: str | None = None
    """W&B group, e.g. one per recipe so its seeds are averaged in the W&B UI."""
    name: str | None = None
    """Display name of the W&B run; null: the run directory's name."""
    init_timeout_s: float = 20.0
    """Seconds (> 0) an online ``wandb.init`` may take (no network, a server that does not answer) before the run
    logs offline instead."""
    finish_timeout_s: float = 120.0
    """Seconds (> 0) the final upload may take; what is left stays on disk for ``wandb sync``."""

    def __post_init__(self) -> None:
        """W&B's own rules on names (``wandb.sdk.wandb_settings``: ``validate_project``, ``validate_run_tags``) are
        checked here, before the run starts: W&B refuses them only inside ``wandb.init``, after its retries.

        Raises:
            ValueError: a value of the wrong type or choice, a timeout <= 0; a project name that is empty, longer
                than 128 characters or holds one of ``/ \\ # ? % :``; a tag empty or longer than 64 characters;
                an empty entity, group or name."""
        check_types(self)
        check_ranges(self, {"init_timeout_s": POSITIVE, "finish_timeout_s": POSITIVE})
        bad = sorted(set(_WANDB_PROJECT_FORBIDDEN) & set(self.project))
        if not self.project.strip() or len(self.project) > 128 or bad:
            why = (f"got {self.project!r}, which holds {' '.join(bad)}" if bad else
                   f"got {len(self.project)} characters" if self.project.strip() else "got an empty name")
            raise ValueError(f"project: W&B project names have 1 to 128 characters, none of "
                             f"{' '.join(_WANDB_PROJECT_FORBIDDEN)}; {why}")
        for i, tag in enumerate(self.tags):
            if not 1 <= len(str(tag)) <= 64:
                shown = str(tag) if len(str(tag)) <= 40 else str(tag)[:37] + "..."
                raise ValueError(f"tags[{i}]: W&B tags have 1 to 64 characters, got {len(str(tag))} "
                                 f"({shown!r})")
        for key in ("entity", "group", "name"):
            value = getattr(self, key)
            if value is not None and not value.strip():
                raise ValueError(f"{key}: expected a non-empty name or null (W&B's default), got {value!r}")


@dataclass
class LogConfig:
    run_dir: str | None = None
    """Run directory (metrics.csv, checkpoint.pt, wandb/); default runs/<env>-<algo>-s<seed>-<time>. ``~`` and
    ``$VAR`` are expanded."""
    progress: bool = True
    """tqdm progress bar."""
    checkpoint: bool = True
    """Write checkpoint.pt atomically at each evaluation and at the end."""
    save_replay: bool = True
    """Save the replay beside each checkpoint, so that ``--resume`` continues exactly: a compressed base
    (``replay.npz``) and an append-only log of the episodes added since (``replay-<env steps>.log``); each
    checkpoint appends its new episodes, and the base is rewritten only once the log outgrows the replay's
    capacity. false: a resumed run starts with an empty replay."""
    video_every: int = 0
    """Log an evaluation video to W&B every N evaluations (>= 0; 0 = never)."""
    wandb: WandbConfig = field(default_factory=WandbConfig)

    def __post_init__(self) -> None:
        """``~`` and ``$VAR`` in ``run_dir`` are expanded as a shell would.

        Raises:
            ValueError: a value of the wrong type, a negative ``video_every``, an empty ``run_dir``, or one with an
                unset ``$VAR``."""
        check_types(self)
        check_ranges(self, {"video_every": NON_NEGATIVE})
        if self.run_dir is not None and not self.run_dir.strip():
            raise ValueError("run_dir must be a directory path, got an empty value; leave log.run_dir out for the "
                             "default runs/<env>-<algo>-s<seed>-<time>")
        if self.run_dir is not None:  # as a shell would have: `log.run_dir=~/runs/x` is not a folder named "~"
            expanded = os.path.expandvars(os.path.expanduser(self.run_dir))
            if "$" in expanded:
                raise ValueError(f"run_dir: expected a directory path, got {self.run_dir!r}, whose $ names an unset "
                                 "environment variable")
            self.run_dir = expanded


@dataclass
class DistConfig:
    """Multi-process training under ``torchrun`` (ignored in a plain single-process run)."""

    mode: DistMode = "data_parallel"
    """data_parallel: every rank collects and learns, gradients all-reduced (``agents/distributed/data_parallel.py``).
    actor_learner: rank 0 learns, the other ranks only collect (Ape-X, ``agents/distributed/actor_learner.py``)."""
    backend: DistBackend = "auto"
    """Collective backend of data_parallel: auto (nccl with CUDA, else gloo) | gloo | nccl."""
    weight_sync_every: int = 50
    """actor_learner: the learner publishes actor weights + normalizers every this many updates (>= 1); actors
    fetch the newest version after each episode."""
    timeout_s: float = 300.0
    """Rendezvous / collective timeout in seconds (> 0; a rank that does not show up -> clear error)."""

    def __post_init__(self) -> None:
        """Raises:
            ValueError: a value of the wrong type or choice, out of range."""
        check_types(self)
        check_ranges(self, {"weight_sync_every": AT_LEAST_ONE, "timeout_s": POSITIVE})


#: ``her``'s argument names (``her.ParameterError.param``) -> the config key
_HER_KEYS = {"n_sampled_goal": "replay.n_sampled_goal",
             "other_desired_fraction": "replay.other_desired_fraction", "n_step": "replay.n_step",
             "gamma": "train.gamma", "alpha": "replay.alpha", "beta0": "replay.beta0", "eps": "replay.eps",
             "td_error_clip": "replay.td_error_clip"}


def check_replay(replay: ReplayConfig, gamma: float) -> None:
    """Run ``her``'s own checks of the replay values: build the relabeler (``MixedGoals``, which checks k and the
    desired-goal share for every strategy), the returns, a prioritized and an energy-based sampler
    from them, as ``train.build_replay`` does with the real storage.

    Raises:
        ValueError: ``her``'s message with the config key in front, e.g. ``replay.beta0 must be in [0, 1], got
            2.0`` or ``train.gamma must be in (0, 1], got 1.5``.
    """
    import her

    r = replay
    energy_keys = {**_HER_KEYS, "eps": "replay.energy_eps", "clip_energy": "replay.energy_clip",
                   "kinetic_weight": "replay.energy_kinetic_weight", "exponent": "replay.energy_exponent"}
    pieces = (
        (lambda: her.MixedGoals(r.n_sampled_goal, r.other_desired_fraction), _HER_KEYS),
        (lambda: her.make_returns(r.n_step, gamma), _HER_KEYS),
        (lambda: her.PrioritizedSampler(alpha=r.alpha, beta0=r.beta0, eps=r.eps,
                                        td_error_clip=r.td_error_clip, rank_based=r.rank_based), _HER_KEYS),
        (lambda: her.EnergySampler(dt=1.0, clip_energy=r.energy_clip, eps=r.energy_eps,
                                   kinetic_weight=r.energy_kinetic_weight, exponent=r.energy_exponent), energy_keys),
    )
    if r.energy and r.prioritized:
        raise ValueError("replay.energy: true needs replay.prioritized: false (one sampler draws the batch: "
                         "energy-based or TD-error prioritized), got both true")
    for build, keys in pieces:
        try:
            build()
        except her.ParameterError as exc:  # names her's argument: say the config key instead
            raise ValueError(f"{keys[exc.param]} {exc.detail}" if exc.param in keys else f"replay: {exc}") from None
        except ValueError as exc:
            raise ValueError(f"replay: {exc}") from None

def check_device_name(device: Any, name: str) -> None:
    """Refuse a device string other than ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.

    Raises:
        ValueError: one line naming ``name`` (e.g. ``device``, ``--device``).
    """
    require(str(device) in DEVICES or re.fullmatch(r"cuda:\d+", str(device)) is not None, name,
            "auto, cpu, cuda or cuda:N", device)


def check_device(device: str, name: str = "train.device") -> None:
    """Refuse a device (the option ``name``) that is not a device name or that this machine does not have.

    Raises:
        ValueError: as [`check_device_name`][her_agents.config.check_device_name]; ``cuda`` / ``cuda:N``
            without CUDA or without that GPU.
    """
    import torch

    check_device_name(device, name)
    device = str(device)
    if not device.startswith("cuda"):
        return
    if not torch.cuda.is_available():
        raise ValueError(f"{name} must be a device this machine has (auto or cpu: CUDA is not available), "
                         f"got {device!r}")
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        raise ValueError(f"{name} must be a GPU this machine has (cuda:0 to cuda:"
                         f"{torch.cuda.device_count() - 1}), got {device!r}")
