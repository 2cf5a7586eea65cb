"""A node failure of a --requeue job that the supervisor sees only once Slurm has started the
requeued job again (issue 19, point 11b: "the node went into suspect_nodes but nothing was
excluded and the task ran on it again 11 s later"). Slurm changes no running job's ExcNodeList
("Job is no longer pending execution", 22.05), so the job is left running — on the failed node
itself when Slurm took it back into service — and the node is excluded from the task's
resubmissions; the audit log and the supervisor's log say where the job runs. While the
requeued job still waits, the node is excluded from it in place (test_fault_recovery.py)."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from slurmagent.config import job_spec
from slurmagent.slurm.seam import SlurmCLI, parse_sacct
from slurmagent.supervise.recover import Recoverer
from slurmagent.supervise.state import Attempt, SweepState, TaskRecord
from tests.fake.fake_slurm import FakeSlurm

# `sacct -n --parsable2 --duplicates -o JobID,State,ExitCode,Reason,NodeList` on the test cluster:
# array task 76_1 lost its run on cpu-2 (slurmd stopped), Slurm requeued it, and by the supervisor's
# next poll the requeued run ran again on cpu-2, back in service after `start-node` (the earlier
# run's rows as recorded; the current run's as it read while running: its Reason is the stale BeginTime)
SACCT_BACK_ON_THE_FAILED_NODE = """76_1|NODE_FAIL|0:0|None|cpu-2
76_1.batch|CANCELLED|||cpu-2
76_1.0|CANCELLED by 0|||cpu-2
76_1|RUNNING|0:0|BeginTime|cpu-2
76_1.batch|RUNNING|0:0||cpu-2
"""
SACCT_RUNNING_ELSEWHERE = SACCT_BACK_ON_THE_FAILED_NODE.replace("BeginTime|cpu-2", "BeginTime|t4-1")


def sweep_with(tmp_path: Path, job_id: str) -> tuple[SweepState, TaskRecord]:
    spec = job_spec({"task": {"target": "a:b"}, "resources": {"exclude": "cpu-1"}})
    task = TaskRecord(3, [], [Attempt(job_id, 0.0, state="RUNNING", nodes="cpu-2")], state="RUNNING")
    sweep = SweepState(str(tmp_path), "slurm", str(tmp_path / ".submitit"), 0.0, [task])
    task.spec_id = sweep.add_spec(dataclasses.asdict(spec))
    return sweep, task


def audit(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    ("sacct", "where"),
    [
        (
            SACCT_BACK_ON_THE_FAILED_NODE,
            "already runs again on cpu-2, the failed node, which Slurm took back into service",
        ),
        (SACCT_RUNNING_ELSEWHERE, "already runs again on t4-1;"),
    ],
)
def test_a_requeued_job_already_running_is_left_running_and_the_node_excluded_from_resubmissions(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, sacct: str, where: str
) -> None:
    fake = FakeSlurm(tmp_path / "fake")
    status = parse_sacct(sacct)["76_1"]
    sweep, task = sweep_with(tmp_path, "76_1")
    with caplog.at_level(logging.WARNING):
        Recoverer(tmp_path, SlurmCLI(runner=fake)).requeued_after_node_failure(
            sweep, task, status.earlier, status.state, status.nodes
        )
    assert fake.calls == []  # no `scontrol update` Slurm would refuse for a running job
    assert sweep.suspect_nodes == {"cpu-2": 1}
    assert sweep.spec_of(task)["resources"]["exclude"] == "cpu-1,cpu-2"  # a resubmission avoids it
    decision, outcome = audit(tmp_path)
    assert (decision["type"], decision["action"], decision["decision"]) == ("decision", "exclude_node", "allow")
    assert where in decision["reason"] and "left running" in decision["reason"], decision["reason"]
    assert decision["params"] == {"exclude": "cpu-1,cpu-2", "in_place": False}
    assert outcome["ok"] and outcome["metrics_after"]["in_place"] is False
    assert outcome["metrics_after"]["job_nodes"] == status.nodes
    assert any(where.rstrip(";") in r.getMessage() for r in caplog.records), caplog.text


def test_a_requeued_job_still_pending_is_excluded_in_place(tmp_path: Path) -> None:
    """The same failure seen while Slurm holds the requeued job: `scontrol update` in place."""
    fake = FakeSlurm(tmp_path / "fake", requeue_delay_s=60.0)
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH --requeue\n#SBATCH --output={tmp_path}/job-%j.out\nsrun sleep 60\n")
    slurm = SlurmCLI(runner=fake)
    job_id = slurm.submit(script)
    node = fake.wait(job_id, ("RUNNING",))["node"]
    fake.fail(job_id, "NODE_FAIL")
    status = slurm.statuses([job_id])[job_id]
    assert status.state == "PENDING" and status.earlier == (("NODE_FAIL", node),)
    sweep, task = sweep_with(tmp_path, job_id)
    fake.calls.clear()
    Recoverer(tmp_path, slurm).requeued_after_node_failure(sweep, task, status.earlier, status.state, status.nodes)
    assert fake.job(job_id)["exclude"] == ",".join(dict.fromkeys(["cpu-1", node]))
    assert [c[:2] for c in fake.calls] == [["scontrol", "update"]]
    decision, outcome = audit(tmp_path)
    assert "in_place" not in decision["params"] and outcome["ok"]


# the requeued run's log when it was killed on the node it had failed on (job 87_0, test cluster,
# issue 19 11a): a step kill queued for the earlier run while cpu-2 was down, retried by slurmctld
# every 60 s and delivered once cpu-2 was back and the requeued run had started there
KILLED_AFTER_RESTART = """srun: forcing job termination
srun: got SIGCONT
slurmstepd-cpu-2: error: *** STEP 88.0 ON cpu-2 CANCELLED AT 2026-12-02T10:12:37 ***
srun: error: cpu-2: task 0: Killed
srun: Force Terminated StepId=88.0
"""


def test_a_requeued_run_killed_on_the_node_that_failed_is_resubmitted_and_explained(tmp_path: Path) -> None:
    fake = FakeSlurm(tmp_path / "fake")
    sweep, task = sweep_with(tmp_path, "87_0")
    sweep.suspect_nodes["cpu-2"] = 1  # requeued_after_node_failure saw it fail
    task.state = task.attempts[0].state = "FAILED"
    task.attempts[0].nodes, task.attempts[0].restarts = "cpu-2", 1
    (tmp_path / ".submitit").mkdir()
    (tmp_path / ".submitit" / "87_0_0_log.err").write_text(KILLED_AFTER_RESTART)
    submitted: list[dict[str, Any]] = []

    def submit(state: SweepState, tasks: list[TaskRecord], spec: Any, attempt: int, marker: str) -> list[str]:
        submitted.append(dataclasses.asdict(spec.resources))
        return ["91"]

    Recoverer(tmp_path, SlurmCLI(runner=fake), submit).handle(sweep, task)
    assert task.diagnosis is not None and task.diagnosis["cause"] == "killed" and task.diagnosis["retryable"]
    assert "after Slurm had requeued it from that node's failure" in task.diagnosis["summary"]
    assert any("cpu-2 failed earlier in this sweep" in e["text"] for e in task.diagnosis["evidence"])
    assert task.job_id == "91" and len(submitted) == 1
    # the same kill on a node nobody saw fail keeps the plain diagnosis
    (tmp_path / "b" / ".submitit").mkdir(parents=True)
    (tmp_path / "b" / ".submitit" / "87_1_0_log.err").write_text(KILLED_AFTER_RESTART.replace("cpu-2", "cpu-1"))
    other, plain = sweep_with(tmp_path / "b", "87_1")
    plain.state, plain.attempts[0].nodes = "FAILED", "cpu-1"
    plain.attempts[0].state, plain.attempts[0].restarts = "FAILED", 1
    other.suspect_nodes["cpu-2"] = 1
    Recoverer(tmp_path / "b", SlurmCLI(runner=fake), submit).handle(other, plain)
    assert plain.diagnosis is not None and plain.diagnosis["cause"] == "killed"
    assert "requeued it from that node's failure" not in plain.diagnosis["summary"]
