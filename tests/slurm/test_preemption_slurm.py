"""Exact resume on the real cluster: the digits example preempted three times by
high-priority jobs ends with bit-identical parameters to a run that never stopped."""

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

DIGITS = ["+experiment=digits_mlp", "train.steps=1000", "checkpoint.every_steps=5000"]
NODE = "cpu-2"


def run_sweep(tmp_path: Path, name: str, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "slurmagent",
            "-m",
            *DIGITS,
            *extra,
            f"hydra.sweep.dir={tmp_path / name}",
            "hydra.launcher.poll_interval_s=1",
            "hydra.launcher.max_poll_interval_s=2",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def result(tmp_path: Path, name: str) -> dict[str, Any]:
    return json.loads((tmp_path / name / "sweep.json").read_text())["tasks"][0]  # type: ignore[no-any-return]


def job_state(job_id: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True).stdout.strip()


def test_digits_preempted_three_times_matches_uninterrupted(slurm_conf: str, tmp_path: Path) -> None:
    local_env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    reference = run_sweep(tmp_path, "ref", "cluster=local", env=local_env)
    preempted = run_sweep(
        tmp_path, "pre", "train.step_delay_s=0.05", "resources.partition=low", f"+resources.extra.nodelist={NODE}"
    )
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "pre" / "sweep.json").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        job_id = result(tmp_path, "pre")["attempts"][0]["job_id"]
        preemptions = 0
        deadline = time.monotonic() + 400
        while preemptions < 3 and time.monotonic() < deadline:
            if job_state(job_id) != "RUNNING":
                time.sleep(0.5)
                continue
            # preempt mid-training: wait until this run has reported new steps
            metrics = tmp_path / "pre" / "0" / "metrics.jsonl"
            seen = len(metrics.read_text().splitlines()) if metrics.exists() else 0
            while time.monotonic() < deadline:
                now = len(metrics.read_text().splitlines()) if metrics.exists() else 0
                if now >= seen + 20:
                    break
                time.sleep(0.3)
            # a high-priority job that needs the whole node preempts (requeues) the low one
            subprocess.run(
                ["sbatch", "-p", "high", "-w", NODE, "--exclusive", "--time=2", "-o", "/dev/null", "--wrap", "sleep 1"],
                check=True,
                capture_output=True,
            )
            preemptions += 1
            while job_state(job_id) == "RUNNING" and time.monotonic() < deadline:
                time.sleep(0.5)
        assert preemptions == 3
        _, err = preempted.communicate(timeout=400)
        assert preempted.returncode == 0, err
        reference.communicate(timeout=300)
        assert reference.returncode == 0
    finally:
        preempted.kill()
        reference.kill()
    got, want = result(tmp_path, "pre")["result"], result(tmp_path, "ref")["result"]
    assert got["attempt"] == 4 and got["resumed_from"] and got["resumed_from"] < 1000
    assert got["state_hash"] == want["state_hash"]  # bit-identical parameters
    assert got["val_acc"] == want["val_acc"]
    history: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the result is written just before the job ends
        out = subprocess.run(
            ["sacct", "-X", "-n", "-P", "--duplicates", "-j", job_id, "-o", "State"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        history = out.split()
        if history and history[-1] == "COMPLETED":
            break
        time.sleep(1)
    assert history.count("PREEMPTED") >= 3 and history[-1] == "COMPLETED", history
