"""Launcher and runtime overhead of one checkout, for before/after comparisons of a restructure.

    python bench/overhead.py --root CHECKOUT --python CHECKOUT/.venv/bin/python --label before|after \
        [--skip-cluster] [--only NAME ...] [--out bench/results/overhead-LABEL.json]

Measures the checkout at --root through its own interpreter --python (a virtual environment
with the checkout installed editable), prints one JSON line per measurement and writes them
all to --out (after each measurement, so a failed run keeps what it had). With --only, the
named measurements are rerun and replace their earlier rows in --out; the others are kept.

  plugin_import   `PY -X importtime -c "import hydra_plugins.slurmagent_launcher.launcher"`,
                  --runs times (after one untimed warm-up run), from a temp dir, SLURM_CONF
                  unset: median cumulative µs of the launcher module, median process wall
                  time, modules imported, and how many of them are in slurmagent, torch,
                  submitit, rich (top-level package equal to that name)
  help            `PY -m slurmagent --help`, --runs times (after one warm-up): median and min
  fast_suite      `PY -m pytest -n 2 -m "not slurm" -q -p no:cacheprovider` in --root,
                  SLURM_CONF unset: wall seconds and the counts of pytest's last line
  sweep           (test cluster) a --sweep-tasks task sweep, held (--begin=now+1h), as a user
                  runs it; every Slurm command the launcher runs goes through a PATH shim that
                  logs it: seconds to the end of the last sbatch once all tasks are queued,
                  sbatch calls, squeue+sacct calls per minute over --observe seconds after
                  that, the launcher's VmHWM at the end of that window. --sweep-runs runs.
  requeue         (test cluster) the synthetic workload (400 steps of 0.1 s, per-step
                  timeline), `scontrol requeue` each time its job has been RUNNING and done
                  15 more steps since it (re)started, --requeues times; per restart
                  launch_s (Slurm start -> submitit's "Starting with JobEnvironment") and
                  setup_restore_s (that -> first step began), as bench/preempt_goodput.py
                  computes them; medians; redone steps and the result's digest.

The cluster measurements need SLURM_CONF (tests/cluster/slurm-cluster up prints it) and an
empty queue; they end with `scancel --user USER` and wait until the queue is empty.
Stdlib only; no shell: every command is an argument vector.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import pwd
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from preempt_goodput import analyse as goodput_analyse  # noqa: E402
from preempt_goodput import expected_digest, instances  # noqa: E402

PLUGIN = "hydra_plugins.slurmagent_launcher.launcher"
COUNTED_PACKAGES = ("slurmagent", "torch", "submitit", "rich")
SLURM_COMMANDS = ("sbatch", "squeue", "sacct", "scontrol", "sinfo", "scancel", "srun", "sstat")
STATUS_COMMANDS = ("squeue", "sacct")
MEASUREMENTS = ("plugin_import", "help", "fast_suite", "sweep", "requeue")
CLUSTER_MEASUREMENTS = ("sweep", "requeue")

# One file per Slurm command on PATH: logs the call (command, argv, start, end, rc) as a JSON
# line to $SLURMAGENT_BENCH_LOG and runs the real command (as bench/slurm_shim.py does).
SHIM = """\
#!{python}
import json, os, subprocess, sys, time
start = time.time()
rc = subprocess.run([{real!r}, *sys.argv[1:]], check=False).returncode
call = {{"cmd": {name!r}, "argv": sys.argv[1:], "start": start, "end": time.time(), "rc": rc}}
with open(os.environ["SLURMAGENT_BENCH_LOG"], "a") as fh:
    fh.write(json.dumps(call) + "\\n")
sys.exit(rc)
"""


# ----------------------------------------------------------------------------- helpers
def base_env(slurm: bool) -> dict[str, str]:
    """This process's environment, less anything that would point the child at a Slurm job
    or (unless `slurm`) at the test cluster."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMAGENT_", "SUBMITIT_"))}
    env.pop("PYTHONPATH", None)
    if slurm:
        env["SLURM_CONF"] = os.environ["SLURM_CONF"]
    return env


