"""A job in a podman container on the real cluster (issue 20): `env.container.runtime=podman`,
run as a user runs it — from a directory outside the checkout, the user's own module, Hydra's
default sweep directory, no checkpoint.dir. The job is preempted by a high-priority job that
takes its node; Slurm's SIGTERM reaches the training process inside the container through
podman; the checkpoint it wrote went through the bound sweep directory to the host; the
requeued run, in a new container, resumes from it and ends bit-identical to an uninterrupted run.

The image is the host's own root file system as an overlay (`env.container.image=/`: podman
`--rootfs /:O`): no registry here, and the overlay is a real container — its own mount, PID
and IPC namespaces, writes outside the binds lost with it (`/run/.containerenv` is podman's
mark inside). This machine's quirks are the test cluster's containers.conf (runc, not crun,
for the hybrid cgroup layout; ulimits no higher than the VM's), passed as `CONTAINERS_CONF`
through env.vars — as a site sets its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fault_cases import wait_for

from tests.conftest import audit_records, chain_digest

pytestmark = pytest.mark.slurm

TASK = """\
import hashlib, os, time
from slurmagent.runtime import StepLoop, current


class State:
    def __init__(self):
        self.digest = hashlib.sha256(b"start").hexdigest()

    def state_dict(self):
        return {"digest": self.digest}

    def load_state_dict(self, s):
        self.digest = s["digest"]


def run(cfg):
    ctx = current()
    state = State()
    loop = StepLoop(ctx, state, total_steps=int(cfg.train.steps))
    for step in loop:
        state.digest = hashlib.sha256(f"{state.digest}:{step}".encode()).hexdigest()
        loop.report(seen=1.0)
        time.sleep(float(cfg.train.pause_s))
    return {
        "digest": state.digest,
        "in_container": os.path.exists("/run/.containerenv"),
        "pid": os.getpid(),
        "restart": os.environ.get("SLURM_RESTART_COUNT", "0"),
        "resumed_from": loop.start_step,
        "checkpoint_dir": str(ctx.checkpoint_dir),
    }
"""
STEPS = 40


def containers_conf(slurm_conf: str) -> str:
    path = Path(slurm_conf).with_name("containers.conf")
    assert path.is_file(), f"{path} missing: run tests/cluster/slurm-cluster up (it writes it)"
    return str(path)


def state(sweep: Path) -> dict[str, Any]:
    try:
        return json.loads((sweep / "sweep.json").read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return {"tasks": []}


def launch(home: Path, slurm_conf: str) -> subprocess.Popen[str]:
    """The user's sweep of one task in a podman container, from `home`, defaults left alone."""
    (home / "ctask.py").write_text(TASK)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "slurmagent",
            "-m",
            "task.target=ctask:run",
            f"+train.steps={STEPS}",
            "+train.pause_s=0.25",
            "checkpoint.every_steps=1",
            "env.container.runtime=podman",
            "env.container.image=/",
            f"env.python={sys.executable}",  # the host's venv, seen through the overlay
            f"+env.vars.CONTAINERS_CONF={containers_conf(slurm_conf)}",
            "hydra.launcher.poll_interval_s=1",
            "hydra.launcher.max_poll_interval_s=2",
        ],
        cwd=home,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def running_in_container(home: Path) -> tuple[Path, str, str]:
    """(the sweep, the task's job, its node) once the task has run 8 steps in its container."""
    sweep = wait_for(
        lambda: next((p for p in home.glob("multirun/*/*") if (p / "sweep.json").is_file()), None),
        "the sweep under multirun/",
        180,
    )

    def running() -> tuple[str, str] | None:
        tasks = state(sweep)["tasks"]
        metrics = sweep / "0" / "metrics.jsonl"
        lines = len(metrics.read_text().splitlines()) if metrics.exists() else 0
        if not tasks or not tasks[0]["attempts"] or lines < 8:
            return None
        job = str(tasks[0]["attempts"][-1]["job_id"])
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %N"], capture_output=True, text=True)
        st, _, node = out.stdout.strip().partition(" ")
        return (job, node) if st == "RUNNING" and node else None

    job, node = wait_for(running, "the task running in its container, 8 steps in", 240)
    return sweep, job, node


