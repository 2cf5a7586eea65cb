"""`slurmagent track SWEEP`: send to the trackers what a sweep's tasks did not send (a tracker
was down when a task ended), continuing each task's own tracker run."""

from __future__ import annotations

import argparse
from pathlib import Path

from slurmagent.cli.args import NEWEST_HELP, sweep_of
from slurmagent.cli.exits import EXIT_FAILED, EXIT_OK


def track_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("sweep_dir", type=Path, nargs="?", default=None, help=NEWEST_HELP)
    s.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for each tracker (default 30)")


def track(args: argparse.Namespace) -> int:
    """Each task's trackers (its track.json) are sent the metrics lines they have not taken;
    exits non-zero when a tracker still does not answer."""
    from slurmagent.track.job import sync

    sweep = sweep_of(args)
    behind = 0
    tasks = sorted((p for p in sweep.iterdir() if p.name.isdigit() and p.is_dir()), key=lambda p: int(p.name))
    for task_dir in tasks:
        state = sync(task_dir, args.timeout)
        if state is None:
            continue
        for name, st in state.items():
            if name.startswith("_") or not isinstance(st, dict):
                continue
            late = bool(st.get("behind") or st.get("error"))
            behind += late
            what = (
                f"{st.get('behind')} point(s) not sent: {st.get('error')}"
                if late
                else f"{st.get('points', 0)} point(s)"
            )
            print(f"task {task_dir.name} {name}: {what}")
    return EXIT_FAILED if behind else EXIT_OK
