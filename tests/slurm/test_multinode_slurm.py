"""Multi-node exact resume on the real cluster: a 2-node torch.distributed (gloo) job whose
ranks each draw their own random numbers (dropout, input noise), preempted by a
high-priority job, stops on every rank at the same step, rank 0 writes the checkpoint with
every rank's RNG state, and the requeued job ends with the same parameters as a run never
stopped — on the same pair of nodes, or on another pair."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from fault_cases import sweep_argv

pytestmark = pytest.mark.slurm

DDP = ["+experiment=ddp_gloo", "ddp.steps=300", "checkpoint.every_steps=0"]  # only the stop checkpoint


def sweep(tmp_path: Path, name: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        sweep_argv(tmp_path / name, *DDP, *extra),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def task(tmp_path: Path, name: str) -> dict[str, Any]:
    return json.loads((tmp_path / name / "sweep.json").read_text())["tasks"][0]  # type: ignore[no-any-return]


def squeue_state(job_id: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True).stdout.strip()


def preempt_ddp(tmp_path: Path, move_to: str | None = None) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """A 2-node run on cpu-[1-2] preempted mid-run by a high-priority job (requeued: Slurm's
    PreemptMode=REQUEUE), beside a reference run never stopped on t4-[1-2]; `move_to` sends
    the requeued job to other nodes while it waits. (job id, its result, the reference's)."""
    ref = sweep(tmp_path, "ref", "resources.partition=gpu", "+resources.extra.nodelist='t4-[1-2]'")
    pre = sweep(
        tmp_path, "pre", "ddp.step_delay_s=0.05", "resources.partition=low", "+resources.extra.nodelist='cpu-[1-2]'"
    )
    try:
        deadline = time.monotonic() + 120
        # the task is in sweep.json before its submission, then its job id
        while time.monotonic() < deadline and not (
            (tmp_path / "pre" / "sweep.json").exists() and task(tmp_path, "pre")["attempts"]
        ):
            assert pre.poll() is None, pre.communicate()[1]
            time.sleep(0.2)
        job_id = task(tmp_path, "pre")["attempts"][0]["job_id"]
        metrics = tmp_path / "pre" / "0" / "metrics.jsonl"
        while time.monotonic() < deadline:  # preempt mid-run
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 130:
                break
            time.sleep(0.2)
        subprocess.run(
            ["sbatch", "-p", "high", "-w", "cpu-1", "--exclusive", "--time=2", "-o", "/dev/null", "--wrap", "sleep 1"],
            check=True,
            capture_output=True,
        )
        if move_to is not None:
            while squeue_state(job_id) != "PENDING" and time.monotonic() < deadline + 60:
                time.sleep(0.2)
            # as an administrator (or a recovery) would: run the waiting job elsewhere
            subprocess.run(
                ["scontrol", "update", f"JobId={job_id}", f"ReqNodeList={move_to}", "ExcNodeList=cpu-[1-2]"],
                check=True,
                capture_output=True,
            )
        _, err = pre.communicate(timeout=300)
        assert pre.returncode == 0, err
        _, err = ref.communicate(timeout=120)
        assert ref.returncode == 0, err
    finally:
        pre.kill()
        ref.kill()
    return job_id, task(tmp_path, "pre")["result"], task(tmp_path, "ref")["result"]


def runs_of(job_id: str) -> list[str]:
    return subprocess.run(
        ["sacct", "-X", "-n", "-P", "--duplicates", "-j", job_id, "-o", "State,NodeList"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()


def test_two_node_gloo_job_preempted_resumes_exactly(slurm_conf: str, tmp_path: Path) -> None:
    job_id, got, want = preempt_ddp(tmp_path)
    assert got["world_size"] == want["world_size"] == 2
    assert got["attempt"] == 2
    resumed = got["resumed_from"]
    assert (
        resumed is not None and 130 <= resumed < 300 and resumed % 100 != 0
    )  # the stop checkpoint, not a periodic one
    assert got["state_hash"] == want["state_hash"]  # bit-identical parameters
    # each rank logged the step it stopped at: the same one, the one rank 0's checkpoint holds
    stops = {}
    for rank in (0, 1):
        log = (tmp_path / "pre" / ".submitit" / f"{job_id}_{rank}_log.out").read_text()
        found = re.findall(r"stop checkpoint at step (\d+)", log)
        assert found, f"rank {rank} did not log its stop:\n{log[-2000:]}"
        stops[rank] = int(found[0])
    assert stops == {0: resumed, 1: resumed}
    assert any(h.startswith("PREEMPTED|cpu-[1-2]") for h in runs_of(job_id)), runs_of(job_id)


def test_two_node_gloo_job_resumes_exactly_on_another_pair_of_nodes(slurm_conf: str, tmp_path: Path) -> None:
    job_id, got, want = preempt_ddp(tmp_path, move_to="a100-1,t4-2")
    assert got["attempt"] == 2 and got["resumed_from"] is not None and got["resumed_from"] >= 130
    assert got["state_hash"] == want["state_hash"]  # bit-identical, on other nodes
    history = runs_of(job_id)
    # (accounting may still show the last run RUNNING for a moment: its nodes are what counts)
    assert history[0].startswith("PREEMPTED|cpu-[1-2]") and history[-1].endswith("|a100-1,t4-2"), history
