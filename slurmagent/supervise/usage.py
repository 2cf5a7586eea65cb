"""What a sweep's jobs used, from accounting: fed to the job history when tasks end, and
checked against the sweep's budget while it runs (the supervisor calls `UsageTracker.poll`).

Once the measured spend reaches a cap, no new task starts: the sweep's jobs that are still
pending (never started) are cancelled through the gate (action `cancel`, source `budget`)
and its WAITING tasks are not submitted; running tasks finish. `status` shows the spend.
"""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
import time
from collections.abc import Callable
from typing import Any

from slurmagent.config import BudgetConf, SiteConf, budget_conf, site_conf
from slurmagent.errors import SlurmCommandError, SlurmUnavailableError
from slurmagent.primitives.env import Progress
from slurmagent.records import Action
from slurmagent.safety.audit import AuditLog
from slurmagent.safety.gate import Gate
from slurmagent.safety.paths import SWEEP_AUDIT, current_user
from slurmagent.schedule.budget import Usage, reached, usage_of
from slurmagent.schedule.history import HistoryStore, default_history_path, fingerprint, row_from_usage
from slurmagent.slurm.seam import JobUsage, SlurmCLI
from slurmagent.supervise.state import SweepState, TaskRecord
from slurmagent.supervise.submission import WAITING
from slurmagent.supervise.views import progress
from slurmagent.syntax import split_hostlist

log = logging.getLogger(__name__)

SPEND_EVERY_S = 10.0  # how often a budgeted sweep's spend is measured (one sacct call)
# a sweep that is done waits this long at most for accounting (slurmdbd lags the controller) to
# show its last runs ended, so that they reach the history: plan and auto are sized from it
SETTLE_S = 30.0
INGEST_STATES = frozenset({"COMPLETED", "TIMEOUT", "OUT_OF_MEMORY"})


def _number(value: Any) -> float:
    """A figure from progress.json (written by the job: anything may be there); 0 = not reported."""
    try:
        out = float(value or 0.0)
    except (TypeError, ValueError):
        return 0.0
    return out if out == out and out > 0 else 0.0  # NaN and negatives: not reported


