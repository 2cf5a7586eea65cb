"""A job's end wakes its sweep's supervisor (slurmagent/primitives/wake.py): the sleep between
two polls is cut short when a job has written to the wake file, and only then; every ended
task of a real local sweep writes to it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from slurmagent.primitives.wake import WAKE_CHECK_S, WakeWatch, wake, wake_path


def test_a_sleep_runs_to_its_end_when_no_job_ends(tmp_path: Path) -> None:
    slept: list[float] = []
    watch = WakeWatch(tmp_path, sleep=slept.append)
    assert watch.sleep(3.0) is False
    # sliced, whatever clock the sleep function keeps: the slices add up to what was asked
    assert len(slept) == round(3.0 / WAKE_CHECK_S) and abs(sum(slept) - 3.0) < 1e-9


def test_a_job_ending_during_a_sleep_cuts_it_short(tmp_path: Path) -> None:
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:  # a job ends while the supervisor sleeps
            wake(tmp_path, "task 0 job 1")

    watch = WakeWatch(tmp_path, sleep=sleep)
    assert watch.sleep(30.0) is True
    assert len(slept) == 3
    # seen once: the next sleep is not cut short by the same line
    assert watch.sleep(1.0) is False
    assert wake_path(tmp_path).read_text().count("\n") == 1


def test_a_wake_never_cuts_a_sleep_below_the_base_interval(tmp_path: Path) -> None:
    slept: list[float] = []
    watch = WakeWatch(tmp_path, sleep=slept.append)
    wake(tmp_path, "a job ended just after the last poll")
    assert watch.sleep(10.0, at_least=2.0) is True
    assert abs(sum(slept) - 2.0) < 1e-9  # many jobs ending: no more polls than the base rate


def test_an_unwritable_wake_file_changes_nothing(tmp_path: Path) -> None:
    blocker = tmp_path / "sweep"
    blocker.write_text("a file where the sweep directory would be")
    wake(blocker, "task 0")  # no exception: the supervisor only looks later
    assert WakeWatch(blocker, sleep=lambda s: None).sleep(0.5) is False


def test_every_task_of_a_local_sweep_wakes_the_supervisor_as_it_ends(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurmagent",
            "+experiment=synthetic",
            "cluster=local",
            "synthetic.steps=2",
            "synthetic.step_time_s=0.01",
            f"hydra.sweep.dir={sweep}",
            "-m",
            "synthetic.x=0.1,0.2",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr
    lines = wake_path(sweep).read_text().splitlines()
    assert sorted(line.split(" task ")[1].split()[0] for line in lines) == ["0", "1"]
