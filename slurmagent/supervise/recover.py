"""Recovery from the login node: a task that ended without a result is diagnosed, the
plan decides (resubmit with adjusted resources, or stop), and a resubmission goes through
the action gate, which records it in the sweep's audit log.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slurmagent.config import JobSpec, ResourcesConf, job_spec, site_conf
from slurmagent.errors import SlurmAgentError, SubmissionRefused
from slurmagent.files import atomic_write
from slurmagent.primitives.env import TaskFile
from slurmagent.records import Action, Decision, Evidence
from slurmagent.recovery.diagnose import Diagnosis, diagnose
from slurmagent.recovery.plan import NODE_SUSPECT_CAUSES, Resubmit, exclude_nodes, fix_command, plan
from slurmagent.safety.audit import AuditLog
from slurmagent.safety.executors import standalone_executors
from slurmagent.safety.gate import Gate
from slurmagent.safety.paths import SWEEP_AUDIT, SWEEP_HISTORY
from slurmagent.safety.policy import resolve_policy
from slurmagent.safety.switch import paused
from slurmagent.slurm.cluster import ClusterInfo
from slurmagent.slurm.seam import TERMINAL_STATES, JobState, SlurmCLI
from slurmagent.supervise.jobfiles import LOG_TAIL_BYTES, task_logs
from slurmagent.supervise.state import Attempt, SweepState, TaskRecord
from slurmagent.supervise.submission import WAITING, Submitter, close_intent, drop_intent, open_intent
from slurmagent.syntax import split_hostlist

log = logging.getLogger(__name__)

# states after which a task may be recovered; CANCELLED is a person's decision and is left alone
RECOVERABLE_STATES = frozenset({"FAILED", "OUT_OF_MEMORY", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL", "PREEMPTED"})
# earlier runs of a job that Slurm requeued by itself because their node failed
NODE_FAILURE_STATES = frozenset({"NODE_FAIL", "BOOT_FAIL"})


def collect_logs(state: SweepState, task: TaskRecord) -> dict[str, str]:
    """Everything that tells why a task failed: its job's logs, a command's own stderr, and
    the error it raised."""
    logs = task_logs(state, task.job_id) if task.job_id else {}
    command_err = Path(state.sweep_dir) / str(task.index) / TaskFile.COMMAND_STDERR  # task.command's own stderr
    if command_err.exists():
        logs[str(command_err)] = command_err.read_text(errors="replace")[-LOG_TAIL_BYTES:]
    if task.error:
        logs["task error"] = task.error
    return logs


HELD_FILE = ".slurmagent/held.json"  # tasks whose recovery waits for resume or approval
HISTORY_LOG_LINES = 20  # log lines kept per source in history.jsonl


class Recoverer:
    """`submit` sends a resubmission (the launcher's `Submitter`: supervision needs no
    knowledge of how jobs are built); `persist` writes the sweep state under the caller's
    lock, so a resubmission is recorded before its sbatch (supervise/submission.py)."""

    def __init__(
        self,
        sweep_dir: Path,
        slurm: SlurmCLI,
        submit: Submitter | None = None,
        persist: Callable[[SweepState], None] | None = None,
    ) -> None:
        self.sweep_dir = sweep_dir
        self.slurm = slurm
        self.submit = submit
        self.persist = persist or (lambda _state: None)
        self.audit = AuditLog(sweep_dir / SWEEP_AUDIT)
        self.history = sweep_dir / SWEEP_HISTORY
        self.held_path = sweep_dir / HELD_FILE
        self._cluster: ClusterInfo | None = None
        self._limited: dict[int, JobSpec] = {}  # task → the spec a limit-refused resubmission had
        resolve_policy(sweep_dir)  # a broken policy is reported now, not at the first failure

    def cluster(self, state: SweepState) -> ClusterInfo | None:
        if not state.where.queued:
            return None
        if self._cluster is None:
            self._cluster = ClusterInfo.query(self.slurm)
        return self._cluster

    def handle(self, state: SweepState, task: TaskRecord) -> None:
        """Called (under the sweep lock) when `task` just ended without a result."""
        if task.state not in RECOVERABLE_STATES or not state.spec_of(task) or task.job_id is None:
            return
        attempt = task.attempts[-1]
        if task.state in NODE_FAILURE_STATES and state.where.queued and self._requeued_by_slurm(task):
            return  # not a new attempt: the next poll sees the requeue and excludes the node
        logs = collect_logs(state, task)
        diag = _after_node_failure(diagnose(task.state, logs), attempt, state.suspect_nodes)
        task.diagnosis = diag.to_json()
        if diag.cause in NODE_SUSPECT_CAUSES:
            for node in filter(None, attempt.nodes.split(",")):
                state.suspect_nodes[node] = state.suspect_nodes.get(node, 0) + 1
        self._plan_and_request(state, task, diag, logs)

    def _plan_and_request(self, state: SweepState, task: TaskRecord, diag: Diagnosis, logs: dict[str, str]) -> None:
        assert task.job_id is not None
        attempt = task.attempts[-1]
        spec = job_spec(state.spec_of(task), require_task=False)
        step = plan(
            spec,
            task.stage_attempts,
            diag,
            attempt.nodes,
            self.cluster(state),
            {k: v - 1 for k, v in state.suspect_nodes.items()},
            site_conf(state.site),
        )
        seen = {"slurm_state": task.state, "attempt": len(task.attempts), "nodes": attempt.nodes}
        if not isinstance(step, Resubmit):
            fix = fix_command(
                diag,
                spec,
                task.overrides,
                attempt.nodes,
                self.cluster(state),
                sys.executable,
                {k: v - 1 for k, v in state.suspect_nodes.items()},
                site_conf(state.site),
            )
            if fix:  # the one-click fix: `slurmagent doctor` prints it
                diag = dataclasses.replace(diag, fix_command=fix)
                task.diagnosis = diag.to_json()
            task.error = f"{task.state}: {step.reason}\n{task.error}"
            self._record_history(task, seen, diag, logs, None, None, step.reason)
            return
        gate = Gate(self.audit, {"resubmit": lambda _action: self._submit(state, task, spec, step)}, job=task.job_id)
        action = Action(
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
            context={
                "attempt": len(task.attempts),
                "run_time_s": max(0.0, time.time() - attempt.submitted_at),  # an upper bound: includes queue time
                "qos": spec.resources.qos,
                "cause": diag.cause,
                "source": "recovery",
            },
        )
        job_id = task.job_id
        out = gate.request(action)
        if out.executed:
            self._resubmitted(state, task, spec, step, diag, out.result)
        elif task.index in self._limited:  # allowed, but Slurm's submit limit is reached: it waits its turn
            self._wait_for_limit(state, task, step.reason)
        self._record_history(task, seen, diag, logs, action, out.decision, step.reason)
        if out.held or out.approval_id:
            why = "the kill switch" if out.held else f"approval {out.approval_id} ({out.decision.rule})"
            task.error = f"{task.state}: recovery waits for {why}: {step.reason}\n{task.error}"
            self._set_held(task.index, {"job_id": job_id, "approval_id": out.approval_id, "since": time.time()})

    # -- held actions: the kill switch and approvals -------------------------------------
    def held(self) -> dict[str, dict[str, Any]]:
        try:
            raw = json.loads(self.held_path.read_text())
        except (OSError, ValueError):
            return {}
        return raw if isinstance(raw, dict) else {}

    def _write_held(self, held: dict[str, dict[str, Any]]) -> None:
        self.held_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.held_path, json.dumps(held, indent=1).encode())

    def _set_held(self, index: int, entry: dict[str, Any]) -> None:
        held = self.held()
        held[str(index)] = entry
        self._write_held(held)

    def retry_held(self, state: SweepState) -> bool:
        """Called (under the sweep lock) every poll: a held recovery is requested again once
        the switch is off; an approved one runs; a rejected or expired one ends the task."""
        held = self.held()
        if not held:
            return False
        changed = False
        by_index = {str(t.index): t for t in state.tasks}
        for key, entry in list(held.items()):
            task = by_index.get(key)
            if task is None or task.job_id != entry.get("job_id") or not task.done:
                held.pop(key)  # moved on (resubmitted, cancelled by a person…)
                continue
            approval = entry.get("approval_id")
            if approval is None:
                if paused(self.sweep_dir) is not None:
                    continue
                held.pop(key)
                self._write_held(held)  # _plan_and_request may hold it again
                diag = diagnosis_from_json(task.diagnosis or {})
                self._plan_and_request(state, task, diag, collect_logs(state, task))
                held = self.held()
                changed = True
                continue
            changed |= self._retry_approved(state, task, str(approval), held, key)
        self._write_held(held)
        return changed

    def _retry_approved(
        self, state: SweepState, task: TaskRecord, approval: str, held: dict[str, dict[str, Any]], key: str
    ) -> bool:
        spec = job_spec(state.spec_of(task), require_task=False)
        gate = Gate(self.audit, {}, job=task.job_id or "")
        st = gate.approvals.status(approval)
        if st.state == "pending":
            return False
        if st.state == "approved":
            request = Action.from_json(st.request.action)
            diag = diagnosis_from_json(task.diagnosis or {})
            step = Resubmit(
                _apply_changes(spec, request.params), request.reason, {k: tuple(v) for k, v in request.params.items()}
            )
            gate.executors["resubmit"] = lambda _action: self._submit(state, task, spec, step)
            out = gate.run_approved(approval)
            if out.held:
                return False
            if out.executed:
                self._resubmitted(state, task, spec, step, diag, out.result)
            elif task.index in self._limited:
                self._wait_for_limit(state, task, step.reason)
            else:
                why = out.result.get("error") or out.result.get("waiting") or out.result.get("state")
                task.error = f"{task.state}: approved recovery did not run ({why})\n{task.error}"
        else:
            task.error = f"{task.state}: recovery {st.state} (approval {approval})\n{task.error}"
        held.pop(key, None)
        return True

    def has_held(self) -> bool:
        return bool(self.held())

    # -- history for replay --------------------------------------------------------------
    def _record_history(
        self,
        task: TaskRecord,
        seen: dict[str, Any],
        diag: Diagnosis,
        logs: dict[str, str],
        action: Action | None,
        decision: Decision | None,
        plan_reason: str,
    ) -> None:
        entry = {
            "time": time.time(),
            "index": task.index,
            "job_id": task.job_id,
            **seen,
            "diagnosis": diag.to_json(),
            "logs": {src: "\n".join(text.splitlines()[-HISTORY_LOG_LINES:]) for src, text in logs.items()},
            "plan": "resubmit" if action is not None else "stop",
            "plan_reason": plan_reason,
            "action": action.to_json() if action is not None else None,
            "decision": dataclasses.asdict(decision) if decision is not None else None,
        }
        with open(self.history, "a") as fh:
            fh.write(json.dumps(entry, default=str) + "\n")

    def _submit(self, state: SweepState, task: TaskRecord, spec: JobSpec, step: Resubmit) -> dict[str, Any]:
        """The resubmit executor: records the intent (persisted before the sbatch), submits,
        returns the outcome; `_resubmitted` applies it."""
        if self.submit is None:
            raise SlurmAgentError("this supervisor cannot resubmit (no submitter was given to it)")
        new_spec = dataclasses.replace(spec, resources=step.resources)
        attempt = len(task.attempts) + 1
        intent = open_intent(state, [task], attempt)
        self.persist(state)
        try:
            ids = self.submit(state, [task], new_spec, attempt, str(intent["marker"]))
        except BaseException as exc:
            drop_intent(state, intent)
            self.persist(state)
            if isinstance(exc, SubmissionRefused) and exc.kind in ("limit", "transient"):
                self._limited[task.index] = new_spec  # it fits later: the task waits its turn
            raise
        return {"job_id": ids[0], "resources": dataclasses.asdict(step.resources), "marker": intent["marker"]}

    def _wait_for_limit(self, state: SweepState, task: TaskRecord, reason: str) -> None:
        """A resubmission the gate allowed met Slurm's submit limit (or a controller that did not
        answer): the task waits with its adjusted spec, and the supervisor submits it as its
        next attempt when there is room."""
        spec = self._limited.pop(task.index)
        task.spec_id = state.add_spec(dataclasses.asdict(spec))
        task.error = f"{task.state}: resubmission waits until Slurm takes it ({reason})\n{task.error}"
        task.state = WAITING

    @staticmethod
    def _resubmitted(
        state: SweepState, task: TaskRecord, spec: JobSpec, step: Resubmit, diag: Diagnosis, outcome: dict[str, Any]
    ) -> None:
        """Apply an executed resubmission's outcome to the sweep state: the task's next attempt."""
        job_id = str(outcome["job_id"])
        intent = next((i for i in state.submissions if i["marker"] == outcome.get("marker")), None)
        close_intent(state, [task], [job_id], intent)
        task.spec_id = state.add_spec(dataclasses.asdict(dataclasses.replace(spec, resources=step.resources)))
        log.warning("task %d: %s → resubmitted as %s (%s)", task.index, diag.cause, job_id, step.reason)

    def _requeued_by_slurm(self, task: TaskRecord) -> bool:
        """Whether Slurm requeued the job itself (a --requeue job whose node failed): accounting
        shows the failed run a moment before the requeued one, the controller knows at once.
        A resubmission then would run the task twice. When the controller does not answer,
        the task stays open and is looked at again at the next poll."""
        assert task.job_id is not None
        try:
            seen = self.slurm.job_state(task.job_id)
        except SlurmAgentError:
            seen = JobState("UNKNOWN", "", "")  # no answer: decide at the next poll
        now = seen.state if seen is not None else ""  # None: the controller forgot the job, it ended
        if not now or now in TERMINAL_STATES:
            return False
        log.warning("task %d: job %s ended %s and Slurm requeued it (%s)", task.index, task.job_id, task.state, now)
        task.state = task.attempts[-1].state = now
        return True

    def requeued_after_node_failure(
        self,
        state: SweepState,
        task: TaskRecord,
        runs: tuple[tuple[str, str], ...],
        job_state: str,
        job_nodes: str = "",
    ) -> None:
        """Slurm requeued the task's job by itself after `runs` (state, nodes) ended: a run
        lost to a failed node marks that node suspect in the sweep state and excludes it from
        the task, through the gate. While the requeued job still waits (PENDING: Slurm holds a
        requeued job ~10 s) the exclusion is made in place with `scontrol update` (and the node
        is taken out of a node list the job was pinned to); the job keeps its id and its
        checkpoint. Slurm changes no running job's ExcNodeList: a job the supervisor finds
        running again (`job_nodes`) — elsewhere, or on the failed node itself once Slurm took it
        back into service — is left running, and the exclusion goes into the task's spec, for
        its resubmissions; the audit record and the log say where the job runs."""
        failed = ",".join(nodes for st, nodes in runs if st in NODE_FAILURE_STATES and split_hostlist(nodes))
        if not failed or task.job_id is None:
            return
        diag = diagnose("NODE_FAIL", collect_logs(state, task))
        task.diagnosis = diag.to_json()
        for node in split_hostlist(failed):
            state.suspect_nodes[node] = state.suspect_nodes.get(node, 0) + 1
        if not state.spec_of(task):
            log.warning("task %d: node %s failed; Slurm requeued the job (now %s)", task.index, failed, job_state)
            return
        spec = job_spec(state.spec_of(task), require_task=False)
        resources, changes = exclude_nodes(spec.resources, failed)
        params: dict[str, Any] = {"exclude": resources.exclude}
        if any(k.startswith("extra.") for k in changes):  # it was pinned there: unpin (ReqNodeList)
            params["nodelist"] = resources.extra.get("nodelist", "")
        in_place = job_state == "PENDING"
        if in_place:
            executors = {"exclude_node": standalone_executors(self.sweep_dir, self.slurm)["exclude_node"]}
            reason = f"node_failure on {failed}: Slurm requeued the job; exclude {resources.exclude} from it"
        else:
            where = _where_it_runs(job_state, job_nodes, failed)
            reason = (
                f"node_failure on {failed}: Slurm requeued the job and it {where}; Slurm excludes no node from a job "
                f"that is not pending: it is left running, and {resources.exclude} is excluded from the task's "
                "resubmissions"
            )
            params["in_place"] = False

            def spec_only(action: Action) -> dict[str, Any]:
                return {"excluded": resources.exclude, "job": action.target, "in_place": False, "job_nodes": job_nodes}

            executors = {"exclude_node": spec_only}
        out = Gate(self.audit, executors, job=task.job_id).request(
            Action(
                "exclude_node",
                task.job_id,
                reason,
                params=params,
                evidence=diag.evidence,
                metrics_before={
                    "state": job_state,
                    "attempt": len(task.attempts),
                    "nodes": failed,
                    "job_nodes": job_nodes,
                    "cause": diag.cause,
                },
                context={"attempt": len(task.attempts), "cause": diag.cause, "source": "recovery"},
            )
        )
        if out.executed:
            task.spec_id = state.add_spec(dataclasses.asdict(dataclasses.replace(spec, resources=resources)))
            if in_place:
                log.warning(
                    "task %d: node %s failed; its requeued job %s now excludes %s",
                    task.index,
                    failed,
                    task.job_id,
                    resources.exclude,
                )
            else:
                log.warning("task %d: job %s: %s", task.index, task.job_id, reason)


def _after_node_failure(diag: Diagnosis, attempt: Attempt, suspect_nodes: dict[str, int]) -> Diagnosis:
    """A run SIGKILLed on a node that failed earlier in the sweep, after Slurm requeued the job
    from it: say so. Seen on the test cluster (issue 19, 11a): while the node was down,
    slurmctld queued a step signal for the job's earlier run (REQUEST_SIGNAL_TASKS, retried
    every 60 s); the node came back, the requeued job (same id, same step 0) started there, and
    the retry killed the new run's step — `srun: … task 0: Killed`, the job FAILED with its stale
    BeginTime reason and no record of ours. Slurm's race; the task is resubmitted as any killed
    one, away from the node (requeued_after_node_failure excluded it from its resubmissions)."""
    nodes = [n for n in split_hostlist(attempt.nodes) if n in suspect_nodes]
    if diag.cause != "killed" or not attempt.restarts or not nodes:
        return diag
    where = ",".join(nodes)
    note = (
        f" It ran on {where} after Slurm had requeued it from that node's failure: a signal Slurm queued for "
        "the job's earlier run while the node was down can reach the requeued run there (a Slurm race)."
    )
    evidence = Evidence(
        "sweep", 0, f"{where} failed earlier in this sweep; run {attempt.restarts + 1} of the job ran there"
    )
    return dataclasses.replace(diag, summary=diag.summary + note, evidence=[*diag.evidence, evidence])


def _where_it_runs(job_state: str, job_nodes: str, failed: str) -> str:
    """Where a job Slurm requeued after a node failure is now, in words for the audit log."""
    if job_state not in ("RUNNING", "COMPLETING"):
        return f"is {job_state or 'in an unknown state'} already"
    nodes = split_hostlist(job_nodes)
    if set(nodes) & set(split_hostlist(failed)):
        return f"already runs again on {job_nodes}, the failed node, which Slurm took back into service"
    return f"already runs again on {job_nodes or 'another node'}"


def diagnosis_from_json(raw: dict[str, Any]) -> Diagnosis:
    return Diagnosis(
        cause=str(raw.get("cause", "unknown")),
        summary=str(raw.get("summary", "")),
        retryable=bool(raw.get("retryable", False)),
        suggestion=str(raw.get("suggestion", "")),
        evidence=[Evidence(**e) for e in raw.get("evidence") or []],
        fix_command=raw.get("fix_command"),
    )


def _apply_changes(spec: JobSpec, params: dict[str, Any]) -> ResourcesConf:
    """The resources an approved resubmission asked for: key → [old, new]."""
    return dataclasses.replace(spec.resources, **{k: v[1] for k, v in params.items()})
