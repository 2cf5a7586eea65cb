"""Which of a sweep's happenings people are told about, decided from what is on disk: the sweep
state, the recovery's history (history.jsonl), the approvals folder. Every event has an id that
whoever derives it gets again (a supervisor job after its requeue, a `watch` taking over), and
the outbox (notify/outbox.py) sends each id once. Run by the supervisor that leads the sweep,
after each poll; never fails a poll."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from slurmagent.commands import slurmagent_command
from slurmagent.config.notify import NotifyConf, notify_conf
from slurmagent.files import json_rows
from slurmagent.notify.message import Event
from slurmagent.notify.outbox import Outbox, Unsent
from slurmagent.safety.approvals import ApprovalStore
from slurmagent.safety.paths import SWEEP_HISTORY, approvals_dir
from slurmagent.safety.policy import resolve_policy
from slurmagent.supervise.state import SweepState, TaskRecord
from slurmagent.supervise.views import summary_line

log = logging.getLogger(__name__)

NOT_GIVEN_UP = frozenset({"COMPLETED", "CANCELLED"})  # a person's cancel, or the budget's (an event of its own)


def task_failed(sweep: str, entry: dict[str, Any]) -> Event | None:
    """A recovery history entry whose resubmission the gate allowed: the task failed, and goes on."""
    decision = entry.get("decision") or {}
    if entry.get("plan") != "resubmit" or decision.get("verdict") != "allow":
        return None
    index, attempt = entry.get("index"), entry.get("attempt")
    diag = entry.get("diagnosis") or {}
    changes = ((entry.get("action") or {}).get("params")) or {}
    change = ", ".join(f"{k} {v[0]} → {v[1]}" if isinstance(v, list) and len(v) == 2 else f"{k}={v}"
                       for k, v in changes.items())  # fmt: skip
    lines = [
        f"cause: {diag.get('cause', 'unknown')}: {diag.get('summary', '')}".rstrip(": "),
        *_evidence(diag),
        f"next: resubmitted as attempt {int(attempt or 0) + 1}" + (f" with {change}" if change else ""),
        f"why: {entry.get('plan_reason', '')}",
    ]
    return Event(
        f"task_failed/{index}/{attempt}",
        "task_failed",
        sweep,
        f"task {index} failed on attempt {attempt} ({diag.get('cause', 'unknown')}); resubmitted",
        lines,
        {
            "task": index,
            "attempt": attempt,
            "cause": diag.get("cause"),
            "summary": diag.get("summary"),
            "job": entry.get("job_id"),
            "changes": changes,
        },
    )


def given_up_id(task: TaskRecord) -> str:
    return f"task_given_up/{task.index}/{len(task.attempts)}"


def finished_id(state: SweepState) -> str:
    return f"sweep_finished/{state.finished_at:.0f}"


def task_given_up(state: SweepState, task: TaskRecord) -> Event:
    """A task that ended without a result and that nothing will run again."""
    diag = task.diagnosis or {}
    cause = str(diag.get("cause") or task.state.lower())
    first = task.error.splitlines()[0] if task.error else task.state
    lines = [f"cause: {cause}: {diag['summary']}" if diag.get("summary") else f"error: {first}"]
    lines += _evidence(diag)
    if diag.get("suggestion"):
        lines.append(f"fix: {diag['suggestion']}")
    if diag.get("fix_command"):
        lines.append(f"$ {diag['fix_command']}")
    lines += [f"why it stopped: {first}", f"$ {slurmagent_command('doctor', state.sweep_dir)}"]
    n = len(task.attempts)
    return Event(
        given_up_id(task),
        "task_given_up",
        state.sweep_dir,
        f"task {task.index} failed and was given up after {n} attempt(s) ({cause})",
        lines,
        {
            "task": task.index,
            "attempts": n,
            "state": task.state,
            "cause": cause,
            "summary": diag.get("summary"),
            "fix_command": diag.get("fix_command"),
            "overrides": task.overrides,
        },
    )


def _evidence(diag: dict[str, Any], most: int = 2) -> list[str]:
    """The log lines that show a diagnosis' cause (the first `most`), each with where it was."""
    out = []
    for ev in (diag.get("evidence") or [])[:most]:
        where = Path(str(ev.get("source", ""))).name + (f":{ev['line']}" if ev.get("line") else "")
        out.append(f"seen: {str(ev.get('text', '')).strip()[:300]}" + (f" ({where})" if where else ""))
    return out


