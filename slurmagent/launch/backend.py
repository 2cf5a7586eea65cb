"""Choosing the backend (auto | slurm | local) and building submitit executors from the
one source of truth for sbatch flags."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import submitit

from slurmagent.config import JobSpec, LauncherConf, parse_conf
from slurmagent.errors import SlurmUnavailableError
from slurmagent.job.runner import SweepRunner, TaskPayload
from slurmagent.slurm.sbatch import sbatch_flags
from slurmagent.slurm.seam import SlurmCLI
from slurmagent.slurm.syntax import slurm_time_to_seconds, time_to_minutes
from slurmagent.supervise.state import SweepState, TaskRecord

SUBMITIT_NAMED = {
    "partition",
    "nodes",
    "ntasks_per_node",
    "cpus_per_task",
    "mem",
    "gres",
    "qos",
    "account",
    "constraint",
    "exclude",
}


def resolve_backend(choice: str, slurm: SlurmCLI) -> str:
    if choice == "local":
        return "local"
    if slurm.available():
        return "slurm"
    if choice == "slurm":
        raise SlurmUnavailableError(
            "cluster=slurm but Slurm does not answer (sinfo failed or is not installed); check SLURM_CONF and that "
            "slurmctld runs, or use cluster=local (or cluster=auto to fall back automatically)"
        )
    return "local"


def slurm_parameters(spec: JobSpec, launcher: LauncherConf, array_size: int, job_name: str) -> dict[str, Any]:
    """submitit SlurmExecutor parameters for one array of tasks sharing `spec`."""
    params: dict[str, Any] = {"job_name": job_name}
    additional: dict[str, Any] = {"requeue": True, "open-mode": "append"}
    for flag, value in sbatch_flags(spec.resources).items():
        key = flag.replace("-", "_")
        if flag == "time":
            params["time"] = time_to_minutes(value)
        elif key in SUBMITIT_NAMED:
            params[key] = int(value) if key in ("nodes", "ntasks_per_node", "cpus_per_task") else value
        else:
            additional[flag] = value
    # job steps (srun) get the signal: submitit runs the task under srun
    additional["signal"] = f"{spec.recovery.signal}@{spec.recovery.signal_delay_s}"
    params["array_parallelism"] = launcher.array_parallelism or array_size
    params["additional_parameters"] = additional
    return params


class SubmititResubmitter:
    """Submits one task of a sweep again, as its next attempt, with an adjusted spec: what
    the supervisor's recovery calls (supervise/recover.py's `Resubmitter`)."""

    def __call__(self, state: SweepState, task: TaskRecord, spec: JobSpec, attempt: int) -> str:
        conf = parse_conf(LauncherConf, state.launcher, "hydra.launcher")
        executor = make_executor(state.backend, Path(state.submitit_folder), spec, conf, 1, state.job_name)
        runner = SweepRunner(state.context_path, state.backend, state.sweep_dir)
        payload = TaskPayload(task.index, tuple(task.overrides), attempt=attempt, resources=asdict(spec.resources))
        return str(executor.submit(runner, payload).job_id)


def make_executor(
    backend: str, folder: Path, spec: JobSpec, launcher: LauncherConf, array_size: int, job_name: str
) -> submitit.Executor:
    if backend == "slurm":
        slurm_ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=spec.recovery.max_attempts)
        slurm_ex.update_parameters(**slurm_parameters(spec, launcher, array_size, job_name))
        return slurm_ex
    local = submitit.LocalExecutor(folder=folder)
    local.update_parameters(
        timeout_min=max(1, slurm_time_to_seconds(spec.resources.time) // 60),
        tasks_per_node=spec.resources.tasks_per_node,
        nodes=1,
    )
    return local
