"""Sweep submission and supervision, slurmagent vs hydra-submitit-launcher 1.2.0, on the
test cluster, in one run. See bench/README.md for what is measured and how to rerun.

    python bench/sweep_bench.py [--sizes 1000 2500] [--observe 60]

Both tools run from bench/.venv (created here: slurmagent editable + hydra-submitit-launcher
1.2.0), with the same trivial task and resources. Jobs are submitted held (--begin=now+1h)
so the measure is of the tools, not of 2 CPU cores running 1,000 Python processes. Every
Slurm command either tool runs goes through bench/slurm_shim.py, which logs it.
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


def main() -> int:
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
