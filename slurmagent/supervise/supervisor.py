"""Supervision from the login node: one batched status query per poll interval for the
whole sweep, results collected from submitit's result files, states kept in sweep.json.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from slurmagent.errors import SlurmAgentError
from slurmagent.primitives.wake import WakeWatch
from slurmagent.recovery.diagnose import TRACEBACK_HEAD, clean_traceback, outside_tracebacks, python_error
from slurmagent.slurm.cluster import DEFAULT_MAX_ARRAY_SIZE
from slurmagent.slurm.seam import TERMINAL_STATES, SlurmCLI, TaskStatus
from slurmagent.supervise.jobfiles import STDERR_TAIL, job_paths, read_result, stderr_tail, unwrap_return
from slurmagent.supervise.lead import Lead
from slurmagent.supervise.notices import Notices
from slurmagent.supervise.recover import Recoverer
from slurmagent.supervise.state import SweepState, SweepStore, TaskRecord
from slurmagent.supervise.submission import RETRY_LIMIT_AFTER_S, WAITING, Submitter, submit_waiting
from slurmagent.supervise.usage import SETTLE_S, UsageTracker
from slurmagent.supervise.views import STUDY_SETTINGS, summary_line, sweep_table, terminal

if TYPE_CHECKING:
    from slurmagent.supervise.study import StudyDriver

log = logging.getLogger(__name__)


# Slurm's reasons for a job to wait (squeue's REASON): stale, not a cause, once the job has ended
WAITING_REASONS = ("BeginTime", "Priority", "Resources", "Dependency", "JobHeldUser", "JobHeldAdmin", "ReqNodeNotAvail",
                   "QOSMaxJobsPerUserLimit", "AssocGrpJobsLimit", "PartitionTimeLimit", "Reservation")  # fmt: skip


def failure_text(word: str, error: str, stderr: str) -> str:
    """A failed task's error: the exception first (`FAILED: RuntimeError: boom`), then its
    traceback once, without Python's `^^^^` markers, then what the job's stderr adds to it."""
    raised = python_error({"result": error})
    lines = clean_traceback(error)
    if len(lines) > STDERR_TAIL:  # the head, then the innermost frames (the user's are last)
        head_line = [lines[0]] if lines[0].strip() == TRACEBACK_HEAD else []
        lines = [*head_line, "  …", *lines[-(STDERR_TAIL - 2) :]]
    head = raised.evidence.text if raised is not None else (lines[-1].strip() if lines else "")
    text = f"{word}: {head}" + ("\n" + "\n".join(lines) if lines and lines != [head] else "")
    seen = {line.strip() for line in clean_traceback(error)}
    # a tail may begin inside a traceback (no head to recognise it by): its frames are in `seen`
    extra = [line for line in clean_traceback("\n".join(outside_tracebacks(stderr))) if line.strip() not in seen]
    extra = [line for line in extra if line.strip()]
    if extra:
        text += "\nlast stderr lines:\n" + "\n".join(extra[-STDERR_TAIL:])
    return text


class Supervisor:
    def __init__(
        self,
        sweep_dir: str | Path,
        slurm: SlurmCLI | None = None,
        poll_interval_s: float = 2.0,
        max_poll_interval_s: float = 30.0,
        console: Console | None = None,
        sleep: Callable[[float], None] = time.sleep,
        submit: Submitter | None = None,
        store: SweepStore | None = None,
    ) -> None:
        # the launcher hands in its own store (the state it holds is not read again)
        self.store = store if store is not None else SweepStore(sweep_dir)
        self.slurm = slurm or SlurmCLI()
        self.poll_interval_s = poll_interval_s
        self.max_poll_interval_s = max_poll_interval_s
        self.console = console or terminal(stderr=True)
        self._wake = WakeWatch(self.store.dir, sleep)  # a job's end cuts a sleep short
        self._no_result_seen: dict[str, int] = {}
        self.queries = 0
        self.results: dict[int, Any] = {}  # index → raw return (JobReturn) read from pickles
        self.submit = submit
        self.recoverer = Recoverer(self.store.dir, self.slurm, submit, self.store.write)
        # a search (hydra/sweeper=slurmagent_hpo): its driver runs in every poll of whoever leads
        self.study: StudyDriver | None = None
        if (self.store.dir / STUDY_SETTINGS).exists():  # optuna is imported only for a search
            from slurmagent.supervise.study import StudyDriver

            self.study = StudyDriver.open(self.store.dir)
        self._last_submit_try = -float("inf")  # monotonic time of the last try at WAITING tasks
        self.usage = UsageTracker(self.slurm)
        self._notices: Notices | None = None  # opened from the state at the first poll
        self._notices_opened = False  # … and then None: it tells nobody

    # -- one poll ---------------------------------------------------------------
    def _statuses(self, state: SweepState, pending: list[TaskRecord]) -> dict[str, TaskStatus]:
        if state.where.queued:
            self.queries += 1
        return state.where.statuses(self.slurm, [t.job_id for t in pending if t.job_id])

    def poll_once(self) -> bool:
        """Update every unfinished task; True when something changed."""
        with self.store.edit() as state:
            # recoveries the kill switch held or that waited for approval, retried first
            changed = self.recoverer.retry_held(state)
            pending = [t for t in state.tasks if not t.done and t.state != WAITING]
            statuses = self._statuses(state, pending) if pending else {}
            ended = 0
            for task in pending:
                restarts_before = task.attempts[-1].restarts if task.attempts else 0
                changed |= self._update_task(state, task, statuses)
                status = statuses.get(task.job_id or "")
                if status is not None and status.restarts > restarts_before:  # Slurm requeued it
                    runs = status.earlier[restarts_before:]
                    self.recoverer.requeued_after_node_failure(state, task, runs, status.state, status.nodes)
                ended += task.done
                if task.done and task.state != "COMPLETED":
                    self.recoverer.handle(state, task)  # may resubmit it as its next attempt
            held = {int(k) for k in self.recoverer.held()}  # recoveries waiting for approval or the kill switch
            if self.study is not None:  # results told, promotions and new trials added as WAITING
                asked = self.study.step(state, held)
                changed |= asked
                ended += asked
            changed |= self.usage.poll(state, ended)  # the history fed, the budget enforced (sacct)
            changed |= self._submit_waiting(state, ended)
        notices = self.notices(state)
        if notices is not None:  # after the edit: its end may have marked the sweep finished
            notices.poll(state, held)
        return changed

    def notices(self, state: SweepState) -> Notices | None:
        """Who is told what happens (notify.*), as the sweep was launched with; None: nobody."""
        if not self._notices_opened:
            self._notices_opened = True
            try:
                self._notices = Notices.open(self.store.dir, state.notify)
            except SlurmAgentError as exc:  # checked at submission: a sweep.json edited since
                log.warning("notify: %s; nobody is told about this sweep", exc)
        return self._notices

    def _submit_waiting(self, state: SweepState, ended: int) -> bool:
        """Tasks a submit limit held back (or a killed launcher never submitted) are
        submitted when tasks have ended (or a search added some), else at most every
        RETRY_LIMIT_AFTER_S."""
        if self.submit is None or not any(t.state == WAITING for t in state.tasks):
            return False
        now = time.monotonic()
        if not ended and now - self._last_submit_try < RETRY_LIMIT_AFTER_S:
            return False
        self._last_submit_try = now
        slurm = self.slurm if state.where.queued else None
        report = submit_waiting(
            state, lambda: self.store.write(state), self.submit, slurm, state.max_array or DEFAULT_MAX_ARRAY_SIZE
        )
        if report.submitted or report.refused:
            held = f"; {report.waiting} still wait: {report.held_back}" if report.waiting else ""
            refused = f"; Slurm refused {report.refused_tasks}: {report.refused}" if report.refused else ""
            log.warning("submitted %d waiting task(s)%s%s", report.submitted, held, refused)
        return bool(report.submitted or report.refused)

    def _update_task(self, state: SweepState, task: TaskRecord, statuses: dict[str, TaskStatus]) -> bool:
        job_id = task.job_id
        if job_id is None:
            return False
        attempt = task.attempts[-1]
        before = (task.state, attempt.state)
        res = read_result(job_paths(state, job_id).result_pickle)
        status = statuses.get(job_id)
        if status is not None:
            attempt.state, attempt.nodes, attempt.restarts = status.state, status.nodes, status.restarts
            attempt.reason = status.reason if status.reason not in ("None", "") else attempt.reason
        if res is not None:
            kind, value = res
            ok, ret, err = unwrap_return(value) if kind == "success" else (False, None, str(value).strip())
            if ok and state.where.queued and status is not None and status.state not in TERMINAL_STATES:
                # the task returned and its job is ending (COMPLETING, epilog): it is done when Slurm
                # says so, so that nothing submitted next (a search's next trial) overlaps it
                task.state = status.state
                return (task.state, attempt.state) != before
            if ok:
                self.results[task.index] = value
                task.state, task.result, task.error = "COMPLETED", ret, ""
                attempt.state = task.state
                return (task.state, attempt.state) != before
            if state.where.queued and (status is None or status.state not in TERMINAL_STATES):
                # the task raised; wait for Slurm's verdict on the job (OOM, time limit…)
                return (task.state, attempt.state) != before
            specific = status is not None and status.state in TERMINAL_STATES - {"COMPLETED", "FAILED"}
            word = status.state if specific and status is not None else "FAILED"
            task.state = attempt.state = word
            self.results[task.index] = None
            task.error = failure_text(word, err, stderr_tail(state, job_id))
        elif status is not None and (status.state in TERMINAL_STATES or status.state == "EXITED"):
            seen = self._no_result_seen.get(job_id, 0) + 1
            self._no_result_seen[job_id] = seen
            # the result file is written before the job ends; allow one poll for it to appear
            if status.state not in ("COMPLETED", "EXITED") or seen >= 2:
                word = status.state if status.state not in ("COMPLETED", "EXITED") else "FAILED"
                task.state = word
                # an ended job's Reason is often the last it waited for (BeginTime after a requeue), not why it ended
                why = f" ({status.reason})" if status.reason not in ("None", "", *WAITING_REASONS) else ""
                exit_info = f", exit {status.exit_code}" if status.exit_code else ""
                tail = "\n".join(clean_traceback(stderr_tail(state, job_id)))
                task.error = f"{word}{why}{exit_info}, no result" + (f"; last stderr lines:\n{tail}" if tail else "")
        elif status is not None:
            task.state = status.state
        return (task.state, attempt.state) != before

    # -- waiting ----------------------------------------------------------------------
    def table(self, state: SweepState | None = None) -> Table:
        return sweep_table(state or self.store.view())

    def wait(
        self,
        live: bool | None = None,
        timeout_s: float | None = None,
        role: str = "watch",
        stop: Callable[[], bool] | None = None,
    ) -> SweepState:
        """Supervise until every task is done (or `timeout_s`, or `stop()`): acting while this
        process holds the sweep's lead (supervise/lead.py), following the one that does
        otherwise, and taking over when it stops."""
        interval = self.poll_interval_s
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        live = self.console.is_terminal if live is None else live
        last_counts: dict[str, int] = {}
        lead, following = Lead(self.store.dir, role), False
        try:
            with (
                Live(self.table(), console=self.console, auto_refresh=False, transient=False) if live else _Null()
            ) as view:
                while True:
                    leading = lead.take()
                    if leading == following:  # just started following, or just took over
                        following = not leading
                        what = f"{lead.describe_holder()} supervises this sweep; following it" if following else ""
                        self.console.print(
                            f"[sweep] {what or 'supervising it now (' + role + ')'}", markup=False, highlight=False
                        )
                    changed = self.poll_once() if leading else False
                    state = self.store.view()  # what changed since the last poll read (by this one, or the lead)
                    changed |= state.counts() != last_counts
                    if live:
                        view.update(self.table(state), refresh=True)
                    elif state.counts() != last_counts:
                        self.console.print(f"[sweep] {summary_line(state)}", markup=False, highlight=False)
                    last_counts = state.counts()
                    # finished_at: set by the end of an edit that left every task done; a state
                    # written mid-edit (a resubmission's intent, before its sbatch) is not the end
                    if state.done and state.finished_at is not None and not self.recoverer.has_held():
                        if leading:
                            self._settle_history()
                        notices = self.notices(state) if leading else None
                        if notices is not None:  # what is not sent yet is tried a while longer
                            for left in notices.flush():
                                self.console.print(
                                    f"[sweep] not sent by {left.channel}: {left.event} ({left.error})",
                                    markup=False,
                                    highlight=False,
                                )
                        break
                    if deadline is not None and time.monotonic() > deadline:
                        break
                    if stop is not None and stop():
                        break
                    interval = self.poll_interval_s if changed else min(interval * 1.5, self.max_poll_interval_s)
                    # a job that ended cuts the back-off short (never below the base interval)
                    if self._wake.sleep(interval, at_least=self.poll_interval_s):
                        interval = self.poll_interval_s
        finally:
            lead.release()
        self._collect_results(state)
        return state

    def _settle_history(self) -> None:
        """The sweep is done, but accounting may not show its last runs ended yet (slurmdbd
        lags the controller): ask sacct again, every poll interval, until they reach the
        history or SETTLE_S has passed."""
        deadline = time.monotonic() + SETTLE_S
        while True:
            with self.store.edit() as state:
                self.usage.poll(state, 0)  # asks sacct only while some are left
                left = len(self.usage.unrecorded(state))
            if not left:
                return
            if time.monotonic() > deadline:
                log.warning("%d ended task(s) not ended in accounting after %.0f s: not in the history", left, SETTLE_S)
                return
            time.sleep(self.poll_interval_s)

    def _collect_results(self, state: SweepState) -> None:
        """Return values of completed tasks this process did not read itself (it followed)."""
        for task in state.tasks:
            if task.state == "COMPLETED" and task.index not in self.results and task.job_id:
                res = read_result(job_paths(state, task.job_id).result_pickle)
                if res is not None and res[0] == "success":
                    self.results[task.index] = res[1]


class _Null:
    def __enter__(self) -> _Null:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, *_a: object, **_k: object) -> None:
        return None
