"""Approvals by two real local users: the test creates `sa-alice` and `sa-bob` with useradd
(it needs root, as CI has) and runs `slurmagent approve` as each of them with runuser."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from safety_users import local_users, run_as, shared_dir

from slurmagent.records import Action
from slurmagent.safety.audit import AuditLog, verify
from slurmagent.safety.executors import standalone_executors
from slurmagent.safety.gate import Gate
from slurmagent.safety.policy import load_policy


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[str, str]]:
    with local_users() as names:
        yield names


@pytest.fixture()
def shared_sweep() -> Iterator[Path]:
    """A sweep directory the team can write."""
    with shared_dir() as top:
        sweep = top / "sweep"
        sweep.mkdir()
        sweep.chmod(0o777)
        yield sweep


def test_two_approval_action_waits_for_two_distinct_real_users(
    users: tuple[str, str], shared_sweep: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    alice, bob = users
    monkeypatch.setenv("SLURMAGENT_STATE_DIR", str(tmp_path / "root-state"))
    ckpt = shared_sweep / "0" / "checkpoints" / "step_100"
    ckpt.mkdir(parents=True)
    (ckpt / "model.pt").write_bytes(b"weights")
    for d in (ckpt.parent.parent, ckpt.parent, ckpt):
        d.chmod(0o777)
    gate = Gate(
        AuditLog(shared_sweep / "audit.jsonl"), standalone_executors(shared_sweep), policy=load_policy("strict")
    )
    out = gate.request(Action("delete_checkpoint", "0/checkpoints/step_100", "free quota", context={"attempt": 1}))
    assert out.approval_id and out.decision.approvals == 2 and ckpt.exists()
    aid, sweep = out.approval_id, str(shared_sweep)

    own = run_as(None, "approve", aid, "--sweep", sweep)  # root asked for it: root does not count
    assert own.returncode == 2 and "cannot approve it" in own.stderr

    first = run_as(alice, "approve", aid, "--sweep", sweep, "--note", "old run")
    assert first.returncode == 0, first.stderr
    assert "now pending" in first.stdout and "1 more approval" in first.stdout and ckpt.exists()
    again = run_as(alice, "approve", aid, "--sweep", sweep)
    assert again.returncode == 2 and f"{alice} has already voted" in again.stderr and ckpt.exists()

    listed = run_as(bob, "approvals", "--sweep", sweep, "--json")
    assert listed.returncode == 0, listed.stderr
    (row,) = [json.loads(x) for x in listed.stdout.splitlines()]
    assert row["id"] == aid and row["state"] == "pending" and row["approvers"] == [alice]

    second = run_as(bob, "approve", aid, "--sweep", sweep)
    assert second.returncode == 0, second.stderr
    assert "now approved" in second.stdout and "executed" in second.stdout
    assert not ckpt.exists() and ckpt.parent.exists()  # the action ran, nothing more

    recs = AuditLog(shared_sweep / "audit.jsonl").records()
    assert [(r["type"], r["user"], r["decision"]) for r in recs] == [
        ("decision", "root", "needs_approval"),
        ("approval", alice, "approve"),
        ("approval", bob, "approve"),
        ("outcome", bob, "allow"),
    ]
    assert recs[-1]["approvers"] == [alice, bob] and recs[-1]["ok"] and recs[-1]["requester"] == "root"
    assert verify(shared_sweep / "audit.jsonl") == []
    bob_log = Path(f"/home/{bob}/.local/state/slurmagent/audit.jsonl")  # bob's own audit log
    assert [r["type"] for r in AuditLog(bob_log).records()] == ["approval", "outcome"]
    late = run_as(alice, "reject", aid, "--sweep", sweep)
    assert late.returncode == 2 and "is executed" in late.stderr


def test_forged_vote_does_not_count_and_a_rejection_ends_the_request(
    users: tuple[str, str], shared_sweep: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    alice, bob = users
    monkeypatch.setenv("SLURMAGENT_STATE_DIR", str(tmp_path / "root-state"))
    gate = Gate(
        AuditLog(shared_sweep / "audit.jsonl"), standalone_executors(shared_sweep), policy=load_policy("strict")
    )
    out = gate.request(Action("cancel", "123_4", "stuck", context={"run_time_s": 3600}))
    assert out.approval_id and out.decision.approvals == 2
    forged = shared_sweep / "approvals" / f"{out.approval_id}.vote.{alice}"  # written by root, not alice
    forged.write_text(json.dumps({"user": alice, "verdict": "approve", "time": 0}))
    assert gate.approvals.status(out.approval_id).approvers == []
    no = run_as(bob, "reject", out.approval_id, "--sweep", str(shared_sweep), "--note", "still useful")
    assert no.returncode == 0 and "now rejected" in no.stdout, no.stderr
    assert gate.approvals.status(out.approval_id).state == "rejected"
    assert run_as(None, "approvals", "--sweep", str(shared_sweep), "--json").stdout == ""  # nothing pending


def test_an_approver_who_cannot_write_the_audit_log_leaves_the_run_to_the_owner(
    users: tuple[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    alice, _bob = users
    monkeypatch.setenv("SLURMAGENT_STATE_DIR", str(tmp_path / "root-state"))
    with shared_dir() as top:
        sweep = top / "sweep"  # the owner's sweep: others may read it, not write it
        (sweep / "ckpt").mkdir(parents=True)
        gate = Gate(AuditLog(sweep / "audit.jsonl"), standalone_executors(sweep), policy=load_policy("default"))
        out = gate.request(Action("delete_checkpoint", "ckpt", "free quota"))
        assert out.approval_id and out.decision.approvals == 1
        for name in ("audit.jsonl", "audit.jsonl.head", "audit.jsonl.lock"):
            (sweep / name).chmod(0o644)
        yes = run_as(alice, "approve", out.approval_id, "--sweep", str(sweep))
        assert yes.returncode == 0, yes.stderr
        assert "now approved" in yes.stdout and f"not run here: {alice} cannot write" in yes.stdout
        assert "cannot write the audit log" in yes.stderr and (sweep / "ckpt").exists()
        run = run_as(None, "approvals", "--sweep", str(sweep), "--run")
        assert run.returncode == 0 and "executed" in run.stdout, run.stdout + run.stderr
        assert not (sweep / "ckpt").exists()
        recs = AuditLog(sweep / "audit.jsonl").records()
        assert [(r["type"], r["user"]) for r in recs] == [("decision", "root"), ("outcome", "root")]
        assert recs[1]["approvers"] == [alice] and verify(sweep / "audit.jsonl") == []
