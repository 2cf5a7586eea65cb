"""The job's interfaces with the world, each named once: the SLURMAGENT_* variables through
which its context reaches its processes (the task in the job, a `task.command` child, a
rendered sbatch script) and the files it leaves in its task directory for the supervisor and
for people (`slurmagent status`, `logs`, `results`, `report`)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any

from slurmagent.errors import ConfigError

__all__ = [
    "REQUEUE_EXIT_CODE",
    "JobEnv",
    "Progress",
    "TaskFile",
    "check_checkpoint_dir",
    "slurm_job_id",
    "task_checkpoint_dir",
]


class JobEnv(StrEnum):
    BACKEND = "SLURMAGENT_BACKEND"  # slurm | local; unset outside slurmagent
    JOB_ID = "SLURMAGENT_JOB_ID"  # Slurm id (ARRAYJOBID_TASKID for an array task) or the local pid
    TASK_INDEX = "SLURMAGENT_TASK_INDEX"  # the task's index in its sweep (Hydra job num)
    ATTEMPT = "SLURMAGENT_ATTEMPT"  # the run of the task this Slurm job started as; each requeue adds one
    SWEEP_DIR = "SLURMAGENT_SWEEP_DIR"  # the sweep directory (unset for a single run)
    OUTPUT_DIR = "SLURMAGENT_OUTPUT_DIR"  # the task's own directory
    CHECKPOINT_DIR = "SLURMAGENT_CHECKPOINT_DIR"  # where its checkpoints go
    RESOURCES = "SLURMAGENT_RESOURCES"  # JSON: the resources the task runs with (resources.*)
    CHECKPOINT = "SLURMAGENT_CHECKPOINT"  # JSON: the checkpoint policy (checkpoint.*), StepLoop's default
    HEALTH = "SLURMAGENT_HEALTH"  # JSON: runtime health checks (health.*)
    STOP_AT = "SLURMAGENT_STOP_AT"  # a search trial's rung, in fidelity units (hpo.stop_at); unset: to the end
    # the plain-script protocol (a task.command child; docs/trainers.md):
    RESUME_FROM = "SLURMAGENT_RESUME_FROM"  # the newest valid checkpoint under CHECKPOINT_DIR; unset: none yet
    METRICS = "SLURMAGENT_METRICS"  # the task's metrics.jsonl: append one JSON object a line, {"step": …, name: value}
    REQUEUE_EXIT = "SLURMAGENT_REQUEUE_EXIT"  # the exit code meaning "saved: run me again" (REQUEUE_EXIT_CODE)


# A task.command program that saved its state at a stop signal exits with this code (sysexits.h's
# EX_TEMPFAIL, "a temporary failure: retry"): the job requeues it, and its next run resumes.
REQUEUE_EXIT_CODE = 75


class TaskFile(StrEnum):
    METRICS = "metrics.jsonl"  # one JSON line per `loop.report(...)`: {"step": …, name: value}
    PROGRESS = "progress.json"  # where the run is: step of total, latest metrics, speed (StepLoop)
    HEALTH = "health.jsonl"  # every runtime health check
    HEALTH_STOP = "health_stop.json"  # the CRITICAL check that moved the job off its node
    ADAPT = "adapt.jsonl"  # every in-loop intervention asked (runtime/adapt.py): step, kind, reason, decision
    COMMAND_STDERR = "command.stderr"  # a task.command's stderr
    TRACK = "track.json"  # each tracker's run id and what was sent to it (slurmagent/track/)
    TENSORBOARD = "tensorboard"  # the task's TensorBoard event files (track.tensorboard)


class Progress(StrEnum):
    """The fields of a task's progress.json that the supervisor reads into the job history
    (schedule/history.py) besides what `status` shows (step, total_steps, metrics, time)."""

    STEPS_PER_S = "steps_per_s"  # this run's speed since it started or resumed (StepLoop)
    GPU_MEM_PEAK_MB = "gpu_mem_peak_mb"  # the most GPU memory torch's allocator held on one device (CUDA jobs)
    # the most host memory the job's process held (ru_maxrss, a kernel high-water mark: exact where sacct's
    # MaxRSS is sampled every JobAcctGatherFrequency) plus its largest waited-for child's (a task.command)
    HOST_MEM_PEAK_MB = "host_mem_peak_mb"
    CHECKPOINT_S = "checkpoint_s"  # what a synchronous checkpoint save took (gather + durable write), seconds


def slurm_job_id(env: Mapping[str, str]) -> str | None:
    """The Slurm job this process runs in, as submitit and `squeue` name it: ARRAYJOBID_TASKID
    for an array task, else SLURM_JOB_ID; None outside Slurm."""
    array_job, array_task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if array_job and array_task:
        return f"{array_job}_{array_task}"
    return env.get("SLURM_JOB_ID") or None


def task_checkpoint_dir(
    configured: str | None, output_dir: Path, sweep_dir: str | Path | None, task_index: int
) -> Path:
    """Where a task's checkpoints go: `<output dir>/checkpoints` by default; with `checkpoint.dir`
    set, that directory for a single run, and for a task of a sweep a directory of its own under
    it, `<checkpoint.dir>/<sweep>/<task index>` — tasks (and sweeps) sharing one directory would
    resume from each other's checkpoints and report each other's results."""
    if not configured:
        return output_dir / "checkpoints"
    base = Path(configured)
    if sweep_dir is None:
        return base
    return base / sweep_key(Path(sweep_dir)) / str(task_index)


def sweep_key(sweep_dir: Path) -> str:
    """A sweep's folder name under a shared `checkpoint.dir`: readable (Hydra's default sweep dir
    `multirun/DATE/TIME` gives `DATE_TIME`) and unique (a hash of the sweep's absolute path)."""
    path = sweep_dir.absolute()
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    name = f"{path.parent.name}_{path.name}" if path.parent.name else path.name
    return f"{name}-{digest}"


def check_checkpoint_dir(configured: str | None) -> None:
    """A `checkpoint.dir` the job can use without creating anything the user did not name: it
    is a directory, or its parent is one (the job creates only the named directory and what goes
    under it). ConfigError naming the key and the missing part otherwise."""
    if not configured:
        return
    path = Path(configured).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ConfigError(f"checkpoint.dir={configured}: exists and is not a directory; name a directory")
        return
    parent = path.absolute().parent
    if not parent.is_dir():
        raise ConfigError(
            f"checkpoint.dir={configured}: its parent {parent} does not exist; create it first or name a directory "
            "under an existing one (slurmagent creates only the directory you name)"
        )


METRIC_AXES = ("step", "epoch")  # a metrics line's position, not metrics


def metric_values(row: Mapping[str, Any]) -> dict[str, float]:
    """A metrics line's values: its numbers but the axes (a bool is not a number here)."""
    return {
        k: float(v)
        for k, v in row.items()
        if k not in METRIC_AXES and isinstance(v, int | float) and not isinstance(v, bool)
    }
