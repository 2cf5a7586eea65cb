"""Where a detached sweep's supervisor runs, and the supervisor itself.

`-m … --detach` (`hydra.launcher.detach=true`) submits, starts the sweep's supervisor away
from the user's shell, prints how to follow the sweep and returns. The supervisor is
`slurmagent supervise SWEEP` (`run_supervisor`), the same supervision as attached —
recovery through the gate, waiting tasks submitted as others end — running

- `supervisor=job`: as a small Slurm job of its own (1 CPU, `supervisor_mem`, on
  `supervisor_partition`, `--requeue`). Requeue-safe: preempted, Slurm requeues it; near
  its time limit (`--signal=B:USR1@60`) it requeues itself through the gate; every run
  goes on from `sweep.json`.
- `supervisor=process`: as a process on this node in a session of its own (no hang-up
  when the shell goes), where the site allows no such job.
- `auto` (the default): a job on Slurm, a process with the local backend or when the
  supervisor job is refused.

One supervisor acts at a time whatever runs: supervise/lead.py. `supervisor.json` records
the one started, so that `slurmagent cancel` stops it too and a later batch of the sweep
starts none twice.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from slurmagent.commands import slurmagent_command
from slurmagent.config import LauncherConf, RecoveryConf, ResourcesConf, parse_conf
from slurmagent.errors import ConfigError, SlurmAgentError
from slurmagent.files import atomic_write
from slurmagent.job.stop import requeue_supervisor_job
from slurmagent.primitives.procs import cmdline
from slurmagent.slurm.sbatch import safe_directive_value, safe_job_name, sbatch_flags, stop_flags
from slurmagent.slurm.seam import TERMINAL_STATES, SlurmCLI
from slurmagent.supervise.state import SweepState, SweepStore
from slurmagent.supervise.submission import Submitter
from slurmagent.supervise.supervisor import Supervisor
from slurmagent.supervise.views import summary_line

log = logging.getLogger(__name__)

SUPERVISOR_FILE = ".slurmagent/supervisor.json"
TIME_LIMIT_WARNING_S = 60  # the supervisor job's --signal=B:USR1@60: time to requeue itself


def follow_commands(sweep_dir: Path) -> list[str]:
    """What to paste to follow a sweep (TASK: a task's number, the # column of status)."""
    return [
        slurmagent_command("status", sweep_dir),
        slurmagent_command("watch", sweep_dir),
        slurmagent_command("logs", sweep_dir) + " TASK",
        slurmagent_command("cancel", sweep_dir),
    ]


def supervisor_resources(conf: LauncherConf, account: str | None) -> ResourcesConf:
    """What the supervisor job asks for: one CPU and a little memory."""
    return ResourcesConf(
        partition=conf.supervisor_partition or None,
        cpus_per_task=1,
        mem=conf.supervisor_mem,
        time=conf.supervisor_time,
        account=account,
    )


def supervisor_script(state: SweepState, conf: LauncherConf, account: str | None, cwd: Path) -> str:
    """The supervisor job's batch script. Its python is this one, its directory the launcher's
    (resubmitted tasks import the user's code from there)."""
    log_path = f"{state.sweep_dir}/.slurmagent/supervisor-%j.log"
    if not safe_directive_value(log_path):
        raise ConfigError(f"the sweep directory {state.sweep_dir!r} cannot stand in an #SBATCH line")
    # its signal goes to the batch shell: the supervisor is the script's own process
    own = RecoveryConf(signal="USR1", signal_delay_s=TIME_LIMIT_WARNING_S, requeue=True)
    flags = {
        "job-name": safe_job_name(f"{state.job_name or 'sweep'}-supervisor"),
        "output": log_path,
        **stop_flags(own, to_batch_script=True),
        **sbatch_flags(supervisor_resources(conf, account)),
    }
    lines = ["#!/bin/bash", "# the supervisor of a detached slurmagent sweep (slurmagent/supervise/detach.py)"]
    lines += [f"#SBATCH --{k}" if v is None else f"#SBATCH --{k}={v}" for k, v in flags.items()]
    lines += [
        f"cd {shlex.quote(str(cwd))} || exit 1",
        f"exec {shlex.quote(sys.executable)} -u -m slurmagent supervise {shlex.quote(state.sweep_dir)}",
    ]
    return "\n".join(lines) + "\n"


def start_detached(state: SweepState, conf: LauncherConf, slurm: SlurmCLI, account: str | None = None) -> str:
    """Start the sweep's supervisor away from this shell, unless one already runs; a
    sentence saying where it runs."""
    sweep_dir = Path(state.sweep_dir)
    running = running_supervisor(sweep_dir, slurm)
    if running is not None:
        return f"its supervisor already runs ({describe(running)})"
    how = conf.supervisor
    if how == "auto":
        how = "job" if state.where.queued else "process"  # a supervisor job where there is a queue
    note = ""
    record: dict[str, Any]
    if how == "job":
        try:
            script = sweep_dir / ".slurmagent" / "supervisor.sbatch"
            script.parent.mkdir(parents=True, exist_ok=True)
            script.write_text(supervisor_script(state, conf, account, Path.cwd()))
            record = {"kind": "job", "job_id": slurm.submit(script)}
        except SlurmAgentError as exc:
            if conf.supervisor == "job":
                raise
            note = f" (the supervisor job was refused: {exc})"
            how = "process"
    if how == "process":
        log_file = sweep_dir / ".slurmagent" / "supervisor.log"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(log_file, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-u", "-m", "slurmagent", "supervise", str(sweep_dir)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # no hang-up when the shell goes
            )
        record = {"kind": "process", "pid": proc.pid, "host": socket.gethostname()}
    record["started"] = time.time()
    atomic_write(sweep_dir / SUPERVISOR_FILE, json.dumps(record).encode())
    return describe(record) + note


def describe(record: dict[str, Any]) -> str:
    if record.get("kind") == "job":
        return f"Slurm job {record['job_id']}"
    return f"process {record.get('pid')} on {record.get('host')}"


def supervisor_record(sweep_dir: Path) -> dict[str, Any] | None:
    try:
        raw = json.loads((Path(sweep_dir) / SUPERVISOR_FILE).read_text())
    except (OSError, ValueError):
        return None
    return raw if isinstance(raw, dict) else None


def running_supervisor(sweep_dir: Path, slurm: SlurmCLI) -> dict[str, Any] | None:
    """The detached supervisor started for this sweep, while it is queued or runs."""
    record = supervisor_record(sweep_dir)
    if record is None:
        return None
    if record.get("kind") == "job":
        try:
            seen = slurm.job_state(str(record["job_id"]))
        except SlurmAgentError:
            return record  # no answer: assume it is there rather than start a second
        return record if seen is not None and seen.state not in TERMINAL_STATES else None
    alive = record.get("host") == socket.gethostname() and _is_supervisor_process(int(record.get("pid", 0)))
    return record if alive else None


def stop_supervisor(sweep_dir: Path, slurm: SlurmCLI) -> str:
    """`slurmagent cancel`: end the detached supervisor too; what was stopped ("" if none)."""
    record = running_supervisor(sweep_dir, slurm)
    if record is None:
        return ""
    if record.get("kind") == "job":
        slurm.cancel([str(record["job_id"])])
    else:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(record["pid"]), signal.SIGTERM)
    return describe(record)


