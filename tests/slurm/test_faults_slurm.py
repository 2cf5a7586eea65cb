"""Fault injection on the real cluster: each fault is real (a cgroup OOM kill, a missing
file, a crashing program); the supervisor diagnoses it, and recovers through the action
gate or stops with one clear sentence."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slurm

POLL = ["hydra.launcher.poll_interval_s=1", "hydra.launcher.max_poll_interval_s=2"]


def sweep_run(tmp_path: Path, *overrides: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [sys.executable, "-m", "slurmagent", "-m", *overrides, f"hydra.sweep.dir={sweep}", *POLL],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc, json.loads((sweep / "sweep.json").read_text())


def audit(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "sweep" / "audit.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_host_oom_is_resubmitted_with_more_memory_and_finishes(slurm_conf: str, tmp_path: Path) -> None:
    proc, state = sweep_run(
        tmp_path,
        "+experiment=synthetic",
        "synthetic.steps=20",
        "synthetic.step_time_s=0.05",
        "synthetic.alloc_mb=300",
        "resources.mem=256M",
    )
    assert proc.returncode == 0, proc.stderr
    task = state["tasks"][0]
    assert task["state"] == "COMPLETED" and task["result"]["steps"] == 20
    assert task["attempts"][0]["state"] == "OUT_OF_MEMORY" and len(task["attempts"]) == 2
    assert task["spec"]["resources"]["mem"] == "384M"
    records = audit(tmp_path)
    assert [r["type"] for r in records[:2]] == ["decision", "outcome"]
    decision = records[0]
    assert decision["action"] == "resubmit" and decision["decision"] == "allow"
    assert decision["params"] == {"mem": ["256M", "384M"]}
    assert any("oom-kill" in e["text"] for e in decision["evidence"]), decision["evidence"]
    assert records[1]["ok"] and records[1]["metrics_after"]["job_id"] == task["attempts"][1]["job_id"]


def test_missing_data_file_is_diagnosed_not_retried(slurm_conf: str, tmp_path: Path) -> None:
    code = "open('/nonexistent/data/train/labels.csv')"
    proc, state = sweep_run(tmp_path, "task.target=null", f'task.command=[python3,-c,"{code}"]')
    assert proc.returncode == 1
    task = state["tasks"][0]
    assert task["state"] == "FAILED" and len(task["attempts"]) == 1
    assert task["diagnosis"]["cause"] == "missing_path" and not task["diagnosis"]["retryable"]
    assert "The path '/nonexistent/data/train/labels.csv' does not exist" in task["error"]
    assert "Not retried" in proc.stderr or "Not retried" in task["error"]
    assert audit(tmp_path) == []  # nothing automated happened
    doctor = subprocess.run(
        [sys.executable, "-m", "slurmagent", "doctor", task["attempts"][-1]["job_id"]],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "cause: missing_path; retryable: False" in doctor.stdout, doctor.stdout + doctor.stderr


def test_code_that_always_crashes_ends_after_one_attempt(slurm_conf: str, tmp_path: Path) -> None:
    code = "raise ValueError('shape mismatch: (64, 10) vs (64, 12)')"
    proc, state = sweep_run(tmp_path, "task.target=null", f'task.command=[python3,-c,"{code}"]')
    assert proc.returncode == 1
    task = state["tasks"][0]
    assert task["state"] == "FAILED" and len(task["attempts"]) == 1
    assert task["diagnosis"]["cause"] == "crash"
    assert "ValueError: shape mismatch" in task["error"]
