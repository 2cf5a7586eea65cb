"""The kill switch on the real cluster: a job the kernel's cgroup OOM killer ends is not
resubmitted while its sweep is paused, and is resubmitted (with more memory) after resume.
The history the supervisor recorded is then replayed under a stricter policy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from safety_users import local_users, run_as, shared_dir

from slurmagent.cli import main
from tests.conftest import audit_records

pytestmark = pytest.mark.slurm

POLL = ["hydra.launcher.poll_interval_s=1", "hydra.launcher.max_poll_interval_s=2"]
# a real cgroup OOM kill: the task holds 300 MB under --mem=256M
OOM = ["+experiment=synthetic", "synthetic.steps=20", "synthetic.step_time_s=0.05", "synthetic.alloc_mb=300"]


def launch(sweep: Path, env: dict[str, str], *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "slurmagent",
            "-m",
            *OOM,
            "resources.mem=256M",
            f"hydra.sweep.dir={sweep}",
            *POLL,
            *extra,
        ],
        cwd=sweep.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """A slurmagent subcommand in this process: (exit code, stdout)."""
    code = main(list(args))
    return code, capsys.readouterr().out


records = audit_records


def wait_for(what: str, check: Any, proc: subprocess.Popen[str], timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if proc.poll() is not None:
            _out, err = proc.communicate()
            pytest.fail(f"launcher ended (rc {proc.returncode}) before {what}:\n{err[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.5)


def test_oom_is_held_while_paused_and_resubmitted_after_resume(
    slurm_conf: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SLURMAGENT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("SLURMAGENT_POLICY", raising=False)
    env = dict(os.environ)
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    code, out = cli(capsys, "pause", "--sweep", str(sweep), "--reason", "test maintenance")
    assert code == 0 and "running jobs keep running" in out
    proc = launch(sweep, env)
    audit = sweep / "audit.jsonl"
    try:
        wait_for("the held resubmission", lambda: any(r["decision"] == "held" for r in records(audit)), proc)
        time.sleep(3)  # several more polls while paused: still nothing happens
        state = json.loads((sweep / "sweep.json").read_text())
        task = state["tasks"][0]
        assert task["state"] == "OUT_OF_MEMORY" and len(task["attempts"]) == 1, task
        assert "recovery waits for the kill switch" in task["error"]
        assert [(r["type"], r["decision"]) for r in records(audit)] == [("decision", "held")]
        held = records(audit)[0]
        assert "test maintenance" in held["rule"] and held["params"] == {"mem": ["256M", "384M"]}
        assert any("oom-kill" in e["text"] for e in held["evidence"]), held["evidence"]
        assert proc.poll() is None  # the launcher waits for the held recovery

        code, out = cli(capsys, "resume", "--sweep", str(sweep))
        assert code == 0 and "resumed sweep" in out
        _out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    state = json.loads((sweep / "sweep.json").read_text())
    task = state["tasks"][0]
    assert task["state"] == "COMPLETED" and len(task["attempts"]) == 2
    assert (
        task["attempts"][0]["state"] == "OUT_OF_MEMORY"
        and state["specs"][task["spec_id"]]["resources"]["mem"] == "384M"
    )
    recs = records(audit)
    assert [(r["type"], r["decision"]) for r in recs] == [
        ("decision", "held"),
        ("decision", "allow"),
        ("outcome", "allow"),
    ]
    assert recs[1]["rule"] == "default:resubmit-within-bounds"
    assert recs[2]["ok"] and recs[2]["metrics_after"]["job_id"] == task["attempts"][1]["job_id"]
    code, out = cli(capsys, "audit", "verify", str(audit))
    assert code == 0 and f"{len(records(audit, retention=True))} record(s), hash chain intact" in out
    mine = records(tmp_path / "state" / "audit.jsonl")  # the per-user log has them too
    assert [r["decision"] for r in mine] == ["held", "allow", "allow"]

    # replay: the recorded history under the stricter policy, executing nothing
    history = sweep / "history.jsonl"
    entries = records(history)
    assert [e["decision"]["verdict"] for e in entries] == ["held", "allow"]
    assert entries[0]["diagnosis"]["cause"] == "host_oom" and entries[0]["slurm_state"] == "OUT_OF_MEMORY"
    assert any("oom-kill" in text for text in entries[0]["logs"].values())
    code, out = cli(capsys, "replay", str(history))
    assert code == 0 and "0 of 2 decision(s) change under policy default" in out
    code, out = cli(capsys, "replay", str(history), "--policy", "strict", "--fail-on-change")
    print(out)  # the side-by-side table and the diff, for the test log
    assert code == 1 and "1 of 2 decision(s) change under policy strict; nothing was executed" in out
    assert "- line 2 task 0: resubmit " in out and "allow [default:resubmit-within-bounds]" in out
    assert "+ line 2 task 0: resubmit " in out and "needs_approval x1 [strict:resubmit-more-memory]" in out
    assert len(records(audit)) == 3 and not (sweep / "approvals").exists()  # replay changed nothing


def test_a_resubmission_that_needs_approval_waits_for_another_real_user(slurm_conf: str, tmp_path: Path) -> None:
    """Under the strict policy (`+policy=strict`) more memory needs one approval; sa-alice gives it, and the
    sweep's supervisor (root) runs the resubmission on its next poll."""
    with local_users() as (alice, _bob), shared_dir() as top:
        sweep = top / "sweep"
        env = {**os.environ, "SLURMAGENT_STATE_DIR": str(tmp_path / "state")}
        env.pop("SLURMAGENT_POLICY", None)
        proc = launch(sweep, env, "+policy=strict")  # the policy as a Hydra config group
        audit = sweep / "audit.jsonl"
        try:
            wait_for(
                "the approval request", lambda: any(r["decision"] == "needs_approval" for r in records(audit)), proc
            )
            # the gate records the decision first; the supervisor's sweep.json follows when its poll ends
            wait_for(
                "the sweep state",
                lambda: "approval" in json.loads((sweep / "sweep.json").read_text())["tasks"][0]["error"],
                proc,
            )
            request = records(audit)[0]
            assert request["rule"] == "strict:resubmit-more-memory" and request["approvals_needed"] == 1
            task = json.loads((sweep / "sweep.json").read_text())["tasks"][0]
            assert len(task["attempts"]) == 1 and f"approval {request['approval_id']}" in task["error"]
            listed = run_as(alice, "approvals", "--sweep", str(sweep))
            assert listed.returncode == 0 and request["approval_id"] in listed.stdout, listed.stderr
            yes = run_as(alice, "approve", request["approval_id"], "--sweep", str(sweep))
            assert yes.returncode == 0, yes.stderr
            assert "now approved" in yes.stdout and "supervisor runs it on its next poll" in yes.stdout
            _out, err = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, err[-3000:]
        state = json.loads((sweep / "sweep.json").read_text())
        task = state["tasks"][0]
        assert task["state"] == "COMPLETED" and len(task["attempts"]) == 2
        assert state["specs"][task["spec_id"]]["resources"]["mem"] == "384M"
        recs = records(audit)
        assert [(r["type"], r["user"], r["decision"]) for r in recs] == [
            ("decision", "root", "needs_approval"),
            ("approval", alice, "approve"),
            ("outcome", "root", "allow"),
        ]
        assert recs[2]["approvers"] == [alice] and recs[2]["metrics_after"]["job_id"] == task["attempts"][1]["job_id"]
        assert run_as(None, "audit", "verify", str(audit)).returncode == 0
