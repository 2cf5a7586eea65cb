"""Launch, supervision, the job's own stop path and recovery, end to end through the fake
Slurm (tests/fake/fake_slurm.py): the real CLI, launcher, submitit script, runtime and
supervisor, with Slurm's commands answered by the fake and the jobs run as local processes.
Each test takes seconds; tests/slurm/ proves the same paths on the real cluster."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from slurmagent.schedule.history import HistoryStore, default_history_path
from tests.conftest import audit_records, chain_digest
from tests.fake.conftest import finish, first_job_id, running, slurmagent, start, sweep_state
from tests.fake.fake_slurm import FakeSlurm

SYNTHETIC = ("+experiment=synthetic", "cluster=slurm", "hydra.launcher.poll_interval_s=0.3")


def audit(sweep: Path) -> list[dict[str, object]]:
    path = sweep / "audit.jsonl"
    return audit_records(path)


def test_launch_submits_one_array_and_supervises_it_to_the_end(fake: FakeSlurm, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc = slurmagent(fake, tmp_path, *SYNTHETIC, "-m", "synthetic.steps=3,4,5", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stderr
    state = sweep_state(sweep)
    assert state["backend"] == "slurm" and len(state["array_ids"]) == 1
    assert [t["state"] for t in state["tasks"]] == ["COMPLETED"] * 3
    assert [t["result"]["digest"] for t in state["tasks"]] == [chain_digest(3), chain_digest(4), chain_digest(5)]
    calls = fake.logged_calls()
    sbatch = [c for c in calls if c[0] == "sbatch"]
    assert len(sbatch) == 1  # one array for the three tasks, through the seam's submit verb
    script = Path(sbatch[0][-1]).read_text()
    for line in (
        "#SBATCH --array=0-2%3",
        "#SBATCH --requeue",
        "#SBATCH --signal=USR2@60",
        "#SBATCH --open-mode=append",
    ):
        assert line in script
    # supervision: one batched status query per poll, never one per task
    sacct = [c for c in calls if c[0] == "sacct"]
    assert sacct and all(c[c.index("-j") + 1] == state["array_ids"][0] for c in sacct)
    assert not [c for c in calls if c[0] == "squeue"]


def test_bad_partition_is_refused_before_anything_is_submitted(fake: FakeSlurm, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc = slurmagent(fake, tmp_path, *SYNTHETIC, "-m", "resources.partition=nosuch", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 2
    assert "resources.partition='nosuch' does not exist; valid partitions: gpu, high, low" in proc.stderr
    assert not [c for c in fake.logged_calls() if c[0] == "sbatch"] and not fake.jobs()


def test_host_oom_is_diagnosed_and_resubmitted_with_more_memory(fake: FakeSlurm, tmp_path: Path) -> None:
    launcher, sweep, job = running(
        fake,
        tmp_path,
        *SYNTHETIC,
        "-m",
        "synthetic.steps=80",
        "synthetic.step_time_s=0.05",
        "checkpoint.every_steps=5",
        steps=12,
    )
    fake.fail(job, "OUT_OF_MEMORY")  # the cgroup's OOM kill, with slurmstepd's line in stderr
    finish(launcher)
    state = sweep_state(sweep)
    (task,) = state["tasks"]
    assert task["state"] == "COMPLETED" and len(task["attempts"]) == 2
    assert task["attempts"][0]["state"] == "OUT_OF_MEMORY" and task["diagnosis"]["cause"] == "host_oom"
    assert state["specs"][task["spec_id"]]["resources"]["mem"] == "384M"  # 256M × 1.5
    # resumed from a periodic checkpoint (every 5 steps; the one at step 10 may still have been
    # in flight, in the background, when the job was killed)
    assert task["result"]["digest"] == chain_digest(80) and task["result"]["resumed_from"] >= 5
    decisions = [(r["type"], r["action"], r["decision"]) for r in audit(sweep)]
    assert decisions == [("decision", "resubmit", "allow"), ("outcome", "resubmit", "allow")]


def test_preempted_job_is_requeued_by_slurm_and_resumes_exactly(fake: FakeSlurm, tmp_path: Path) -> None:
    launcher, sweep, job = running(
        fake,
        tmp_path,
        *SYNTHETIC,
        "-m",
        "synthetic.steps=80",
        "synthetic.step_time_s=0.05",
        "checkpoint.every_steps=1000",
        steps=10,
    )
    fake.preempt(job)  # SIGCONT + SIGTERM + USR2 to the step; Slurm requeues it (PreemptMode=REQUEUE)
    finish(launcher)
    (task,) = sweep_state(sweep)["tasks"]
    assert len(task["attempts"]) == 1 and task["attempts"][0]["restarts"] == 1  # not a new attempt
    result = task["result"]
    assert result["digest"] == chain_digest(80) and result["resumed_from"] >= 10  # the stop checkpoint
    assert result["steps_run_here"] == 80 - result["resumed_from"]  # no step redone
    assert fake.job(job)["runs"][0][0] == "PREEMPTED"
    # the requeued run started from what the stopped one left (no composition, no sweep context)
    assert (sweep / ".slurmagent" / "requeue" / f"0-{job}.pkl").is_file()
    assert audit(sweep) == []  # SIGTERM: Slurm's own requeue, nothing for the gate


# 4 s of work; the warning comes with 1:30 - 0:30 left: within its lead + slack
NEAR_THE_LIMIT = (
    "synthetic.steps=80",
    "synthetic.step_time_s=0.05",
    "checkpoint.every_steps=1000",
    "resources.time=00:01:30",
)


def test_time_limit_warning_makes_the_job_requeue_itself_through_the_gate(fake: FakeSlurm, tmp_path: Path) -> None:
    # the requeue path, though the rest would fit (finishing instead: the test below)
    off = "recovery.finish_before_limit=false"
    launcher, sweep, job = running(fake, tmp_path, *SYNTHETIC, "-m", *NEAR_THE_LIMIT, off, steps=10)
    fake.warn(job)  # Slurm's --signal=USR2@60 before the time limit
    finish(launcher)
    (task,) = sweep_state(sweep)["tasks"]
    assert task["result"]["digest"] == chain_digest(80) and task["attempts"][0]["restarts"] == 1
    records = audit(sweep)
    assert [(r["type"], r["action"], r["decision"]) for r in records] == [
        ("decision", "requeue", "allow"),
        ("outcome", "requeue", "allow"),
    ]
    assert records[0]["context"]["cause"] == "time_limit"  # type: ignore[index]
    assert ["scontrol", "requeue", job] in fake.logged_calls()  # from inside the job, through the seam
    assert fake.job(job)["runs"][0][0] == "REQUEUED"


def test_time_limit_warning_with_a_few_seconds_of_work_left_finishes_instead_of_requeueing(
    fake: FakeSlurm, tmp_path: Path
) -> None:
    """Was: requeued at the warning whatever was left (a bench job at 98 % of its work went back
    to the queue for 2 s of it). The loop saves its stop checkpoint, asks Slurm the time left,
    and finishes: one run, no requeue, nothing for the gate to decide."""
    launcher, sweep, job = running(fake, tmp_path, *SYNTHETIC, "-m", *NEAR_THE_LIMIT, steps=10)
    fake.warn(job)  # ~75 s left, ~4 s of work
    finish(launcher)
    (task,) = sweep_state(sweep)["tasks"]
    assert task["result"]["digest"] == chain_digest(80) and task["attempts"][0]["restarts"] == 0, task
    assert task["result"]["resumed_from"] is None and task["result"]["steps_run_here"] == 80  # never restored
    assert not (sweep / "audit.jsonl").exists() or not audit(sweep)
    assert ["scontrol", "requeue", job] not in fake.logged_calls() and not fake.job(job)["runs"]
    assert ["squeue", "-h", "-j", job, "-o", "%T|%r|%L"] in fake.logged_calls()  # it asked Slurm the time left
    log = slurmagent(fake, tmp_path, "logs", str(sweep), "0", "--tail", "0").stdout
    assert "finishing instead of requeueing (recovery.finish_before_limit)" in log, log


def test_recovery_waits_while_paused_and_runs_after_resume(fake: FakeSlurm, tmp_path: Path) -> None:
    """The kill switch holds the supervisor's resubmission; `slurmagent resume` lets it run."""
    launcher, sweep, job = running(fake, tmp_path, *SYNTHETIC, "-m", "synthetic.steps=80", "synthetic.step_time_s=0.05")
    assert slurmagent(fake, tmp_path, "pause", "--sweep", str(sweep)).returncode == 0
    fake.fail(job, "OUT_OF_MEMORY")
    deadline = time.monotonic() + 60
    while not any(r["decision"] == "held" for r in audit(sweep)):
        assert time.monotonic() < deadline, "the resubmission was not held"
        time.sleep(0.1)
    assert len(sweep_state(sweep)["tasks"][0]["attempts"]) == 1  # nothing ran while paused
    assert slurmagent(fake, tmp_path, "resume", "--sweep", str(sweep)).returncode == 0
    finish(launcher)
    (task,) = sweep_state(sweep)["tasks"]
    assert task["state"] == "COMPLETED" and len(task["attempts"]) == 2


