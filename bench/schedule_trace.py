"""Resource scheduling on the test cluster: one job trace replayed twice, (a) as the users
requested it and (b) with slurmagent's placement and right-sizing (schedule/plan.py) after a
history warm-up from pass (a). See bench/README.md for the definitions and how to rerun.

    export SLURM_CONF=...   # tests/cluster/slurm-cluster up prints it
    python bench/schedule_trace.py [--jobs 64] [--seed 1] [--scale 1.0]

The cluster has 6 GPUs (tests/cluster): a100-1 with 2 a100, t4-1 and t4-2 with 2 t4 each
(fake GRES: Slurm allocates and accounts them; the workload holds them by running). Each
job is a synthetic workload that holds its GPUs and its memory for its true run time there:
`work` A100-seconds over the type's throughput (the bench's site catalogue: t4 = 0.5 of an
a100, so that the trace fits in 15 minutes; the packaged catalogue says 0.15).

Users' requests, as production logs show them: run-time estimates several times the actual
run time (Mu'alem & Feitelson, IEEE TPDS 12(6), 2001; Tsafrir, Etsion & Feitelson, IEEE TPDS
18(6), 2007 — we draw the factor from 2-8x, rounded up to whole minutes as Slurm takes them);
the largest GPU type for most jobs (an assumption: 75 % ask a100, 25 % t4); memory "to be
safe" (an assumption: 1800M where 250-450 MB are used).
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
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))

from slurmagent.config import ResourcesConf, default_site, job_spec, site_conf  # noqa: E402
from slurmagent.schedule.history import HistoryStore, row_from_usage  # noqa: E402
from slurmagent.schedule.plan import plan_spec  # noqa: E402
from slurmagent.slurm.cluster import ClusterInfo  # noqa: E402
from slurmagent.slurm.sbatch import sbatch_flags  # noqa: E402
from slurmagent.slurm.seam import SlurmCLI, parse_usage  # noqa: E402
from slurmagent.slurm.syntax import slurm_time_to_seconds  # noqa: E402

THROUGHPUT = {"a100": 1.0, "t4": 0.5}
GPUS = {"a100": 2, "t4": 4}  # on the test cluster
WORKLOAD = """import os, sys, time
work, rss = float(sys.argv[1]), int(sys.argv[2])
speed = {"a100": 1.0, "t4": 0.5}[os.environ["SLURMD_NODENAME"].split("-")[0]]
hold = bytearray(rss * 2**20)
time.sleep(work / speed)
"""


@dataclass
class Job:
    index: int
    cls: str  # the work's kind: its fingerprint in the history
    arrive_s: float
    work_s: float  # A100-seconds
    gpus: int
    rss_mb: int
    need_gib: float  # GPU memory it needs: > 15 only fits an a100
    ask_type: str  # what the user asks for in (a)
    ask_factor: float  # the user's over-estimate of the run time


@dataclass
class Outcome:
    job: Job
    job_ids: list[str]
    submit: float
    start: float
    end: float
    gpu_type: str
    gpus: int
    elapsed_s: float  # of every run (a timed-out one too)
    limit_s: float
    reference_s: float | None  # (b): the history's prediction in A100-seconds, before inflation
    timeouts: int


def make_trace(n: int, seed: int, scale: float) -> list[Job]:
    rng = random.Random(seed)
    classes = [  # (A100-seconds, GPUs, GPU memory GiB)
        ("tiny", 12, 1, 4),
        ("small", 20, 1, 6),
        ("small2", 25, 2, 6),
        ("mid", 35, 1, 10),
        ("big-mem", 30, 1, 30),
        ("long", 70, 1, 8),
        ("long2", 80, 2, 12),
        ("long-mem", 90, 1, 24),
    ]
    weights = [10, 10, 5, 8, 4, 6, 3, 3]
    jobs = []
    t = 0.0
    for i in range(n):
        name, work, gpus, need = rng.choices(classes, weights)[0]
        t += rng.expovariate(1 / (90 * scale / n))
        jobs.append(
            Job(
                index=i,
                cls=name,
                arrive_s=t,
                work_s=work * scale * rng.uniform(0.9, 1.1),
                gpus=gpus,
                rss_mb=rng.randint(250, 450),
                need_gib=need,
                ask_type="a100" if need > 15 or rng.random() < 0.75 else "t4",
                ask_factor=rng.uniform(2, 8),
            )
        )
    return jobs


def requested(job: Job) -> ResourcesConf:
    true_s = job.work_s / THROUGHPUT[job.ask_type]
    minutes = max(1, math.ceil(true_s * job.ask_factor / 60))
    return ResourcesConf(partition="gpu", gpus=job.gpus, gpu_type=job.ask_type, mem="1800M", time=f"{minutes}")


def sbatch(job: Job, res: ResourcesConf, script: Path, tag: str) -> str:
    argv = ["sbatch", "--parsable", f"--job-name=sched-{tag}-{job.index}", f"--comment={job.cls}"]
    argv += [f"--{k}={v}" for k, v in sbatch_flags(res).items()]
    argv += ["--output=/dev/null", f"--wrap=exec {sys.executable} {script} {job.work_s:.2f} {job.rss_mb}"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    return out.stdout.strip().split(";")[0]


def squeue_count(tag: str) -> int:
    out = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True).stdout
    return sum(1 for name in out.split() if name.startswith(f"sched-{tag}-"))


def sacct(job_ids: list[str]) -> dict[str, dict[str, str]]:
    fields = "JobID,Submit,Start,End,Elapsed,Timelimit,NodeList,AllocTRES,State"
    out = subprocess.run(
        ["sacct", "-n", "-P", "-X", "-j", ",".join(job_ids), "-o", fields], capture_output=True, text=True
    ).stdout
    rows = {}
    for line in out.splitlines():
        f = line.split("|")
        rows[f[0]] = dict(zip(fields.split(","), f, strict=False))
    return rows


def stamp(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()


def replay(jobs: list[Job], tag: str, plan: Any, script: Path) -> tuple[list[Outcome], float]:
    """Submit each job at its arrival time (resources from `plan(job)`), resubmit a job that
    hit its time limit with twice the time, wait for all; the outcomes from sacct."""
    t0 = time.time()
    submitted: dict[int, list[str]] = {}
    resources: dict[int, ResourcesConf] = {}
    predicted: dict[int, float | None] = {}
    pending = sorted(jobs, key=lambda j: j.arrive_s)
    while pending or squeue_count(tag):
        now = time.time() - t0
        while pending and pending[0].arrive_s <= now:
            job = pending.pop(0)
            res, predicted[job.index] = plan(job)
            resources[job.index] = res
            submitted[job.index] = [sbatch(job, res, script, tag)]
        # under-estimates: a job that timed out is resubmitted with twice the time (no checkpoint here)
        ended = sacct([i[-1] for i in submitted.values()])
        for index, ids in submitted.items():
            row = ended.get(ids[-1])
            if row and row["State"].startswith("TIMEOUT"):
                res = resources[index]
                doubled = dataclasses.replace(res, time=str(2 * slurm_time_to_seconds(res.time) // 60), time_min=None)
                resources[index] = doubled
                ids.append(sbatch(next(j for j in jobs if j.index == index), doubled, script, tag))
        time.sleep(1.0)
    time.sleep(2)
    rows = sacct([i for ids in submitted.values() for i in ids])
    out = []
    for job in jobs:
        ids = submitted[job.index]
        runs = [rows[i] for i in ids]
        last = runs[-1]
        gtype = "a100" if last["NodeList"].startswith("a100") else "t4"
        out.append(
            Outcome(
                job,
                ids,
                submit=stamp(runs[0]["Submit"]),
                start=stamp(last["Start"]),
                end=stamp(last["End"]),
                gpu_type=gtype,
                gpus=job.gpus,
                elapsed_s=sum(slurm_time_to_seconds(r["Elapsed"]) for r in runs),
                limit_s=slurm_time_to_seconds(runs[0]["Timelimit"]),
                reference_s=predicted[job.index],
                timeouts=len(ids) - 1,
            )
        )
    return out, t0


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
        row = row_from_usage(o.job.cls, f"bench-a#{o.job.index}", "bench", o.gpu_type, parse_usage(text))
        if row is not None:
            rows.append(row)
    return store.add(rows)


def metrics(outcomes: list[Outcome], t0: float) -> dict[str, Any]:
    site = bench_site()
    first = min(o.submit for o in outcomes)
    makespan = max(o.end for o in outcomes) - first
    held = sum(o.elapsed_s * o.gpus for o in outcomes)
    useful = sum(o.job.work_s / THROUGHPUT[o.gpu_type] * o.gpus for o in outcomes)
    total_gpus = sum(GPUS.values())
    long_waits = sorted(o.start - o.submit for o in outcomes if o.job.cls.startswith("long"))
    cost = sum(o.elapsed_s * o.gpus / 3600 * site.gpus[o.gpu_type].price_per_hour for o in outcomes)
    # the prediction for the GPU type the job ran on (an any-type request lands where Slurm puts it)
    errors = [
        abs(o.reference_s / THROUGHPUT[o.gpu_type] - o.elapsed_s) / o.elapsed_s
        for o in outcomes
        if o.reference_s is not None and o.elapsed_s and not o.timeouts
    ]
    under = sum(
        1 for o in outcomes if o.reference_s is not None and o.reference_s / THROUGHPUT[o.gpu_type] < o.elapsed_s
    )
    asked = [abs(o.limit_s - o.elapsed_s) / o.elapsed_s for o in outcomes if o.elapsed_s and not o.timeouts]
    return {
        "jobs": len(outcomes),
        "makespan_s": makespan,
        "gpu_allocation_utilisation": held / (total_gpus * makespan),
        "work_utilisation": useful / (total_gpus * makespan),
        "long_jobs": len(long_waits),
        "long_wait_mean_s": statistics.fmean(long_waits),
        "long_wait_p90_s": long_waits[min(len(long_waits) - 1, math.ceil(0.9 * len(long_waits)) - 1)],
        "wait_mean_s": statistics.fmean(o.start - o.submit for o in outcomes),
        "cost": cost,
        "on_t4": sum(o.gpu_type == "t4" for o in outcomes),
        "prediction_median_rel_error": statistics.median(errors) if errors else None,
        "predictions_under_actual": under,
        "limit_median_rel_error": statistics.median(asked) if asked else None,
        "timeouts": sum(o.timeouts for o in outcomes),
        "wait_by_class": {
            cls: round(statistics.fmean(o.start - o.submit for o in outcomes if o.job.cls == cls), 1)
            for cls in sorted({o.job.cls for o in outcomes})
        },
    }


def bench_site() -> Any:
    site = default_site()
    raw = dataclasses.asdict(site)
    raw["gpus"]["t4"]["throughput"] = THROUGHPUT["t4"]
    return site_conf(raw)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--scale", type=float, default=0.35, help="multiply every job's work (and the arrival span)")
    ap.add_argument("--out", type=Path, default=BENCH / "results" / "schedule_trace.json")
    args = ap.parse_args()
    jobs = make_trace(args.jobs, args.seed, args.scale)
    work = Path(tempfile.mkdtemp(prefix="sched-bench-"))
    script = work / "workload.py"
    script.write_text(WORKLOAD)
    slurm = SlurmCLI()
    site = bench_site()
    print(
        f"trace: {len(jobs)} jobs, {sum(j.cls.startswith('long') for j in jobs)} long, "
        f"arrivals over {jobs[-1].arrive_s:.0f}s"
    )

    def as_requested(job: Job) -> tuple[ResourcesConf, float | None]:
        return requested(job), None

    a, t0a = replay(jobs, "a", as_requested, script)
    store = HistoryStore(work / "history.sqlite")
    print(f"(a) done; {ingest(a, store)} jobs into the history")
    cluster = ClusterInfo.query(slurm)

    asked_b: dict[int, ResourcesConf] = {}

    def placed(job: Job) -> tuple[ResourcesConf, float | None]:
        ask = requested(job)
        spec = job_spec(
            {
                "resources": {**dataclasses.asdict(ask), "gpu_type": "auto", "time": "auto", "mem": "auto"},
                "checkpoint": {"every_steps": 0},  # the workload does not checkpoint: no --time-min
                "task": {"target": "bench:workload"},
            }
        )
        p = plan_spec(
            spec,
            job.cls,  # the work's fingerprint here: its kind
            site=site,
            history=store,
            cluster=cluster,
            slurm=slurm,
            need_gib=job.need_gib,
        )
        asked_b[job.index] = p.resources
        return p.resources, p.prediction.reference_s

    b, t0b = replay(jobs, "b", placed, script)
    result = {
        "a": metrics(a, t0a),
        "b": metrics(b, t0b),
        "outcomes": {"a": [dataclasses.asdict(o) for o in a], "b": [dataclasses.asdict(o) for o in b]},
        "asked_b": {str(i): dataclasses.asdict(r) for i, r in asked_b.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    ma, mb = result["a"], result["b"]
    print(f"{'measure':36} {'(a) as requested':>18} {'(b) slurmagent':>16} {'b/a':>7}")
    for key in ma:
        va, vb = ma[key], mb[key]
        if isinstance(va, (int, float)) and isinstance(vb, (int, float)):
            ratio = f"{vb / va:.2f}" if va else "-"
            print(f"{key:36} {va:18.3f} {vb:16.3f} {ratio:>7}")
        else:
            print(f"{key:36} {va!s:>18} {vb!s:>16}")
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("SLURM_CONF", "/var/tmp/slurmagent-cluster/etc/slurm.conf")
    sys.exit(main())
