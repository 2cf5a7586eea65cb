"""Sweep submission and supervision, slurmagent vs hydra-submitit-launcher 1.2.0, on the
test cluster, in one run. See bench/README.md for what is measured and how to rerun.

    python bench/sweep_bench.py [--sizes 1000 2500] [--observe 60]
    python bench/sweep_bench.py scale [--sizes 10000 30000 100000] [--code DIR --label NAME]

Both tools run from bench/.venv (created here: slurmagent editable + hydra-submitit-launcher
1.2.0), with the same trivial task and resources. Jobs are submitted held (--begin=now+1h)
so the measure is of the tools, not of 2 CPU cores running 1,000 Python processes. Every
Slurm command either tool runs goes through bench/slurm_shim.py, which logs it.

`scale`: slurmagent alone, `--detach`, 10,000 to 100,000 tasks: seconds to all queued, the
launcher's peak RSS and bytes written, Slurm's own sbatch time (a two-line shell shim times
each call), `status` and `status --json` of the queued sweep; `--code DIR` runs another
checkout of slurmagent (e.g. the previous commit, `git archive`) with the same harness.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
VENV = BENCH / ".venv"
SHIM = BENCH / ".shim"
COMMANDS = ("sbatch", "squeue", "sacct", "scontrol", "sinfo", "scancel")
STATUS = ("squeue", "sacct")


def sh(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, **kw)  # type: ignore[call-overload]


def ensure_env() -> Path:
    py = VENV / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run(
        [
            str(py),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "-e",
            str(ROOT),
            "hydra-submitit-launcher==1.2.0",
        ],
        check=True,
    )
    SHIM.mkdir(exist_ok=True)
    for cmd in COMMANDS:
        path = SHIM / cmd
        path.write_text(
            f"#!{py}\nimport sys\nsys.path.insert(0, {str(BENCH)!r})\nimport slurm_shim\n"
            f"sys.exit(slurm_shim.main({cmd!r}))\n"
        )
        path.chmod(0o755)
    return py


def queue_size() -> int:
    out = sh(["squeue", "-h", "-r", "-o", "%i"]).stdout
    return len(out.split())


def clear_queue() -> None:
    sh(["scancel", "--user", os.environ.get("USER", "root")])
    deadline = time.monotonic() + 120
    while queue_size() and time.monotonic() < deadline:
        time.sleep(1)


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def command(tool: str, py: Path, n: int, sweep: Path) -> list[str]:
    if tool == "slurmagent":
        return [
            str(py),
            "-m",
            "slurmagent",
            "-m",
            f"+bench.i=range(0,{n})",
            "resources.partition=low",
            "resources.mem=1G",
            "resources.time=00:30:00",
            "+resources.extra.begin=now+3600",
            "synthetic.steps=1",
            f"hydra.sweep.dir={sweep}",
            "hydra.launcher.poll_interval_s=10",
            "hydra.launcher.max_poll_interval_s=10",
        ]
    return [str(py), str(BENCH / "hsl" / "app.py"), "-m", f"bench.i=range(0,{n})", f"hydra.sweep.dir={sweep}"]


def measure(tool: str, py: Path, n: int, observe_s: float) -> dict[str, object]:
    clear_queue()
    work = Path(tempfile.mkdtemp(prefix=f"bench-{tool}-{n}-"))
    log = work / "calls.jsonl"
    log.touch()
    env = dict(os.environ, PATH=f"{SHIM}:{os.environ['PATH']}", SLURMAGENT_BENCH_LOG=str(log))
    t0 = time.time()
    with open(work / "out", "w") as out, open(work / "err", "w") as err:
        proc = subprocess.Popen(
            command(tool, py, n, work / "sweep"), cwd=work, env=env, stdout=out, stderr=err, start_new_session=True
        )
    row: dict[str, object] = {"tool": tool, "tasks": n}
    deadline = time.monotonic() + 300
    queued = 0
    while time.monotonic() < deadline and proc.poll() is None:
        queued = queue_size()
        if queued >= n:
            break
        time.sleep(0.25)
    calls = [json.loads(x) for x in log.read_text().splitlines()]
    sbatch = [c for c in calls if c["cmd"] == "sbatch"]
    if queued < n:
        err = (work / "err").read_text().strip().splitlines()
        row.update(
            status="FAILED",
            queued=queued,
            sbatch_calls=len(sbatch),
            error=next((ln for ln in reversed(err) if "rror" in ln), err[-1] if err else "?")[:200],
        )
        proc.kill()
        clear_queue()
        return row
    queued_at = max(c["end"] for c in sbatch)
    row.update(status="ok", queued=queued, seconds_to_queued=round(queued_at - t0, 2), sbatch_calls=len(sbatch))
    window_start = time.time()
    time.sleep(observe_s)
    rss = peak_rss_mb(proc.pid)
    calls = [json.loads(x) for x in log.read_text().splitlines()]
    status_calls = [c for c in calls if c["cmd"] in STATUS and c["start"] >= window_start]
    row.update(status_queries_per_min=round(len(status_calls) * 60 / observe_s, 1), peak_rss_mb=round(rss, 1))
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    clear_queue()
    return row


# -- scale: one launcher, 10,000 … 100,000 tasks ---------------------------------------------------
SBATCH_TIMER = """#!/bin/sh
# times each sbatch (Slurm's own share of the time to queued); the job id is logged to cancel it
s=$(date +%s.%N); out=$({real} "$@"); rc=$?; e=$(date +%s.%N)
echo "$s $e $rc $out" >> "$SLURMAGENT_BENCH_SBATCH_LOG"; [ -n "$out" ] && echo "$out"; exit $rc
"""
# the launcher, in process: its peak RSS and the bytes it wrote (write(2) calls), read as it exits
PROBE = """
import json, os, resource, runpy, sys
sys.argv = ["slurmagent", *sys.argv[1:]]
try:
    runpy.run_module("slurmagent", run_name="__main__", alter_sys=True)
