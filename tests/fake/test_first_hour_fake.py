"""While a sweep runs and after it, through the fake Slurm (issue 11): jobs named after the
experiment, runs and requeues as they happened, progress with an ETA, every attempt's logs,
results sorted or as CSV, and the HTML report opened in a real headless Chromium."""

from __future__ import annotations

import csv
import io
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from slurmagent.commands import slurmagent_command
from tests.conftest import browser_dom, built_once
from tests.fake.conftest import first_job_id, slurmagent, start, sweep_state, wait_steps
from tests.fake.fake_slurm import FakeSlurm

DIGITS = (
    "+experiment=digits_mlp",
    "cluster=slurm",
    "train.steps=60",
    "train.step_delay_s=0.03",
    "hydra.launcher.poll_interval_s=0.3",
)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[FakeSlurm, Path, Path]:
    """A two-task digits sweep whose task 0 was preempted once, run to the end (once per test
    run: a worker that gets some of these tests after another built it takes the same one)."""

    def build(work: Path) -> None:
        fake = FakeSlurm(work / "fake-slurm", kill_wait_s=3.0)
        sweep = work / "sweep"
        launcher = start(fake, work, *DIGITS, "-m", "optim.lr=1e-3,1e-2", f"hydra.sweep.dir={sweep}")
        job = first_job_id(sweep)
        fake.wait(job, ("RUNNING",))
        wait_steps(sweep, 10)
        fake.preempt(job)
        _, err = launcher.communicate(timeout=300)
        assert launcher.returncode == 0, err

    work = built_once(tmp_path_factory, "first-hour", build)
    return FakeSlurm(work / "fake-slurm"), work / "sweep", work  # the built cluster's state, as it was left


def test_jobs_are_named_after_the_experiment(finished: tuple[FakeSlurm, Path, Path]) -> None:
    fake, _, _ = finished
    assert {j["name"] for j in fake.jobs().values()} == {"digits_mlp"}


def test_runs_and_requeues_show_as_they_happened(finished: tuple[FakeSlurm, Path, Path]) -> None:
    fake, sweep, work = finished
    table = slurmagent(fake, work, "status", str(sweep)).stdout
    row0 = next(line for line in table.splitlines() if re.match(r"[│|]\s*0\s", line))
    assert "2 (1 requeued)" in row0
    data = json.loads(slurmagent(fake, work, "status", str(sweep), "--json").stdout)
    assert [t["runs"] for t in data["tasks"]] == [2, 1]


def test_logs_list_every_task_and_print_every_attempt(finished: tuple[FakeSlurm, Path, Path]) -> None:
    fake, sweep, work = finished
    listing = slurmagent(fake, work, "logs", str(sweep))
    assert listing.returncode == 0 and listing.stdout.count("_0_log.out") == 2
    one = slurmagent(fake, work, "logs", str(sweep), "0", "--tail", "0")
    assert one.returncode == 0
    # the requeued run appended to its job's files: both runs' starts are in them
    assert one.stdout.count("Starting with JobEnvironment") == 2 and "task.log" in one.stdout
    status = slurmagent(fake, work, "status", str(sweep)).stdout
    assert f"{slurmagent_command('logs', sweep)} TASK" in status  # status says where the logs are


def test_results_sorted_and_as_csv(finished: tuple[FakeSlurm, Path, Path]) -> None:
    fake, sweep, work = finished
    rows = [
        json.loads(x)
        for x in slurmagent(fake, work, "results", str(sweep), "--sort", "val_acc", "--json").stdout.splitlines()
    ]
    accs = [r["val_acc"] for r in rows]
    assert accs == sorted(accs) and {r["optim.lr"] for r in rows} == {"0.001", "0.01"}
    table = list(csv.DictReader(io.StringIO(slurmagent(fake, work, "results", str(sweep), "--csv").stdout)))
    assert [r["task"] for r in table] == ["0", "1"] and {"optim.lr", "val_acc", "runs", "state"} <= set(table[0])
    bad = slurmagent(fake, work, "results", str(sweep), "--sort", "val_acc_typo")
    assert bad.returncode == 2 and "columns:" in bad.stderr and "val_acc" in bad.stderr


