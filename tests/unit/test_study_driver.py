"""The search's driver (supervise/study.py) on a sweep state held in memory: the tasks'
outcomes are written as a trial would (metrics.jsonl lines with the epoch and the
objective), so the driver's decisions — new trials, promotions as new attempts of the same
task, failures, budgets, a driver killed between an ask and its write — are checked
without any job running. The same paths run on the fake and the real Slurm in
tests/fake/test_hpo_fake.py and tests/slurm/test_hpo_slurm.py."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from slurmagent.supervise.state import Attempt, SweepState, TaskRecord
from slurmagent.supervise.study import StudyDriver, StudySettings, override_value, read_curve
from slurmagent.supervise.submission import WAITING
from slurmagent.supervise.views import load_trials, result_rows, runs_text


def settings(**hpo: Any) -> StudySettings:
    conf: dict[str, Any] = {
        "objective": "val_error",
        "max_parallel": 3,
        "fidelity": {"key": "synthetic.epochs", "max": 9, "min": 1, "eta": 3},
        "budget": {"trials": 12},
    }
    conf.update(hpo)
    return StudySettings(conf, ["+experiment=synthetic", "synthetic.x=interval(0,1)"], "0", time.time(), ["python"])


def new_state(sweep: Path) -> SweepState:
    return SweepState(str(sweep), "slurm", str(sweep / ".submitit"), time.time(), [])


def error(x: float, epoch: int) -> float:
    return (x - 0.3) ** 2 + 0.5 / epoch


def run(sweep: Path, task: TaskRecord, outcome: str = "COMPLETED", diverge: bool = False) -> None:
    """Submit the WAITING `task` (as the supervisor would) and end it: a trial reports its
    objective once per epoch up to its rung, appending to its own metrics.jsonl."""
    assert task.state == WAITING
    task.attempts.append(Attempt(f"{100 + task.index}_{len(task.attempts)}", time.time()))
    stop = int(override_value(task, "hpo.stop_at") or 0)
    x = float(override_value(task, "synthetic.x") or 0)
    folder = sweep / str(task.index)
    folder.mkdir(parents=True, exist_ok=True)
    reached = sorted(read_curve(folder, "val_error"))
    with open(folder / "metrics.jsonl", "a") as fh:
        for epoch in range((reached[-1] if reached else 0) + 1, stop + 1):
            value = math.nan if diverge else error(x, epoch)
            fh.write(json.dumps({"step": epoch * 2, "epoch": epoch, "val_error": value}) + "\n")
    task.state = outcome
    task.error = "" if outcome == "COMPLETED" else f"{outcome}: the job ended"


def waiting(state: SweepState) -> list[TaskRecord]:
    return [t for t in state.tasks if t.state == WAITING]


def test_new_trials_are_waiting_tasks_with_their_rung_and_the_full_schedule(tmp_path: Path) -> None:
    driver = StudyDriver(tmp_path, settings())
    state = new_state(tmp_path)
    assert driver.step(state)
    assert [t.index for t in state.tasks] == [0, 1, 2]  # max_parallel, task index = trial number
    for t in state.tasks:
        assert t.state == WAITING and t.spec_id == "0"
        assert t.overrides[0] == "+experiment=synthetic" and override_value(t, "synthetic.epochs") == "9"
        assert override_value(t, "hpo.trial") == str(t.index)
        assert override_value(t, "hpo.stop_at") == "1"
    assert not driver.step(state)  # nothing ended: nothing new


def test_a_promotion_is_the_same_task_resumed_and_recovery_counts_attempts_per_stage(tmp_path: Path) -> None:
    driver = StudyDriver(tmp_path, settings(max_parallel=1, explore=3, budget={"trials": 3}))
    state = new_state(tmp_path)
    promoted: TaskRecord | None = None
    for _ in range(20):
        driver.step(state)
        todo = waiting(state)
        if not todo:
            break
        task = todo[0]
        if task.attempts:
            promoted = task
            assert task.stage_start == len(task.attempts) and task.stage_attempts == 0
            assert task.result is None and not task.error
        run(tmp_path, task)
    assert promoted is not None, "a search of 3 trials at eta 3 promotes its best"
    assert promoted.promotions >= 1 and len(promoted.attempts) == 1 + promoted.promotions
    assert "promoted" in runs_text(promoted) and "resubmitted" not in runs_text(promoted)
    rows = {r["trial"]: r for r in load_trials(tmp_path)["trials"]}  # type: ignore[index]
    assert rows[promoted.index]["epochs"] == int(override_value(promoted, "hpo.stop_at") or 0) > 1
    assert driver.finished


def test_a_failed_trial_ranks_last_and_a_held_one_is_not_failed(tmp_path: Path) -> None:
    driver = StudyDriver(tmp_path, settings())
    state = new_state(tmp_path)
    driver.step(state)
    first, second, third = state.tasks
    run(tmp_path, first, "OUT_OF_MEMORY")
    run(tmp_path, second, "FAILED")
    driver.step(state, held={first.index})  # its recovery waits for approval: not a failure
    assert driver.opt.trials[first.index].running and not driver.opt.trials[first.index].failed
    assert driver.opt.trials[second.index].failed.startswith("FAILED")
    assert len(state.tasks) == 4  # the failed trial's slot went to a new one
    rows = {r["trial"]: r for r in result_rows(state)}
    assert rows[second.index]["state"] == "failed" and rows[second.index]["error"].startswith("FAILED")
    assert rows[third.index]["state"] == "waiting"


def test_a_diverged_trial_gets_the_worst_value_and_the_study_goes_on(tmp_path: Path) -> None:
    driver = StudyDriver(tmp_path, settings(max_parallel=1, budget={"trials": 3}))
    state = new_state(tmp_path)
    driver.step(state)
    run(tmp_path, state.tasks[0], diverge=True)
    driver.step(state)
    for _ in range(20):
        todo = waiting(state)
        if not todo:
            break
        run(tmp_path, todo[0], diverge=todo[0].index == 0)
        driver.step(state)
    assert driver.finished and len(driver.opt.trials) == 3  # the study went on to its budget
    first = driver.opt.trials[0]
    assert first.diverged and not first.promoted_from and not first.failed
    assert load_trials(tmp_path)["trials"][0]["state"] == "diverged"  # type: ignore[index]
    assert result_rows(state)[0]["val_error"] is None  # NaN shown as no value, not as a number
    best = driver.opt.best()
    assert best is not None and math.isfinite(best.curve[best.reached])


def test_a_trial_that_reports_no_objective_fails_with_what_to_report(tmp_path: Path) -> None:
    driver = StudyDriver(tmp_path, settings(objective="val_loss"))
    state = new_state(tmp_path)
    driver.step(state)
    run(tmp_path, state.tasks[0])  # writes val_error, not val_loss
    driver.step(state)
    info = driver.opt.trials[0]
    assert "without reporting val_loss at epoch 1" in info.failed
    assert "loop.report(epoch=<n>, val_loss=<value>)" in state.tasks[0].error


def test_the_epoch_budget_is_never_exceeded(tmp_path: Path) -> None:
    driver = StudyDriver(tmp_path, settings(budget={"epochs": 20}, max_parallel=2))
    state = new_state(tmp_path)
    for _ in range(100):
        driver.step(state)
        assert driver.opt.spent() <= 20
        todo = waiting(state)
        if not todo:
            break
        for task in todo:
            run(tmp_path, task)
    assert driver.finished and driver.opt.spent() >= 20 - 6  # it stops only when the next step does not fit


def test_a_killed_driver_loses_no_trial_and_restarts_none(tmp_path: Path) -> None:
    s = settings(max_parallel=2)
    driver = StudyDriver(tmp_path, s)
    state = new_state(tmp_path)
    driver.step(state)
    run(tmp_path, state.tasks[0])
    # the driver asks (the study's storage has it) and dies before sweep.json is written
    lost = driver.opt.ask()
    del driver
    again = StudyDriver(tmp_path, s)
    assert again.step(state)
    indices = [t.index for t in state.tasks]
    assert lost.trial in indices and len(indices) == len(set(indices))
    task = next(t for t in state.tasks if t.index == lost.trial)
    assert task.state == WAITING and override_value(task, "hpo.stop_at") == str(lost.fidelity)
    # the completed trial was told by the new driver
    x0 = float(override_value(state.tasks[0], "synthetic.x") or 0)
    assert not again.opt.trials[0].running and again.opt.trials[0].curve == {1: pytest.approx(error(x0, 1))}
    before = {t.index: (t.state, len(t.attempts)) for t in state.tasks}
    assert not again.step(state)
    assert before == {t.index: (t.state, len(t.attempts)) for t in state.tasks}


def test_the_study_settings_must_match_a_continued_study(tmp_path: Path) -> None:
    StudyDriver(tmp_path, settings())
    from slurmagent.errors import ConfigError

    with pytest.raises(ConfigError, match="use another study"):
        StudyDriver(tmp_path, settings(fidelity={"key": "synthetic.epochs", "max": 27, "min": 1, "eta": 3}))


def test_stale_is_not_failed_after_a_driver_restart(tmp_path: Path) -> None:
    """While no driver ran, one trial's job completed, one failed for good and one still runs:
    the next driver tells the first, fails the second with its cause, and leaves the third
    alone (not failed, not asked again, not restarted)."""
    s = settings(max_parallel=3, budget={"trials": 3})
    driver = StudyDriver(tmp_path, s)
    state = new_state(tmp_path)
    driver.step(state)
    done, failed, running = state.tasks
    del driver  # the supervisor dies; the jobs go on
    run(tmp_path, done)
    run(tmp_path, failed, "OUT_OF_MEMORY")
    failed.error = "OUT_OF_MEMORY: gave up after 3 attempt(s) (recovery.max_attempts=3)"
    running.attempts.append(Attempt("300_0", time.time()))
    running.state = "RUNNING"
    again = StudyDriver(tmp_path, s)
    again.step(state)
    assert again.opt.trials[done.index].curve and not again.opt.trials[done.index].failed
    assert again.opt.trials[failed.index].failed.startswith("OUT_OF_MEMORY: gave up")
    info = again.opt.trials[running.index]
    assert info.running and not info.failed and not info.curve
    assert running.state == "RUNNING" and len(running.attempts) == 1  # not resubmitted, not re-asked
    assert len(state.tasks) == 3  # the trial budget is spent: nothing new
