"""Submitting a sweep's tasks so that no job is ever orphaned.

Every task is in `sweep.json` before anything is submitted (state WAITING, no attempt yet).
Each submission — an array of tasks that share a job spec, or one resubmitted task — is
recorded as an intent before its `sbatch` (with a marker the job carries as its
`--comment`) and completed with the job id after it. A launcher killed in between leaves an
intent that the next poll reconciles: the marked job is found in the queue and recorded, or
was never submitted and its tasks stay WAITING. So `status`, `watch` and `cancel` always
know every job of the sweep.

A refusal is handled by its kind (`slurm/seam.py:refusal_kind`): a transient one is retried
by the seam with back-off; a submit limit (MaxSubmitJobs, the cluster's MaxJobCount) leaves
the remaining tasks WAITING, and the supervisor submits them as earlier tasks end, never
more than the limit it reads from accounting; anything else is a permanent refusal,
reported with Slurm's message.

This module decides what to submit and records it; how a job is built and sent is the
`Submitter` the launcher hands in (`launch/backend.py`).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from slurmagent.config import JobSpec, job_spec, site_conf
from slurmagent.errors import SubmissionRefused
from slurmagent.primitives.procs import command_running, pid_alive
from slurmagent.safety.paths import current_user
from slurmagent.slurm.seam import SlurmCLI
from slurmagent.supervise.state import Attempt, SweepState, TaskRecord

log = logging.getLogger(__name__)

WAITING = "WAITING"  # in sweep.json, not submitted yet (slurmagent's state, not Slurm's)
REFUSED = "REFUSED"  # Slurm refused its submission for good (the message is the task's error)
# an intent without a job id this old is looked up in the queue (longer than one sbatch may
# take, so a killed launcher's sbatch still in flight has ended); at once when its submitter
# ran on this host, is gone, and no sbatch runs here
RECONCILE_AFTER_S = 90.0
RETRY_LIMIT_AFTER_S = 30.0  # after a limit refusal, try again this long later (or when a task ends)


class Submitter(Protocol):
    """Sends `tasks` (sharing `spec`) to the backend as one job or array, each as its
    `attempt`, the job carrying `comment`; returns the job ids in the tasks' order. The
    launcher provides it (`launch/backend.py`)."""

    def __call__(
        self, state: SweepState, tasks: list[TaskRecord], spec: JobSpec, attempt: int, comment: str
    ) -> list[str]: ...


@dataclass
class SubmitReport:
    submitted: int = 0  # tasks submitted by this call
    arrays: list[str] = field(default_factory=list)  # their jobs' own ids
    waiting: int = 0  # tasks still WAITING afterwards
    limit: int | None = None  # the submit limit read from accounting, when one is set
    refused: str = ""  # Slurm's message for a permanent refusal (those tasks are REFUSED)
    refused_tasks: int = 0
    held_back: str = ""  # why tasks wait (a submit limit), for people


def open_intent(state: SweepState, tasks: list[TaskRecord], attempt: int) -> dict[str, Any]:
    """Record that `tasks` are about to be submitted (persist it before the sbatch); the
    marker is the job's --comment, by which a lost submission is found again."""
    intent: dict[str, Any] = {
        "marker": f"slurmagent:{uuid.uuid4().hex[:12]}",
        "tasks": [t.index for t in tasks],
        "attempt": attempt,
        "job_id": None,
        "state": "submitting",
        "at": time.time(),
        "host": socket.gethostname(),  # who submits: a dead submitter on this host has nothing in flight
        "pid": os.getpid(),
    }
    state.submissions.append(intent)
    state.touch(tasks, intent)
    return intent


def drop_intent(state: SweepState, intent: dict[str, Any]) -> None:
    """Nothing was submitted (refused, denied, held)."""
    if intent in state.submissions:
        state.submissions.remove(intent)
        state.touch(intent=intent)


def close_intent(state: SweepState, tasks: list[TaskRecord], ids: list[str], intent: dict[str, Any] | None) -> None:
    """The submission's job ids are the tasks' next attempts."""
    now = time.time()
    for task, job_id in zip(tasks, ids, strict=True):
        task.attempts.append(Attempt(job_id, now))
        task.state, task.error = "PENDING", ""
    state.finished_at = None
    own = ids[0].split("_")[0]
    if state.where.queued and own not in state.array_ids:
        state.array_ids.append(own)
    if intent is not None:
        intent.update(job_id=own, state="submitted")
    state.touch(tasks, intent)


