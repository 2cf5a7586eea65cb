"""A seeded random fault campaign on the test cluster, run as a user runs, with recovery ON
and OFF.

N checkpointed tasks of the synthetic workload (default 20), spread over four sweeps, each
launched with `python -m slurmagent … -m` from a fresh directory of its own (not the
checkout), with Hydra's default sweep dir, the default checkpoint dir and the default poll
interval:

- `faults`: tasks hit by per-task faults (below);
- `watch`: the same, and its launcher is SIGKILLed mid-run; `slurmagent watch SWEEP` finishes it;
- `time-limit`: `resources.time=00:01:00 recovery.signal_delay_s=20`, more steps than fit;
- `host-oom`: `resources.mem=256M`, `synthetic.alloc_mb` allocated at a step mid-run, so the
  cgroup OOM killer ends the job.

Per-task faults, drawn from the seed (kind and the step at which each lands), injected
while the task runs: preemption (a high-partition job on the task's node, `sbatch -p high
-w NODE --exclusive`: it preempts every task on that node), node failure (`slurm-cluster
stop-node NODE`, its slurmd and jobs SIGKILLed; `start-node` a few seconds after Slurm
marked it down), SIGKILL of the task's training process, `scontrol requeue` of its job.

The same campaign (same seed: same sweeps, same faults at the same steps) runs twice:
recovery ON (the defaults) and OFF (`recovery.max_attempts=1 recovery.requeue=false`: no
resubmission, no Slurm requeue). A completed task's `digest` (a sha256 chain over its
steps) equals `chain(steps)` only if no step was lost or run twice; its metrics.jsonl has
one line per step run, so steps redone = lines − distinct steps.

    tests/cluster/slurm-cluster up
    SLURM_CONF=/var/tmp/slurmagent-cluster/etc/slurm.conf .venv/bin/python bench/fault_campaign.py \\
        [--seed 19] [--tasks 20] [--modes on off] [--json campaign.json] [--keep DIR]

Needs root (it reads the job processes' environment and stops slurmd daemons), the cluster
to itself, and about 5 minutes for both passes (20 tasks). Exits 1 when recovery ON left a
task unfinished or any completed result is wrong. bench/README.md has a measured table.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "slurm"))

from fault_cases import (  # noqa: E402
    CLUSTER_SCRIPT,
    InjectionError,
    slurm,
    submit_once,
    sweep_state,
    training_pids,
    wait_for,
)

KINDS = ("preempt", "node_fail", "sigkill", "requeue")
KIND_WORDS = {
    "preempt": "preemption (high-partition job on the node)",
    "node_fail": "node failure (slurmd and its jobs SIGKILLed)",
    "sigkill": "SIGKILL of the training process",
    "requeue": "`scontrol requeue`",
    "launcher_kill": "launcher SIGKILLed, `watch` finishes",
    "time_limit": "time limit (tasks of a 1-minute sweep)",
    "host_oom": "host OOM (tasks of a 256M sweep)",
}
OFF = ("recovery.max_attempts=1", "recovery.requeue=false")
STEP_TIME_S = 0.5
CKPT_EVERY = 10
WORK = ("+experiment=synthetic", f"synthetic.step_time_s={STEP_TIME_S}", f"checkpoint.every_steps={CKPT_EVERY}")
NODES = ("a100-1", "cpu-1", "cpu-2", "t4-1", "t4-2")
RUN_TIMEOUT_S = 900  # one pass (ON or OFF), launchers' start to the last sweep's end


def node_states(env: dict[str, str], node: str = "") -> dict[str, str]:
    """Each node's State as `scontrol show node -o` has it (IDLE, ALLOCATED*, DOWN*+COMPLETING…),
    all its flags: polling sinfo's one word, the campaign once went 90 s without seeing `down`
    while slurmctld had set the node DOWN."""
    out = slurm(["scontrol", "show", "node", "-o", *([node] if node else [])], env, check=False)
    states = {}
    for line in out.splitlines():
        fields = dict(f.partition("=")[::2] for f in line.split())
        if fields.get("NodeName"):
            states[fields["NodeName"]] = fields.get("State", "")
    return states


def node_dead(state: str) -> bool:
    """Slurm has marked the node down (a * alone only says it does not answer yet)."""
    return "DOWN" in state or "FAIL" in state


def node_back(state: str) -> bool:
    return bool(state) and not node_dead(state) and "*" not in state


def chain(steps: int) -> str:
    """The synthetic task's digest after `steps` steps, each run exactly once."""
    d = hashlib.sha256(b"start").hexdigest()
    for step in range(steps):
        d = hashlib.sha256(f"{d}:{step}".encode()).hexdigest()
    return d


