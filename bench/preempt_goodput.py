"""Preemption goodput: the synthetic workload preempted every ~20 s by a high-priority job,
slurmagent's runtime vs submitit's Checkpointable, side by side in one run on the test
cluster. See bench/README.md for the definitions and how to rerun.

    export SLURM_CONF=...   # tests/cluster/slurm-cluster up prints it
    python bench/preempt_goodput.py [--steps 600] [--step-time 0.1] [--every 50] [--interval 20]

Four jobs run at once, each on its own node of partition `low`:
  slurmagent  preempted    python -m slurmagent +experiment=synthetic (cpu-1)
  submitit    preempted    bench/goodput_workloads.py:SubmititSynthetic (cpu-2)
  slurmagent  reference    the same, never preempted (t4-1)
  submitit    reference    the same, never preempted (t4-2)
A preempted job is preempted each time it has been RUNNING for `--interval` seconds: an
exclusive 1-second job in partition `high` on its node (PreemptMode=REQUEUE). Both
workloads write each step's end time (wall clock) with their attempt number; sacct gives
every run instance's Start/End (1-second resolution).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))


@dataclass
class Instance:
    """One run of the job (sacct --duplicates row)."""

    start: float
    end: float
    state: str


@dataclass
class Run:
    tool: str
    role: str  # "preempted" | "reference"
    node: str
    job_id: str = ""
    preemptions_sent: list[float] = field(default_factory=list)  # when the high job was submitted
    running_since: float | None = None
    awaiting_stop: bool = False
    done: bool = False
    result: dict[str, Any] | None = None


def sh(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def expected_digest(steps: int) -> str:
    digest = hashlib.sha256(b"start").hexdigest()
    for step in range(steps):
        digest = hashlib.sha256(f"{digest}:{step}".encode()).hexdigest()
    return digest


def slurm_time(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()  # the cluster's local time, as time.time()


def instances(job_id: str) -> list[Instance]:
    out = sh(["sacct", "-X", "-n", "-P", "--duplicates", "-j", job_id, "-o", "Start,End,State"])
    rows = []
    for line in out.splitlines():
        start, end, state = line.split("|")
        if start in ("Unknown", "None") or end in ("Unknown", "None"):
            continue
        rows.append(Instance(slurm_time(start), slurm_time(end), state.split()[0]))
    return sorted(rows, key=lambda r: r.start)


def read_timeline(path: Path) -> list[tuple[int, int, float]]:
    """(attempt, step, end time) per step, in the order written."""
    rows = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if "t" in rec:
            rows.append((int(rec["attempt"]), int(rec["step"]), float(rec["t"])))
    return rows


def process_starts(folder: Path, job_id: str) -> list[float]:
    """When the job's Python process started, per run: submitit's "Starting with
    JobEnvironment" log line (both tools start their jobs through submitit)."""
    starts = []
    for log in folder.glob(f"**/{job_id.split('_')[0]}_0_log.out"):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("submitit INFO (") and "Starting with JobEnvironment" in line:
                stamp = line[len("submitit INFO (") :].split(")")[0]
                starts.append(datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return sorted(starts)


def analyse(
    inst: list[Instance], timeline: list[tuple[int, int, float]], step_s: float, starts: list[float]
) -> dict[str, Any]:
    """Per-preemption and total figures from the run instances and the step timeline."""
    attempts: dict[int, list[tuple[int, float]]] = {}
    for attempt, step, t in timeline:
        attempts.setdefault(attempt, []).append((step, t))
    ordered = sorted(attempts.values(), key=lambda rows: rows[0][1])

    def instance_of(t: float) -> Instance:
        return min(inst, key=lambda i: 0.0 if i.start - 1 <= t <= i.end + 1 else min(abs(t - i.start), abs(t - i.end)))

    per: list[dict[str, float]] = []
    done_before = -1
    for k, rows in enumerate(ordered):
        if k:
            prev, cur = ordered[k - 1], rows
            ended, started = instance_of(prev[-1][1]), instance_of(cur[0][1])
            proc = [t for t in starts if started.start - 1 <= t <= cur[0][1]]
            per.append(
                {
                    # of start_s: Slurm start -> Python process running; process -> first step (task setup, restore)
                    "launch_s": proc[0] - started.start if proc else float("nan"),
                    "setup_restore_s": cur[0][1] - step_s - proc[0] if proc else float("nan"),
                    "stop_s": ended.end - prev[-1][1],  # last step done -> instance ended (save + exit)
                    "start_s": cur[0][1] - step_s - started.start,  # instance started -> first step began
                    "queue_s": started.start - ended.end,  # requeued -> running again
                    "redone_steps": sum(1 for step, _ in cur if step <= done_before),
                    "resumed_at_step": cur[0][0],
                    "stopped_after_step": prev[-1][0],
                }
            )
        done_before = max(done_before, max(step for step, _ in rows))
    run_s = sum(i.end - i.start for i in inst)
    first_start = inst[0].start
    return {
        "instances": [asdict(i) for i in inst],
        "states": [i.state for i in inst],
        "preemptions": len(per),
        "per_preemption": per,
        "run_s": run_s,  # allocated time, queue wait excluded
        "queue_s": sum(p["queue_s"] for p in per),
        "wall_s": inst[-1].end - first_start,  # first start to last end, queue wait included
        "startup_s": ordered[0][0][1] - step_s - first_start if ordered else None,
        "steps_run": len(timeline),
    }


def launch_slurmagent(run: Run, work: Path, args: argparse.Namespace) -> subprocess.Popen[str]:
    sweep = work / f"sa-{run.role}"
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "slurmagent",
            "+experiment=synthetic",
            "-m",
            f"synthetic.steps={args.steps}",
            f"synthetic.step_time_s={args.step_time}",
            "+synthetic.timeline=true",
            f"checkpoint.every_steps={args.every}",
            "resources.partition=low",
            f"+resources.extra.nodelist={run.node}",
            "recovery.max_attempts=50",
            f"hydra.sweep.dir={sweep}",
            "hydra.launcher.poll_interval_s=1",
            "hydra.launcher.max_poll_interval_s=2",
        ],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def launch_submitit(run: Run, work: Path, args: argparse.Namespace) -> Any:
    import submitit
    from goodput_workloads import SubmititSynthetic

    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCH), os.environ.get("PYTHONPATH")]))
    folder = work / f"sit-{run.role}"
    folder.mkdir()
    ex = submitit.AutoExecutor(folder=folder / "submitit", cluster="slurm")
    ex.update_parameters(
        slurm_partition="low",
        timeout_min=30,
        mem_gb=1,
        cpus_per_task=1,
        slurm_additional_parameters={"nodelist": run.node},
    )
    return ex.submit(SubmititSynthetic(), args.steps, args.step_time, args.every, str(folder))


