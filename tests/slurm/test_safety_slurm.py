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

pytestmark = pytest.mark.slurm

POLL = ["hydra.launcher.poll_interval_s=1", "hydra.launcher.max_poll_interval_s=2"]


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurmagent", *args], capture_output=True, text=True, env=env, timeout=120
    )


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


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


def test_oom_is_held_while_paused_and_resubmitted_after_resume(slurm_conf: str, tmp_path: Path) -> None:
    env = {**os.environ, "SLURMAGENT_STATE_DIR": str(tmp_path / "state")}
    env.pop("SLURMAGENT_POLICY", None)
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    paused = cli(env, "pause", "--sweep", str(sweep), "--reason", "test maintenance")
    assert paused.returncode == 0 and "running jobs keep running" in paused.stdout, paused.stderr
    overrides = ["synthetic.steps=20", "synthetic.step_time_s=0.05", "synthetic.alloc_mb=300", "resources.mem=256M"]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "slurmagent",
            "-m",
            "+experiment=synthetic",
            *overrides,
            f"hydra.sweep.dir={sweep}",
            *POLL,
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    audit = sweep / "audit.jsonl"
    try:
        wait_for("the held resubmission", lambda: any(r["decision"] == "held" for r in records(audit)), proc)
        time.sleep(4)  # several more polls while paused: still nothing happens
        state = json.loads((sweep / "sweep.json").read_text())
        task = state["tasks"][0]
        assert task["state"] == "OUT_OF_MEMORY" and len(task["attempts"]) == 1, task
        assert "recovery waits for the kill switch" in task["error"]
        assert [(r["type"], r["decision"]) for r in records(audit)] == [("decision", "held")]
        held = records(audit)[0]
        assert "test maintenance" in held["rule"] and held["params"] == {"mem": ["256M", "384M"]}
        assert any("oom-kill" in e["text"] for e in held["evidence"]), held["evidence"]
        assert proc.poll() is None  # the launcher waits for the held recovery

        resumed = cli(env, "resume", "--sweep", str(sweep))
        assert resumed.returncode == 0 and "resumed sweep" in resumed.stdout
        _out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    task = json.loads((sweep / "sweep.json").read_text())["tasks"][0]
    assert task["state"] == "COMPLETED" and len(task["attempts"]) == 2
    assert task["attempts"][0]["state"] == "OUT_OF_MEMORY" and task["spec"]["resources"]["mem"] == "384M"
    recs = records(audit)
    assert [(r["type"], r["decision"]) for r in recs] == [
        ("decision", "held"),
        ("decision", "allow"),
        ("outcome", "allow"),
    ]
    assert recs[1]["rule"] == "default:resubmit-within-bounds"
    assert recs[2]["ok"] and recs[2]["metrics_after"]["job_id"] == task["attempts"][1]["job_id"]
    verify = cli(env, "audit", "verify", str(audit))
    assert verify.returncode == 0 and "3 record(s), hash chain intact" in verify.stdout
    mine = records(tmp_path / "state" / "audit.jsonl")  # the per-user log has them too
    assert [r["decision"] for r in mine] == ["held", "allow", "allow"]

    # replay: the recorded history under the stricter policy, executing nothing
    history = sweep / "history.jsonl"
    entries = records(history)
    assert [e["decision"]["verdict"] for e in entries] == ["held", "allow"]
    assert entries[0]["diagnosis"]["cause"] == "host_oom" and entries[0]["slurm_state"] == "OUT_OF_MEMORY"
    assert any("oom-kill" in text for text in entries[0]["logs"].values())
    same = cli(env, "replay", str(history))
    assert same.returncode == 0 and "0 of 2 decision(s) change under policy default" in same.stdout, same.stderr
    strict = cli(env, "replay", str(history), "--policy", "strict", "--fail-on-change")
    assert strict.returncode == 1, strict.stderr
    assert "1 of 2 decision(s) change under policy strict; nothing was executed" in strict.stdout
    assert "- line 2 task 0: resubmit" in strict.stdout and "allow [default:resubmit-within-bounds]" in strict.stdout
    assert (
        "+ line 2 task 0: resubmit" in strict.stdout
        and "needs_approval x1 [strict:resubmit-more-memory]" in strict.stdout
    )
    assert len(records(audit)) == 3 and not (sweep / "approvals").exists()  # replay changed nothing