finally:
    io = dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())
    with open(os.environ["SLURMAGENT_BENCH_PROBE"], "w") as fh:
        json.dump({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                   "wchar": int(io["wchar"]), "write_bytes": int(io["write_bytes"])}, fh)
"""


def scale_command(n: int, sweep: Path) -> list[str]:
    return [
        "-m",
        f"+bench.i=range(0,{n})",
        "synthetic.steps=1",
        "resources.partition=low",
        "resources.mem=1G",
        "resources.time=00:30:00",
        "+resources.extra.begin=now+3600",
        "cluster=slurm",
        "--detach",
        f"hydra.sweep.dir={sweep}",
    ]


def _timed(argv: list[str], env: dict[str, str], out: int | None = subprocess.DEVNULL) -> tuple[float, float, int]:
    """(wall seconds, peak RSS MB, exit code) of one command."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - t0, usage.ru_maxrss / 1024, proc.returncode


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def measure_scale(n: int, code: Path | None) -> dict[str, object]:
    work = Path(tempfile.mkdtemp(prefix=f"bench-scale-{n}-"))
    sweep, log, probe = work / "sweep", work / "sbatch.log", work / "probe.json"
    shim = work / "bin"
    shim.mkdir()
    (shim / "sbatch").write_text(SBATCH_TIMER.format(real=sh(["which", "sbatch"]).stdout.strip()))
    (shim / "sbatch").chmod(0o755)
    env = dict(os.environ, PATH=f"{shim}:{os.environ['PATH']}", SLURMAGENT_BENCH_SBATCH_LOG=str(log))
    env["SLURMAGENT_BENCH_PROBE"] = str(probe)
    if code is not None:  # another checkout of slurmagent, first on the path
        env["PYTHONPATH"] = str(code)
    load_before = os.getloadavg()
    t0 = time.time()
    with open(work / "err", "w") as err:
        proc = subprocess.run(
            [sys.executable, "-c", PROBE, *scale_command(n, sweep)], cwd=work, env=env, stdout=err, stderr=err
        )
    returned = time.time() - t0
    calls = [line.split(maxsplit=3) for line in log.read_text().splitlines()] if log.exists() else []
    ids = [c[3].split(";")[0] for c in calls if len(c) > 3]
    text = (work / "err").read_text()
    supervisor = next((w for w in text.split("supervised by Slurm job ")[1:2]), "").split()[:1]
    if supervisor:
        sh(["scancel", supervisor[0]])  # it would load the sweep on these same 2 cores: not measured here
    arrays = [c for c in calls if len(c) > 3 and c[3].split(";")[0] not in supervisor]
    row: dict[str, object] = {
        "tasks": n,
        "code": str(code or ROOT),
        "loadavg_before": [round(x, 2) for x in load_before],
    }
    queued = len(
        sh(["squeue", "-h", "-r", "-j", ",".join(c[3].split(";")[0] for c in arrays), "-o", "%i"]).stdout.split()
    )
    if proc.returncode != 0 or queued != n:
        row.update(status="FAILED", rc=proc.returncode, queued=queued, error=text.strip().splitlines()[-3:])
        if ids:
            sh(["scancel", *ids])
        return row
    stats = json.loads(probe.read_text())
    sbatch_s = sum(float(c[1]) - float(c[0]) for c in arrays)
    row.update(
        status="ok",
        arrays=len(arrays),
        seconds_to_queued=round(max(float(c[1]) for c in arrays) - t0, 2),
        seconds_to_return=round(returned, 2),
        sbatch_seconds=round(sbatch_s, 2),
        peak_rss_mb=round(stats["peak_rss_mb"], 1),
        written_mb=round(stats["wchar"] / 1e6, 1),
        state_files_mb={p.name: round(p.stat().st_size / 1e6, 2) for p in sorted(sweep.glob("sweep.*"))},
        sweep_dir_mb=round(_du(sweep) / 1e6, 1),
    )
    plain = {**os.environ, **({"PYTHONPATH": str(code)} if code is not None else {})}
    status = [_timed([sys.executable, "-m", "slurmagent", "status", str(sweep)], plain) for _ in range(3)]
    as_json = _timed([sys.executable, "-m", "slurmagent", "status", str(sweep), "--json"], plain)
    row.update(
        status_s=round(sorted(s[0] for s in status)[1], 2),
        status_rss_mb=round(status[0][1], 1),
        status_json_s=round(as_json[0], 2),
        status_json_rss_mb=round(as_json[1], 1),
        status_ok=all(s[2] == 0 for s in status) and as_json[2] == 0,
        loadavg_after=[round(x, 2) for x in os.getloadavg()],
    )
    sh(["scancel", *ids])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and sh(["squeue", "-h", "-j", ",".join(ids), "-o", "%i"]).stdout.strip():
        time.sleep(1)
    return row