# ----------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class Fault:
    kind: str  # one of KINDS
    at_step: int  # injected once the task's run has reached this step
    down_s: float = 0.0  # node_fail: seconds between Slurm marking the node down and its slurmd's start


@dataclass(frozen=True)
class TaskPlan:
    index: int  # in the campaign
    sweep: str
    steps: int  # synthetic.steps: also what tells the sweep's tasks apart
    faults: tuple[Fault, ...] = ()


@dataclass(frozen=True)
class SweepPlan:
    name: str
    tasks: tuple[TaskPlan, ...]
    overrides: tuple[str, ...] = ()
    kill_launcher_at_step: int | None = None  # the launcher is SIGKILLed once its first task reached it
    sweep_fault: str = ""  # launcher_kill | time_limit | host_oom: what hits the whole sweep


def make_plan(seed: int, n_tasks: int) -> list[SweepPlan]:
    """The campaign drawn from `seed`: which tasks go to which sweep, their step counts, and
    every fault with the step it lands at."""
    if n_tasks < 4:
        raise SystemExit("--tasks: at least 4 (one per sweep)")
    rng = random.Random(seed)
    n_time = max(1, round(n_tasks * 0.15))
    n_oom = max(1, round(n_tasks * 0.15))
    n_watch = max(1, round(n_tasks * 0.25))
    n_faults = n_tasks - n_time - n_oom - n_watch
    steps = rng.sample(range(100, 100 + 3 * n_tasks), n_tasks)
    index = iter(range(n_tasks))

    def faulty(sweep: str, n: int) -> tuple[TaskPlan, ...]:
        tasks = []
        for _ in range(n):
            i = next(index)
            s = steps[i]
            count = rng.choices((0, 1, 2), weights=(1, 6, 3))[0]
            faults: list[Fault] = []
            at = rng.randint(8, int(s * 0.45))
            for _ in range(count):
                kind = rng.choice(KINDS)
                faults.append(Fault(kind, at, round(rng.uniform(2, 8), 1) if kind == "node_fail" else 0.0))
                at = rng.randint(at + 15, max(at + 16, s - 12))
            tasks.append(TaskPlan(i, sweep, s, tuple(f for f in faults if f.at_step < s - 5)))
        return tuple(tasks)

    def plain(sweep: str, n: int) -> tuple[TaskPlan, ...]:
        return tuple(TaskPlan(i, sweep, steps[i]) for i in (next(index) for _ in range(n)))

    sweeps = [SweepPlan("faults", faulty("faults", n_faults))] if n_faults else []
    # the launcher is killed before the first per-task fault of its sweep lands
    watch = faulty("watch", n_watch)
    first = min((f.at_step for t in watch for f in t.faults), default=40)
    sweeps.append(SweepPlan("watch", watch, (), rng.randint(5, max(5, first - 3)), "launcher_kill"))
    # 1 minute with the warning 20 s before it (slurmctld sends it 10-40 s in): 50-65 s of steps need 2+ runs
    sweeps.append(
        SweepPlan(
            "time-limit",
            plain("time-limit", n_time),
            ("resources.time='00:01:00'", "recovery.signal_delay_s=20"),
            sweep_fault="time_limit",
        )
    )
    # 260 MB more under --mem=256M: the cgroup OOM killer fires at that step
    oom_at = rng.randint(15, 60)
    sweeps.append(
        SweepPlan(
            "host-oom",
            plain("host-oom", n_oom),
            ("resources.mem=256M", "synthetic.alloc_mb=260", f"synthetic.alloc_at_step={oom_at}"),
            sweep_fault="host_oom",
        )
    )
    return sweeps


