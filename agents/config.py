"""Run configuration: typed dataclasses (the documented defaults), YAML files in ``configs/`` and ``key=value``
overrides, merged with OmegaConf. Unknown keys are refused with the list of valid ones.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import io
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

__all__ = ["RESUME_FROZEN", "Config", "check_device", "config_dir", "load_config", "resolve_config_path", "resume_config"]


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
    """HER relabel strategy: future | final | episode | mixed (future + other episodes' desired goals)."""
    n_sampled_goal: int = 4
    """k: relabel probability k/(k+1). 0 disables HER."""
    other_desired_fraction: float = 0.5
    """Strategy mixed: share of the relabeled goals drawn from stored desired goals (the rest are future goals)."""
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
    init_timeout_s: float = 20.0
    """Seconds an online ``wandb.init`` may take (no network, a server that does not answer) before the run
    logs offline instead."""
    finish_timeout_s: float = 120.0
    """Seconds the final upload may take; what is left stays on disk for ``wandb sync``."""


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


def config_dir() -> Traversable:
    """The YAML configs shipped with the package: the data of the ``configs`` package, read through
    ``importlib.resources`` (so they are found in a wheel install as in a source checkout)."""
    return importlib.resources.files("her_configs")


def resolve_config_path(name: str) -> Path | Traversable:
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
    shipped = sorted(q.name[:-5] for q in config_dir().iterdir() if q.name.endswith(".yaml"))
    raise FileNotFoundError(f"config {name!r} is neither a file nor one of the shipped configs: {shipped}")


def _valid_keys(node: Any, prefix: str = "") -> list[str]:
    keys = []
    for k, v in node.items():
        if isinstance(v, DictConfig) and k != "agent":
            keys += _valid_keys(v, f"{prefix}{k}.")
        else:
            keys.append(f"{prefix}{k}")
    return keys


def _field_type(key: str) -> Any:
    """The annotated type of a dotted key of :class:`Config` (None for unknown keys and ``agent.*``)."""
    cls: Any = Config
    hint: Any = None
    for part in key.split("."):
        if not dataclasses.is_dataclass(cls):
            return None
        hint = typing.get_type_hints(cls).get(part)
        if hint is None:
            return None
        cls = hint
    return hint


def _describe_type(hint: Any) -> str:
    """``int`` -> "an integer", ``float | None`` -> "a number or null", ``tuple[int, ...]`` -> "a list of
    integers", ..."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if type(None) in typing.get_args(hint):
        rest = args[0] if len(args) == 1 else typing.Union[tuple(args)]  # noqa: UP007
        return f"{_describe_type(rest)} or null"
    origin = typing.get_origin(hint)
    if origin in (list, tuple):
        inner = [a for a in typing.get_args(hint) if a is not Ellipsis]
        of = _describe_type(inner[0]) if inner else "values"
        n = f"{len(inner)} " if origin is tuple and Ellipsis not in typing.get_args(hint) and len(inner) > 1 else ""
        plural = {"an integer": "integers", "a number": "numbers", "a string": "strings", "true or false": "booleans"}
        return f"a list of {n}{plural.get(of, of)}"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(hint, str(hint))


def _raw_override(key: str, overrides: list[str] | None, value: Any) -> str:
    """What the user wrote for ``key`` (the last ``key=...`` override), else ``repr(value)``."""
    for o in reversed(overrides or []):
        k, _, v = o.partition("=")
        if k.strip() == key:
            return repr(v)
    return repr(value)


def _merge(base: DictConfig, layers: list[Any], overrides: list[str] | None) -> DictConfig:
    """``OmegaConf.merge`` with its errors as one line naming the key, what was expected and what came."""
    try:
        return OmegaConf.merge(base, *layers)
    except (ConfigKeyError, ValidationError) as exc:
        key = getattr(exc, "full_key", None) or ""
        if isinstance(exc, ConfigKeyError) or _field_type(key) is None:
            raise ValueError(f"unknown key {key or str(exc).splitlines()[0]!r}; valid keys: "
                             f"{', '.join(_valid_keys(base))}") from None
        value = getattr(exc, "value", None)
        value = value._value() if hasattr(value, "_value") else value  # an OmegaConf node
        got = _raw_override(key, overrides, value)
        raise ValueError(f"{key} must be {_describe_type(_field_type(key))}, got {got} "
                         f"({type(value).__name__})") from None


def load_config(path: str | None = None, overrides: list[str] | None = None) -> DictConfig:
    """Defaults <- YAML file (``defaults:`` entries first) <- ``key=value`` overrides.

    Raises:
        ValueError: one line naming the key, what was expected and what came: an unknown key (with the list
            of valid keys), a value of the wrong type or out of range, an override that is not ``key=value``, a
            YAML file that does not parse, is empty or is not a mapping.
        FileNotFoundError: ``path`` is neither a file nor a shipped config name.
    """
    base = OmegaConf.structured(Config)
    layers = []
    if path is not None:
        layers += _read_yaml(resolve_config_path(path))
    _check_overrides(overrides)
    if overrides:
        layers.append(OmegaConf.from_dotlist(overrides))
    cfg = _merge(base, layers, overrides)
    _check_values(cfg)
    return cfg


def _check_overrides(overrides: list[str] | None) -> None:
    for o in overrides or []:
        if "=" not in o or not o.partition("=")[0].strip():
            raise ValueError(f"override {o!r} is not of the form key=value (e.g. train.total_env_steps=5000)")


#: settings a resumed run cannot change: its networks, replay layout and env would no longer match the checkpoint
RESUME_FROZEN = ("env.id", "env.n_envs", "algo", "agent.hidden", "agent.layer_norm", "agent.n_critics",
                 "replay.capacity", "replay.prioritized", "replay.rank_based")


def resume_config(saved: dict[str, Any], overrides: list[str] | None = None) -> DictConfig:
    """The config of a resumed run: its saved config (``checkpoint["config"]``) <- ``key=value`` overrides.

    Overrides may change e.g. ``train.total_env_steps``, ``train.eval_every``, ``train.eval_episodes``,
    ``env.eval_envs`` and ``log.*``; the keys in :data:`RESUME_FROZEN` and ``log.run_dir`` cannot change.

    Raises:
        ValueError: as :func:`load_config`; an override of a frozen key to another value, or of
            ``log.run_dir``.
    """
    _check_overrides(overrides)
    for o in overrides or []:
        if o.partition("=")[0].strip() == "log.run_dir":
            raise ValueError("log.run_dir cannot be set with --resume: the run continues in its own directory "
                             "(the --resume argument)")
    base = OmegaConf.structured(Config)
    old = _merge(base, [OmegaConf.create(saved)], None)
    cfg = _merge(base, [old, OmegaConf.from_dotlist(list(overrides or []))], overrides)
    for key in RESUME_FROZEN:
        before, after = _frozen_value(old, key), _frozen_value(cfg, key)
        if before != after:
            raise ValueError(f"{key} cannot change on --resume: the run has {before!r}, got {after!r} (start a new "
                             "run for that; train.total_env_steps, train.eval_*, env.eval_envs and log.* may "
                             "change)")
    _check_values(cfg)
    return cfg


def _frozen_value(cfg: DictConfig, key: str) -> Any:
    if key.startswith("agent."):
        from her_agents.registry import AGENTS

        name = key.split(".", 1)[1]
        defaults = {f.name: f.default for f in dataclasses.fields(AGENTS[cfg.algo][1])
                    if f.default is not dataclasses.MISSING} if cfg.algo in AGENTS else {}
        value = cfg.agent[name] if name in cfg.agent else defaults.get(name)
        value = OmegaConf.to_object(value) if OmegaConf.is_config(value) else value
        return list(value) if isinstance(value, (list, tuple)) else value
    return OmegaConf.select(cfg, key)


def _read_yaml(path: Path | Traversable) -> list[DictConfig]:
    """The layers of one YAML config (its ``defaults:`` parents first).

    Raises:
        ValueError: the file does not parse, is empty or is not a mapping (one line, with the line number).
    """
    text = path.read_text()
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
    if len(cfg) == 0:
        raise ValueError(f"config {path}: expected a YAML mapping of settings (key: value), got an empty file")
    parents = cfg.pop("defaults", None) or []
    layers: list[DictConfig] = []
    for parent in parents:
        layers += _read_yaml(resolve_config_path(str(parent)) if not Path(str(parent)).is_absolute()
                             else Path(str(parent)))
    return layers + [cfg]


def check_device(device: str) -> None:
    """Refuse a ``train.device`` this machine does not have.

    Raises:
        ValueError: ``cuda`` / ``cuda:N`` without CUDA or without that GPU.
    """
    import torch

    device = str(device)
    if not device.startswith("cuda"):
        return
    if not torch.cuda.is_available():
        raise ValueError(f"train.device must be a device this machine has (auto or cpu: CUDA is not available), "
                         f"got {device!r}")
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        raise ValueError(f"train.device must be a GPU this machine has (cuda:0 to cuda:"
                         f"{torch.cuda.device_count() - 1}), got {device!r}")


def _check_values(cfg: DictConfig) -> None:
    from her_agents.registry import AGENTS
    from her import STRATEGIES

    k = cfg.replay.n_sampled_goal
    checks = [
        (cfg.algo in AGENTS, f"algo must be one of {sorted(AGENTS)}", cfg.algo),
        (cfg.replay.strategy in STRATEGIES, f"replay.strategy must be one of {STRATEGIES}", cfg.replay.strategy),
        (k >= 0, "replay.n_sampled_goal (k) must be an integer >= 0", k),
        (0 <= cfg.replay.other_desired_fraction <= 1, "replay.other_desired_fraction must be in [0, 1]",
         cfg.replay.other_desired_fraction),
        (cfg.replay.n_step >= 1, "replay.n_step must be >= 1", cfg.replay.n_step),
        (cfg.replay.capacity >= 1, "replay.capacity must be >= 1", cfg.replay.capacity),
        (cfg.env.n_envs >= 1, "env.n_envs must be >= 1", cfg.env.n_envs),
        (cfg.env.eval_envs >= 1, "env.eval_envs must be >= 1", cfg.env.eval_envs),
        (cfg.replay.alpha >= 0, "replay.alpha must be >= 0", cfg.replay.alpha),
        (0 <= cfg.replay.beta0 <= 1, "replay.beta0 must be in [0, 1]", cfg.replay.beta0),
        (cfg.replay.eps > 0, "replay.eps must be > 0", cfg.replay.eps),
        (cfg.train.warmup_steps >= 0, "train.warmup_steps must be >= 0", cfg.train.warmup_steps),
        (0 <= cfg.train.seed < 2**32 - 10_000, "train.seed must be in [0, 2**32 - 10000)", cfg.train.seed),
        (cfg.train.learning_starts >= 0, "train.learning_starts must be >= 0", cfg.train.learning_starts),
        (cfg.train.torch_threads >= 1, "train.torch_threads must be >= 1", cfg.train.torch_threads),
        (cfg.log.video_every >= 0, "log.video_every must be >= 0", cfg.log.video_every),
        (cfg.log.wandb.init_timeout_s > 0, "log.wandb.init_timeout_s must be > 0", cfg.log.wandb.init_timeout_s),
        (cfg.log.wandb.finish_timeout_s > 0, "log.wandb.finish_timeout_s must be > 0",
         cfg.log.wandb.finish_timeout_s),
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
    _check_agent(cfg)


#: ranges of agent options (those an algorithm has): (test, what is expected)
AGENT_RANGES: dict[str, tuple[Any, str]] = {
    "hidden": (lambda v: len(v) >= 1 and all(h >= 1 for h in v), "a non-empty list of positive integers "
               "(hidden layer sizes must be positive)"),
    "actor_lr": (lambda v: v > 0, "> 0"), "critic_lr": (lambda v: v > 0, "> 0"), "alpha_lr": (lambda v: v > 0, "> 0"),
    "polyak": (lambda v: 0 <= v <= 1, "in [0, 1]"), "random_eps": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "noise_std": (lambda v: v >= 0, ">= 0"), "action_l2": (lambda v: v >= 0, ">= 0"),
    "policy_noise": (lambda v: v >= 0, ">= 0"), "noise_clip": (lambda v: v >= 0, ">= 0"),
    "policy_delay": (lambda v: v >= 1, ">= 1"), "n_critics": (lambda v: v >= 1, ">= 1"),
    "target_update_interval": (lambda v: v >= 0, ">= 0"), "alpha": (lambda v: v > 0, "> 0"),
    "norm_eps": (lambda v: v > 0, "> 0"), "norm_clip_obs": (lambda v: v > 0, "> 0"),
    "norm_clip_range": (lambda v: v > 0, "> 0"),
    "q_clip": (lambda v: v is None or (len(v) == 2 and v[0] <= v[1]), "null or [low, high] with low <= high"),
}


def _type_ok(value: Any, hint: Any) -> bool:
    args = typing.get_args(hint)
    if type(None) in args:
        if value is None:
            return True
        rest = [a for a in args if a is not type(None)]
        return any(_type_ok(value, a) for a in rest)
    origin = typing.get_origin(hint)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False
        inner = [a for a in args if a is not Ellipsis]
        if origin is tuple and inner and Ellipsis not in args and len(inner) != len(value):
            return False
        return not inner or all(_type_ok(v, inner[0]) for v in value)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint in (bool, str):
        return isinstance(value, hint)
    return True


def _check_agent(cfg: DictConfig) -> None:
    """Names, types and ranges of ``agent.*`` against the algorithm's config dataclass. ``seed``, ``device`` and
    the torch threads are the loop's (``train.seed``, ``train.device``, ``train.torch_threads``)."""
    from her_agents.registry import AGENTS

    config_cls = AGENTS[cfg.algo][1]
    hints = typing.get_type_hints(config_cls)
    values = OmegaConf.to_container(cfg.agent, resolve=True)
    owned = {"seed": "train.seed", "device": "train.device", "n_threads": "train.torch_threads"}
    for key in values:
        if key in owned:
            raise ValueError(f"agent.{key} is set by the training loop: use {owned[key]}")
        if key not in hints:
            valid = sorted(k for k in hints if k not in owned)
            raise ValueError(f"unknown key 'agent.{key}' for algo {cfg.algo!r}; valid agent keys: "
                             f"{', '.join(valid)}")
    for key, value in values.items():
        if not _type_ok(value, hints[key]):
            raise ValueError(f"agent.{key} must be {_describe_type(hints[key])}, got {value!r} "
                             f"({type(value).__name__})")
        test, expected = AGENT_RANGES.get(key, (None, ""))
        if test is not None and not test(value):
            raise ValueError(f"agent.{key} must be {expected}, got {value!r}")
