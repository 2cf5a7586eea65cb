"""A task that dies without a result and may not be retried: its summary names Slurm's
state, the bound that stopped it, and its last stderr."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm


def test_oom_killed_task_is_summarised_with_state_and_stderr(slurm_conf: str, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    hog = "import time; x = bytearray(700 * 2**20); time.sleep(5)"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurmagent",
            "-m",
            "task.target=null",
            f"task.command=[python3,-c,'{hog}']",
            "resources.mem=200M",
            "recovery.max_attempts=1",
            f"hydra.sweep.dir={sweep}",
            "hydra.launcher.poll_interval_s=1",
            "hydra.launcher.max_poll_interval_s=2",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1
    task = json.loads((sweep / "sweep.json").read_text())["tasks"][0]
    assert task["state"] == "OUT_OF_MEMORY", task
    assert "OUT_OF_MEMORY" in task["error"] and "oom-kill" in task["error"]
    assert "gave up after 1 attempt(s) (recovery.max_attempts=1)" in task["error"]
    assert "OUT_OF_MEMORY" in proc.stderr  # the launcher's summary says it too
