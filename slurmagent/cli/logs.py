"""`slurmagent logs`: where a sweep's logs are, one task's logs (every run), or follow them."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from slurmagent.cli.args import NEWEST_HELP, sweep_of
from slurmagent.cli.exits import EXIT_FAILED, EXIT_OK
from slurmagent.commands import slurmagent_command
from slurmagent.errors import SweepStateError


def logs_args(lg: argparse.ArgumentParser) -> None:
    lg.add_argument("sweep_dir", type=Path, nargs="?", default=None, help=f"{NEWEST_HELP}; `logs 3`: its task 3")
    lg.add_argument("task", nargs="?", type=int, default=None, help="a task's index (the # column of status)")
    lg.add_argument("--follow", "-f", action="store_true", help="keep printing new lines until the task ends")
    lg.add_argument("--tail", type=int, default=200, help="last lines of each file (0 = all; default 200)")
    lg.add_argument("--interval", type=float, default=1.0, help="seconds between reads with --follow")
    lg.add_argument("--rows", type=int, default=100, help="tasks listed without TASK (default 100)")


def logs(args: argparse.Namespace) -> int:
    """Without TASK: one line per task with its log files. With TASK: each Slurm job's stdout and stderr
    (a requeued run appends to its job's files), then the task's own logs; --follow keeps printing
    what they add, through new attempts, until the task ends."""

    import time

    from slurmagent.supervise.state import SweepStore
    from slurmagent.supervise.views import log_files, tail_lines

    digits = args.sweep_dir is not None and re.fullmatch(r"\d+", str(args.sweep_dir))
    if args.task is None and digits and not (args.sweep_dir / "sweep.json").exists():
        args.task, args.sweep_dir = int(str(args.sweep_dir)), None  # `logs 3`: task 3 of the newest sweep
    store = SweepStore(sweep_of(args))
    state = store.load()
    if args.task is None:
        for t in state.tasks[: args.rows]:
            files = log_files(state, t)
            print(f"task {t.index} ({t.state}): " + (", ".join(str(p) for _, p in files) or "no log yet"))
        if len(state.tasks) > args.rows:
            print(f"… {len(state.tasks) - args.rows} more task(s) (--rows)")
        print(f"one task's logs: {slurmagent_command('logs', args.sweep_dir)} TASK [--follow]")
        return EXIT_OK
    task = next((t for t in state.tasks if t.index == args.task), None)
    if task is None:
        indices = [t.index for t in state.tasks]
        where = f"its tasks are {min(indices)}–{max(indices)}" if indices else "it has no task"
        raise SweepStateError(f"task {args.task} is not in {args.sweep_dir}; {where}")
    sizes: dict[Path, int] = {}
    for label, path in log_files(state, task):
        print(f"==> {label}: {path} <==")
        text = tail_lines(path, args.tail)
        print(text, end="" if text.endswith("\n") or not text else "\n")
        sizes[path] = path.stat().st_size
    if not args.follow:
        return EXIT_OK
    while True:  # like tail -f over the task's files, new attempts included, until the task is done
        time.sleep(args.interval)
        state = store.load()
        task = next(t for t in state.tasks if t.index == args.task)
        for label, path in log_files(state, task):
            size = path.stat().st_size
            if size > sizes.get(path, 0):
                with open(path, "rb") as fh:
                    fh.seek(sizes.get(path, 0))
                    chunk = fh.read().decode(errors="replace")
                print(f"==> {label} <==\n{chunk}", end="" if chunk.endswith("\n") else "\n", flush=True)
            sizes[path] = size
        if task.done:
            print(f"task {task.index} ended {task.state}")
            return EXIT_OK if task.state == "COMPLETED" else EXIT_FAILED
