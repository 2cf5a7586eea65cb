"""Counts Slurm calls: installed as bench/.shim/{sbatch,squeue,…}, it logs one JSON line
per call (command, argv, start, end, exit code) and runs the real command (no shell)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def main(name: str) -> int:
    real = os.path.join(os.environ.get("SLURMAGENT_BENCH_REAL_BIN", "/usr/bin"), name)
    start = time.time()
    proc = subprocess.run([real, *sys.argv[1:]], check=False)
    with open(os.environ["SLURMAGENT_BENCH_LOG"], "a") as fh:
        fh.write(
            json.dumps({"cmd": name, "argv": sys.argv[1:], "start": start, "end": time.time(), "rc": proc.returncode})
            + "\n"
        )
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(os.path.basename(sys.argv[0])))
