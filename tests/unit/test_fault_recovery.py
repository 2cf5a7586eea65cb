"""The recovery path's fixes found by the fault table (tests/slurm/test_fault_table.py), on
recorded Slurm output and against the fake Slurm: a node failure that Slurm requeues by itself is not resubmitted a
second time but has the node excluded in place; excluding a node unpins a job pinned to
it; a full disk is diagnosed; a checkpoint whose manifest cannot be written leaves the old
ones intact and nothing half-written."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from slurmagent.config import ResourcesConf, job_spec
from slurmagent.errors import CheckpointError
from slurmagent.primitives.checkpoint import MANIFEST, CheckpointManager
from slurmagent.recovery import Resubmit, diagnose, plan
from slurmagent.recovery.plan import exclude_nodes
from slurmagent.slurm.seam import SlurmCLI, parse_sacct
from slurmagent.supervise.recover import Recoverer
from slurmagent.supervise.state import Attempt, SweepState, TaskRecord
from slurmagent.syntax import split_hostlist
from tests.fake.fake_slurm import FakeSlurm

# `sacct -n --parsable2 --duplicates -o JobID,State,ExitCode,Reason,NodeList` on the test
# cluster while a --requeue job whose node (t4-2) was stopped waits to run again
SACCT_REQUEUED = """800037|NODE_FAIL|0:0|None|t4-2
800037.batch|CANCELLED|0:15||t4-2
800037.0|CANCELLED|0:15||t4-2
800037|PENDING|0:0|None|None assigned
"""
# the same job seconds earlier: accounting has the failed run, not yet the requeued one
SACCT_FAILED_ONLY = """800037|NODE_FAIL|0:0|None|t4-2
800037.batch|CANCELLED|0:15||t4-2
"""


def test_sacct_keeps_the_state_and_nodes_of_earlier_runs() -> None:
    st = parse_sacct(SACCT_REQUEUED)["800037"]
    assert (st.state, st.restarts, st.earlier) == ("PENDING", 1, (("NODE_FAIL", "t4-2"),))
    assert parse_sacct(SACCT_FAILED_ONLY)["800037"].earlier == ()


@pytest.mark.parametrize(
    ("exclude", "extra", "nodes", "want_exclude", "want_extra"),
    [
        (None, {}, "t4-2", "t4-2", {}),
        ("cpu-2", {"nodelist": "t4-2"}, "t4-2", "cpu-2,t4-2", {}),  # pinned to the failed node: unpinned
        (None, {"nodelist": "t4-1,t4-2"}, "t4-2", "t4-2", {"nodelist": "t4-1"}),
        (None, {"nodelist": "t4-[1-2]"}, "t4-2", "t4-2", {}),  # a range cannot be checked: dropped
        (None, {"nodelist": "cpu-1"}, "t4-2", "t4-2", {"nodelist": "cpu-1"}),
        ("t4-2", {}, "t4-2", "t4-2", {}),
    ],
)
def test_excluding_a_node_takes_it_out_of_a_pinned_nodelist(
    exclude: str | None, extra: dict[str, str], nodes: str, want_exclude: str, want_extra: dict[str, str]
) -> None:
    res, changes = exclude_nodes(ResourcesConf(exclude=exclude, extra=extra), nodes)
    assert (res.exclude, res.extra) == (want_exclude, want_extra)
    assert changes["exclude"] == (exclude, want_exclude)


def test_hostlists_split_on_top_level_commas() -> None:
    assert split_hostlist("a100-1,t4-[1,2],None") == ["a100-1", "t4-[1,2]"]
    assert split_hostlist(None) == []


def test_plan_for_a_failed_pinned_node_unpins_and_excludes() -> None:
    spec = job_spec({"task": {"target": "a:b"}, "resources": {"extra": {"nodelist": "t4-2"}}})
    step = plan(spec, 1, diagnose("NODE_FAIL", {}), "t4-2", None)
    assert isinstance(step, Resubmit)
    assert step.resources.exclude == "t4-2" and "nodelist" not in step.resources.extra
    assert step.changes["extra.nodelist"] == ("t4-2", None)


def test_disk_full_is_diagnosed_and_not_retried() -> None:
    # the task error of the fault table's disk-full row (a 256 KiB tmpfs filled up)
    err = (
        "FAILED: CheckpointError: could not write checkpoint /tmp/fa/small-fs/ckpt/step_0000000010.ckpt: "
        "[Errno 28] No space left on device; older checkpoints are intact"
    )
    d = diagnose("FAILED", {"task error": err})
    assert (d.cause, d.retryable) == ("disk_full", False)
    assert d.summary.startswith("Checkpoint /tmp/fa/small-fs/ckpt/step_0000000010.ckpt could not be written")
    assert diagnose("FAILED", {"e": "OSError: [Errno 122] Disk quota exceeded"}).cause == "disk_full"


def test_a_manifest_that_cannot_be_written_leaves_the_old_checkpoint(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path)
    mgr.save(5, {"w": 1})
    # the manifest's temporary file cannot be created (a directory is in the way): a real OSError
    blocker = tmp_path / f".{MANIFEST}.tmp.{os.getpid()}"
    blocker.mkdir()
    with pytest.raises(CheckpointError, match=r"could not write checkpoint manifest .*older checkpoints are intact"):
        mgr.save(10, {"w": 2})
    blocker.rmdir()
    assert sorted(p.name for p in tmp_path.iterdir()) == [MANIFEST, "step_0000000005.ckpt"]
    found = mgr.latest()
    assert found is not None and found[0].step == 5 and found[1] == {"w": 1}


JOB = """#!/bin/bash
#SBATCH --requeue
#SBATCH --partition=gpu
#SBATCH --nodelist=t4-2
#SBATCH --exclude=cpu-2
#SBATCH --output={out}/job-%j.out
srun sleep 60
"""


def failed_node_job(tmp_path: Path, fake: FakeSlurm) -> tuple[SlurmCLI, SweepState, TaskRecord]:
    """A --requeue job pinned to t4-2 whose node failed: Slurm requeued it (it waits)."""
    script = tmp_path / "job.sh"
    script.write_text(JOB.format(out=tmp_path))
    slurm = SlurmCLI(runner=fake)
    job_id = slurm.submit(script)
    fake.wait(job_id, ("RUNNING",))
    fake.fail(job_id, "NODE_FAIL")
    spec = job_spec({"task": {"target": "a:b"}, "resources": {"exclude": "cpu-2", "extra": {"nodelist": "t4-2"}}})
    task = TaskRecord(0, [], [Attempt(job_id, 0.0, state="NODE_FAIL", nodes="t4-2")], state="NODE_FAIL")
    sweep = SweepState(str(tmp_path), "slurm", str(tmp_path / ".submitit"), 0.0, [task])
    task.spec_id = sweep.add_spec(dataclasses.asdict(spec))
    fake.calls.clear()
    return slurm, sweep, task


@pytest.fixture()
def fake(tmp_path: Path) -> FakeSlurm:
    # a requeued job waits 60 s (Slurm's BeginTime): the test acts on it while it is pending
    return FakeSlurm(tmp_path / "fake", requeue_delay_s=60.0)


def test_a_node_failure_slurm_requeued_is_not_resubmitted(tmp_path: Path, fake: FakeSlurm) -> None:
    slurm, sweep, task = failed_node_job(tmp_path, fake)
    Recoverer(tmp_path, slurm).handle(sweep, task)  # accounting said NODE_FAIL; Slurm requeued the job
    assert task.state == "PENDING" and len(task.attempts) == 1 and task.attempts[0].state == "PENDING"
    assert not (tmp_path / "audit.jsonl").exists()  # nothing submitted, nothing decided
    assert fake.calls == [["squeue", "-h", "-j", task.job_id, "-o", "%T|%r|%L"]]


def test_controller_silent_leaves_the_task_open(tmp_path: Path, fake: FakeSlurm) -> None:
    slurm, sweep, task = failed_node_job(tmp_path, fake)
    fake.set_controller(up=False)
    Recoverer(tmp_path, slurm).handle(sweep, task)
    assert task.state == "UNKNOWN" and not task.done and len(task.attempts) == 1
    assert not (tmp_path / "audit.jsonl").exists()


def test_requeued_job_has_the_failed_node_excluded_in_place(tmp_path: Path, fake: FakeSlurm) -> None:
    slurm, sweep, task = failed_node_job(tmp_path, fake)
    assert task.job_id is not None
    status = slurm.statuses([task.job_id])[task.job_id]
    assert status.state == "PENDING" and status.earlier == (("NODE_FAIL", "t4-2"),)
    Recoverer(tmp_path, slurm).requeued_after_node_failure(sweep, task, status.earlier, status.state)
    job = fake.job(task.job_id)
    assert job["exclude"] == "cpu-2,t4-2" and job["nodelist"] == ""  # unpinned: it was pinned to t4-2
    assert sweep.suspect_nodes == {"t4-2": 1}
    resources = sweep.spec_of(task)["resources"]
    assert resources["exclude"] == "cpu-2,t4-2" and resources["extra"] == {}
    assert task.diagnosis is not None and task.diagnosis["cause"] == "node_failure"
    records = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(r["type"], r["action"]) for r in records] == [("decision", "exclude_node"), ("outcome", "exclude_node")]
    assert records[1]["ok"] and records[0]["params"] == {"exclude": "cpu-2,t4-2", "nodelist": ""}


def test_requeued_job_already_running_elsewhere_only_marks_the_node(tmp_path: Path, fake: FakeSlurm) -> None:
    slurm, sweep, task = failed_node_job(tmp_path, fake)
    rec = Recoverer(tmp_path, slurm)
    rec.requeued_after_node_failure(sweep, task, (("NODE_FAIL", "t4-2"),), "RUNNING")
    assert sweep.suspect_nodes == {"t4-2": 1} and fake.calls == []
    assert rec.requeued_after_node_failure(sweep, task, (("PREEMPTED", "cpu-2"),), "PENDING") is None
    assert sweep.suspect_nodes == {"t4-2": 1}  # a preemption blames no node
