"""Resource scheduling on the test cluster: job traces replayed three times each, (a) as the
users requested them, (b) with slurmagent's placement and right-sizing (`resources.gpu_type=
auto time=auto mem=auto`, schedule/plan.py) after a history warm-up from pass (a), and (o) an
oracle: the same planner given each job's true needs (its exact run time, memory, GPU memory
and checkpoint time, no inflation). The share of the oracle's gain that `auto` reaches is
(b − a) / (o − a). See bench/README.md for the definitions and how to rerun.

    export SLURM_CONF=...   # tests/cluster/slurm-cluster up prints it
    python bench/schedule_trace.py [--traces burst,spread] [--seed 3] [--scale 1.0]

Two traces of the same ten kinds of work: `burst` (every job within half a minute) and
`spread` (arrivals over several minutes along a working-day curve: a morning rise, a lunch
dip, an afternoon peak). The cluster has 6 GPUs (tests/cluster): a100-1 with 2 a100, t4-1 and
t4-2 with 2 t4 each (fake GRES: Slurm allocates and accounts them; the workload holds them by
running). A job holds its GPUs and its memory for its true run time there: `work`
A100-seconds over the type's throughput (the bench's catalogue: t4 = 0.5 of an a100; the
packaged catalogue says 0.15), minutes for every kind. Checkpointed kinds act as slurmagent's
runtime does: `--signal=B:USR2@60`, on the signal they save (a few seconds), finish when the
rest fits before the limit (`recovery.finish_before_limit`, since commit 3291344), else requeue
themselves and resume where they stopped; `auto` gives them `--time-min`. A job that needs
more GPU memory than the GPU it landed on has fails with a GPU OOM and is resubmitted on the
a100 (the emulated GPU's memory: the catalogue's).

Users' requests, as production logs show them: run-time estimates several times the actual
run time (Mu'alem & Feitelson, IEEE TPDS 12(6), 2001; Tsafrir, Etsion & Feitelson, IEEE TPDS
18(6), 2007 — here 1.5-12x), a habitual 1-hour limit for a third of the jobs, 15 % under-
estimates (0.6-0.95x: a plain job then times out and reruns with twice the time, a
checkpointed one requeues and resumes); the a100 for every job that needs its memory and for
half of the others (an assumption); memory 1.5-4x what the job holds (an assumption).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))

from slurmagent.config import ResourcesConf, default_site, job_spec, site_conf  # noqa: E402
from slurmagent.schedule.history import HistoryRow, HistoryStore, row_from_usage  # noqa: E402
from slurmagent.schedule.plan import plan_spec  # noqa: E402
from slurmagent.slurm.cluster import ClusterInfo  # noqa: E402
from slurmagent.slurm.sbatch import sbatch_flags  # noqa: E402
from slurmagent.slurm.seam import SlurmCLI, parse_usage  # noqa: E402
from slurmagent.syntax import format_mb, mem_to_mb, slurm_time_to_seconds  # noqa: E402

THROUGHPUT = {"a100": 1.0, "t4": 0.5}
GPU_MEMORY = {"a100": 80, "t4": 16}
GPUS = {"a100": 2, "t4": 4}  # on the test cluster
SIGNAL_DELAY_S = 60  # slurmagent's default recovery.signal_delay_s
SAVE_S = 3.0  # what a checkpoint save takes in the workload
OOM_EXIT = 3  # the workload's exit code for an (emulated) GPU OOM
MAX_TIME_LIMIT_REQUEUES = 3  # slurmagent's default recovery.max_time_limit_requeues
STARTUP_S = 3.0  # the workload's start (the interpreter, its memory touched), seconds on an a100
WORKLOAD = """import json, os, signal, subprocess, sys, time
work, rss, need, ckpt = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
state, save_s = sys.argv[5], float(sys.argv[6])
kind = os.environ["SLURMD_NODENAME"].split("-")[0]
speed, memory = {"a100": (1.0, 80), "t4": (0.5, 16)}[kind]
if need > memory - 1:  # the emulated GPU: the catalogue's memory
    print(f"torch.OutOfMemoryError: CUDA out of memory (emulated GPU: {need} GiB, {memory} here)", file=sys.stderr)
    sys.exit(3)
