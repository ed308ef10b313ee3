"""Run configuration: typed dataclasses (the documented defaults), YAML files in ``configs/`` and ``key=value``
overrides, merged with OmegaConf. Unknown keys are refused with the list of valid ones.

Who checks what, once:

- types and choices (``Literal`` fields): OmegaConf while merging the layers (naming the key and what the user
  wrote), then each section's ``__post_init__`` (``her_agents.fields.check_types``, which also covers a
  section built directly);
- ranges: each section's ``__post_init__``; the replay values (and ``train.gamma``) are the ``her`` library's, so
  [`check_replay`][her_agents.config.check_replay] builds its pieces from them and names the key in its error;
- the ``agent`` section: the algorithm's config dataclass (``DDPGConfig``, ``TD3Config``, ``SACConfig``), picked
  by ``algo`` after all layers are merged ([`agent_section`][her_agents.config.agent_section]), so an
  ``algo=`` override re-types the section.

[`load_config`][her_agents.config.load_config] and [`resume_config`][her_agents.config.resume_config] build
the merged values into [`Config`][her_agents.config.Config] (which runs those
checks) and return it, typed: every section a dataclass, ``agent`` the algorithm's config dataclass. OmegaConf
is used only to parse and merge the YAML layers and overrides, and to write the resolved config out
([`config_dict`][her_agents.config.config_dict] for checkpoints and W&B,
[`config_yaml`][her_agents.config.config_yaml] for ``--print-config`` and ``config.yaml``).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import io
import os
import re
import sys
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from .algos.configs import AgentConfig, algo_name, config_class
from .fields import (
    AT_LEAST_ONE,
    NON_NEGATIVE,
    POSITIVE,
    UNIT_INTERVAL,
    check_ranges,
    check_types,
    convert,
    describe_type,
    require,
)

if TYPE_CHECKING:
    if sys.version_info >= (3, 11):
        from importlib.resources.abc import Traversable
    else:  # its home before 3.11
        from importlib.abc import Traversable

__all__ = ["DERIVED_WHEN_UNSET", "LOOP_OWNED", "RESUME_FROZEN", "Config", "DistConfig", "EnvConfig", "LogConfig",
           "ReplayConfig", "TrainConfig", "WandbConfig", "agent_config", "agent_section", "check_device", "check_replay",
           "config_dict", "config_dir", "config_yaml", "load_config", "resolve_config_path", "resume_config",
           "torch_thread_count", "usable_cores"]

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
    torchrun, shared among the node's ranks), so that one run owns the machine; an integer >= 1 limits it: 1 to
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
    resume continues it exactly), and one process per training env. Ignored in the actor-learner mode (its learner steps no envs)."""

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


