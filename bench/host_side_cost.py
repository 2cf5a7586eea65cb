"""What the host side of a container job (job/host.py) adds to each of its steps: the time
from starting `python -m slurmagent.job.host --relay DIR -- true` to its end (its interpreter,
the relay's socket up and down), beside the same interpreter doing nothing and `true` alone.
The container runtime's own start (podman: about a second) comes on top of both.

    .venv/bin/python bench/host_side_cost.py --runs 20
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time


def median_s(argv: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory() as relay:
        rows = [
            ("`true` alone", ["true"]),
            ("the interpreter, `-c pass`", [sys.executable, "-c", "pass"]),
            (
                "host side around `true`",
                [sys.executable, "-u", "-m", "slurmagent.job.host", "--relay", relay, "--", "true"],
            ),
        ]
        print(f"| command | median of {runs} (s) |\n|---|---:|")
        for name, argv in rows:
            print(f"| {name} | {median_s(argv, runs):.3f} |")


if __name__ == "__main__":
    main()
