"""Resource scheduling on the real test cluster: the history fed from its sacct, `plan` and
`auto` values from it, a budget refusing a sweep with nothing submitted, spend measured
with sacct stopping new tasks under a per-partition cap, a `--time-min` job started by
backfill in a hole before a reservation and requeued cleanly at its shortened limit, and
`priority=urgent` (allowed by a policy rule) preempting a background task that resumes.

The GPUs are the cluster's fake GRES devices (tests/cluster: t4-[1-2], a100-1): Slurm
allocates and accounts them like real ones; nothing runs on them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fault_cases import slurmagent_cli, sweep_state, wait_for

from slurmagent.config import SchedulingConf
from slurmagent.schedule.history import HistoryRow, HistoryStore, fingerprint
from tests.conftest import WebhookReceiver, jobs_from

pytestmark = pytest.mark.slurm

HISTORY = "history.sqlite"
POLL = ("hydra.launcher.poll_interval_s=0.5", "hydra.launcher.max_poll_interval_s=1")


def env_for(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "SLURMAGENT_STATE_DIR": str(tmp_path / "state")}


def cli(args: list[str], tmp_path: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return slurmagent_cli(args, tmp_path, timeout, env_for(tmp_path))


def scontrol_job(job: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True).stdout
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def my_jobs() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%i|%P|%T"], capture_output=True, text=True).stdout
    return out.split()


def test_history_from_sacct_then_plan_and_auto_from_it(slurm_conf: str, tmp_path: Path) -> None:
    work = ("+experiment=synthetic", "cluster=slurm", "synthetic.steps=40", "synthetic.step_time_s=0.25")
    sweep = tmp_path / "first"
    first = cli([*work, *POLL, "-m", "synthetic.x=0.1,0.2", "resources.gpus=1", "resources.gpu_type=a100",
                 "resources.time=00:10:00", f"hydra.sweep.dir={sweep}"], tmp_path)  # fmt: skip
    assert first.returncode == 0, first.stderr
    rows = wait_for(
        lambda: [r for fp in _fingerprints(tmp_path) for r in HistoryStore(tmp_path / "state" / HISTORY).recent(fp)],
        "the history to hold both tasks", 30,
    )  # fmt: skip
    assert len(rows) == 2 and {r.gpu_type for r in rows} == {"a100"} and all(r.gpus == 1 for r in rows)
    assert all(8 <= r.elapsed_s <= 120 and r.state == "COMPLETED" and r.timelimit_s == 600 for r in rows), rows
    assert len({r.fingerprint for r in rows}) == 2  # synthetic.x changes the work (it is not an lr)
    assert all(1 < r.steps_per_s < 5 for r in rows), rows  # the runtime's speed (0.25 s a step)
    assert all(r.gpu_mem_peak_mb == 0 for r in rows)  # no CUDA in these jobs (the GRES is Slurm's): no GPU peak

    before = jobs_from(tmp_path)
    auto = ["resources.gpus=1", "resources.gpu_type=auto", "resources.time=auto", "resources.mem=auto"]
    planned = cli(["plan", *work, "synthetic.x=0.1", *auto, "--json"], tmp_path)
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert jobs_from(tmp_path) == before  # nothing submitted
    assert plan["history_runs"] == 1 and "mean of the last 1 run(s)" in plan["prediction"]
    assert {c["gpu_type"] for c in plan["candidates"]} == {"a100", "t4", "any"}  # any: Slurm picks the node
    assert all(c["wait_s"] is not None and "on " in c["start_note"] for c in plan["candidates"])  # Slurm's estimate
    chosen = plan["chosen"]["gpu_type"]
    asked = None if chosen == "any" else chosen
    assert plan["resources"]["gpu_type"] == asked
    assert plan["sbatch"]["gres"] == (f"gpu:{chosen}:1" if asked else "gpu:1")
    limit = plan["resources"]["time"]
    assert limit < "00:10:00"  # right-sized from history, not 10 min
    assert plan["sbatch"].get("time-min", "00:00:00") < limit  # none when the whole limit is the floor
    shown = cli(["plan", *work, "synthetic.x=0.1", *auto], tmp_path)
    assert "Slurm's start" in shown.stdout and f"resources.gpu_type={chosen}" in shown.stdout, shown.stdout

    sweep = tmp_path / "auto"
    second = cli([*work, *POLL, "-m", "synthetic.x=0.1", *auto, f"hydra.sweep.dir={sweep}"], tmp_path)
    assert second.returncode == 0, second.stderr
    state = sweep_state(sweep)
    (task,) = state["tasks"]
    job = scontrol_job(task["attempts"][0]["job_id"])
    assert job["TimeLimit"] == limit and job["TresPerNode"] == "gres:" + plan["sbatch"]["gres"], job
    assert job["TimeMin"] == plan["sbatch"].get("time-min", "N/A"), job  # as plan said
    decisions = {d["key"]: d["value"] for p in state["schedule"]["plans"] for d in p["decisions"]}
    assert decisions["resources.gpu_type"] == chosen and decisions["resources.time"] == limit
    status = cli(["status", str(sweep)], tmp_path)
    assert f"chose gpu_type={chosen}" in status.stdout.replace("\n", " "), status.stdout


def _fingerprints(tmp_path: Path) -> set[str]:
    path = tmp_path / "state" / "history.sqlite"
    if not path.exists():
        return set()
    import sqlite3

    with sqlite3.connect(path) as db:
        return {r[0] for r in db.execute("SELECT fingerprint FROM runs")}


def test_a_sweep_over_budget_is_refused_with_nothing_submitted(slurm_conf: str, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    before = jobs_from(tmp_path)
    out = cli(["+experiment=synthetic", "cluster=slurm", "-m", "synthetic.x=0.1,0.2,0.3", "resources.gpus=2",
               "resources.gpu_type=a100", "resources.time=01:00:00", "budget.gpu_hours=4",
               f"hydra.sweep.dir={sweep}"], tmp_path)  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "predicted use (6.000 GPU-h, cost 22.02) exceeds its budget: 6.000 GPU-h > budget.gpu_hours=4" in out.stderr
    assert "nothing was submitted" in out.stderr and not sweep.exists()
    assert jobs_from(tmp_path) == before
    denied = cli(["+experiment=synthetic", "cluster=slurm", "-m", "resources.priority=urgent",
                  f"hydra.sweep.dir={sweep}"], tmp_path)  # fmt: skip
    assert denied.returncode == 2 and "resources.priority=urgent is not allowed" in denied.stderr, denied.stderr
    assert "rule default:priority-urgent: deny" in denied.stderr and not sweep.exists()
    month = cli(["+experiment=synthetic", "cluster=slurm", "-m", "resources.gpus=1", "resources.time=00:10:00",
                 "budget.user_month_gpu_hours=0.1", f"hydra.sweep.dir={sweep}"], tmp_path)  # fmt: skip
    used = re.search(r"this month you used (\d+\.\d+) GPU-h; with this sweep's predicted 0.167", month.stderr)
    assert month.returncode == 2 and used and float(used.group(1)) >= 0, month.stderr  # measured with sacct
    assert "budget.user_month_gpu_hours=0.1; nothing was submitted" in month.stderr and not sweep.exists()


def test_spend_from_sacct_stops_new_tasks_under_a_partition_cap(
    slurm_conf: str, tmp_path: Path, webhook: WebhookReceiver
) -> None:
    """The history says this work takes 5 s (recorded rows); it takes about 12 s. The budget
    fits the prediction (4 × 6 s × 1 GPU) but not what sacct measures: once spend reaches it,
    the waiting task is not started, and the webhook is told so, once. The cap keeps one job in
    partition gpu at a time."""
    work = ["+experiment=synthetic", "cluster=slurm", "synthetic.steps=40", "synthetic.step_time_s=0.25"]
    tasks = [f"synthetic.x=0.{i}" for i in range(1, 5)]
    res = ["resources.partition=gpu", "resources.gpus=1", "resources.gpu_type=t4", "resources.time=00:05:00"]
    budget = ["budget.gpu_hours=0.0083", "+site.scheduling.max_jobs_per_partition.gpu=1"]  # 30 GPU-seconds
    store = HistoryStore(tmp_path / "state" / "history.sqlite")
    ignore = SchedulingConf().ignore_in_fingerprint
    for i, x in enumerate(tasks):
        fp = fingerprint("synthetic", [*work, x, *res, *budget], ignore)  # the job name: the experiment
        store.add(
            [HistoryRow(fp, f"old#{i}", "synthetic", "gpu", "t4", 1, 5.0, 300, 200, 1000, 5, "COMPLETED", "t4-1", 1)]
        )
    sweep = tmp_path / "sweep"
    proc = subprocess.Popen(
        [sys.executable, "-m", "slurmagent", *work, *POLL, "-m", ",".join(tasks).replace(",synthetic.x=", ","),
         *res, *budget, f"hydra.sweep.dir={sweep}", "notify.webhook.url_env=BUDGET_HOOK", "notify.webhook.format=json"],
        cwd=tmp_path, env={**env_for(tmp_path), "BUDGET_HOOK": webhook.url}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    most = 0
    while proc.poll() is None:
        most = max(most, sum(1 for j in my_jobs() if j.split("|")[1] == "gpu"))
        time.sleep(0.25)
    _, err = proc.communicate()
    state = sweep_state(sweep)
    assert state["schedule"]["predicted"]["gpu_hours"] == pytest.approx(4 * 6 / 3600)
    assert most == 1, "the cap of one job in partition gpu was exceeded"
    states = [t["state"] for t in state["tasks"]]
    assert states.count("COMPLETED") >= 2 and states[-1] == "CANCELLED", (states, err)
    assert "budget is reached" in state["tasks"][-1]["error"] and not state["tasks"][-1]["attempts"]
    assert state["schedule"]["spent"]["gpu_hours"] >= 0.0083 and "spent" in state["schedule"]["stopped"]
    audit = [json.loads(line) for line in (sweep / "audit.jsonl").read_text().splitlines()]
    assert any(r["action"] == "cancel" and r["rule"].endswith(":cancel-over-budget") for r in audit)
    status = cli(["status", str(sweep)], tmp_path)
    assert "budget reached" in status.stdout.replace("\n", " "), status.stdout
    told = [p["json"] for p in webhook.posts]
    assert [m["event"] for m in told] == ["budget_reached", "sweep_finished"], told
    assert told[0]["not_started"] == 1 and "spent" in told[0]["why"], told[0]


def test_time_min_job_is_backfilled_into_a_hole_and_requeued_at_its_shortened_limit(
    slurm_conf: str, tmp_path: Path
) -> None:
    """cpu-2 is busy for 45 s; cpu-1 is reserved from 95 s on. A 10-minute job that may run
    for 1 minute (--time-min) starts at once on cpu-1 with its limit cut to fit; before that
    limit Slurm's warning signal makes it checkpoint and requeue, and it resumes and completes.
    How many times depends on when Slurm's warning comes (up to a minute early: at a 1-minute
    limit a run may get almost no time) and on the hole left: seen 1 to 3 requeues, and once a
    4th, which the default bound (3) ended FAILED and recovery resubmitted — so the bound here
    is 8: the test is about where the job ran and how it ended, not the count."""
    block = ["sbatch", "--parsable", "-p", "low", "-w", "cpu-2", "--exclusive", "-t", "1", "-o", "/dev/null"]
    block += ["--wrap", "sleep 45"]
    blocker = subprocess.run(block, capture_output=True, text=True, check=True).stdout.strip()
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 95))
    name = f"sa-hole-{os.getpid()}"
    reserve = [f"ReservationName={name}", f"StartTime={start}", "Duration=5", "Nodes=cpu-1", "Users=root"]
    subprocess.run(
        ["scontrol", "create", "reservation", *reserve, "Flags=IGNORE_JOBS"], check=True, capture_output=True
    )
    sweep = tmp_path / "sweep"
    seen: list[str] = []
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "slurmagent", "+experiment=synthetic", "cluster=slurm", *POLL, "-m",
             "synthetic.steps=200", "synthetic.step_time_s=0.25", "checkpoint.every_steps=10",
             "resources.constraint=cpu", "resources.time=00:10:00", "resources.time_min=00:01:00",
             "recovery.signal_delay_s=20", "recovery.max_time_limit_requeues=8",
             "recovery.finish_before_limit=false",  # the requeue at the cut limit, even when the rest would fit
             f"hydra.sweep.dir={sweep}"],
            cwd=tmp_path, env=env_for(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        while proc.poll() is None:  # what the controller says of the job while it runs
            tasks = sweep_state(sweep)["tasks"]
            if tasks and tasks[0]["attempts"]:
                job = tasks[0]["attempts"][0]["job_id"]
                out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T|%l|%N"], capture_output=True, text=True)
                if out.stdout.strip().startswith("RUNNING") and out.stdout.strip() not in seen:
                    seen.append(out.stdout.strip())
            time.sleep(0.5)
        _, err = proc.communicate()
        assert proc.returncode == 0, err
    finally:
        subprocess.run(["scontrol", "delete", f"ReservationName={name}"], capture_output=True)
        subprocess.run(["scancel", blocker], capture_output=True)
    assert seen and seen[0] == "RUNNING|1:00|cpu-1", seen  # started at once in the hole, its limit cut to 1 min
    (task,) = sweep_state(sweep)["tasks"]
    assert task["state"] == "COMPLETED" and task["result"]["steps"] == 200, task
    assert task["result"]["resumed_from"] > 0 and task["result"]["steps_run_here"] < 200  # resumed, not redone
    job = task["attempts"][0]["job_id"]
    runs = subprocess.run(["sacct", "-n", "-P", "-X", "--duplicates", "-j", job, "-o", "State"],
                          capture_output=True, text=True).stdout.split()  # fmt: skip
    assert runs[0] == "REQUEUED" and runs[-1] == "COMPLETED", runs  # requeued at the cut limit, not timed out
    assert "TIMEOUT" not in runs and len(task["attempts"]) == 1, runs  # one job throughout: no resubmission


def test_urgent_priority_allowed_by_policy_preempts_background_which_resumes(slurm_conf: str, tmp_path: Path) -> None:
    me = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    policy = tmp_path / "urgent.yaml"
    policy.write_text(
        "name: urgent-for-me\nrules:\n"
        f"  - {{name: urgent-users, action: priority_urgent, decision: allow, when: {{user_in: [{me}]}}}}\n"
        "  - {name: requeue, action: requeue, decision: allow}\n"
        "  - {name: resubmit, action: resubmit, decision: allow}\n"
    )
    site = ["site.priorities.urgent.partition=high", "site.priorities.background.partition=low"]
    pin = ["resources.extra.nodelist=t4-1"]  # the urgent job takes all 4 CPUs of t4-1: background must go
    bg_sweep, urgent_sweep = tmp_path / "bg", tmp_path / "urgent"
    background = subprocess.Popen(
        [sys.executable, "-m", "slurmagent", "+experiment=synthetic", "cluster=slurm", *POLL, "-m",
         "synthetic.steps=80",
         "synthetic.step_time_s=0.25", "checkpoint.every_steps=5", "resources.priority=background", *site, *pin,
         f"hydra.sweep.dir={bg_sweep}"],
        cwd=tmp_path, env=env_for(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_for(lambda: any(t["state"] == "RUNNING" for t in sweep_state(bg_sweep)["tasks"]), "background to run", 60)
    time.sleep(4)  # a few checkpoints
    env = {**env_for(tmp_path), "SLURMAGENT_POLICY": str(policy)}
    urgent = subprocess.run(
        [sys.executable, "-m", "slurmagent", "+experiment=synthetic", "cluster=slurm", *POLL, "-m",
         "synthetic.steps=10",
         "resources.priority=urgent", "resources.cpus_per_task=4", *site, *pin,
         f"hydra.sweep.dir={urgent_sweep}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert urgent.returncode == 0, urgent.stderr
    _, err = background.communicate(timeout=300)
    assert background.returncode == 0, err
    (bg,) = sweep_state(bg_sweep)["tasks"]
    assert bg["state"] == "COMPLETED" and bg["result"]["steps"] == 80 and bg["result"]["resumed_from"] > 0, bg
    job = bg["attempts"][-1]["job_id"]
    states = subprocess.run(["sacct", "-n", "-P", "-X", "--duplicates", "-j", job, "-o", "State,Partition"],
                            capture_output=True, text=True).stdout.split()  # fmt: skip
    assert any(s.startswith("PREEMPTED") or s.startswith("REQUEUED") for s in states[:-1]), states
    assert all(s.endswith("|low") for s in states), states
    (ut,) = sweep_state(urgent_sweep)["tasks"]
    assert scontrol_job(ut["attempts"][0]["job_id"]).get("Partition", "high") == "high"
    audit = [json.loads(line) for line in (urgent_sweep / "audit.jsonl").read_text().splitlines()]
    assert any(
        r["action"] == "priority_urgent" and r["decision"] == "allow" and r["rule"] == "urgent-for-me:urgent-users"
        for r in audit
    )


# a job's GPU memory, EMULATED (there is no GPU on the test cluster: its GPUs are Slurm's fake GRES
# devices): the GPU it has is the type of the node Slurm started it on, with the site catalogue's
# memory; a job that needs more raises torch's own OutOfMemoryError with CUDA's message
EMULATED_GPU = """
import os
import subprocess

