"""Failures that look like failures, on the real test cluster: a task that failed inside
Hydra ends FAILED in Slurm's accounting (non-zero exit); a stop signal while the job starts
is held, not fatal; a broken policy refuses the sweep with nothing submitted; a
requeued preemption is never shown as a failure (the multi-node and requeue tests watch
that too)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fault_cases import sweep_argv, wait_for

pytestmark = pytest.mark.slurm


def first_job(sweep: Path) -> str | None:
    try:
        attempts = json.loads((sweep / "sweep.json").read_text())["tasks"][0]["attempts"]
    except (OSError, ValueError, IndexError, KeyError):
        return None
    return str(attempts[0]["job_id"]) if attempts else None


def sacct(job: str, fields: str) -> list[str]:
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-D", "-j", job, "-o", fields], capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if line.strip()]


def test_a_failure_hydra_caught_is_failed_in_slurms_accounting(slurm_conf: str, tmp_path: Path) -> None:
    (tmp_path / "boom.py").write_text("def train(cfg):\n    raise RuntimeError('disk full')\n")
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        sweep_argv(sweep, "task.target=boom:train", "cluster=slurm", "recovery.max_attempts=1"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr
    job = first_job(sweep)
    assert job is not None
    rows = wait_for(
        lambda: [r for r in sacct(job, "State,ExitCode") if not r.startswith(("RUNNING", "PENDING"))],
        "accounting to show the job ended",
        60,
        interval=0.05,
    )
    state, exit_code = rows[-1].split("|")
    assert state == "FAILED" and exit_code != "0:0", rows  # sacct, mail and afterok dependencies see a failure
    log = (sweep / ".submitit" / f"{job}_0_log.err").read_text()
    assert "RuntimeError: disk full" in log


def test_a_stop_signal_while_the_job_starts_is_held_not_fatal(slurm_conf: str, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    launcher = subprocess.Popen(
        sweep_argv(sweep, "+experiment=synthetic", "synthetic.steps=30", "synthetic.step_time_s=0.1"),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        job = wait_for(lambda: first_job(sweep), "the task's job id", 120, interval=0.05)
        # the time-limit warning while submitit loads the task (Hydra's set-up: no handler of the
        # runtime's yet); job/boot.py holds it from the process's first line
        log = sweep / ".submitit" / f"{job}_0_log.out"
        wait_for(
            lambda: log.exists() and "Starting with JobEnvironment" in log.read_text(),
            "submitit's start",
            120,
            interval=0.05,
        )
        subprocess.run(["scancel", "--signal=USR2", job], check=True)
        _, err = launcher.communicate(timeout=240)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, err
    (task,) = json.loads((sweep / "sweep.json").read_text())["tasks"]
    assert task["state"] == "COMPLETED" and task["diagnosis"] is None, task
    result = task["result"]
    assert result["attempt"] == 2 and result["steps_run_here"] == 30 - (result["resumed_from"] or 0)
    states = wait_for(
        lambda: (st := [r.split("|")[0] for r in sacct(job, "State")]) and st[-1] != "RUNNING" and st,
        "accounting to record the job's end",
        60,
        interval=0.05,
    )
    assert "REQUEUED" in states and states[-1] == "COMPLETED", states


def test_a_broken_policy_refuses_the_sweep_with_nothing_submitted(slurm_conf: str, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "policy.yaml").write_text("name: mine\nrules:\n  - {name: r, action: resubmitt, decision: allow}\n")
    proc = subprocess.run(
        sweep_argv(sweep, "+experiment=synthetic", "cluster=slurm"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert "resubmitt" in proc.stderr and "nothing was submitted" in proc.stderr
    assert not (sweep / "sweep.json").exists() and not (sweep / ".submitit").exists()


SICK = '''
import os, time
from slurmagent.config import CheckpointConf, HealthConf
from slurmagent.runtime import StepLoop, current
from slurmagent.runtime.health import HealthMonitor


def train(cfg):
    """A step loop with the runtime health check. No NVIDIA GPU here: recorded readings stand
    in for NVML (a fake GPU): a broken GPU on {bad}, a healthy one elsewhere."""
    ctx = current()
    node = os.environ["SLURMD_NODENAME"]
    readings = "{data}/broken.json" if node == "{bad}" else "{data}/healthy.json"
    state = {{"n": 0}}

    class S:
        def state_dict(self):
            return dict(state)

        def load_state_dict(self, s):
            state.update(s)

    health = HealthMonitor(ctx, HealthConf(1.0, inputs={{"readings_file": readings, "gpus": [0]}}))
    loop = StepLoop(ctx, S(), 30, CheckpointConf(every_steps=1000), health=health)
    for _ in loop:
        state["n"] += 1
        time.sleep(0.1)
    return {{"node": node, "n": state["n"], "resumed_from": loop.restored_from}}
'''


def test_a_task_that_moved_off_a_sick_node_says_so_in_status(slurm_conf: str, tmp_path: Path) -> None:
    from test_prolog_slurm import BAD_NODE, DATA, occupy_other_t4

    (tmp_path / "sick.py").write_text(SICK.format(bad=BAD_NODE, data=DATA))
    sweep = tmp_path / "sweep"
    occupy_other_t4(tmp_path)  # the task starts on the sick node
    proc = subprocess.run(
        sweep_argv(
            sweep,
            "task.target=sick:train",
            "cluster=slurm",
            "resources.partition=gpu",
            "resources.gpus=1",
            "resources.gpu_type=t4",
        ),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    status = subprocess.run(
        [sys.executable, "-m", "slurmagent", "status", str(sweep), "--json"], capture_output=True, text=True, check=True
    )
    (task,) = json.loads(status.stdout)["tasks"]
    assert task["state"] == "COMPLETED" and task["result"]["node"] != BAD_NODE and task["result"]["n"] == 30
    assert task["health"].startswith(f"moved off {BAD_NODE} at step "), task["health"]
    assert "health CRITICAL: GPU 0" in task["health"]
