"""The built wheel, installed into a fresh virtual environment, works on its own: configs,
templates and skills are inside it, Hydra finds the launcher, the console script runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import built_once

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, project_root: Path) -> Path:
    """The wheel built and installed once per test run (setuptools builds inside the source
    tree: two builds at once, one per xdist worker, break each other)."""
    return built_once(tmp_path_factory, "wheel", lambda work: _build_and_install(work, project_root)) / "venv"


def _build_and_install(work: Path, project_root: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(work / "dist"), str(project_root)],
        check=True,
        capture_output=True,
        text=True,
    )
    (wheel,) = (work / "dist").glob("slurmagent-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "slurmagent/conf/config.yaml",
        "slurmagent/conf/experiment/digits_mlp.yaml",
        "slurmagent/sbatch_templates/job.sbatch.j2",
        "slurmagent/skills/_base.py",
        "slurmagent/py.typed",
        "slurmagent/examples/data/digits.npz",
        "hydra_plugins/slurmagent_launcher/launcher.py",
    ):
        assert needed in names, f"{needed} missing from {wheel.name}"
    assert "hydra_plugins/__init__.py" not in names  # a namespace package: Hydra scans it
    # conf/, sbatch_templates/, skills/ are mapped into the package: one import path each
    top = {n.split("/", 1)[0] for n in names if not n.startswith("slurmagent-")}
    assert top == {"slurmagent", "hydra_plugins"}, top
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    proc = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


def run(venv: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_CONF", "PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_help_plugins_and_console_script(installed: Path, tmp_path: Path) -> None:
    py = str(installed / "bin" / "python")
    assert run(installed, [py, "-m", "slurmagent", "--help"], tmp_path).returncode == 0
    plugins = run(installed, [py, "-m", "slurmagent", "--info", "plugins"], tmp_path)
    assert plugins.returncode == 0 and "SlurmAgentLauncher" in plugins.stdout
    search = run(installed, [py, "-m", "slurmagent", "--info", "searchpath"], tmp_path)
    assert "pkg://slurmagent.conf" in search.stdout
    version = run(installed, [str(installed / "bin" / "slurmagent"), "version"], tmp_path)
    assert version.returncode == 0 and version.stdout.strip() == "0.1.0"
    # the installed package is the one that ran, not the source tree
    where = run(installed, [py, "-c", "import slurmagent; print(slurmagent.__file__)"], tmp_path)
    assert str(installed) in where.stdout


def test_installed_wheel_runs_a_sweep_and_renders(installed: Path, tmp_path: Path) -> None:
    cli = str(installed / "bin" / "slurmagent")
    sweep = tmp_path / "sweep"
    proc = run(
        installed,
        [
            cli,
            "+experiment=synthetic",
            "-m",
            "synthetic.steps=3,4",
            "synthetic.step_time_s=0",
            f"hydra.sweep.dir={sweep}",
            "hydra.launcher.poll_interval_s=0.2",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(run(installed, [cli, "status", str(sweep), "--json"], tmp_path).stdout)
    assert sorted(t["result"]["steps"] for t in data["tasks"]) == [3, 4]
    rendered = run(installed, [cli, "render", "+experiment=digits_mlp", "-o", str(tmp_path / "r")], tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    assert "#SBATCH --requeue" in (tmp_path / "r" / "job.sbatch").read_text()


def test_the_checkout_holds_no_job_output_and_ignores_it(project_root: Path) -> None:
    """Was: an empty slurm-1763.out committed at the root; render/ and slurm-*.out not ignored."""
    tracked = subprocess.run(["git", "ls-files"], cwd=project_root, capture_output=True, text=True).stdout.split()
    assert not [f for f in tracked if Path(f).name.startswith("slurm-") and f.endswith(".out")], tracked
    ignored = (project_root / ".gitignore").read_text().splitlines()
    assert {"render/", "slurm-*.out", "multirun/", "outputs/"} <= set(ignored)
