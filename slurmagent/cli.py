"""One entry point: `slurmagent …` and `python -m slurmagent …`.

A first word that is a subcommand (status, watch, cancel, render, sweeps, …) runs it;
anything else goes to Hydra (`+experiment=x -m a=1,2`, `--help`, `--info plugins`).
Returns an exit code: 0 ok, 1 a task or command failed, 2 bad input (nothing was done):
then one line on stderr, naming the key, value or path and what would be valid.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from slurmagent.commands import slurmagent_command
from slurmagent.errors import ConfigError, SlurmAgentError, SweepStateError
from slurmagent.safety import cli as safety_cli
from slurmagent.safety.cli import check_output_dir, check_path, shown_path

if TYPE_CHECKING:
    from slurmagent.slurm.seam import SlurmCLI

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
DETACH_FLAGS = ("--detach", "-d")  # = hydra.launcher.detach=true: submit, leave it to a supervisor, return


def one_line(text: object) -> str:
    """An error message as one line: Hydra's own span several (a hint; a heading ending in ':'
    and its indented items, which become `heading: a, b, c`)."""
    out, items = "", False
    for raw in str(text).splitlines():
        part = raw.strip()
        if not part:
            continue
        if out.endswith(":") or (items and raw[:1].isspace()):
            out += (", " if items else " ") + part
            items = raw[:1].isspace()
        else:
            out, items = f"{out}; {part}" if out else part, False
    return out


def _slurmagent_cause(exc: BaseException) -> SlurmAgentError | None:
    """Our own error inside one Hydra wrapped (a launcher or sweeper refusing its options
    while Hydra instantiates it: "Error in call to target …")."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, SlurmAgentError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _bare_word(arg: str) -> bool:
    """A word that is neither a flag nor a Hydra override (key=value, +key=…, ~key): a command."""
    return not arg.startswith(("-", "+", "~")) and "=" not in arg


def _hydra(argv: list[str]) -> int:
    import hydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from slurmagent.config import config_error
    from slurmagent.job.task import run_task

    # let exceptions reach us, so bad input ends in one clear line instead of a traceback
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    # Hydra's argparse stops at a flag between overrides (`+experiment=x -m a=1,2`): put the
    # flags first, keeping their values, so that both orders work as users expect
    if any(a in DETACH_FLAGS for a in argv) and not {"-m", "--multirun"} & set(argv):
        print("slurmagent: error: --detach applies to sweeps: add -m (a one-task sweep is fine)", file=sys.stderr)
        return EXIT_BAD_INPUT
    if any(a in DETACH_FLAGS for a in argv):  # slurmagent's own flag: the launcher option, spelt short
        argv = [*(a for a in argv if a not in DETACH_FLAGS), "hydra.launcher.detach=true"]
    sys.argv = [sys.argv[0] if sys.argv else "slurmagent", *hoist_flags(argv)]
    main = hydra.main(version_base="1.3", config_path="pkg://slurmagent.conf", config_name="config")(run_task)
    try:
        main()
    except (SlurmAgentError, HydraException, OmegaConfBaseException) as exc:
        own = _slurmagent_cause(exc)
        if own is None:
            print(f"slurmagent: error: {one_line(config_error(exc) or exc)}", file=sys.stderr)
            return EXIT_BAD_INPUT
        from slurmagent.errors import SlurmUnavailableError, SubmissionRefused, SweepRefusedError

        # refused: Slurm said no to the request itself
        bad_input = isinstance(own, (ConfigError, SlurmUnavailableError, SubmissionRefused, SweepRefusedError))
        # bad input: one line; a failed task's error keeps its lines (its traceback)
        print(f"slurmagent: error: {one_line(own) if bad_input else own}", file=sys.stderr)
        return EXIT_BAD_INPUT if bad_input else EXIT_FAILED
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else EXIT_FAILED
    return EXIT_OK


_FLAGS_WITH_VALUE = {
    "--cfg",
    "-c",
    "--package",
    "-p",
    "--config-path",
    "-cp",
    "--config-name",
    "-cn",
    "--config-dir",
    "-cd",
    "--experimental-rerun",
    "--info",
    "-i",
    "--shell-completion",
    "-sc",
}


_INFO_CHOICES = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")