def preempt(node: str) -> None:
    sh(["sbatch", "-p", "high", "-w", node, "--exclusive", "--time=1", "-o", "/dev/null", "--wrap", "sleep 1"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--step-time", type=float, default=0.1)
    ap.add_argument("--every", type=int, default=50, help="periodic checkpoint every N steps (both tools)")
    ap.add_argument("--interval", type=float, default=20.0, help="preempt after this long RUNNING")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--out", type=Path, default=BENCH / "results" / "preempt_goodput.json")
    args = ap.parse_args()
    if not os.environ.get("SLURM_CONF"):
        sys.exit("set SLURM_CONF to the test cluster's slurm.conf (tests/cluster/slurm-cluster up prints it)")

    work = Path(tempfile.mkdtemp(prefix="preempt_goodput.", dir="/var/tmp"))
    runs = {
        ("slurmagent", "preempted"): Run("slurmagent", "preempted", "cpu-1"),
        ("submitit", "preempted"): Run("submitit", "preempted", "cpu-2"),
        ("slurmagent", "reference"): Run("slurmagent", "reference", "t4-1"),
        ("submitit", "reference"): Run("submitit", "reference", "t4-2"),
    }
    procs: dict[tuple[str, str], subprocess.Popen[str]] = {}
    jobs: dict[tuple[str, str], Any] = {}
    t0 = time.time()
    for key, run in runs.items():
        if run.tool == "slurmagent":
            procs[key] = launch_slurmagent(run, work, args)
        else:
            jobs[key] = launch_submitit(run, work, args)
            run.job_id = str(jobs[key].job_id)
    print(f"work dir {work}", flush=True)
    deadline = time.monotonic() + args.timeout
    while not all(r.done for r in runs.values()) and time.monotonic() < deadline:
        for run in runs.values():
            if run.tool == "slurmagent" and not run.job_id:
                sweep_json = work / f"sa-{run.role}" / "sweep.json"
                if sweep_json.exists():
                    attempts = json.loads(sweep_json.read_text())["tasks"][0]["attempts"]
                    run.job_id = attempts[0]["job_id"] if attempts else ""
        ids = [r.job_id for r in runs.values() if r.job_id and not r.done]
        states: dict[str, str] = {}
        if ids:
            for line in sh(["squeue", "-h", "-j", ",".join(ids), "-o", "%i|%T"]).splitlines():
                jid, _, state = line.partition("|")
                states[jid] = state
        for key, run in runs.items():
            if run.tool == "slurmagent":
                run.done = procs[key].poll() is not None
            else:  # submitit's own done() is True at a preemption: ended = result written and out of the queue
                run.done = jobs[key].paths.result_pickle.exists() and run.job_id not in states
        now = time.time()
        for run in runs.values():
            if run.role != "preempted" or run.done or not run.job_id:
                continue
            state = states.get(run.job_id, "")
            if state != "RUNNING":
                run.running_since, run.awaiting_stop = None, False
            elif not run.awaiting_stop:
                run.running_since = run.running_since or now
                if now - run.running_since >= args.interval:
                    preempt(run.node)
                    run.preemptions_sent.append(now)
                    run.awaiting_stop = True
                    print(f"{now - t0:6.1f}s preempted {run.tool} ({run.job_id}) on {run.node}", flush=True)
        time.sleep(0.5)
    for key, proc in procs.items():
        try:
            _, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if proc.returncode != 0:
            print(f"{key}: launcher exited {proc.returncode}: {err[-2000:]}", flush=True)
        sweep_json = work / f"sa-{key[1]}" / "sweep.json"
        runs[key].result = json.loads(sweep_json.read_text())["tasks"][0].get("result")
    for key, job in jobs.items():
        runs[key].result = job.result() if job.done() else None

    time.sleep(3)  # accounting catches up with the last job end
    want = expected_digest(args.steps)
    report: dict[str, Any] = {}
    for run in runs.values():
        timeline_file = (
            work / f"sa-{run.role}" / "0" / "metrics.jsonl"
            if run.tool == "slurmagent"
            else work / f"sit-{run.role}" / "timeline.jsonl"
        )
        a = analyse(
            instances(run.job_id), read_timeline(timeline_file), args.step_time, process_starts(work, run.job_id)
        )
        a["digest_matches_uninterrupted"] = bool(run.result and run.result.get("digest") == want)
        a["preemptions_sent"] = len(run.preemptions_sent)
        a["node"], a["job_id"] = run.node, run.job_id
        report[f"{run.tool} {run.role}"] = a
    summary = {}
    for tool in ("slurmagent", "submitit"):
        pre, ref = report[f"{tool} preempted"], report[f"{tool} reference"]
        per = pre["per_preemption"]
        n = max(pre["preemptions"], 1)
        mean = statistics.fmean
        summary[tool] = {
            "preemptions": pre["preemptions"],
            "steps_redone_per_preemption": mean([p["redone_steps"] for p in per]) if per else None,
            "uninterrupted_run_s": ref["run_s"],
            "total_wall_s": pre["wall_s"],
            "total_wall_over_uninterrupted": pre["wall_s"] / ref["run_s"],
            "run_s_excluding_queue": pre["run_s"],
            "queue_wait_s": pre["queue_s"],
            "goodput_excluding_queue": ref["run_s"] / pre["run_s"],
            "step_goodput_excluding_queue": args.steps * args.step_time / pre["run_s"],
            "stop_s_per_preemption": mean([p["stop_s"] for p in per]) if per else None,
            "start_s_per_preemption": mean([p["start_s"] for p in per]) if per else None,
            "launch_s_per_preemption": mean([p["launch_s"] for p in per]) if per else None,
            "setup_restore_s_per_preemption": mean([p["setup_restore_s"] for p in per]) if per else None,
            "overhead_s_per_preemption": mean([p["stop_s"] + p["start_s"] for p in per]) if per else None,
            "lost_s_per_preemption": (pre["run_s"] - ref["run_s"]) / n,
            "startup_s_first_attempt": pre["startup_s"],
            "result_correct": pre["digest_matches_uninterrupted"] and ref["digest_matches_uninterrupted"],
        }
    result = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t0)),
        "args": {k: str(v) for k, v in vars(args).items()},
        "load_average": os.getloadavg(),
        "summary": summary,
        "runs": report,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(summary, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
