"""The job context: what training code knows about the job it runs in.

Built from the environment the launcher and Slurm set (SLURM_*, SLURMAGENT_*), so the same
code works under Slurm, the local backend, a rendered sbatch script and a child command.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ENV_PREFIX = "SLURMAGENT_"


@dataclass(frozen=True)
class JobContext:
    backend: str  # "slurm", "local" or "none" (plain python, no launcher)
    job_id: str | None  # Slurm job id ("123_4" for an array task) or local pid
    array_job_id: str | None  # SLURM_ARRAY_JOB_ID
    array_task_id: int | None  # SLURM_ARRAY_TASK_ID
    task_index: int  # index of the task in its sweep (Hydra job num)
    attempt: int  # 1 for the first run; +1 for each requeue or resubmission
    restart_count: int  # SLURM_RESTART_COUNT: requeues of this Slurm job
    output_dir: Path  # the task's own directory
    checkpoint_dir: Path  # where its checkpoints go
    sweep_dir: Path | None  # the sweep directory (None for a single run)
    rank: int = 0  # global rank of this process (SLURM_PROCID)
    world_size: int = 1  # number of processes (SLURM_NTASKS)
    node: str | None = None  # SLURMD_NODENAME
    resources: dict[str, Any] = field(default_factory=dict)  # the resources the task asked for

    @property
    def slurm_requeue_id(self) -> str | None:
        """The id `scontrol requeue` needs: ARRAYJOBID_TASKID for an array task."""
        if self.array_job_id and self.array_task_id is not None:
            return f"{self.array_job_id}_{self.array_task_id}"
        return self.job_id

    def to_env(self) -> dict[str, str]:
        """The context as SLURMAGENT_* variables, for a child command."""
        env = {
            f"{ENV_PREFIX}BACKEND": self.backend,
            f"{ENV_PREFIX}TASK_INDEX": str(self.task_index),
            f"{ENV_PREFIX}ATTEMPT": str(self.attempt),
            f"{ENV_PREFIX}OUTPUT_DIR": str(self.output_dir),
            f"{ENV_PREFIX}CHECKPOINT_DIR": str(self.checkpoint_dir),
            f"{ENV_PREFIX}RESOURCES": json.dumps(self.resources, sort_keys=True),
        }
        if self.sweep_dir is not None:
            env[f"{ENV_PREFIX}SWEEP_DIR"] = str(self.sweep_dir)
        if self.job_id:
            env[f"{ENV_PREFIX}JOB_ID"] = self.job_id
        return env

    def describe(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items()}


def _int(env: Mapping[str, str], key: str, default: int) -> int:
    try:
        return int(env[key])
    except (KeyError, ValueError):
        return default


def context_from_env(
    env: Mapping[str, str] | None = None,
    output_dir: str | os.PathLike[str] | None = None,
    checkpoint_dir: str | os.PathLike[str] | None = None,
) -> JobContext:
    env = os.environ if env is None else env
    out = Path(output_dir or env.get(f"{ENV_PREFIX}OUTPUT_DIR") or os.getcwd())
    ckpt = Path(checkpoint_dir or env.get(f"{ENV_PREFIX}CHECKPOINT_DIR") or out / "checkpoints")
    restarts = _int(env, "SLURM_RESTART_COUNT", 0)
    slurm_id = env.get("SLURM_JOB_ID")
    array_job = env.get("SLURM_ARRAY_JOB_ID")
    array_task = env.get("SLURM_ARRAY_TASK_ID")
    if array_job and array_task:
        job_id: str | None = f"{array_job}_{array_task}"
    else:
        job_id = slurm_id or env.get(f"{ENV_PREFIX}JOB_ID")
    backend = env.get(f"{ENV_PREFIX}BACKEND") or ("slurm" if slurm_id else "none")
    try:
        resources = json.loads(env.get(f"{ENV_PREFIX}RESOURCES", "{}"))
    except ValueError:
        resources = {}
    sweep = env.get(f"{ENV_PREFIX}SWEEP_DIR")
    return JobContext(
        backend=backend,
        job_id=job_id,
        array_job_id=array_job,
        array_task_id=int(array_task) if array_task and array_task.isdigit() else None,
        task_index=_int(env, f"{ENV_PREFIX}TASK_INDEX", 0),
        # the launcher sets the attempt this Slurm job started as; each requeue adds one
        attempt=_int(env, f"{ENV_PREFIX}ATTEMPT", 1) + restarts,
        restart_count=restarts,
        output_dir=out,
        checkpoint_dir=ckpt,
        sweep_dir=Path(sweep) if sweep else None,
        rank=_int(env, "SLURM_PROCID", _int(env, "RANK", 0)),
        world_size=_int(env, "SLURM_NTASKS", _int(env, "WORLD_SIZE", 1)),
        node=env.get("SLURMD_NODENAME"),
        resources=resources if isinstance(resources, dict) else {},
    )


_current: JobContext | None = None


def set_current(ctx: JobContext | None) -> None:
    global _current
    _current = ctx


def _hydra_output_dir() -> str | None:
    try:
        from hydra.core.hydra_config import HydraConfig

        return str(HydraConfig.get().runtime.output_dir)
    except (ImportError, ValueError):
        return None


def current() -> JobContext:
    """The context of the running job. Inside `python -m slurmagent` the task wrapper sets
    it; in a user's own Hydra app it is built from the environment and Hydra's output dir."""
    if _current is not None:
        return _current
    return context_from_env(output_dir=os.environ.get(f"{ENV_PREFIX}OUTPUT_DIR") or _hydra_output_dir())
