"""Strict parsing of a config group into its dataclass: unknown keys (listing the valid ones), wrong
types and values refused with a message naming the key."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from slurmagent.errors import ConfigError, choices

T = TypeVar("T")


def _type_ok(value: Any, annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if origin is Literal:
        return value in typing.get_args(annotation)
    if origin is list:
        (inner,) = typing.get_args(annotation)
        return isinstance(value, list) and all(_type_ok(v, inner) for v in value)
    if origin is dict:
        k, v = typing.get_args(annotation)
        return isinstance(value, dict) and all(_type_ok(a, k) and _type_ok(b, v) for a, b in value.items())
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


def _type_name(annotation: Any) -> str:
    return str(annotation).replace("typing.", "").replace("<class '", "").replace("'>", "")


def unknown_key(group: str, key: str, valid: list[str]) -> ConfigError:
    """`unknown key resources.gpu; valid keys of resources: …; did you mean resources.gpus?`"""
    import difflib

    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    hint = f"; did you mean {group}.{close[0]}?" if close else ""
    return ConfigError(f"unknown key {group}.{key}; valid keys of {group}: {choices(valid)}{hint}")


def parse_conf(cls: type[T], data: Mapping[str, Any] | None, where: str) -> T:
    """Build dataclass `cls` from a plain mapping; `where` names the config group in errors."""
    data = dict(data or {})
    assert dataclasses.is_dataclass(cls)
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in data if k not in known]
    if unknown:
        raise unknown_key(where, unknown[0], known)
    for key, value in data.items():
        if isinstance(value, float) and hints[key] is int and value.is_integer():
            data[key] = int(value)
            value = data[key]
        if (
            isinstance(value, list)
            and _type_ok(["x"], hints[key])
            and all(isinstance(v, (str, int, float)) for v in value)
        ):
            # command lines: Hydra reads `--epochs,3` as an int; argv elements are strings
            data[key] = value = [str(v) for v in value]
        if not _type_ok(value, hints[key]):
            raise ConfigError(f"{where}.{key}={value!r} has the wrong type; expected {_type_name(hints[key])}")
        if any(isinstance(v, float) and not math.isfinite(v) for v in _numbers(value)):
            raise ConfigError(f"{where}.{key}={value!r} is not a finite number; nan and inf are refused")
    return cls(**data)


def _numbers(value: Any) -> list[Any]:
    """A value's numbers: itself, or a list's or a mapping's values (one level)."""
    if isinstance(value, Mapping):
        return list(value.values())
    return list(value) if isinstance(value, list) else [value]


def parse_part(cls: type[T], value: Any, where: str) -> T:
    """A nested group of a group (track.mlflow, notify.webhook), parsed as a group of its own;
    an already-built `cls` passes as it is."""
    if isinstance(value, cls):
        return value
    if value is not None and not isinstance(value, Mapping):
        keys = ", ".join(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
        raise ConfigError(f"{where}={value!r} has the wrong type; expected keys {keys}")
    return parse_conf(cls, value, where)
