"""The YAML config files: found by name among the shipped configs or by path
([`resolve_config_path`][her_agents.config.resolve_config_path]), and read into OmegaConf layers, their
``defaults:`` parents first, each refused in one line when it is not a mapping of plain values (``read_yaml``).
"""

from __future__ import annotations

import importlib.resources
import io
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

if TYPE_CHECKING:
    if sys.version_info >= (3, 11):
        from importlib.resources.abc import Traversable
    else:  # its home before 3.11
        from importlib.abc import Traversable

__all__ = ["config_dir", "read_yaml", "resolve_config_path"]


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


def read_yaml(path: Path | Traversable, chain: tuple[str, ...] = ()) -> list[DictConfig]:
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
        layers += read_yaml(resolve_config_path(parent, beside=path), chain)
    return layers + [cfg]
