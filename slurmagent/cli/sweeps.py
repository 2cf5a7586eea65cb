"""A sweep's life from the command line: sweeps (list them), status, watch (supervise it to the
end), cancel, supervise (what a detached sweep's supervisor runs)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from slurmagent.cli.args import NEWEST_HELP, SWEEP_HELP, sweep_dir_arg, sweep_of
from slurmagent.cli.exits import EXIT_FAILED, EXIT_OK


def sweeps_args(sw: argparse.ArgumentParser) -> None:
    sw.add_argument("--limit", type=int, default=20, help="at most this many sweeps (default 20)")
    sw.add_argument("--json", action="store_true", help="one JSON object per sweep")


def sweeps(args: argparse.Namespace) -> int:
    """Finds the sweeps under ./multirun (Hydra's default sweep directory) and the ones the launcher
    recorded in your index (in your state directory), wherever they were launched. status, watch,
    logs, results and report take the newest one when no sweep directory is given."""

    import time

    from slurmagent.launch.index import find_sweeps, index_path, shown

    found = find_sweeps(limit=args.limit)
    if args.json:
        for e in found:
            print(
                json.dumps(
                    {
                        "sweep_dir": str(e.path),
                        "launched_at": e.launched_at,
                        "counts": e.counts,
                        "problem": e.problem or None,
                    }
                )
            )
        return EXIT_OK
    if not found:
        print(f"no sweep under ./multirun nor in your index ({index_path()})")
        return EXIT_OK
    for e in found:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.launched_at))
        print(f"{when}  {e.describe_counts():<32}  {shown(e.path)}")
    return EXIT_OK


def status_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("sweep_dir", type=Path, nargs="?", default=None, help=NEWEST_HELP)
    s.add_argument("--json", action="store_true", help="every task as JSON, for scripts")
    s.add_argument("--refresh", action="store_true", help="poll Slurm once before printing")
    s.add_argument("--rows", type=int, default=100, help="at most this many table rows (default 100)")


def status(args: argparse.Namespace) -> int:
    """Reads sweep.json; with --refresh it first polls Slurm once (one sacct call)."""

    from slurmagent.notify.outbox import read_ledger, unsent
    from slurmagent.primitives.code import read_snapshot
    from slurmagent.supervise.state import SweepStore, task_json
    from slurmagent.supervise.views import (
        Summary,
        health_note,
        progress,
        runs,
        started,
        sweep_table,
        terminal,
        track_state,
    )

    sweep_of(args)
    if args.refresh:  # one poll, by the sweep's supervisor's rules: only when none acts on it now
        from slurmagent.launch.backend import SubmititSubmitter
        from slurmagent.supervise.lead import Lead
        from slurmagent.supervise.supervisor import Supervisor

        lead = Lead(args.sweep_dir, "status --refresh")
        if lead.take():
            try:
                Supervisor(args.sweep_dir, submit=SubmititSubmitter()).poll_once()
            finally:
                lead.release()
        else:
            print(f"slurmagent: {lead.describe_holder()} supervises this sweep; sweep.json is current", file=sys.stderr)
    # each task's index and state only; whole records for the rows shown (or, --json, one at a time)
    scan = SweepStore(args.sweep_dir).scan()
    state = scan.state
    if args.json:  # streamed: one task per line, never the whole sweep as one string
        out = sys.stdout
        snapshot = read_snapshot(state.sweep_dir)
        head = {"sweep_dir": state.sweep_dir, "backend": state.backend, "counts": scan.counts(), "done": scan.done}
        head["code"] = dataclasses.asdict(snapshot) if snapshot is not None else None
        # notify.*: the messages a channel has not taken (yet); None when the sweep tells nobody
        head["messages_unsent"] = (
            [dataclasses.asdict(u) for u in unsent(read_ledger(state.sweep_dir))] if state.notify else None
        )
        out.write("{\n" + "".join(f" {json.dumps(k)}: {json.dumps(v)},\n" for k, v in head.items()) + ' "tasks": [')
        ran = started(state.sweep_dir)
        for n, t in enumerate(scan.tasks()):
            task = {
                "index": t.index,
                "overrides": t.overrides,
                "state": t.state,
                "runs": runs(t),
                "job_id": t.job_id,
                "attempts": task_json(t)["attempts"],
                "result": t.result,
                "error": t.error,
                "diagnosis": t.diagnosis,
                "health": (health_note(state, t) or None) if t.index in ran else None,
                "progress": progress(state, t) if t.state == "RUNNING" else None,  # the table's step/metrics/speed
                "track": track_state(state, t) if t.index in ran else None,  # its trackers' runs, what is not sent
            }
            out.write(("\n  " if n == 0 else ",\n  ") + json.dumps(task, default=str))
        out.write(("\n ]" if scan.total else "]") + f',\n "schedule": {json.dumps(state.schedule, default=str)}\n}}\n')
    else:
        state.tasks = scan.page(args.rows)
        common = frozenset(scan.common_overrides()).intersection(*(t.overrides for t in state.tasks))
        summary = Summary(scan.counts(), scan.total, common, scan.indices)
        console = terminal()
        console.print(sweep_table(state, max_rows=args.rows, summary=summary))
        snapshot = read_snapshot(state.sweep_dir)
        if snapshot is not None:
            console.print(snapshot.describe(), markup=False, highlight=False)
    return EXIT_OK


def watch_args(w: argparse.ArgumentParser) -> None:
    w.add_argument("sweep_dir", type=Path, nargs="?", default=None, help=NEWEST_HELP)
    w.add_argument("--interval", type=float, default=2.0, help="seconds between polls (grows while nothing changes)")
    w.add_argument("--timeout", type=float, default=None, help="give up after this many seconds (exit 1)")


def watch(args: argparse.Namespace) -> int:
    """Use it after the launcher died (or was never kept): it polls Slurm, recovers failed tasks
    as the launcher would, and exits 0 when every task completed, 1 otherwise."""

    from slurmagent.launch.backend import SubmititSubmitter
    from slurmagent.supervise.supervisor import Supervisor
    from slurmagent.supervise.views import sweep_table, terminal

    sup = Supervisor(sweep_of(args), poll_interval_s=args.interval, submit=SubmititSubmitter())
    state = sup.wait(timeout_s=args.timeout)
    terminal().print(sweep_table(state))
    if not state.done:
        print(
            f"slurmagent: watch timed out with {sum(not t.done for t in state.tasks)} task(s) unfinished",
            file=sys.stderr,
        )
        return EXIT_FAILED
    return EXIT_OK if all(t.state == "COMPLETED" for t in state.tasks) else EXIT_FAILED


def cancel_args(c: argparse.ArgumentParser) -> None:
    c.add_argument("sweep_dir", type=Path, help=f"{SWEEP_HELP} (always given: cancel never guesses)")


def cancel(args: argparse.Namespace) -> int:
    """Completed tasks and their results stay."""

    from slurmagent.slurm.seam import SlurmCLI
    from slurmagent.supervise.control import cancel_sweep
    from slurmagent.supervise.state import SweepStore

    SweepStore(sweep_dir_arg(args.sweep_dir)).load()  # not a sweep: a clear error, nothing cancelled
    n = cancel_sweep(args.sweep_dir, SlurmCLI(), "by slurmagent cancel")
    print(f"cancelled {n} unfinished task(s) of {args.sweep_dir}")
    return EXIT_OK


def supervise_args(sv: argparse.ArgumentParser) -> None:
    sv.add_argument("sweep_dir", type=Path, help=SWEEP_HELP)


def supervise(args: argparse.Namespace) -> int:
    """Started by `-m --detach`; like watch, but quiet, requeue-safe in a Slurm job, and exiting 0 once the
    sweep is done. Only one supervisor acts on a sweep at a time (a lock); the others follow."""

    from slurmagent.launch.backend import SubmititSubmitter
    from slurmagent.supervise.detach import run_supervisor

    return run_supervisor(sweep_dir_arg(args.sweep_dir), SubmititSubmitter())