hold = bytearray(rss * 2**20)
hold[:: 4096] = b"x" * len(range(0, len(hold), 4096))  # resident, not just reserved
stop = []
signal.signal(signal.SIGUSR2, (lambda *_: stop.append(1)) if ckpt else signal.SIG_IGN)
def save(done, cost=0.0):
    time.sleep(cost)
    with open(state + ".tmp", "w") as f:
        json.dump({"done": done}, f)
    os.replace(state + ".tmp", state)
done = json.load(open(state))["done"] if ckpt and os.path.exists(state) else 0.0
last = time.monotonic()
while done < work:
    time.sleep(min(0.5, (work - done) / speed))
    done += 0.5 * speed if work - done > 0.5 * speed else work - done
    if stop:  # the time limit's warning: save (a few seconds), requeue, resume later where it stopped
        save(done, save_s)
        # … unless the rest ends before the limit: it finishes (recovery.finish_before_limit)
        from slurmagent.job.stop import finishes_before_limit
        from slurmagent.syntax import parse_time_limit
        left = subprocess.run(["squeue", "-h", "-j", os.environ["SLURM_JOB_ID"], "-o", "%L"],
                              capture_output=True, text=True).stdout.strip()
        try:
            fits = finishes_before_limit((work - done) / speed + save_s, parse_time_limit(left))
        except Exception:  # no answer: requeue, as the runtime does
            fits = False
        if fits:
            stop.clear()
            continue
        subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]])
        time.sleep(60)
        sys.exit(0)
    if ckpt and time.monotonic() - last > 30:  # periodic saves: in the background, as the runtime's
        save(done)
        last = time.monotonic()
