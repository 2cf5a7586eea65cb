"""One class per backend (slurmagent/primitives/backends.py): what each says about itself, and
the two things it does for the supervisor and `cancel` (read its tasks' states, end them),
with real processes for the local backend and recorded Slurm answers for Slurm's."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from slurmagent.errors import ConfigError
from slurmagent.primitives.backends import BACKENDS, LocalBackend, SlurmBackend, backend_named
from slurmagent.slurm.seam import JobState, SlurmCLI, TaskStatus


def test_a_backend_is_found_by_its_name_and_an_unknown_name_lists_the_choices() -> None:
    assert [backend_named(n).name for n in ("slurm", "local", "none")] == ["slurm", "local", "none"]
    assert backend_named("slurm").queued and not backend_named("local").queued
    assert backend_named("local").launched and not backend_named("none").launched
    with pytest.raises(ConfigError) as err:
        backend_named("kubernetes")
    assert str(err.value) == "backend 'kubernetes' is not one of slurm, local, none"
    assert set(BACKENDS) == {"slurm", "local", "none"}


def test_the_local_backend_reads_its_processes_and_ends_only_submitit_ones() -> None:
    # a process that is not a submitit task is never signalled, even when its pid is given
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    task = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "submitit"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    local, slurm = LocalBackend(), SlurmCLI(runner=_no_slurm)
    try:
        ids = [str(other.pid), str(task.pid), str(dead.pid)]
        states = {j: s.state for j, s in local.statuses(slurm, ids).items()}
        assert states == {str(other.pid): "RUNNING", str(task.pid): "RUNNING", str(dead.pid): "EXITED"}
        local.end(slurm, [], ids)
        assert task.wait(timeout=10) == -15 and other.poll() is None
    finally:
        other.kill()
        task.kill()
        other.wait()


def test_slurms_backend_asks_the_controller_again_about_a_preempted_job(monkeypatch: pytest.MonkeyPatch) -> None:
    slurm = SlurmCLI(runner=_no_slurm)
    seen: list[Any] = []

    def statuses(ids: set[str]) -> dict[str, TaskStatus]:
        seen.append(sorted(ids))
        return {
            "7_0": TaskStatus("7_0", "PREEMPTED", "", "", "n1", 0),
            "7_1": TaskStatus("7_1", "PREEMPTED", "", "", "n2", 0),
            "8": TaskStatus("8", "RUNNING", "", "", "n1", 0),
        }

    monkeypatch.setattr(slurm, "statuses", statuses)
    monkeypatch.setattr(
        slurm, "job_states", lambda ids: {"7_0": JobState("PENDING", "", ""), "7_1": JobState("PREEMPTED", "", "")}
    )
    got = SlurmBackend().statuses(slurm, ["7_0", "7_1", "8"])
    assert seen == [["7", "8"]]  # one query, by the sweep's own job ids
    # requeued: it runs again; ended (PreemptMode=CANCEL): it stays PREEMPTED
    assert {j: s.state for j, s in got.items()} == {"7_0": "PENDING", "7_1": "PREEMPTED", "8": "RUNNING"}
    cancelled: list[list[str]] = []
    monkeypatch.setattr(slurm, "cancel", lambda ids: cancelled.append(list(ids)))
    SlurmBackend().end(slurm, ["7", "8"], ["7_0", "8"])
    assert cancelled == [["7", "8"]]  # Slurm ends the sweep's arrays: every unfinished task in them


def _no_slurm(argv: list[str], **_: Any) -> Any:
    raise AssertionError(f"no Slurm command expected here: {argv}")
