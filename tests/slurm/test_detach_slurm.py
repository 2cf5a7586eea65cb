"""Fire-and-forget sweeps on the real test cluster: a detached sweep whose task must be
resubmitted completes with the user's shell gone; its supervisor job, preempted once,
goes on from sweep.json and tells its webhook each event once; two `watch` processes on one
sweep do not both act."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fault_cases import sweep_state, wait_for

from tests.conftest import WebhookReceiver, files_holding

pytestmark = pytest.mark.slurm

POLL = ("hydra.launcher.poll_interval_s=1", "hydra.launcher.max_poll_interval_s=2")
# a task the cgroup kills for memory at step 12: the supervisor must resubmit it with more
HOST_OOM = (
    "+experiment=synthetic",
    "cluster=slurm",
    "synthetic.steps=40",
    "synthetic.step_time_s=0.25",
    "checkpoint.every_steps=5",
    "resources.mem=256M",
    "synthetic.alloc_mb=300",
    "synthetic.alloc_at_step=12",
)


def launch(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """The launcher in a session of its own: a login shell that can go away."""
    return subprocess.Popen(
        [sys.executable, "-m", "slurmagent", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def done(sweep: Path) -> bool:
    """The supervisor says the sweep ended: a task's state alone may be an ending it is still
    acting on (OUT_OF_MEMORY for a moment, before the resubmission with more memory)."""
    return sweep_state(sweep).get("finished_at") is not None


def supervisor_job(sweep: Path) -> str:
    return str(json.loads((sweep / ".slurmagent" / "supervisor.json").read_text())["job_id"])


def sacct_states(job: str) -> list[str]:
    out = subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-j", job, "-o", "State"], capture_output=True, text=True)
    return [s.split()[0] for s in out.stdout.split("\n") if s.strip()]


def squeue(job: str, fmt: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", fmt], capture_output=True, text=True)
    return out.stdout.strip()


def resubmissions(sweep: Path) -> int:
    lines = (sweep / "audit.jsonl").read_text().splitlines() if (sweep / "audit.jsonl").exists() else []
    return sum(1 for r in map(json.loads, lines) if r["action"] == "resubmit" and r["type"] == "outcome")


def test_a_detached_sweep_completes_with_the_users_shell_gone(slurm_conf: str, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    launcher = launch(tmp_path, *HOST_OOM, *POLL, "-m", "--detach", f"hydra.sweep.dir={sweep}")
    _, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 0, err
    assert "detached: the sweep is supervised by Slurm job" in err
    with_pid = launcher.pid
    with pytest.raises(ProcessLookupError):  # the shell's session is gone: nothing of it is left
        os.killpg(with_pid, signal.SIGKILL)
    wait_for(lambda: done(sweep), "the sweep to end", 300, interval=0.5)
    (task,) = sweep_state(sweep)["tasks"]
    assert task["state"] == "COMPLETED" and len(task["attempts"]) == 2, task
    assert task["attempts"][0]["state"] == "OUT_OF_MEMORY" and resubmissions(sweep) == 1
    job = supervisor_job(sweep)
    lead = json.loads((sweep / ".slurmagent" / "lead.json").read_text())
    assert lead["role"] == f"supervisor job {job}"
    wait_for(lambda: "COMPLETED" in sacct_states(job), "the supervisor job to end COMPLETED", 120, interval=0.5)


NOTIFY_POLICY = """\
name: notify-test
approvers: [alice@example.org]
rules:
  - {name: requeue, action: requeue, decision: allow}
  - {name: resubmit-asks, action: resubmit, decision: needs_approval, approvals: 1}
  - {name: the-rest, action: "*", decision: allow}
