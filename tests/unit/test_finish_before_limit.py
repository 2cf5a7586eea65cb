"""The time limit's warning with a few seconds of work left: the run finishes instead of
requeueing (`job/stop.py`: `finishes_before_limit`, `FinishCheck`, asked by the step loop at a
stop). A preemption, a person's signal, a rest that does not fit, or
`recovery.finish_before_limit=false` still stops it for a requeue, as before. The seam is a
recorded squeue answer; tests/fake/test_through_fake_slurm.py runs the whole path."""

from __future__ import annotations

import dataclasses
import signal
from pathlib import Path
from typing import Any

import pytest

from slurmagent.config import CheckpointConf, RecoveryConf
from slurmagent.errors import SlurmCommandError
from slurmagent.job.stop import FinishCheck, finishes_before_limit
from slurmagent.primitives.signals import StopFlag, StopSignals
from slurmagent.runtime import StepLoop, StopForRequeue, context_from_env
from slurmagent.runtime.loop import rest_seconds
from slurmagent.slurm.seam import JobState, SlurmCLI
from tests.unit.test_checkpoint import Counter

USR2, TERM = signal.SIGUSR2, signal.SIGTERM


def test_the_rest_must_end_before_the_limit_with_room_for_a_slower_pace() -> None:
    assert finishes_before_limit(10.0, 30)  # 1.5 × 10 s + 5 s = 20 s ≤ 30 s
    assert not finishes_before_limit(20.0, 30)  # 35 s > 30 s
    assert not finishes_before_limit(10.0, 30, after_s=15.0)  # + the trackers' 15 s flush: 35 s > 30 s
    assert not finishes_before_limit(1.0, None)  # Slurm did not say: stop, as before


def test_the_rest_is_the_steps_left_at_the_pace_since_the_run_started_or_resumed() -> None:
    assert rest_seconds(done=15, start_step=0, end_step=20, elapsed_s=30.0, save_s=1.0) == 11.0  # 5 × 2 s + 1 s
    assert rest_seconds(done=15, start_step=10, end_step=20, elapsed_s=10.0, save_s=0.0) == 10.0  # resumed at 10
    assert rest_seconds(done=15, start_step=0, end_step=15, elapsed_s=30.0, save_s=1.0) == 1.0  # a rung's end
    assert rest_seconds(done=10, start_step=10, end_step=20, elapsed_s=3.0, save_s=0.0) is None  # no step yet


class Squeue(SlurmCLI):
    """`squeue -j JOB -o %T|%r|%L` answered from a recorded line."""

    def __init__(self, state: str, left: str) -> None:
        super().__init__()
        self.seen = JobState(state, "None", left)
        self.asked: list[str] = []

    def job_state(self, job_id: str) -> JobState | None:
        self.asked.append(job_id)
        return self.seen