@dataclass
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    algo: str = "ddpg"
    """ddpg | td3 | sac | tqc (the registered algorithms, ``her_agents.algos.registry.AGENTS``;
    case-insensitive)."""
    # a mapping until __post_init__ types it: the empty one is the algorithm's defaults
    agent: AgentConfig = field(default_factory=lambda: cast(AgentConfig, {}))
    """The algorithm's settings, typed by its config dataclass (``DDPGConfig``, ``TD3Config``, ``SACConfig``,
    ``TQCConfig``): given keys are checked and converted, missing ones get the dataclass's defaults, except
    ``LOOP_OWNED`` (refused) and ``q_clip`` and ``noise_horizon``, which stay absent unless set (the loop then
    derives them: ``q_clip`` from the env's reward range and ``train.gamma``, ``noise_horizon`` from the env's
    episode length)."""
    log: LogConfig = field(default_factory=LogConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    agent_unset: frozenset[str] = field(default=frozenset(), repr=False, metadata={"key": False})
    """Not a key: the ``DERIVED_WHEN_UNSET`` fields of ``agent`` that no layer set, which the loop derives
    (their value in ``agent`` is the dataclass default meanwhile) and which
    [`config_dict`][her_agents.config.config_dict] leaves out.
    Computed when ``agent`` is given as a mapping (as [`load_config`][her_agents.config.load_config] does);
    kept as given with a typed
    ``agent``."""

    def __post_init__(self) -> None:
        """Types the ``agent`` section for ``algo`` when it is a mapping
        ([`agent_section`][her_agents.config.agent_section]), runs ``her``'s
        checks of the replay values ([`check_replay`][her_agents.config.check_replay]) and the checks across
        sections.

        Raises:
            ValueError: one line naming the key: an unknown algo, an ``agent`` key the algorithm does not have
                or one it refuses, an ``agent`` of another algorithm's dataclass, a replay value ``her``
                refuses, ``train.batch_size`` above ``replay.capacity``.
        """

        self.algo = algo_name(convert(self.algo, str, "algo"))
        if isinstance(self.agent, Mapping):
            self.agent_unset = frozenset(k for k in DERIVED_WHEN_UNSET if k not in self.agent)
            self.agent = agent_section(self.algo, self.agent)
        expected = config_class(self.algo)
        require(type(self.agent) is expected, "agent", f"a mapping or a {expected.__name__} (algo {self.algo!r})",
                self.agent)
        check_types(self)
        check_replay(self.replay, self.train.gamma)
        require(self.train.batch_size <= self.replay.capacity, "train.batch_size",
                f"in [1, replay.capacity] = [1, {self.replay.capacity}]", self.train.batch_size)
        require(not self.env.behaviour_goals or self.dist.mode != "actor_learner", "env.behaviour_goals",
                "0 with dist.mode=actor_learner (its actors keep the env's goals)", self.env.behaviour_goals)
        require(self.agent.target_update_interval >= 1, "agent.target_update_interval",
                ">= 1 in her-train (0 leaves the target updates to a loop of your own; this one never makes them)",
                self.agent.target_update_interval)


def usable_cores() -> int:
    """The number of CPU cores this process may run on: ``len(os.sched_getaffinity(0))`` (a CPU set given by
    ``taskset``, a container or a scheduler counts), else ``os.cpu_count()`` where the platform has no affinity
    (macOS, Windows)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def torch_thread_count(value: int | str | None) -> int:
    """The torch threads of a ``train.torch_threads`` value (``auto``, an int >= 1; None, a config older
    than the key: 1): ``auto`` is ``usable_cores()``, divided among the ranks a torchrun started on this node
    (``LOCAL_WORLD_SIZE``), at least 1."""
    if value is None:
        return 1
    if value == "auto":
        try:
            ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        except ValueError:
            ranks = 1
        return max(1, usable_cores() // ranks)
    return max(1, int(value))


#: agent fields the training loop sets, refused in the ``agent`` section: {field: the key to use instead}
LOOP_OWNED = {"seed": "train.seed", "device": "train.device", "n_threads": "train.torch_threads"}

#: agent fields the loop derives when the section leaves them out (``q_clip``: from the env's reward range;
#: ``noise_horizon``: the env's episode length)
DERIVED_WHEN_UNSET = ("q_clip", "noise_horizon")


def agent_section(algo: str, values: Mapping[str, Any]) -> AgentConfig:
    """The ``agent`` section typed by ``algo``'s config dataclass: ``values`` checked and converted (lists of
    sizes become tuples of ints, ints become floats where a float is expected), every other field with its
    default (``LOOP_OWNED`` and unset ``DERIVED_WHEN_UNSET`` ones too: the loop sets those).

    Args:
        algo: a registered algorithm name.
        values: the section as merged from the defaults, YAML layers and overrides.

    Raises:
        ValueError: one line naming ``agent.<key>``: a key of the loop (with the key to use), a key ``algo``
            does not have (with the valid ones), a value of the wrong type, not among the choices or out of
            range (the dataclass's own checks).
    """

    config_cls = config_class(algo)
    names = [f.name for f in dataclasses.fields(config_cls)]
    for key in values:
        if key in LOOP_OWNED:
            raise ValueError(f"agent.{key} is set by the training loop: use {LOOP_OWNED[key]}")
        if key not in names:
            valid = sorted(k for k in names if k not in LOOP_OWNED)
            raise ValueError(f"unknown key 'agent.{key}' for algo {algo!r}{_did_you_mean(key, valid, 'agent.')}; "
                             f"valid agent keys: {', '.join(valid)}")
    try:
        return config_cls(**values)
    except ValueError as exc:
        raise ValueError(f"agent.{exc}") from None


def agent_config(cfg: Config, **fields: Any) -> AgentConfig:
    """``cfg.agent`` (its algorithm's dataclass, e.g. ``DDPGConfig``) with ``fields`` replaced.

    Args:
        cfg: from [`load_config`][her_agents.config.load_config] or
            [`resume_config`][her_agents.config.resume_config].
        fields: values the loop sets, e.g. ``seed=cfg.train.seed``, ``q_clip=...``; they win over the section.

    Raises:
        ValueError: a field the dataclass refuses.
    """
    return dataclasses.replace(cfg.agent, **fields)


def config_dict(cfg: Config) -> dict[str, Any]:
    """The resolved config as plain data, key for key what the YAML layers and overrides can set: the
    ``agent`` section without ``LOOP_OWNED`` and the unset ``DERIVED_WHEN_UNSET`` fields. What a
    checkpoint's ``config`` and the W&B run's config hold, and what
    [`resume_config`][her_agents.config.resume_config] reads back."""
    drop = set(LOOP_OWNED) | cfg.agent_unset
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        if f.name == "agent":
            out["agent"] = {k: v for k, v in dataclasses.asdict(cfg.agent).items() if k not in drop}
        elif f.metadata.get("key", True):
            value = getattr(cfg, f.name)
            is_section = dataclasses.is_dataclass(value) and not isinstance(value, type)
            out[f.name] = dataclasses.asdict(value) if is_section else value
    return out


def config_yaml(cfg: Config) -> str:
    """[`config_dict`][her_agents.config.config_dict] as YAML: what ``--print-config`` prints and a run
    directory's ``config.yaml`` holds."""
    return OmegaConf.to_yaml(OmegaConf.create(config_dict(cfg)))


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


def config_dir() -> Traversable:
    """The YAML configs shipped with the package: the data of the ``configs`` package, read through
    ``importlib.resources`` (so they are found in a wheel install as in a source checkout)."""
    return importlib.resources.files("her_configs")


def resolve_config_path(name: str, beside: Path | Traversable | None = None) -> Path | Traversable:
    """A YAML path, or a config name in ``configs/`` (``fetch_reach_ddpg`` or ``fetch_reach_ddpg.yaml``). ``~`` and
    ``$VAR`` / ``${VAR}`` in a path are expanded as a shell would (a quoted argument or a YAML value reaches us
    unexpanded).

    Args:
        beside: the YAML file whose ``defaults:`` names ``name``: a relative path is looked up in that file's
            directory (not the current one), then among the shipped configs.

    Raises:
        FileNotFoundError: neither exists (lists the shipped configs, and what ``~`` / ``$VAR`` expanded to).
    """
    expanded = os.path.expandvars(os.path.expanduser(name))
    p = Path(expanded)
    if beside is None or p.is_absolute():
        if p.is_file():
            return p
    else:
        here = beside.parent if isinstance(beside, Path) else None
        for near in (here / expanded, here / f"{expanded}.yaml") if here is not None else ():
            if near.is_file():
                return near
    for cand in (config_dir() / name, config_dir() / f"{name}.yaml"):
        if cand.is_file():
            return cand
    shipped = sorted(q.name[:-5] for q in config_dir().iterdir() if q.name.endswith(".yaml"))
    what = f"config {name!r}" if beside is None else f"config {beside}: defaults entry {name!r}"
    where = ("a file" if beside is None or p.is_absolute() or not isinstance(beside, Path)
             else f"a file beside it ({beside.parent / expanded})")
    if expanded != name:
        where += f" (it expands to {expanded})"
    elif "$" in name:
        where += " (its $ names an unset environment variable)"
    raise FileNotFoundError(f"{what} is neither {where} nor one of the shipped configs: {shipped}")


def _valid_keys(node: Any, prefix: str = "") -> list[str]:
    keys = []
    for k, v in node.items():
        if isinstance(v, DictConfig) and k != "agent":
            keys += _valid_keys(v, f"{prefix}{k}.")
        else:
            keys.append(f"{prefix}{k}")
    return keys


@functools.cache
def _layout() -> type:
    """[`Config`][her_agents.config.Config]'s keys as OmegaConf merges the layers: the sections typed,
    ``agent`` an open mapping (its
    keys depend on ``algo``, known only once every layer is merged)."""
    hints = typing.get_type_hints(Config)

    def spec(f: dataclasses.Field) -> tuple[str, Any, Any]:
        if f.name == "agent":
            return "agent", dict[str, Any], field(default_factory=dict)
        default = (field(default_factory=f.default_factory) if f.default_factory is not dataclasses.MISSING
                   else field(default=f.default))
        return f.name, hints[f.name], default

    return dataclasses.make_dataclass("Config", [spec(f) for f in dataclasses.fields(Config)
                                                 if f.metadata.get("key", True)])


def _field_type(key: str) -> Any:
    """The annotated type of a dotted key of [`Config`][her_agents.config.Config] (None for unknown keys and
    ``agent.*``)."""
    cls: Any = _layout()
    hint: Any = None
    for part in key.split("."):
        if not dataclasses.is_dataclass(cls):
            return None
        hint = typing.get_type_hints(cls).get(part)
        if hint is None:
            return None
        cls = hint
    return hint


def _raw_override(key: str, overrides: list[str] | None, value: Any) -> str:
    """What the user wrote for ``key`` (the last ``key=...`` override), else ``repr(value)``."""
    for o in reversed(overrides or []):
        k, _, v = o.partition("=")
        if k.strip() == key:
            return repr(v)
    return repr(value)


def _got(key: str, overrides: list[str] | None, value: Any) -> str:
    """The "got ..." of an error: what the user wrote for ``key`` and the type it was read as."""
    raw = _raw_override(key, overrides, value)
    return "an empty value" if value is None and raw in ("''", "None") else f"{raw} ({type(value).__name__})"


def _check_sections(base: Any, layer: Any, overrides: list[str] | None, prefix: str = "") -> None:
    """Raises ValueError where ``layer`` gives a plain value for a section of ``base`` (``train=5``), which
    OmegaConf reports without naming the key, or anything but true/false for a bool key, which OmegaConf would
    convert."""
    if not OmegaConf.is_dict(layer):
        return
    for key in layer:
        if key not in base:
            continue
        full = f"{prefix}{key}"
        value = layer[key]
        if not OmegaConf.is_dict(base[key]):
            # OmegaConf reads any integer as a bool (2 -> true); a true/false key takes only true or false
            if _field_type(full) is bool and not isinstance(value, bool):
                raise ValueError(f"{full} must be true or false, got {_got(full, overrides, value)}")
            continue
        if OmegaConf.is_dict(value):
            _check_sections(base[key], value, overrides, full + ".")
        else:
            raise ValueError(f"{full} must be a mapping of {full}.* keys, got {_got(full, overrides, value)}")


def _did_you_mean(key: str, valid: list[str], prefix: str = "") -> str:
    """`` (did you mean X?)`` for the valid key closest to a misspelled one (its last part compared within its
    section, the whole key across sections), or ``""``."""
    import difflib

    section, _, leaf = key.rpartition(".")
    leaves = {v.rpartition(".")[2]: v for v in valid if v.rpartition(".")[0] == section}
    close = difflib.get_close_matches(leaf, list(leaves), n=1, cutoff=0.75) if leaf else []
    if close:
        return f" (did you mean {prefix}{leaves[close[0]]}?)"
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.85) if key else []
    if not close and not section:  # a misspelled section (trian.seed=1 is reported as 'trian')
        sections = sorted({v.partition(".")[0] for v in valid if "." in v})
        close = difflib.get_close_matches(key, sections, n=1, cutoff=0.75)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def _merge(base: DictConfig, layers: list[Any], overrides: list[str] | None) -> DictConfig:
    """``OmegaConf.merge`` with its errors as one line naming the key, what was expected and what came."""
    for layer in layers:
        _check_sections(base, layer, overrides)
    try:
        return cast(DictConfig, OmegaConf.merge(base, *layers))  # merged onto a DictConfig
    except (ConfigKeyError, ValidationError) as exc:
        key = getattr(exc, "full_key", None) or ""
        if isinstance(exc, ConfigKeyError) or _field_type(key) is None:
            valid = _valid_keys(base)
            raise ValueError(f"unknown key {key or str(exc).splitlines()[0]!r}{_did_you_mean(key, valid)}; valid "
                             f"keys: {', '.join(valid)}") from None
        value: Any = getattr(exc, "value", None)
        value = value._value() if hasattr(value, "_value") else value  # an OmegaConf node
        raise ValueError(f"{key} must be {describe_type(_field_type(key))}, got {_got(key, overrides, value)}"
                         ) from None


def load_config(path: str | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults <- YAML file (``defaults:`` entries first) <- ``key=value`` overrides, then built into
    [`Config`][her_agents.config.Config], whose sections check their values; the ``agent`` section is typed by
    the final ``algo``'s
    config dataclass (see [`Config.agent`][her_agents.config.Config.agent]).

    Raises:
        ValueError: one line naming the key, what was expected and what came: an unknown key (with the list
            of valid keys), a value of the wrong type, not among the choices or out of range, an override that
            is not ``key=value``, a YAML file that does not parse, is empty or is not a mapping.
        FileNotFoundError: ``path`` is neither a file nor a shipped config name.
    """
    base = OmegaConf.structured(_layout())
    layers = []
    if path is not None:
        layers += _read_yaml(resolve_config_path(path))
    _check_overrides(overrides)
    if overrides:
        layers.append(_dotlist(overrides))
    return _checked(_merge(base, layers, overrides))


def _checked(cfg: DictConfig) -> Config:
    """The merged layers built into [`Config`][her_agents.config.Config] (each section's ``__post_init__``
    checks its values,
    ``Config``'s types the ``agent`` section)."""
    return _build(Config, cast(dict, OmegaConf.to_container(cfg, resolve=True)))


def _build(cls: type, values: Mapping[str, Any], prefix: str = "") -> Any:
    """``cls(**values)`` with its dataclass fields built first; a section's ValueError gets the section's key
    in front (``env.``, ``log.wandb.``; the root's messages name their keys in full)."""
    hints = typing.get_type_hints(cls)
    # ``agent`` stays a mapping: Config types it by ``algo``
    kwargs = {k: _build(hints[k], v, f"{prefix}{k}.") if dataclasses.is_dataclass(hints[k]) and k != "agent"
              else v for k, v in values.items()}
    try:
        return cls(**kwargs)
    except ValueError as exc:
        raise ValueError(f"{prefix}{exc}") from None


def _check_literal(layer: DictConfig, where: str = "", prefix: str = "") -> None:
    """Refuse OmegaConf's special values in a layer: an interpolation (``${...}``, also a resolver such as
    ``${oc.env:HOME}``) or the missing-value marker ``???``; a config holds plain values (a run's ``config.yaml``
    and checkpoint must say what it ran with).

    Raises:
        ValueError: one line naming ``where`` (the file), the key and the value."""
    for key in cast(Iterable[str], layer):  # YAML keys (OmegaConf types them as any DictKeyType)
        full = f"{prefix}{key}"
        if OmegaConf.is_missing(layer, key):
            raise ValueError(f"{where}{full}: expected a value, got OmegaConf's missing-value marker '???'; set a "
                             f"value or leave the key out for its default")
        node: Any = layer._get_node(key)  # a DictConfig, a ListConfig or a value node
        if OmegaConf.is_interpolation(layer, key):
            raw = node._value()  # the text, unresolved
            raise ValueError(f"{where}{full}: expected a plain value, got the OmegaConf interpolation {raw!r} "
                             "(not supported in configs: write the value itself)")
        if OmegaConf.is_dict(node):
            _check_literal(node, where, f"{full}.")
        elif OmegaConf.is_list(node):
            for i in range(len(node)):
                if OmegaConf.is_interpolation(node, i) or OmegaConf.is_missing(node, i):
                    raise ValueError(f"{where}{full}[{i}]: expected a plain value, got {node._get_node(i)._value()!r}"
                                     " (OmegaConf interpolations and '???' are not supported in configs)")


def _check_overrides(overrides: list[str] | None) -> None:
    """Raises:
        ValueError: an override that is not ``key=value``, a key with an empty part (``a..b``, ``train.``,
            ``.seed``), an interpolation or ``???`` as the value."""
    for o in overrides or []:
        key, _, value = o.partition("=")
        if "=" not in o or not key.strip():
            raise ValueError(f"override {o!r} is not of the form key=value (e.g. train.total_env_steps=5000)")
        if any(not part.strip() for part in key.split(".")):
            raise ValueError(f"override {o!r}: the key {key!r} has an empty part between its dots; expected "
                             "section.key=value (e.g. train.total_env_steps=5000)")
        if "${" in value or value.strip() == "???":
            raise ValueError(f"{key.strip()}: expected a plain value, got {value.strip()!r} (OmegaConf interpolations "
                             "and '???' are not supported in overrides: write the value itself)")
        # `log.run_dir=` reads as null, the default: refuse it as `env.id=` is, not silently use another directory
        if key.strip() == "log.run_dir" and value.strip() in ("", "''", '""'):
            raise ValueError("log.run_dir must be a directory path, got an empty value; leave log.run_dir out "
                             "for the default runs/<env>-<algo>-s<seed>-<time>")


def _dotlist(overrides: list[str]) -> DictConfig:
    """``OmegaConf.from_dotlist`` with a value YAML cannot parse (``train.seed=[1,2``, ``env.id=:``) as one line
    naming the override, instead of YAML's multi-line error.

    Raises:
        ValueError: naming the override, YAML's reason and how to quote the value."""
    for o in overrides:
        try:
            OmegaConf.from_dotlist([o])
        except yaml.YAMLError as exc:
            reason = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            key, _, value = o.partition("=")
            raise ValueError(f"{key.strip()}: expected a YAML value, got {value!r}, which does not parse ({reason}); "
                             f"quote it for a string, e.g. {key.strip()}=\"'{value}'\"") from None
    return OmegaConf.from_dotlist(overrides)


#: settings a resumed run cannot change: its networks, replay layout and env would no longer match the checkpoint
RESUME_FROZEN = ("env.id", "env.n_envs", "algo", "agent.hidden", "agent.layer_norm", "agent.n_critics",
                 "replay.capacity", "replay.prioritized", "replay.rank_based")


def resume_config(saved: dict[str, Any], overrides: list[str] | None = None) -> Config:
    """The config of a resumed run: its saved config (``checkpoint["config"]``) <- ``key=value`` overrides,
    checked and typed as in [`load_config`][her_agents.config.load_config]. A saved ``agent`` section may be
    partial (run directories of
    earlier versions): the missing fields get the algorithm's defaults.

    Overrides may change e.g. ``train.total_env_steps``, ``train.eval_every``, ``train.eval_episodes``,
    ``env.eval_envs`` and ``log.*``; the keys in ``RESUME_FROZEN`` and ``log.run_dir`` cannot change.

    Raises:
        ValueError: as [`load_config`][her_agents.config.load_config]; an override of a frozen key to another
            value, or of
            ``log.run_dir``.
    """
    _check_overrides(overrides)
    for o in overrides or []:
        if o.partition("=")[0].strip() == "log.run_dir":
            raise ValueError("log.run_dir cannot be set with --resume: the run continues in its own directory "
                             "(the --resume argument)")
    base = OmegaConf.structured(_layout())
    # the saved config typed first: a partial agent section of an earlier version gets its defaults
    old = config_dict(_checked(_merge(base, [OmegaConf.create(saved)], None)))
    merged = _merge(base, [OmegaConf.create(old), _dotlist(list(overrides or []))], overrides)
    agent_keys = [k for k in RESUME_FROZEN if k.startswith("agent.")]
    # before algo re-types agent
    _check_frozen(old, cast(dict, OmegaConf.to_container(merged)), [k for k in RESUME_FROZEN if k not in agent_keys])
    cfg = _checked(merged)
    _check_frozen(old, config_dict(cfg), agent_keys)
    return cfg


def _check_frozen(old: dict[str, Any], new: dict[str, Any], keys: list[str]) -> None:
    """Raises ValueError for the first dotted key of ``keys`` whose value differs between the two configs."""
    for key in keys:
        before, after = _plain(_select(old, key)), _plain(_select(new, key))
        if before != after:
            raise ValueError(f"{key} cannot change on --resume: the run has {before!r}, got {after!r} (it shapes "
                             "the saved networks, replay or sampler state; start a new run for that)")


def _select(values: Mapping[str, Any], key: str) -> Any:
    """The value of a dotted key in nested mappings (None where a part is missing)."""
    value: Any = values
    for part in key.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, (list, tuple)) else value


def _read_yaml(path: Path | Traversable, chain: tuple[str, ...] = ()) -> list[DictConfig]:
    """The layers of one YAML config (its ``defaults:`` parents first: one config name or path, or a list of
    them).

    Raises:
        ValueError: the file does not parse, is empty or is not a mapping (one line, with the line number);
            ``defaults`` not a name or a list of names; a config that is its own parent (the chain named).
    """
    if str(path) in chain:
        raise ValueError(f"config {path}: defaults form a cycle: {' -> '.join([*chain, str(path)])}")
    chain = (*chain, str(path))
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"config {path}: expected a readable YAML file, got {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"config {path}: expected a YAML text file (UTF-8), got a binary file (byte "
                         f"0x{data[exc.start]:02x} at offset {exc.start})") from None
    if "\0" in text:
        raise ValueError(f"config {path}: expected a YAML text file, got a binary file (a NUL byte at offset "
                         f"{text.index(chr(0))})")
    try:
        cfg = OmegaConf.load(io.StringIO(text))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        tabs = "; YAML does not allow tabs for indentation" if "\t" in text else ""
        raise ValueError(f"config {path}: expected a YAML mapping of settings (key: value), got text that does "
                         f"not parse ({getattr(exc, 'problem', None) or type(exc).__name__}{where}{tabs})") from None
    except OSError as exc:  # OmegaConf: "Invalid loaded object type: int"
        raise ValueError(f"config {path}: expected a YAML mapping of settings (key: value), got "
                         f"{str(exc).rsplit(':', 1)[-1].strip() or 'something else'}") from None
    if not isinstance(cfg, DictConfig):
        raise ValueError(f"config {path}: expected a YAML mapping of settings (key: value), got a list")
    if len(cfg) == 1 and isinstance(yaml.safe_load(text), str):
        # OmegaConf reads a file of plain text (a CSV, a README) as the mapping {text: None}
        first = text.strip().splitlines()[0]
        first = first if len(first) <= 40 else first[:40] + "..."
        raise ValueError(f"config {path}: expected a YAML mapping of settings (key: value), got plain text "
                         f"({first!r})")
    if len(cfg) == 0:
        raise ValueError(f"config {path}: expected a YAML mapping of settings (key: value), got an empty file")
    _check_literal(cfg, f"config {path}: ")
    parents = cfg.pop("defaults", None)
    parents = [] if parents is None else [parents] if isinstance(parents, str) else parents
    if not isinstance(parents, (ListConfig, list)) or not all(
            isinstance(p, str) and p for p in parents):
        got = OmegaConf.to_container(parents) if isinstance(parents, DictConfig) else parents
        raise ValueError(f"config {path}: defaults must be a config name or a list of config names (e.g. "
                         f"defaults: [fetch_push_ddpg]), got {got!r}")
    layers: list[DictConfig] = []
    for parent in parents:
        layers += _read_yaml(resolve_config_path(parent, beside=path), chain)
    return layers + [cfg]


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
