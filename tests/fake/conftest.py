"""Fixtures for the fast tests that drive launch, supervision, the job's stop path and
recovery through `tests.fake.fake_slurm.FakeSlurm`: a stand-in for Slurm that runs the
submitted jobs as local processes. The same paths are proven on the real test cluster by
tests/slurm/; these run in seconds and need no cluster."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fake.fake_slurm import FakeSlurm


@pytest.fixture()
def fake(tmp_path: Path) -> Iterator[FakeSlurm]:
    slurm = FakeSlurm(tmp_path / "fake-slurm", kill_wait_s=3.0)
    yield slurm
    for job_id, job in slurm.jobs().items():  # nothing outlives the test
        if job["state"] in ("RUNNING", "PENDING"):
            slurm.command(["scancel", job_id], str(tmp_path))


def slurmagent(fake: FakeSlurm, cwd: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """`python -m slurmagent ARGS` with the fake's commands first on PATH, waited for."""
    return subprocess.run(
        [sys.executable, "-m", "slurmagent", *args],
        cwd=cwd,
        env=fake.env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def ctrl_c_as_in_a_terminal() -> None:
    """preexec_fn: SIGINT's default action in the child. A test run started in the background
    by a script (`cmd &` without job control) ignores SIGINT, and children inherit that; a
    launcher a person runs in a terminal has the default, which the Ctrl-C tests need."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(fake: FakeSlurm, cwd: Path, *args: str) -> subprocess.Popen[str]:
    """The same, in the background (a launcher that supervises while the test injects faults)."""
    return subprocess.Popen(
        [sys.executable, "-m", "slurmagent", *args],
        cwd=cwd,
        env=fake.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_as_in_a_terminal,
    )


def sweep_state(sweep: Path) -> dict[str, Any]:
    return json.loads((sweep / "sweep.json").read_text())  # type: ignore[no-any-return]


def first_job_id(sweep: Path, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # the tasks are in sweep.json before they are submitted (WAITING, no attempt yet); a
        # search's sweep.json has no task until its first trial is asked
        tasks = sweep_state(sweep)["tasks"] if (sweep / "sweep.json").exists() else []
        if tasks and (attempts := tasks[0]["attempts"]):
            return str(attempts[-1]["job_id"])
        time.sleep(0.1)
    raise TimeoutError(f"task 0 of {sweep} was not submitted")


def steps_done(sweep: Path, index: int = 0) -> int:
    path = sweep / str(index) / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def wait_steps(sweep: Path, at_least: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while steps_done(sweep) < at_least:
        if time.monotonic() > deadline:
            raise TimeoutError(f"fewer than {at_least} steps after {timeout:.0f}s")
        time.sleep(0.05)


def running(fake: FakeSlurm, cwd: Path, *args: str, steps: int = 0) -> tuple[subprocess.Popen[str], Path, str]:
    """A sweep launched in the background into cwd/sweep, once its first task's job runs (and
    has done `steps` steps): (the launcher, the sweep directory, that job's id)."""
    sweep = cwd / "sweep"
    launcher = start(fake, cwd, *args, f"hydra.sweep.dir={sweep}")
    job = first_job_id(sweep)
    fake.wait(job, ("RUNNING",))
    if steps:
        wait_steps(sweep, steps)
    return launcher, sweep, job


def finish(launcher: subprocess.Popen[str], timeout: float = 180) -> str:
    """Wait for the launcher; it must succeed. Its stderr."""
    _, err = launcher.communicate(timeout=timeout)
    assert launcher.returncode == 0, err
    return err