# ----------------------------------------------------------------------------- one pass
@dataclass
class Injected:
    kind: str
    task: int  # campaign index
    at_step: int  # planned
    step: int  # the task's step when it landed
    job: str
    node: str
    t: float  # seconds into the pass
    detail: str = ""


@dataclass
class Live:
    """A sweep while it runs: its directory, its supervising process, what was done to it."""

    plan: SweepPlan
    home: Path
    proc: subprocess.Popen[bytes] | None = None
    sweep: Path | None = None
    ended: threading.Event = field(default_factory=threading.Event)
    rc: int | None = None
    notes: dict[str, Any] = field(default_factory=dict)

    def state(self) -> dict[str, Any]:
        return sweep_state(self.sweep) if self.sweep is not None else {"tasks": []}

    def task(self, k: int) -> dict[str, Any] | None:
        tasks = self.state()["tasks"]
        return next((t for t in tasks if t["index"] == k), None)

    def progress(self, k: int) -> int:
        """Steps done by task k's newest run: the highest step in its metrics.jsonl, plus one."""
        assert self.sweep is not None
        try:
            text = (self.sweep / str(k) / "metrics.jsonl").read_text()
        except OSError:
            return 0
        return max((s + 1 for s in _steps(text)), default=0)


def _steps(text: str) -> list[int]:
    """The step of each per-step line of a metrics.jsonl (a line cut by a concurrent write is skipped)."""
    out = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and "step" in row and "epoch" not in row:
            out.append(int(row["step"]))
    return out


