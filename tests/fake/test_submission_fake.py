"""A sweep's submission never orphans a job, end to end through the fake Slurm: the real
CLI, launcher and supervisor, with sbatch refusing as Slurm does (a per-user submit limit,
a permanent refusal, a controller that is down). tests/slurm/test_submission_slurm.py
proves the same on the real cluster."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.fake.conftest import slurmagent, start, sweep_state
from tests.fake.fake_slurm import FakeSlurm

QUICK = ("+experiment=synthetic", "cluster=slurm", "hydra.launcher.poll_interval_s=0.3", "synthetic.step_time_s=0.01")


def test_a_sweep_larger_than_the_submit_limit_completes_within_it(fake: FakeSlurm, tmp_path: Path) -> None:
    fake.set_submit_limit(2)  # sacctmgr … set MaxSubmitJobs=2
    sweep = tmp_path / "sweep"
    proc = slurmagent(fake, tmp_path, *QUICK, "-m", "synthetic.steps=2,3,4,5,6,7", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stderr
    assert "4 task(s) wait: Slurm's submit limit (2 jobs per user) is reached" in proc.stderr
    state = sweep_state(sweep)
    assert [t["state"] for t in state["tasks"]] == ["COMPLETED"] * 6 and not state["held_back"]
    assert fake.max_queued() == 2 and not fake.limit_refusals()  # never more than the limit, never refused
    assert all(i["state"] == "submitted" for i in state["submissions"])
    assert len(state["array_ids"]) == len(state["submissions"]) >= 3


def test_a_permanent_refusal_exits_2_and_leaves_the_accepted_tasks_supervised(fake: FakeSlurm, tmp_path: Path) -> None:
    fake.refuse_sbatch("Batch job submission failed: Invalid account or account/partition combination specified")
    sweep = tmp_path / "sweep"
    proc = slurmagent(
        fake, tmp_path, *QUICK, "-m", "synthetic.steps=3", "resources.mem=1G,2G", f"hydra.sweep.dir={sweep}"
    )
    assert proc.returncode == 2, proc.stderr
    assert "Slurm refused 1 task(s): sbatch: error: Batch job submission failed: Invalid account" in proc.stderr
    assert "Traceback" not in proc.stderr
    state = sweep_state(sweep)
    assert [t["state"] for t in state["tasks"]] == ["REFUSED", "COMPLETED"]
    assert "Invalid account" in state["tasks"][0]["error"]


def test_on_refusal_cancel_cancels_what_was_accepted(fake: FakeSlurm, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    # the first array is accepted, the second refused
    fake.refuse_sbatch("Batch job submission failed: Invalid qos specification", after=1)
    launcher = start(
        fake,
        tmp_path,
        *QUICK,
        "-m",
        "synthetic.steps=500",
        "synthetic.step_time_s=0.1",
        "resources.mem=1G,2G",
        "hydra.launcher.on_refusal=cancel",
        f"hydra.sweep.dir={sweep}",
    )
    _, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 2, err
    assert "Invalid qos specification" in err and "cancelled (hydra.launcher.on_refusal=cancel)" in err
    state = sweep_state(sweep)
    assert [t["state"] for t in state["tasks"]] == ["CANCELLED", "REFUSED"]
    assert all(j["state"] == "CANCELLED" for j in fake.jobs().values())


def test_a_launcher_killed_while_the_controller_is_down_leaves_a_sweep_watch_completes(
    fake: FakeSlurm, tmp_path: Path
) -> None:
    """slurmctld down at submission: the launcher retries; killed meanwhile, it leaves every
    task in sweep.json (WAITING, with its submission's intent), and `watch` submits them
    once the controller is back and completes the sweep."""
    sweep = tmp_path / "sweep"
    launcher = start(fake, tmp_path, *QUICK, "-m", "synthetic.steps=2,3", f"hydra.sweep.dir={sweep}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if [c for c in fake.logged_calls() if c[0] == "sacctmgr"]:  # the submit limit is read just before sbatch
            fake.set_controller(False)
            break
        time.sleep(0.02)
    while time.monotonic() < deadline and not ((sweep / "sweep.json").exists() and sweep_state(sweep)["submissions"]):
        time.sleep(0.05)
    time.sleep(1.5)  # a retry or two
    launcher.kill()
    launcher.communicate(timeout=30)
    state = sweep_state(sweep)
    assert [t["state"] for t in state["tasks"]] == ["WAITING", "WAITING"]
    (intent,) = state["submissions"]
    assert intent["state"] == "submitting" and intent["tasks"] == [0, 1]
    fake.set_controller(True)
    intent["at"] -= 120  # two minutes later: the dead launcher's sbatch is long over
    (sweep / "sweep.json").write_text(json.dumps(state))
    proc = slurmagent(fake, tmp_path, "watch", str(sweep), "--interval", "0.3", "--timeout", "120")
    assert proc.returncode == 0, proc.stderr
    state = sweep_state(sweep)
    assert [t["state"] for t in state["tasks"]] == ["COMPLETED", "COMPLETED"]
    assert [i["state"] for i in state["submissions"]] == ["submitted"]  # the lost intent dropped, one array
    assert len([j for j in fake.jobs().values() if j["array"]]) == 2


def test_a_cap_on_jobs_in_a_partition_holds_tasks_back_until_others_end(fake: FakeSlurm, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc = slurmagent(
        fake,
        tmp_path,
        *QUICK,
        "-m",
        "synthetic.steps=2,3,4,5,6",
        "+site.scheduling.max_jobs_per_partition.low=2",
        f"hydra.sweep.dir={sweep}",
    )
    assert proc.returncode == 0, proc.stderr
    assert "3 task(s) wait: reached 2 jobs in partition low (your cap)" in proc.stderr
    state = sweep_state(sweep)
    assert [t["state"] for t in state["tasks"]] == ["COMPLETED"] * 5
    assert fake.max_queued() == 2 and not fake.limit_refusals()
