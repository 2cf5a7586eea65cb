"""The README's commands and its runtime example work as written."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), flags=re.S)


def local_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}  # no Slurm: the local backend
    env.update(extra)
    return env


def test_readme_opens_with_exactly_two_setup_commands() -> None:
    first, second = blocks("bash")[:2]
    assert len(first.strip().splitlines()) == 1 and len(second.strip().splitlines()) == 1
    assert "python -m slurmagent +experiment=" in first and " -m " in first
    assert second.strip() == "bash tests/run"
    ci = (README.parent / ".ci" / "run").read_text()
    assert "exec bash tests/run" in ci


@pytest.mark.slow
def test_first_command_runs_the_sweep_locally(tmp_path: Path) -> None:
    first = blocks("bash")[0].strip()
    argv = shlex.split(first.split("&&")[-1])
    assert argv[:3] == [".venv/bin/python", "-m", "slurmagent"]
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [sys.executable, *argv[1:], f"hydra.sweep.dir={sweep}", "hydra.launcher.poll_interval_s=0.5"],
        cwd=tmp_path,
        env=local_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(
        subprocess.run(
            [sys.executable, "-m", "slurmagent", "status", str(sweep), "--json"],
            capture_output=True,
            text=True,
            env=local_env(),
            check=True,
        ).stdout
    )
    assert data["counts"] == {"COMPLETED": 6}
    assert all(t["result"]["val_acc"] > 0.8 for t in data["tasks"])


def test_runtime_example_runs(tmp_path: Path) -> None:
    code = blocks("python")[0]
    (tmp_path / "readme_example.py").write_text(code)
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "slurmagent", "task.target=readme_example:train", "+lr=0.1", f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        env=local_env(PYTHONPATH=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((run_dir / "checkpoints" / "manifest.json").read_text())
    assert [e["step"] for e in manifest["checkpoints"]] == [800, 900, 1000]