def hoist_flags(argv: list[str]) -> list[str]:
    flags: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("-") and "=" not in a:
            flags.append(a)
            takes = a in _FLAGS_WITH_VALUE and a not in ("--info", "-i", "--shell-completion", "-sc")
            optional = a in ("--info", "-i")
            has_next = i + 1 < len(argv) and not argv[i + 1].startswith("-")
            if has_next and (takes or (optional and argv[i + 1] in _INFO_CHOICES)):
                flags.append(argv[i + 1])
                i += 1
        else:
            rest.append(a)
        i += 1
    return [*flags, *rest]


# -- sweep directories named, or the newest -----------------------------------------------
JOB_ID = re.compile(r"\d+(_\d+)?")  # a Slurm job (123), array task (123_4) or array (123): doctor's other target


def sweep_dir_arg(path: Path) -> Path:
    """A sweep directory named on the command line, checked before anything reads or writes
    it: a SweepStateError naming it (missing, a file, a symlink loop, unreadable, no sweep.json)."""
    from slurmagent.supervise.state import STATE_FILE

    if not os.path.lexists(path):
        raise SweepStateError(
            f"{shown_path(path)} is not a slurmagent sweep directory: no such directory, so no {STATE_FILE} "
            "(slurmagent sweeps lists yours)"
        )
    check_path(path, "dir", "sweep directory", SweepStateError)
    state = path / STATE_FILE
    try:
        state.stat()
    except FileNotFoundError:
        raise SweepStateError(
            f"{shown_path(path)} is not a slurmagent sweep directory: no {STATE_FILE} in it "
            "(slurmagent sweeps lists yours)"
        ) from None
    except OSError:
        pass  # check_path names what is wrong
    check_path(state, "file", "sweep state", SweepStateError)
    return path


def newest_sweep(command: str) -> Path:
    """The newest sweep (the first line of `slurmagent sweeps`), said on stderr."""
    from slurmagent.launch.index import find_sweeps, index_path, shown

    found = find_sweeps(limit=1)
    if not found:
        raise SweepStateError(
            f"no sweep directory given, and no sweep under ./multirun nor in your index ({index_path()}); "
            f"give one: slurmagent {command} DIR"
        )
    print(f"slurmagent: {command}: the newest sweep, {shown(found[0].path)}", file=sys.stderr)
    return found[0].path


def _sweep(args: argparse.Namespace) -> Path:
    """args.sweep_dir checked, or the newest sweep when none was given; set on args too."""
    args.sweep_dir = newest_sweep(args.cmd) if args.sweep_dir is None else sweep_dir_arg(args.sweep_dir)
    return args.sweep_dir  # type: ignore[no-any-return]


# -- subcommands --------------------------------------------------------------------------
def cmd_sweeps(args: argparse.Namespace) -> int:
    """Recent sweeps, newest first: when, the tasks' states, where."""
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


def cmd_status(args: argparse.Namespace) -> int:

    from slurmagent.supervise.state import SweepStore, task_json
    from slurmagent.supervise.views import Summary, health_note, runs, started, sweep_table, terminal

    _sweep(args)
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
        head = {"sweep_dir": state.sweep_dir, "backend": state.backend, "counts": scan.counts(), "done": scan.done}
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
            }
            out.write(("\n  " if n == 0 else ",\n  ") + json.dumps(task, default=str))
        out.write(("\n ]" if scan.total else "]") + f',\n "schedule": {json.dumps(state.schedule, default=str)}\n}}\n')
    else:
        state.tasks = scan.page(args.rows)
        common = frozenset(scan.common_overrides()).intersection(*(t.overrides for t in state.tasks))
        summary = Summary(scan.counts(), scan.total, common, scan.indices)
        terminal().print(sweep_table(state, max_rows=args.rows, summary=summary))
    return EXIT_OK


def cmd_watch(args: argparse.Namespace) -> int:

    from slurmagent.launch.backend import SubmititSubmitter
    from slurmagent.supervise.supervisor import Supervisor
    from slurmagent.supervise.views import sweep_table, terminal

    sup = Supervisor(_sweep(args), poll_interval_s=args.interval, submit=SubmititSubmitter())
    state = sup.wait(timeout_s=args.timeout)
    terminal().print(sweep_table(state))
    if not state.done:
        print(
            f"slurmagent: watch timed out with {sum(not t.done for t in state.tasks)} task(s) unfinished",
            file=sys.stderr,
        )
        return EXIT_FAILED
    return EXIT_OK if all(t.state == "COMPLETED" for t in state.tasks) else EXIT_FAILED