import torch

from slurmagent.config import default_site


def train(cfg):
    node = os.environ["SLURMD_NODENAME"]
    shown = subprocess.run(["scontrol", "show", "node", node, "-o"], capture_output=True, text=True).stdout
    gres = next(f for f in shown.split() if f.startswith("Gres="))  # Gres=gpu:t4:2
    gpu_type = gres.split(":")[1]
    have = default_site().memory_gib(gpu_type)
    need = float(cfg.need_gib)
    if need > have - 1:
        raise torch.OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate {need:.2f} GiB. GPU 0 has a total capacity of {have:.2f} GiB "
            "(emulated GPU: no NVIDIA GPU on this machine)"
        )
    return {"gpu_type": gpu_type, "node": node}
"""


def test_an_any_type_job_out_of_gpu_memory_is_resubmitted_on_a_type_with_more_memory(
    slurm_conf: str, tmp_path: Path
) -> None:
    """`resources.gpus=1` without a type (what `auto` asks for a plain script) that Slurm starts
    on a t4 and that needs 20 GiB of GPU memory (emulated GPU, see EMULATED_GPU) fails with a GPU
    OOM; recovery resubmits it on the a100 (more memory than the t4 it ran on), where it completes.
    Then the history says the work needs more than a t4, and `plan` no longer offers one."""
    (tmp_path / "emulated_gpu.py").write_text(EMULATED_GPU)
    # both a100 GPUs held for a moment, so that the untyped request starts on a t4
    block = ["sbatch", "--parsable", "-p", "low", "-w", "a100-1", "--gres=gpu:a100:2", "-c", "1", "--mem=100M"]
    blocker = subprocess.run([*block, "-t", "5", "-o", "/dev/null", "--wrap", "sleep 300"],
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    work = ["task.target=emulated_gpu:train", "+need_gib=20", "cluster=slurm", "resources.gpus=1"]
    sweep = tmp_path / "sweep"
    try:
        wait_for(lambda: scontrol_job(blocker).get("JobState") == "RUNNING", "the a100s to be held", 60)
        proc = subprocess.Popen(
            [sys.executable, "-m", "slurmagent", *work, *POLL, "-m", "resources.mem=1G", "resources.time=00:05:00",
             f"hydra.sweep.dir={sweep}"],
            cwd=tmp_path, env=env_for(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        first = wait_for(
            lambda: next((t["attempts"][0] for t in sweep_state(sweep)["tasks"] if t["attempts"] and
                          t["attempts"][0].get("nodes")), None) if (sweep / "sweep.json").exists() else None,
            "the first run to start", 120, interval=0.5,
        )  # fmt: skip
    finally:
        subprocess.run(["scancel", blocker], capture_output=True)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    state = sweep_state(sweep)
    (task,) = state["tasks"]
    assert first["nodes"].startswith("t4-"), first
    assert task["state"] == "COMPLETED" and task["result"] == {"gpu_type": "a100", "node": "a100-1"}, task
    assert [a["nodes"] for a in task["attempts"]][-1] == "a100-1" and len(task["attempts"]) == 2, task
    assert state["specs"][task["spec_id"]]["resources"]["gpu_type"] == "a100"  # the resubmission's request
    audit = [json.loads(line) for line in (sweep / "audit.jsonl").read_text().splitlines()]
    (decision,) = [r for r in audit if r["type"] == "decision" and r["action"] == "resubmit"]
    assert decision["params"] == {"gpu_type": [None, "a100"]}, decision
    assert "GPU OOM on t4 (any type asked; it ran on t4-" in decision["reason"], decision
    rows = wait_for(
        lambda: [r for fp in _fingerprints(tmp_path) for r in HistoryStore(tmp_path / "state" / HISTORY).recent(fp)],
        "the task in the history", 30,
    )  # fmt: skip
    assert [(r.gpu_oom_gib, r.gpu_type) for r in rows] == [(16.0, "a100")], rows
    planned = cli(["plan", *work, "resources.gpu_type=auto", "resources.time=auto", "--json"], tmp_path)
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    fits = {c["gpu_type"]: c["fits"] for c in plan["candidates"]}
    assert fits == {"a100": True, "t4": False} and plan["resources"]["gpu_type"] == "a100", plan["candidates"]