"""


def test_the_supervisor_job_preempted_once_goes_on_and_tells_each_event_once(
    slurm_conf: str, tmp_path: Path, webhook: WebhookReceiver
) -> None:
    """A detached sweep from the user's directory with default paths, its webhook's URL in the
    environment: one task is killed for memory and its resubmission waits for approval (the
    approvers are told, with the command); the supervisor job is preempted while it waits; its
    second run tells nothing twice, the rejection ends the task (told, with the cause), the sweep
    ends (told). Exactly one message per event, and the URL in no file of the sweep."""
    (tmp_path / "policy.yaml").write_text(NOTIFY_POLICY)
    env = {**os.environ, "SLURMAGENT_POLICY": str(tmp_path / "policy.yaml"), "NOTIFY_HOOK": webhook.url}
    launcher = launch(
        tmp_path,
        "+experiment=synthetic",
        "cluster=slurm",
        "synthetic.steps=100",
        "synthetic.step_time_s=0.25",
        "checkpoint.every_steps=5",
        "resources.mem=256M",
        "synthetic.alloc_at_step=12",
        "hydra.launcher.supervisor_partition=low",
        "notify.webhook.url_env=NOTIFY_HOOK",
        "+resources.extra.mail_type=END",  # Slurm's own mail about the jobs, beside slurmagent's messages
        "+resources.extra.mail_user=alice@example.org",
        *POLL,
        "-m",
        "synthetic.alloc_mb=0,300",
        "--detach",
        env=env,
    )
    _, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 0, err
    (sweep,) = [p for p in tmp_path.glob("multirun/*/*") if (p / "sweep.json").is_file()]
    job = supervisor_job(sweep)
    asked = wait_for(lambda: [p["json"] for p in webhook.posts], "the approval's message", 180, interval=0.5)
    assert asked[0]["text"].startswith("for alice@example.org: *approval needed: resubmit"), asked
    approval = asked[0]["text"].split("slurmagent approve ")[1].split()[0]
    assert f"slurmagent approve {approval} --sweep {sweep}`" in asked[0]["text"]
    node = squeue(job, "%N")
    # a high-priority job that needs the supervisor's whole node preempts (requeues) it
    subprocess.run(
        ["sbatch", "-p", "high", "-w", node, "--exclusive", "--time=2", "-o", "/dev/null", "--wrap", "sleep 5"],
        check=True,
        capture_output=True,
    )
    wait_for(lambda: "[sweep]" in supervisor_log(sweep, job).partition("(run 2)")[2], "the second run's poll", 180, 0.5)
    time.sleep(5)  # a few polls of the second run: the approval is still pending, and not told again
    assert len(webhook.posts) == 1, webhook.texts()
    reject = [sys.executable, "-m", "slurmagent", "reject", approval, "--sweep", str(sweep)]
    subprocess.run(reject, cwd=tmp_path, env=env, check=True, capture_output=True, timeout=60)
    wait_for(lambda: done(sweep), "the sweep to end", 300, interval=0.5)
    wait_for(lambda: "COMPLETED" in sacct_states(job), "the supervisor job to end COMPLETED", 120, interval=0.5)
    assert "PREEMPTED" in sacct_states(job) and "the sweep is done" in supervisor_log(sweep, job)
    assert [t["state"] for t in sweep_state(sweep)["tasks"]] == ["COMPLETED", "OUT_OF_MEMORY"]
    ids = sorted(p["headers"]["Idempotency-Key"].split("/")[0] for p in webhook.posts)
    assert ids == ["approval_needed", "sweep_finished", "task_given_up"], webhook.texts()
    given_up = next(t for t in webhook.texts() if "given up" in t)
    assert "(host_oom)" in given_up and "cause: host_oom: " in given_up, given_up
    assert "sweep finished: 1 of 2 task(s) completed" in webhook.texts()[-1]
    assert files_holding(sweep, webhook.url) == [] and files_holding(sweep, "s3cr3t") == []
    # Slurm mailed the array's end to the user named (the cluster's MailProg records, no MTA here)
    (array,) = {a["job_id"].split("_")[0] for t in sweep_state(sweep)["tasks"] for a in t["attempts"]}
    mails = Path(slurm_conf).parent.parent / "log" / "mail.jsonl"
    calls = [json.loads(line)["argv"] for line in mails.read_text().splitlines()] if mails.exists() else []
    mine = [argv for argv in calls if f"({array})" in " ".join(argv) or f"Job_id={array} " in " ".join(argv)]
    assert mine and all(argv[-1] == "alice@example.org" and "Ended" in argv[1] for argv in mine), calls[-5:]


def supervisor_log(sweep: Path, job: str) -> str:
    path = sweep / ".slurmagent" / f"supervisor-{job}.log"
    return path.read_text() if path.exists() else ""


def test_two_watches_on_one_sweep_do_not_both_act(slurm_conf: str, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    launcher = launch(tmp_path, *HOST_OOM, *POLL, "-m", f"hydra.sweep.dir={sweep}")
    wait_for(
        lambda: sweep_state(sweep)["tasks"] and sweep_state(sweep)["tasks"][0]["attempts"],
        "the task to be submitted",
        120,
        interval=0.5,
    )
    launcher.kill()  # the launcher dies; two people re-attach
    launcher.communicate(timeout=30)
    watch = [sys.executable, "-m", "slurmagent", "watch", str(sweep), "--interval", "1", "--timeout", "300"]
    watches = [
        subprocess.Popen(watch, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [w.communicate(timeout=360) for w in watches]
    assert [w.returncode for w in watches] == [0, 0], outs
    assert sum("supervises this sweep; following it" in err for _, err in outs) == 1, outs
    (task,) = sweep_state(sweep)["tasks"]
    assert task["state"] == "COMPLETED" and len(task["attempts"]) == 2 and resubmissions(sweep) == 1
