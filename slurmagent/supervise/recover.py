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
from slurmagent.errors import SlurmAgentError
from slurmagent.gate import Action, AuditLog, Gate
from slurmagent.recovery.diagnose import Diagnosis, diagnose
from slurmagent.recovery.plan import NODE_SUSPECT_CAUSES, Resubmit, exclude_nodes, plan, split_hostlist
from slurmagent.slurm.cluster import ClusterInfo
from slurmagent.slurm.seam import TERMINAL_STATES, SlurmCLI
from slurmagent.supervise.state import Attempt, SweepState, TaskRecord

log = logging.getLogger(__name__)

# states after which a task may be recovered; CANCELLED is a person's decision and is left alone
RECOVERABLE_STATES = frozenset({"FAILED", "OUT_OF_MEMORY", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL", "PREEMPTED"})
LOG_TAIL_BYTES = 200_000
# earlier runs of a job that Slurm requeued by itself because their node failed
NODE_FAILURE_STATES = frozenset({"NODE_FAIL", "BOOT_FAIL"})


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
        if task.state in NODE_FAILURE_STATES and state.backend == "slurm" and self._requeued_by_slurm(task):
            return  # not a new attempt: the next poll sees the requeue and excludes the node
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
        job = executor.submit(runner, TaskPayload(task.index, tuple(task.overrides), attempt=len(task.attempts) + 1))
        job_id = str(job.job_id)
        task.attempts.append(Attempt(job_id, time.time()))
        task.spec = dataclasses.asdict(new_spec)
        task.state, task.error = "PENDING", ""
        if state.backend == "slurm":
            state.array_ids.append(job_id.split("_")[0])
        log.warning("task %d: %s → resubmitted as %s (%s)", task.index, diag.cause, job_id, step.reason)
        return {"job_id": job_id, "resources": dataclasses.asdict(step.resources)}

    def _requeued_by_slurm(self, task: TaskRecord) -> bool:
        """Whether Slurm requeued the job itself (a --requeue job whose node failed): accounting
        shows the failed run a moment before the requeued one, the controller knows at once.
        A resubmission then would run the task twice. When the controller does not answer,
        the task stays open and is looked at again at the next poll."""
        assert task.job_id is not None
        try:
            now = self.slurm.run(["squeue", "-h", "-j", task.job_id, "-o", "%T"]).strip()
        except SlurmAgentError as exc:
            if "Invalid job id" in str(exc):
                return False  # the controller forgot the job: it ended
            now = "UNKNOWN"  # no answer: decide at the next poll
        if not now or now in TERMINAL_STATES:
            return False
        log.warning("task %d: job %s ended %s and Slurm requeued it (%s)", task.index, task.job_id, task.state, now)
        task.state = task.attempts[-1].state = now
        return True

    def requeued_after_node_failure(
        self, state: SweepState, task: TaskRecord, runs: tuple[tuple[str, str], ...], job_state: str
    ) -> None:
        """Slurm requeued the task's job by itself after `runs` (state, nodes) ended: a run
        lost to a failed node marks that node suspect in the sweep state, and while the job
        still waits, the node is excluded from it (and taken out of a node list it was pinned
        to) with `scontrol update`, through the gate. The job keeps its id and its checkpoint."""
        failed = ",".join(nodes for st, nodes in runs if st in NODE_FAILURE_STATES and split_hostlist(nodes))
        if not failed or task.job_id is None:
            return
        diag = diagnose("NODE_FAIL", collect_logs(state, task))
        task.diagnosis = diag.to_json()
        for node in split_hostlist(failed):
            state.suspect_nodes[node] = state.suspect_nodes.get(node, 0) + 1
        if not task.spec or job_state != "PENDING":
            log.warning("task %d: node %s failed; Slurm requeued the job (now %s)", task.index, failed, job_state)
            return
        spec = job_spec(task.spec, require_task=False)
        resources, changes = exclude_nodes(spec.resources, failed)
        job_id = task.job_id

        def exclude(action: Action) -> dict[str, Any]:
            del action
            argv = ["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={resources.exclude}"]
            if any(k.startswith("extra.") for k in changes):
                argv.append(f"ReqNodeList={resources.extra.get('nodelist', '')}")
            self.slurm.run(argv)
            task.spec = dataclasses.asdict(dataclasses.replace(spec, resources=resources))
            log.warning(
                "task %d: node %s failed; its requeued job %s now excludes %s",
                task.index,
                failed,
                job_id,
                resources.exclude,
            )
            return {"job_id": job_id, "exclude": resources.exclude}

        Gate(self.audit, {"exclude_node": exclude}, job=job_id).request(
            Action(
                "exclude_node",
                job_id,
                f"node_failure on {failed}: Slurm requeued the job; exclude {resources.exclude} from it",
                params={k: list(v) for k, v in changes.items()},
                evidence=diag.evidence,
                metrics_before={
                    "state": job_state,
                    "attempt": len(task.attempts),
                    "nodes": failed,
                    "cause": diag.cause,
                },
            )
        )
