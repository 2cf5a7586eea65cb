"""The SLURMAGENT_* job environment: the one schema of the variables through which a job's
context reaches its processes (the task in the job, a `task.command` child, a rendered
sbatch script). `JobEnv` names every variable; nothing else spells them."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["JobEnv"]


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
