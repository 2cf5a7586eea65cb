"""The test cluster itself, through the real Slurm commands and submitit."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import pytest
import submitit

pytestmark = pytest.mark.slurm
# the job functions below are defined in this test module, which the compute node cannot
# import: pickle them by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def slurm(*argv: str, timeout: float = 60) -> str:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"{argv}: {proc.stderr}"
    return proc.stdout


def wait_state(job_id: str, states: set[str], timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        out = slurm("sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State")
        last = out.strip().splitlines()[-1].split()[0] if out.strip() else ""
        if last in states:
            return last
        time.sleep(1)
    raise AssertionError(f"job {job_id} did not reach {states} in {timeout}s (last {last!r})")


def node_name() -> str:
    return os.environ["SLURMD_NODENAME"]


def test_cluster_shape(slurm_conf: str) -> None:
    out = slurm("sinfo", "-h", "-N", "-o", "%N|%G|%T")
    nodes = {ln.split("|")[0]: ln.split("|") for ln in out.splitlines()}
    assert len(nodes) >= 4
    gres = {ln.split("|")[1] for ln in out.splitlines()}
    assert {"gpu:a100:2", "gpu:t4:2"} <= gres
    assert all(ln.split("|")[2] in ("idle", "mixed", "allocated") for ln in out.splitlines())
    assert "slurmagent" in slurm("sacctmgr", "-n", "-P", "show", "cluster", "format=cluster")


def test_submitit_batch_job_returns_result(slurm_conf: str, tmp_path: Path) -> None:
    ex = submitit.SlurmExecutor(folder=tmp_path)
    ex.update_parameters(time=5, mem="200M", partition="low")
    job = ex.submit(node_name)
    assert job.result() in {"a100-1", "t4-1", "t4-2", "cpu-1", "cpu-2"}
    assert wait_state(str(job.job_id), {"COMPLETED"}) == "COMPLETED"


def test_two_node_job_spans_two_emulated_nodes(slurm_conf: str, tmp_path: Path) -> None:
    ex = submitit.SlurmExecutor(folder=tmp_path)
    ex.update_parameters(time=5, mem="200M", partition="low", nodes=2, ntasks_per_node=1, constraint="cpu")
    job = ex.submit(node_name)
    names = job.results()
    assert sorted(names) == ["cpu-1", "cpu-2"]


def test_low_priority_job_is_preempted_requeued_and_finishes(slurm_conf: str, tmp_path: Path) -> None:
    out = tmp_path / "low.out"
    script = tmp_path / "low.sh"
    # first run: waits to be preempted; after the requeue (SLURM_RESTART_COUNT=1) it finishes
    script.write_text(
        "#!/bin/bash\n"
        'echo "start restart=${SLURM_RESTART_COUNT:-0}"\n'
        'if [ "${SLURM_RESTART_COUNT:-0}" = "0" ]; then sleep 300; fi\n'
        'echo "done restart=${SLURM_RESTART_COUNT:-0}"\n'
    )
    low = slurm(
        "sbatch",
        "--parsable",
        "-p",
        "low",
        "-w",
        "cpu-2",
        "--exclusive",
        "--requeue",
        "--open-mode=append",
        "-o",
        str(out),
        "--time=10",
        str(script),
    ).strip()
    wait_state(low, {"RUNNING"})
    high = slurm(
        "sbatch",
        "--parsable",
        "-p",
        "high",
        "-w",
        "cpu-2",
        "--exclusive",
        "--time=5",
        "-o",
        "/dev/null",
        "--wrap",
        "sleep 2",
    ).strip()
    assert wait_state(high, {"COMPLETED"}, timeout=180) == "COMPLETED"
    assert wait_state(low, {"COMPLETED"}, timeout=180) == "COMPLETED"
    text = out.read_text()
    assert "start restart=0" in text and "done restart=1" in text, text
    history = slurm("sacct", "-X", "-n", "-P", "--duplicates", "-j", low, "-o", "State").split()
    assert history[-1] == "COMPLETED"
    assert {"PREEMPTED", "REQUEUED"} & set(history), history
