"""The stop decision inside a job: after the step loop checkpointed and raised
`StopForRequeue`, decide what the stop means and act, through the action gate.

- `reason="signal"`: ask Slurm why (squeue: state, reason, time left; `classify_stop`,
  pure). Slurm ending the job (preemption requeues it itself) → nothing to do; the time
  limit near → requeue, at most `recovery.max_time_limit_requeues` times per Slurm job,
  then fail with a sentence the supervisor turns into a resubmission with more time; a
  signal with time to spare → requeue. A requeue that is not done (Slurm refuses it for a
  `--no-requeue` job, the policy or the kill switch holds it) ends the job with a sentence
  the diagnosis knows (`time_limit`, `requeue_failed`), so recovery resubmits it.
- Before any of that, at the time limit's warning, the step loop asks `FinishCheck` whether
  the rest of the run fits before the limit: then it finishes and nothing is requeued.
- `reason="health"`: the runtime health check found this node CRITICAL → requeue the job
  and exclude this node from its next run (`requeue_elsewhere`).

Only rank 0 acts; every rank stopped at the same step. This module is the one owner of a
job requeueing itself. It also holds the gate helpers a running job uses: `job_gate`,
`job_action`, and `LoopApprover`, the gate as the step loop's in-loop controller asks it.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from slurmagent.config import RecoveryConf
from slurmagent.errors import SlurmAgentError, TaskFailedError
from slurmagent.files import atomic_write
from slurmagent.primitives.backends import Backend
from slurmagent.primitives.signals import StopFlag, install_handlers, restore_handlers, signal_number
from slurmagent.records import ACTION_KINDS, Action, ActionKind, Evidence
from slurmagent.runtime.context import Approval, JobContext
from slurmagent.runtime.health import STOP_RECORD
from slurmagent.runtime.loop import StopForRequeue
from slurmagent.safety.audit import AuditLog
from slurmagent.safety.executors import standalone_executors
from slurmagent.safety.gate import Gate, Outcome
from slurmagent.safety.paths import SWEEP_AUDIT
from slurmagent.slurm.seam import SlurmCLI
from slurmagent.syntax import parse_time_limit

log = logging.getLogger(__name__)

TIME_LIMIT_FILE = ".slurmagent-time-limit-requeues.json"


class GraceWindow:
    """Seconds a job may still run after a stop signal: the user signal comes
    `recovery.signal_delay_s` before the time limit; after SIGTERM, Slurm kills at KillWait
    (asked from Slurm once, on the first SIGTERM, unless `recovery.kill_wait_s` is set)."""

    def __init__(self, recovery: RecoveryConf, backend: Backend, slurm: SlurmCLI | None = None) -> None:
        self.recovery = recovery
        self.backend = backend
        self._slurm = slurm
        self._kill_wait: float | None = recovery.kill_wait_s

    def __call__(self, signum: int) -> float | None:
        if signum == signal_number(self.recovery.signal):
            return float(self.recovery.signal_delay_s)
        if signum != signal.SIGTERM:
            return None
        if self._kill_wait is None and self.backend.queued:  # KillWait is the scheduler's
            try:
                self._kill_wait = (self._slurm or SlurmCLI(timeout=5)).kill_wait_s()
            except SlurmAgentError:
                self._kill_wait = 30.0  # Slurm's default
        return self._kill_wait


def classify_stop(signals: tuple[int, ...], state: str, time_left_s: int | None, signal_delay_s: int) -> str:
    """Why the job was told to stop, from Slurm's own view of it (pure):
    `ending` — Slurm is ending the job itself (SIGTERM, or no longer RUNNING: preemption
    requeues it, a time limit or cancel ends it); `time_limit` — the user signal came and
    the job's remaining time is within the signal's lead; `signal` — the user signal came
    with time to spare (preemption with a grace time, or a person's `scancel --signal`)."""
    if signal.SIGTERM in signals or (state and state != "RUNNING"):
        return "ending"
    # Slurm may send the signal up to a minute early (its timer resolution): allow slack
    if time_left_s is not None and time_left_s <= signal_delay_s + 60:
        return "time_limit"
    return "signal"


FINISH_PACE = 1.5  # the rest of a run is assumed this much slower than its pace so far
FINISH_MARGIN_S = 5.0  # and to end this long before the time limit


def finishes_before_limit(rest_s: float, time_left_s: float | None, after_s: float = 0.0) -> bool:
    """Pure: a run stopped by the time limit's warning whose rest (`rest_s`: its remaining
    steps at its pace so far and its last checkpoint) ends before the limit, with room for
    a slower pace and for what the job does after the loop (`after_s`: the trackers' last
    flush), finishes instead of requeueing; a requeue would put it back in the queue for a
    few seconds of work."""
    if time_left_s is None or rest_s < 0:
        return False
    return FINISH_PACE * rest_s + after_s + FINISH_MARGIN_S <= time_left_s


class FinishCheck:
    """What the step loop asks at a stop, before it stops for a requeue (`StopSignals.finish`):
    the reason the run may finish instead, or None. Only at the time limit's warning (Slurm's
    view, as `classify_stop` reads it: a preemption or a person's signal always stops), only
    when `recovery.finish_before_limit` and `finishes_before_limit` allow. If the run is slower
    than that, Slurm's SIGTERM at the limit stops it at the next step with a checkpoint, and
    recovery resubmits it with more time. Code of the task's own after the loop (a final
    evaluation, an export) is not counted: FINISH_MARGIN_S is all it gets."""

    ASK_TIMEOUT_S = 10.0  # squeue's answer must leave the warning's lead for the stop itself

    def __init__(self, ctx: JobContext, recovery: RecoveryConf, slurm: SlurmCLI | None = None) -> None:
        self.ctx, self.recovery = ctx, recovery
        self.slurm = slurm or SlurmCLI(timeout=self.ASK_TIMEOUT_S)
        self.after_s = 0.0  # what the job does after the loop may take (the trackers' flush)

    def __call__(self, signals: tuple[int, ...], rest_s: float) -> str | None:
        job = self.ctx.slurm_requeue_id
        if not self.recovery.finish_before_limit or not self.ctx.where.queued or job is None:
            return None
        asked = time.monotonic()
        try:
            seen = self.slurm.job_state(job)
        except SlurmAgentError:
            return None  # no answer: stop, as without this check
        if seen is None:
            return None
        left = parse_time_limit(seen.time_left)
        if classify_stop(signals, seen.state, left, self.recovery.signal_delay_s) != "time_limit":
            return None
        if left is None or not finishes_before_limit(rest_s, left - (time.monotonic() - asked), self.after_s):
            return None
        return (
            f"time limit near ({seen.time_left} left) and the rest of the run takes about {rest_s:.0f} s: "
            f"finishing instead of requeueing (recovery.finish_before_limit)"
        )


def count_time_limit_requeue(ctx: JobContext) -> int:
    """Time-limit stops of this Slurm job so far, this one included (a resubmission is a
    new job and starts again from zero)."""
    path = ctx.output_dir / TIME_LIMIT_FILE
    job = ctx.slurm_requeue_id or ""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        saved = {}
    count = int(saved.get("count", 0)) + 1 if saved.get("job") == job else 1
    atomic_write(path, json.dumps({"job": job, "count": count}).encode())
    return count


def sweep_gate(sweep: Path, slurm: SlurmCLI, job: str = "") -> Gate:
    """The gate as a job of a sweep uses it (a task's job, the sweep's supervisor job): the
    sweep's policy, kill switch and audit log."""
    return Gate(AuditLog(sweep / SWEEP_AUDIT), standalone_executors(sweep, slurm), job=job)


def job_gate(ctx: JobContext, slurm: SlurmCLI) -> Gate:
    """The gate as a running task's job uses it."""
    return sweep_gate(ctx.sweep_dir or ctx.output_dir, slurm, ctx.slurm_requeue_id or "")


def requeue_supervisor_job(sweep_dir: Path, job_id: str, restarts: int, slurm: SlurmCLI) -> Outcome:
    """The sweep's supervisor job at its time-limit warning requeues itself, through the gate
    (as a task's job does in `handle_stop`): its next run goes on from sweep.json."""
    return sweep_gate(sweep_dir, slurm, job_id).request(
        Action(
            "requeue",
            job_id,
            "the sweep's supervisor job reaches its time limit: requeued, its next run goes on from sweep.json",
            context={"attempt": restarts + 1, "source": "supervisor"},
        )
    )


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


class LoopApprover:
    """The gate for the step loop's in-loop actions (`ctx.approve`; runtime/adapt.py): each
    intervention is an Action on this job — kind decay_lr or restart_schedule, source
    `runtime:adapt`, cause the trigger — decided by the sweep's policy and kill switch and
    recorded in its audit log; the change is the action's executor, run by the gate only when
    allowed. Plain data (picklable), so the context stays copyable."""

    SOURCE = "runtime:adapt"

    def __init__(self, ctx: JobContext) -> None:
        self.sweep: Path = ctx.sweep_dir or ctx.output_dir
        self.target = ctx.slurm_requeue_id or str(ctx.output_dir)
        self.attempt = ctx.attempt

    def __call__(
        self,
        kind: str,
        reason: str,
        evidence: dict[str, Any],
        params: dict[str, Any],
        apply: Callable[[], dict[str, Any]],
        source: str = "",
    ) -> Approval:
        if kind not in ACTION_KINDS:
            raise SlurmAgentError(f"unknown action kind {kind!r} asked by the step loop")
        cause = str(evidence.get("trigger") or ("plateau" if kind == "restart_schedule" else "gradient_explosion"))
        action = Action(
            cast(ActionKind, kind),
            self.target,
            reason,
            params=dict(params),
            evidence=[Evidence(self.SOURCE, 0, f"{key}: {value}") for key, value in evidence.items()],
            metrics_before=dict(evidence),
            context={"attempt": self.attempt, "source": source or self.SOURCE, "cause": cause},
        )

        def run(_action: Action) -> dict[str, Any]:
            try:
                return apply()
            except Exception as exc:  # the change failed: an outcome for the audit log, not a crash
                raise SlurmAgentError(f"{kind} failed in the training loop: {exc}") from exc

        gate = Gate(AuditLog(self.sweep / SWEEP_AUDIT), {kind: run}, job=self.target)
        outcome = gate.request(action)
        verdict = "held" if outcome.held else outcome.decision.verdict
        return Approval(outcome.executed, verdict, outcome.decision.rule, dict(outcome.result))


def handle_stop(
    ctx: JobContext, stop: StopForRequeue, recovery: RecoveryConf | None = None, slurm: SlurmCLI | None = None
) -> None:
    """After the loop's stop checkpoint: requeue this job (through the action gate) as the
    stop's reason demands; see the module docstring."""
    recovery = recovery or RecoveryConf()
    if not ctx.where.queued or ctx.slurm_requeue_id is None:
        log.warning("stopped at step %d (%s); no Slurm here to requeue", stop.step, stop.reason)
        return
    if ctx.rank != 0:
        return  # rank 0 speaks for the job; every rank stopped at the same step
    # our own `scontrol requeue` makes Slurm signal this job at once: the stop signals must
    # not end it before every action is done and recorded (SIGKILL still comes after KillWait)
    held = install_handlers(StopFlag(), [signal.SIGTERM, signal.SIGCONT, signal_number(recovery.signal)])
    try:
        _decide(ctx, stop, recovery, slurm or SlurmCLI())
    finally:
        restore_handlers(held)


def _decide(ctx: JobContext, stop: StopForRequeue, recovery: RecoveryConf, slurm: SlurmCLI) -> None:
    assert ctx.slurm_requeue_id is not None
    if stop.reason == "health":
        requeue_elsewhere(ctx, slurm)
        return
    try:
        seen = slurm.job_state(ctx.slurm_requeue_id)
    except SlurmAgentError:
        seen = None
    state, reason, left = (seen.state, seen.reason, seen.time_left) if seen is not None else ("", "", "")
    why = classify_stop(stop.signals, state, parse_time_limit(left), recovery.signal_delay_s)
    if why == "ending":
        log.warning(
            "stopped at step %d: Slurm is ending this job (state %s, reason %s); it requeues preempted jobs itself",
            stop.step,
            state or "unknown",
            reason or "unknown",
        )
        return
    metrics = {"step": stop.step, "state": state, "reason": reason, "time_left": left, "signals": list(stop.signals)}
    if why == "time_limit":
        count = count_time_limit_requeue(ctx)
        if count > recovery.max_time_limit_requeues:
            raise TaskFailedError(
                f"slurmagent: time limit reached {count} times (recovery.max_time_limit_requeues="
                f"{recovery.max_time_limit_requeues}); checkpoint at step {stop.step}: resubmit with a longer time"
            )
        reason_text = f"time limit near ({left} left): requeue {count} of {recovery.max_time_limit_requeues}"
    else:
        reason_text = f"signal {stop.signum} with {left or 'unknown'} left: requeue to resume from step {stop.step}"
    names = ", ".join(signal.Signals(n).name for n in stop.signals if n in signal.Signals._value2member_map_)
    evidence = [
        Evidence("slurm", 0, f"squeue: State={state or '?'} Reason={reason or '?'} TimeLeft={left or '?'}"),
        Evidence("runtime", 0, f"signals received: {names}; stop checkpoint at step {stop.step}"),
    ]
    cause = "time_limit" if why == "time_limit" else "signal"
    action = job_action(ctx, "requeue", reason_text, "runtime", evidence=evidence, metrics=metrics, cause=cause)
    outcome = job_gate(ctx, slurm).request(action)
    if outcome.executed:
        log.warning("stopped at step %d: %s", stop.step, reason_text)
        return
    # not requeued (Slurm refused: a --no-requeue job, recovery.requeue=false; the policy; the kill
    # switch): the job ends here, and says why in words the supervisor's diagnosis knows, so that
    # recovery resubmits it to resume from the checkpoint (was: "crash", no error message, not retried)
    verdict = "held by the kill switch" if outcome.held else outcome.decision.verdict
    # on one line: scontrol's errors span several (munge's three), and the diagnosis reads a line
    why_not = " ".join(f"{verdict}: {outcome.result.get('error') or outcome.decision.rule}".split())
    if why == "time_limit":
        raise TaskFailedError(
            f"slurmagent: time limit near ({left} left) and the requeue was not done ({why_not}); "
            f"checkpoint at step {stop.step}: resubmit with a longer time"
        )
    raise TaskFailedError(
        f"slurmagent: stopped by signal {stop.signum} with {left or 'unknown'} left and the requeue was not done "
        f"({why_not}); checkpoint at step {stop.step}: resubmit to resume from it"
    )


def requeue_elsewhere(ctx: JobContext, slurm: SlurmCLI) -> dict[str, Any]:
    """Requeue this job and add this node to its ExcNodeList, so its next run starts on
    another node (Slurm allows ExcNodeList changes only once the job is pending again, hence
    the order) — both through the action gate, as automated actions from a CRITICAL health
    check. The outcome is added to health_stop.json for the supervisor."""
    job = ctx.slurm_requeue_id
    if not job or not ctx.node:
        return {}
    source = "health_check:CRITICAL"
    done: dict[str, Any] = {"requeued": False, "excluded": None}
    path = ctx.output_dir / STOP_RECORD
    record = json.loads(path.read_text()) if path.exists() else {}
    evidence = [Evidence(str(path), 0, str(r)) for r in (record.get("reasons") or [])[:3]]
    gate = job_gate(ctx, slurm)
    try:
        current = slurm.job_fields(job).get("ExcNodeList", "(null)")
        why = f"health check CRITICAL on {ctx.node}: requeue from the checkpoint just written"
        requeue = job_action(
            ctx, "requeue", why, source, evidence=evidence, metrics={"node": ctx.node}, cause="gpu_health"
        )
        requeued = gate.request(requeue)
        done["requeued"] = requeued.executed
        if requeued.executed:
            excluded = ",".join(x for x in (current if current != "(null)" else "", ctx.node) if x)
            params = {"exclude": excluded, "node": ctx.node}
            elsewhere = f"health check CRITICAL on {ctx.node}: run elsewhere"
            moved = gate.request(job_action(ctx, "exclude_node", elsewhere, source, params=params, evidence=evidence))
            done["excluded"] = excluded if moved.executed else None
            if not moved.executed:
                done["error"] = str(moved.result.get("error") or moved.decision.rule)
        else:
            done["error"] = (
                f"requeue {requeued.decision.verdict}: {requeued.result.get('error') or requeued.decision.rule}"
            )
    except SlurmAgentError as exc:
        done["error"] = str(exc)
        log.error("could not requeue %s away from %s: %s", job, ctx.node, exc)
    atomic_write(path, json.dumps({**record, **done}, default=str).encode())
    return done
