"""The time limit on the real cluster: Slurm's warning signal (USR2 ahead of the limit)
is told apart from preemption by the job's own time left; beyond the bound on time-limit
requeues (0 here, to keep the test short: the counting is a unit test) the supervisor
resubmits it with a longer time limit, and the run ends with the same result as one
never interrupted."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

STEPS = 450  # 45 s of work: more than Slurm lets the first attempt run before its warning


def uninterrupted_digest(steps: int) -> str:
    """The synthetic example's state after `steps` steps (its definition, run here)."""
    digest = hashlib.sha256(b"start").hexdigest()
    for step in range(steps):
        digest = hashlib.sha256(f"{digest}:{step}".encode()).hexdigest()
    return digest


def test_time_limit_requeues_within_bound_then_resubmits_with_more_time(slurm_conf: str, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurmagent",
            "-m",
            "+experiment=synthetic",
            f"synthetic.steps={STEPS}",
            "synthetic.step_time_s=0.1",
            "checkpoint.every_steps=1000",
            "resources.time='00:01:00'",  # one minute: Slurm's smallest limit
            "resources.partition=low",
            # USR2 20 s before the limit; slurmctld checks every 30 s, so it comes 10-40 s into the job
            "recovery.signal_delay_s=20",
            "recovery.max_time_limit_requeues=0",  # no requeue at the limit: resubmit with more time at once
            f"hydra.sweep.dir={sweep}",
            "hydra.launcher.poll_interval_s=1",
            "hydra.launcher.max_poll_interval_s=2",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr
    task = json.loads((sweep / "sweep.json").read_text())["tasks"][0]
    assert task["state"] == "COMPLETED"
    assert task["result"]["digest"] == uninterrupted_digest(STEPS)
    first, last = task["attempts"][0], task["attempts"][-1]
    assert len(task["attempts"]) == 2 and first["state"] == "FAILED" and last["state"] == "COMPLETED"
    assert task["spec"]["resources"]["time"] == "00:02:00"
    records = [json.loads(x) for x in (sweep / "audit.jsonl").read_text().splitlines()]
    assert [(r["type"], r["action"]) for r in records] == [("decision", "resubmit"), ("outcome", "resubmit")]
    assert records[0]["params"] == {"time": ["00:01:00", "00:02:00"]}
    assert any("time limit reached 1 times" in e["text"] for e in records[0]["evidence"]), records[0]["evidence"]
    assert records[1]["metrics_after"]["job_id"] == last["job_id"]
    assert task["result"]["resumed_from"] and task["result"]["resumed_from"] > 0
