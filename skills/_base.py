"""The skill interface: one base class; every result is OK / WARNING / CRITICAL / UNKNOWN
with reasons and the raw findings. Exit codes follow Nagios: 0, 1, 2, 3."""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar


class Status(enum.IntEnum):
    OK = 0
    WARNING = 1
    CRITICAL = 2
    UNKNOWN = 3


@dataclass(frozen=True)
class SkillResult:
    skill: str  # name of the skill that produced it
    status: Status  # overall verdict
    reasons: list[str] = field(default_factory=list)  # one sentence per finding that is not OK
    findings: dict[str, Any] = field(default_factory=dict)  # raw readings behind the verdict

    def to_json(self) -> dict[str, Any]:
        return {"skill": self.skill, "status": self.status.name, "reasons": self.reasons, "findings": self.findings}


class BaseSkill(abc.ABC):
    name: ClassVar[str]
    description: ClassVar[str]

    @abc.abstractmethod
    def run(self, **inputs: Any) -> SkillResult:
        """Run the skill; never raises for a finding (that is a CRITICAL/UNKNOWN result)."""