def run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, **kw)


def timed(argv: list[str], **kw: Any) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.perf_counter()
    proc = run(argv, **kw)
    return time.perf_counter() - t0, proc


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None or x != x else round(x, nd)  # NaN -> None


def user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


# ----------------------------------------------------------------------------- a. plugin import
def parse_importtime(stderr: str) -> list[tuple[int, int, str]]:
    """(self µs, cumulative µs, module) per `import time:` line; the header is skipped."""
    rows = []
    for line in stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        parts = line[len("import time:") :].split("|")
        if len(parts) != 3 or not parts[0].strip().isdigit():
            continue  # the header
        rows.append((int(parts[0]), int(parts[1]), parts[2].strip()))
    return rows


def measure_plugin_import(py: str, runs: int) -> dict[str, Any]:
    argv = [py, "-X", "importtime", "-c", f"import {PLUGIN}"]
    env = base_env(slurm=False)
    cumulative: list[float] = []
    walls: list[float] = []
    counts: list[int] = []
    per_pkg: dict[str, list[int]] = {p: [] for p in COUNTED_PACKAGES}
    with tempfile.TemporaryDirectory(prefix="overhead-import-") as cwd:
        run(argv, cwd=cwd, env=env)  # warm-up: bytecode caches written
        for _ in range(runs):
            wall, proc = timed(argv, cwd=cwd, env=env)
            if proc.returncode != 0:
                raise RuntimeError(f"import failed (rc {proc.returncode}): {proc.stderr[-2000:]}")
            rows = parse_importtime(proc.stderr)
            own = [cum for _, cum, mod in rows if mod == PLUGIN]
            if not own:
                raise RuntimeError(f"no importtime line for {PLUGIN}")
            cumulative.append(own[-1])
            walls.append(wall)
            counts.append(len(rows))
            tops = Counter(mod.split(".")[0] for _, _, mod in rows)
            for pkg in COUNTED_PACKAGES:
                per_pkg[pkg].append(tops[pkg])
    return {
        "runs": runs,
        "warmup_runs": 1,
        "cumulative_us_median": median(cumulative),
        "cumulative_us_all": cumulative,
        "wall_s_median": r(median(walls)),
        "wall_s_min": r(min(walls)),
        "modules_imported": int(median([float(c) for c in counts])),
        "modules_imported_all": sorted(set(counts)),
        "modules_by_package": {p: int(median([float(c) for c in v])) for p, v in per_pkg.items()},
    }


# ----------------------------------------------------------------------------- b. --help
def measure_help(py: str, runs: int) -> dict[str, Any]:
    argv = [py, "-m", "slurmagent", "--help"]
    env = base_env(slurm=False)
    walls = []
    with tempfile.TemporaryDirectory(prefix="overhead-help-") as cwd:
        run(argv, cwd=cwd, env=env)  # warm-up
        for _ in range(runs):
            wall, proc = timed(argv, cwd=cwd, env=env)
            if proc.returncode != 0:
                raise RuntimeError(f"--help failed (rc {proc.returncode}): {proc.stderr[-2000:]}")
            walls.append(wall)
    return {
        "runs": runs,
        "warmup_runs": 1,
        "wall_s_median": r(median(walls)),
        "wall_s_min": r(min(walls)),
        "wall_s_all": [r(w) for w in walls],
    }


# ----------------------------------------------------------------------------- c. fast suite
SUMMARY_ITEM = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected|warnings?)\b")