def cmd_cancel(args: argparse.Namespace) -> int:
    from slurmagent.slurm.seam import SlurmCLI
    from slurmagent.supervise.control import cancel_sweep
    from slurmagent.supervise.state import SweepStore

    SweepStore(sweep_dir_arg(args.sweep_dir)).load()  # not a sweep: a clear error, nothing cancelled
    n = cancel_sweep(args.sweep_dir, SlurmCLI(), "by slurmagent cancel")
    print(f"cancelled {n} unfinished task(s) of {args.sweep_dir}")
    return EXIT_OK


def cmd_supervise(args: argparse.Namespace) -> int:
    from slurmagent.launch.backend import SubmititSubmitter
    from slurmagent.supervise.detach import run_supervisor

    return run_supervisor(sweep_dir_arg(args.sweep_dir), SubmititSubmitter())


def cmd_plan(args: argparse.Namespace) -> int:
    from slurmagent.schedule.cli import plan_cli

    return plan_cli(
        args.overrides,
        as_json=args.json,
        config_dir=args.config_dir,
        multirun=args.multirun,
        config_name=args.config_name,
        config_path=args.config_path,
    )


def cmd_render(args: argparse.Namespace) -> int:
    from slurmagent.render import render_cli

    if args.output is not None:
        check_output_dir(args.output, "--output", ConfigError)
    return render_cli(args.output, args.overrides, args.mode, config_dir=args.config_dir)


def cmd_doctor(args: argparse.Namespace) -> int:
    """Diagnose a finished job (by Slurm id) or every failed task of a sweep directory."""
    from slurmagent.recovery.diagnose import Diagnosis, diagnose
    from slurmagent.slurm.seam import TERMINAL_STATES, SlurmCLI
    from slurmagent.supervise.recover import collect_logs
    from slurmagent.supervise.state import SweepStore

    target = str(args.target)
    found: list[tuple[str, Diagnosis]] = []
    # a job id unless a sweep directory of that name is here; anything else is a path (from the cwd)
    if not JOB_ID.fullmatch(target) or (Path(target) / "sweep.json").exists():
        state = SweepStore(sweep_dir_arg(Path(target))).load()
        for t in state.tasks:
            if t.state != "COMPLETED" and t.done and t.job_id:
                found.append((f"task {t.index} ({t.job_id}, {t.state})", diagnose(t.state, collect_logs(state, t))))
    else:
        slurm = SlurmCLI()
        if not slurm.available():
            print(
                f"slurmagent: error: Slurm does not answer here, so job {target} cannot be looked up; "
                "for a local run, pass its sweep directory: slurmagent doctor DIR",
                file=sys.stderr,
            )
            return EXIT_BAD_INPUT
        statuses = slurm.statuses([target])
        # an array's own id (what squeue shows first) stands for all of its tasks
        jobs = (
            [statuses[target]] if target in statuses else [s for k, s in statuses.items() if k.startswith(f"{target}_")]
        )
        if not jobs:
            print(f"slurmagent: error: Slurm accounting knows no job {target}", file=sys.stderr)
            return EXIT_BAD_INPUT
        ended_ok = [s for s in jobs if s.state == "COMPLETED"]
        for status in jobs:
            if status.state == "COMPLETED" or status.state not in TERMINAL_STATES:
                continue
            found.append(
                (
                    f"job {status.job_id} ({status.state}, exit {status.exit_code}, nodes {status.nodes})",
                    diagnose(status.state, _job_logs(slurm, status.job_id)),
                )
            )
        if not found:
            running = [s for s in jobs if s.state not in TERMINAL_STATES]
            print(
                f"nothing to diagnose: {len(ended_ok)} of {len(jobs)} job(s) of {target} completed"
                + (f", {len(running)} not finished yet ({running[0].state})" if running else "")
            )
            return EXIT_OK
    if not found:
        print("no failed task: nothing to diagnose")
        return EXIT_OK
    for name, diag in found:
        if args.json:
            print(json.dumps({"target": name, **diag.to_json()}))
            continue
        print(f"{name}: {diag.summary}")
        print(f"  cause: {diag.cause}; retryable: {diag.retryable}; suggestion: {diag.suggestion}")
        for ev in diag.evidence:
            print(f"  {ev.source}:{ev.line}: {ev.text}")
    return EXIT_FAILED


