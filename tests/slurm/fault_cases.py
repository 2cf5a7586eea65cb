"""The fault-injection table: one list of faults, each injected into a real sweep on the
real test cluster, shared by tests/slurm/test_fault_table.py (asserts every row) and
bench/fault_table.py (writes the markdown table of bench/README.md).

A row is a `FaultCase`: the overrides of its sweep, an injector that does the damage while
the sweep runs (a thread of its own), and what must come out. Recoverable rows must end
bit-identical to an uninterrupted run of the same workload (`workload` overrides, run with
`cluster=local`); the others must end FAILED with the right cause, after a bounded number
of attempts. To add a row, append a `FaultCase` to `CASES`: give it its own node if its
fault hits a whole node, and a phase of its own if it hits the whole cluster.

Layout of the five emulated nodes while the table runs: PREEMPT_NODE belongs to the
preemption row (its high-priority job takes the whole node), NODE_FAIL_NODE to the
node-failure row (its slurmd is stopped), every other row is kept off both with
`resources.exclude`. The slurmctld restart hits every job, so it runs in phase 1, before
the rest.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_SCRIPT = ROOT / "tests" / "cluster" / "slurm-cluster"
WATCH = (sys.executable, "-m", "slurmagent", "watch")
POLL = ("hydra.launcher.poll_interval_s=1", "hydra.launcher.max_poll_interval_s=2")
CASE_TIMEOUT_S = 300  # one row, launcher start to sweep end; rows take 10-90 s here

PREEMPT_NODE = "cpu-2"
NODE_FAIL_NODE = "t4-2"
KEEP_OFF = f"resources.exclude='{PREEMPT_NODE},{NODE_FAIL_NODE}'"  # quoted: a bare comma is a sweep

# the synthetic step loop: 40 steps of 0.25 s, a checkpoint every 5; its state is a hash chain
# over the steps, so a step lost or applied twice changes the final hash. 10 s of steps: an
# injector polling a loaded 2-core machine must still catch the job mid-run (4 s was missed in CI)
SYNTH = ("+experiment=synthetic", "synthetic.steps=40", "synthetic.step_time_s=0.25", "checkpoint.every_steps=5")
SYNTH_SWEEP = (
    "+experiment=synthetic",
    "synthetic.steps=30,40",
    "synthetic.step_time_s=0.1",
    "checkpoint.every_steps=5",
)
# 100 such steps: long enough that a node failure lands mid-run however slow the injection
SYNTH_LONG = ("+experiment=synthetic", "synthetic.steps=100", "synthetic.step_time_s=0.25", "checkpoint.every_steps=5")
# the torch digits MLP: model, optimiser, scheduler, RNG and data order in the checkpoint
DIGITS = ("+experiment=digits_mlp", "train.steps=300", "train.step_delay_s=0.05", "checkpoint.every_steps=50")


class InjectionError(RuntimeError):
    """The injector could not do its damage (the sweep did not reach the state it needs)."""


# ----------------------------------------------------------------------------- one running row
@dataclass
class Run:
    """A case while it runs: its directories, its launcher, what its injector saw and did."""

    case: FaultCase
    dir: Path
    env: dict[str, str]
    launcher: subprocess.Popen[bytes] | None = None
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def sweep(self) -> Path:
        return self.dir / "sweep"

    def state(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.sweep / "sweep.json").read_text())  # type: ignore[no-any-return]
        except (OSError, ValueError):
            return None

    def job_id(self, task: int = 0) -> str | None:
        state = self.state()
        if state is None or len(state["tasks"]) <= task or not state["tasks"][task]["attempts"]:
            return None
        return str(state["tasks"][task]["attempts"][-1]["job_id"])

    def steps_run(self, task: int = 0) -> int:
        """Lines in the task's metrics.jsonl of the per-step report (not the end-of-epoch one,
        which shares its step): one per step run, redone steps included."""
        path = self.sweep / str(task) / "metrics.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return sum(1 for line in lines if '"epoch"' not in line)

    def checkpoints(self, directory: Path | None = None, task: int = 0) -> list[dict[str, Any]]:
        path = (directory or self.sweep / str(task) / "checkpoints") / "manifest.json"
        try:
            return sorted(json.loads(path.read_text())["checkpoints"], key=lambda e: int(e["step"]))
        except (OSError, ValueError, KeyError):
            return []

    def squeue(self, job_id: str) -> tuple[str, str]:
        """(state, node list) of a job Slurm still lists, ("", "") for one it does not,
        ("UNKNOWN", "") while slurmctld does not answer."""
        try:
            out = slurm(["squeue", "-h", "-j", job_id, "-o", "%T|%N"], self.env).strip()
        except InjectionError:
            return "UNKNOWN", ""
        state, _, nodes = out.partition("|")
        return state, nodes

    def running(self, task: int = 0, min_steps: int = 1) -> str:
        """Wait until the task's job runs and has run `min_steps` steps; its job id."""

        def ready() -> str | None:
            job = self.job_id(task)
            if job and self.squeue(job)[0] == "RUNNING" and self.steps_run(task) >= min_steps:
                return job
            return None

        return wait_for(ready, f"task {task} running with {min_steps} step(s) done", 120)

    def cluster(self, *args: str) -> str:
        proc = subprocess.run(
            [sys.executable, str(CLUSTER_SCRIPT), *args], capture_output=True, text=True, env=self.env, timeout=120
        )
        if proc.returncode != 0:
            raise InjectionError(f"slurm-cluster {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc.stderr.strip()


def slurm(argv: list[str], env: dict[str, str], check: bool = True, retry_s: float = 0) -> str:
    """Run a Slurm command; with `retry_s`, a failing one is retried that long (a row of
    phase 1 may hit the slurmctld restart)."""
    deadline = time.monotonic() + retry_s
    while True:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
        if proc.returncode == 0 or not check:
            return proc.stdout
        if time.monotonic() > deadline:
            raise InjectionError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
        time.sleep(1)


def slurmagent_cli(
    args: list[str], cwd: Path, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m slurmagent ARGS` in `cwd`, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "slurmagent", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env if env is not None else dict(os.environ),
    )


def wait_for(probe: Callable[[], Any], what: str, timeout: float, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(interval)
    raise InjectionError(f"timed out after {timeout:.0f}s waiting for {what}")


def training_pids(submitit_folder: Path, job_id: str) -> list[int]:
    """The training processes of Slurm job `job_id` ("123", or an array task "123_4"): the
    python that srun started, `slurmagent.job.boot FOLDER` in its argv, told apart from the
    sweep's other tasks by its SLURM_* environment (readable by root or the job's user)."""
    array_job, _, array_task = job_id.partition("_")
    want = {"SLURM_ARRAY_JOB_ID": array_job, "SLURM_ARRAY_TASK_ID": array_task} if array_task else {}
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            words = [a.decode(errors="replace") for a in (proc / "cmdline").read_bytes().split(b"\0")]
            if "slurmagent.job.boot" not in words or str(submitit_folder) not in words:
                continue
            environ = dict(
                e.decode(errors="replace").partition("=")[::2] for e in (proc / "environ").read_bytes().split(b"\0")
            )
        except OSError:
            continue
        if "python" not in Path(words[0]).name:
            continue
        if (want and all(environ.get(k) == v for k, v in want.items())) or environ.get("SLURM_JOB_ID") == job_id:
            found.append(int(proc.name))
    return found


def sweep_state(sweep: Path) -> dict[str, Any]:
    """sweep.json as it is now; no tasks while it is not written yet (or mid-replace)."""
    try:
        return json.loads((sweep / "sweep.json").read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return {"tasks": []}


# ----------------------------------------------------------------------------- cases
@dataclass(frozen=True)
class Expect:
    state: str = "COMPLETED"  # every task's final state in sweep.json
    runs: int | None = None  # Slurm runs of each task (submissions + Slurm's requeues); None: any
    cause: str | None = None  # the diagnosis cause the supervisor must name; None: none needed
    recoverable: bool = True  # results must be bit-identical to an uninterrupted run
    max_steps_redone: int | None = None  # bound on steps run twice, summed over tasks


@dataclass(frozen=True)
class FaultCase:
    name: str  # row id (test id)
    fault: str  # the table's words for the fault
    workload: tuple[str, ...]  # overrides that decide the result: the reference runs these
    expect: Expect
    overrides: tuple[str, ...] = ()  # further overrides ({dir} = the row's directory); not in the reference
    inject: Callable[[Run], None] | None = None  # runs while the sweep runs
    check: Callable[[Run, CaseResult], list[str]] | None = None  # the row's own checks: problems found
    setup: Callable[[Run], AbstractContextManager[None]] | None = None  # around the whole row (a mount)
    reattach: bool = False  # the injector kills the launcher; `slurmagent watch` finishes the sweep
    phase: int = 2  # rows of one phase inject at the same time; phases one after another
    note: str = ""  # appended to the table's cause column


# -- preemption ---------------------------------------------------------------------
PREEMPTIONS = 3


def preempt(run: Run) -> None:
    """Preempt the job PREEMPTIONS times, each time after its new run did 15 steps."""
    run.notes["preempted_after_steps"] = []
    for _ in range(PREEMPTIONS):
        job = run.running(min_steps=run.steps_run() + 15)
        run.notes["preempted_after_steps"].append(run.steps_run())
        # a high-priority job that needs the whole node preempts (requeues) the low one
        name = f"preempt-{run.dir.name}-{len(run.notes['preempted_after_steps'])}"
        argv = ["sbatch", "-p", "high", "-w", PREEMPT_NODE, "--exclusive", "--time=2", "-o", "/dev/null"]
        submit_once([*argv, f"--job-name={name}", "--wrap", "sleep 1"], name, run.env)
        state = wait_for(
            lambda job=job: (st := run.squeue(job)[0]) not in ("RUNNING", "UNKNOWN") and (st or "ENDED"),
            "the preempted job to stop running",
            90,
        )
        if state == "ENDED":  # no longer listed: it finished before the preemption landed
            raise InjectionError(f"job {job} finished before preemption {len(run.notes['preempted_after_steps'])}")


def submit_once(argv: list[str], name: str, env: dict[str, str], retry_s: float = 60) -> None:
    """sbatch through the slurmctld restart without submitting twice: an sbatch whose reply
    the restart cut off may still have queued its job (seen in CI: one preemption too many),
    so before each retry look for the job by its name."""
    deadline = time.monotonic() + retry_s
    while True:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
        if proc.returncode == 0:
            return
        if slurm(["squeue", "-h", "-n", name, "-o", "%i"], env, check=False).strip():
            return  # queued after all
        if time.monotonic() > deadline:
            raise InjectionError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
        time.sleep(1)


def check_preempted(run: Run, res: CaseResult) -> list[str]:
    history, result = res.history.get(0, []), res.tasks[0]["result"] or {}
    problems = []
    if history.count("PREEMPTED") != PREEMPTIONS:
        problems.append(f"Slurm's history {history} does not show {PREEMPTIONS} preemptions")
    if result.get("attempt") != PREEMPTIONS + 1 or not result.get("resumed_from"):
        problems.append(f"the final run is attempt {result.get('attempt')}, resumed from {result.get('resumed_from')}")
    if result.get("val_acc") != res.reference.get(0, {}).get("val_acc"):
        problems.append(f"val_acc {result.get('val_acc')} differs from the uninterrupted run's {res.reference.get(0)}")
    return problems


# -- host OOM -------------------------------------------------------------------------
def check_host_oom(run: Run, res: CaseResult) -> list[str]:
    task = res.tasks[0]
    problems = []
    first = task["attempts"][0]
    if first["state"] != "OUT_OF_MEMORY":
        # Slurm may end the job FAILED 1:0 with the OOM only on its srun step (seen in CI: 4054
        # FAILED, 4054.0 OUT_OF_MEMORY); the seam reads the step as the job's state, but a job
        # seen ending before the step's row reached accounting is recorded FAILED. The
        # decision's evidence (checked below) is the oom-kill line either way.
        out = slurm(["sacct", "-n", "-P", "-j", first["job_id"], "-o", "JobID,State"], run.env, check=False)
        steps = dict(line.split("|", 1) for line in out.splitlines() if "|" in line)
        res.notes["first_attempt_states"] = steps
        if first["state"] != "FAILED" or steps.get(f"{first['job_id']}.0") != "OUT_OF_MEMORY":
            problems.append(f"first attempt ended {first['state']} (steps {steps}), not OUT_OF_MEMORY")
    if task["spec"]["resources"]["mem"] != "384M":
        problems.append(f"resubmitted with --mem={task['spec']['resources']['mem']}, not 384M")
    decisions = [r for r in res.audit if r["type"] == "decision"]
    if not decisions or decisions[0]["params"] != {"mem": ["256M", "384M"]}:
        problems.append(f"audit has no resubmit decision mem 256M→384M: {decisions}")
    elif not any("oom-kill" in e["text"] or "OUT_OF_MEMORY" in e["text"] for e in decisions[0]["evidence"]):
        problems.append(f"the resubmit decision shows no OOM evidence: {decisions[0]['evidence']}")
    if not task["result"]["resumed_from"]:
        problems.append("the resubmitted attempt did not resume from a checkpoint")
    return problems


# -- node failure -----------------------------------------------------------------------
def fail_node(run: Run) -> None:
    job = run.running(min_steps=12)
    nodes = run.squeue(job)[1]
    if nodes != NODE_FAIL_NODE:
        raise InjectionError(f"job {job} runs on {nodes!r}, not on {NODE_FAIL_NODE}")
    run.notes["killed_after_steps"] = run.steps_run()
    try:
        run.notes["stop_node"] = run.cluster("stop-node", NODE_FAIL_NODE)
        after = run.steps_run()
        if after >= 100:
            raise InjectionError(f"job {job} ran all its steps before its node was stopped")
        wait_for(
            lambda: run.squeue(job)[0] not in ("RUNNING", "UNKNOWN"), "Slurm to see the node failure", 120, interval=0.5
        )
        # the killed job's processes are gone: it ran no further steps on the dead node
        run.notes["steps_after_kill"] = run.steps_run() - after
        # Slurm requeued the job; it waits for its node (it is pinned there) until the
        # supervisor excludes the node from it
        wait_for(lambda: excluded(run), "the supervisor to exclude the failed node", 90, interval=0.5)
    finally:
        # back at once: the requeued job must stay off it all the same
        run.cluster("start-node", NODE_FAIL_NODE)


def excluded(run: Run) -> bool:
    path = run.sweep / "audit.jsonl"
    records = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return any(r["type"] == "outcome" and r["action"] in ("exclude_node", "resubmit") for r in records)


def check_node_failure(run: Run, res: CaseResult) -> list[str]:
    task, state = res.tasks[0], res.state
    problems = []
    if run.notes.get("steps_after_kill"):
        problems.append(f"the job ran {run.notes['steps_after_kill']} step(s) after its node was stopped")
    if NODE_FAIL_NODE not in state.get("suspect_nodes", {}):
        problems.append(f"{NODE_FAIL_NODE} not among the sweep's suspect nodes {state.get('suspect_nodes')}")
    if NODE_FAIL_NODE not in (task["spec"]["resources"].get("exclude") or ""):
        problems.append(f"task spec does not exclude {NODE_FAIL_NODE}: {task['spec']['resources']}")
    if "nodelist" in task["spec"]["resources"].get("extra", {}):
        problems.append("the task is still pinned to the failed node")
    last_nodes = task["attempts"][-1]["nodes"]
    if NODE_FAIL_NODE in last_nodes:
        problems.append(f"the final run was on {last_nodes}")
    if "NODE_FAIL" not in res.history.get(0, []):
        problems.append(f"no NODE_FAIL run in Slurm's history {res.history.get(0)}")
    outcomes = [r for r in res.audit if r["type"] == "outcome" and r["action"] in ("exclude_node", "resubmit")]
    if not outcomes or not outcomes[0]["ok"]:
        problems.append(f"no successful exclusion in the audit log: {res.audit}")
    return problems


# -- slurmctld restart -----------------------------------------------------------------
def restart_ctld(run: Run) -> None:
    for task in (0, 1):
        run.running(task, min_steps=3)
    run.notes["restart"] = run.cluster("restart-ctld", "3")


# -- launcher killed -------------------------------------------------------------------
def kill_launcher(run: Run) -> None:
    for task in (0, 1):
        run.running(task, min_steps=3)
    assert run.launcher is not None
    run.launcher.send_signal(signal.SIGKILL)  # as on a closed ssh session
    run.launcher.wait()
    run.notes["killed_with_done"] = sum(t["state"] == "COMPLETED" for t in (run.state() or {"tasks": []})["tasks"])


# -- newest checkpoint corrupt -----------------------------------------------------------
def corrupt_newest_checkpoint(run: Run) -> None:
    job = run.running(min_steps=12)
    wait_for(lambda: len(run.checkpoints()) >= 2, "two checkpoints", 60)
    # requeue and hold: the job checkpoints on SIGTERM, ends, and waits while we break that checkpoint
    slurm(["scontrol", "requeuehold", job], run.env)
    wait_for(lambda: run.squeue(job)[0] == "PENDING", "the held job to stop", 60)
    entries = run.checkpoints()
    newest, previous = entries[-1], entries[-2]
    path = run.sweep / "0" / "checkpoints" / newest["file"]
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # truncated, as by a crash in a non-atomic writer
    run.notes.update(corrupted_step=int(newest["step"]), fallback_step=int(previous["step"]))
    slurm(["scontrol", "release", job], run.env)


def check_corrupt(run: Run, res: CaseResult) -> list[str]:
    result = res.tasks[0]["result"] or {}
    problems = []
    if result.get("resumed_from") != run.notes.get("fallback_step"):
        problems.append(
            f"resumed from step {result.get('resumed_from')}, not from the previous checkpoint "
            f"(step {run.notes.get('fallback_step')}; the truncated one was step {run.notes.get('corrupted_step')})"
        )
    logs = "".join(p.read_text(errors="replace") for p in (run.sweep / ".submitit").glob("*_log.*"))
    if "fails its checksum; falling back" not in logs:
        problems.append("the job's log does not say it fell back from the corrupt checkpoint")
    bad, good = run.notes.get("corrupted_step"), run.notes.get("fallback_step")
    res.cause = f"newest checkpoint (step {bad}) fails its checksum → restored step {good}"
    return problems


# -- disk full during a save --------------------------------------------------------------
def small_disk(run: Run) -> Iterator[None]:
    mount = run.dir / "small-fs"
    mount.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], check=True, timeout=30)
    try:
        yield
    finally:
        if subprocess.run(["umount", str(mount)], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=30)


def disk_ckpt_dir(run: Run) -> Path:
    """The task's own directory under the row's checkpoint.dir (primitives/env.py: DIR/<sweep>/<task>)."""
    from slurmagent.primitives.env import sweep_key

    return run.dir / "small-fs" / "ckpt" / sweep_key(run.sweep) / "0"


def fill_disk(run: Run) -> None:
    run.running(min_steps=1)
    ckpt = disk_ckpt_dir(run)
    wait_for(lambda: run.checkpoints(ckpt), "a first checkpoint on the small file system", 60)
    chunk = b"\0" * 4096
    with open(ckpt.parent / "filler", "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(chunk)
        except OSError as exc:
            run.notes["filled"] = str(exc)
    run.notes["steps_at_fill"] = run.steps_run()


def check_disk_full(run: Run, res: CaseResult) -> list[str]:
    from slurmagent.primitives.checkpoint import CheckpointManager

    ckpt = disk_ckpt_dir(run)
    problems = []
    entries = run.checkpoints(ckpt)
    found = CheckpointManager(ckpt).latest()
    if not entries or found is None:
        problems.append(f"no intact checkpoint left in {ckpt}")
    elif found[0].step != int(entries[-1]["step"]):
        problems.append(f"newest checkpoint in the manifest (step {entries[-1]['step']}) does not verify")
    leftovers = [p.name for p in ckpt.iterdir() if ".tmp." in p.name or p.name not in {e["file"] for e in entries}]
    if set(leftovers) - {"manifest.json"}:
        problems.append(f"half-written files left behind: {leftovers}")
    problems += unretried_failure(res, "No space left on device", "older checkpoints are intact")
    if found is not None:
        res.cause += f"; step {found[0].step} checkpoint intact"
    return problems


# -- missing data file, code that always crashes ---------------------------------------------
def unretried_failure(res: CaseResult, *shown: str) -> list[str]:
    """The task's error shows `shown`, says it was not retried, and nothing automated ran."""
    error = res.tasks[0]["error"]
    problems = [f"the task's error does not say {t!r}: {error!r}" for t in (*shown, "Not retried") if t not in error]
    if res.audit:
        problems.append(f"something automated happened: {res.audit}")
    return problems


def check_missing(run: Run, res: CaseResult) -> list[str]:
    problems = unretried_failure(res, "The path '/nonexistent/data/train/labels.csv' does not exist")
    doctor = subprocess.run(
        [sys.executable, "-m", "slurmagent", "doctor", res.tasks[0]["attempts"][-1]["job_id"]],
        capture_output=True,
        text=True,
        timeout=120,
        env=run.env,
    )
    if "cause: missing_path; retryable: False" not in doctor.stdout:
        problems.append(f"`slurmagent doctor` says: {doctor.stdout + doctor.stderr}")
    return problems


def check_crash(run: Run, res: CaseResult) -> list[str]:
    return unretried_failure(res, "ValueError: shape mismatch")


def check_oom_bounded(run: Run, res: CaseResult) -> list[str]:
    error = res.tasks[0]["error"]
    shown = ("OUT_OF_MEMORY", "oom-kill", "gave up after 1 attempt(s) (recovery.max_attempts=1)")
    problems = [f"the task's error does not say {t!r}: {error!r}" for t in shown if t not in error]
    if "OUT_OF_MEMORY" not in (run.dir / "launcher.err").read_text(errors="replace"):
        problems.append("the launcher's summary does not say OUT_OF_MEMORY")
    if res.audit:
        problems.append(f"resubmitted beyond the bound: {res.audit}")
    return problems


# -- GPU faults (emulated GPU: slurmagent/examples/gpu_faults.py raises torch's real exception
#    types with the real CUDA/NCCL messages from a real torch step; there is no GPU here) --------
GPU_WORK = ("+experiment=gpu_faults", "resources.gpus=1")
ON_GPU_NODES = (KEEP_OFF, "resources.partition=gpu")


def first_decision(res: CaseResult) -> dict[str, Any]:
    decisions = [r for r in res.audit if r["type"] == "decision"]
    return decisions[0] if decisions else {}


def check_cuda_transient(run: Run, res: CaseResult) -> list[str]:
    retries = (res.tasks[0]["result"] or {}).get("cuda_retries")
    return [] if retries == 2 else [f"{retries} in-process retries of the step, expected 2"]


def check_cuda_persistent(run: Run, res: CaseResult) -> list[str]:
    task = res.tasks[0]
    bad = task["attempts"][0]["nodes"]
    problems = []
    if bad not in (task["spec"]["resources"].get("exclude") or ""):
        problems.append(f"the node with the broken GPU ({bad}) is not excluded: {task['spec']['resources']}")
    if (task["result"] or {}).get("node") == bad:
        problems.append(f"the final run was on {bad} again")
    if bad not in res.state.get("suspect_nodes", {}):
        problems.append(f"{bad} not among the suspect nodes {res.state.get('suspect_nodes')}")
    if not any("suspect GPU on node" in e["text"] for e in first_decision(res).get("evidence", [])):
        problems.append(f"the resubmission shows no suspect-GPU evidence: {first_decision(res)}")
    return problems


def check_nccl(run: Run, res: CaseResult) -> list[str]:
    decision = first_decision(res)
    problems = []
    if decision.get("params") != {}:
        problems.append(f"the first NCCL failure should be retried unchanged: {decision.get('params')}")
    if not any("NCCL error in:" in e["text"] for e in decision.get("evidence", [])):
        problems.append(f"the resubmission shows no NCCL evidence: {decision.get('evidence')}")
    return problems


def check_gpu_oom(run: Run, res: CaseResult) -> list[str]:
    task, result = res.tasks[0], res.tasks[0]["result"] or {}
    problems = []
    if not task["attempts"][0]["nodes"].startswith("t4-") or task["attempts"][-1]["nodes"] != "a100-1":
        problems.append(f"attempts ran on {[a['nodes'] for a in task['attempts']]}, expected a t4 then a100-1")
    if (result.get("gpu_type"), result.get("micro_batch"), result.get("halvings")) != ("a100", 32, 1):
        problems.append(f"final run: {result}")
    if first_decision(res).get("params") != {"gpu_type": ["t4", "a100"]}:
        problems.append(f"resubmission params {first_decision(res).get('params')}")
    return problems


def check_time_limit(run: Run, res: CaseResult) -> list[str]:
    task = res.tasks[0]
    problems = []
    if task["spec"]["resources"]["time"] != "00:02:00":
        problems.append(f"resubmitted with --time={task['spec']['resources']['time']}, not 00:02:00")
    decision = first_decision(res)
    if decision.get("params") != {"time": ["00:01:00", "00:02:00"]}:
        problems.append(f"resubmission params {decision.get('params')}")
    if not any("time limit reached 1 times" in e["text"] for e in decision.get("evidence", [])):
        problems.append(f"no time-limit evidence: {decision.get('evidence')}")
    if not (task["result"] or {}).get("resumed_from"):
        problems.append("the resubmitted run did not resume from the stop checkpoint")
    return problems


MISSING = "open('/nonexistent/data/train/labels.csv')"
CRASH = "raise ValueError('shape mismatch: (64, 10) vs (64, 12)')"
HOG = "import time; x = bytearray(700 * 2**20); time.sleep(5)"

CASES: tuple[FaultCase, ...] = (
    FaultCase(
        "slurmctld_restart",
        "slurmctld restarted mid-sweep (down 3 s)",
        SYNTH_SWEEP,
        Expect(runs=1, max_steps_redone=0),
        overrides=(KEEP_OFF,),
        inject=restart_ctld,
        phase=1,
        note="no failure: jobs ran on, their ends were accounted after the restart",
    ),
    FaultCase(
        "preemption",
        f"preemption by a high-priority job, {PREEMPTIONS} times (torch digits MLP)",
        DIGITS,
        Expect(runs=PREEMPTIONS + 1, max_steps_redone=PREEMPTIONS),  # at most one step per preemption
        overrides=("resources.partition=low", f"+resources.extra.nodelist={PREEMPT_NODE}"),
        inject=preempt,
        check=check_preempted,
        phase=1,  # four torch start-ups: the longest row, so it starts first; it copes with the restart
        note="Slurm requeue, resumed from the stop checkpoint",
    ),
    FaultCase(
        "host_oom",
        "host OOM (cgroup kill at step 12)",
        SYNTH,
        Expect(runs=2, cause="host_oom", max_steps_redone=5),
        overrides=(KEEP_OFF, "resources.mem=256M", "synthetic.alloc_mb=300", "synthetic.alloc_at_step=12"),
        check=check_host_oom,
    ),
    FaultCase(
        "node_failure",
        "node failure (slurmd SIGKILLed, its jobs killed)",
        SYNTH_LONG,
        Expect(runs=2, cause="node_failure"),
        overrides=(f"resources.exclude={PREEMPT_NODE}", f"+resources.extra.nodelist={NODE_FAIL_NODE}"),
        inject=fail_node,
        check=check_node_failure,
    ),
    FaultCase(
        "launcher_killed",
        "launcher killed mid-sweep, `slurmagent watch` re-attaches",
        SYNTH_SWEEP,
        Expect(runs=1, max_steps_redone=0),
        overrides=(KEEP_OFF,),
        inject=kill_launcher,
        reattach=True,
        note="no failure: `watch` took over the sweep state and collected every result",
    ),
    FaultCase(
        "corrupt_checkpoint",
        "newest checkpoint truncated while the job was requeued",
        SYNTH,
        Expect(runs=2),
        overrides=(KEEP_OFF,),
        inject=corrupt_newest_checkpoint,
        check=check_corrupt,
    ),
    FaultCase(
        "disk_full",
        "disk full during a checkpoint save",
        SYNTH_LONG,  # 10 s of steps: the injector must see it running before it ends, even under load
        Expect(state="FAILED", runs=1, cause="disk_full", recoverable=False),
        overrides=(KEEP_OFF, "checkpoint.dir={dir}/small-fs/ckpt"),
        inject=fill_disk,
        check=check_disk_full,
        setup=contextmanager(small_disk),
    ),
    FaultCase(
        "missing_data",
        "missing data file",
        ("task.target=null", f'task.command=[python3,-c,"{MISSING}"]'),
        Expect(state="FAILED", runs=1, cause="missing_path", recoverable=False),
        overrides=(KEEP_OFF, "recovery.max_attempts=3"),
        check=check_missing,
    ),
    FaultCase(
        "always_crashes",
        "code that always crashes",
        ("task.target=null", f'task.command=[python3,-c,"{CRASH}"]'),
        Expect(state="FAILED", runs=1, cause="crash", recoverable=False),
        overrides=(KEEP_OFF, "recovery.max_attempts=3"),
        check=check_crash,
    ),
    FaultCase(
        "host_oom_bounded",
        "host OOM, no attempt left (recovery.max_attempts=1)",
        ("task.target=null", f"task.command=[python3,-c,'{HOG}']"),
        Expect(state="OUT_OF_MEMORY", runs=1, cause="host_oom", recoverable=False),
        overrides=(KEEP_OFF, "resources.mem=200M", "recovery.max_attempts=1"),
        check=check_oom_bounded,
        note="gave up after 1 attempt",
    ),
    FaultCase(
        "time_limit",
        "time limit (1 min): Slurm's warning signal, no requeue left",
        ("+experiment=synthetic", "synthetic.steps=450", "synthetic.step_time_s=0.1", "checkpoint.every_steps=1000"),
        Expect(runs=2, cause="time_limit", max_steps_redone=1),
        # USR2 20 s before the limit; slurmctld checks every 30 s, so it comes 10-40 s in,
        # before the 45 s of work are done; the job stops, the supervisor gives it 2 minutes
        overrides=(
            KEEP_OFF,
            "resources.partition=low",
            "resources.time='00:01:00'",
            "recovery.signal_delay_s=20",
            "recovery.max_time_limit_requeues=0",
            # a warning late in the run may find the rest fits before the limit and finish
            # (test_requeue_slurm.py proves that); this case is the stop and resubmission
            "recovery.finish_before_limit=false",
        ),
        check=check_time_limit,
    ),
    FaultCase(
        "cuda_transient",
        "CUDA illegal memory access at step 20, twice (emulated GPU)",
        GPU_WORK,
        Expect(runs=1, max_steps_redone=0),
        overrides=(*ON_GPU_NODES, "gpu_faults.fault=cuda_error", "gpu_faults.fault_times=2"),
        check=check_cuda_transient,
        note="retried in process from the state before the step",
    ),
    FaultCase(
        "cuda_persistent",
        "CUDA error on every try on one node, batch fine on CPU (emulated GPU)",
        GPU_WORK,
        Expect(runs=2, cause="gpu_suspect"),
        overrides=(*ON_GPU_NODES, "gpu_faults.fault=cuda_error", "gpu_faults.bad_node=first"),
        check=check_cuda_persistent,
    ),
    FaultCase(
        "nccl",
        "NCCL error at step 20 (emulated)",
        GPU_WORK,
        Expect(runs=2, cause="nccl_error"),
        overrides=(*ON_GPU_NODES, "gpu_faults.fault=nccl"),
        check=check_nccl,
    ),
    FaultCase(
        "gpu_oom",
        "GPU OOM on a t4 past 2 halvings (emulated GPU memory)",
        # the reference runs on an a100 from the start; the faulty run asks for a t4 (later override wins)
        (*GPU_WORK, "gpu_faults.fault=gpu_oom", "gpu_faults.sample_mib=2", "resources.gpu_type=a100"),
        Expect(runs=2, cause="gpu_oom"),
        overrides=(*ON_GPU_NODES, "resources.gpu_type=t4"),
        check=check_gpu_oom,
        note="halved in process first",
    ),
)


# ----------------------------------------------------------------------------- results
@dataclass
class CaseResult:
    name: str
    fault: str
    wall_s: float
    tasks: list[dict[str, Any]]  # sweep.json's task records
    state: dict[str, Any]  # the whole sweep.json
    audit: list[dict[str, Any]]  # the sweep's audit.jsonl records
    history: dict[int, list[str]]  # task → Slurm states of each run of each of its jobs, in order
    runs: list[int]  # Slurm runs per task
    steps_redone: int | None
    bit_identical: bool | None  # None: not a recoverable row
    reference: dict[int, dict[str, Any]]  # the uninterrupted run's result per task (recoverable rows)
    cause: str = ""
    problems: list[str] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def outcome(self) -> str:
        states = sorted({t["state"] for t in self.tasks}) or ["no sweep"]
        return "/".join(states) + (f" ({len(self.tasks)} tasks)" if len(self.tasks) > 1 else "")

    def row(self) -> str:
        redone = "–" if self.steps_redone is None else str(self.steps_redone)
        same = {True: "yes", False: "**no**", None: "n/a"}[self.bit_identical]
        runs = "/".join(str(r) for r in self.runs) or "–"
        cells = [self.fault, self.outcome, runs, redone, f"{self.wall_s:.0f} s", same, self.cause or "–"]
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


TABLE_HEADER = (
    "| fault | outcome | attempts | steps redone | wall time | bit-identical | cause |\n"
    "|---|---|---:|---:|---:|---|---|"
)


def table(results: list[CaseResult]) -> str:
    return "\n".join([TABLE_HEADER, *(r.row() for r in results)])


def _history(job_id: str, env: dict[str, str]) -> list[str]:
    out = slurm(["sacct", "-X", "-n", "-P", "--duplicates", "-j", job_id, "-o", "State"], env, check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _steps_redone(sweep: Path, n_tasks: int) -> int | None:
    total, seen_any = 0, False
    for i in range(n_tasks):
        path = sweep / str(i) / "metrics.jsonl"
        if not path.exists():
            continue
        seen_any = True
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        steps = [r["step"] for r in rows if "epoch" not in r]  # an epoch's report shares its last step
        total += len(steps) - len(set(steps))
    return total if seen_any else None


def _cause(tasks: list[dict[str, Any]], audit: list[dict[str, Any]], history: dict[int, list[str]]) -> str:
    causes = sorted({t["diagnosis"]["cause"] for t in tasks if t.get("diagnosis")})
    if not causes:  # Slurm requeued the job itself: its states say why
        causes = sorted({s.lower() for h in history.values() for s in h[:-1] if s not in ("REQUEUED", "RUNNING")})
    words = [", ".join(causes)] if causes else []
    for rec in audit:
        if rec["type"] == "decision":
            params = "; ".join(
                f"{k} {v[0]}→{v[1]}" if isinstance(v, list) and len(v) == 2 else (f"{k}={v}" if v else f"{k} cleared")
                for k, v in rec["params"].items()
            )
            words.append(f"{rec['action']} {params}".strip() + ("" if rec["decision"] == "allow" else " (denied)"))
    failed = [t for t in tasks if t["state"] != "COMPLETED" and t.get("diagnosis")]
    if failed and not failed[0]["diagnosis"]["retryable"]:
        words.append("not retried")
    return " → ".join(words)


def summarize(run: Run, wall_s: float, rc: int | None, reference: dict[int, dict[str, Any]]) -> CaseResult:
    """The row's figures from the sweep's files and Slurm's accounting, and every way it
    differs from what the case expects (`problems`)."""
    case = run.case
    state = run.state() or {"tasks": []}
    tasks = [{**t, "spec": state.get("specs", {}).get(t.get("spec_id"), {})} for t in state["tasks"]]
    audit_path = run.sweep / "audit.jsonl"
    audit = [json.loads(x) for x in audit_path.read_text().splitlines()] if audit_path.exists() else []
    history = {t["index"]: [s for a in t["attempts"] for s in _history(a["job_id"], run.env)] for t in tasks}
    # Slurm's accounting has a row per run; sweep.json's restart counts as a fallback
    runs = [len(history[t["index"]]) or sum(1 + int(a["restarts"]) for a in t["attempts"]) for t in tasks]
    bit_identical = None
    if case.expect.recoverable:
        got = {t["index"]: (t["result"] or {}).get("state_hash") for t in tasks}
        want = {i: r.get("state_hash") for i, r in reference.items()}
        bit_identical = bool(tasks) and all(got[i] is not None and got[i] == want.get(i) for i in got)
    res = CaseResult(
        case.name,
        case.fault,
        wall_s,
        tasks,
        state,
        audit,
        history,
        runs,
        _steps_redone(run.sweep, len(tasks)),
        bit_identical,
        reference,
        " → ".join(filter(None, [_cause(tasks, audit, history), case.note])),
        notes=run.notes,
    )
    problems = res.problems
    if run.notes.get("inject_error"):
        problems.append(f"injection failed: {run.notes['inject_error']}")
    exp = case.expect
    want_rc = 0 if exp.state == "COMPLETED" else 1
    if rc != want_rc:
        problems.append(f"launcher/watch exited {rc}, expected {want_rc}")
    if not tasks:
        problems.append("no sweep state was written")
    for t in tasks:
        if t["state"] != exp.state:
            problems.append(f"task {t['index']} ended {t['state']}, expected {exp.state}: {t['error'][:500]}")
        if exp.state == "COMPLETED" and t["result"] is None:
            problems.append(f"task {t['index']} lost its result")
        if exp.cause is not None and (t.get("diagnosis") or {}).get("cause") != exp.cause:
            problems.append(f"task {t['index']} diagnosed {t.get('diagnosis')}, expected cause {exp.cause}")
        if exp.state != "COMPLETED" and not t["error"]:
            problems.append(f"task {t['index']} failed without an error text")
    if exp.runs is not None and any(r != exp.runs for r in runs):
        problems.append(f"runs per task {runs}, expected {exp.runs} each")
    if bit_identical is False:
        got = [(t["result"] or {}).get("state_hash") for t in tasks]
        want = [r.get("state_hash") for _, r in sorted(reference.items())]
        problems.append(f"state hashes {got} differ from the uninterrupted run's {want}")
    if exp.max_steps_redone is not None and (res.steps_redone or 0) > exp.max_steps_redone:
        problems.append(f"{res.steps_redone} steps redone, expected at most {exp.max_steps_redone}")
    if case.check is not None and tasks:
        try:
            problems += case.check(run, res)
        except Exception:
            problems.append("row check raised:\n" + traceback.format_exc())
    if problems:
        err = run.dir / "launcher.err"
        if err.exists():
            problems.append("launcher stderr (tail):\n" + "\n".join(err.read_text().splitlines()[-20:]))
    return res


# ----------------------------------------------------------------------------- running
def sweep_argv(sweep: Path, *overrides: str) -> list[str]:
    """`python -m slurmagent -m OVERRIDES` into `sweep`, polling every 1-2 s (the cluster
    tests' launcher command line)."""
    return [sys.executable, "-m", "slurmagent", "-m", *overrides, f"hydra.sweep.dir={sweep}", *POLL]


def launcher_argv(run: Run) -> list[str]:
    case = run.case
    return sweep_argv(run.sweep, *(o.replace("{dir}", str(run.dir)) for o in (*case.workload, *case.overrides)))


@dataclass
class Turn:
    """A row's place in the schedule (run_table): it reports `submitted` once its sweep is
    on the cluster, waits for `may_inject`, reports `injected` when its fault is done."""

    submitted: threading.Event = field(default_factory=threading.Event)
    may_inject: threading.Event = field(default_factory=threading.Event)
    injected: threading.Event = field(default_factory=threading.Event)


def run_case(case: FaultCase, base: Path, env: dict[str, str], references: ReferenceRuns, turn: Turn) -> CaseResult:
    """One row: launch its sweep, inject its fault when its turn comes, wait for the end."""
    run = Run(case, base / case.name, env)
    run.dir.mkdir(parents=True, exist_ok=True)
    rc: int | None = None
    with case.setup(run) if case.setup is not None else nullcontext():
        t0 = time.monotonic()
        with open(run.dir / "launcher.out", "wb") as out, open(run.dir / "launcher.err", "wb") as err:
            run.launcher = subprocess.Popen(launcher_argv(run), cwd=run.dir, env=env, stdout=out, stderr=err)
            try:
                with suppress(InjectionError):  # no sweep state: the checks below say so
                    wait_for(lambda: run.state() or run.launcher.poll() is not None, "the sweep's state", 120)
                turn.submitted.set()
                try:
                    turn.may_inject.wait(CASE_TIMEOUT_S)
                    if case.inject is not None:
                        case.inject(run)
                except Exception as exc:
                    run.notes["inject_error"] = f"{type(exc).__name__}: {exc}"
                finally:
                    turn.injected.set()
                if case.reattach:
                    watch = subprocess.run(
                        [*WATCH, str(run.sweep), "--interval", "1", "--timeout", str(CASE_TIMEOUT_S)],
                        cwd=run.dir,
                        env=env,
                        stdout=out,
                        stderr=err,
                        timeout=CASE_TIMEOUT_S + 60,
                    )
                    rc = watch.returncode
                else:
                    rc = run.launcher.wait(timeout=max(1.0, CASE_TIMEOUT_S - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                run.notes["inject_error"] = f"the sweep did not end within {CASE_TIMEOUT_S} s"
            finally:
                if run.launcher.poll() is None:
                    run.launcher.kill()
                    run.launcher.wait()
                    if (run.sweep / "sweep.json").exists():  # leave nothing running on the cluster
                        subprocess.run(
                            [sys.executable, "-m", "slurmagent", "cancel", str(run.sweep)],
                            env=env,
                            capture_output=True,
                            timeout=120,
                        )
        wall = time.monotonic() - t0
        references.wait(case.workload)
        return summarize(run, wall, rc, references.results.get(case.workload, {}))


class ReferenceRuns:
    """Uninterrupted runs of each distinct workload (cluster=local, no faults), in threads."""

    def __init__(self, base: Path, env: dict[str, str]) -> None:
        self.base = base
        self.env = {k: v for k, v in env.items() if k != "SLURM_CONF"}
        self.results: dict[tuple[str, ...], dict[int, dict[str, Any]]] = {}  # workload → index → result
        self.errors: dict[tuple[str, ...], str] = {}
        self._threads: dict[tuple[str, ...], threading.Thread] = {}

    def start(self, workloads: list[tuple[str, ...]]) -> None:
        for wl in dict.fromkeys(workloads):
            if wl not in self._threads:
                thread = threading.Thread(target=self._run, args=(wl, len(self._threads)), daemon=True)
                self._threads[wl] = thread
                thread.start()

    def _run(self, workload: tuple[str, ...], k: int) -> None:
        sweep = self.base / f"reference-{k}"
        proc = subprocess.run(
            [sys.executable, "-m", "slurmagent", "-m", "cluster=local", *workload, f"hydra.sweep.dir={sweep}"],
            cwd=self.base,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=CASE_TIMEOUT_S,
        )
        try:
            tasks = json.loads((sweep / "sweep.json").read_text())["tasks"]
            self.results[workload] = {t["index"]: t["result"] or {} for t in tasks}
        except (OSError, ValueError, KeyError):
            self.errors[workload] = f"reference run exited {proc.returncode}: {proc.stderr[-2000:]}"

    def wait(self, workload: tuple[str, ...]) -> None:
        thread = self._threads.get(workload)
        if thread is not None:
            thread.join(CASE_TIMEOUT_S)


def run_table(
    cases: tuple[FaultCase, ...] | list[FaultCase], base: Path, env: dict[str, str] | None = None
) -> list[CaseResult]:
    """Run `cases` on the test cluster (SLURM_CONF in `env`), all at the same time but phase
    after phase: a phase's rows are launched once every row of the phases before has done
    its damage (their sweeps may still be finishing), and inject their faults once all of
    their sweeps are on the cluster (a slurmctld restart then hits no submission). References
    for the recoverable rows run alongside. Results in the order of `cases`."""
    env = dict(os.environ if env is None else env)
    base.mkdir(parents=True, exist_ok=True)
    references = ReferenceRuns(base, env)
    references.start([c.workload for c in cases if c.expect.recoverable])
    turns = {c.name: Turn() for c in cases}
    with ThreadPoolExecutor(max_workers=max(1, len(cases))) as pool:
        futures = {}
        for phase in sorted({c.phase for c in cases}):
            for case in cases:
                if case.phase == phase:
                    futures[case.name] = pool.submit(run_case, case, base, env, references, turns[case.name])
            for name in futures:
                turns[name].submitted.wait(CASE_TIMEOUT_S)
            now = [c for c in cases if c.phase == phase]
            for case in now:
                turns[case.name].may_inject.set()
            for case in now:
                turns[case.name].injected.wait(CASE_TIMEOUT_S)
        results = {name: fut.result() for name, fut in futures.items()}
    for res in results.values():
        case = next(c for c in cases if c.name == res.name)
        if case.workload in references.errors:
            res.problems.append(references.errors[case.workload])
    return [results[c.name] for c in cases]
