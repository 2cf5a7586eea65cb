"""The fault-injection table: every row of tests/slurm/fault_cases.py run once on the test
cluster (the same cases, injectors and checks as tests/slurm/test_fault_table.py), written
as one markdown table: fault, outcome, attempts, steps redone, wall time, bit-identical,
cause. Rows that did not come out as expected are listed under the table, and the exit
code is 1.

    tests/cluster/slurm-cluster up      # with your SLURMAGENT_CLUSTER_DIR/PORT, if any
    .venv/bin/python bench/fault_table.py [--only NAME ...] [--out table.md] [--json rows.json] [--keep DIR]

Needs root (the disk-full row mounts a small tmpfs) and about 4 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "slurm"))

from fault_cases import CASES, CLUSTER_SCRIPT, CaseResult, run_table, table  # noqa: E402


def cluster_conf() -> str:
    """Bring the test cluster up (or find it up); its SLURM_CONF."""
    proc = subprocess.run([sys.executable, str(CLUSTER_SCRIPT), "up"], capture_output=True, text=True, timeout=300)
    for line in proc.stdout.splitlines():
        if line.startswith("SLURM_CONF="):
            return line.split("=", 1)[1]
    sys.exit(f"the test cluster did not come up: {proc.stderr.strip()[-2000:]}")


def as_json(res: CaseResult) -> dict[str, object]:
    return {
        "name": res.name,
        "fault": res.fault,
        "outcome": res.outcome,
        "attempts": res.runs,
        "steps_redone": res.steps_redone,
        "wall_s": round(res.wall_s, 1),
        "bit_identical": res.bit_identical,
        "cause": res.cause,
        "problems": res.problems,
        "notes": res.notes,
    }


def main(argv: list[str] | None = None) -> int:
    names = [c.name for c in CASES]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", choices=names, metavar="NAME", help=f"rows to run: {', '.join(names)}")
    ap.add_argument("--out", type=Path, help="also write the markdown table to this file")
    ap.add_argument("--json", type=Path, help="write every row's figures and notes as JSON")
    ap.add_argument("--keep", type=Path, help="run in this directory and keep it (default: a temporary one)")
    args = ap.parse_args(argv)
    cases = [c for c in CASES if not args.only or c.name in args.only]
    env = dict(os.environ, SLURM_CONF=cluster_conf())
    t0 = time.monotonic()
    if args.keep:
        results = run_table(cases, args.keep.resolve(), env)
    else:
        with tempfile.TemporaryDirectory(prefix="fault-table-") as tmp:
            results = run_table(cases, Path(tmp), env)
    wall = time.monotonic() - t0
    text = table(results)
    print(text)
    print(f"\n{len(results)} rows in {wall:.0f} s wall ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")
    if args.out:
        args.out.write_text(text + "\n")
    if args.json:
        args.json.write_text(json.dumps([as_json(r) for r in results], indent=1, default=str) + "\n")
    bad = [r for r in results if r.problems]
    for res in bad:
        print(f"\n{res.name}: not as expected:\n  " + "\n  ".join(res.problems), file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