class Pass:
    """One run of the campaign (recovery ON or OFF) in `base`."""

    def __init__(self, plan: list[SweepPlan], mode: str, base: Path, env: dict[str, str]) -> None:
        self.plan, self.mode, self.base, self.env = plan, mode, base, env
        self.live = [Live(sp, base / sp.name) for sp in plan]
        self.injected: list[Injected] = []
        self.missed: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.node_locks = {n: threading.Lock() for n in NODES}  # a node fails once at a time
        self.t0 = 0.0
        self._lock = threading.Lock()

    # -- helpers -----------------------------------------------------------------------
    def now(self) -> float:
        return round(time.monotonic() - self.t0, 1)

    def cli(self, home: Path, *args: str, out: Path) -> subprocess.Popen[bytes]:
        with open(out, "ab") as fh:
            return subprocess.Popen(
                [sys.executable, "-m", "slurmagent", *args], cwd=home, env=self.env, stdout=fh, stderr=fh
            )

    def cluster(self, *args: str) -> str:
        proc = subprocess.run(
            [sys.executable, str(CLUSTER_SCRIPT), *args], capture_output=True, text=True, env=self.env, timeout=120
        )
        if proc.returncode != 0:
            raise InjectionError(f"slurm-cluster {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc.stderr.strip()

    def squeue(self, job: str) -> tuple[str, str]:
        out = slurm(["squeue", "-h", "-j", job, "-o", "%T|%N"], self.env, check=False).strip()
        state, _, nodes = out.splitlines()[0].partition("|") if out else ("", "", "")
        return state, nodes

    def node_state(self, node: str) -> str:
        return node_states(self.env, node).get(node, "")

    # -- launching -------------------------------------------------------------------------
    def launch(self, lv: Live) -> None:
        lv.home.mkdir(parents=True, exist_ok=True)
        steps = ",".join(str(t.steps) for t in lv.plan.tasks)
        overrides = [*WORK, *lv.plan.overrides, *(OFF if self.mode == "off" else ())]
        lv.notes["command"] = ["python", "-m", "slurmagent", *overrides, "-m", f"synthetic.steps={steps}"]
        lv.proc = self.cli(lv.home, *overrides, "-m", f"synthetic.steps={steps}", out=lv.home / "launcher.log")

    def find_sweep(self, lv: Live) -> None:
        def found() -> Path | None:
            sweeps = [p for p in lv.home.glob("multirun/*/*") if (p / "sweep.json").is_file()]
            return sweeps[0] if len(sweeps) == 1 else None

        lv.sweep = wait_for(found, f"the {lv.plan.name} sweep under multirun/", 120)

    def supervise(self, lv: Live) -> None:
        """Wait for the sweep's end: its launcher, or (launcher killed) `slurmagent watch`."""
        assert lv.proc is not None and lv.sweep is not None
        try:
            if lv.plan.kill_launcher_at_step is not None:
                first = lv.plan.tasks[0]
                at = lv.plan.kill_launcher_at_step
                launcher = lv.proc
                wait_for(lambda: lv.progress(0) >= at or launcher.poll() is not None, "the launcher's kill", 300, 0.3)
                if lv.proc.poll() is not None:
                    with self._lock:
                        why = "the launcher had ended"
                        self.missed.append({"task": first.index, "kind": "launcher_kill", "at_step": at, "why": why})
                else:
                    lv.proc.send_signal(signal.SIGKILL)  # as a closed ssh session
                    lv.proc.wait()
                    step = lv.progress(0)
                    with self._lock:
                        self.injected.append(Injected("launcher_kill", first.index, at, step, "", "", self.now()))
                    lv.notes["launcher_killed_at"] = self.now()
                    lv.proc = self.cli(lv.home, "watch", str(lv.sweep), out=lv.home / "watch.log")
            deadline = self.t0 + RUN_TIMEOUT_S
            lv.rc = lv.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except (subprocess.TimeoutExpired, InjectionError) as exc:
            self.errors.append(f"{lv.plan.name}: {exc}")
            if lv.proc.poll() is None:
                lv.proc.kill()
                lv.proc.wait()
            subprocess.run(
                [sys.executable, "-m", "slurmagent", "cancel", str(lv.sweep)],
                cwd=lv.home,
                env=self.env,
                capture_output=True,
                timeout=120,
            )
        finally:
            lv.notes["ended_at"] = self.now()
            lv.ended.set()

    # -- per-task faults -----------------------------------------------------------------
    def injector(self, lv: Live, k: int, tp: TaskPlan) -> None:
        for fault in tp.faults:
            try:
                got = self._when_running(lv, k, fault.at_step)
                if got is None:
                    with self._lock:
                        self.missed.append({"task": tp.index, **asdict(fault), "why": "the task was no longer running"})
                    return
                job, node, step = got
                detail = self.inject(lv, fault, job, node)
                with self._lock:
                    done = Injected(fault.kind, tp.index, fault.at_step, step, job, node, self.now(), detail)
                    self.injected.append(done)
            except Exception as exc:
                with self._lock:
                    self.errors.append(f"task {tp.index} {fault.kind}@{fault.at_step}: {type(exc).__name__}: {exc}")
                    self.missed.append({"task": tp.index, **asdict(fault), "why": f"{type(exc).__name__}: {exc}"})
                traceback.print_exc()

    def _when_running(self, lv: Live, k: int, at: int) -> tuple[str, str, int] | None:
        """(job, node, step) once task k's job runs and has reached step `at`; None when the
        task ended (completed, or its sweep is over) first."""
        while not lv.ended.is_set():
            task = lv.task(k)
            if task is not None and task["state"] == "COMPLETED":
                return None
            if task is not None and task["attempts"] and lv.progress(k) >= at:
                job = str(task["attempts"][-1]["job_id"])
                state, node = self.squeue(job)
                if state == "RUNNING" and node:
                    return job, node, lv.progress(k)
            time.sleep(0.3)
        return None

    def inject(self, lv: Live, fault: Fault, job: str, node: str) -> str:
        assert lv.sweep is not None
        if fault.kind == "preempt":
            name = f"campaign-preempt-{self.mode}-{job}-{fault.at_step}"
            argv = ["sbatch", "-p", "high", "-w", node, "--exclusive", "--time=2", "-o", "/dev/null"]
            submit_once([*argv, f"--job-name={name}", "--wrap", "sleep 1"], name, self.env)
            return f"high-partition job on {node}"
        if fault.kind == "requeue":
            proc = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, env=self.env)
            return "requeued" if proc.returncode == 0 else f"refused: {proc.stderr.strip()}"
        if fault.kind == "sigkill":
            folder = lv.sweep / ".submitit"
            pids = wait_for(lambda: training_pids(folder, job), f"job {job}'s training process", 30)
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            return f"pid {','.join(map(str, pids))}"
        if fault.kind == "node_fail":
            with self.node_locks.setdefault(node, threading.Lock()):
                state, node_now = self.squeue(job)
                if state != "RUNNING" or node_now != node:
                    raise InjectionError(f"job {job} left {node} ({state} {node_now}) before its node failed")
                t_stop = self.now()
                self.cluster("stop-node", node)
                try:
                    wait_for(lambda: node_dead(self.node_state(node)), f"Slurm to mark {node} down", 180, 0.5)
                    t_down: object = self.now()
                    time.sleep(fault.down_s)
                except InjectionError:  # still failed: bring it back all the same
                    t_down = f"not within 180 s ({self.node_state(node)})"
                self.cluster("start-node", node)
                t_start = self.now()
                wait_for(lambda: node_back(self.node_state(node)), f"{node} to come back", 90, 0.5)
                return f"{node}: stop-node at {t_stop} s, marked down at {t_down} s, slurmd started at {t_start} s"
        raise ValueError(f"unknown fault kind {fault.kind!r}")

    # -- the whole pass ------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        self.base.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        for lv in self.live:
            self.launch(lv)
        threads: list[threading.Thread] = []
        for lv in self.live:
            self.find_sweep(lv)
            threads.append(threading.Thread(target=self.supervise, args=(lv,), daemon=True))
            for k, tp in enumerate(lv.plan.tasks):
                if tp.faults:
                    threads.append(threading.Thread(target=self.injector, args=(lv, k, tp), daemon=True))
        for th in threads:
            th.start()
        for th in threads:
            th.join(RUN_TIMEOUT_S + 300)
        wall = time.monotonic() - self.t0
        return self.summary(started, wall)

    # -- results -------------------------------------------------------------------------
    def summary(self, started: str, wall: float) -> dict[str, Any]:
        tasks = []
        for lv in self.live:
            state = lv.state()
            for k, tp in enumerate(lv.plan.tasks):
                tasks.append(self.task_result(lv, state, k, tp))
        injected = Counter(i.kind for i in self.injected)
        for lv in self.live:
            if lv.plan.sweep_fault in ("time_limit", "host_oom"):
                injected[lv.plan.sweep_fault] += len(lv.plan.tasks)
        planned = Counter(f.kind for sp in self.plan for tp in sp.tasks for f in tp.faults)
        for sp in self.plan:
            planned[sp.sweep_fault] += 1 if sp.sweep_fault == "launcher_kill" else len(sp.tasks)
        completed = [t for t in tasks if t["state"] == "COMPLETED"]
        sigkills = Counter(i.task for i in self.injected if i.kind == "sigkill")
        for t in tasks:  # steps SIGKILLed that no injected SIGKILL explains (issue 19, 11a)
            t["unexplained_kills"] = max(0, t["killed_steps"] - sigkills[t["task"]])
        return {
            "mode": self.mode,
            "started": started,
            "wall_s": round(wall, 1),
            "tasks": len(tasks),
            "completed": len(completed),
            "bit_identical": sum(t["digest_ok"] is True for t in completed),
            "wrong_results": sum(t["digest_ok"] is False for t in completed),
            "steps_redone": sum(t["steps_redone"] for t in tasks),
            "slurm_runs": sum(t["slurm_runs"] for t in tasks),
            "resubmissions": sum(max(0, len(t["jobs"]) - 1) for t in tasks),
            "unexplained_kills": sum(t["unexplained_kills"] for t in tasks),
            "injected": dict(injected),
            "planned": dict(planned),  # a fault is missed when its task ended (or failed) before its step
            "injections": [asdict(i) for i in self.injected],
            "missed": self.missed,
            "errors": self.errors,
            "sweeps": {lv.plan.name: {"dir": str(lv.sweep), "rc": lv.rc, **lv.notes} for lv in self.live},
            "per_task": tasks,
        }

    def task_result(self, lv: Live, state: dict[str, Any], k: int, tp: TaskPlan) -> dict[str, Any]:
        assert lv.sweep is not None
        task = next((t for t in state["tasks"] if t["index"] == k), None) or {"state": "MISSING", "attempts": []}
        try:
            lines = _steps((lv.sweep / str(k) / "metrics.jsonl").read_text())
        except OSError:
            lines = []
        result = task.get("result") or {}
        digest_ok = None if task["state"] != "COMPLETED" else result.get("digest") == chain(tp.steps)
        jobs = [str(a["job_id"]) for a in task["attempts"]]
        runs = 0
        for job in jobs:
            out = slurm(["sacct", "-X", "-n", "-P", "--duplicates", "-j", job, "-o", "State"], self.env, check=False)
            runs += len([x for x in out.splitlines() if x.strip()])
        diagnosis = task.get("diagnosis") or {}
        kills = 0  # steps that died of SIGKILL, by their job logs (injected or not)
        for job in jobs:
            for path in (lv.sweep / ".submitit").glob(f"{job}_0_log.err"):
                kills += path.read_text(errors="replace").count(": Killed")
        return {
            "task": tp.index,
            "sweep": tp.sweep,
            "sweep_index": k,
            "steps": tp.steps,
            "faults": [asdict(f) for f in tp.faults],
            "state": task["state"],
            "digest_ok": digest_ok,
            "step_lines": len(lines),
            "steps_redone": len(lines) - len(set(lines)),
            "jobs": jobs,
            "slurm_runs": runs,
            "nodes": [a.get("nodes", "") for a in task["attempts"]],
            "cause": diagnosis.get("cause", ""),
            "killed_steps": kills,
            "resumed_from": result.get("resumed_from"),
            "error": (task.get("error") or "")[:400],
        }


