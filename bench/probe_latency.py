"""The pre-flight probe's added latency before a sweep's tasks are queued (issue 20): the time a
detached launch takes to return (its tasks queued) with `probe=off`, with a cold probe
(`probe=recheck`: a probe job submitted, run and read) and with a cached one (`probe=auto` after
a passed check), on the test cluster, N runs each, medians.

    export SLURM_CONF=/var/tmp/slurmagent-cluster/etc/slurm.conf
    .venv/bin/python bench/probe_latency.py [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def launch(home: Path, mode: str, n: int) -> float:
    t0 = time.perf_counter()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurmagent",
            "-m",
            "+experiment=synthetic",
            "synthetic.steps=1",
            'env.setup=["export PROBE_BENCH=1"]',
            f"probe={mode}",
            "--detach",
            f"hydra.sweep.dir={home / f'{mode}-{n}'}",
        ],
        cwd=home,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode != 0:
        raise SystemExit(out.stderr)
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        times: dict[str, list[float]] = {"off": [], "recheck": [], "auto": []}
        for n in range(args.runs):
            for mode in times:  # auto right after recheck: the check it finds is an hour old at most
                times[mode].append(launch(home, mode, n))
        off = statistics.median(times["off"])
        print("| probe | launch returns, median of", args.runs, "(s) | added by the probe (s) |\n|---|---:|---:|")
        for mode, label in (("off", "off"), ("recheck", "cold (a probe job)"), ("auto", "cached")):
            med = statistics.median(times[mode])
            print(f"| {label} | {med:.2f} | {med - off:+.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
