"""Recovery from the login node: a task that ended without a result is diagnosed, the
plan decides (resubmit with adjusted resources, or stop), and a resubmission goes through
the action gate, which records it in the sweep's audit log.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

from slurmagent.config import JobSpec, LauncherConf, job_spec, parse_conf
from slurmagent.gate import Action, AuditLog, Gate
from slurmagent.recovery.diagnose import Diagnosis, diagnose
from slurmagent.recovery.plan import NODE_SUSPECT_CAUSES, Resubmit, plan
from slurmagent.slurm.cluster import ClusterInfo
from slurmagent.slurm.seam import SlurmCLI
from slurmagent.supervise.state import Attempt, SweepState, TaskRecord

log = logging.getLogger(__name__)

# states after which a task may be recovered; CANCELLED is a person's decision and is left alone
RECOVERABLE_STATES = frozenset({"FAILED", "OUT_OF_MEMORY", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL", "PREEMPTED"})
LOG_TAIL_BYTES = 200_000


def task_logs(state: SweepState, job_id: str) -> dict[str, str]:
    from submitit.core.utils import JobPaths

    paths = JobPaths(state.submitit_folder, job_id=job_id, task_id=0)
    out: dict[str, str] = {}
    for path in (paths.stderr, paths.stdout):
        try:
            with open(path, "rb") as fh:
                fh.seek(0, 2)
                size = fh.tell()
                fh.seek(max(0, size - LOG_TAIL_BYTES))
                out[str(path)] = fh.read().decode(errors="replace")
        except OSError:
            continue
    return out


def collect_logs(state: SweepState, task: TaskRecord) -> dict[str, str]:
    """Everything that tells why a task failed: its job's logs, a command's own stderr, and
    the error it raised."""
    logs = task_logs(state, task.job_id) if task.job_id else {}
    command_err = Path(state.sweep_dir) / str(task.index) / "command.stderr"  # task.command's own stderr
    if command_err.exists():
        logs[str(command_err)] = command_err.read_text(errors="replace")[-LOG_TAIL_BYTES:]
    if task.error:
        logs["task error"] = task.error
    return logs


class Recoverer:
    def __init__(self, sweep_dir: Path, slurm: SlurmCLI) -> None:
        self.sweep_dir = sweep_dir
        self.slurm = slurm
        self.audit = AuditLog(sweep_dir / "audit.jsonl")
        self._cluster: ClusterInfo | None = None

    def cluster(self, state: SweepState) -> ClusterInfo | None:
        if state.backend != "slurm":
            return None
        if self._cluster is None:
            self._cluster = ClusterInfo.query(self.slurm)
        return self._cluster

    def handle(self, state: SweepState, task: TaskRecord) -> None:
        """Called (under the sweep lock) when `task` just ended without a result."""
        if task.state not in RECOVERABLE_STATES or not task.spec or task.job_id is None:
            return
        attempt = task.attempts[-1]
        diag = diagnose(task.state, collect_logs(state, task))
        task.diagnosis = diag.to_json()
        if diag.cause in NODE_SUSPECT_CAUSES:
            for node in filter(None, attempt.nodes.split(",")):
                state.suspect_nodes[node] = state.suspect_nodes.get(node, 0) + 1
        spec = job_spec(task.spec, require_task=False)
        step = plan(
            spec,
            len(task.attempts),
            diag,
            attempt.nodes,
            self.cluster(state),
            {k: v - 1 for k, v in state.suspect_nodes.items()},
        )
        if not isinstance(step, Resubmit):
            task.error = f"{task.state}: {step.reason}\n{task.error}"
            return
        gate = Gate(
            self.audit, {"resubmit": lambda action: self._resubmit(state, task, spec, step, diag)}, job=task.job_id
        )
        gate.request(
            Action(
                "resubmit",
                task.job_id,
                step.reason,
                params={k: list(v) for k, v in step.changes.items()},
                evidence=diag.evidence,
                metrics_before={
                    "state": task.state,
                    "attempt": len(task.attempts),
                    "nodes": attempt.nodes,
                    "cause": diag.cause,
                },
            )
        )

    def _resubmit(
        self, state: SweepState, task: TaskRecord, spec: JobSpec, step: Resubmit, diag: Diagnosis
    ) -> dict[str, Any]:
        from slurmagent.launch.backend import make_executor
        from slurmagent.launch.runner import SweepRunner, TaskPayload

        new_spec = dataclasses.replace(spec, resources=step.resources)
        conf = parse_conf(LauncherConf, state.launcher, "hydra.launcher")
        executor = make_executor(state.backend, Path(state.submitit_folder), new_spec, conf, 1, state.job_name)
        runner = SweepRunner(state.context_path, state.backend, state.sweep_dir)
        payload = TaskPayload(
            task.index,
            tuple(task.overrides),
            attempt=len(task.attempts) + 1,
            resources=dataclasses.asdict(step.resources),
        )
        job = executor.submit(runner, payload)
        job_id = str(job.job_id)
        task.attempts.append(Attempt(job_id, time.time()))
        task.spec = dataclasses.asdict(new_spec)
        task.state, task.error = "PENDING", ""
        if state.backend == "slurm":
            state.array_ids.append(job_id.split("_")[0])
        log.warning("task %d: %s → resubmitted as %s (%s)", task.index, diag.cause, job_id, step.reason)
        return {"job_id": job_id, "resources": dataclasses.asdict(step.resources)}