def test_watch_takes_over_after_the_launcher_is_killed(fake: FakeSlurm, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    launcher = start(
        fake,
        tmp_path,
        *SYNTHETIC,
        "-m",
        "synthetic.steps=30,31",
        "synthetic.step_time_s=0.05",
        f"hydra.sweep.dir={sweep}",
    )
    first_job_id(sweep)
    launcher.send_signal(signal.SIGKILL)
    launcher.communicate(timeout=30)
    proc = slurmagent(fake, tmp_path, "watch", str(sweep), "--interval", "0.3")
    assert proc.returncode == 0, proc.stderr
    assert [t["result"]["digest"] for t in sweep_state(sweep)["tasks"]] == [chain_digest(30), chain_digest(31)]


def test_a_stop_signal_before_the_runtime_is_ready_is_held_not_fatal(fake: FakeSlurm, tmp_path: Path) -> None:
    """Slurm may signal a job during its first second (the time-limit warning can come a
    minute early). The job process blocks the stop signals from its first line (job/boot.py)
    and the runtime takes them when it is ready: the job stops cleanly and requeues itself."""
    launcher, sweep, job = running(fake, tmp_path, *SYNTHETIC, "-m", "synthetic.steps=40")
    log = sweep / ".submitit" / f"{job}_0_log.out"
    deadline = time.monotonic() + 60
    while "Starting with JobEnvironment" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    fake.warn(job)  # USR2 while submitit is still loading the task: no handler of ours yet
    finish(launcher)
    (task,) = sweep_state(sweep)["tasks"]
    assert task["state"] == "COMPLETED" and task["result"]["digest"] == chain_digest(40)
    assert task["attempts"][0]["restarts"] == 1  # it requeued itself once, through the gate
    assert [r["action"] for r in audit(sweep)] == ["requeue", "requeue"]


def test_a_requeued_preemption_is_never_a_failure_even_while_accounting_lags(tmp_path: Path) -> None:
    """Accounting shows PREEMPTED for a while before the requeued run: the supervisor asks the
    controller, sees the job waiting again, and neither fails nor resubmits the task."""
    fake = FakeSlurm(tmp_path / "fake-slurm", kill_wait_s=3.0, accounting_lag_s=4.0)
    launcher, sweep, job = running(
        fake, tmp_path, *SYNTHETIC, "-m", "synthetic.steps=80", "synthetic.step_time_s=0.05", steps=10
    )
    fake.preempt(job)
    err = finish(launcher)
    assert "FAILED" not in err and "resubmitted" not in err
    (task,) = sweep_state(sweep)["tasks"]
    assert len(task["attempts"]) == 1 and task["attempts"][0]["restarts"] == 1
    assert task["result"]["digest"] == chain_digest(80)
    assert ["squeue", "-h", "-j", job, "-o", "%i|%T|%r|%L"] in fake.logged_calls()  # it asked


def test_runs_that_accounting_shows_ended_late_still_reach_the_job_history(tmp_path: Path) -> None:
    """slurmdbd lags the controller: a short job is not in sacct at all until after its result is
    on disk and the sweep is done. The supervisor asks again until accounting shows it ended (at
    most SETTLE_S), so the history that `plan` and `auto` size the next sweep from holds every
    run. Was: such runs never reached it (the README's `auto` cluster test failed 2 of 3 runs)."""
    fake = FakeSlurm(tmp_path / "fake-slurm", kill_wait_s=3.0, record_lag_s=3.0)
    sweep = tmp_path / "sweep"
    proc = slurmagent(fake, tmp_path, *SYNTHETIC, "-m", "synthetic.steps=3,4", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stderr
    state = sweep_state(sweep)
    assert [t["state"] for t in state["tasks"]] == ["COMPLETED"] * 2
    keys = {f"{state['sweep_dir']}#{t['index']}" for t in state["tasks"]}
    assert HistoryStore(default_history_path()).known(keys) == keys


def test_a_preemption_that_cancels_the_job_is_recovered(fake: FakeSlurm, tmp_path: Path) -> None:
    """PreemptMode=CANCEL: the job ends PREEMPTED; the supervisor resubmits the task."""
    launcher, sweep, job = running(
        fake, tmp_path, *SYNTHETIC, "-m", "synthetic.steps=80", "synthetic.step_time_s=0.05", steps=10
    )
    fake.preempt(job, requeue=False)
    finish(launcher)
    (task,) = sweep_state(sweep)["tasks"]
    assert [a["state"] for a in task["attempts"]] == ["PREEMPTED", "COMPLETED"]
    assert task["result"]["digest"] == chain_digest(80) and task["result"]["resumed_from"] >= 10


def test_a_task_recovery_gave_up_on_gets_a_fix_command_that_works(fake: FakeSlurm, tmp_path: Path) -> None:
    """recovery.max_attempts=1: a host OOM is not retried; `doctor` prints the fix as a command
    (the task again, with the memory recovery would have given it), and that command, run as
    printed from the same directory, completes the task."""
    launcher, sweep, job = running(
        fake, tmp_path, *SYNTHETIC, "-m", "synthetic.steps=20", "synthetic.step_time_s=0.05", "recovery.max_attempts=1"
    )
    fake.fail(job, "OUT_OF_MEMORY")
    launcher.communicate(timeout=180)
    (task,) = sweep_state(sweep)["tasks"]
    assert task["state"] == "OUT_OF_MEMORY" and len(task["attempts"]) == 1
    fix = task["diagnosis"]["fix_command"]
    assert " resources.mem=384M " in fix and fix.endswith(" -m") and "+experiment=synthetic" in fix, fix
    doctor = slurmagent(fake, tmp_path, "doctor", str(sweep))
    assert doctor.returncode == 1 and f"  fix: {fix}" in doctor.stdout.splitlines(), doctor.stdout
    argv = shlex.split(fix)
    assert argv[0] == sys.executable and "hydra.sweep.dir" not in fix  # a new sweep of its own
    again = subprocess.run(argv, cwd=tmp_path, env=fake.env(), capture_output=True, text=True, timeout=240)
    assert again.returncode == 0, again.stderr
    (new_sweep,) = [p.parent for p in (tmp_path / "multirun").glob("*/*/sweep.json")]
    state = sweep_state(new_sweep)
    (redo,) = state["tasks"]
    assert redo["state"] == "COMPLETED" and state["specs"][redo["spec_id"]]["resources"]["mem"] == "384M"
    assert redo["result"]["digest"] == chain_digest(20)
