"""The action gate as a running job uses it: requeueing itself after a stop, or moving
off a node its health check found broken. Same gate, policy, kill switch and audit log
as the sweep's supervisor (the sweep directory's `audit.jsonl`)."""

from __future__ import annotations

from typing import Any

from slurmagent.gate import Action, AuditLog, Gate, Outcome
from slurmagent.recovery.diagnose import Evidence
from slurmagent.runtime.context import JobContext
from slurmagent.safety.executors import standalone_executors


def job_gate(ctx: JobContext) -> Gate:
    sweep = ctx.sweep_dir or ctx.output_dir
    return Gate(AuditLog(sweep / "audit.jsonl"), standalone_executors(sweep), job=ctx.slurm_requeue_id or "")


def request_requeue(
    ctx: JobContext,
    reason: str,
    metrics: dict[str, Any],
    source: str = "runtime",
    cause: str = "",
    evidence: list[Evidence] | None = None,
) -> Outcome:
    assert ctx.slurm_requeue_id is not None
    action = Action(
        "requeue",
        ctx.slurm_requeue_id,
        reason,
        evidence=list(evidence or []),
        metrics_before=metrics,
        context={"attempt": ctx.attempt, "source": source, "cause": cause},
    )
    return job_gate(ctx).request(action)


def request_exclude(
    ctx: JobContext, exclude: str, reason: str, source: str, evidence: list[Evidence] | None = None
) -> Outcome:
    assert ctx.slurm_requeue_id is not None
    action = Action(
        "exclude_node",
        ctx.slurm_requeue_id,
        reason,
        params={"exclude": exclude, "node": ctx.node},
        evidence=list(evidence or []),
        context={"attempt": ctx.attempt, "source": source},
    )
    return job_gate(ctx).request(action)
