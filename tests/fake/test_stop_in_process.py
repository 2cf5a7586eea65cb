"""The job's stop decision (`slurmagent.job.stop.handle_stop`) against the fake Slurm, in
process: the seam's runner is the fake, the job a real process it runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from slurmagent.config import RecoveryConf
from slurmagent.errors import TaskFailedError
from slurmagent.job.stop import handle_stop
from slurmagent.runtime.context import JobContext, context_from_env
from slurmagent.runtime.health import STOP_RECORD
from slurmagent.runtime.loop import StopForRequeue
from slurmagent.slurm.seam import SlurmCLI
from tests.conftest import audit_records
from tests.fake.fake_slurm import FakeSlurm

SCRIPT = """#!/bin/bash
#SBATCH --time=1
#SBATCH --signal=USR2@60
#SBATCH --requeue
#SBATCH --output={out}/job-%j.out
srun sleep 60
"""


def running_job(fake: FakeSlurm, tmp_path: Path) -> tuple[SlurmCLI, JobContext]:
    script = tmp_path / "job.sh"
    script.write_text(SCRIPT.format(out=tmp_path))
    slurm = SlurmCLI(runner=fake)
    job_id = slurm.submit(script)
    node = fake.wait(job_id, ("RUNNING",))["node"]
    env = {"SLURM_JOB_ID": job_id, "SLURMD_NODENAME": node, "SLURMAGENT_BACKEND": "slurm"}
    (tmp_path / "out").mkdir()
    return slurm, context_from_env(env, output_dir=tmp_path / "out")


def audit(ctx: JobContext) -> list[tuple[str, str, str]]:
    return [(r["type"], r["action"], r["decision"]) for r in audit_records(ctx.output_dir / "audit.jsonl")]


def test_time_limit_requeues_through_the_gate_within_its_bound(fake: FakeSlurm, tmp_path: Path) -> None:
    slurm, ctx = running_job(fake, tmp_path)
    usr2 = StopForRequeue(signal.SIGUSR2, 5, (signal.SIGUSR2,))
    handle_stop(ctx, usr2, RecoveryConf(max_time_limit_requeues=1), slurm)  # 1 min limit: within the lead
    assert ["scontrol", "requeue", ctx.job_id] in fake.calls
    assert fake.job(str(ctx.job_id))["runs"][0][0] == "REQUEUED"
    assert audit(ctx) == [("decision", "requeue", "allow"), ("outcome", "requeue", "allow")]
    fake.wait(str(ctx.job_id), ("RUNNING",))  # the same job runs again
    with pytest.raises(TaskFailedError, match="time limit reached 2 times"):
        handle_stop(ctx, usr2, RecoveryConf(max_time_limit_requeues=1), slurm)


def test_sigterm_means_slurm_is_ending_the_job_and_nothing_is_requeued(fake: FakeSlurm, tmp_path: Path) -> None:
    slurm, ctx = running_job(fake, tmp_path)
    handle_stop(ctx, StopForRequeue(signal.SIGTERM, 5, (signal.SIGCONT, signal.SIGTERM)), RecoveryConf(), slurm)
    assert not [c for c in fake.calls if c[:2] == ["scontrol", "requeue"]]
    assert not (ctx.output_dir / "audit.jsonl").exists()


def test_critical_health_requeues_the_job_away_from_its_node(fake: FakeSlurm, tmp_path: Path) -> None:
    slurm, ctx = running_job(fake, tmp_path)
    (ctx.output_dir / STOP_RECORD).write_text(json.dumps({"node": ctx.node, "reasons": ["GPU 0: ECC errors"]}))
    handle_stop(ctx, StopForRequeue(0, 7, reason="health"), RecoveryConf(), slurm)
    job = fake.job(str(ctx.job_id))
    assert job["runs"] == [["REQUEUED", ctx.node]] and job["exclude"] == ctx.node
    record = json.loads((ctx.output_dir / STOP_RECORD).read_text())
    assert record["requeued"] is True and record["excluded"] == ctx.node
    assert audit(ctx) == [
        ("decision", "requeue", "allow"),
        ("outcome", "requeue", "allow"),
        ("decision", "exclude_node", "allow"),
        ("outcome", "exclude_node", "allow"),
    ]
    assert fake.wait(str(ctx.job_id), ("RUNNING",))["node"] != ctx.node  # its next run is elsewhere


def test_the_job_survives_its_own_requeue_signal_until_every_action_is_done(fake: FakeSlurm, tmp_path: Path) -> None:
    """Slurm signals a job as soon as it is requeued; `handle_stop` runs after the loop gave
    its handlers back, so it holds the stop signals itself until the node is excluded too."""
    _, ctx = running_job(fake, tmp_path)
    (ctx.output_dir / STOP_RECORD).write_text(json.dumps({"node": ctx.node, "reasons": ["GPU 0: ECC errors"]}))

    def slurm_signals_us(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        out = fake(argv, timeout)
        if argv[:2] == ["scontrol", "requeue"]:
            os.kill(os.getpid(), signal.SIGTERM)  # what Slurm does to the requeued job's processes
        return out

    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as in a job whose loop restored the default
    try:
        handle_stop(ctx, StopForRequeue(0, 7, reason="health"), RecoveryConf(), SlurmCLI(runner=slurm_signals_us))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert fake.job(str(ctx.job_id))["exclude"] == ctx.node  # still alive after the requeue: it excluded the node
