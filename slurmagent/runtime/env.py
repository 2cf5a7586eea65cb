"""The job's interfaces with the world, each named once: the SLURMAGENT_* variables through
which its context reaches its processes (the task in the job, a `task.command` child, a
rendered sbatch script) and the files it leaves in its task directory for the supervisor and
for people (`slurmagent status`, `logs`, `results`, `report`)."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

__all__ = ["JobEnv", "TaskFile", "slurm_job_id"]


class JobEnv(StrEnum):
    BACKEND = "SLURMAGENT_BACKEND"  # slurm | local; unset outside slurmagent
    JOB_ID = "SLURMAGENT_JOB_ID"  # Slurm id (ARRAYJOBID_TASKID for an array task) or the local pid
    TASK_INDEX = "SLURMAGENT_TASK_INDEX"  # the task's index in its sweep (Hydra job num)
    ATTEMPT = "SLURMAGENT_ATTEMPT"  # the attempt this Slurm job started as; each requeue adds one
    SWEEP_DIR = "SLURMAGENT_SWEEP_DIR"  # the sweep directory (unset for a single run)
    OUTPUT_DIR = "SLURMAGENT_OUTPUT_DIR"  # the task's own directory
    CHECKPOINT_DIR = "SLURMAGENT_CHECKPOINT_DIR"  # where its checkpoints go
    RESOURCES = "SLURMAGENT_RESOURCES"  # JSON: the resources the task runs with (resources.*)
    CHECKPOINT = "SLURMAGENT_CHECKPOINT"  # JSON: the checkpoint policy (checkpoint.*), StepLoop's default
    HEALTH = "SLURMAGENT_HEALTH"  # JSON: runtime health checks (health.*)
    STOP_AT = "SLURMAGENT_STOP_AT"  # a search trial's rung, in fidelity units (hpo.stop_at); unset: to the end


class TaskFile(StrEnum):
    METRICS = "metrics.jsonl"  # one JSON line per `loop.report(...)`: {"step": …, name: value}
    PROGRESS = "progress.json"  # where the run is: step of total, latest metrics, speed (StepLoop)
    HEALTH = "health.jsonl"  # every runtime health check
    HEALTH_STOP = "health_stop.json"  # the CRITICAL check that moved the job off its node
    ADAPT = "adapt.jsonl"  # every in-loop intervention asked (runtime/adapt.py): step, kind, reason, decision
    COMMAND_STDERR = "command.stderr"  # a task.command's stderr


def slurm_job_id(env: Mapping[str, str]) -> str | None:
    """The Slurm job this process runs in, as submitit and `squeue` name it: ARRAYJOBID_TASKID
    for an array task, else SLURM_JOB_ID; None outside Slurm."""
    array_job, array_task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if array_job and array_task:
        return f"{array_job}_{array_task}"
    return env.get("SLURM_JOB_ID") or None