class UsageTracker:
    def __init__(self, slurm: SlurmCLI, clock: Callable[[], float] = time.monotonic) -> None:
        self.slurm = slurm
        self._clock = clock
        self._last = -float("inf")
        self._node_types: dict[str, str] | None = None

    @staticmethod
    def unrecorded(state: SweepState) -> list[TaskRecord]:
        """Ended tasks whose runs are not in the history yet (on a queued backend)."""
        if not state.where.queued:
            return []
        done = set(state.schedule.get("ingested", []))
        return [t for t in state.tasks if t.state in INGEST_STATES and t.index not in done and t.attempts]

    def poll(self, state: SweepState, ended: int) -> bool:
        """One sacct call when tasks ended (history) or the budget is due a look; True when
        the state changed."""
        if not state.where.queued:  # accounting is Slurm's
            return False
        budget = budget_conf(state.schedule.get("budget"))
        capped = bool(budget.gpu_hours or budget.cost) and not state.schedule.get("stopped")
        to_ingest = self.unrecorded(state)
        # measured when tasks ended too: a waiting task is submitted right after, and must not be if the cap is reached
        due = capped and (ended > 0 or self._clock() - self._last >= SPEND_EVERY_S)
        if not to_ingest and not due:
            return False
        jobs = {a.job_id: t for t in state.tasks for a in t.attempts if a.job_id}
        try:  # by the sweep's own job ids (arrays: every task), like the status query
            usages = self.slurm.usage(state.array_ids)
        except (SlurmCommandError, SlurmUnavailableError) as exc:  # accounting down: the next poll tries again
            log.warning("could not read the sweep's usage from sacct: %s", exc)
            return False
        by_job: dict[str, list[JobUsage]] = {}
        for u in usages:
            by_job.setdefault(u.job_id, []).append(u)
        changed = self._ingest(state, to_ingest, by_job)
        if due:
            self._last = self._clock()
            changed |= self._spend(state, budget, jobs, by_job)
        return changed

    def _ingest(self, state: SweepState, tasks: list[TaskRecord], by_job: dict[str, list[JobUsage]]) -> bool:
        site = site_conf(state.site)
        rows = []
        for task in tasks:
            runs = [u for a in task.attempts for u in by_job.get(a.job_id, [])]
            gpu_type = str(state.spec_of(task).get("resources", {}).get("gpu_type") or "")
            if not gpu_type and runs and runs[-1].gpus:  # an any-type request: the type of the node it ran on
                gpu_type = self._type_of(runs[-1].nodes)
            fp = fingerprint(state.job_name, task.overrides, site.scheduling.ignore_in_fingerprint)
            reported = progress(state, task) or {}  # the runtime's own figures, when it reports them
            key = f"{state.sweep_dir}#{task.index}"
            row = row_from_usage(
                fp,
                key,
                state.job_name,
                gpu_type,
                runs,
                steps_per_s=_number(reported.get(Progress.STEPS_PER_S)),
                gpu_mem_peak_mb=_number(reported.get(Progress.GPU_MEM_PEAK_MB)),
                host_mem_peak_mb=_number(reported.get(Progress.HOST_MEM_PEAK_MB)),
                gpu_oom_gib=self._gpu_oom_gib(task, site),
                checkpoint_s=_number(reported.get(Progress.CHECKPOINT_S)),
            )
            if row is not None:
                rows.append((task.index, row))
        if not rows:
            return False
        try:
            HistoryStore(default_history_path(site.scheduling.history)).add(r for _, r in rows)
        except (OSError, sqlite3.Error) as exc:  # a full disk or a locked shared file must not stop the sweep
            log.warning("could not write the job history: %s", exc)
            return False
        state.schedule["ingested"] = sorted({*state.schedule.get("ingested", []), *(i for i, _ in rows)})
        return True

    def _gpu_oom_gib(self, task: TaskRecord, site: SiteConf) -> float:
        """When the task's last failure was a GPU OOM: the memory of the GPU type it ran out on
        (the type of the failed attempts' nodes; 0 when not known). The need is more than that,
        even for a job that records no GPU peak (a plain script)."""
        if not task.diagnosis or task.diagnosis.get("cause") != "gpu_oom":
            return 0.0
        failed = task.attempts if task.state != "COMPLETED" else task.attempts[:-1]
        sizes = [site.memory_gib(self._type_of(a.nodes)) or 0.0 for a in failed if a.nodes]
        return max(sizes, default=0.0)

    def _type_of(self, nodes: str) -> str:
        if self._node_types is None:
            try:
                self._node_types = self.slurm.node_gpu_types()
            except (SlurmCommandError, SlurmUnavailableError) as exc:  # the row's type stays unknown
                log.warning("could not read the nodes' GPU types: %s", exc)
                self._node_types = {}
        first = next(iter(split_hostlist(nodes)), "")
        if "[" in first:  # t4-[1-2] → t4-1
            base, _, rest = first.partition("[")
            first = base + rest.split(",")[0].split("-")[0].rstrip("]")
        return self._node_types.get(first, "")

    def _spend(
        self, state: SweepState, budget: BudgetConf, jobs: dict[str, TaskRecord], by_job: dict[str, list[JobUsage]]
    ) -> bool:
        site = site_conf(state.site)
        spent = Usage()
        for job_id, runs in by_job.items():
            task = jobs.get(job_id)
            gpu_type = state.spec_of(task).get("resources", {}).get("gpu_type") if task is not None else None
            for u in runs:  # an any-type request is priced at the type of the node each run ran on
                ran_on = gpu_type or (self._type_of(u.nodes) if u.gpus and u.nodes else None)
                spent = spent + usage_of(u.gpus, u.elapsed_s, ran_on, site)
        state.schedule["spent"] = dataclasses.asdict(spent)
        why = reached(budget, spent)
        if not why:
            return True
        not_started = [t for t in state.tasks if not t.done and (t.state in (WAITING, "PENDING"))]
        pending_jobs = sorted(t.job_id for t in not_started if t.job_id and t.state == "PENDING")
        action = Action(
            kind="cancel",
            target=state.sweep_dir,
            reason=f"the sweep's budget is reached ({why}): its tasks that have not started are not started",
            params={"jobs": pending_jobs, "tasks": [t.index for t in not_started]},
            metrics_before={"spent": dataclasses.asdict(spent)},
            context={"source": "budget", "user": current_user()},
        )
        gate = Gate(AuditLog(state.sweep_dir + "/" + SWEEP_AUDIT), {"cancel": lambda _a: self._cancel(pending_jobs)})
        out = gate.request(action)
        state.schedule["stopped"] = (
            why if out.executed else f"{why} (the policy did not allow the cancel: {out.decision.rule})"
        )
        if out.executed:
            for t in not_started:
                t.state, t.error = "CANCELLED", f"CANCELLED: not started, the sweep's budget is reached ({why})"
        log.warning("budget reached (%s): %d task(s) not started", why, len(not_started) if out.executed else 0)
        return True

    def _cancel(self, job_ids: list[str]) -> dict[str, Any]:
        self.slurm.cancel(job_ids)
        return {"cancelled": job_ids}