# ----------------------------------------------------------------------------- cluster
def cluster_conf() -> str:
    """Bring the test cluster up (or find it up); its SLURM_CONF."""
    proc = subprocess.run([sys.executable, str(CLUSTER_SCRIPT), "up"], capture_output=True, text=True, timeout=300)
    for line in proc.stdout.splitlines():
        if line.startswith("SLURM_CONF="):
            return line.split("=", 1)[1]
    sys.exit(f"the test cluster did not come up: {proc.stderr.strip()[-2000:]}")


def settle(env: dict[str, str]) -> None:
    """Between passes and at the end: every node up and idle, no job of ours left."""
    for node, st in node_states(env).items():
        if node_dead(st):
            subprocess.run([sys.executable, str(CLUSTER_SCRIPT), "start-node", node], env=env, capture_output=True)
    names = slurm(["squeue", "-h", "-o", "%i|%j"], env, check=False)
    stray = [line.split("|")[0] for line in names.splitlines() if "|campaign-preempt-" in line]
    if stray:
        slurm(["scancel", *stray], env, check=False)

    def idle() -> bool:
        nodes = node_states(env).values()
        return not slurm(["squeue", "-h"], env, check=False).strip() and all(n == "IDLE" for n in nodes)

    wait_for(idle, "the cluster to be idle", 180, 1)


