"""A sweep's results: `results` (one row per task: a table, CSV or JSON) and `report` (an HTML page
with every reported metric's curves)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from slurmagent.cli.args import NEWEST_HELP, check_output_dir, sweep_of
from slurmagent.cli.exits import EXIT_OK
from slurmagent.errors import SweepStateError


def results_args(rs: argparse.ArgumentParser) -> None:
    rs.add_argument("sweep_dir", type=Path, nargs="?", default=None, help=NEWEST_HELP)
    rs.add_argument("--sort", default=None, help="a column to sort by (a result key such as val_acc, or an override)")
    rs.add_argument("--desc", action="store_true", help="largest first")
    fmt = rs.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="CSV on stdout, one column per override and result key")
    fmt.add_argument("--json", action="store_true", help="one JSON object per task")


def results(args: argparse.Namespace) -> int:
    """Example: slurmagent results DIR --sort val_acc --desc   |   slurmagent results DIR --csv > results.csv"""

    import csv

    from slurmagent.supervise.state import SweepStore
    from slurmagent.supervise.views import columns, result_rows, results_table, terminal

    rows = result_rows(SweepStore(sweep_of(args)).load(), args.sort, descending=args.desc)
    if args.json:
        for r in rows:
            print(json.dumps(r, default=str))
    elif args.csv:
        writer = csv.DictWriter(sys.stdout, fieldnames=columns(rows))
        writer.writeheader()
        writer.writerows(rows)
    else:
        order = f", by {args.sort}{' (descending)' if args.desc else ''}" if args.sort else ""
        terminal().print(results_table(rows, f"{len(rows)} task(s) of {args.sweep_dir}{order}"))
    return EXIT_OK


def report_args(rp: argparse.ArgumentParser) -> None:
    rp.add_argument("sweep_dir", type=Path, nargs="?", default=None, help=NEWEST_HELP)
    rp.add_argument("-o", "--output", type=Path, default=None, help="directory to write into (default: SWEEP/report)")


def report(args: argparse.Namespace) -> int:
    """The curves come from each task's metrics.jsonl (loop.report); the page needs no server."""

    from slurmagent.supervise.report import write_report

    if args.output is not None:
        check_output_dir(args.output, "--output", SweepStateError)
    report = write_report(sweep_of(args), args.output)
    print(
        f"wrote {report.page} with {len(report.images)} plot(s) ({report.curves} of {report.tasks} task(s) "
        f"reported metrics); open it in a browser: file://{report.page.absolute()}"
    )
    return EXIT_OK