def ended(launcher: subprocess.Popen[str], sweep: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the task, its result) once the launcher is done: it ended well, the task completed in a container."""
    try:
        out, err = launcher.communicate(timeout=420)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, out + err
    (task,) = state(sweep)["tasks"]
    assert task["state"] == "COMPLETED", task
    assert task["result"]["in_container"] is True, task["result"]  # podman's mark inside
    return task, task["result"]


def logged_steps(sweep: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (sweep / "0" / "metrics.jsonl").read_text().splitlines()]


def test_a_podman_job_is_preempted_and_resumes_bit_identically_in_a_new_container(home: Path, slurm_conf: str) -> None:
    launcher = launch(home, slurm_conf)
    try:
        sweep, job, node = running_in_container(home)
        # a high-priority job that needs the whole node preempts (requeues) the low-priority one
        subprocess.run(
            ["sbatch", "-p", "high", "-w", node, "--exclusive", "--time=2", "-o", "/dev/null", "--wrap", "sleep 1"],
            check=True,
            capture_output=True,
            timeout=60,
        )
    except BaseException:
        launcher.kill()
        raise
    task, result = ended(launcher, sweep)
    assert result["pid"] != 1, result  # catatonit is PID 1
    assert task["attempts"][0]["restarts"] >= 1 and result["restart"] != "0", task  # preempted, requeued by Slurm
    history = subprocess.run(
        ["sacct", "-n", "-X", "-D", "-j", job, "-o", "State"], capture_output=True, text=True, timeout=60
    ).stdout.split()
    assert "PREEMPTED" in history or "REQUEUED" in history, history
    # resumed, not restarted: the new container went on from the checkpoint the first run wrote
    # through the bound sweep directory (Slurm's SIGTERM at the preemption reaches the loop through
    # the host side, job/host.py; at most the step in flight is redone, as outside a container)
    start = result["resumed_from"]
    assert 8 <= start < STEPS, result
    steps = logged_steps(sweep)
    assert steps[: steps.index(start)] == list(range(start)) and steps[-(STEPS - start) :] == list(range(start, STEPS))
    assert len(steps) - STEPS <= 2, steps  # at most the step in flight (and its report) redone
    ckpts = Path(result["checkpoint_dir"])
    assert ckpts.is_relative_to(sweep) and any(ckpts.iterdir()), ckpts
    assert result["digest"] == chain_digest(STEPS), result  # an uninterrupted run's digest, bit for bit


def test_a_podman_job_told_to_stop_requeues_itself_through_its_host_side(home: Path, slurm_conf: str) -> None:
    """`scancel --signal=USR2` (what a preemption with a grace time or a person sends): the loop in
    the container checkpoints at the step boundary and requeues its own job; `scontrol requeue`
    and the `squeue` before it run on the host (job/host.py's relay: no Slurm client or munge in
    the image). The same job runs again, resumes in a new container, no step redone."""
    launcher = launch(home, slurm_conf)
    try:
        sweep, job, _ = running_in_container(home)
        subprocess.run(["scancel", "--signal=USR2", job], check=True, capture_output=True, timeout=60)
    except BaseException:
        launcher.kill()
        raise
    task, result = ended(launcher, sweep)
    assert result["restart"] != "0", result
    assert [a["job_id"] for a in task["attempts"]] == [job] and task["attempts"][0]["restarts"] >= 1, task
    # the job's own requeue, through the gate, once; squeue answered from the host (State=RUNNING)
    records = audit_records(sweep / "audit.jsonl")
    assert [(r["type"], r["action"]) for r in records] == [("decision", "requeue"), ("outcome", "requeue")], records
    assert records[0]["decision"] == "allow" and records[1]["ok"], records
    assert (records[0]["context"]["source"], records[0]["context"]["cause"]) == ("runtime", "signal")
    assert any("State=RUNNING" in e["text"] for e in records[0]["evidence"]), records[0]
    start = result["resumed_from"]
    assert 8 <= start < STEPS, result
    assert logged_steps(sweep) == list(range(STEPS))  # the stop checkpoint came after the step: none redone
    assert result["digest"] == chain_digest(STEPS), result
    assert not any((sweep / ".submitit" / ".slurm-relay").iterdir())  # each host side took its socket away
