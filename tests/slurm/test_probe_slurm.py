"""The pre-flight probe on the real cluster (issue 20), run as a user runs it (a directory outside
the checkout, Hydra's default sweep directory, the user's own module): a sweep whose `env.python`
lacks torch (and slurmagent) is refused by one probe job before any array task is submitted —
exit 2, the finding and its fix named, nothing else queued; an environment that passes is
checked once and then taken from the cache (`probe=recheck` checks it again)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fault_cases import wait_for

pytestmark = pytest.mark.slurm

TASK = "def run(cfg):\n    return {'ok': 1}\n"


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurmagent", *args], cwd=home, capture_output=True, text=True, timeout=600
    )


def jobs_named(name: str) -> list[str]:
    """Every job of that name in accounting (a sweep's arrays are named after its app: slurmagent)."""
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID,JobName,State"], capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if line.split("|")[1] == name]


def test_an_interpreter_without_torch_is_refused_by_the_probe_and_nothing_is_queued(home: Path) -> None:
    (home / "bare_task.py").write_text(TASK)
    venv = home / "bare-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    before, probes = jobs_named("slurmagent"), jobs_named("slurmagent-probe")
    run = cli(home, "-m", "task.target=bare_task:run", f"env.python={venv}/bin/python")
    assert run.returncode == 2, run.stderr
    assert "the environment probe (Slurm job" in run.stderr, run.stderr
    assert "torch does not import" in run.stderr and "fix: pip install torch" in run.stderr
    assert "nothing was submitted" in run.stderr
    assert not list(home.glob("multirun/*/*/sweep.json"))
    assert jobs_named("slurmagent") == before  # no array task of the sweep was ever queued
    queued = subprocess.run(["squeue", "-h", "-n", "slurmagent", "-o", "%i"], capture_output=True, text=True)
    assert queued.stdout.strip() == "", queued.stdout
    probe = run.stderr.split("the environment probe (Slurm job ")[1].split(",")[0]
    named = wait_for(lambda: [j for j in jobs_named("slurmagent-probe") if j.startswith(f"{probe}|")], "accounting", 60)
    assert named and named[0].endswith("|COMPLETED") and len(probes) < len(jobs_named("slurmagent-probe"))


def test_a_passing_environment_is_probed_once_and_then_taken_from_the_cache(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "ok_task.py").write_text(TASK)
    # an environment of its own (a line no other test uses): probed once, then cached
    args = ["-m", "task.target=ok_task:run", f'env.setup=["export PROBE_TEST_MARK={tmp_path.name}"]']
    first = cli(home, *args, "probe=recheck")
    assert first.returncode == 0, first.stderr
    assert "environment checked by probe job" in first.stderr, first.stderr
    again = cli(home, *args)
    assert again.returncode == 0, again.stderr
    assert "environment checked within the last day" in again.stderr, again.stderr


def test_doctor_env_probes_an_environment_on_demand(tmp_path: Path) -> None:
    """`slurmagent doctor --env OVERRIDES`: the same probe job, now, every finding printed."""
    home = tmp_path / "home"
    home.mkdir()
    venv = home / "bare-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    bad = cli(home, "doctor", "--env", f"env.python={venv}/bin/python")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "environment checked by probe job" in bad.stdout
    assert "CRITICAL: torch does not import" in bad.stdout and "(fix: pip install torch" in bad.stdout
    good = cli(home, "doctor", "--env", f'env.setup=["export DOCTOR_ENV_MARK={tmp_path.name}"]')
    assert good.returncode == 0, good.stdout + good.stderr
    assert "environment checked by probe job" in good.stdout and "CRITICAL" not in good.stdout
