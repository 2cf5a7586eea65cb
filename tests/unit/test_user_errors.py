"""A task's failure in the user's words: the exception their code raised (not srun's "Exited with
exit code 1"), its traceback once and without Python's `^^^^` markers, and a process killed by a
signal named as such. On logs recorded from real failing jobs of the test cluster."""

from __future__ import annotations

from pathlib import Path

from slurmagent.config import job_spec
from slurmagent.recovery import Resubmit, diagnose, plan
from slurmagent.supervise.supervisor import failure_text

LOGS = Path(__file__).resolve().parent.parent / "data" / "logs"
STDERR = (LOGS / "user_crash.err").read_text()
RESULT = (LOGS / "user_crash.result.txt").read_text()


def test_a_crash_names_the_users_exception_and_where_it_was_raised() -> None:
    error = failure_text("FAILED", RESULT, STDERR)
    for logs in ({"stderr": STDERR}, {"stderr": STDERR, "task error": error}):
        d = diagnose("FAILED", logs)
        assert d.cause == "crash" and not d.retryable
        assert d.summary == "The task raised RuntimeError: boom at step 5 at mytrain.py:11 in train.", d.summary
        assert "srun" not in d.summary and d.evidence[0].text == "RuntimeError: boom at step 5"


def test_a_failed_tasks_error_has_the_exception_first_and_its_traceback_once() -> None:
    error = failure_text("FAILED", RESULT, STDERR)
    lines = error.splitlines()
    assert lines[0] == "FAILED: RuntimeError: boom at step 5", lines[0]
    assert not any(set(line.strip()) <= {"^", "~"} for line in lines if line.strip()), error
    assert error.count("Traceback (most recent call last):") == 1
    assert error.count('raise RuntimeError("boom at step 5")') == 1
    # what the job's stderr adds beyond the traceback: srun's line, nothing of the traceback again
    assert error.split("last stderr lines:\n")[1].splitlines() == [
        "submitit ERROR (2026-12-02 09:24:53,953) - Submitted job triggered an exception",
        "srun: error: a100-1: task 0: Exited with exit code 1",
    ]


def test_a_process_killed_by_sigkill_is_not_the_users_crash_and_is_resumed() -> None:
    """Was: "crash … srun: error: a100-1: task 0: Killed … Not retried"."""
    d = diagnose("FAILED", {"stderr": (LOGS / "sigkill.err").read_text()})
    assert d.cause == "killed" and d.retryable, d
    assert "SIGKILL (signal 9)" in d.summary and d.evidence[0].text == "srun: error: a100-1: task 0: Killed"
    spec = job_spec({"task": {"target": "a:b"}, "recovery": {"max_attempts": 3}})
    step = plan(spec, 1, d, "a100-1", None)
    assert isinstance(step, Resubmit) and step.changes == {}  # resubmitted as it was: it resumes from its checkpoint
    assert not isinstance(plan(spec, 3, d, "a100-1", None), Resubmit)  # bounded like every retry


def test_a_native_crash_names_its_signal() -> None:
    d = diagnose("FAILED", {"stderr": "srun: error: t4-1: task 0: Segmentation fault\n"})
    assert d.cause == "crash" and not d.retryable
    assert "SIGSEGV (signal 11)" in d.summary and "PYTHONFAULTHANDLER=1" in d.suggestion


def test_a_stderr_tail_that_begins_inside_the_traceback_adds_no_markers() -> None:
    tail = "\n".join(STDERR.splitlines()[-15:])  # what stderr_tail reads: the traceback's head cut off
    error = failure_text("FAILED", RESULT, tail)
    assert "^^^" not in error and error.split("last stderr lines:\n")[1].splitlines() == [
        "srun: error: a100-1: task 0: Exited with exit code 1"
    ], error
