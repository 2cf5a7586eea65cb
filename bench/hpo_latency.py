"""How long slurmagent's optimiser takes per ask + tell as a study grows, with its default
storage (an Optuna journal file, `slurmagent.hpo.storage.open_storage("", DIR)`).

    .venv/bin/python bench/hpo_latency.py [--trials 10000] [--at 1000 10000] [--storage journal|memory]
                                          [--max-seconds 900] [--profile-at 1000]

The study is the tabular benchmark's (bench/hpo_table.py, bench/hpo_replay.py): the same
search space and rungs (1, 3, 9, 20 epochs, eta 3), every ask looked up in the table (seed 0)
and told its per-epoch curve up to the ask's fidelity, as the study driver tells it; no
budget: it runs until the study holds `--trials` trials (or `--max-seconds` have passed).
Each *pair* is one `ask()` and the `tell()` of that ask (a new trial or a promotion); its
wall time (and the process's CPU time, less sensitive to a loaded machine) is measured
around the two calls only (the table look-up excluded).

Reported for each `--at` N: the median and p95 of the pairs asked while the study held
N - window .. N trials (`--window`, 100), ask and tell apart and together, and the journal
file's size. `--profile-at N` runs those pairs under cProfile and prints where the time
went (and writes the stats next to the JSON).
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import io
import json
import math
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hpo_replay import DEFAULT_TABLE, ETA, Table

BENCH = Path(__file__).resolve().parent
DEFAULT_JSON = BENCH / "results" / "hpo_latency.json"


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else math.nan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", type=Path, default=DEFAULT_TABLE)
    parser.add_argument("--trials", type=int, default=10_000, help="stop once the study holds this many trials")
    parser.add_argument("--at", type=int, nargs="+", default=[1_000, 10_000], help="study sizes to report")
    parser.add_argument("--window", type=int, default=100, help="pairs asked while the study held N-window..N trials")
    parser.add_argument("--every", type=int, default=500, help="also summarise every this many trials")
    parser.add_argument("--storage", choices=["journal", "memory"], default="journal")
    parser.add_argument("--dir", type=Path, default=None, help="where the journal goes (default: a temporary dir)")
    parser.add_argument("--max-seconds", type=float, default=900.0, help="stop after this much wall time")
    parser.add_argument("--profile-at", type=int, nargs="*", default=[], help="cProfile the window before N trials")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=lambda s: Path(s) if s else None, default=DEFAULT_JSON, help="'': none")
    args = parser.parse_args(argv)

    import optuna

    from slurmagent.hpo.core import Optimizer
    from slurmagent.hpo.space import Space
    from slurmagent.hpo.storage import JOURNAL, open_storage

    table = Table(args.table)
    space = Space.from_overrides(
        [
            f"optim.lr=tag(log,interval({float(table.lrs[0])!r},{float(table.lrs[-1])!r}))",
            "model.width=choice(" + ",".join(map(str, table.widths)) + ")",
            "model.depth=choice(" + ",".join(map(str, table.depths)) + ")",
            "optim.name=choice(" + ",".join(table.optimizers) + ")",
        ]
    )
    tmp = tempfile.TemporaryDirectory(prefix="hpo-latency-")
    where = args.dir or Path(tmp.name)
    storage = open_storage("", where) if args.storage == "journal" else None
    journal = Path(where) / JOURNAL
    opt = Optimizer(space, 1, table.epochs, ETA, seed=args.seed, direction="minimize", storage=storage)

    pairs: list[dict[str, Any]] = []  # n (trials held when asked), ask_ms, tell_ms, promotion
    sizes: dict[int, int] = {}  # trials → journal bytes
    profiles = {n: cProfile.Profile() for n in args.profile_at}
    wall0, cpu0 = time.perf_counter(), time.process_time()
    stopped = "trials"
    next_report = args.every
    while len(opt.trials) < args.trials:
        if time.perf_counter() - wall0 > args.max_seconds:
            stopped = "max-seconds"
            break
        n = len(opt.trials)
        prof = next((p for at, p in profiles.items() if at - args.window <= n < at), None)
        if prof:
            prof.enable()
        c0, t0 = time.process_time(), time.perf_counter()
        a = opt.ask()
        t1, c1 = time.perf_counter(), time.process_time()
        if prof:
            prof.disable()
        p = a.params
        row = table.row(float(p["optim.lr"]), int(p["model.width"]), int(p["model.depth"]), str(p["optim.name"]))
        curve = {e: float(table.val[row, 0, e - 1]) for e in range(1, a.fidelity + 1)}
        if prof:
            prof.enable()
        c2, t2 = time.process_time(), time.perf_counter()
        opt.tell(a.trial, curve)
        t3, c3 = time.perf_counter(), time.process_time()
        if prof:
            prof.disable()
        pairs.append(
            {
                "n": n,
                "ask_ms": (t1 - t0) * 1e3,
                "tell_ms": (t3 - t2) * 1e3,
                "cpu_ms": (c1 - c0 + c3 - c2) * 1e3,
                "promotion": a.resume is not None,
            }
        )
        if len(opt.trials) >= next_report and a.resume is None:
            recent = [q["ask_ms"] + q["tell_ms"] for q in pairs if n - args.window <= q["n"] < n]
            size = journal.stat().st_size if journal.exists() else 0
            sizes[len(opt.trials)] = size
            print(
                f"{len(opt.trials):6d} trials, {len(pairs):6d} pairs, {time.perf_counter() - wall0:7.1f} s: "
                f"last {args.window} trials' pairs median {statistics.median(recent):.1f} ms, "
                f"p95 {percentile(recent, 95):.1f} ms; journal {size / 1e6:.1f} MB",
                flush=True,
            )
            next_report += args.every
    wall_s, cpu_s = time.perf_counter() - wall0, time.process_time() - cpu0

    windows: dict[str, Any] = {}
    for at in sorted({*args.at, *range(args.every, args.trials + 1, args.every)}):
        sel = [q for q in pairs if at - args.window <= q["n"] < at]
        if not sel:
            continue
        both = [q["ask_ms"] + q["tell_ms"] for q in sel]
        windows[str(at)] = {
            "pairs": len(sel),
            "promotions": sum(q["promotion"] for q in sel),
            "median_ms": statistics.median(both),
            "p95_ms": percentile(both, 95),
            "ask_median_ms": statistics.median(q["ask_ms"] for q in sel),
            "ask_p95_ms": percentile([q["ask_ms"] for q in sel], 95),
            "tell_median_ms": statistics.median(q["tell_ms"] for q in sel),
            "tell_p95_ms": percentile([q["tell_ms"] for q in sel], 95),
            "cpu_median_ms": statistics.median(q["cpu_ms"] for q in sel),
            "cpu_p95_ms": percentile([q["cpu_ms"] for q in sel], 95),
        }
    print()
    print("| trials held | pairs | ask+tell median | p95 | ask median / p95 | tell median / p95 | CPU median / p95 |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for at in args.at:
        w = windows.get(str(at))
        if w is None:
            print(f"| {at:,} | not reached | | | | | |")
            continue
        print(
            f"| {at - args.window:,}–{at:,} | {w['pairs']} | {w['median_ms']:.1f} ms | {w['p95_ms']:.1f} ms | "
            f"{w['ask_median_ms']:.1f} / {w['ask_p95_ms']:.1f} ms | "
            f"{w['tell_median_ms']:.1f} / {w['tell_p95_ms']:.1f} ms | "
            f"{w['cpu_median_ms']:.1f} / {w['cpu_p95_ms']:.1f} ms |"
        )

    profile_text: dict[str, str] = {}
    for at, prof in profiles.items():
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf)
        stats.sort_stats("cumulative").print_stats(30)
        stats.sort_stats("tottime").print_stats(20)
        profile_text[str(at)] = buf.getvalue()
        print(f"\n== cProfile, the {args.window} trials' pairs before {at} trials ==")
        print(buf.getvalue())
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            stats.dump_stats(str(args.json.with_suffix(f".{at}.prof")))

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "meta": {
                "storage": args.storage,
                "trials_reached": len(opt.trials),
                "pairs": len(pairs),
                "stopped_by": stopped,
                "wall_s": round(wall_s, 1),
                "cpu_s": round(cpu_s, 1),
                "journal_bytes": journal.stat().st_size if journal.exists() else None,
                "window": args.window,
                "optuna": optuna.__version__,
                "python": sys.version.split()[0],
                "run_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
            },
            "windows": windows,
            "journal_bytes_at": sizes,
            "pairs_ms": [
                [q["n"], round(q["ask_ms"], 3), round(q["tell_ms"], 3), round(q["cpu_ms"], 3), int(q["promotion"])]
                for q in pairs
            ],
        }
        args.json.write_text(json.dumps(doc, indent=1))
        print(f"\n{args.json}")
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