"""


@dataclass(frozen=True)
class Kind:
    name: str
    work_s: float  # A100-seconds
    gpus: int
    need_gib: float  # GPU memory: > 15 only fits an a100
    rss_mb: int  # host memory it holds
    checkpointed: bool
    long: bool  # counted in "long jobs"


KINDS = [
    Kind("script", 60, 1, 4, 300, False, False),
    Kind("script-mem", 75, 1, 6, 700, False, False),
    Kind("eval", 45, 1, 10, 400, False, False),
    Kind("ft", 90, 1, 10, 500, True, False),
    Kind("ft-big", 100, 1, 24, 600, True, False),
    Kind("ddp", 90, 2, 8, 600, True, False),
    Kind("long", 210, 1, 8, 400, True, True),
    Kind("long-plain", 165, 1, 6, 350, False, True),
    Kind("long-mem", 180, 1, 30, 600, True, True),
    Kind("long-ddp", 180, 2, 12, 700, True, True),
]
WEIGHTS = [3, 2, 2, 3, 2, 2, 2, 2, 1, 1]


@dataclass
class Job:
    index: int
    cls: str  # the work's kind: its fingerprint in the history
    arrive_s: float
    work_s: float  # A100-seconds
    gpus: int
    rss_mb: int
    need_gib: float  # GPU memory it needs: > 15 only fits an a100
    checkpointed: bool
    long: bool
    ask_type: str  # what the user asks for in (a)
    ask_time_s: int  # the user's --time
    ask_mem_mb: int  # the user's --mem


@dataclass
class Outcome:
    job: Job
    job_ids: list[str]
    submit: float
    start: float
    end: float
    gpu_type: str
    gpus: int
    elapsed_s: float  # of every run (a timed-out or requeued one too)
    limit_s: float  # the first submission's --time
    reference_s: float | None  # (b): the history's prediction in A100-seconds, before inflation
    timeouts: int  # resubmissions after TIMEOUT
    requeues: int  # runs that ended requeued (the checkpointed jobs' time-limit warnings)
    ooms: int  # resubmissions after a host or GPU OOM
    asked: dict[str, Any]


def make_trace(n: int, seed: int, scale: float, shape: str) -> list[Job]:
    """`n` jobs of the ten kinds; `burst`: all within 30 s; `spread`: over `span` seconds
    along a working-day curve (a morning rise, a lunch dip, an afternoon peak)."""
    rng = random.Random(f"{seed}-{shape}")
    span = 30.0 if shape == "burst" else 420.0 * scale
    jobs = []
    for i in range(n):
        kind = rng.choices(KINDS, WEIGHTS)[0]
        if shape == "burst":
            arrive = rng.uniform(0, span)
        else:  # rejection-sample the day curve: 0.35 + a morning bump + a larger afternoon bump
            while True:
                x = rng.random()
                density = 0.35 + 0.8 * math.exp(-(((x - 0.25) / 0.12) ** 2)) + math.exp(-(((x - 0.7) / 0.15) ** 2))
                if rng.random() * 2.2 < density:
                    break
            arrive = x * span
        work = kind.work_s * scale * rng.uniform(0.85, 1.15)
        typed = "a100" if kind.need_gib > 15 or rng.random() < 0.5 else "t4"
        true_s = work / THROUGHPUT[typed]
        r = rng.random()
        if r < 1 / 3:
            ask_s = 3600  # the habitual hour
        elif r < 1 / 3 + 0.15:
            ask_s = max(60, math.ceil(true_s * rng.uniform(0.6, 0.95) / 60) * 60)  # an under-estimate
        else:
            ask_s = max(60, math.ceil(true_s * rng.uniform(1.5, 12) / 60) * 60)
        mem = max(1024, math.ceil(kind.rss_mb * rng.uniform(1.5, 4) / 256) * 256)
        jobs.append(
            Job(i, kind.name, arrive, work, kind.gpus, kind.rss_mb, kind.need_gib, kind.checkpointed, kind.long,
                typed, ask_s, mem)
        )  # fmt: skip
    jobs.sort(key=lambda j: j.arrive_s)
    for i, j in enumerate(jobs):
        j.index = i
    return jobs


def requested(job: Job) -> ResourcesConf:
    return ResourcesConf(
        partition="gpu",
        gpus=job.gpus,
        gpu_type=job.ask_type,
        mem=format_mb(job.ask_mem_mb),
        time=str(job.ask_time_s // 60),
    )


def sbatch(job: Job, res: ResourcesConf, script: Path, tag: str, state_dir: Path) -> str:
    argv = ["sbatch", "--parsable", f"--job-name=sched-{tag}-{job.index}", f"--comment={job.cls}"]
    argv += [f"--{k}={v}" for k, v in sbatch_flags(res).items()]
    if job.checkpointed:  # as slurmagent submits a job: the warning before the limit, requeue-able
        argv += [f"--signal=B:USR2@{SIGNAL_DELAY_S}", "--requeue"]
    state = state_dir / f"{tag}-{job.index}.json"
    args = f"{job.work_s:.2f} {job.rss_mb} {job.need_gib} {int(job.checkpointed)} {state} {SAVE_S}"
    argv += ["--output=/dev/null", f"--wrap=exec {sys.executable} {script} {args}"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    return out.stdout.strip().split(";")[0]


def squeue_count(tag: str) -> int:
    out = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True).stdout
    return sum(1 for name in out.split() if name.startswith(f"sched-{tag}-"))


FIELDS = "JobID,Submit,Start,End,Elapsed,Timelimit,NodeList,AllocTRES,State,ExitCode"


def sacct_runs(job_ids: list[str]) -> dict[str, list[dict[str, str]]]:
    """Every run of each job (a requeued job has several), oldest first."""
    if not job_ids:
        return {}
    out = subprocess.run(
        ["sacct", "-n", "-P", "-X", "--duplicates", "-j", ",".join(job_ids), "-o", FIELDS],
        capture_output=True,
        text=True,
    ).stdout
    rows: dict[str, list[dict[str, str]]] = {}
    for line in out.splitlines():
        f = line.split("|")
        rows.setdefault(f[0], []).append(dict(zip(FIELDS.split(","), f, strict=False)))
    return rows


def stamp(text: str) -> float | None:
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def replay(
    jobs: list[Job], tag: str, plan: Callable[[Job], tuple[ResourcesConf, float | None]], script: Path, work: Path
) -> list[Outcome]:
    """Submit each job at its arrival time (resources from `plan(job)`) and resubmit as
    slurmagent's recovery would: a TIMEOUT with twice the time, a host OOM with 1.5x the memory,
    a GPU OOM on the a100; wait for all; the outcomes from sacct."""
    t0 = time.time()
    submitted: dict[int, list[str]] = {}
    resources: dict[int, ResourcesConf] = {}
    predicted: dict[int, float | None] = {}
    counts: dict[int, dict[str, int]] = {}
    first_asked: dict[int, dict[str, Any]] = {}
    pending = sorted(jobs, key=lambda j: j.arrive_s)
    by_index = {j.index: j for j in jobs}
    while True:
        now = time.time() - t0
        while pending and pending[0].arrive_s <= now:
            job = pending.pop(0)
            res, predicted[job.index] = plan(job)
            resources[job.index] = res
            first_asked[job.index] = {**sbatch_flags(res)}
            counts[job.index] = {"timeouts": 0, "ooms": 0}
            submitted[job.index] = [sbatch(job, res, script, tag, work)]
        queued = squeue_count(tag)
        ended = sacct_runs([ids[-1] for ids in submitted.values()])
        settled = True
        for index, ids in submitted.items():
            runs = ended.get(ids[-1]) or []
            state = runs[-1]["State"] if runs else ""
            res, job = resources[index], by_index[index]
            requeued = sum(r["State"].startswith("REQUEUED") for r in runs)
            if state.startswith("TIMEOUT") or (requeued >= MAX_TIME_LIMIT_REQUEUES and state.startswith("PENDING")):
                # a plain job at its limit; a checkpointed one after 3 requeues at the warning
                # (recovery.max_time_limit_requeues): resubmitted with twice the time, as recovery does
                subprocess.run(["scancel", ids[-1]], capture_output=True)
                new = dataclasses.replace(res, time=str(2 * slurm_time_to_seconds(res.time) // 60), time_min=None)
                counts[index]["timeouts"] += 1
            elif state.startswith("OUT_OF_MEMORY"):
                new = dataclasses.replace(res, mem=format_mb(int(mem_to_mb(str(res.mem)) * 1.5)))
                counts[index]["ooms"] += 1
            elif state.startswith("FAILED") and runs[-1]["ExitCode"].startswith(f"{OOM_EXIT}:"):
                new = dataclasses.replace(res, gpu_type="a100")
                counts[index]["ooms"] += 1
            else:
                settled = settled and state.startswith(("COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL"))
                continue
            settled = False
            resources[index] = new
            ids.append(sbatch(job, new, script, tag, work))
        if not pending and not queued and settled:
            break
        time.sleep(1.0)
    time.sleep(2)
    rows = sacct_runs([i for ids in submitted.values() for i in ids])
    out = []
    for job in jobs:
        ids = submitted[job.index]
        runs = [r for i in ids for r in rows.get(i, [])]
        starts = [s for r in runs if (s := stamp(r["Start"])) is not None]
        ends = [e for r in runs if (e := stamp(r["End"])) is not None]
        last = runs[-1]
        out.append(
            Outcome(
                job,
                ids,
                submit=stamp(rows[ids[0]][0]["Submit"]) or t0,
                start=min(starts),
                end=max(ends),
                gpu_type="a100" if last["NodeList"].startswith("a100") else "t4",
                gpus=job.gpus,
                elapsed_s=sum(slurm_time_to_seconds(r["Elapsed"]) for r in runs),
                limit_s=slurm_time_to_seconds(rows[ids[0]][0]["Timelimit"]),
                reference_s=predicted[job.index],
                timeouts=counts[job.index]["timeouts"],
                requeues=sum(r["State"].startswith("REQUEUED") for r in runs),
                ooms=counts[job.index]["ooms"],
                asked=first_asked[job.index],
            )
        )
    return out


def ingest(outcomes: list[Outcome], store: HistoryStore) -> int:
    """Pass (a)'s jobs into the history, from sacct, as the supervisor does for sweeps."""
    fields = "JobID,JobName,Partition,Elapsed,Timelimit,MaxRSS,ReqMem,TotalCPU,State,NodeList,AllocTRES,End,Comment"
    rows = []
    for o in outcomes:
        text = subprocess.run(
            ["sacct", "-n", "-P", "--duplicates", "-j", ",".join(o.job_ids), "-o", fields],
            capture_output=True,
            text=True,
        ).stdout
        row = row_from_usage(
            o.job.cls, f"bench-a#{o.job.index}", "bench", o.gpu_type, parse_usage(text), checkpoint_s=SAVE_S
        )
        if row is not None:
            rows.append(row)
    return store.add(rows)