def submit_recorded(
    state: SweepState,
    persist: Callable[[], None],
    submit: Submitter,
    tasks: list[TaskRecord],
    spec: JobSpec,
    attempt: int,
) -> list[str]:
    """One submission, recorded before and after: the intent is persisted, then sbatch, then
    the job ids go into the tasks' attempts."""
    intent = open_intent(state, tasks, attempt)
    persist()
    try:
        ids = submit(state, tasks, spec, attempt, str(intent["marker"]))
    except BaseException:
        drop_intent(state, intent)
        persist()
        raise
    close_intent(state, tasks, ids, intent)
    persist()
    return ids


def reconcile(state: SweepState, slurm: SlurmCLI, user: str) -> int:
    """Intents a killed launcher left without a job id: find the marked job in the queue and
    record it; not there after RECONCILE_AFTER_S, it was never submitted (its tasks stay
    WAITING). Returns how many tasks were recovered."""
    recovered = 0
    by_index = {t.index: t for t in state.tasks}
    for intent in [i for i in state.submissions if i["state"] == "submitting"]:
        if time.time() - float(intent["at"]) < RECONCILE_AFTER_S and _may_be_in_flight(intent):
            continue
        found = slurm.jobs_with_comment(str(intent["marker"]), user)
        tasks = [by_index[i] for i in intent["tasks"] if i in by_index]
        if found:
            own = found[0]
            ids = [own] if len(tasks) == 1 else [f"{own}_{k}" for k in range(len(tasks))]
            close_intent(state, tasks, ids, intent)
            recovered += len(tasks)
            log.warning("found job %s of an unrecorded submission (%s): recorded", own, intent["marker"])
        else:
            drop_intent(state, intent)
    return recovered


def _may_be_in_flight(intent: dict[str, Any]) -> bool:
    """Whether the intent's sbatch may still be running: yes unless its submitter ran on
    this host and is gone, and no sbatch of this user runs here (an orphaned one would)."""
    if intent.get("host") != socket.gethostname() or not intent.get("pid"):
        return True
    if pid_alive(intent["pid"]):
        return True
    return command_running("sbatch") is not False


def in_flight(state: SweepState) -> set[int]:
    """Tasks of a submission whose job id is not recorded yet (a killed launcher's)."""
    return {i for intent in state.submissions if intent["state"] == "submitting" for i in intent["tasks"]}


def waiting_groups(state: SweepState) -> list[tuple[str, int, list[TaskRecord]]]:
    """The WAITING tasks as (spec id, attempt, tasks): those submitted together, in task order."""
    groups: dict[tuple[str, int], list[TaskRecord]] = {}
    busy = in_flight(state)
    for t in sorted(state.tasks, key=lambda t: t.index):
        if t.state == WAITING and t.index not in busy:
            groups.setdefault((t.spec_id, len(t.attempts) + 1), []).append(t)
    return [(spec_id, attempt, tasks) for (spec_id, attempt), tasks in groups.items()]


def waiting(state: SweepState) -> int:
    return sum(1 for t in state.tasks if t.state == WAITING)


