"""Run configuration: typed dataclasses (the documented defaults), YAML files in ``configs/`` and ``key=value``
overrides, merged with OmegaConf. Unknown keys are refused with the list of valid ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

__all__ = ["Config", "config_dir", "load_config", "resolve_config_path"]


@dataclass
class EnvConfig:
    id: str = "FetchPush-v4"
    """gymnasium env id: FetchReach/Push/Slide/PickAndPlace-v4 or any registered goal env."""
    n_envs: int = 1
    """Parallel training envs (gymnasium vector env); each env step counts n_envs env steps."""
    vectorization: str = "sync"
    """"sync" (one process) or "async" (a subprocess per env)."""
    eval_envs: int = 10
    """Parallel envs used for evaluation episodes."""


@dataclass
class ReplayConfig:
    capacity: int = 1_000_000
    """Transitions kept (whole episodes are dropped, oldest first)."""
    strategy: str = "future"
    """HER relabel strategy: future | final | episode."""
    n_sampled_goal: int = 4
    """k: relabel probability k/(k+1). 0 disables HER."""
    n_step: int = 1
    """n-step returns (1 = one-step TD)."""
    stop_at_success: bool = False
    """End the n-step window where the (relabeled) goal is first achieved (Yang et al. 2021)."""
    prioritized: bool = False
    """Proportional prioritized replay (Schaul et al. 2016)."""
    alpha: float = 0.6
    """Prioritization exponent."""
    beta0: float = 0.4
    """Initial importance-sampling exponent, annealed linearly to 1 over the run's updates."""
    eps: float = 1e-6
    """Added to |TD error| so no priority is 0."""
    td_error_clip: float | None = None
    """Upper clip of |TD error| before the priority (None = no clip)."""
    rank_based: bool = False
    """Rank-based instead of proportional prioritization."""


@dataclass
class TrainConfig:
    total_env_steps: int = 200_000
    """Env steps to train for (summed over envs)."""
    warmup_steps: int = 1_000
    """Initial env steps with uniform random actions."""
    learning_starts: int = 1_000
    """Env steps before the first update (there must also be one complete episode stored)."""
    updates_per_step: float = 0.4
    """Gradient updates per env step (baselines HER: 40 updates per 100 steps)."""
    update_every: int = 1
    """Do the updates in blocks every this many env steps (50 = once per Fetch episode, baselines' cycles)."""
    batch_size: int = 256
    """Transitions per update."""
    gamma: float = 0.98
    """Discount factor (baselines: 1 - 1/T for T = 50)."""
    eval_every: int = 20_000
    """Evaluate every this many env steps (and at the end)."""
    eval_episodes: int = 50
    """Deterministic evaluation episodes per evaluation."""
    seed: int = 0
    """Seeds envs, numpy, torch and the replay; a CPU run is reproducible."""
    device: str = "auto"
    """auto | cpu | cuda."""
    torch_threads: int = 1
    """torch intra-op threads (1 is fastest on a shared 2-core box)."""
    normalizer_relabeled: bool = True
    """Feed the normalizer HER-relabeled samples of each new episode (baselines), else raw stored goals."""


@dataclass
class WandbConfig:
    mode: str = "auto"
    """auto | online | offline | disabled. auto: WANDB_MODE if set, online with an API key, else offline."""
    project: str = "her-robotics"
    entity: str | None = None
    tags: list[str] = field(default_factory=list)
    group: str | None = None
    name: str | None = None


@dataclass
class LogConfig:
    run_dir: str | None = None
    """Run directory (metrics.csv, checkpoint.pt, wandb/); default runs/<env>-<algo>-s<seed>-<time>."""
    progress: bool = True
    """tqdm progress bar."""
    checkpoint: bool = True
    """Write checkpoint.pt atomically at each evaluation and at the end."""
    save_replay: bool = False
    """Also save the replay storage (compressed .npz) beside each checkpoint, for exact resume."""
    video_every: int = 0
    """Log an evaluation video to W&B every N evaluations (0 = never)."""
    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass
class DistConfig:
    """Multi-process training under ``torchrun`` (ignored in a plain single-process run)."""

    mode: str = "data_parallel"
    """data_parallel: every rank collects and learns, gradients all-reduced (``agents/distributed.py``).
    actor_learner: rank 0 learns, the other ranks only collect (Ape-X, ``agents/actor_learner.py``)."""
    backend: str = "auto"
    """Collective backend of data_parallel: auto (nccl with CUDA, else gloo) | gloo | nccl."""
    weight_sync_every: int = 50
    """actor_learner: the learner publishes actor weights + normalizers every this many updates; actors fetch
    the newest version after each episode."""
    timeout_s: float = 300.0
    """Rendezvous / collective timeout in seconds (a rank that does not show up -> clear error)."""


@dataclass
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    algo: str = "ddpg"
    """ddpg | td3 | sac."""
    agent: dict[str, Any] = field(default_factory=dict)
    """Algorithm settings passed to the agent (see the agent's config dataclass); unknown keys are refused."""
    log: LogConfig = field(default_factory=LogConfig)
    dist: DistConfig = field(default_factory=DistConfig)


def config_dir() -> Path:
    """The directory holding the YAML configs shipped with the package."""
    return Path(__file__).resolve().parent.parent / "configs"


