"""The one gate for automated actions: every requeue, resubmission, node exclusion or
cancellation slurmagent decides on its own passes through `Gate.request`, which asks the
policy, records the decision (with reason and evidence) in the audit log, runs the action
if allowed, and records the outcome with the metrics after.

Actions are typed records; executors are plain callables registered per action kind, so
only the kinds the gate knows can run at all.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock

from slurmagent.errors import SlurmAgentError, choices
from slurmagent.recovery.diagnose import Evidence

ACTION_KINDS = ("requeue", "resubmit", "exclude_node", "cancel", "drain_node", "delete_checkpoint")
GENESIS = "0" * 64


@dataclass(frozen=True)
class Action:
    kind: str  # one of ACTION_KINDS
    target: str  # job id, array task id, node or path
    reason: str  # one sentence: why
    params: dict[str, Any] = field(default_factory=dict)  # e.g. the new resources of a resubmission
    evidence: list[Evidence] = field(default_factory=list)  # log lines with source and line number
    metrics_before: dict[str, Any] = field(default_factory=dict)  # state the decision was taken on

    def __post_init__(self) -> None:
        if self.kind not in ACTION_KINDS:
            raise SlurmAgentError(f"unknown action kind {self.kind!r}; the gate knows {choices(ACTION_KINDS)}")


@dataclass(frozen=True)
class Decision:
    verdict: str  # "allow", "deny" or "needs_approval"
    rule: str  # which rule of the policy decided


class DefaultPolicy:
    """Recovery within bounds is allowed; anything destructive is not automated here."""

    allowed = frozenset({"requeue", "resubmit", "exclude_node"})

    def decide(self, action: Action) -> Decision:
        if action.kind in self.allowed:
            return Decision("allow", f"default: {action.kind} allowed within the task's recovery bounds")
        return Decision("deny", f"default: {action.kind} is not an automated action")


def record_hash(record: Mapping[str, Any]) -> str:
    body = {k: v for k, v in record.items() if k != "hash"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


class AuditLog:
    """Append-only JSON Lines, one record per decision and per outcome, each carrying the
    hash of the previous record, written under a filelock lock."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.lock = FileLock(str(self.path) + ".lock", timeout=60)

    def _last_hash(self) -> str:
        if not self.path.exists():
            return GENESIS
        last = ""
        with open(self.path, "rb") as fh:
            for line in fh:
                if line.strip():
                    last = line.decode()
        return str(json.loads(last)["hash"]) if last else GENESIS

    def append(self, record: dict[str, Any]) -> dict[str, Any]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.lock:
            full = {
                "time": time.time(),
                "user": getpass.getuser(),
                "host": socket.gethostname(),
                **record,
                "prev": self._last_hash(),
            }
            full["hash"] = record_hash(full)
            with open(self.path, "a") as fh:
                fh.write(json.dumps(full, default=str) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        return full

    def records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]


Executor = Callable[[Action], dict[str, Any]]


@dataclass(frozen=True)
class Outcome:
    decision: Decision
    executed: bool
    result: dict[str, Any]  # what the executor returned (new job id, …) or the error


class Gate:
    def __init__(
        self, audit: AuditLog, executors: Mapping[str, Executor], policy: DefaultPolicy | None = None, job: str = ""
    ) -> None:
        self.audit = audit
        self.executors = dict(executors)
        self.policy = policy or DefaultPolicy()
        self.job = job

    def request(self, action: Action) -> Outcome:
        decision = self.policy.decide(action)
        base = {
            "job": self.job or action.target,
            "action": action.kind,
            "target": action.target,
            "params": action.params,
            "reason": action.reason,
            "evidence": [asdict(e) for e in action.evidence],
            "metrics_before": action.metrics_before,
        }
        self.audit.append({"type": "decision", **base, "decision": decision.verdict, "rule": decision.rule})
        if decision.verdict != "allow":
            return Outcome(decision, False, {})
        executor = self.executors.get(action.kind)
        if executor is None:
            result: dict[str, Any] = {"error": f"no executor for {action.kind} here"}
            ok = False
        else:
            try:
                result, ok = executor(action), True
            except SlurmAgentError as exc:
                result, ok = {"error": str(exc)}, False
        self.audit.append(
            {
                "type": "outcome",
                **base,
                "decision": decision.verdict,
                "rule": decision.rule,
                "ok": ok,
                "metrics_after": result,
            }
        )
        return Outcome(decision, ok, result)
