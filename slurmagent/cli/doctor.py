"""`slurmagent doctor`: why a job or a sweep's tasks failed, and what to do (recovery/diagnose.py
decides; this reads the logs and says it)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from slurmagent.cli.args import CONFIG_DIR_HELP, JOB_ID, check_path, sweep_dir_arg
from slurmagent.cli.exits import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
from slurmagent.errors import ConfigError


def doctor_args(dr: argparse.ArgumentParser) -> None:
    dr.add_argument(
        "target",
        nargs="*",
        help="a sweep directory or a Slurm job id (digits, or 123_4); with --env: the launcher's overrides",
    )
    dr.add_argument("--json", action="store_true", help="one JSON object per diagnosed task")
    dr.add_argument(
        "--env",
        action="store_true",
        help="run the pre-flight probe now on the environment the overrides give (env.*, the partition, GPUs)",
    )
    dr.add_argument("--config-dir", "-cd", type=Path, default=None, help=CONFIG_DIR_HELP)


def doctor_env(overrides: list[str], config_dir: Path | None) -> int:
    """`doctor --env OVERRIDES`: the probe job a launch would run (launch/probe.py), run now
    whatever the cache says, every finding printed; exit 1 on a CRITICAL one."""
    from slurmagent.config import job_spec, spec_dict
    from slurmagent.launch.probe import interpreter_of, remember, run_probe
    from slurmagent.render import compose, experiment_name
    from slurmagent.safety.paths import state_dir
    from slurmagent.slurm.seam import SlurmCLI

    try:
        spec = job_spec(spec_dict(compose(overrides, config_dir)), require_task=False)
    except ConfigError as exc:
        print(f"slurmagent: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    slurm = SlurmCLI()
    if not slurm.available():
        print("slurmagent: error: Slurm does not answer here: the probe is a Slurm job", file=sys.stderr)
        return EXIT_BAD_INPUT
    python = interpreter_of(spec, sys.executable)
    out = run_probe(spec, python, slurm, experiment_name(overrides) or "env", state_dir() / "probes")
    remember(out)
    print(out.describe())
    for f in out.findings:
        print(f"  {f.status.name}: {f.what}" + (f" (fix: {f.fix})" if f.fix else ""))
    return EXIT_FAILED if out.critical or out.note else EXIT_OK


def doctor(args: argparse.Namespace) -> int:
    """TARGET is a sweep directory, a Slurm job id (123), an array task (123_4) or an array (123).
    `doctor --env OVERRIDES…` probes the environment those overrides give, on Slurm, now."""
    if args.config_dir is not None:
        check_path(args.config_dir, "dir", "--config-dir", ConfigError)
        if not args.env:
            print("slurmagent: error: --config-dir is for doctor --env (the overrides' configs)", file=sys.stderr)
            return EXIT_BAD_INPUT
    if args.env:
        return doctor_env(list(args.target), args.config_dir)
    if len(args.target) != 1:
        print(
            "slurmagent: error: doctor takes one sweep directory or job id (or --env with the launcher's overrides)",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    args.target = Path(args.target[0])

    from slurmagent.recovery.diagnose import Diagnosis, diagnose
    from slurmagent.recovery.plan import install_command
    from slurmagent.slurm.seam import TERMINAL_STATES, SlurmCLI
    from slurmagent.supervise.jobfiles import job_logs
    from slurmagent.supervise.recover import collect_logs
    from slurmagent.supervise.state import SweepStore

    def with_install(diag: Diagnosis) -> Diagnosis:
        """A module missing in the job's environment: the pip command (this python: the launcher's)."""
        install = diag.fix_command or install_command(diag, sys.executable)
        return replace(diag, fix_command=install) if install else diag

    target = str(args.target)
    found: list[tuple[str, Diagnosis]] = []
    # a job id unless a sweep directory of that name is here; anything else is a path (from the cwd)
    if not JOB_ID.fullmatch(target) or (Path(target) / "sweep.json").exists():
        state = SweepStore(sweep_dir_arg(Path(target))).load()
        for t in state.tasks:
            if t.state != "COMPLETED" and t.done and t.job_id:
                diag = diagnose(t.state, collect_logs(state, t))
                stored = t.diagnosis or {}  # recovery's, with the fix it could give (resources, nodes)
                if stored.get("cause") == diag.cause and stored.get("fix_command"):
                    diag = replace(diag, fix_command=str(stored["fix_command"]))
                found.append((f"task {t.index} ({t.job_id}, {t.state})", with_install(diag)))
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
                    with_install(diagnose(status.state, job_logs(slurm, status.job_id))),
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
        if diag.fix_command:
            print(f"  fix: {diag.fix_command}")
        for ev in diag.evidence:
            print(f"  {ev.source}:{ev.line}: {ev.text}")
    return EXIT_FAILED
