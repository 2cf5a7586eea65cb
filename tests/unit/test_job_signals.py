"""The job's own stop signals after its task has returned (slurmagent/job/task.py `run_in_job`):
held until the process exits, so that a late stop (the time limit's warning just as the task
ended) cannot kill a finished job and make Slurm record its run as FAILED."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

LATE_STOP = r"""
import os, signal
from omegaconf import OmegaConf
os.environ["SLURMAGENT_BACKEND"] = "local"  # a job's process: the job layer owns its stop signals
from slurmagent.job.task import run_in_job
run_in_job(OmegaConf.create({"task": {"target": "m:f"}}), lambda spec, ctx: None)
os.kill(os.getpid(), signal.SIGUSR2)  # the time limit's warning, as the task has just returned
os.kill(os.getpid(), signal.SIGTERM)
print("exited as a finished job does", flush=True)
"""


def test_a_stop_signal_after_the_task_returned_does_not_kill_the_finished_job(tmp_path: Path) -> None:
    """Before: the handlers restored to the default, a late warning killed the process before it
    exited, and Slurm recorded the finished run as FAILED (seen once in the --time-min cluster test)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "SLURMAGENT_"))}
    out = subprocess.run([sys.executable, "-c", LATE_STOP], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "exited as a finished job does" in out.stdout, (out.returncode, out.stderr)
