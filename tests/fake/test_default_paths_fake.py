"""The path a user takes by default, through the fake Slurm: launched from a fresh directory
that is not the checkout, no `hydra.sweep.dir` (Hydra's `multirun/${now:…}`), no
`checkpoint.dir` unless the test is about it. tests/slurm/test_default_paths_slurm.py proves
the same on the real cluster."""

from __future__ import annotations

import time
from pathlib import Path

from slurmagent.primitives.env import sweep_key
from tests.conftest import chain_digest
from tests.fake.conftest import finish, slurmagent, start, sweep_state
from tests.fake.fake_slurm import FakeSlurm
from tests.fake.test_through_fake_slurm import SYNTHETIC


def default_sweep(home: Path, timeout: float = 60) -> Path:
    """The one sweep Hydra's default sweep dir put under `home` (multirun/DATE/TIME)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [p for p in home.glob("multirun/*/*") if (p / "sweep.json").is_file()]
        if found:
            assert len(found) == 1, found
            return found[0]
        time.sleep(0.1)
    raise TimeoutError(f"no sweep under {home}/multirun")


def job_of(sweep: Path, task: int = 0, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tasks = sweep_state(sweep)["tasks"]
        if len(tasks) > task and tasks[task]["attempts"]:
            return str(tasks[task]["attempts"][-1]["job_id"])
        time.sleep(0.1)
    raise TimeoutError(f"task {task} of {sweep} was not submitted")


def test_a_preempted_task_resumes_under_the_default_sweep_dir(fake: FakeSlurm, tmp_path: Path) -> None:
    """Was: the requeued run died in Hydra's run_job on `${now:…}` (UnsupportedInterpolationType)."""
    home = tmp_path / "home"
    home.mkdir()
    launcher = start(fake, home, *SYNTHETIC, "-m", "synthetic.steps=80", "synthetic.step_time_s=0.05")
    sweep = default_sweep(home)
    job = job_of(sweep)
    fake.wait(job, ("RUNNING",))
    deadline = time.monotonic() + 60
    while not (sweep / "0" / "metrics.jsonl").is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    fake.preempt(job)
    finish(launcher)
    (task,) = sweep_state(sweep)["tasks"]
    assert task["state"] == "COMPLETED" and task["attempts"][0]["restarts"] == 1, task
    assert task["result"]["digest"] == chain_digest(80) and task["result"]["resumed_from"] > 0, task["result"]
    # the requeued run wrote into the same task directory, not a new multirun/<now>
    assert [p.relative_to(home) for p in home.glob("multirun/*/*")] == [sweep.relative_to(home)]
    # runs are numbered alike by the job (ctx.attempt) and by `logs` (was: "attempt 1" for both runs)
    assert task["result"]["attempt"] == 2
    logs = slurmagent(fake, home, "logs", str(sweep), "0", "--tail", "0").stdout
    assert f"==> runs 1–2, job {job}, stdout:" in logs, logs
    assert f"[slurmagent] task 0, run 1 (job {job})" in logs and f"task 0, run 2 (job {job}, requeued 1x)" in logs


def test_a_shared_checkpoint_dir_gives_each_task_its_own_directory(fake: FakeSlurm, tmp_path: Path) -> None:
    """Was: the tasks of `-m … checkpoint.dir=D` all wrote into D, and a later one "resumed" from
    another's final checkpoint and reported its result."""
    home, ckpt = tmp_path / "home", tmp_path / "ckpt"
    home.mkdir()
    args = (*SYNTHETIC, "-m", "synthetic.steps=12,20", "synthetic.step_time_s=0", "checkpoint.every_steps=4")
    finish(start(fake, home, *args, f"checkpoint.dir={ckpt}"))
    sweep = default_sweep(home)
    tasks = sweep_state(sweep)["tasks"]
    assert [t["result"]["digest"] for t in tasks] == [chain_digest(12), chain_digest(20)]
    assert all(not t["result"]["resumed_from"] for t in tasks), tasks
    under = ckpt / sweep_key(sweep)
    assert sorted(p.name for p in under.iterdir()) == ["0", "1"]
    assert all((under / i / "manifest.json").is_file() for i in ("0", "1"))
    assert not (sweep / "0" / "checkpoints").exists()  # they went where the user asked
    # the same sweep again into the same checkpoint.dir: a sweep of its own, nothing resumed from the first
    finish(start(fake, home, *args, f"checkpoint.dir={ckpt}", f"hydra.sweep.dir={home / 'again'}"))
    again = sweep_state(home / "again")["tasks"]
    assert all(not t["result"]["resumed_from"] for t in again), again
    assert len(list(ckpt.iterdir())) == 2


def test_a_checkpoint_dir_whose_parent_is_missing_is_refused_and_nothing_is_created(
    fake: FakeSlurm, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    missing = tmp_path / "nonexistent" / "ckpts"
    proc = slurmagent(fake, home, *SYNTHETIC, "-m", "synthetic.steps=3", f"checkpoint.dir={missing}")
    assert proc.returncode == 2, proc.stderr
    assert f"checkpoint.dir={missing}: its parent {missing.parent} does not exist" in proc.stderr, proc.stderr
    assert "nothing was submitted" in proc.stderr and "Traceback" not in proc.stderr
    assert not missing.parent.exists() and not (home / "multirun").exists()
    assert fake.jobs() == {}
    # a single run (no -m) is checked the same way before it starts
    local = slurmagent(fake, home, "+experiment=synthetic", "cluster=local", f"checkpoint.dir={missing}")
    assert local.returncode == 2 and "does not exist" in local.stderr, local.stderr
    assert not missing.parent.exists()


def test_max_attempts_counts_submissions_not_slurms_requeues(fake: FakeSlurm, tmp_path: Path) -> None:
    """recovery.max_attempts bounds the submissions of a task (the first and recovery's
    resubmissions); Slurm's own requeues of a preempted job are not attempts: a task preempted
    twice under max_attempts=1 still completes, in one submission of three runs."""
    home = tmp_path / "home"
    home.mkdir()
    launcher = start(fake, home, *SYNTHETIC, "-m", "synthetic.steps=120", "synthetic.step_time_s=0.05",
                     "recovery.max_attempts=1")  # fmt: skip
    sweep = default_sweep(home)
    job = job_of(sweep)
    for restarts in (0, 1):
        fake.wait(job, ("RUNNING",))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            lines = (
                (sweep / "0" / "metrics.jsonl").read_text().splitlines()
                if (sweep / "0" / "metrics.jsonl").exists()
                else []
            )
            if len(lines) >= 10 * (restarts + 1):
                break
            time.sleep(0.05)
        fake.preempt(job)
    finish(launcher)
    (task,) = sweep_state(sweep)["tasks"]
    assert task["state"] == "COMPLETED" and len(task["attempts"]) == 1 and task["attempts"][0]["restarts"] == 2, task
    assert task["result"]["attempt"] == 3 and task["result"]["digest"] == chain_digest(120)
