"""Typed dataclass fields: check and convert a dataclass's values against its annotations, check ranges, and say
in words what a type expects (and which valid key a misspelled one meant). The config sections ([`her_agents.config`][]) and the agents' config dataclasses
([`her_agents.algos.base.AgentConfig`][] and its subclasses) call these from ``__post_init__``, so each
validates its
own values, with one-line errors that start with the field's name (a caller adds the section, e.g. ``agent.``).

No torch import here: the run config uses it before anything heavy is loaded.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal

__all__ = ["AT_LEAST_ONE", "Bound", "NON_NEGATIVE", "POSITIVE", "UNIT_INTERVAL", "Range", "check_ranges", "check_types",
           "convert", "describe_type", "did_you_mean", "require"]

Range = tuple[Callable[[Any], bool], str]
"""A range check: ``(test(value) -> bool, what is expected in words)``."""

POSITIVE: Range = (lambda v: v > 0, "> 0")
NON_NEGATIVE: Range = (lambda v: v >= 0, ">= 0")
AT_LEAST_ONE: Range = (lambda v: v >= 1, ">= 1")
UNIT_INTERVAL: Range = (lambda v: 0 <= v <= 1, "in [0, 1]")

Bound = typing.NewType("Bound", float)
"""A float field that may be infinite (a clip bound: ``-inf`` means none on that side); NaN is refused. Plain
``float`` fields must be finite."""

_FAIL = object()


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _shown(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def require(ok: bool, name: str, expected: str, value: Any) -> None:
    """Raises:
        ValueError: ``"{name} must be {expected}, got {value!r}"`` when not ``ok`` (a tuple shown as a list)."""
    if not ok:
        raise ValueError(f"{name} must be {expected}, got {_shown(value)!r}")


def check_ranges(obj: Any, ranges: Mapping[str, Range]) -> None:
    """Check fields of ``obj`` against ``{field name: (test, expected)}``.

    Raises:
        ValueError: the first field whose test fails, as ``require``.
    """
    for name, (test, expected) in ranges.items():
        value = getattr(obj, name)
        require(bool(test(value)), name, expected, value)


def check_types(obj: Any) -> None:
    """Convert every field of the dataclass instance ``obj`` to its annotated type, in place (see
    ``convert``).

    Raises:
        ValueError: ``"{field} must be {describe_type(hint)}, got {value!r} ({type})"`` for the first field whose
            value does not fit its annotation.
    """
    cls: type = type(obj)
    hints = _hints(cls)
    for f in dataclasses.fields(obj):
        setattr(obj, f.name, convert(getattr(obj, f.name), hints[f.name], f.name))


def convert(value: Any, hint: Any, name: str) -> Any:
    """``value`` as the type ``hint``: ``int`` (not a bool), ``float`` (finite; an int becomes a float), ``bool``, ``str``,
    ``Literal[...]`` (one of its values), ``X | None``, ``list[X]``, ``tuple[X, ...]`` and ``tuple[X, Y]`` (from a
    list or tuple, element by element), a dataclass (an instance of it), ``dict``/``Any`` (as is).

    Raises:
        ValueError: the value does not fit (one line naming ``name``, what was expected and what came).
    """
    out = _convert(value, hint)
    if out is _FAIL:
        raise ValueError(f"{name} must be {describe_type(hint)}, got {_shown(value)!r} ({type(value).__name__})")
    return out


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


_SCALARS: dict[Any, Any] = {
    bool: lambda v: v if isinstance(v, bool) else _FAIL,
    int: lambda v: int(v) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else _FAIL,
    Bound: lambda v: float(v) if _real(v) and not math.isnan(v) else _FAIL,
    # inf/nan in a config is a typo or an overflow, never a setting
    float: lambda v: float(v) if _real(v) and math.isfinite(v) else _FAIL,
    str: lambda v: v if isinstance(v, str) else _FAIL,
}


def _convert_union(value: Any, args: tuple[Any, ...]) -> Any:
    if value is None:
        return None if type(None) in args else _FAIL
    for a in args:
        if a is not type(None) and (out := _convert(value, a)) is not _FAIL:
            return out
    return _FAIL


def _convert_sequence(value: Any, origin: type, args: tuple[Any, ...]) -> Any:
    if not isinstance(value, (list, tuple)):
        return _FAIL
    if origin is tuple and Ellipsis not in args and args:  # a fixed-length tuple
        if len(args) != len(value):
            return _FAIL
        items = [_convert(v, a) for v, a in zip(value, args, strict=True)]
    else:
        items = [_convert(v, args[0]) if args else v for v in value]
    return _FAIL if any(i is _FAIL for i in items) else origin(items)


def _convert(value: Any, hint: Any) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin is Literal:
        return next((a for a in args if isinstance(value, type(a)) and value == a), _FAIL)
    if origin in (typing.Union, types.UnionType):
        return _convert_union(value, args)
    if origin in (list, tuple):
        return _convert_sequence(value, origin, args)
    if origin is dict or hint is dict:
        return value if isinstance(value, Mapping) else _FAIL
    if hint in _SCALARS:
        return _SCALARS[hint](value)
    if isinstance(hint, type):
        return value if isinstance(value, hint) else _FAIL
    return value


def describe_type(hint: Any) -> str:
    """In words: ``int`` -> "an integer", ``float | None`` -> "a finite number or null", ``tuple[int, ...]`` -> "a list
    of integers", ``tuple[float, float]`` -> "a list of 2 numbers", ``Literal["a", "b"]`` -> "one of ['a', 'b']"."""
    args = typing.get_args(hint)
    origin = typing.get_origin(hint)
    if origin is Literal:
        return f"one of {list(args)}"
    if type(None) in args:
        rest = [a for a in args if a is not type(None)]
        inner = rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]  # noqa: UP007
        return f"{describe_type(inner)} or null"
    if origin in (typing.Union, types.UnionType):  # e.g. int | Literal["auto"] -> "an integer or 'auto'"
        return " or ".join(", ".join(map(repr, typing.get_args(a))) if typing.get_origin(a) is Literal
                           else describe_type(a) for a in args)
    if origin in (list, tuple):
        inner = [a for a in args if a is not Ellipsis]
        of = describe_type(inner[0]) if inner else "values"
        n = f"{len(inner)} " if origin is tuple and Ellipsis not in args and len(inner) > 1 else ""
        plural = {"an integer": "integers", "a finite number": "finite numbers", "a number": "numbers", "a string": "strings", "true or false": "booleans"}
        return f"a list of {n}{plural.get(of, of)}"
    if origin is dict or hint is dict:
        return "a mapping"
    return {int: "an integer", float: "a finite number", Bound: "a number", bool: "true or false", str: "a string"}.get(hint, str(hint))


def did_you_mean(key: str, valid: list[str], prefix: str = "") -> str:
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
