"""The job context: what training code knows about the job it runs in.

Built from the environment the launcher and Slurm set (SLURM_*, and the SLURMAGENT_*
variables of `primitives/env.py`), so the same code works under Slurm, the local backend, a
rendered sbatch script and a child command. Inside a job wrapped by `slurmagent.job`, the
context also carries the job's stop signals (`signals`), which the step loop uses, and the
gate as the loop's in-loop controller asks it (`approve`, runtime/adapt.py): the runtime
imports neither the gate nor Slurm, the job layer hands them over.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from slurmagent.config import CheckpointConf, HealthConf, parse_conf
from slurmagent.errors import ConfigError
from slurmagent.primitives.backends import BACKENDS, Backend, BackendName, backend_named
from slurmagent.primitives.env import JobEnv, slurm_job_id
from slurmagent.primitives.signals import StopSignals


@dataclass(frozen=True)
class Approval:
    """The gate's answer to an in-loop action (`JobContext.approve`)."""

    granted: bool  # allowed, and the change ran (inside the gate, as its executor)
    decision: str  # the verdict: allow, deny, needs_approval, held (kill switch); "local" without a gate
    rule: str = ""  # the policy rule that decided (or why it was held)
    result: dict[str, Any] = field(default_factory=dict)  # what the change returned, or {"error": …}


class Approver(Protocol):
    """Ask the gate for an in-loop action of this job (`kind`: an action kind such as decay_lr
    or restart_schedule); `apply` makes the change and is run by the gate only when allowed.
    `source`: who in the loop asks (the policy's `source_in`); "" for the in-loop controller."""

    def __call__(
        self,
        kind: str,
        reason: str,
        evidence: dict[str, Any],
        params: dict[str, Any],
        apply: Callable[[], dict[str, Any]],
        source: str = "",
    ) -> Approval: ...


@dataclass(frozen=True)
class JobContext:
    backend: BackendName  # "slurm", "local" or "none" (plain python, no launcher); `where` is its class
    job_id: str | None  # Slurm job id ("123_4" for an array task) or local pid
    array_job_id: str | None  # SLURM_ARRAY_JOB_ID
    array_task_id: int | None  # SLURM_ARRAY_TASK_ID
    task_index: int  # index of the task in its sweep (Hydra job num)
    attempt: (
        int  # this run's number among the task's runs: 1 for the first, +1 for each requeue, resubmission or promotion
    )
    restart_count: int  # SLURM_RESTART_COUNT: requeues of this Slurm job
    output_dir: Path  # the task's own directory
    checkpoint_dir: Path  # where its checkpoints go
    sweep_dir: Path | None  # the sweep directory (None for a single run)
    rank: int = 0  # global rank of this process (SLURM_PROCID)
    world_size: int = 1  # number of processes (SLURM_NTASKS)
    node: str | None = None  # SLURMD_NODENAME
    resources: dict[str, Any] = field(default_factory=dict)  # the resources the task asked for
    checkpoint: CheckpointConf = field(default_factory=CheckpointConf)  # the job's checkpoint policy
    health: HealthConf = field(default_factory=HealthConf)  # the job's runtime health checks
    stop_at: int = 0  # a search trial's rung: stop there, checkpointed (hpo.stop_at; 0 = run to the end)
    # the job wrapper's stop signals (slurmagent.job), handed to the step loop; None outside one
    signals: StopSignals | None = field(default=None, compare=False, repr=False)
    # the gate for the loop's in-loop actions (slurmagent.job hands it over); None: act and record locally
    approve: Approver | None = field(default=None, compare=False, repr=False)

    @property
    def where(self) -> Backend:
        """Where this job runs: every way the backends differ is asked of it."""
        return backend_named(self.backend)

    @property
    def slurm_requeue_id(self) -> str | None:
        """The id `scontrol requeue` needs: ARRAYJOBID_TASKID for an array task."""
        if self.array_job_id and self.array_task_id is not None:
            return f"{self.array_job_id}_{self.array_task_id}"
        return self.job_id

    def to_env(self) -> dict[str, str]:
        """The context as SLURMAGENT_* variables, for a child command."""
        env = {
            JobEnv.BACKEND: self.backend,
            JobEnv.TASK_INDEX: str(self.task_index),
            JobEnv.ATTEMPT: str(self.attempt - self.restart_count),
            JobEnv.OUTPUT_DIR: str(self.output_dir),
            JobEnv.CHECKPOINT_DIR: str(self.checkpoint_dir),
            JobEnv.RESOURCES: json.dumps(self.resources, sort_keys=True),
            JobEnv.CHECKPOINT: json.dumps(asdict(self.checkpoint), sort_keys=True),
            JobEnv.HEALTH: json.dumps(asdict(self.health), sort_keys=True),
        }
        if self.stop_at:
            env[JobEnv.STOP_AT] = str(self.stop_at)
        if self.sweep_dir is not None:
            env[JobEnv.SWEEP_DIR] = str(self.sweep_dir)
        if self.job_id:
            env[JobEnv.JOB_ID] = self.job_id
        return {str(k): v for k, v in env.items()}

    def describe(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("signals", None)
        d.pop("approve", None)
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items()}


