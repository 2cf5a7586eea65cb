"""What runs inside each submitted job: rebuild the task's Hydra config from the sweep's
context file and its overrides, then run Hydra's job machinery around our task function.

The callable that submitit pickles per task is tiny (a path and a few fields): the heavy
context (Hydra context, base config, plugin registrations) is pickled once per sweep.
"""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle

from slurmagent.files import atomic_write
from slurmagent.primitives.backends import backend_named
from slurmagent.primitives.code import import_from_snapshot
from slurmagent.primitives.env import JobEnv, slurm_job_id
from slurmagent.primitives.wake import wake


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
    """Called by submitit on the compute node (or locally) with one TaskPayload.

    The first run of a task composes its config from the sweep's context. When the task
    stops to be requeued (preemption, time limit, a sick node), it leaves what it ran with
    (composed config, task function, Hydra callbacks) in `.slurmagent/requeue/`, and the
    requeued run starts from that: no context to unpickle, no composition."""

    context_path: str  # the sweep's pickled context
    backend: str  # the backend's name ("slurm" or "local"): a plain string in the task's pickle
    sweep_dir: str  # the sweep directory

    def __call__(self, payload: TaskPayload) -> Any:
        from hydra.core.hydra_config import HydraConfig
        from hydra.core.utils import JobReturn, JobStatus, run_job

        from slurmagent.job.task import run_task, wrap_user_task
        from slurmagent.runtime.loop import StopForRequeue

        job_id = _job_id()
        # the sweep's copy of the code, if it has one, before anything of the user's is imported (primitives/code.py)
        import_from_snapshot(self.sweep_dir)
        # as the process exits (submitit has written the result by then): the supervisor looks at once
        atexit.register(wake, self.sweep_dir, f"task {payload.index} job {job_id}")
        saved = self._requeue_file(payload, job_id)
        if saved.exists():
            sweep_config, task_function, hydra_context = self._resume(saved)
        else:
            sweep_config, task_function, hydra_context = self._compose(payload, job_id)
        os.environ.update(
            {
                JobEnv.BACKEND: self.backend,
                JobEnv.TASK_INDEX: str(payload.index),
                JobEnv.ATTEMPT: str(payload.attempt),
                JobEnv.SWEEP_DIR: self.sweep_dir,
                JobEnv.JOB_ID: job_id,
            }
        )
        if not backend_named(self.backend).exports_env:
            # no batch script exported env.vars (slurm/sbatch.env_lines): this process does
            env = sweep_config.get("env") or {}
            os.environ.update({str(k): str(v) for k, v in (env.get("vars") or {}).items()})
        restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
        # one line per run in the job's log (a requeued run appends to the same file): `logs` and
        # ctx.attempt number runs alike
        print(
            f"[slurmagent] task {payload.index}, run {payload.attempt + restarts} (job {job_id}"
            + (f", requeued {restarts}x" if restarts else "")
            + ")",
            flush=True,
        )
        HydraConfig.instance().set_config(sweep_config)
        job_function = task_function if task_function is run_task else wrap_user_task(task_function)
        try:
            ret: JobReturn = run_job(
                hydra_context=hydra_context,
                task_function=job_function,
                config=sweep_config,
                job_dir_key="hydra.sweep.dir",
                job_subdir_key="hydra.sweep.subdir",
            )
        except StopForRequeue:
            if not saved.exists():
                self._save_for_requeue(saved, sweep_config, task_function, hydra_context)
            raise
        if ret.status == JobStatus.FAILED:
            # Hydra caught the task's exception into the JobReturn; raised here, submitit records
            # it and the job exits non-zero, so Slurm, sacct, mail and dependent jobs see FAILED
            raise ret._return_value
        return ret

    def _requeue_file(self, payload: TaskPayload, job_id: str) -> Path:
        # one per Slurm job: a requeue keeps the job id; a resubmission is a new job
        return Path(self.sweep_dir) / ".slurmagent" / "requeue" / f"{payload.index}-{job_id}.pkl"

    def _compose(self, payload: TaskPayload, job_id: str) -> tuple[Any, Any, Any]:
        from hydra.core.singleton import Singleton
        from omegaconf import open_dict

        with open(self.context_path, "rb") as fh:
            ctx = cloudpickle.load(fh)
        Singleton.set_state(ctx["singleton_state"])
        hydra_context = ctx["hydra_context"]
        sweep_config = hydra_context.config_loader.load_sweep_config(ctx["config"], list(payload.overrides))
        with open_dict(sweep_config.hydra.job):
            sweep_config.hydra.job.id = job_id
            sweep_config.hydra.job.num = payload.index
        with open_dict(sweep_config.hydra.sweep):
            # the launcher's sweep dir, absolute: Hydra's default (`multirun/${now:…}`) would be
            # resolved again by a requeued run, days later and in whatever directory it starts in
            sweep_config.hydra.sweep.dir = self.sweep_dir
        if payload.resources:
            with open_dict(sweep_config):
                for key, value in payload.resources.items():
                    sweep_config.resources[key] = value
        return sweep_config, ctx["task_function"], hydra_context

    @staticmethod
    def _save_for_requeue(path: Path, sweep_config: Any, task_function: Any, hydra_context: Any) -> None:
        from hydra import version

        base = version.getbase()
        state = {
            "config": sweep_config,
            "task_function": task_function,
            "callbacks": hydra_context.callbacks,
            "version_base": None if base is None else str(base),
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, cloudpickle.dumps(state))

    @staticmethod
    def _resume(path: Path) -> tuple[Any, Any, Any]:
        from hydra import version
        from hydra.core.utils import setup_globals
        from hydra.types import HydraContext

        # Hydra's resolvers (`now`, `hydra`, `python_version`), as Hydra's own start registers
        # them: a user's `${now:…}` keeps the value the first run cached in the saved config
        setup_globals()
        with open(path, "rb") as fh:
            state = cloudpickle.load(fh)
        if state["version_base"] is not None:
            version.setbase(state["version_base"])
        # run_job uses only the callbacks of the Hydra context; no config loader is needed here
        context = HydraContext(config_loader=None, callbacks=state["callbacks"])  # type: ignore[arg-type]
        return state["config"], state["task_function"], context


def _job_id() -> str:
    return slurm_job_id(os.environ) or str(os.getpid())
