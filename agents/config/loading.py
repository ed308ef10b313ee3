"""Building the run config from its layers: the defaults, the YAML files and ``key=value`` overrides merged
with OmegaConf into [`Config`][her_agents.config.Config] ([`load_config`][her_agents.config.load_config]), or a
saved run's config with overrides ([`resume_config`][her_agents.config.resume_config]). OmegaConf's errors, an
override that is not ``key=value`` and a value of the wrong type come out as one line naming the key.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Mapping
from dataclasses import field
from typing import Any, cast

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from ..fields import describe_type, did_you_mean
from .files import read_yaml, resolve_config_path
from .root import Config, config_dict

__all__ = ["RESUME_FROZEN", "load_config", "resume_config"]


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
            raise ValueError(f"unknown key {key or str(exc).splitlines()[0]!r}{did_you_mean(key, valid)}; valid "
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
        layers += read_yaml(resolve_config_path(path))
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


#: settings a resumed run cannot change: its networks, replay layout and env would no longer match the checkpoint,
#: or (``train.seed``) the checkpoint's random streams continue whatever the seed says
RESUME_FROZEN = ("env.id", "env.n_envs", "algo", "agent.hidden", "agent.layer_norm", "agent.n_critics",
                 "agent.n_quantiles", "replay.capacity", "replay.prioritized", "replay.rank_based", "train.seed")

_FROZEN_BECAUSE = {
    "train.seed": "the run's random streams (envs, replay, exploration, torch) continue from its checkpoint; start "
                  "a new run for another seed",
    "env.rare_state_cell": "the run's archive of rare states is binned by it; start a new run for another cell",
}


def resume_config(saved: dict[str, Any], overrides: list[str] | None = None) -> Config:
    """The config of a resumed run: its saved config (``checkpoint["config"]``) <- ``key=value`` overrides,
    checked and typed as in [`load_config`][her_agents.config.load_config]. A saved ``agent`` section may be
    partial (run directories of
    earlier versions): the missing fields get the algorithm's defaults.

    Overrides may change e.g. ``train.total_env_steps``, ``train.eval_every``, ``train.eval_episodes``,
    ``env.eval_envs``, ``log.*`` and the agent's learning rates and weight decay (the resumed agent keeps its
    config's: the agent's ``load_state_dict`` loads learned state, not settings); the keys in
    ``RESUME_FROZEN``, ``log.run_dir`` and, for a run with rare-state starts, ``env.rare_state_cell`` cannot
    change.

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
    frozen = [*RESUME_FROZEN, *(["env.rare_state_cell"] if _select(old, "env.rare_state_start") else [])]
    agent_keys = [k for k in frozen if k.startswith("agent.")]
    # before algo re-types agent
    _check_frozen(old, cast(dict, OmegaConf.to_container(merged)), [k for k in frozen if k not in agent_keys])
    cfg = _checked(merged)
    _check_frozen(old, config_dict(cfg), agent_keys)
    return cfg


def _check_frozen(old: dict[str, Any], new: dict[str, Any], keys: list[str]) -> None:
    """Raises ValueError for the first dotted key of ``keys`` whose value differs between the two configs."""
    for key in keys:
        before, after = _plain(_select(old, key)), _plain(_select(new, key))
        if before != after:
            because = _FROZEN_BECAUSE.get(key, "it shapes the saved networks, replay or sampler state; start a new "
                                               "run for that")
            raise ValueError(f"{key} cannot change on --resume: the run has {before!r}, got {after!r} ({because})")


def _select(values: Mapping[str, Any], key: str) -> Any:
    """The value of a dotted key in nested mappings (None where a part is missing)."""
    value: Any = values
    for part in key.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, (list, tuple)) else value
