"""The code snapshot's cost at submission (issue 20): files, MB and seconds to list and copy
the project of a sweep, for this repository and for a generated tree of 10,000 small files
(a big repository's worth), one run each.

    .venv/bin/python bench/snapshot_cost.py
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

from slurmagent.config import CodeConf
from slurmagent.launch.snapshot import plan_snapshot, write_snapshot

ROOT = Path(__file__).resolve().parents[1]


def measure(name: str, cwd: Path, work: Path) -> None:
    sweep = work / f"sweep-{name}"
    t0 = time.perf_counter()
    plan = plan_snapshot(cwd, sweep, CodeConf(max_mb=10_000))
    listed = time.perf_counter() - t0
    snap = write_snapshot(plan, sweep)
    total = time.perf_counter() - t0
    print(
        f"| {name} | {snap.files:,} | {snap.bytes / 1e6:.1f} | {listed:.2f} | {snap.seconds:.2f} | {total:.2f} |",
        flush=True,
    )


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        tree = work / "tree"
        for i in range(10_000):
            folder = tree / f"pkg{i // 100:03d}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"mod{i % 100:02d}.py").write_text(f"VALUE = {i}\n" + "# a line of code\n" * 40)
        print("| project | files | MB | list (s) | copy (s) | total (s) |\n|---|---:|---:|---:|---:|---:|")
        measure("this repository (git)", ROOT, work)
        measure("10,000-file tree (no git)", tree, work)
        shutil.rmtree(work / "tree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