def submit_waiting(
    state: SweepState,
    persist: Callable[[], None],
    submit: Submitter,
    slurm: SlurmCLI | None,
    max_array: int,
    user: str | None = None,
    caps: dict[str, int] | None = None,
) -> SubmitReport:
    """Submit the WAITING tasks: arrays of at most `max_array` tasks, no more than the user's
    submit limit allows now, nor the `caps` on the user's active + pending jobs per partition
    (site.scheduling.max_jobs_per_partition). A limit refusal leaves the rest WAITING
    (`held_back` says why); a permanent one marks that group's tasks REFUSED and goes on with
    the others."""
    report = SubmitReport()
    user = user or current_user()
    on_slurm = slurm is not None and state.where.queued
    if on_slurm:
        assert slurm is not None
        reconcile(state, slurm, user)
    groups = waiting_groups(state)
    if not groups:
        state.held_back = ""
        return report
    room: int | None = None
    if on_slurm:
        assert slurm is not None
        report.limit = slurm.submit_limit(
            user, job_spec(state.specs[groups[0][0]], require_task=False).resources.qos or ""
        )
        if report.limit is not None:
            room = max(0, report.limit - slurm.queued_jobs(user))
    cap = max(1, max_array)  # halved at each limit refusal of an array: a limit not read may still fit part
    capped: dict[str, int] = {}  # partition → room left under its cap
    default_partition = None
    caps = partition_caps(state) if caps is None else caps
    if on_slurm and caps:
        assert slurm is not None
        held = slurm.jobs_by_partition(user)
        capped = {p: max(0, n - held.get(p, 0)) for p, n in caps.items()}
        default_partition = slurm.default_partition()
    at_cap: list[str] = []
    for spec_id, attempt, tasks in groups:
        spec = job_spec(state.specs[spec_id], require_task=False)
        partition = spec.resources.partition or default_partition or ""
        while tasks and not report.held_back:
            size = min(len(tasks), cap, len(tasks) if room is None else room, capped.get(partition, len(tasks)))
            if size <= 0 and partition in capped and capped[partition] <= 0:
                at_cap.append(f"{caps[partition] if caps else 0} jobs in partition {partition} (your cap)")
                break
            if size <= 0:
                report.held_back = f"Slurm's submit limit ({report.limit} jobs per user) is reached"
                break
            part, tasks = tasks[:size], tasks[size:]
            try:
                ids = submit_recorded(state, persist, submit, part, spec, attempt)
            except SubmissionRefused as exc:
                message = _last_line(exc.stderr) or str(exc)
                if exc.kind == "transient":  # the seam's retries are spent: the supervisor tries again later
                    report.held_back = f"Slurm did not answer ({message})"
                    break
                if exc.kind == "limit" and len(part) > 1:
                    tasks, cap = part + tasks, len(part) // 2
                    continue
                if exc.kind == "limit" and not _limit_is_not_the_cause(exc, report.limit, slurm, user):
                    report.held_back = _held_back(message, report.limit)
                    break
                for t in (*part, *tasks):
                    t.state, t.error = REFUSED, f"{REFUSED}: {message}"
                state.touch((*part, *tasks))
                report.refused, report.refused_tasks = message, report.refused_tasks + len(part) + len(tasks)
                log.error("sbatch refused %d task(s): %s", len(part) + len(tasks), message)
                persist()
                break
            report.submitted += len(part)
            report.arrays.append(ids[0].split("_")[0])
            if room is not None:
                room -= len(part)
            if partition in capped:
                capped[partition] -= len(part)
        if report.held_back:
            break
    if at_cap and not report.held_back:
        report.held_back = "reached " + ", ".join(sorted(set(at_cap)))
    report.waiting = waiting(state)
    state.held_back = report.held_back if report.waiting else ""
    return report


def partition_caps(state: SweepState) -> dict[str, int]:
    """The caps the sweep was launched with (site.scheduling.max_jobs_per_partition)."""
    return dict(site_conf(state.site).scheduling.max_jobs_per_partition) if state.site is not None else {}


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1].strip() if lines else ""


def _limit_is_not_the_cause(exc: SubmissionRefused, limit: int | None, slurm: SlurmCLI | None, user: str) -> bool:
    """sbatch says "job submit limit, user's size and/or time limits" for a submit limit and
    for a job over a size or time limit (a QOS with DenyOnLimit): when none of the user's
    jobs is queued, or fewer than the known limit, the job itself is refused, and waiting
    will not change that. (The cluster's MaxJobCount counts everyone's jobs: always a limit.)"""
    if "resource temporarily unavailable" in exc.stderr.lower() or slurm is None:
        return False
    queued = slurm.queued_jobs(user)
    return queued == 0 or (limit is not None and queued < limit)


def _held_back(message: str, limit: int | None) -> str:
    if limit is not None:
        return f"Slurm's submit limit ({limit} jobs per user) is reached"
    return f"Slurm refused more jobs for now ({message})"
