"""Approvals by two real local users: the test creates `sa-alice` and `sa-bob` with useradd
(it needs root, as CI has) and runs `slurmagent approve` as each of them with runuser."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmagent.gate import Action, AuditLog, Gate
from slurmagent.safety.audit import verify
from slurmagent.safety.executors import standalone_executors
from slurmagent.safety.policy import load_policy

USERS = ("sa-alice", "sa-bob")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[str, str]]:
    if os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("runuser") is None:
        if IN_CI:
            pytest.fail("approval tests need root with useradd and runuser under CI")
        pytest.skip("needs root, useradd and runuser to create real users")
    for user in USERS:
        subprocess.run(["userdel", "-r", user], capture_output=True, check=False)  # left over by a killed run
        subprocess.run(["useradd", "-m", "-s", "/bin/sh", user], check=True, capture_output=True)
    try:
        yield USERS
    finally:
        for user in USERS:
            subprocess.run(["userdel", "-r", user], capture_output=True, check=False)


@pytest.fixture()
def shared_sweep() -> Iterator[Path]:
    """A sweep directory the team can write (pytest's tmp_path is private to root)."""
    top = Path(tempfile.mkdtemp(prefix="sa-approvals-"))
    top.chmod(0o755)
    sweep = top / "sweep"
    sweep.mkdir()
    sweep.chmod(0o777)
    try:
        yield sweep
    finally:
        shutil.rmtree(top)


ROOT = Path(__file__).resolve().parents[2]


def python_for(user: str) -> tuple[str, dict[str, str]]:
    """This interpreter when `user` may run it; else the system's python of the same
    version with this environment's packages on its path (a pyenv under /root is private)."""
    real = os.path.realpath(sys.executable)
    if subprocess.run(["runuser", "-u", user, "--", "test", "-x", real], check=False).returncode == 0:
        return sys.executable, {}
    system = shutil.which(f"python{sys.version_info.major}.{sys.version_info.minor}", path="/usr/local/bin:/usr/bin")
    if system is None:
        pytest.skip(f"no python {sys.version_info.major}.{sys.version_info.minor} that {user} may run")
    paths = [str(ROOT), *(p for p in sys.path if p.endswith("site-packages"))]
    return system, {"PYTHONPATH": os.pathsep.join(paths)}


def run_as(user: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURMAGENT_", "XDG_", "PYTHON"))}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    python, extra = python_for(user) if user else (sys.executable, {})
    env.update(extra)
    prefix = ["runuser", "-u", user, "--"] if user else []
    argv = [*prefix, python, "-m", "slurmagent", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd="/", timeout=120)


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