def _int(env: Mapping[str, str], key: str, default: int) -> int:
    try:
        return int(env[key])
    except (KeyError, ValueError):
        return default


def _json_conf(env: Mapping[str, str], var: JobEnv, cls: type[Any]) -> Any:
    raw = env.get(var)
    if not raw:
        return cls()
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"{var} is not JSON: {exc}") from None
    return parse_conf(cls, data if isinstance(data, dict) else None, str(var))


def context_from_env(
    env: Mapping[str, str] | None = None,
    output_dir: str | os.PathLike[str] | None = None,
    checkpoint_dir: str | os.PathLike[str] | None = None,
) -> JobContext:
    env = os.environ if env is None else env
    out = Path(output_dir or env.get(JobEnv.OUTPUT_DIR) or os.getcwd())
    ckpt = Path(checkpoint_dir or env.get(JobEnv.CHECKPOINT_DIR) or out / "checkpoints")
    restarts = _int(env, "SLURM_RESTART_COUNT", 0)
    slurm_id = env.get("SLURM_JOB_ID")
    array_job = env.get("SLURM_ARRAY_JOB_ID")
    array_task = env.get("SLURM_ARRAY_TASK_ID")
    job_id = slurm_job_id(env) or env.get(JobEnv.JOB_ID)
    named = env.get(JobEnv.BACKEND)
    backend: BackendName = BACKENDS[named].name if named in BACKENDS else "slurm" if slurm_id else "none"
    try:
        resources = json.loads(env.get(JobEnv.RESOURCES, "{}"))
    except ValueError:
        resources = {}
    sweep = env.get(JobEnv.SWEEP_DIR)
    return JobContext(
        backend=backend,
        job_id=job_id,
        array_job_id=array_job,
        array_task_id=int(array_task) if array_task and array_task.isdigit() else None,
        task_index=_int(env, JobEnv.TASK_INDEX, 0),
        # the launcher sets the attempt this Slurm job started as; each requeue adds one
        attempt=_int(env, JobEnv.ATTEMPT, 1) + restarts,
        restart_count=restarts,
        output_dir=out,
        checkpoint_dir=ckpt,
        sweep_dir=Path(sweep) if sweep else None,
        rank=_int(env, "SLURM_PROCID", _int(env, "RANK", 0)),
        world_size=_int(env, "SLURM_NTASKS", _int(env, "WORLD_SIZE", 1)),
        node=env.get("SLURMD_NODENAME"),
        resources=resources if isinstance(resources, dict) else {},
        checkpoint=_json_conf(env, JobEnv.CHECKPOINT, CheckpointConf),
        health=_json_conf(env, JobEnv.HEALTH, HealthConf),
        stop_at=_int(env, JobEnv.STOP_AT, 0),
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
    """The context of the running job. Inside a slurmagent job the job wrapper sets it; in
    a plain script it is built from the environment and Hydra's output dir."""
    if _current is not None:
        return _current
    return context_from_env(output_dir=os.environ.get(JobEnv.OUTPUT_DIR) or _hydra_output_dir())