def measure_fast_suite(py: str, root: Path) -> dict[str, Any]:
    argv = [py, "-m", "pytest", "-n", "2", "-m", "not slurm", "-q", "-p", "no:cacheprovider"]
    wall, proc = timed(argv, cwd=root, env=base_env(slurm=False))
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    counts = {k: 0 for k in ("passed", "failed", "skipped", "errors")}
    for n, kind in SUMMARY_ITEM.findall(last):
        key = {"error": "errors", "warning": "warnings"}.get(kind, kind)
        counts[key] = counts.get(key, 0) + int(n)
    row: dict[str, Any] = {"wall_s": r(wall, 2), "rc": proc.returncode, **counts, "last_line": last.strip("= ")}
    if counts["failed"] or counts["errors"]:
        row["failures"] = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))][:30]
    return row


# ----------------------------------------------------------------------------- cluster helpers
def squeue_ids(job: str | None = None) -> list[str]:
    argv = ["squeue", "-h", "-r", "-o", "%i"] + (["-j", job] if job else [])
    return run(argv).stdout.split()


def clear_queue(timeout: float = 300) -> int:
    """Cancel this user's jobs and wait until squeue shows none; returns what is left."""
    run(["scancel", "--user", user()])
    deadline = time.monotonic() + timeout
    left = len(squeue_ids())
    while left and time.monotonic() < deadline:
        time.sleep(1)
        left = len(squeue_ids())
    return left


