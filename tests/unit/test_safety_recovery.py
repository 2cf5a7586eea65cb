"""The Recoverer with the kill switch and approvals, on a sweep state in a real directory:
a held recovery is requested again after resume; a rejected or expired one ends the task.
(No job is submitted here: the strict policy asks for approval; the cluster test runs it.)"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from slurmagent.config import job_spec
from slurmagent.safety.approvals import ApprovalStore
from slurmagent.safety.audit import AuditLog
from slurmagent.safety.switch import pause, resume
from slurmagent.slurm.seam import SlurmCLI
from slurmagent.supervise.recover import Recoverer
from slurmagent.supervise.state import Attempt, SweepState, TaskRecord

LOGS = Path(__file__).resolve().parent.parent / "data" / "logs"


@pytest.fixture()
def sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SLURMAGENT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("SLURMAGENT_POLICY", raising=False)
    path = tmp_path / "sweep"
    path.mkdir()
    (path / "policy.yaml").write_text(
        "name: test\napproval_ttl_s: 600\nrules:\n"
        "  - {name: more-memory, action: resubmit, decision: needs_approval, approvals: 1, when: {params_any: [mem]}}\n"
    )
    return path


def oom_state(sweep: Path) -> tuple[SweepState, TaskRecord]:
    spec = job_spec({"task": {"target": "a:b"}, "resources": {"mem": "1G"}, "cluster": "local"})
    task = TaskRecord(0, ["x=1"], [Attempt("4242", time.time(), "OUT_OF_MEMORY")], "OUT_OF_MEMORY")
    task.error = "OUT_OF_MEMORY"
    (sweep / "0").mkdir()
    (sweep / "0" / "command.stderr").write_text((LOGS / "host_oom.err").read_text())
    state = SweepState(str(sweep), "local", str(sweep / ".submitit"), time.time(), [task])
    task.spec_id = state.add_spec(dataclasses.asdict(spec))
    return state, task


def test_held_recovery_is_requested_again_after_resume_then_a_rejection_ends_it(sweep: Path) -> None:
    state, task = oom_state(sweep)
    rec = Recoverer(sweep, SlurmCLI())
    pause(sweep)
    rec.handle(state, task)
    assert rec.has_held() and rec.held()["0"]["approval_id"] is None
    assert "recovery waits for the kill switch" in task.error and task.diagnosis["cause"] == "host_oom"
    assert rec.retry_held(state) is False and rec.has_held()  # still paused: nothing happens
    resume(sweep)
    assert rec.retry_held(state) is True  # requested again: this policy asks for approval now
    approval = rec.held()["0"]["approval_id"]
    assert approval and f"approval {approval}" in task.error
    assert rec.retry_held(state) is False  # pending
    ApprovalStore(sweep / "approvals").vote(approval, "reject", "not now")
    assert rec.retry_held(state) is True and not rec.has_held()
    assert task.error.startswith(f"OUT_OF_MEMORY: recovery rejected (approval {approval})")
    assert len(task.attempts) == 1 and task.state == "OUT_OF_MEMORY"
    decisions = [(r["decision"], r["rule"].split(":")[0]) for r in AuditLog(sweep / "audit.jsonl").records()]
    assert decisions == [("held", "kill-switch"), ("needs_approval", "test")]
    history = (sweep / "history.jsonl").read_text().splitlines()
    assert len(history) == 2 and '"cause": "host_oom"' in history[0] and "oom-kill" in history[0]


def test_an_expired_approval_ends_the_task(sweep: Path) -> None:
    (sweep / "policy.yaml").write_text((sweep / "policy.yaml").read_text().replace("600", "0.2"))
    state, task = oom_state(sweep)
    rec = Recoverer(sweep, SlurmCLI())
    rec.handle(state, task)
    approval = rec.held()["0"]["approval_id"]
    time.sleep(0.3)
    assert rec.retry_held(state) is True and not rec.has_held()
    assert f"recovery expired (approval {approval})" in task.error


def test_a_task_that_moved_on_is_no_longer_held(sweep: Path) -> None:
    state, task = oom_state(sweep)
    rec = Recoverer(sweep, SlurmCLI())
    rec.handle(state, task)
    assert rec.has_held()
    task.attempts.append(Attempt("4343", time.time()))  # e.g. resubmitted by a person
    task.state = "PENDING"
    rec.retry_held(state)
    assert not rec.has_held()