def truth(jobs: list[Job], store: HistoryStore) -> int:
    """The oracle's history: each job's own row, exactly what it is (its run time on an a100
    with the interpreter's start, the memory it holds with the interpreter's, its GPU memory,
    its save time)."""
    rows = [
        HistoryRow(
            f"oracle-{j.index}", f"oracle#{j.index}", "bench", "gpu", "a100", j.gpus, j.work_s + STARTUP_S, 0, 0, 0,
            0, "COMPLETED", "", 1, host_mem_peak_mb=j.rss_mb + 64, gpu_mem_peak_mb=j.need_gib * 1024,
            checkpoint_s=SAVE_S, ended_at=time.time(),
        )
        for j in jobs
    ]  # fmt: skip
    return store.add(rows)


def metrics(outcomes: list[Outcome]) -> dict[str, Any]:
    site = bench_site()
    first = min(o.submit for o in outcomes)
    makespan = max(o.end for o in outcomes) - first
    held = sum(o.elapsed_s * o.gpus for o in outcomes)
    useful = sum(o.job.work_s / THROUGHPUT[o.gpu_type] * o.gpus for o in outcomes)
    total_gpus = sum(GPUS.values())
    long_waits = sorted(o.start - o.submit for o in outcomes if o.job.long)
    cost = sum(o.elapsed_s * o.gpus / 3600 * site.gpus[o.gpu_type].price_per_hour for o in outcomes)
    errors = [
        abs(o.reference_s / THROUGHPUT[o.gpu_type] - o.elapsed_s) / o.elapsed_s
        for o in outcomes
        if o.reference_s is not None and o.elapsed_s and not (o.timeouts or o.requeues or o.ooms)
    ]
    asked = [
        (o.limit_s - o.elapsed_s) / o.elapsed_s for o in outcomes if o.elapsed_s and not (o.timeouts or o.requeues)
    ]
    return {
        "jobs": len(outcomes),
        "makespan_s": makespan,
        "gpu_allocation_utilisation": held / (total_gpus * makespan),
        "work_utilisation": useful / (total_gpus * makespan),
        "long_jobs": len(long_waits),
        "long_wait_mean_s": statistics.fmean(long_waits),
        "wait_mean_s": statistics.fmean(o.start - o.submit for o in outcomes),
        "turnaround_mean_s": statistics.fmean(o.end - o.submit for o in outcomes),
        "cost": cost,
        "on_t4": sum(o.gpu_type == "t4" for o in outcomes),
        "prediction_median_rel_error": statistics.median(errors) if errors else None,
        "limit_median_over": statistics.median(asked) if asked else None,
        "timeouts": sum(o.timeouts for o in outcomes),
        "requeues": sum(o.requeues for o in outcomes),
        "ooms": sum(o.ooms for o in outcomes),
        "time_min_jobs": sum("time-min" in o.asked for o in outcomes),
        "untyped_requests": sum(o.asked.get("gres", "").count(":") == 1 for o in outcomes),
    }


