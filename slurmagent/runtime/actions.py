"""The action gate as a running job uses it: requeueing itself after a stop, or moving
off a node its health check found broken. Same gate, policy, kill switch and audit log
as the sweep's supervisor (the sweep directory's `audit.jsonl`)."""

from __future__ import annotations

from typing import Any

from slurmagent.gate import Action, AuditLog, Gate
from slurmagent.records import ActionKind, Evidence
from slurmagent.runtime.context import JobContext
from slurmagent.safety.executors import standalone_executors


def job_gate(ctx: JobContext) -> Gate:
    sweep = ctx.sweep_dir or ctx.output_dir
    return Gate(AuditLog(sweep / "audit.jsonl"), standalone_executors(sweep), job=ctx.slurm_requeue_id or "")


def job_action(
    ctx: JobContext,
    kind: ActionKind,
    reason: str,
    source: str,
    *,
    params: dict[str, Any] | None = None,
    evidence: list[Evidence] | None = None,
    metrics: dict[str, Any] | None = None,
    cause: str = "",
) -> Action:
    """An action on this job (its array-aware id), with the context the policy matches on."""
    assert ctx.slurm_requeue_id is not None
    return Action(
        kind,
        ctx.slurm_requeue_id,
        reason,
        params=dict(params or {}),
        evidence=list(evidence or []),
        metrics_before=dict(metrics or {}),
        context={"attempt": ctx.attempt, "source": source, **({"cause": cause} if cause else {})},
    )
