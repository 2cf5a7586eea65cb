"""What `status` shows, pure over a sweep's files: runs and requeues, progress with an ETA,
a task moved off a sick node."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from slurmagent.supervise.state import Attempt, SweepState, TaskRecord
from slurmagent.supervise.views import health_note, progress_text, runs, runs_text, sweep_table


def render(state: SweepState) -> str:
    console = Console(width=250, record=True)
    console.print(sweep_table(state))
    return console.export_text()


def test_runs_count_requeues_and_resubmissions() -> None:
    task = TaskRecord(0, [], [Attempt("1", 0.0, restarts=2), Attempt("2", 0.0, restarts=1)])
    assert runs(task) == 5 and runs_text(task) == "5 (1 resubmitted, 3 requeued)"
    assert runs_text(TaskRecord(1, [], [Attempt("3", 0.0)])) == "1"


def test_progress_has_step_of_total_metrics_and_an_eta() -> None:
    now = 1000.0
    p = {"step": 100, "total_steps": 400, "steps_per_s": 10.0, "metrics": {"loss": 0.25}, "time": now - 5}
    assert progress_text(p, now=now) == "step 100/400 (25%) loss=0.25 ETA 25s"  # 30 s left, written 5 s ago


def test_a_task_moved_off_a_sick_node_says_so(tmp_path: Path) -> None:
    task = TaskRecord(0, ["x=1"], [Attempt("7", 0.0, restarts=1)], state="PENDING")
    state = SweepState(str(tmp_path), "slurm", str(tmp_path / ".submitit"), 0.0, [task])
    (tmp_path / "0").mkdir()
    record = {"node": "t4-1", "step": 30, "reasons": ["GPU 0: 3 volatile uncorrected ECC error(s)"], "excluded": "t4-1"}
    (tmp_path / "0" / "health_stop.json").write_text(json.dumps(record))
    note = health_note(state, task)
    assert note == "moved off t4-1 at step 30 (health CRITICAL: GPU 0: 3 volatile uncorrected ECC error(s))"
    assert note in render(state) and "2 (1 requeued)" in render(state)


def test_logs_number_runs_as_the_job_does(tmp_path: Path) -> None:
    """A task requeued once, then resubmitted: its jobs' logs are runs 1–2 and run 3, and the
    resubmission starts as run 3 (ctx.attempt), not as "attempt 2"."""
    from submitit.core.utils import JobPaths

    from slurmagent.supervise.views import log_files

    folder = tmp_path / ".submitit"
    task = TaskRecord(0, ["a=1"], attempts=[Attempt("10_0", 0.0, restarts=1), Attempt("12", 0.0, restarts=0)])
    state = SweepState(str(tmp_path), "slurm", str(folder), 0.0, [task], [])
    for job in ("10_0", "12"):
        paths = JobPaths(folder, job_id=job, task_id=0)
        paths.stdout.parent.mkdir(parents=True, exist_ok=True)
        paths.stdout.write_text("x\n")
    assert [label for label, _ in log_files(state, task)] == ["runs 1–2, job 10_0, stdout", "run 3, job 12, stdout"]
    assert runs(task) == 3  # the next submission starts as run runs(task) + 1


def test_a_live_task_without_a_report_says_what_it_does() -> None:
    """Was: a blank cell until the first loop.report."""
    running = TaskRecord(0, ["a=1"], state="RUNNING", attempts=[Attempt("7_0", 0.0, state="RUNNING", nodes="cpu-1")])
    queued = TaskRecord(1, ["a=2"], state="PENDING", attempts=[Attempt("7_1", 0.0, reason="Resources")])
    text = render(SweepState("/nonexistent/sweep", "slurm", "/nonexistent/sweep/.submitit", 0.0, [running, queued], []))
    assert "started on cpu-1; no step reported yet" in text and "queued by Slurm (Resources)" in text, text