def _check(tmp_path: Path, squeue: Squeue, **recovery: Any) -> FinishCheck:
    ctx = context_from_env(
        {"SLURM_JOB_ID": "42", "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "2"}, output_dir=tmp_path
    )
    return FinishCheck(ctx, RecoveryConf(**recovery), squeue)


@pytest.mark.parametrize(
    ("signals", "state", "left", "rest_s", "finishes"),
    [
        ((USR2,), "RUNNING", "0:50", 10.0, True),  # the warning, 10 s of work left, 50 s to the limit
        ((USR2,), "RUNNING", "0:50", 40.0, False),  # 1.5 × 40 s + 5 s does not fit in 50 s
        ((USR2,), "RUNNING", "10:00", 10.0, False),  # a person's signal, 10 minutes left: it asked for a requeue
        ((USR2, signal.SIGCONT, TERM), "RUNNING", "0:50", 1.0, False),  # Slurm is ending the job
        ((USR2,), "COMPLETING", "0:50", 1.0, False),  # … or no longer runs it
    ],
)
def test_only_the_time_limits_warning_with_a_rest_that_fits_finishes(
    tmp_path: Path, signals: tuple[int, ...], state: str, left: str, rest_s: float, finishes: bool
) -> None:
    squeue = Squeue(state, left)
    said = _check(tmp_path, squeue)(signals, rest_s)
    assert (said is not None) == finishes, said
    assert squeue.asked == ["40_2"]  # the task's own id, as `scontrol requeue` takes it
    if finishes:
        assert said == (
            "time limit near (0:50 left) and the rest of the run takes about 10 s: "
            "finishing instead of requeueing (recovery.finish_before_limit)"
        )


def test_finish_before_limit_false_always_stops_and_asks_nothing(tmp_path: Path) -> None:
    squeue = Squeue("RUNNING", "0:50")
    assert _check(tmp_path, squeue, finish_before_limit=False)((USR2,), 1.0) is None
    assert squeue.asked == []


class Unanswered(Squeue):
    def job_state(self, job_id: str) -> JobState | None:
        raise SlurmCommandError(["squeue"], 1, "slurm_load_jobs error: Socket timed out")


class Forgotten(Squeue):
    def job_state(self, job_id: str) -> JobState | None:
        return None


def test_no_answer_from_slurm_or_no_slurm_stops_as_before(tmp_path: Path) -> None:
    assert _check(tmp_path, Unanswered("RUNNING", "0:50"))((USR2,), 1.0) is None
    assert _check(tmp_path, Forgotten("RUNNING", "0:50"))((USR2,), 1.0) is None
    local = FinishCheck(context_from_env({}, output_dir=tmp_path), RecoveryConf(), Squeue("RUNNING", "0:50"))
    assert local((USR2,), 1.0) is None  # not under Slurm: nothing to requeue or ask


def _loop(tmp_path: Path, finish: Any) -> StepLoop:
    ctx = context_from_env({}, output_dir=tmp_path)
    flag = StopFlag()
    ctx = dataclasses.replace(ctx, signals=StopSignals(flag, lambda _s: 60.0, finish))
    return StepLoop(ctx, Counter(), total_steps=20, conf=CheckpointConf(every_steps=0), install_signal_handlers=False)


def test_a_loop_told_it_fits_saves_and_runs_to_its_end_and_a_later_sigterm_still_stops_it(tmp_path: Path) -> None:
    asked: list[tuple[tuple[int, ...], float]] = []

    def finish(signals: tuple[int, ...], rest_s: float) -> str:
        asked.append((signals, rest_s))
        return "fits"

    loop = _loop(tmp_path, finish)
    state: Any = loop.state
    for step in loop:
        state.value += 1
        if step == 14:
            loop.flag.handler(USR2, None)  # the warning after step 15 of 20
    assert loop.step == 20 and state.value == 20  # no StopForRequeue: it finished
    assert [s for s, _ in asked] == [(USR2,)] and asked[0][1] >= 0
    assert not loop.flag.set and loop.flag.history == [USR2]
    assert "stop checkpoint at step 15" in loop.stop_note and loop.stop_note.endswith("; fits")
    assert sorted(e.step for e in loop.manager.entries()) == [15, 20]  # the stop's checkpoint, then the end's

    again = _loop(tmp_path / "again", finish)
    with pytest.raises(StopForRequeue) as stop:
        for step in again:
            if step == 4:
                again.flag.handler(USR2, None)
            if step == 9:
                again.flag.handler(TERM, None)  # the limit came after all: stopped, nothing asked
    assert stop.value.step == 10 and stop.value.signum == TERM and len(asked) == 2


def test_a_loop_told_it_does_not_fit_stops_for_a_requeue_as_before(tmp_path: Path) -> None:
    loop = _loop(tmp_path, lambda _signals, _rest: None)
    with pytest.raises(StopForRequeue) as stop:
        for step in loop:
            if step == 14:
                loop.flag.handler(USR2, None)
    assert stop.value.step == 15 and stop.value.signum == USR2


def test_a_sigterm_that_lands_while_the_loop_asks_still_stops_it(tmp_path: Path) -> None:
    loop = _loop(tmp_path, lambda _signals, _rest: None)

    def finish(signals: tuple[int, ...], rest_s: float) -> str:
        loop.flag.handler(signal.SIGCONT, None)  # the preemption comes while squeue answers
        loop.flag.handler(TERM, None)
        return "fits"

    loop._finish = finish
    with pytest.raises(StopForRequeue) as stop:
        for step in loop:
            if step == 4:
                loop.flag.handler(USR2, None)
    assert stop.value.step == 6 and stop.value.signum == TERM  # the next boundary, not the end


def test_a_question_that_fails_stops_for_a_requeue_as_before(tmp_path: Path) -> None:
    def finish(signals: tuple[int, ...], rest_s: float) -> str:
        raise RuntimeError("broken")

    loop = _loop(tmp_path, finish)
    with pytest.raises(StopForRequeue) as stop:
        for step in loop:
            if step == 4:
                loop.flag.handler(USR2, None)
    assert stop.value.step == 5 and stop.value.signum == USR2
