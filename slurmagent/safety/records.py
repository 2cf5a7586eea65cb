"""Typed records of the action gate: what an automated action is and what was decided."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from slurmagent.errors import SlurmAgentError, choices
from slurmagent.recovery.diagnose import Evidence

ACTION_KINDS = ("requeue", "resubmit", "exclude_node", "cancel", "drain_node", "delete_checkpoint")
VERDICTS = ("allow", "needs_approval", "deny")


@dataclass(frozen=True)
class Action:
    kind: str  # one of ACTION_KINDS
    target: str  # job id, array task id, node or path
    reason: str  # one sentence: why
    params: dict[str, Any] = field(default_factory=dict)  # e.g. the new resources of a resubmission
    evidence: list[Evidence] = field(default_factory=list)  # log lines with source and line number
    metrics_before: dict[str, Any] = field(default_factory=dict)  # state the decision was taken on
    # what the policy matches on: attempt, run_time_s, qos, source (e.g. health_check:CRITICAL), cause
    context: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in ACTION_KINDS:
            raise SlurmAgentError(f"unknown action kind {self.kind!r}; the gate knows {choices(ACTION_KINDS)}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Action:
        return cls(
            kind=str(raw["kind"]),
            target=str(raw["target"]),
            reason=str(raw.get("reason", "")),
            params=dict(raw.get("params") or {}),
            evidence=[Evidence(**e) for e in raw.get("evidence") or []],
            metrics_before=dict(raw.get("metrics_before") or {}),
            context=dict(raw.get("context") or {}),
        )


@dataclass(frozen=True)
class Decision:
    verdict: str  # "allow", "needs_approval", "deny" — or "held" while the kill switch is on
    rule: str  # which rule of the policy decided (or why the action was held)
    approvals: int = 0  # distinct approvers needed when verdict == "needs_approval"