def share(a: float, b: float, o: float) -> float | None:
    """The share of the oracle's gain over (a) that (b) reaches: (b − a) / (o − a)."""
    return (b - a) / (o - a) if o != a else None


def bench_site(inflation: float | None = None) -> Any:
    raw = dataclasses.asdict(default_site())
    raw["gpus"]["t4"]["throughput"] = THROUGHPUT["t4"]
    if inflation is not None:
        raw["scheduling"]["inflation"] = inflation
    return site_conf(raw)


def planner(
    store: HistoryStore, site: Any, cluster: ClusterInfo, slurm: SlurmCLI, oracle: bool, asked: dict[int, Any]
) -> Callable[[Job], tuple[ResourcesConf, float | None]]:
    def placed(job: Job) -> tuple[ResourcesConf, float | None]:
        ask = requested(job)
        spec = job_spec(
            {
                "resources": {**dataclasses.asdict(ask), "gpu_type": "auto", "time": "auto", "mem": "auto"},
                "checkpoint": {"every_steps": 100 if job.checkpointed else 0},  # checkpointed: --time-min
                "recovery": {"signal_delay_s": SIGNAL_DELAY_S},
                "task": {"target": "bench:workload"},
            }
        )
        p = plan_spec(
            spec,
            f"oracle-{job.index}" if oracle else job.cls,  # the work's fingerprint: its kind (the oracle: itself)
            site=site,
            history=store,
            cluster=cluster,
            slurm=slurm,
            need_gib=None if oracle else job.need_gib,  # (b): the config validator's estimate stands in
        )
        asked[job.index] = dataclasses.asdict(p.resources)
        return p.resources, p.prediction.reference_s

    return placed


