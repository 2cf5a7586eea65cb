"""A job whose own requeue Slurm refuses (a `--no-requeue` job: `recovery.requeue=false`; Slurm
22.05 answers "Requested operation is presently disabled for job N", seen on the test cluster by
bench/fault_campaign.py): the stop ends the job with a sentence the supervisor's diagnosis knows,
so recovery resubmits it to resume from the stop checkpoint. Was: the job ended FAILED without a
word, diagnosed "crash: no error message in its logs", not retried."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from slurmagent.config import RecoveryConf, job_spec
from slurmagent.errors import TaskFailedError
from slurmagent.job.stop import handle_stop
from slurmagent.recovery import Resubmit, diagnose, plan
from slurmagent.runtime.context import JobContext, context_from_env
from slurmagent.runtime.loop import StopForRequeue
from slurmagent.slurm.seam import SlurmCLI
from tests.fake.fake_slurm import FakeSlurm

SCRIPT = """#!/bin/bash
#SBATCH --time={minutes}
#SBATCH --signal=USR2@60
#SBATCH --no-requeue
#SBATCH --output={out}/job-%j.out
srun sleep 60
"""


# what scontrol says in a container without munge's socket (the test cluster's podman overlay)
NO_MUNGE = (
    "scontrol: error: If munged is up, restart with --num-threads=10\n"
    'scontrol: error: Munge encode failed: Failed to access "/run/munge/munge.socket.2": Connection refused\n'
    "scontrol: error: slurm_send_node_msg: auth_g_create: REQUEST_JOB_REQUEUE has authentication error\n"
)


def refusing(fake: FakeSlurm, message: str = "") -> SlurmCLI:
    """The fake Slurm, except that `scontrol requeue` is refused as real Slurm refuses it for a
    job submitted with --no-requeue (or with `message`)."""

    def runner(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        if argv[:2] == ["scontrol", "requeue"]:
            msg = message or f"Requested operation is presently disabled for job {argv[2]}\n"
            return subprocess.CompletedProcess(argv, 1, "", msg)
        return fake(argv, timeout)

    return SlurmCLI(runner=runner)


def running_job(fake: FakeSlurm, tmp_path: Path, minutes: int) -> tuple[SlurmCLI, JobContext]:
    script = tmp_path / "job.sh"
    script.write_text(SCRIPT.format(out=tmp_path, minutes=minutes))
    job_id = SlurmCLI(runner=fake).submit(script)
    node = fake.wait(job_id, ("RUNNING",))["node"]
    env = {"SLURM_JOB_ID": job_id, "SLURMD_NODENAME": node, "SLURMAGENT_BACKEND": "slurm"}
    (tmp_path / "out").mkdir()
    return refusing(fake), context_from_env(env, output_dir=tmp_path / "out")


def test_a_time_limit_stop_that_cannot_requeue_is_resubmitted_with_more_time(fake: FakeSlurm, tmp_path: Path) -> None:
    slurm, ctx = running_job(fake, tmp_path, minutes=1)  # 1 minute: the USR2 is the time limit's warning
    with pytest.raises(TaskFailedError) as err:
        handle_stop(ctx, StopForRequeue(signal.SIGUSR2, 65, (signal.SIGUSR2,)), RecoveryConf(), slurm)
    text = f"FAILED: TaskFailedError: {err.value}"  # the task's error, as the supervisor records it
    assert "presently disabled" in text and "checkpoint at step 65" in text, text
    diag = diagnose("FAILED", {"task error": text})
    assert (diag.cause, diag.retryable) == ("time_limit", True), diag
    assert "could not requeue itself" in diag.summary and "presently disabled" in diag.summary
    step = plan(job_spec({"task": {"target": "a:b"}, "resources": {"time": "00:01:00"}}), 1, diag, "cpu-1", None)
    assert isinstance(step, Resubmit) and step.changes == {"time": ("00:01:00", "00:02:00")}
    # recovery off (max_attempts=1): the task ends on the same cause, in one sentence
    off = plan(job_spec({"task": {"target": "a:b"}, "recovery": {"max_attempts": 1}}), 1, diag, "cpu-1", None)
    assert not isinstance(off, Resubmit) and "could not requeue itself" in off.reason


def test_a_signal_stop_that_cannot_requeue_is_resubmitted_unchanged(fake: FakeSlurm, tmp_path: Path) -> None:
    slurm, ctx = running_job(fake, tmp_path, minutes=30)  # time to spare: a person's scancel --signal=USR2
    with pytest.raises(TaskFailedError) as err:
        handle_stop(ctx, StopForRequeue(signal.SIGUSR2, 12, (signal.SIGUSR2,)), RecoveryConf(), slurm)
    diag = diagnose("FAILED", {"task error": str(err.value)})
    assert (diag.cause, diag.retryable) == ("requeue_failed", True), diag
    step = plan(job_spec({"task": {"target": "a:b"}}), 1, diag, "cpu-1", None)
    assert isinstance(step, Resubmit) and step.changes == {}


def test_a_requeue_slurm_takes_still_just_stops_the_job(fake: FakeSlurm, tmp_path: Path) -> None:
    """The usual path is unchanged: the requeue is done, the job stops for its next run."""
    _, ctx = running_job(fake, tmp_path, minutes=1)
    handle_stop(ctx, StopForRequeue(signal.SIGUSR2, 5, (signal.SIGUSR2,)), RecoveryConf(), SlurmCLI(runner=fake))
    assert fake.job(str(ctx.job_id))["runs"][0][0] == "REQUEUED"


def test_a_refusal_of_many_lines_is_still_diagnosed(fake: FakeSlurm, tmp_path: Path) -> None:
    """scontrol's errors span lines (munge unreachable: three); the job's sentence keeps them on one,
    so the diagnosis still finds it. Was: "crash", not retried."""
    _, ctx = running_job(fake, tmp_path, minutes=30)
    with pytest.raises(TaskFailedError) as err:
        handle_stop(
            ctx, StopForRequeue(signal.SIGUSR2, 12, (signal.SIGUSR2,)), RecoveryConf(), refusing(fake, NO_MUNGE)
        )
    assert "\n" not in str(err.value) and "Connection refused" in str(err.value)
    diag = diagnose("FAILED", {"task error": f"FAILED: TaskFailedError: {err.value}"})
    assert (diag.cause, diag.retryable) == ("requeue_failed", True), diag