# ----------------------------------------------------------------------------- the table
def _pct(n: int, d: int) -> str:
    return f"{n}/{d} ({100 * n / d:.0f} %)" if d else "–"


def _of(run: dict[str, Any], kind: str) -> str:
    return f"{run['injected'].get(kind, 0)} of {run['planned'].get(kind, 0)}"


ROWS: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (
    ("tasks", lambda r: str(r["tasks"])),
    *(
        (f"faults injected (of planned): {KIND_WORDS[k]}", lambda r, k=k: _of(r, k))
        for k in (*KINDS, "launcher_kill", "time_limit", "host_oom")
    ),
    ("success (COMPLETED)", lambda r: _pct(r["completed"], r["tasks"])),
    ("bit-identical, of the completed", lambda r: _pct(r["bit_identical"], r["completed"])),
    ("wrong results (completed, digest wrong)", lambda r: str(r["wrong_results"])),
    ("steps redone", lambda r: str(r["steps_redone"])),
    ("Slurm runs (all tasks: first runs, requeues, resubmissions)", lambda r: str(r["slurm_runs"])),
    ("resubmissions", lambda r: str(r["resubmissions"])),
    (
        "steps SIGKILLed with no SIGKILL injected (a stale Slurm kill after a node failure)",
        lambda r: str(r["unexplained_kills"]),
    ),
    ("wall time", lambda r: f"{r['wall_s']:.0f} s"),
)