@pytest.mark.browser
def test_the_report_renders_in_a_real_browser(finished: tuple[FakeSlurm, Path, Path]) -> None:
    fake, sweep, work = finished
    made = slurmagent(fake, work, "report", str(sweep))
    assert made.returncode == 0, made.stderr
    page = sweep / "report" / "index.html"
    pngs = sorted(p.name for p in page.parent.glob("*.png"))
    # the epoch is an axis, not a metric; the main metric (val_error) against optim.lr: metric_vs_params.png
    assert "loss.png" in pngs and set(pngs) <= {"loss.png", "val_acc.png", "val_error.png", "metric_vs_params.png"}
    dom = browser_dom(page, work)
    # the page's own script counts the images the browser decoded: every plot rendered
    n = len(pngs)
    assert f'data-images="{n}"' in dom and f'data-images-shown="{n}"' in dom, dom[:2000]
    assert "optim.lr" in dom and "val_acc" in dom  # the results table


def test_status_shows_progress_and_an_eta_while_a_task_runs(fake: FakeSlurm, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    launcher = start(fake, tmp_path, *DIGITS, "train.steps=400", "-m", f"hydra.sweep.dir={sweep}")
    try:
        fake.wait(first_job_id(sweep), ("RUNNING",))
        wait_steps(sweep, 30)
        deadline = time.monotonic() + 60
        row = ""
        while time.monotonic() < deadline and "ETA" not in row:
            table = slurmagent(fake, tmp_path, "status", str(sweep), "--refresh").stdout
            row = next((line for line in table.splitlines() if line.startswith("│") and "RUNNING" in line), "")
            time.sleep(0.5)
        assert re.search(r"step \d+/400 \(\d+%\) loss=[\d.]+ .*ETA \d+", row), row
        assert json.loads((sweep / "0" / "progress.json").read_text())["total_steps"] == 400
    finally:
        slurmagent(fake, tmp_path, "cancel", str(sweep))
        launcher.kill()
        launcher.communicate(timeout=60)


def _state(sweep: Path) -> dict[str, Any]:
    return sweep_state(sweep)


def test_logs_follow_a_task_to_its_end(fake: FakeSlurm, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    launcher = start(fake, tmp_path, *DIGITS, "-m", f"hydra.sweep.dir={sweep}")
    first_job_id(sweep)
    follow = slurmagent(fake, tmp_path, "logs", str(sweep), "0", "--follow", "--interval", "0.3", timeout=300)
    launcher.communicate(timeout=300)
    assert follow.returncode == 0 and "task 0 ended COMPLETED" in follow.stdout
    assert "digits_mlp done" in follow.stdout and _state(sweep)["tasks"][0]["state"] == "COMPLETED"


def test_doctor_takes_an_arrays_own_id_and_says_when_nothing_failed(fake: FakeSlurm, tmp_path: Path) -> None:
    (tmp_path / "flaky.py").write_text(
        "def train(cfg):\n"
        "    if cfg.synthetic.steps == 3:\n"
        "        raise FileNotFoundError(\"[Errno 2] No such file or directory: 'data/train/labels.csv'\")\n"
        "    return {'ok': 1}\n"
    )
    sweep = tmp_path / "sweep"
    proc = slurmagent(
        fake,
        tmp_path,
        "cluster=slurm",
        "task.target=flaky:train",
        "recovery.max_attempts=1",
        "-m",
        "synthetic.steps=2,3",
        f"hydra.sweep.dir={sweep}",
        "hydra.launcher.poll_interval_s=0.3",
    )
    assert proc.returncode == 1
    array = sweep_state(sweep)["array_ids"][0]
    doctor = slurmagent(fake, tmp_path, "doctor", array)  # the array's own id, as squeue shows it
    assert doctor.returncode == 1 and f"job {array}_1 (FAILED" in doctor.stdout
    assert "missing_path" in doctor.stdout and f"{array}_0" not in doctor.stdout
    fine = slurmagent(fake, tmp_path, "doctor", f"{array}_0")
    assert fine.returncode == 0 and "nothing to diagnose: 1 of 1 job(s)" in fine.stdout