def _job_logs(slurm: SlurmCLI, job_id: str) -> dict[str, str]:
    """A job's batch log, its steps' logs beside it (submitit: <id>_<rank>_log.err) and
    slurmagent's own record of its failure."""
    logs: dict[str, str] = {}
    for key, value in slurm.job_fields(job_id).items():
        if key in ("StdErr", "StdOut") and value:
            for path in {Path(value), *Path(value).parent.glob(f"{job_id}_*log.*")}:
                if path.is_file():
                    logs[str(path)] = path.read_text(errors="replace")[-200_000:]
            logs.update(_result_logs(Path(value).parent, job_id))
    return logs


def _result_logs(folder: Path, job_id: str) -> dict[str, str]:
    """A slurmagent job's own record of its failure: the error in its result file and the
    logs in its output directory (Hydra's job log, a command's stderr)."""
    from slurmagent.runtime.env import TaskFile
    from slurmagent.supervise.supervisor import read_result, unwrap_return

    out: dict[str, str] = {}
    for pkl in folder.glob(f"{job_id}_*result.pkl"):
        res = read_result(pkl)
        if res is None:
            continue
        kind, value = res
        ok, _, err = unwrap_return(value) if kind == "success" else (False, None, str(value))
        if not ok:
            out[str(pkl)] = err
        output_dir = getattr(getattr(getattr(value, "hydra_cfg", None), "hydra", None), "runtime", None)
        if output_dir is not None:
            for name in (TaskFile.COMMAND_STDERR, "app.log"):
                path = Path(str(output_dir.output_dir)) / name
                if path.is_file():
                    out[str(path)] = path.read_text(errors="replace")[-200_000:]
    return out


def cmd_skill(args: argparse.Namespace) -> int:
    """`slurmagent skill --list` / `slurmagent skill NAME [args] [--json]`: Nagios exit codes
    (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN; an unknown skill or bad argument is UNKNOWN)."""
    from slurmagent.skills.cli import skill_main

    return skill_main(args.list, args.json, args.name, args.args)


def cmd_logs(args: argparse.Namespace) -> int:
    """Where every task's logs are, or one task's logs (every attempt), or follow them."""
    import time

    from slurmagent.supervise.state import SweepStore
    from slurmagent.supervise.views import log_files, tail_lines

    digits = args.sweep_dir is not None and re.fullmatch(r"\d+", str(args.sweep_dir))
    if args.task is None and digits and not (args.sweep_dir / "sweep.json").exists():
        args.task, args.sweep_dir = int(str(args.sweep_dir)), None  # `logs 3`: task 3 of the newest sweep
    store = SweepStore(_sweep(args))
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


def cmd_results(args: argparse.Namespace) -> int:
    import csv

    from slurmagent.supervise.state import SweepStore
    from slurmagent.supervise.views import columns, result_rows, results_table, terminal

    rows = result_rows(SweepStore(_sweep(args)).load(), args.sort, descending=args.desc)
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


def cmd_report(args: argparse.Namespace) -> int:
    from slurmagent.report import write_report

    if args.output is not None:
        check_output_dir(args.output, "--output", SweepStateError)
    report = write_report(_sweep(args), args.output)
    print(
        f"wrote {report.page} with {len(report.images)} plot(s) ({report.curves} of {report.tasks} task(s) "
        f"reported metrics); open it in a browser: file://{report.page.absolute()}"
    )
    return EXIT_OK


def cmd_version(args: argparse.Namespace) -> int:
    from slurmagent import __version__

    print(__version__)
    return EXIT_OK