def approvals_needed(sweep_dir: Path) -> list[Event]:
    """Every pending approval of this sweep, addressed to the policy's approvers, with the commands."""
    store = ApprovalStore(approvals_dir(sweep_dir), shared=False)
    pending = [s for s in store.statuses() if s.state == "pending" and _same(s.request.sweep_dir, sweep_dir)]
    if not pending:
        return []
    approvers = list(resolve_policy(sweep_dir).approvers)
    out = []
    for st in pending:
        req = st.request
        action = req.action
        have = f"{len(st.approvers)}/{req.approvals}"
        out.append(
            Event(
                f"approval_needed/{req.id}",
                "approval_needed",
                str(sweep_dir),
                f"approval needed: {action.get('kind')} {action.get('target')} (rule {req.rule})",
                [
                    f"why: {action.get('reason', '')}",
                    f"needs {req.approvals} approval(s) by users other than {req.requester}; has {have}",
                    f"$ {slurmagent_command('approve', req.id, '--sweep', sweep_dir)}",
                    f"$ {slurmagent_command('reject', req.id, '--sweep', sweep_dir)}",
                ],
                {
                    "approval": req.id,
                    "action": action.get("kind"),
                    "target": action.get("target"),
                    "rule": req.rule,
                    "approvals": req.approvals,
                    "requester": req.requester,
                    "expires_at": req.expires_at,
                },
                approvers,
            )
        )
    return out


def budget_reached(state: SweepState) -> Event | None:
    why = state.schedule.get("stopped")
    if not why:
        return None
    not_started = sum(1 for t in state.tasks if t.state == "CANCELLED" and "budget is reached" in t.error)
    return Event(
        "budget_reached",
        "budget_reached",
        state.sweep_dir,
        f"the sweep's budget is reached: {not_started} task(s) not started",
        [f"why: {why}", f"$ {slurmagent_command('status', state.sweep_dir)}"],
        {"why": why, "not_started": not_started},
    )


def sweep_finished(state: SweepState, best: str, report: str | None) -> Event:
    counts = state.counts()
    lines = [summary_line(state)]
    if best:
        lines.append(f"best: {best}")
    lines.append(f"report: {report}" if report else f"$ {slurmagent_command('report', state.sweep_dir)}")
    lines.append(f"$ {slurmagent_command('results', state.sweep_dir)}")
    ok = counts.get("COMPLETED", 0)
    return Event(
        finished_id(state),
        "sweep_finished",
        state.sweep_dir,
        f"sweep finished: {ok} of {len(state.tasks)} task(s) completed",
        lines,
        {"counts": counts, "best": best, "report": report},
    )


def _same(a: str, b: Path) -> bool:
    try:
        return Path(a).resolve() == b.resolve()
    except OSError:
        return False


class Notices:
    """The sweep's events offered to its outbox, and the outbox's due messages sent."""

    def __init__(self, sweep_dir: Path, conf: NotifyConf) -> None:
        self.sweep_dir = sweep_dir
        self.conf = conf
        self.outbox = Outbox(sweep_dir, conf)
        self._history_at = 0  # bytes of history.jsonl read (a successor reads it all: the ledger dedups)

    @classmethod
    def open(cls, sweep_dir: Path, raw: dict[str, Any]) -> Notices | None:
        """None when the sweep tells nobody (no channel configured)."""
        if not raw:
            return None
        conf = notify_conf(raw)
        return cls(sweep_dir, conf) if conf.channels else None

    def events(self, state: SweepState, held: set[int]) -> list[Event]:
        """What happened that people may be told about: only of the kinds notify.events names,
        and only what the ledger does not hold already, where that is cheap to know first."""
        events: list[Event] = []
        wanted, known = self.conf.events, self.outbox.known()
        history = self.sweep_dir / SWEEP_HISTORY
        if history.exists():
            with open(history, "rb") as fh:
                fh.seek(self._history_at)
                data = fh.read()
            whole = data[: data.rfind(b"\n") + 1]  # a line being written is read next time
            self._history_at += len(whole)
            events += filter(None, (task_failed(state.sweep_dir, e) for e in json_rows(whole.splitlines())))
        if "task_given_up" in wanted:
            for task in state.tasks:
                given_up = task.done and task.state not in NOT_GIVEN_UP and task.index not in held
                if given_up and given_up_id(task) not in known:
                    events.append(task_given_up(state, task))
        if "approval_needed" in wanted:  # the approvals folder is read only for it
            events += approvals_needed(self.sweep_dir)
        budget = budget_reached(state)
        if budget is not None:
            events.append(budget)
        finished = state.done and state.finished_at is not None and "sweep_finished" in wanted
        if finished and finished_id(state) not in known:  # the report is written once, for the message
            events.append(sweep_finished(state, *self._report()))
        return events

    def _report(self) -> tuple[str, str | None]:
        """The sweep's best result in a line, and its HTML report written now (None: it failed)."""
        from slurmagent.supervise.report import write_report

        try:
            rep = write_report(self.sweep_dir)
        except Exception as exc:
            log.warning("notify: the sweep's report could not be written: %s", exc)
            return "", None
        return rep.best, str(rep.page)

    def poll(self, state: SweepState, held: set[int]) -> None:
        """Offer what happened, send what is due; a failure here is logged, never raised."""
        try:
            self.outbox.offer(self.events(state, held))
            self.outbox.send_due()
        except Exception as exc:
            log.warning("notify: %s: %s", type(exc).__name__, exc)

    def flush(self) -> list[Unsent]:
        try:
            return self.outbox.flush(self.conf.flush_timeout_s)
        except Exception as exc:
            log.warning("notify: %s: %s", type(exc).__name__, exc)
            return []
