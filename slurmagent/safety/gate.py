"""The one gate for automated actions: every requeue, resubmission, node exclusion,
cancellation, drain or checkpoint deletion slurmagent decides on its own passes through
`Gate.request`, which

1. checks the kill switch (safety/switch.py): paused → the action is recorded as held and
   not run; the caller retries it after `slurmagent resume`;
2. asks the policy (safety/policy.py, Hydra config in conf/policy/): allow, deny, or
   needs_approval — then a pending approval is filed (safety/approvals.py) and the action
   runs once enough distinct users approved it (`Gate.run_approved`);
3. records the decision (with its rule, reason and evidence) in the sweep's audit log and
   the user's own, runs the action if allowed, and records the outcome with the metrics
   after.

Actions are typed records; executors are plain callables registered per action kind, so
only the kinds the gate knows can run at all.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from slurmagent.errors import SlurmAgentError
from slurmagent.records import Action, Decision
from slurmagent.safety.approvals import ApprovalStore
from slurmagent.safety.audit import AuditLog
from slurmagent.safety.executors import Executor
from slurmagent.safety.paths import approvals_dir, current_user, user_audit_path
from slurmagent.safety.policy import Policy, RulePolicy, resolve_policy
from slurmagent.safety.switch import describe, paused

__all__ = ["SHARED_AUDIT_MODE", "DefaultPolicy", "Gate", "Outcome"]

log = logging.getLogger(__name__)
SHARED_AUDIT_MODE = 0o666


class DefaultPolicy:
    """The built-in fallback (kept for callers that pass it): recovery within bounds and the
    in-loop controller's changes to its own run are allowed; anything destructive is not
    automated. `Gate` uses conf/policy/ otherwise."""

    allowed = frozenset({"requeue", "resubmit", "exclude_node", "decay_lr", "restart_schedule"})

    def decide(self, action: Action) -> Decision:
        if action.kind in self.allowed:
            return Decision("allow", f"default: {action.kind} allowed within the task's recovery bounds")
        return Decision("deny", f"default: {action.kind} is not an automated action")


@dataclass(frozen=True)
class Outcome:
    decision: Decision
    executed: bool
    result: dict[str, Any]  # what the executor returned (new job id, …) or the error
    approval_id: str | None = None  # set when the action waits for approval
    held: bool = False  # the kill switch held it: retry after resume


class Gate:
    """`Gate(audit, executors)`: the sweep is the audit log's directory (pass `sweep_dir`
    to say otherwise, e.g. from a job); the policy is the sweep's (see resolve_policy)."""

    def __init__(
        self,
        audit: AuditLog,
        executors: Mapping[str, Executor],
        policy: Policy | None = None,
        job: str = "",
        *,
        sweep_dir: Path | None = None,
        user_audit: AuditLog | None = None,
    ) -> None:
        self.audit = audit
        self.executors = dict(executors)
        self.sweep_dir = (Path(sweep_dir) if sweep_dir is not None else audit.path.parent).absolute()
        self.policy: Policy = policy or resolve_policy(self.sweep_dir)
        self.job = job
        self.shared = bool(getattr(self.policy, "shared", False))
        if self.shared and audit.mode is None:
            self.audit = AuditLog(audit.path, mode=SHARED_AUDIT_MODE)  # approvers append their outcomes
        self.user_audit = user_audit if user_audit is not None else AuditLog(user_audit_path())
        self.approvals = ApprovalStore(approvals_dir(self.sweep_dir), shared=self.shared)

    # -- recording -----------------------------------------------------------------------
    def _base(self, action: Action) -> dict[str, Any]:
        return {
            "sweep": str(self.sweep_dir),
            "job": self.job or action.target,
            "action": action.kind,
            "target": action.target,
            "params": action.params,
            "context": action.context,
            "reason": action.reason,
            "evidence": [asdict(e) for e in action.evidence],
            "metrics_before": action.metrics_before,
        }

    def _record(self, record: dict[str, Any]) -> None:
        self.audit.append(record)  # the sweep's log must take it: an unrecorded action does not run
        if self.user_audit.path != self.audit.path:
            try:
                self.user_audit.append(record)
            except (OSError, SlurmAgentError) as exc:
                log.warning("could not write the per-user audit log %s: %s", self.user_audit.path, exc)

    def _hold(self, action: Action, switch: Path, extra: dict[str, Any]) -> Outcome:
        decision = Decision("held", f"kill-switch: {describe(switch)}")
        self._record({"type": "decision", **self._base(action), **extra, "decision": "held", "rule": decision.rule})
        return Outcome(decision, False, {"held": str(switch)}, held=True)

    # -- the gate ------------------------------------------------------------------------
    def request(self, action: Action) -> Outcome:
        switch = paused(self.sweep_dir)
        if switch is not None:
            return self._hold(action, switch, {})
        decision = self.policy.decide(action)
        base = self._base(action)
        verdict = {"decision": decision.verdict, "rule": decision.rule}
        if decision.verdict == "needs_approval":
            ttl = float(getattr(self.policy, "approval_ttl_s", RulePolicy.approval_ttl_s))
            req = self.approvals.create(action, decision, ttl, self.job, self.sweep_dir, self.audit.path.absolute())
            self._record(
                {
                    "type": "decision",
                    **base,
                    **verdict,
                    "approvals_needed": decision.approvals,
                    "approval_id": req.id,
                    "expires_at": req.expires_at,
                }
            )
            return Outcome(decision, False, {"approval_id": req.id}, approval_id=req.id)
        self._record({"type": "decision", **base, **verdict})
        if decision.verdict != "allow":
            return Outcome(decision, False, {})
        return self._execute(action, decision, base, {})

    def run_approved(self, approval_id: str) -> Outcome:
        """Run an action whose approvals are complete — once, by whichever process claims it."""
        st = self.approvals.status(approval_id)
        action = Action.from_json(st.request.action)
        decision = Decision(st.state, st.request.rule, st.request.approvals)
        if st.state != "approved" or action.kind not in self.executors:
            return Outcome(decision, False, {"state": st.state}, approval_id=approval_id)
        if not self.audit.writable():  # an action whose outcome cannot be recorded does not run
            why = f"{current_user()} cannot write {self.audit.path}"
            return Outcome(decision, False, {"state": st.state, "waiting": why}, approval_id=approval_id)
        extra = {"approval_id": approval_id, "approvers": st.approvers, "requester": st.request.requester}
        switch = paused(self.sweep_dir)
        if switch is not None:
            return self._hold(action, switch, extra)
        if not self.approvals.claim(approval_id):
            return Outcome(decision, False, {"state": "claimed by another process"}, approval_id=approval_id)
        allowed = Decision("allow", f"{st.request.rule} (approved by {', '.join(st.approvers)})", st.request.approvals)
        out = self._execute(action, allowed, self._base(action), extra)
        self.approvals.finish(approval_id, out.executed, out.result)
        return Outcome(out.decision, out.executed, out.result, approval_id=approval_id)

    def _execute(self, action: Action, decision: Decision, base: dict[str, Any], extra: dict[str, Any]) -> Outcome:
        executor = self.executors.get(action.kind)
        if executor is None:
            result: dict[str, Any] = {"error": f"no executor for {action.kind} here"}
            ok = False
        else:
            try:
                result, ok = executor(action), True
            except SlurmAgentError as exc:
                result, ok = {"error": str(exc)}, False
        self._record(
            {
                "type": "outcome",
                **base,
                **extra,
                "decision": decision.verdict,
                "rule": decision.rule,
                "ok": ok,
                "metrics_after": result,
            }
        )
        return Outcome(decision, ok, result)