def _parser() -> tuple[argparse.ArgumentParser, dict[str, Callable[[argparse.Namespace], int]]]:
    p = argparse.ArgumentParser(prog="slurmagent", description="slurmagent subcommands (anything else goes to Hydra)")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def command(name: str, summary: str, description: str = "") -> argparse.ArgumentParser:
        return sub.add_parser(
            name,
            help=summary,
            description=f"{summary}.\n\n{description}".rstrip(),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    sweep_help = "a sweep directory (the multirun/<date>/<time> folder the launcher printed)"
    newest_help = f"{sweep_help}; default: the newest sweep (slurmagent sweeps lists them)"
    config_dir_help = "a directory of your own configs, searched as with Hydra's --config-dir (e.g. conf)"
    sw = command(
        "sweeps",
        "list your recent sweeps, newest first: the tasks' states and the sweep directory",
        "Finds the sweeps under ./multirun (Hydra's default sweep directory) and the ones the launcher\n"
        "recorded in your index (in your state directory), wherever they were launched. status, watch,\n"
        "logs, results and report take the newest one when no sweep directory is given.",
    )
    sw.add_argument("--limit", type=int, default=20, help="at most this many sweeps (default 20)")
    sw.add_argument("--json", action="store_true", help="one JSON object per sweep")
    s = command(
        "status",
        "print a sweep's table: every task's state, runs, result or reason",
        "Reads sweep.json; with --refresh it first polls Slurm once (one sacct call).",
    )
    s.add_argument("sweep_dir", type=Path, nargs="?", default=None, help=newest_help)
    s.add_argument("--json", action="store_true", help="every task as JSON, for scripts")
    s.add_argument("--refresh", action="store_true", help="poll Slurm once before printing")
    s.add_argument("--rows", type=int, default=100, help="at most this many table rows (default 100)")
    w = command(
        "watch",
        "re-attach to a sweep: supervise it to the end and collect its results",
        "Use it after the launcher died (or was never kept): it polls Slurm, recovers failed tasks\n"
        "as the launcher would, and exits 0 when every task completed, 1 otherwise.",
    )
    w.add_argument("sweep_dir", type=Path, nargs="?", default=None, help=newest_help)
    w.add_argument("--interval", type=float, default=2.0, help="seconds between polls (grows while nothing changes)")
    w.add_argument("--timeout", type=float, default=None, help="give up after this many seconds (exit 1)")
    c = command(
        "cancel",
        "cancel a sweep's unfinished tasks (and its detached supervisor)",
        "Completed tasks and their results stay.",
    )
    c.add_argument("sweep_dir", type=Path, help=f"{sweep_help} (always given: cancel never guesses)")
    sv = command(
        "supervise",
        "what a detached sweep's supervisor runs (a Slurm job or a process): supervise it to the end",
        "Started by `-m --detach`; like watch, but quiet, requeue-safe in a Slurm job, and exiting 0 once the\n"
        "sweep is done. Only one supervisor acts on a sweep at a time (a lock); the others follow.",
    )
    sv.add_argument("sweep_dir", type=Path, help=sweep_help)
    pl = command(
        "plan",
        "show what a job would ask Slurm for, and why: GPU type, partition, time, memory, start, cost",
        "Example: slurmagent plan +experiment=digits_mlp resources.gpus=1 resources.gpu_type=auto resources.time=auto\n"
        "Takes the launcher's arguments (-cd, -cn, -cp, -m with a sweep's values: each distinct job planned once).\n"
        "A table of candidates (GPU type, partition, GPU memory, predicted run time, --time, Slurm's predicted start\n"
        "from `sbatch --test-only`, GPU-h and cost on one basis) and the choice; nothing is submitted.",
    )
    # the launcher's arguments, flags anywhere among the overrides (schedule/cli.py reads those after the first)
    pl.add_argument("overrides", nargs=argparse.REMAINDER, help="what python -m slurmagent takes: Hydra overrides")
    pl.add_argument("--config-dir", "-cd", type=Path, default=None, help=config_dir_help)
    pl.add_argument("--config-name", "-cn", default=None, help="the primary config's name, as for the launcher")
    pl.add_argument("--config-path", "-cp", default=None, help="the primary config's path, as for the launcher")
    pl.add_argument("--multirun", "-m", action="store_true", help="a sweep: plan each distinct job of it once")
    pl.add_argument("--detach", "-d", action="store_true", help="accepted as the launcher does; the plan is the same")
    pl.add_argument("--json", action="store_true", help="the plan as JSON, for scripts")
    r = command(
        "render",
        "write a standalone sbatch script (and its config) for a login node",
        "Example: slurmagent render +experiment=digits_mlp optim.lr=1e-3 -o run1 && sbatch run1/job.sbatch",
    )
    r.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. +experiment=digits_mlp optim.lr=1e-3")
    r.add_argument("-o", "--output", type=Path, default=None, help="directory to write into (default: ./render/<name>)")
    r.add_argument("--config-dir", "-cd", type=Path, default=None, help=config_dir_help)
    r.add_argument(
        "--mode",
        choices=("python", "command"),
        default=None,
        help="how the job starts: through slurmagent's runtime (python) or the task's command line",
    )
    dr = command(
        "doctor",
        "say why a job or a sweep's tasks failed, and what to do",
        "TARGET is a sweep directory, a Slurm job id (123), an array task (123_4) or an array (123).",
    )
    dr.add_argument("target", type=Path, help="a sweep directory or a Slurm job id (digits, or 123_4)")
    dr.add_argument("--json", action="store_true", help="one JSON object per diagnosed task")
    lg = command(
        "logs",
        "show where a sweep's logs are, or print one task's logs (every attempt), or follow them",
        "Without TASK: one line per task with its log files. With TASK: each Slurm job's stdout and stderr\n"
        "(a requeued run appends to its job's files), then the task's own logs; --follow keeps printing\n"
        "what they add, through new attempts, until the task ends.",
    )
    lg.add_argument("sweep_dir", type=Path, nargs="?", default=None, help=f"{newest_help}; `logs 3`: its task 3")
    lg.add_argument("task", nargs="?", type=int, default=None, help="a task's index (the # column of status)")
    lg.add_argument("--follow", "-f", action="store_true", help="keep printing new lines until the task ends")
    lg.add_argument("--tail", type=int, default=200, help="last lines of each file (0 = all; default 200)")
    lg.add_argument("--interval", type=float, default=1.0, help="seconds between reads with --follow")
    lg.add_argument("--rows", type=int, default=100, help="tasks listed without TASK (default 100)")
    rs = command(
        "results",
        "one row per task: its varying overrides, state, runs and result values",
        "Example: slurmagent results DIR --sort val_acc --desc   |   slurmagent results DIR --csv > results.csv",
    )
    rs.add_argument("sweep_dir", type=Path, nargs="?", default=None, help=newest_help)
    rs.add_argument("--sort", default=None, help="a column to sort by (a result key such as val_acc, or an override)")
    rs.add_argument("--desc", action="store_true", help="largest first")
    fmt = rs.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="CSV on stdout, one column per override and result key")
    fmt.add_argument("--json", action="store_true", help="one JSON object per task")
    rp = command(
        "report",
        "write an HTML report: a plot of every reported metric over steps (PNGs beside it) and the results",
        "The curves come from each task's metrics.jsonl (loop.report); the page needs no server.",
    )
    rp.add_argument("sweep_dir", type=Path, nargs="?", default=None, help=newest_help)
    rp.add_argument("-o", "--output", type=Path, default=None, help="directory to write into (default: SWEEP/report)")
    command("version", "print the version")
    sk = command(
        "skill",
        "run a skill (health, validation, resume, data): NAME [args], or --list",
        "Exit codes are Nagios': 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN; a bad skill name or argument is 2.\n"
        "`slurmagent skill NAME --help` lists the skill's own arguments.",
    )
    sk.add_argument("--list", action="store_true", help="list the registered skills")
    sk.add_argument("--json", action="store_true", help="print the result as JSON")
    sk.add_argument("name", nargs="?", help="the skill to run")
    sk.add_argument("args", nargs=argparse.REMAINDER, help="the skill's own arguments (see NAME --help)")
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {
        "sweeps": cmd_sweeps,
        "status": cmd_status,
        "watch": cmd_watch,
        "cancel": cmd_cancel,
        "supervise": cmd_supervise,
        "render": cmd_render,
        "plan": cmd_plan,
        "version": cmd_version,
        "doctor": cmd_doctor,
        "skill": cmd_skill,
        "logs": cmd_logs,
        "results": cmd_results,
        "report": cmd_report,
    }
    handlers.update(safety_cli.add_parsers(sub))  # audit, approvals, approve, reject, pause, resume, replay
    return p, handlers


