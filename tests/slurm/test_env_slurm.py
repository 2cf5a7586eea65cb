"""A job's environment on the real cluster (issue 20): `env.vars` exported and `env.setup` run in
the batch script before the job's Python (a variable set from another, a second virtual
environment activated), `env.python` the interpreter the job starts — run as a user runs it,
from a directory outside the checkout, with the user's own module and Hydra's default sweep
directory; and again after Slurm requeues the job (the setup lines run on every run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fault_cases import wait_for

pytestmark = pytest.mark.slurm
EVERY_STEP = ("checkpoint.every_steps=1",)

TASK = """\
import os, sys, time
from slurmagent.runtime import StepLoop, current


class State:
    def __init__(self):
        self.n = 0

    def state_dict(self):
        return {"n": self.n}

    def load_state_dict(self, s):
        self.n = s["n"]


def run(cfg):
    state = State()
    train = cfg.get("train") or {}
    for step in StepLoop(current(), state, total_steps=int(train.get("steps", 1))):
        state.n += 1
        time.sleep(float(train.get("pause_s", 0)))
    return {
        "site": os.environ.get("SITE_VAR"),
        "from_setup": os.environ.get("FROM_SETUP"),
        "venv": os.environ.get("VIRTUAL_ENV"),
        "python": sys.executable,
        "restart": os.environ.get("SLURM_RESTART_COUNT", "0"),
        "n": state.n,
    }
"""


def cli(home: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurmagent", *args], cwd=home, capture_output=True, text=True, timeout=timeout
    )


def env_args(home: Path) -> tuple[list[str], dict[str, str]]:
    """A second venv to activate, and the launcher's interpreter under another of its names."""
    venv = home / "site-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(Path(sys.executable).with_name("python3"))
    args = [
        "task.target=envtask:run",
        "+env.vars.SITE_VAR=a b",
        f'env.setup=["export FROM_SETUP=$SITE_VAR-and-setup","source {venv}/bin/activate"]',
        f"env.python={python}",
        "hydra.launcher.poll_interval_s=1",
        "hydra.launcher.max_poll_interval_s=2",
    ]
    return args, {"venv": str(venv), "python": python}


def the_sweep(home: Path) -> Path:
    (sweep,) = [p.parent for p in (home / "multirun").glob("*/*/sweep.json")]
    return sweep


def result(home: Path, sweep: Path) -> dict[str, object]:
    (task,) = json.loads(cli(home, "status", str(sweep), "--json").stdout)["tasks"]
    assert task["state"] == "COMPLETED", task
    return task["result"]  # type: ignore[no-any-return]


def test_the_job_runs_the_setup_lines_and_the_interpreter_it_is_given(home: Path) -> None:
    (home / "envtask.py").write_text(TASK)
    args, want = env_args(home)
    run = cli(home, "-m", *args)
    assert run.returncode == 0, run.stderr
    got = result(home, the_sweep(home))
    assert got["site"] == "a b" and got["from_setup"] == "a b-and-setup"  # the variables first, then the setup
    assert got["venv"] == want["venv"] and got["python"] == want["python"]


def test_a_requeued_job_runs_its_setup_again_and_resumes(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "envtask.py").write_text(TASK)
    args, want = env_args(home)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "slurmagent", "-m", *args, "+train.steps=30", "+train.pause_s=0.2", *EVERY_STEP],
        cwd=home,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        requeue_midway(home)
    except BaseException:
        launcher.kill()
        raise
    _, err = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, err
    got = result(home, the_sweep(home))
    assert got["restart"] == "1" and got["n"] == 30  # requeued once, resumed: every step counted once
    assert got["from_setup"] == "a b-and-setup" and got["venv"] == want["venv"] and got["python"] == want["python"]


def requeue_midway(home: Path) -> None:
    """`scontrol requeue` the sweep's job once it has written a checkpoint."""
    sweep = wait_for(lambda: next(iter((home / "multirun").glob("*/*")), None), "the sweep directory", 60)

    def running_job() -> str | None:
        path = sweep / "sweep.json"
        tasks = json.loads(path.read_text()).get("tasks", []) if path.exists() else []
        ckpts = sweep / "0" / "checkpoints"
        ok = tasks and tasks[0]["attempts"] and ckpts.is_dir() and any(ckpts.iterdir())
        return str(tasks[0]["attempts"][-1]["job_id"]) if ok else None

    job = wait_for(running_job, "the task's first checkpoint", 120)
    subprocess.run(["scontrol", "requeue", job], check=True)  # as an admin or a preemption would


EDITABLE = """\
import os, time
from slurmagent.runtime import StepLoop, current

FACTOR = 1


class State:
    def __init__(self):
        self.total = 0

    def state_dict(self):
        return {"total": self.total}

    def load_state_dict(self, s):
        self.total = s["total"]


def run(cfg):
    state = State()
    for step in StepLoop(current(), state, total_steps=30):
        state.total += FACTOR * (step + 1)
        time.sleep(0.2)
    return {"total": state.total, "restart": os.environ.get("SLURM_RESTART_COUNT", "0"), "file": __file__}
"""


def test_code_edited_after_submission_does_not_reach_a_requeued_task(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "mytrain.py").write_text(EDITABLE)
    poll = ("hydra.launcher.poll_interval_s=1", "hydra.launcher.max_poll_interval_s=2")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "slurmagent", "-m", "task.target=mytrain:run", *EVERY_STEP, *poll],
        cwd=home,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ckpt = wait_for(lambda: next(iter((home / "multirun").glob("*/*/0/checkpoints/*")), None), "a checkpoint", 120)
        (home / "mytrain.py").write_text(EDITABLE.replace("FACTOR = 1", "FACTOR = 1000"))  # the user edits on
        job = json.loads((ckpt.parents[2] / "sweep.json").read_text())["tasks"][0]["attempts"][-1]["job_id"]
        subprocess.run(["scontrol", "requeue", str(job)], check=True)
    except BaseException:
        launcher.kill()
        raise
    out, err = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, err
    sweep = the_sweep(home)
    got = result(home, sweep)
    assert got["restart"] == "1" and got["total"] == sum(range(1, 31)), got  # the code as submitted, resumed
    assert "code: a snapshot of" in err + out, err
    assert str(sweep / ".slurmagent" / "code" / "files") in str(got["file"])
    status = cli(home, "status", str(sweep)).stdout
    assert f"code: a snapshot of {home.resolve()}" in status, status