def resolve_config_path(name: str) -> Path:
    """A YAML path, or a config name in ``configs/`` (``fetch_reach_ddpg`` or ``fetch_reach_ddpg.yaml``).

    Raises:
        FileNotFoundError: neither exists (lists the shipped configs).
    """
    p = Path(name)
    if p.is_file():
        return p
    for cand in (config_dir() / name, config_dir() / f"{name}.yaml"):
        if cand.is_file():
            return cand
    shipped = sorted(q.stem for q in config_dir().glob("*.yaml"))
    raise FileNotFoundError(f"config {name!r} is neither a file nor one of the shipped configs: {shipped}")


def _valid_keys(node: Any, prefix: str = "") -> list[str]:
    keys = []
    for k, v in node.items():
        if isinstance(v, DictConfig) and k != "agent":
            keys += _valid_keys(v, f"{prefix}{k}.")
        else:
            keys.append(f"{prefix}{k}")
    return keys


def load_config(path: str | None = None, overrides: list[str] | None = None) -> DictConfig:
    """Defaults <- YAML file (``defaults:`` entries first) <- ``key=value`` overrides.

    Raises:
        ValueError: an unknown key or a value of the wrong type (message lists the valid keys).
    """
    base = OmegaConf.structured(Config)
    layers = []
    if path is not None:
        layers += _read_yaml(resolve_config_path(path))
    for o in overrides or []:
        if "=" not in o:
            raise ValueError(f"override {o!r} is not of the form key=value (e.g. train.total_env_steps=5000)")
    if overrides:
        layers.append(OmegaConf.from_dotlist(overrides))
    try:
        cfg = OmegaConf.merge(base, *layers)
    except (ConfigKeyError, ValidationError) as exc:
        msg = str(exc).splitlines()[0]
        raise ValueError(f"bad config: {msg}. Valid keys: {', '.join(_valid_keys(base))}") from None
    _check_values(cfg)
    return cfg


def _read_yaml(path: Path) -> list[DictConfig]:
    cfg = OmegaConf.load(path)
    parents = cfg.pop("defaults", None) or []
    layers: list[DictConfig] = []
    for parent in parents:
        layers += _read_yaml(resolve_config_path(str(parent)) if not Path(str(parent)).is_absolute()
                             else Path(str(parent)))
    return layers + [cfg]


def _check_values(cfg: DictConfig) -> None:
    from agents.registry import AGENTS
    from her import STRATEGIES

    k = cfg.replay.n_sampled_goal
    checks = [
        (cfg.algo in AGENTS, f"algo must be one of {sorted(AGENTS)}", cfg.algo),
        (cfg.replay.strategy in STRATEGIES, f"replay.strategy must be one of {STRATEGIES}", cfg.replay.strategy),
        (k >= 0, "replay.n_sampled_goal (k) must be an integer >= 0", k),
        (cfg.replay.n_step >= 1, "replay.n_step must be >= 1", cfg.replay.n_step),
        (cfg.replay.capacity >= 1, "replay.capacity must be >= 1", cfg.replay.capacity),
        (cfg.env.n_envs >= 1, "env.n_envs must be >= 1", cfg.env.n_envs),
        (cfg.env.vectorization in ("sync", "async"), "env.vectorization must be sync or async", cfg.env.vectorization),
        (cfg.train.total_env_steps >= 1, "train.total_env_steps must be >= 1", cfg.train.total_env_steps),
        (cfg.train.updates_per_step >= 0, "train.updates_per_step must be >= 0", cfg.train.updates_per_step),
        (cfg.train.update_every >= 1, "train.update_every must be >= 1", cfg.train.update_every),
        (1 <= cfg.train.batch_size <= cfg.replay.capacity, "train.batch_size must be in [1, replay.capacity]",
         cfg.train.batch_size),
        (cfg.replay.td_error_clip is None or cfg.replay.td_error_clip > 0, "replay.td_error_clip must be > 0 or null",
         cfg.replay.td_error_clip),
        (0 < cfg.train.gamma <= 1, "train.gamma must be in (0, 1]", cfg.train.gamma),
        (cfg.train.eval_every >= 1, "train.eval_every must be >= 1", cfg.train.eval_every),
        (cfg.train.eval_episodes >= 1, "train.eval_episodes must be >= 1", cfg.train.eval_episodes),
        (cfg.train.device in ("auto", "cpu", "cuda") or str(cfg.train.device).startswith("cuda:"),
         "train.device must be auto, cpu or cuda", cfg.train.device),
        (cfg.log.wandb.mode in ("auto", "online", "offline", "disabled"),
         "log.wandb.mode must be auto, online, offline or disabled", cfg.log.wandb.mode),
        (cfg.dist.mode in ("data_parallel", "actor_learner"), "dist.mode must be data_parallel or actor_learner",
         cfg.dist.mode),
        (cfg.dist.backend in ("auto", "gloo", "nccl"), "dist.backend must be auto, gloo or nccl", cfg.dist.backend),
        (cfg.dist.weight_sync_every >= 1, "dist.weight_sync_every must be >= 1", cfg.dist.weight_sync_every),
        (cfg.dist.timeout_s > 0, "dist.timeout_s must be > 0", cfg.dist.timeout_s),
    ]
    for ok, msg, got in checks:
        if not ok:
            raise ValueError(f"{msg}, got {got!r}")