SUBCOMMANDS = (
    "sweeps",
    "status",
    "watch",
    "logs",
    "results",
    "report",
    "cancel",
    "supervise",
    "render",
    "plan",
    "version",
    "doctor",
    "skill",
    *safety_cli.COMMANDS,
)
HELP_WORDS = ("-h", "--help", "help")


def help_page() -> str:
    """`slurmagent --help`: how to run and sweep, and every subcommand in one line each."""
    parser, _ = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    lines = [f"  {c.dest:<10} {c.help}" for c in sub._choices_actions]
    return "\n".join(
        [
            "usage: slurmagent [OVERRIDE ...] [-m]     a run, or a sweep with -m (Hydra overrides: key=value)",
            "       slurmagent COMMAND [ARGS]          one of the commands below",
            "",
            "Run and sweep:",
            "  slurmagent +experiment=digits_mlp                          one run (cluster=local runs it here)",
            "  slurmagent +experiment=digits_mlp -m optim.lr=1e-3,1e-2     a sweep: one Slurm job array",
            "  slurmagent +experiment=digits_mlp -m optim.lr=1e-3 --detach  submit, leave it to a supervisor, return",
            "  slurmagent --cfg job +experiment=digits_mlp                print the composed config",
            "  slurmagent help config                                     the config groups and their defaults",
            "  slurmagent --hydra-help                                    Hydra's own flags",
            "",
            "Commands (slurmagent COMMAND --help for each one's options):",
            *lines,
            "",
            "Exit codes: 0 ok, 1 a task or command failed, 2 bad input (then nothing was submitted).",
        ]
    )


