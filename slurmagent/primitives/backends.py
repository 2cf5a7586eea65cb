"""Where a task runs, one class per backend (as submitit has one executor per backend): each
says once how it differs from the others, and the launcher, the supervisor, `cancel` and the
job ask it instead of comparing names.

- `SlurmBackend`: Slurm's queue — job ids and arrays, states from squeue/sacct, accounting,
  submit limits, node requeues, `scontrol requeue` and `scancel`; a batch script exports the
  job's environment before its Python starts.
- `LocalBackend`: processes on this machine (submitit's local executor), their pids the ids.
- `PlainPython`: code run with no launcher at all (`python train.py`): no sweep, nobody to
  requeue it.

A sweep's backend is saved by name in its `sweep.json`; the job's reaches it in
SLURMAGENT_BACKEND. `backend_named` is the one way back from a name."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
from collections.abc import Iterable
from typing import ClassVar, Literal

from slurmagent.errors import ConfigError, SlurmAgentError
from slurmagent.primitives.procs import cmdline, pid_alive
from slurmagent.slurm.seam import TERMINAL_STATES, JobState, SlurmCLI, TaskStatus

__all__ = ["BACKENDS", "Backend", "BackendName", "LocalBackend", "PlainPython", "SlurmBackend", "backend_named"]


BackendName = Literal["slurm", "local", "none"]


class Backend:
    name: ClassVar[BackendName]
    # slurmagent launched the task: it shares a sweep, and the job owns its stop signals
    launched: ClassVar[bool] = True
    # a scheduler queues the tasks as jobs: arrays, accounting (sacct), submit limits, cluster
    # facts (sinfo), Slurm's own requeues and its verdict on how a job ended
    queued: ClassVar[bool] = False
    # the job's environment (env.vars, env.setup) is set by a batch script before its Python starts
    exports_env: ClassVar[bool] = False
    snapshot_by_default: ClassVar[bool] = False  # code.snapshot=auto copies the code for a sweep here

    def statuses(self, slurm: SlurmCLI, job_ids: Iterable[str]) -> dict[str, TaskStatus]:
        """The state of each of these tasks' jobs (or processes) now, keyed by the task's job id."""
        host = os.uname().nodename
        return {j: TaskStatus(j, "RUNNING" if pid_alive(j) else "EXITED", "", "", host, 0) for j in job_ids}

    def end(self, slurm: SlurmCLI, array_ids: list[str], job_ids: Iterable[str]) -> None:
        """End these tasks of a sweep (`array_ids`: the sweep's own Slurm jobs)."""
        for job_id in job_ids:
            if _is_local_task(job_id):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(job_id), signal.SIGTERM)

    def __repr__(self) -> str:
        return f"<backend {self.name}>"


class SlurmBackend(Backend):
    name = "slurm"
    queued = True
    exports_env = True
    snapshot_by_default = True  # a queued job may start after the working tree has changed

    def statuses(self, slurm: SlurmCLI, job_ids: Iterable[str]) -> dict[str, TaskStatus]:
        """One squeue/sacct query for the jobs' arrays; a PREEMPTED job is asked again
        of the controller: requeued (it runs again) or ended (PreemptMode=CANCEL)."""
        statuses = slurm.statuses({j.split("_")[0] for j in job_ids})
        preempted = [j for j, s in statuses.items() if s.state == "PREEMPTED"]
        if preempted:
            try:
                alive = slurm.job_states(preempted)
            except SlurmAgentError:
                alive = {j: JobState("UNKNOWN", "", "") for j in preempted}  # no answer: decide later
            for job, seen in alive.items():
                if job in statuses and seen.state not in TERMINAL_STATES:
                    statuses[job] = dataclasses.replace(statuses[job], state=seen.state)
        return statuses

    def end(self, slurm: SlurmCLI, array_ids: list[str], job_ids: Iterable[str]) -> None:
        slurm.cancel(array_ids)


class LocalBackend(Backend):
    name = "local"


class PlainPython(Backend):
    name = "none"
    launched = False


BACKENDS: dict[str, Backend] = {b.name: b() for b in (SlurmBackend, LocalBackend, PlainPython)}


def backend_named(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise ConfigError(f"backend {name!r} is not one of {', '.join(BACKENDS)}") from None


def _is_local_task(pid: str) -> bool:
    """True only if `pid` still runs a submitit task (a pid may have been reused since)."""
    return pid.isdigit() and any(b"submitit" in arg for arg in cmdline(pid))