def require_empty_queue(timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while squeue_ids():
        if time.monotonic() > deadline:
            raise RuntimeError("the test cluster's queue is not empty (someone else's jobs?); not touching them")
        time.sleep(2)


def make_shim(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in SLURM_COMMANDS:
        real = shutil.which(name)
        if real is None:
            continue
        path = folder / name
        path.write_text(SHIM.format(python=sys.executable, real=real, name=name))
        path.chmod(0o755)
    return folder


def peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def read_calls(log: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in log.read_text().splitlines() if x.strip()]


# ----------------------------------------------------------------------------- d. sweep
def measure_sweep(py: str, tasks: int, observe_s: float, run_no: int) -> dict[str, Any]:
    require_empty_queue()
    work = Path(tempfile.mkdtemp(prefix=f"overhead-sweep-{tasks}-", dir="/var/tmp"))
    log = work / "calls.jsonl"
    log.touch()
    shim = make_shim(work / "shim")
    env = dict(base_env(slurm=True), PATH=f"{shim}{os.pathsep}{os.environ['PATH']}", SLURMAGENT_BENCH_LOG=str(log))
    argv = [
        py,
        "-m",
        "slurmagent",
        "-m",
        f"+bench.i=range(0,{tasks})",
        "resources.partition=low",
        "resources.mem=1G",
        "resources.time=00:30:00",
        "+resources.extra.begin=now+3600",
        "synthetic.steps=1",
        f"hydra.sweep.dir={work / 'sweep'}",
        "hydra.launcher.poll_interval_s=10",
        "hydra.launcher.max_poll_interval_s=10",
    ]
    row: dict[str, Any] = {"run": run_no, "tasks": tasks, "work": str(work)}
    t0 = time.time()
    with open(work / "out", "wb") as out, open(work / "err", "wb") as err:
        proc = subprocess.Popen(argv, cwd=work, env=env, stdout=out, stderr=err, start_new_session=True)
    try:
        deadline = time.monotonic() + 900
        queued = 0
        while time.monotonic() < deadline and proc.poll() is None:
            queued = len(squeue_ids())
            if queued >= tasks:
                break
            time.sleep(0.5)
        seen_queued = time.time()
        sbatch = [c for c in read_calls(log) if c["cmd"] == "sbatch"]
        row.update(queued=queued, sbatch_calls=len(sbatch), sbatch_failed=sum(1 for c in sbatch if c["rc"]))
        if queued < tasks:
            row.update(
                status="FAILED",
                launcher_rc=proc.poll(),
                seconds_waited=r(time.time() - t0, 1),
                stderr_tail=tail(work / "err"),
            )
            return row
        queued_at = max(c["end"] for c in sbatch)
        row.update(
            status="ok",
            seconds_to_queued=r(queued_at - t0, 2),
            seconds_to_seen_in_squeue=r(seen_queued - t0, 2),
            sbatch_s_total=r(sum(c["end"] - c["start"] for c in sbatch), 2),
        )
        window_start = time.time()
        time.sleep(observe_s)
        rss = peak_rss_mb(proc.pid)
        alive = proc.poll() is None
        calls = read_calls(log)
        in_window = [c for c in calls if c["start"] >= window_start and c["start"] < window_start + observe_s]
        status_calls = [c for c in in_window if c["cmd"] in STATUS_COMMANDS]
        row.update(
            observe_s=observe_s,
            status_queries_per_min=r(len(status_calls) * 60 / observe_s, 1),
            calls_in_window=dict(Counter(c["cmd"] for c in in_window)),
            calls_total=dict(Counter(c["cmd"] for c in calls)),
            peak_rss_mb=r(rss, 1),
            launcher_alive_after_window=alive,
        )
        if not alive:
            row["stderr_tail"] = tail(work / "err")
        return row
    finally:
        stop_group(proc)
        row["queue_left_after_cleanup"] = clear_queue()


# ----------------------------------------------------------------------------- e. requeue
# Per-restart analysis: bench/preempt_goodput.py's own (Instance, instances, analyse), so the
# two benchmarks define "setup + restore" the same way.
def read_timeline(path: Path) -> list[tuple[int, int, float]]:
    """(attempt, step, end time) per step, in the order written."""
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line being written
            if "t" in rec:
                rows.append((int(rec["attempt"]), int(rec["step"]), float(rec["t"])))
    return rows


STARTING = "Starting with JobEnvironment"


def submitit_starts(folder: Path, job_id: str) -> set[float]:
    """When the job's Python process started, per run: submitit's "Starting with
    JobEnvironment" lines in the job's rank-0 log ({job_id}_0_log.out, anywhere below)."""
    starts = set()
    for log in folder.glob(f"**/{job_id}_0_log.out"):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("submitit INFO (") and STARTING in line:
                stamp = line[len("submitit INFO (") :].split(")")[0]
                starts.add(datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return starts


def measure_requeue(
    py: str, requeues: int, steps: int, step_s: float, after_steps: int, timeout: float
) -> dict[str, Any]:
    require_empty_queue()
    work = Path(tempfile.mkdtemp(prefix="overhead-requeue-", dir="/var/tmp"))
    sweep = work / "sweep"
    argv = [
        py,
        "-m",
        "slurmagent",
        "+experiment=synthetic",
        f"synthetic.steps={steps}",
        f"synthetic.step_time_s={step_s}",
        "+synthetic.timeline=true",
        "resources.partition=low",
        f"hydra.sweep.dir={sweep}",
        "-m",
    ]
    row: dict[str, Any] = {"steps": steps, "step_time_s": step_s, "requeue_after_steps": after_steps, "work": str(work)}
    metrics = sweep / "0" / "metrics.jsonl"
    starts: set[float] = set()
    job_ids: list[str] = []
    sent: list[dict[str, Any]] = []
    t0 = time.time()
    with open(work / "out", "wb") as out, open(work / "err", "wb") as err:
        proc = subprocess.Popen(
            argv, cwd=work, env=base_env(slurm=True), stdout=out, stderr=err, start_new_session=True
        )
    try:
        deadline = time.monotonic() + timeout
        requeued_attempt = 0  # the attempt last requeued: the next requeue waits for steps of a later one
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.3)
            try:
                attempts = json.loads((sweep / "sweep.json").read_text())["tasks"][0]["attempts"]
            except (OSError, ValueError, KeyError, IndexError):
                continue
            if not attempts or not attempts[-1].get("job_id"):
                continue
            job = str(attempts[-1]["job_id"])
            if job not in job_ids:
                job_ids.append(job)
            starts |= submitit_starts(sweep, job)  # each poll: kept even if a log were rewritten
            if len(sent) >= requeues:
                continue
            state = run(["squeue", "-h", "-j", job, "-o", "%T"]).stdout.strip()
            fresh = [(a, s) for a, s, _ in read_timeline(metrics) if a > requeued_attempt]
            if state == "RUNNING" and len(fresh) >= after_steps:
                rq = run(["scontrol", "requeue", job])
                sent.append(
                    {
                        "t": round(time.time() - t0, 2),
                        "job": job,
                        "attempt": max(a for a, _ in fresh),
                        "last_step": max(s for _, s in fresh),
                        "rc": rq.returncode,
                    }
                )
                if rq.returncode != 0:
                    raise RuntimeError(f"scontrol requeue {job}: {rq.stderr.strip()}")
                requeued_attempt = max(a for a, _ in fresh)
                print(f"# requeue {len(sent)}/{requeues} of {job} at step {sent[-1]['last_step']}", file=sys.stderr)
        finished = proc.poll() is not None
        row.update(
            launcher_rc=proc.poll(),
            finished=finished,
            wall_s=r(time.time() - t0, 1),
            requeues_sent=len(sent),
            requeues=sent,
            job_ids=job_ids,
        )
        if not finished or proc.returncode != 0:
            row.update(status="FAILED", stderr_tail=tail(work / "err"))
            return row
        time.sleep(3)  # accounting catches up with the last run's end
        for job in job_ids:
            starts |= submitit_starts(sweep, job)
        inst = [i for job in job_ids for i in instances(job)]
        timeline = read_timeline(metrics)
        per = goodput_analyse(sorted(inst, key=lambda i: i.start), timeline, step_s, sorted(starts))["per_preemption"]
        task = json.loads((sweep / "sweep.json").read_text())["tasks"][0]
        result = task.get("result") or {}
        launch = [p["launch_s"] for p in per if p["launch_s"] == p["launch_s"]]
        setup = [p["setup_restore_s"] for p in per if p["setup_restore_s"] == p["setup_restore_s"]]
        row.update(
            status="ok" if len(per) == requeues and len(setup) == len(per) else "INCOMPLETE",
            restarts=len(per),
            setup_restore_s=[r(x) for x in setup],
            setup_restore_s_median=r(median(setup)) if setup else None,
            launch_s=[r(x) for x in launch],
            launch_s_median=r(median(launch)) if launch else None,
            per_restart=[{k: (r(v) if isinstance(v, float) else v) for k, v in p.items()} for p in per],
            instances=[{**asdict(i), "start": r(i.start, 0), "end": r(i.end, 0)} for i in inst],
            submitit_starts=len(starts),
            steps_in_timeline=len(timeline),
            redone_steps=sum(p["redone_steps"] for p in per),
            task_state=task.get("state"),
            attempts_recorded=len(task.get("attempts", [])),
            result={k: result.get(k) for k in ("steps", "attempt", "steps_run_here", "resumed_from")},
            digest_matches_uninterrupted=result.get("digest") == expected_digest(steps),
        )
        return row
    finally:
        stop_group(proc)
        row["queue_left_after_cleanup"] = clear_queue()


# ----------------------------------------------------------------------------- main
def describe(root: Path, py: str) -> dict[str, Any]:
    where = run(
        [py, "-c", f"import slurmagent, {PLUGIN} as m, sys; print(slurmagent.__file__); print(m.__file__)"],
        cwd=tempfile.gettempdir(),
        env=base_env(slurm=False),
    )
    rev = run(["git", "-C", str(root), "rev-parse", "HEAD"]).stdout.strip()
    dirty = run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"]).stdout.strip()
    version = run([py, "-c", "import sys; print(sys.version.split()[0])"]).stdout.strip()
    files = where.stdout.split()
    meta = {
        "root": str(root),
        "python": py,
        "python_version": version,
        "git_rev": rev,
        "git_dirty": bool(dirty),
        "imports_from": files,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    if where.returncode != 0 or not all(Path(f).resolve().is_relative_to(root) for f in files):
        raise SystemExit(f"{py} does not import slurmagent from {root}: {where.stdout}{where.stderr}")
    return meta


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, required=True, help="the checkout to measure")
    ap.add_argument("--python", required=True, help="its interpreter (a venv with the checkout installed editable)")
    ap.add_argument("--label", required=True, help="before | after (goes into the results)")
    ap.add_argument("--skip-cluster", action="store_true", help="no sweep / requeue measurements")
    ap.add_argument("--only", nargs="+", choices=MEASUREMENTS, help="run only these; merge into --out")
    ap.add_argument("--out", type=Path, help="default: bench/results/overhead-LABEL.json")
    ap.add_argument("--runs", type=int, default=7, help="timed runs of the import and --help measurements")
    ap.add_argument("--sweep-tasks", type=int, default=10000)
    ap.add_argument("--sweep-runs", type=int, default=2)
    ap.add_argument("--observe", type=float, default=40.0, help="seconds of supervision to count queries in")
    ap.add_argument("--requeues", type=int, default=5)
    ap.add_argument("--requeue-timeout", type=float, default=1800.0)
    args = ap.parse_args()

    root = args.root.resolve()
    py = args.python if os.sep not in args.python else str(Path(args.python).absolute())
    out: Path = args.out or BENCH / "results" / f"overhead-{args.label}.json"
    wanted = [m for m in (args.only or MEASUREMENTS) if not (args.skip_cluster and m in CLUSTER_MEASUREMENTS)]
    if any(m in CLUSTER_MEASUREMENTS for m in wanted) and not os.environ.get("SLURM_CONF"):
        print("set SLURM_CONF (tests/cluster/slurm-cluster up prints it), or pass --skip-cluster", file=sys.stderr)
        return 2

    meta = describe(root, py)
    rows: list[dict[str, Any]] = []
    if args.only and out.exists():
        earlier = json.loads(out.read_text())
        rows = [m for m in earlier.get("measurements", []) if m.get("measurement") not in wanted]
        meta["earlier_runs"] = [*earlier.get("meta", {}).get("earlier_runs", []), earlier.get("meta", {})]

    def save() -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        order = {m: i for i, m in enumerate(MEASUREMENTS)}
        rows.sort(key=lambda m: (order.get(str(m.get("measurement")), 99), m.get("run", 0)))
        out.write_text(json.dumps({"label": args.label, "meta": meta, "measurements": rows}, indent=1) + "\n")

    def record(name: str, fn: Callable[[], dict[str, Any]], **extra: Any) -> None:
        t0 = time.time()
        try:
            row = {"label": args.label, "measurement": name, **extra, **fn()}
        except Exception as exc:  # recorded as a failed measurement; the others still run
            row = {"label": args.label, "measurement": name, **extra, "status": "FAILED", "error": repr(exc)}
        row.setdefault("status", "ok")
        row["took_s"] = round(time.time() - t0, 1)
        print(json.dumps(row), flush=True)
        rows.append(row)
        save()

    if "plugin_import" in wanted:
        record("plugin_import", lambda: measure_plugin_import(py, args.runs))
    if "help" in wanted:
        record("help", lambda: measure_help(py, args.runs))
    if "fast_suite" in wanted:
        record("fast_suite", lambda: measure_fast_suite(py, root))
    if "sweep" in wanted:
        for k in range(1, args.sweep_runs + 1):
            record("sweep", partial(measure_sweep, py, args.sweep_tasks, args.observe, k), run=k)
    if "requeue" in wanted:
        record("requeue", lambda: measure_requeue(py, args.requeues, 400, 0.1, 15, args.requeue_timeout))
    save()
    print(f"wrote {out}", file=sys.stderr)
    return 0 if all(m.get("status") == "ok" for m in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
