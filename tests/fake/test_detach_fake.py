"""Fire-and-forget sweeps through the fake Slurm: `--detach` returns at once and a
supervisor job of the sweep's own recovers and finishes it; Ctrl-C on an attached launcher
leaves the sweep to such a supervisor or cancels it; two `watch` processes on one sweep
never both act. tests/slurm/test_detach_slurm.py proves the same on the real cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.fake.conftest import ctrl_c_as_in_a_terminal, first_job_id, slurmagent, start, sweep_state, wait_steps
from tests.fake.fake_slurm import FakeSlurm

SYNTHETIC = (
    "+experiment=synthetic",
    "cluster=slurm",
    "hydra.launcher.poll_interval_s=0.3",
    "hydra.launcher.max_poll_interval_s=1",
)
LONG = ("synthetic.steps=40", "synthetic.step_time_s=0.05", "checkpoint.every_steps=5")


def wait_done(sweep: Path, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = sweep_state(sweep)
        if all(t["state"] in ("COMPLETED", "FAILED", "CANCELLED", "REFUSED") for t in state["tasks"]):
            return state
        time.sleep(0.2)
    raise TimeoutError(f"{sweep} not done after {timeout:.0f}s: {[t['state'] for t in sweep_state(sweep)['tasks']]}")


def resubmissions(sweep: Path) -> list[dict[str, Any]]:
    path = sweep / "audit.jsonl"
    records = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return [r for r in records if r["action"] == "resubmit" and r["type"] == "outcome"]


def supervisor_jobs(fake: FakeSlurm) -> dict[str, dict[str, Any]]:
    return {j: job for j, job in fake.jobs().items() if job["name"].endswith("-supervisor")}


def test_a_detached_sweep_is_recovered_and_finished_by_its_supervisor_job(fake: FakeSlurm, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    t0 = time.monotonic()
    proc = slurmagent(fake, tmp_path, *SYNTHETIC, "-m", *LONG, "--detach", f"hydra.sweep.dir={sweep}")
    returned_after = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    assert "detached: the sweep is supervised by Slurm job" in proc.stderr
    for command in ("status", "watch", "logs", "cancel"):
        assert f"slurmagent {command}" in proc.stderr
    job = first_job_id(sweep)
    assert sweep_state(sweep)["tasks"][0]["state"] != "COMPLETED" and returned_after < 60
    wait_steps(sweep, 12)
    fake.fail(job, "OUT_OF_MEMORY")  # the launcher is gone: the supervisor job must resubmit it
    state = wait_done(sweep)
    (task,) = state["tasks"]
    assert task["state"] == "COMPLETED" and len(task["attempts"]) == 2
    assert len(resubmissions(sweep)) == 1
    lead = json.loads((sweep / ".slurmagent" / "lead.json").read_text())
    (sup_id,) = supervisor_jobs(fake)
    assert lead["role"] == f"supervisor job {sup_id}"
    deadline = time.monotonic() + 30
    while supervisor_jobs(fake)[sup_id]["state"] != "COMPLETED" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert supervisor_jobs(fake)[sup_id]["state"] == "COMPLETED"  # it ends with the sweep


def test_the_supervisor_job_requeues_itself_at_its_time_limit_through_the_gate(fake: FakeSlurm, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc = slurmagent(fake, tmp_path, *SYNTHETIC, "-m", *LONG, "--detach", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stderr
    first_job_id(sweep)
    (sup_id,) = supervisor_jobs(fake)
    deadline = time.monotonic() + 60
    lead: dict[str, Any] = {}
    while time.monotonic() < deadline and lead.get("role") != f"supervisor job {sup_id}":
        path = sweep / ".slurmagent" / "lead.json"
        lead = json.loads(path.read_text()) if path.exists() else {}
        time.sleep(0.1)
    # the supervisor job's --signal=B:USR1@60 (its batch script execs the supervisor): the time limit is near
    os.kill(int(lead["pid"]), signal.SIGUSR1)
    state = wait_done(sweep)
    assert [t["state"] for t in state["tasks"]] == ["COMPLETED"]
    records = [json.loads(x) for x in (sweep / "audit.jsonl").read_text().splitlines()]
    (requeue,) = [r for r in records if r["action"] == "requeue" and r["type"] == "outcome"]
    assert requeue["target"] == sup_id and requeue["context"]["source"] == "supervisor", requeue
    deadline = time.monotonic() + 30
    while supervisor_jobs(fake)[sup_id]["state"] != "COMPLETED" and time.monotonic() < deadline:
        time.sleep(0.2)
    job = supervisor_jobs(fake)[sup_id]
    assert job["state"] == "COMPLETED" and job["restarts"] == 1  # its second run saw the sweep to its end
    log = (sweep / ".slurmagent" / f"supervisor-{sup_id}.log").read_text()
    assert "time limit near: requeued" in log and "(run 2)" in log, log


def interrupted(fake: FakeSlurm, tmp_path: Path, *extra: str) -> tuple[Path, int, str]:
    sweep = tmp_path / "sweep"
    launcher = start(fake, tmp_path, *SYNTHETIC, "-m", *LONG, *extra, f"hydra.sweep.dir={sweep}")
    job = first_job_id(sweep)
    fake.wait(job, ("RUNNING",))
    wait_steps(sweep, 5)
    launcher.send_signal(signal.SIGINT)  # Ctrl-C, no terminal: hydra.launcher.on_interrupt decides
    _, err = launcher.communicate(timeout=60)
    return sweep, launcher.returncode, err


def test_ctrl_c_leaves_the_sweep_to_a_detached_supervisor(fake: FakeSlurm, tmp_path: Path) -> None:
    sweep, code, err = interrupted(fake, tmp_path)
    assert code == 130, err
    assert "interrupted: the sweep goes on, supervised by Slurm job" in err and "Traceback" not in err
    state = wait_done(sweep)
    assert [t["state"] for t in state["tasks"]] == ["COMPLETED"]
    assert len(supervisor_jobs(fake)) == 1


def test_ctrl_c_with_on_interrupt_cancel_cancels_the_sweep(fake: FakeSlurm, tmp_path: Path) -> None:
    sweep, code, err = interrupted(fake, tmp_path, "hydra.launcher.on_interrupt=cancel")
    assert code == 130, err
    assert "interrupted: cancelled 1 unfinished task(s)" in err
    assert [t["state"] for t in sweep_state(sweep)["tasks"]] == ["CANCELLED"]
    assert not supervisor_jobs(fake)
    assert all(j["state"] == "CANCELLED" for j in fake.jobs().values())


def test_two_watches_on_one_sweep_do_not_both_act(fake: FakeSlurm, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    launcher = start(fake, tmp_path, *SYNTHETIC, "-m", *LONG, f"hydra.sweep.dir={sweep}")
    job = first_job_id(sweep)
    fake.wait(job, ("RUNNING",))
    launcher.kill()  # the launcher dies; two people re-attach
    launcher.communicate(timeout=30)
    watches = [
        subprocess.Popen(
            [sys.executable, "-m", "slurmagent", "watch", str(sweep), "--interval", "0.3", "--timeout", "120"],
            cwd=tmp_path,
            env=fake.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    wait_steps(sweep, 12)
    fake.fail(job, "OUT_OF_MEMORY")
    outs = [w.communicate(timeout=150) for w in watches]
    assert [w.returncode for w in watches] == [0, 0], outs
    following = [err for _, err in outs if "supervises this sweep; following it" in err]
    assert len(following) == 1  # one acted, the other followed
    (task,) = sweep_state(sweep)["tasks"]
    assert task["state"] == "COMPLETED" and len(task["attempts"]) == 2 and len(resubmissions(sweep)) == 1


def test_a_detached_local_sweep_is_finished_by_a_supervisor_process(tmp_path: Path) -> None:
    """The local backend (no Slurm): `--detach` leaves the sweep to a process of its own session."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    sweep = tmp_path / "sweep"
    args = [
        "+experiment=synthetic",
        "cluster=local",
        "synthetic.steps=30",
        "synthetic.step_time_s=0.05",
        *SYNTHETIC[2:],
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "slurmagent", *args, "-m", "--detach", f"hydra.sweep.dir={sweep}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "detached: the sweep is supervised by process" in proc.stderr
    record = json.loads((sweep / ".slurmagent" / "supervisor.json").read_text())
    assert record["kind"] == "process" and os.getsid(record["pid"]) != os.getsid(0)  # not in the shell's session
    state = wait_done(sweep, 60)
    assert [t["state"] for t in state["tasks"]] == ["COMPLETED"]
    deadline = time.monotonic() + 30
    while Path(f"/proc/{record['pid']}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    log = (sweep / ".slurmagent" / "supervisor.log").read_text()
    assert "the sweep is done: 1 COMPLETED" in log


def test_detach_without_a_sweep_is_refused(fake: FakeSlurm, tmp_path: Path) -> None:
    proc = slurmagent(fake, tmp_path, "+experiment=synthetic", "cluster=slurm", "--detach")
    assert proc.returncode == 2 and "--detach applies to sweeps: add -m" in proc.stderr
    assert not [c for c in fake.logged_calls() if c[0] == "sbatch"]


def test_a_bad_supervisor_choice_names_the_valid_ones_and_submits_nothing(fake: FakeSlurm, tmp_path: Path) -> None:
    proc = slurmagent(fake, tmp_path, *SYNTHETIC, "-m", "--detach", "hydra.launcher.supervisor=cronjob")
    assert proc.returncode == 2
    assert "hydra.launcher.supervisor='cronjob' is not one of auto, job, process; nothing was submitted" in proc.stderr
    assert not [c for c in fake.logged_calls() if c[0] == "sbatch"]


def test_ctrl_c_on_a_terminal_asks_and_c_cancels(fake: FakeSlurm, tmp_path: Path) -> None:
    """On a terminal the launcher asks (Enter keeps hydra.launcher.on_interrupt); `c` cancels."""
    import os
    import pty

    master, slave = pty.openpty()
    sweep = tmp_path / "sweep"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "slurmagent", *SYNTHETIC, "-m", *LONG, f"hydra.sweep.dir={sweep}"],
        cwd=tmp_path,
        env=fake.env(),
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_as_in_a_terminal,
    )
    os.close(slave)
    try:
        job = first_job_id(sweep)
        fake.wait(job, ("RUNNING",))
        launcher.send_signal(signal.SIGINT)
        os.write(master, b"c\n")  # the answer waits in the terminal until the question reads it
        _, err = launcher.communicate(timeout=60)
    finally:
        os.close(master)
    assert launcher.returncode == 130, err
    assert "leave the sweep's 1 unfinished task(s) to a detached supervisor, or cancel them?" in err
    assert "interrupted: cancelled 1 unfinished task(s)" in err
    assert [t["state"] for t in sweep_state(sweep)["tasks"]] == ["CANCELLED"] and not supervisor_jobs(fake)
