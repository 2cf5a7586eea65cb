"""One entry point: `slurmagent …` and `python -m slurmagent …`.

A first word that is a subcommand (status, watch, cancel, render, version) runs it;
anything else goes to Hydra (`+experiment=x -m a=1,2`, `--help`, `--info plugins`).
Returns an exit code: 0 ok, 1 a task or command failed, 2 bad input (nothing was done).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from slurmagent.errors import SlurmAgentError
from slurmagent.safety import cli as safety_cli

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


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
    sys.argv = [sys.argv[0] if sys.argv else "slurmagent", *hoist_flags(argv)]
    main = hydra.main(version_base="1.3", config_path="pkg://slurmagent.conf", config_name="config")(run_task)
    try:
        main()
    except SlurmAgentError as exc:
        print(f"slurmagent: error: {exc}", file=sys.stderr)
        from slurmagent.errors import ConfigError, SlurmUnavailableError

        return EXIT_BAD_INPUT if isinstance(exc, (ConfigError, SlurmUnavailableError)) else EXIT_FAILED
    except (HydraException, OmegaConfBaseException) as exc:
        print(f"slurmagent: error: {config_error(exc) or exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
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


# -- subcommands --------------------------------------------------------------------------
def cmd_status(args: argparse.Namespace) -> int:
    from rich.console import Console

    from slurmagent.launch.backend import SubmititResubmitter
    from slurmagent.supervise.state import SweepStore
    from slurmagent.supervise.supervisor import Supervisor, sweep_table

    if args.refresh:
        Supervisor(args.sweep_dir, resubmit=SubmititResubmitter()).poll_once()
    state = SweepStore(args.sweep_dir).load()
    if args.json:
        out = {
            "sweep_dir": state.sweep_dir,
            "backend": state.backend,
            "counts": state.counts(),
            "done": state.done,
            "tasks": [
                {
                    "index": t.index,
                    "overrides": t.overrides,
                    "state": t.state,
                    "job_id": t.job_id,
                    "attempts": [a.__dict__ for a in t.attempts],
                    "result": t.result,
                    "error": t.error,
                    "diagnosis": t.diagnosis,
                }
                for t in state.tasks
            ],
        }
        print(json.dumps(out, indent=1, default=str))
    else:
        Console().print(sweep_table(state, max_rows=args.rows))
    return EXIT_OK


def cmd_watch(args: argparse.Namespace) -> int:
    from rich.console import Console

    from slurmagent.launch.backend import SubmititResubmitter
    from slurmagent.supervise.supervisor import Supervisor, sweep_table

    sup = Supervisor(args.sweep_dir, poll_interval_s=args.interval, resubmit=SubmititResubmitter())
    state = sup.wait(timeout_s=args.timeout)
    Console().print(sweep_table(state))
    if not state.done:
        print(
            f"slurmagent: watch timed out with {sum(not t.done for t in state.tasks)} task(s) unfinished",
            file=sys.stderr,
        )
        return EXIT_FAILED
    return EXIT_OK if all(t.state == "COMPLETED" for t in state.tasks) else EXIT_FAILED


def cmd_cancel(args: argparse.Namespace) -> int:
    from slurmagent.slurm.seam import SlurmCLI
    from slurmagent.supervise.state import SweepStore

    store = SweepStore(args.sweep_dir)
    with store.edit() as state:
        live = [t for t in state.tasks if not t.done]
        if state.backend == "slurm":
            SlurmCLI().cancel(state.array_ids)
        else:
            for t in live:
                if t.job_id and _is_our_local_task(t.job_id):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(t.job_id), signal.SIGTERM)
        for t in live:
            t.state = "CANCELLED"
            t.error = "CANCELLED by slurmagent cancel"
    print(f"cancelled {len(live)} unfinished task(s) of {args.sweep_dir}")
    return EXIT_OK


def _is_our_local_task(pid: str) -> bool:
    """True only if `pid` still runs a submitit task (a pid may have been reused since)."""
    try:
        cmdline = Path(f"/proc/{int(pid)}/cmdline").read_bytes()
    except (OSError, ValueError):
        return False
    return b"submitit" in cmdline


def cmd_render(args: argparse.Namespace) -> int:
    from slurmagent.render import render_cli

    return render_cli(args.output, args.overrides, args.mode)


def cmd_doctor(args: argparse.Namespace) -> int:
    """Diagnose a finished job (by Slurm id) or every failed task of a sweep directory."""
    from slurmagent.recovery.diagnose import Diagnosis, diagnose
    from slurmagent.slurm.seam import SlurmCLI
    from slurmagent.supervise.recover import collect_logs
    from slurmagent.supervise.state import SweepStore

    target = str(args.target)
    found: list[tuple[str, Diagnosis]] = []
    if Path(target).is_dir():
        state = SweepStore(target).load()
        for t in state.tasks:
            if t.state != "COMPLETED" and t.done and t.job_id:
                found.append((f"task {t.index} ({t.job_id}, {t.state})", diagnose(t.state, collect_logs(state, t))))
    else:
        slurm = SlurmCLI()
        status = slurm.statuses([target]).get(target)
        if status is None:
            print(f"slurmagent: error: Slurm accounting knows no job {target}", file=sys.stderr)
            return EXIT_BAD_INPUT
        logs: dict[str, str] = {}
        for key, value in slurm.job_fields(target).items():
            if key in ("StdErr", "StdOut") and value:
                # the batch log, and beside it the job steps' logs (submitit: <id>_<rank>_log.err)
                for path in {Path(value), *Path(value).parent.glob(f"{target}_*log.*")}:
                    if path.is_file():
                        logs[str(path)] = path.read_text(errors="replace")[-200_000:]
                logs.update(_result_logs(Path(value).parent, target))
        found.append(
            (
                f"job {target} ({status.state}, exit {status.exit_code}, nodes {status.nodes})",
                diagnose(status.state, logs),
            )
        )
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


def _result_logs(folder: Path, job_id: str) -> dict[str, str]:
    """A slurmagent job's own record of its failure: the error in its result file and the
    logs in its output directory (Hydra's job log, a command's stderr)."""
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
            for name in ("command.stderr", "app.log"):
                path = Path(str(output_dir.output_dir)) / name
                if path.is_file():
                    out[str(path)] = path.read_text(errors="replace")[-200_000:]
    return out


def cmd_skill(args: argparse.Namespace) -> int:
    """`slurmagent skill --list` / `slurmagent skill NAME [args] [--json]`: Nagios exit codes
    (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN; an unknown skill or bad argument is UNKNOWN)."""
    from slurmagent.skills.cli import skill_main

    return skill_main(args.list, args.json, args.name, args.args)


def cmd_version(args: argparse.Namespace) -> int:
    from slurmagent import __version__

    print(__version__)
    return EXIT_OK


def _parser() -> tuple[argparse.ArgumentParser, dict[str, Callable[[argparse.Namespace], int]]]:
    p = argparse.ArgumentParser(prog="slurmagent", description="slurmagent subcommands (anything else goes to Hydra)")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("status", help="print a sweep's table")
    s.add_argument("sweep_dir", type=Path)
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("--refresh", action="store_true", help="poll Slurm once before printing")
    s.add_argument("--rows", type=int, default=100)
    w = sub.add_parser("watch", help="re-attach to a sweep and collect its results")
    w.add_argument("sweep_dir", type=Path)
    w.add_argument("--interval", type=float, default=2.0)
    w.add_argument("--timeout", type=float, default=None)
    c = sub.add_parser("cancel", help="cancel a sweep's unfinished tasks")
    c.add_argument("sweep_dir", type=Path)
    r = sub.add_parser("render", help="write a standalone sbatch script from sbatch_templates/")
    r.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. +experiment=digits_mlp optim.lr=1e-3")
    r.add_argument("-o", "--output", type=Path, default=None, help="directory to write into (default: ./render/<name>)")
    r.add_argument(
        "--mode",
        choices=("python", "command"),
        default=None,
        help="how the job starts: through slurmagent's runtime (python) or the task's command line",
    )
    dr = sub.add_parser("doctor", help="diagnose a finished job (JOB_ID) or a sweep's failed tasks (SWEEP_DIR)")
    dr.add_argument("target", help="a Slurm job id (123 or 123_4) or a sweep directory")
    dr.add_argument("--json", action="store_true")
    sub.add_parser("version", help="print the version")
    sk = sub.add_parser("skill", help="run a skill (health, validation, resume…): NAME [args] --json, or --list")
    sk.add_argument("--list", action="store_true", help="list the registered skills")
    sk.add_argument("--json", action="store_true", help="print the result as JSON")
    sk.add_argument("name", nargs="?", help="the skill to run")
    sk.add_argument("args", nargs=argparse.REMAINDER, help="the skill's own arguments (see NAME --help)")
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {
        "status": cmd_status,
        "watch": cmd_watch,
        "cancel": cmd_cancel,
        "render": cmd_render,
        "version": cmd_version,
        "doctor": cmd_doctor,
        "skill": cmd_skill,
    }
    handlers.update(safety_cli.add_parsers(sub))  # audit, approvals, approve, reject, pause, resume, replay
    return p, handlers


SUBCOMMANDS = ("status", "watch", "cancel", "render", "version", "doctor", "skill", *safety_cli.COMMANDS)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in SUBCOMMANDS:
        parser, handlers = _parser()
        ns = parser.parse_args(args)
        try:
            return handlers[ns.cmd](ns)
        except SlurmAgentError as exc:
            print(f"slurmagent: error: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        except Exception as exc:  # a config that does not compose (render, skill): one line, exit 2
            if type(exc).__module__.split(".")[0] not in ("hydra", "omegaconf"):
                raise
            from slurmagent.config import config_error

            print(f"slurmagent: error: {config_error(exc) or exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
    return _hydra(args)