def run_trace(shape: str, jobs: list[Job], passes: str, out: dict[str, Any]) -> None:
    work = Path(tempfile.mkdtemp(prefix=f"sched-bench-{shape}-"))
    script = work / "workload.py"
    script.write_text(WORKLOAD)
    slurm = SlurmCLI()
    span = jobs[-1].arrive_s - jobs[0].arrive_s
    print(f"[{shape}] {len(jobs)} jobs ({sum(j.long for j in jobs)} long), arrivals over {span:.0f}s", flush=True)
    result: dict[str, Any] = {"jobs": [dataclasses.asdict(j) for j in jobs], "started": time.time()}
    a = replay(jobs, f"{shape}-a", lambda job: (requested(job), None), script, work)
    result["a"] = metrics(a)
    store = HistoryStore(work / "history.sqlite")
    print(f"[{shape}] (a) done: {result['a']}; {ingest(a, store)} rows into the history", flush=True)
    cluster = ClusterInfo.query(slurm)
    outcomes = {"a": a}
    for name in passes:
        asked: dict[int, Any] = {}
        if name == "b":
            plan = planner(store, bench_site(), cluster, slurm, False, asked)
        else:
            oracle = HistoryStore(work / "truth.sqlite")
            truth(jobs, oracle)
            plan = planner(oracle, bench_site(inflation=1.0), cluster, slurm, True, asked)
        outcomes[name] = replay(jobs, f"{shape}-{name}", plan, script, work)
        result[name] = metrics(outcomes[name])
        result[f"asked_{name}"] = {str(i): r for i, r in asked.items()}
        print(f"[{shape}] ({name}) done: {result[name]}", flush=True)
    result["outcomes"] = {k: [dataclasses.asdict(o) for o in v] for k, v in outcomes.items()}
    result["finished"] = time.time()
    if "b" in result and "o" in result:
        result["share_of_oracle_gain"] = {
            "gpu_allocation_utilisation": share(*(result[p]["gpu_allocation_utilisation"] for p in "abo")),
            "long_wait_mean_s": share(*(result[p]["long_wait_mean_s"] for p in "abo")),
        }
    out[shape] = result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", default="burst,spread", help="which traces: burst, spread or both")
    ap.add_argument("--jobs", default="14,16", help="jobs per trace, in --traces order")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every job's work (and the spread's span)")
    ap.add_argument("--passes", default="bo", help="after (a): b = auto, o = the oracle")
    ap.add_argument("--out", type=Path, default=BENCH / "results" / "schedule_trace.json")
    args = ap.parse_args()
    shapes = args.traces.split(",")
    counts = [int(n) for n in args.jobs.split(",")]
    out: dict[str, Any] = {"seed": args.seed, "scale": args.scale}
    for shape, n in zip(shapes, counts, strict=True):
        run_trace(shape, make_trace(n, args.seed, args.scale, shape), args.passes, out)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1))
    for shape in shapes:
        r = out[shape]
        print(f"\n[{shape}] {'measure':30} {'(a) requested':>14} {'(b) auto':>10} {'(o) oracle':>11}")
        for key in r["a"]:
            vals = [r[p][key] for p in "abo" if p in r]
            shown = [f"{v:.3f}" if isinstance(v, float) else str(v) for v in vals]
            print(f"[{shape}] {key:30} " + " ".join(f"{s:>12}" for s in shown))
        print(f"[{shape}] share of the oracle's gain: {r.get('share_of_oracle_gain')}")
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("SLURM_CONF", "/var/tmp/slurmagent-cluster/etc/slurm.conf")
    sys.exit(main())
