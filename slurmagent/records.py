"""Neutral records shared by every layer: the evidence behind a decision, the automated
actions the gate may run and its decisions. Closed sets are `Literal` types, checked when a
record is built from outside data."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

from slurmagent.errors import SlurmAgentError, choices

__all__ = [
    "ACTION_KINDS",
    "APPROVAL_STATES",
    "VERDICTS",
    "Action",
    "ActionKind",
    "ApprovalState",
    "Decision",
    "DecisionVerdict",
    "Evidence",
    "Verdict",
]

# the last two are the step loop's own (runtime/adapt.py): changes within the run, asked from inside it
ActionKind = Literal[
    "requeue",
    "resubmit",
    "exclude_node",
    "cancel",
    "drain_node",
    "delete_checkpoint",
    "decay_lr",
    "restart_schedule",
    "priority_urgent",  # a sweep asks for resources.priority=urgent (it may preempt others' background work)
]
ACTION_KINDS: tuple[str, ...] = get_args(ActionKind)
# what a policy rule may decide
Verdict = Literal["allow", "needs_approval", "deny"]
VERDICTS: tuple[str, ...] = get_args(Verdict)
# where a request for approval stands
ApprovalState = Literal["pending", "approved", "rejected", "expired", "executed", "failed"]
APPROVAL_STATES: tuple[str, ...] = get_args(ApprovalState)
# what a decision may say: a policy verdict, the kill switch's hold, or an approval's state
DecisionVerdict = Verdict | Literal["held"] | ApprovalState


@dataclass(frozen=True)
class Evidence:
    source: str  # file the line came from (or "slurm" for accounting)
    line: int  # 1-based line number (0 for accounting)
    text: str  # the line itself


@dataclass(frozen=True)
class Action:
    kind: ActionKind  # what to do
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
            kind=raw["kind"],
            target=str(raw["target"]),
            reason=str(raw.get("reason", "")),
            params=dict(raw.get("params") or {}),
            evidence=[Evidence(**e) for e in raw.get("evidence") or []],
            metrics_before=dict(raw.get("metrics_before") or {}),
            context=dict(raw.get("context") or {}),
        )


@dataclass(frozen=True)
class Decision:
    verdict: DecisionVerdict  # a policy verdict, "held" while the kill switch is on, or an approval's state
    rule: str  # which rule of the policy decided (or why the action was held)
    approvals: int = 0  # distinct approvers needed when verdict == "needs_approval"
