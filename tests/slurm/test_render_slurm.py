"""Rendered sbatch scripts on the real cluster: sbatch --test-only accepts every one, and
a script rendered into a shell-hostile directory runs the task and nothing else."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurmagent.render import render

pytestmark = pytest.mark.slurm

CASES = [
    ["+experiment=digits_mlp", "optim.lr=1e-3"],
    ["+experiment=synthetic", "resources.partition=gpu", "resources.gpus=2", "resources.gpu_type=t4"],
    ["task.target=null", "task.command=[python3,-c,'print(1)']", "resources.partition=high"],
    ["+name='x $(touch PWNED)'", "resources.nodes=2", "resources.constraint=cpu"],
]


@pytest.mark.parametrize("overrides", CASES)
def test_sbatch_test_only_accepts_rendered_scripts(slurm_conf: str, weird_tmp_path: Path, overrides: list[str]) -> None:
    out = render(overrides, weird_tmp_path / "run dir")
    proc = subprocess.run(
        ["sbatch", "--test-only", str(out.script)], capture_output=True, text=True, cwd=weird_tmp_path, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "to start at" in proc.stderr


def test_rendered_script_runs_in_hostile_directory(slurm_conf: str, weird_tmp_path: Path) -> None:
    out = render(
        ["+experiment=synthetic", "synthetic.steps=30", "synthetic.step_time_s=0", "+name='n $(touch PWNED)'"],
        weird_tmp_path / "r u n",
        python=sys.executable,
    )
    job = subprocess.run(
        ["sbatch", "--parsable", str(out.script)], capture_output=True, text=True, cwd=weird_tmp_path, check=True
    ).stdout.strip()
    deadline = time.monotonic() + 120
    state = ""
    while time.monotonic() < deadline:
        state = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-j", job, "-o", "State"], capture_output=True, text=True, check=True
        ).stdout.strip()
        if state in ("COMPLETED", "FAILED", "CANCELLED", "OUT_OF_MEMORY", "TIMEOUT"):
            break
        time.sleep(1)
    log = (weird_tmp_path / f"slurm-{job}.out").read_text()
    assert state == "COMPLETED", log
    manifest = out.run_dir / "checkpoints" / "manifest.json"
    assert '"step": 30' in manifest.read_text()
    assert not list(weird_tmp_path.parent.rglob("PWNED*"))