def _is_supervisor_process(pid: int) -> bool:
    """Only a `slurmagent supervise` process (a pid may have been reused since)."""
    argv = cmdline(pid)
    return b"slurmagent" in argv and b"supervise" in argv


# -- the supervisor --------------------------------------------------------------------------
class _Wake(Exception):
    """Raised by the signal handler to cut a sleep short."""


class SupervisorSignals:  # the supervisor job's own (the job wrapper's are primitives/signals.StopSignals)
    """SIGTERM (preempted, cancelled) and SIGUSR1 (the time limit is near) end supervision
    between two polls; a sleep between polls is cut short."""

    def __init__(self) -> None:
        self.signum = 0
        self._sleeping = False
        for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
            signal.signal(signum, self._handler)

    def _handler(self, signum: int, _frame: FrameType | None) -> None:
        self.signum = self.signum or signum
        if self._sleeping:
            raise _Wake

    def sleep(self, seconds: float) -> None:
        try:
            self._sleeping = True
            if not self.signum:
                time.sleep(seconds)
        except _Wake:
            pass
        finally:
            self._sleeping = False

    def stopped(self) -> bool:
        return bool(self.signum)


def run_supervisor(sweep_dir: Path, submit: Submitter) -> int:
    """`slurmagent supervise SWEEP`: supervise the sweep to its end (following whoever holds
    its lead until it can take it). In a Slurm job, a time-limit warning requeues the job
    through the gate; preemption just ends this run (Slurm requeues it)."""
    job_id = os.environ.get("SLURM_JOB_ID", "")
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    for key in [k for k in os.environ if k.startswith("SLURM_") and k != "SLURM_CONF"]:
        del os.environ[key]  # the jobs it submits are not steps of this one
    store = SweepStore(sweep_dir)
    conf = parse_conf(LauncherConf, store.load().launcher, "hydra.launcher")
    stops = SupervisorSignals()
    role = f"supervisor job {job_id}" if job_id else "supervisor process"
    print(f"[supervisor] {role} for {sweep_dir} (run {restarts + 1}) on {socket.gethostname()}", flush=True)
    sup = Supervisor(
        sweep_dir,
        poll_interval_s=conf.poll_interval_s,
        max_poll_interval_s=conf.max_poll_interval_s,
        sleep=stops.sleep,
        submit=submit,
    )
    state = sup.wait(live=False, role=role, stop=stops.stopped)
    if state.done:
        print(f"[supervisor] the sweep is done: {summary_line(state)}", flush=True)
        return 0
    if stops.signum == signal.SIGUSR1 and job_id:
        _requeue_self(Path(sweep_dir), job_id, restarts, sup.slurm)
    else:
        print(f"[supervisor] stopped by signal {stops.signum} before the sweep ended", flush=True)
    return 0


def _requeue_self(sweep_dir: Path, job_id: str, restarts: int, slurm: SlurmCLI) -> None:
    out = requeue_supervisor_job(sweep_dir, job_id, restarts, slurm)  # job/stop.py decides, through the gate
    what = "requeued" if out.executed else f"not requeued ({out.decision.verdict}: {out.decision.rule})"
    print(f"[supervisor] time limit near: {what}", flush=True)
    if not out.executed:
        print(f"[supervisor] the sweep goes on unsupervised: {slurmagent_command('watch', sweep_dir)}", flush=True)