def table(runs: list[dict[str, Any]]) -> str:
    head = "| measure | " + " | ".join(f"recovery {r['mode'].upper()}" for r in runs) + " |"
    rule = "|---|" + "---:|" * len(runs)
    return "\n".join([head, rule, *("| " + name + " | " + " | ".join(f(r) for r in runs) + " |" for name, f in ROWS)])


def failures(run: dict[str, Any]) -> list[str]:
    return [
        f"task {t['task']} ({t['sweep']} #{t['sweep_index']}, faults {[f['kind'] for f in t['faults']]}): "
        f"{t['state']} {t['cause'] or ''} {t['error'].splitlines()[0] if t['error'] else ''}".rstrip()
        for t in run["per_task"]
        if t["state"] != "COMPLETED" or t["digest_ok"] is False
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--tasks", type=int, default=20)
    ap.add_argument("--modes", nargs="+", choices=("on", "off"), default=["on", "off"])
    ap.add_argument("--json", type=Path, help="write the plan and both runs' figures as JSON")
    ap.add_argument("--keep", type=Path, help="run in this directory and keep it (default: a temporary one)")
    args = ap.parse_args(argv)
    plan = make_plan(args.seed, args.tasks)
    env = dict(os.environ, SLURM_CONF=cluster_conf())
    print(f"campaign seed {args.seed}: {args.tasks} tasks in {len(plan)} sweeps", flush=True)
    for sp in plan:
        kill = f" at task {sp.tasks[0].index}'s step {sp.kill_launcher_at_step}" if sp.kill_launcher_at_step else ""
        print(f"  sweep {sp.name}: {sp.sweep_fault or 'per-task faults'}{kill} {' '.join(sp.overrides)}", flush=True)
        for tp in sp.tasks:
            faults = ", ".join(f"{f.kind}@{f.at_step}" for f in tp.faults) or "-"
            print(f"    task {tp.index:2d} steps={tp.steps} {faults}", flush=True)
    runs = []
    with tempfile.TemporaryDirectory(prefix="fault-campaign-") as tmp:
        base = (args.keep or Path(tmp)).resolve()
        for mode in args.modes:
            settle(env)
            print(f"\n== recovery {mode.upper()} ==", flush=True)
            run = Pass(plan, mode, base / mode, env).run()
            runs.append(run)
            print(f"{mode}: {run['completed']}/{run['tasks']} completed in {run['wall_s']:.0f} s", flush=True)
            for line in failures(run):
                print(f"  {line}", flush=True)
            for err in run["errors"]:
                print(f"  injector: {err}", flush=True)
            if args.json:  # written after each pass: a long run leaves what it measured
                doc = {"seed": args.seed, "plan": [asdict(sp) for sp in plan], "runs": runs}
                args.json.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        settle(env)
    print()
    print(table(runs))
    on = next((r for r in runs if r["mode"] == "on"), None)
    bad = any(r["wrong_results"] for r in runs) or (on is not None and on["completed"] < on["tasks"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
