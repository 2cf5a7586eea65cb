"""The skill interface: one base class; every result is OK / WARNING / CRITICAL / UNKNOWN
with reasons and the raw findings. Exit codes follow Nagios: 0, 1, 2, 3.

A skill subclasses `BaseSkill` and implements `run(**inputs)`. Most built-in skills
subclass `TypedSkill`, whose inputs are a dataclass (`Input`): `run(**inputs)` builds it
(unknown or badly typed inputs → UNKNOWN naming the key) and calls `check(inp)`; the same
dataclass gives the command-line options of `slurmagent skill NAME`.
"""

from __future__ import annotations

import abc
import argparse
import dataclasses
import enum
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar


class Status(enum.IntEnum):
    OK = 0
    WARNING = 1
    CRITICAL = 2
    UNKNOWN = 3


def worst(statuses: typing.Iterable[Status]) -> Status:
    """Overall verdict of several findings: CRITICAL > WARNING > UNKNOWN > OK (an UNKNOWN
    part does not hide a real WARNING or CRITICAL elsewhere)."""
    rank = {Status.OK: 0, Status.UNKNOWN: 1, Status.WARNING: 2, Status.CRITICAL: 3}
    return max(statuses, key=lambda s: rank[s], default=Status.OK)


@dataclass(frozen=True)
class SkillResult:
    skill: str  # name of the skill that produced it
    status: Status  # overall verdict
    reasons: list[str] = field(default_factory=list)  # one sentence per finding that is not OK
    findings: dict[str, Any] = field(default_factory=dict)  # raw readings behind the verdict

    def to_json(self) -> dict[str, Any]:
        return {"skill": self.skill, "status": self.status.name, "reasons": self.reasons, "findings": self.findings}

    @property
    def exit_code(self) -> int:
        return int(self.status)


class BaseSkill(abc.ABC):
    name: ClassVar[str]
    description: ClassVar[str]

    @abc.abstractmethod
    def run(self, **inputs: Any) -> SkillResult:
        """Run the skill; never raises for a finding (that is a CRITICAL/UNKNOWN result)."""

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Command-line options of `slurmagent skill NAME`; none by default."""
        del parser

    @classmethod
    def inputs_from_args(cls, ns: argparse.Namespace) -> dict[str, Any]:
        return {k: v for k, v in vars(ns).items() if v is not None and v != []}

    def unknown(self, reason: str, **findings: Any) -> SkillResult:
        return SkillResult(self.name, Status.UNKNOWN, [reason], dict(findings))


InputT = TypeVar("InputT")


def _cli_type(annotation: Any) -> tuple[Any, bool]:
    """(argparse type, is_list) for a dataclass field annotation."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _cli_type(args[0]) if len(args) == 1 else (str, False)
    if origin is list:
        return _cli_type(typing.get_args(annotation)[0])[0], True
    if annotation in (int, float, str):
        return annotation, False
    if annotation is Path:
        return Path, False
    return str, False


class TypedSkill(BaseSkill, Generic[InputT]):
    """A skill whose inputs are the dataclass `Input`. Subclasses implement `check`."""

    Input: ClassVar[type[Any]]
    positional: ClassVar[tuple[str, ...]] = ()  # Input fields taken as positional CLI args

    @abc.abstractmethod
    def check(self, inp: InputT) -> SkillResult: ...

    def run(self, **inputs: Any) -> SkillResult:
        hints = typing.get_type_hints(self.Input)
        names = [f.name for f in dataclasses.fields(self.Input)]
        unknown = [k for k in inputs if k not in names]
        if unknown:
            return self.unknown(f"unknown input {unknown[0]!r}; valid inputs: {', '.join(sorted(names)) or '(none)'}")
        for key, value in list(inputs.items()):
            if hints[key] in (Path, Path | None) and isinstance(value, str):
                inputs[key] = Path(value)
        try:
            inp = self.Input(**inputs)
        except (TypeError, ValueError) as exc:
            return self.unknown(f"bad input: {exc}")
        return self.check(inp)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        hints = typing.get_type_hints(cls.Input)
        for f in dataclasses.fields(cls.Input):
            kind, is_list = _cli_type(hints[f.name])
            help_text = str(f.metadata.get("help", ""))
            if f.name in cls.positional:
                parser.add_argument(f.name, type=kind, nargs="*" if is_list else "?", default=None, help=help_text)
            elif hints[f.name] is bool:
                parser.add_argument(
                    f"--{f.name.replace('_', '-')}", dest=f.name, action=argparse.BooleanOptionalAction, help=help_text
                )
            else:
                parser.add_argument(
                    f"--{f.name.replace('_', '-')}",
                    dest=f.name,
                    type=kind,
                    nargs="+" if is_list else None,
                    default=None,
                    help=help_text,
                )
