"""What runs inside each submitted job: rebuild the task's Hydra config from the sweep's
context file and its overrides, then run Hydra's job machinery around our task function.

The callable that submitit pickles per task is tiny (a path and a few fields): the heavy
context (Hydra context, base config, plugin registrations) is pickled once per sweep.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle

from slurmagent.files import atomic_write
from slurmagent.runtime.env import JobEnv


@dataclass(frozen=True)
class TaskPayload:
    index: int  # Hydra job num of this task
    overrides: tuple[str, ...]  # its sweep overrides
    attempt: int = 1  # attempt this submission starts as
    resources: dict[str, Any] | None = None  # a resubmission's adjusted resources, so the job's config says what it got


def write_context(path: Path, hydra_context: Any, task_function: Any, config: Any, singleton_state: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(
        path,
        cloudpickle.dumps(
            {
                "hydra_context": hydra_context,
                "task_function": task_function,
                "config": config,
                "singleton_state": singleton_state,
            },
        ),
    )


@dataclass(frozen=True)
class SweepRunner:
    """Called by submitit on the compute node (or locally) with one TaskPayload."""

    context_path: str  # the sweep's pickled context
    backend: str  # "slurm" or "local"
    sweep_dir: str  # the sweep directory

    def __call__(self, payload: TaskPayload) -> Any:
        from hydra.core.hydra_config import HydraConfig
        from hydra.core.singleton import Singleton
        from hydra.core.utils import JobReturn, run_job
        from omegaconf import open_dict

        from slurmagent.job.task import run_task, wrap_user_task

        with open(self.context_path, "rb") as fh:
            ctx = cloudpickle.load(fh)
        Singleton.set_state(ctx["singleton_state"])
        hydra_context = ctx["hydra_context"]
        sweep_config = hydra_context.config_loader.load_sweep_config(ctx["config"], list(payload.overrides))
        job_id = _job_id()
        with open_dict(sweep_config.hydra.job):
            sweep_config.hydra.job.id = job_id
            sweep_config.hydra.job.num = payload.index
        if payload.resources:
            with open_dict(sweep_config):
                for key, value in payload.resources.items():
                    sweep_config.resources[key] = value
        os.environ.update(
            {
                JobEnv.BACKEND: self.backend,
                JobEnv.TASK_INDEX: str(payload.index),
                JobEnv.ATTEMPT: str(payload.attempt),
                JobEnv.SWEEP_DIR: self.sweep_dir,
                JobEnv.JOB_ID: job_id,
            }
        )
        HydraConfig.instance().set_config(sweep_config)
        task_function = ctx["task_function"]
        if task_function is not run_task:  # a user's own Hydra app: run it as a slurmagent job too
            task_function = wrap_user_task(task_function)
        ret: JobReturn = run_job(
            hydra_context=hydra_context,
            task_function=task_function,
            config=sweep_config,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )
        return ret


def _job_id() -> str:
    array_job, array_task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array_job and array_task:
        return f"{array_job}_{array_task}"
    return os.environ.get("SLURM_JOB_ID") or str(os.getpid())