def unknown_command(word: str) -> str:
    import difflib

    close = difflib.get_close_matches(word, [*SUBCOMMANDS, "help"], n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}? " if close else ""
    return (
        f"slurmagent: error: unknown command {word!r}; {hint}commands: {', '.join(SUBCOMMANDS)} "
        "(a Hydra override looks like key=value; slurmagent --help lists both)"
    )


def _path_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Every path-typed argument of every subcommand."""
    found: list[argparse.Action] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _path_actions(sub)
        elif action.type is Path:
            found.append(action)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] and args[0] in HELP_WORDS:
        if args[1:] == ["config"]:
            return _hydra(["--help"])  # Hydra's page for this app: config groups and defaults
        if args[1:2] and args[1] in SUBCOMMANDS:
            return main([args[1], "--help"])
        print(help_page())
        return EXIT_OK
    if args[:1] and args[0] not in SUBCOMMANDS and _bare_word(args[0]):
        print(unknown_command(args[0]), file=sys.stderr)
        return EXIT_BAD_INPUT
    if args and args[0] in SUBCOMMANDS:
        parser, handlers = _parser()
        ns = parser.parse_args(args)
        for action in _path_actions(parser):
            # argparse drops a value of `--`: `--config-dir=--` arrives as [] instead of a path
            if isinstance(getattr(ns, action.dest, None), list) and action.nargs is None:
                flag = action.option_strings[0] if action.option_strings else action.dest
                print(f"slurmagent: error: {flag} needs a path (got '--')", file=sys.stderr)
                return EXIT_BAD_INPUT
        try:
            return handlers[ns.cmd](ns)
        except SlurmAgentError as exc:
            print(f"slurmagent: error: {one_line(exc)}", file=sys.stderr)
            return EXIT_BAD_INPUT
        except Exception as exc:
            if type(exc).__module__.split(".")[0] in ("hydra", "omegaconf"):  # a config that does not compose
                from slurmagent.config import config_error

                own = _slurmagent_cause(exc)
                print(f"slurmagent: error: {one_line(own or config_error(exc) or exc)}", file=sys.stderr)
                return EXIT_BAD_INPUT
            if isinstance(exc, OSError):  # a file the command needed, past the checks of its arguments
                where = f"{exc.filename}: " if exc.filename else ""
                print(f"slurmagent: error: {where}{safety_cli.os_why(exc)}", file=sys.stderr)
                return EXIT_FAILED
            raise
    return _hydra(args)
