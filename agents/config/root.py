"""The root of the run config: [`Config`][her_agents.config.Config], its sections together with the
``agent`` section typed by ``algo`` ([`agent_section`][her_agents.config.agent_section]), and the resolved config
written out as plain data ([`config_dict`][her_agents.config.config_dict]) or YAML
([`config_yaml`][her_agents.config.config_yaml]).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from omegaconf import OmegaConf

from ..algos.configs import AgentConfig, algo_name, config_class
from ..fields import check_types, convert, did_you_mean, require
from .sections import DistConfig, EnvConfig, LogConfig, ReplayConfig, TrainConfig, check_replay

__all__ = ["DERIVED_WHEN_UNSET", "LOOP_OWNED", "Config", "agent_config", "agent_section", "config_dict",
           "config_yaml"]


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
            raise ValueError(f"unknown key 'agent.{key}' for algo {algo!r}{did_you_mean(key, valid, 'agent.')}; "
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
