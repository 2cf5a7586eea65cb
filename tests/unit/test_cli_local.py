"""The CLI end to end on the local backend (no Slurm reachable): real processes, real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def cli(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}  # no Slurm config: as on a laptop
    return subprocess.run(
        [sys.executable, "-m", "slurmagent", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_local_sweep_returns_results_and_status_json(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc = cli(
        [
            "+experiment=synthetic",
            "-m",
            "synthetic.steps=5,7",
            "synthetic.step_time_s=0",
            f"hydra.sweep.dir={sweep}",
            "hydra.launcher.poll_interval_s=0.2",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "2 COMPLETED" in proc.stderr
    status = cli(["status", str(sweep), "--json"], tmp_path)
    data = json.loads(status.stdout)
    assert data["backend"] == "local" and data["done"]
    assert sorted(t["result"]["steps"] for t in data["tasks"]) == [5, 7]
    assert all(t["state"] == "COMPLETED" and t["attempts"] for t in data["tasks"])
    # checkpoints went through the runtime into each task's own directory
    assert (sweep / "0" / "checkpoints" / "manifest.json").exists()


def test_unknown_key_is_refused_and_nothing_is_submitted(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc = cli(["-m", "+resources.gpu=1", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert proc.returncode == 2
    assert "unknown key resources.gpu; valid keys of resources:" in proc.stderr
    assert "gpu_type" in proc.stderr and "Traceback" not in proc.stderr
    assert not (sweep / "sweep.json").exists() and not (sweep / ".submitit").exists()


def test_failed_task_is_reported_with_its_reason(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    script = tmp_path / "fail.py"
    script.write_text("import sys\nprint('data/train/ has no JPEG files', file=sys.stderr)\nsys.exit(3)\n")
    proc = cli(
        [
            "-m",
            "task.target=null",
            f"task.command=[{sys.executable},{script}]",
            f"hydra.sweep.dir={sweep}",
            "hydra.launcher.poll_interval_s=0.2",
        ],
        tmp_path,
    )
    assert proc.returncode == 1
    assert "exited with code 3" in proc.stderr and "data/train/ has no JPEG files" in proc.stderr
    data = json.loads(cli(["status", str(sweep), "--json"], tmp_path).stdout)
    assert data["tasks"][0]["state"] == "FAILED"
    assert data["tasks"][0]["diagnosis"]["cause"] == "crash"
    doctor = cli(["doctor", str(sweep)], tmp_path)
    assert doctor.returncode == 1  # there is a failure to report
    assert "task 0" in doctor.stdout and "cause: crash; retryable: False" in doctor.stdout
    assert "exited with code 3" in doctor.stdout


def test_command_mode_gets_context_and_returns_result_json(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    script = tmp_path / "train.py"
    script.write_text(
        "import json, os\n"
        "out = os.environ['SLURMAGENT_OUTPUT_DIR']\n"
        "ctx = {k: v for k, v in os.environ.items() if k.startswith('SLURMAGENT_')}\n"
        "json.dump({'ckpt': ctx['SLURMAGENT_CHECKPOINT_DIR'], 'attempt': ctx['SLURMAGENT_ATTEMPT']},"
        " open(os.path.join(out, 'result.json'), 'w'))\n"
    )
    proc = cli(
        [
            "-m",
            "task.target=null",
            f"task.command=[{sys.executable},{script}]",
            f"hydra.sweep.dir={sweep}",
            "hydra.launcher.poll_interval_s=0.2",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(cli(["status", str(sweep), "--json"], tmp_path).stdout)
    assert data["tasks"][0]["result"] == {"ckpt": str(sweep / "0" / "checkpoints"), "attempt": "1"}


@pytest.mark.parametrize("args", [["--help"], ["--info", "plugins"]])
def test_hydra_flags_pass_through(tmp_path: Path, args: list[str]) -> None:
    proc = cli(args, tmp_path)
    assert proc.returncode == 0, proc.stderr
    if "plugins" in args:
        assert "SlurmAgentLauncher" in proc.stdout


def test_subcommand_errors_are_one_line(tmp_path: Path) -> None:
    proc = cli(["status", str(tmp_path / "nope")], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("slurmagent: error:") and "no sweep.json" in proc.stderr