def scale_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="sweep_bench.py scale")
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 30_000, 100_000])
    ap.add_argument("--code", type=Path, help="another checkout of slurmagent to run (PYTHONPATH)")
    ap.add_argument("--label", default="this tree")
    ap.add_argument("--out", type=Path, default=BENCH / "results" / "sweep_scale.json")
    args = ap.parse_args(argv)
    if not os.environ.get("SLURM_CONF"):
        print("set SLURM_CONF (tests/cluster/slurm-cluster up prints it)", file=sys.stderr)
        return 2
    rows = json.loads(args.out.read_text()) if args.out.exists() else []
    for n in args.sizes:
        row = {"label": args.label, **measure_scale(n, args.code)}
        print(json.dumps(row), flush=True)
        rows.append(row)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


def main() -> int:
    if sys.argv[1:2] == ["scale"]:
        return scale_main(sys.argv[2:])
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 2500])
    ap.add_argument("--observe", type=float, default=60.0, help="seconds of supervision to count queries in")
    ap.add_argument("--out", type=Path, default=BENCH / "results" / "sweep.json")
    args = ap.parse_args()
    if not os.environ.get("SLURM_CONF"):
        print("set SLURM_CONF (tests/cluster/slurm-cluster up prints it)", file=sys.stderr)
        return 2
    py = ensure_env()
    rows = []
    for n in args.sizes:
        for tool in ("slurmagent", "hydra-submitit-launcher"):
            row = measure(tool, py, n, args.observe)
            print(json.dumps(row), flush=True)
            rows.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
