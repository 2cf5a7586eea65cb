"""What a person sees of a sweep, read-only and pure over its files: the table (with each
task's Slurm runs and, while it runs, its progress), the log files of every attempt, and
the results as rows. `slurmagent status`, `watch`, `logs` and `results` print these."""

from __future__ import annotations

import heapq
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from slurmagent.commands import slurmagent_command
from slurmagent.files import json_rows
from slurmagent.notify.outbox import read_ledger, unsent
from slurmagent.primitives.env import TaskFile
from slurmagent.supervise.state import SweepState, TaskRecord
from slurmagent.track.forward import RUN_KEY
from slurmagent.track.forward import read_state as read_track_state


def terminal(stderr: bool = False) -> Console:
    """The console for tables and progress: a terminal's own width, else (a log file, a pipe)
    wide enough that a line or a command to copy is never wrapped in the middle."""

    stream = sys.stderr if stderr else sys.stdout
    wide = None if stream.isatty() else 200
    return Console(stderr=stderr, width=wide, soft_wrap=not stream.isatty())


def task_dir(state: SweepState, task: TaskRecord) -> Path:
    """A task's own directory: the sweep's `hydra.sweep.subdir` (the task's job number)."""
    return Path(state.sweep_dir) / str(task.index)


# a search's files (supervise/study.py writes them; status, results and report read them)
STUDY_SETTINGS = "hpo/settings.json"
STUDY_TRIALS = "hpo/trials.json"
STUDY_BEST = "hpo/best.json"


def load_trials(sweep_dir: str | Path) -> dict[str, Any] | None:
    """SWEEP/hpo/trials.json as the study's driver last wrote it; None when the sweep is not a search."""
    path = Path(sweep_dir) / STUDY_TRIALS
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError as exc:
        from slurmagent.errors import SweepStateError

        raise SweepStateError(f"{path} is not valid JSON: {exc}") from None
    return raw if isinstance(raw, dict) else None


def runs(task: TaskRecord) -> int:
    """How many times Slurm ran the task: every attempt (a submission) and its requeues."""
    return sum(a.restarts + 1 for a in task.attempts) if task.attempts else 0


def runs_text(task: TaskRecord) -> str:
    """`1`, `3 (2 requeued)`, `2 (1 resubmitted)`, `4 (1 resubmitted, 2 requeued)`, `3 (2 promoted)`."""
    total, resubmitted = runs(task), max(0, len(task.attempts) - 1 - task.promotions)
    requeued = total - len(task.attempts)
    counts = ((task.promotions, "promoted"), (resubmitted, "resubmitted"), (requeued, "requeued"))
    notes = [f"{n} {what}" for n, what in counts if n]
    return f"{total} ({', '.join(notes)})" if notes else str(total)


def progress(state: SweepState, task: TaskRecord) -> dict[str, Any] | None:
    """The running task's progress.json: step, total_steps, steps_per_s, metrics, time."""
    try:
        data = json.loads((task_dir(state, task) / TaskFile.PROGRESS).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 90:
        return f"{seconds}s"
    if seconds < 5400:
        return f"{round(seconds / 60)}m"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"


def progress_text(p: dict[str, Any], now: float | None = None) -> str:
    """`step 120/300 (40%) loss=0.123 ETA 2m` (the ETA from this run's own speed)."""
    step, total = int(p.get("step", 0)), p.get("total_steps")
    head = f"step {step}/{total} ({100 * step // total}%)" if total else f"step {step}"
    metrics = " ".join(f"{k}={_short(v)}" for k, v in list((p.get("metrics") or {}).items())[:2])
    rate = p.get("steps_per_s")
    eta = ""
    if total and rate:
        age = max(0.0, (now or time.time()) - float(p.get("time", 0)))
        eta = f"ETA {_duration(max(0.0, (total - step) / rate - age))}"
    return " ".join(x for x in (head, metrics, eta) if x)


def not_reported_yet(task: TaskRecord) -> str:
    """What a live task is doing before its first step is reported (was: a blank cell)."""
    attempt = task.attempts[-1]
    if task.state == "RUNNING":
        where = f" on {attempt.nodes}" if attempt.nodes else ""
        return f"started{where}; no step reported yet (loading, or the task reports none)"
    reason = attempt.reason if attempt.reason and attempt.reason != "None" else ""
    return f"queued by Slurm{f' ({reason})' if reason else ''}"


def health_note(state: SweepState, task: TaskRecord) -> str:
    """`moved off t4-1 at step 30 (health CRITICAL: GPU 0: 3 volatile uncorrected ECC error(s))`
    when the runtime's health check moved the task off a sick node (health_stop.json)."""
    try:
        stop = json.loads((task_dir(state, task) / TaskFile.HEALTH_STOP).read_text())
    except (OSError, ValueError):
        return ""
    if not isinstance(stop, dict):
        return ""
    why = (stop.get("reasons") or ["CRITICAL"])[0]
    where = "moved off" if stop.get("excluded") else "stopped on"
    return f"{where} {stop.get('node', '?')} at step {stop.get('step', '?')} (health CRITICAL: {why})"


@dataclass(frozen=True)
class Summary:
    """What the table says of every task, when `state.tasks` holds only the rows shown
    (`status` of a large sweep reads no more: supervise/state.py's SweepScan)."""

    counts: dict[str, int]  # tasks by state
    total: int  # tasks in the sweep
    common: frozenset[str]  # overrides every task has (not shown per row)
    indices: list[int]  # every task's index (the in-loop caption reads their files)


def summarize(state: SweepState) -> Summary:
    common = set.intersection(*(set(t.overrides) for t in state.tasks)) if len(state.tasks) > 1 else set()
    return Summary(state.counts(), len(state.tasks), frozenset(common), [t.index for t in state.tasks])


def summary_line(state: SweepState, summary: Summary | None = None) -> str:
    counts = summary.counts if summary is not None else state.counts()
    total = summary.total if summary is not None else len(state.tasks)
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + f" (of {total})"


def adapt_records(state: SweepState, task: TaskRecord) -> list[dict[str, Any]]:
    """The in-loop controller's records of a task (runtime/adapt.py: adapt.jsonl)."""
    return _adapt_records(Path(state.sweep_dir) / str(task.index) / TaskFile.ADAPT)


def _adapt_records(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    return list(json_rows(lines))


def started(sweep_dir: str | Path) -> set[int]:
    """The tasks that have a directory of their own yet (they started): one listing."""
    try:
        with os.scandir(sweep_dir) as entries:
            return {int(e.name) for e in entries if e.name.isdigit() and e.is_dir()}
    except OSError:
        return set()


def adapt_line(state: SweepState, most: int = 4, indices: list[int] | None = None) -> str:
    """In-loop interventions in one line: per task, what was applied (and where) and what was
    refused, e.g. `in-loop: task 3 decay_lr at step 33, restart_schedule at step 120; 1 denied`."""
    parts = []
    ran = started(state.sweep_dir)
    for index in indices if indices is not None else [t.index for t in state.tasks]:
        if index not in ran:
            continue
        records = _adapt_records(Path(state.sweep_dir) / str(index) / TaskFile.ADAPT)
        if not records:
            continue
        applied = [f"{r.get('kind')} at step {r.get('step')}" for r in records if r.get("applied")]
        refused = sum(1 for r in records if r.get("decision") in ("deny", "needs_approval", "held"))
        note = ", ".join(applied[-3:]) or "nothing applied"
        if refused:
            note += f"; {refused} refused by the gate"
        if any(r.get("decision") == "capped" for r in records):
            note += "; capped"
        parts.append(f"task {index} {note}")
    if not parts:
        return ""
    more = f" (+{len(parts) - most} more tasks)" if len(parts) > most else ""
    return "in-loop: " + "; ".join(parts[:most]) + more


def track_state(state: SweepState, task: TaskRecord) -> dict[str, Any] | None:
    """Each tracker of a task (track/forward.py's track.json) as status shows it: the run it
    continues, points sent, points not sent yet and the last error; None without trackers."""
    saved = read_track_state(task_dir(state, task))
    if not saved:
        return None
    keep = ("run_id", "uri", "experiment", "log_dir", "points", "behind", "error")
    return {name: {k: v for k, v in st.items() if k in keep} for name, st in saved.items() if name != RUN_KEY}


def track_line(state: SweepState, most: int = 4, indices: list[int] | None = None) -> str:
    """Trackers that are behind, in one line (nothing when all are caught up), e.g.
    `trackers behind: task 3 mlflow 37 point(s) not sent (ConnectionError: …)`."""
    parts = []
    ran = started(state.sweep_dir)
    for index in indices if indices is not None else [t.index for t in state.tasks]:
        if index not in ran:
            continue
        for name, st in read_track_state(Path(state.sweep_dir) / str(index)).items():
            if name != RUN_KEY and isinstance(st, dict) and (st.get("error") or st.get("behind")):
                behind = f"{st['behind']} point(s) not sent" if st.get("behind") else "not caught up"
                parts.append(f"task {index} {name} {behind}" + (f" ({st['error']})" if st.get("error") else ""))
    if not parts:
        return ""
    more = f" (+{len(parts) - most} more)" if len(parts) > most else ""
    return "trackers behind: " + "; ".join(parts[:most]) + more + f" — {slurmagent_command('track', state.sweep_dir)}"


def unsent_line(sweep_dir: str | Path, most: int = 4) -> str:
    """The messages (notify.*) a channel has not taken, in a line; empty when all were sent."""
    left = [
        f"{u.event} by {u.channel} ({u.state}, {u.tries} tries{': ' + u.error if u.error else ''})"
        for u in unsent(read_ledger(sweep_dir))
    ]
    if not left:
        return ""
    more = f"; {len(left) - most} more" if len(left) > most else ""
    return f"messages not sent: {'; '.join(left[:most])}{more}"


def trials_by_state(rows: list[dict[str, Any]]) -> str:
    """`8 trial(s) (3 complete, 5 stopped)`: a search's trials counted by state."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["state"]] = counts.get(row["state"], 0) + 1
    return f"{len(rows)} trial(s) ({', '.join(f'{n} {s}' for s, n in sorted(counts.items()))})"


def study_line(sweep_dir: str | Path) -> str:
    """A search's state in one line: trials by state, epochs asked of the budget, the best so far."""
    trials = load_trials(sweep_dir)
    if trials is None:
        return ""
    rows = trials.get("trials", [])
    budget = trials.get("budget", {})
    of = f" of {budget['epochs']}" if budget.get("epochs") else ""
    line = f"search: {trials_by_state(rows)}, {trials.get('spent_epochs', 0)}{of} epoch(s) asked"
    if best := search_best(trials):
        line += f"; best {best}"
    return line + ("; finished" if trials.get("finished") else "")


def search_best(trials: dict[str, Any]) -> str:
    """A search's best so far, among the trials that went furthest: `val_error=0.031 (trial 4,
    9 epoch(s))`; empty before any trial has a value."""
    finite = [r for r in trials.get("trials", []) if r.get("value") is not None and r.get("epochs")]
    if not finite:
        return ""
    top = max(r["epochs"] for r in finite)
    pick = min if trials.get("direction") == "minimize" else max
    best = pick((r for r in finite if r["epochs"] == top), key=lambda r: r["value"])
    return f"{trials.get('objective')}={best['value']:.6g} (trial {best['trial']}, {top} epoch(s))"


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = " ".join(f"{k}={_short(v)}" for k, v in list(value.items())[:3]) if isinstance(value, dict) else str(value)
    return text if len(text) < 48 else text[:45] + "..."


def sweep_table(state: SweepState, max_rows: int = 40, summary: Summary | None = None) -> Table:
    """The sweep as a table: unfinished tasks first, by index, `max_rows` of them. With a
    `summary`, `state.tasks` holds only the rows to show (status of a large sweep)."""
    summary = summary if summary is not None else summarize(state)
    common = summary.common

    def varying(overrides: list[str]) -> list[str]:
        return [o for o in overrides if o not in common]

    table = Table(title=Text(f"sweep {state.sweep_dir} — {summary_line(state, summary)}"))
    for col in ("#", "job", "state", "runs", "overrides", "result / progress / reason"):
        table.add_column(col)
    rows = heapq.nsmallest(max(0, max_rows), state.tasks, key=lambda t: (t.state == "COMPLETED", t.index))
    for t in rows:
        if t.state == "COMPLETED":
            detail = _short(t.result)
        elif t.state == "RUNNING" and (p := progress(state, t)) is not None:
            detail = progress_text(p)
        elif t.state in ("RUNNING", "PENDING", "REQUEUED", "COMPLETING") and t.attempts:
            detail = not_reported_yet(t)
        elif t.state == "WAITING" and not t.error:
            detail = f"not submitted yet: {state.held_back}" if state.held_back else "not submitted yet"
        else:
            detail = t.error.splitlines()[0] if t.error else ""
        if t.state != "COMPLETED" and (moved := health_note(state, t)):
            detail = f"{moved}; {detail}" if detail else moved
        # Text cells: overrides and errors are user data, never rich markup
        cells = (str(t.index), t.job_id or "-", t.state, runs_text(t), " ".join(varying(t.overrides)), detail)
        table.add_row(*(Text(c) for c in cells))
    captions = [f"logs: {slurmagent_command('logs', state.sweep_dir)} TASK"]
    study = study_line(state.sweep_dir)
    if study:
        captions.insert(0, study)
    adapted = adapt_line(state, indices=summary.indices)
    if adapted:
        captions.insert(0, adapted)
    if tracked := track_line(state, indices=summary.indices):
        captions.insert(0, tracked)
    if state.notify and (untold := unsent_line(state.sweep_dir)):
        captions.insert(0, untold)
    if schedule := schedule_note(state):
        captions.insert(0, schedule)
    if state.held_back:
        waiting = summary.counts.get("WAITING", 0)
        captions.insert(0, f"{waiting} task(s) wait: {state.held_back}; submitted as earlier ones end")
    if summary.total > max_rows:
        every = slurmagent_command("status", state.sweep_dir, "--json")
        captions.insert(0, f"{summary.total - max_rows} more rows; `{every}` lists all")
    table.caption = "; ".join(captions)
    return table


# -- logs ------------------------------------------------------------------------------------------------
def log_files(state: SweepState, task: TaskRecord) -> list[tuple[str, Path]]:
    """Every log of a task that exists, oldest attempt first: each Slurm job's stdout and
    stderr (a requeued run appends to its job's files), then the task's own logs (Hydra's job
    log, a command's stderr) in its directory."""
    from slurmagent.supervise.jobfiles import job_paths

    out: list[tuple[str, Path]] = []
    first = 1  # runs are numbered as the job's ctx.attempt numbers them: every Slurm run of the task
    for attempt in task.attempts:
        last = first + attempt.restarts
        which = f"run {first}" if last == first else f"runs {first}–{last}"
        paths = job_paths(state, attempt.job_id)
        for kind, path in (("stdout", paths.stdout), ("stderr", paths.stderr)):
            out.append((f"{which}, job {attempt.job_id}, {kind}", Path(path)))
        first = last + 1
    folder = task_dir(state, task)
    for path in [*sorted(folder.glob("*.log")), folder / TaskFile.COMMAND_STDERR]:
        out.append((f"task {task.index}, {path.name}", path))
    return [(label, path) for label, path in out if path.is_file()]


def tail_lines(path: Path, lines: int) -> str:
    """The last `lines` lines of a file (all of it for lines <= 0), read from its end."""
    with open(path, "rb") as fh:
        fh.seek(0, 2)
        size = fh.tell()
        block = min(size, max(1, lines) * 400) if lines > 0 else size
        while True:
            fh.seek(size - block)
            data = fh.read(block)
            if lines <= 0 or data.count(b"\n") > lines or block == size:
                break
            block = min(size, block * 4)
    text = data.decode(errors="replace")
    return "\n".join(text.splitlines()[-lines:]) if lines > 0 else text


# -- results ---------------------------------------------------------------------------------------------
def varying_overrides(state: SweepState) -> dict[int, dict[str, str]]:
    """Each task's overrides that differ between tasks, as key → value."""
    common = set.intersection(*(set(t.overrides) for t in state.tasks)) if len(state.tasks) > 1 else set()
    return {t.index: dict(o.split("=", 1) for o in t.overrides if o not in common and "=" in o) for t in state.tasks}


def result_rows(state: SweepState, sort: str | None = None, descending: bool = False) -> list[dict[str, Any]]:
    """One row per task: index, state, runs, the varying overrides, the result's values (a
    result that is a mapping gives one column per key), and the error's first line. Sorted by
    a column when asked; rows without it come last."""
    trials = load_trials(state.sweep_dir)
    rows = trial_rows(state, trials) if trials is not None else task_rows(state)
    if sort:
        known = sorted({k for r in rows for k in r})
        if sort not in known:
            from slurmagent.errors import ConfigError, choices

            raise ConfigError(f"--sort {sort!r} is not a column of these results; columns: {choices(known)}")
        present = [r for r in rows if isinstance(r.get(sort), (int, float, str)) and not isinstance(r[sort], bool)]
        missing = [r for r in rows if r not in present]
        present.sort(key=lambda r: (isinstance(r[sort], str), r[sort]), reverse=descending)
        rows = present + missing
    return rows


def trial_rows(state: SweepState, trials: dict[str, Any]) -> list[dict[str, Any]]:
    """A search's rows, one per trial: its parameters, the epochs it reached, the objective
    there, its state (complete | stopped at a rung | running | waiting | failed | diverged)."""
    objective = str(trials.get("objective", "objective"))
    tasks = {t.index: t for t in state.tasks}
    rows = []
    for tr in trials.get("trials", []):
        task = tasks.get(int(tr["trial"]))
        row: dict[str, Any] = {"trial": tr["trial"], "state": tr["state"]}
        row.update(tr.get("params", {}))
        row.update({"epochs": tr["epochs"], objective: tr["value"], "promotions": tr["promotions"]})
        row.update({"runs": runs(task) if task else 0, "job": (task.job_id if task else "") or ""})
        if tr.get("reason"):
            row["error"] = str(tr["reason"]).splitlines()[0]
        rows.append(row)
    return rows


# the direction in which a reported metric is better, read from its name: a `NAME.best` column
# for these (last words win: `val_error` is an error, `accuracy_loss` a loss)
_HIGHER = ("acc", "accuracy", "auc", "f1", "precision", "recall", "score", "reward", "iou", "map", "bleu", "rouge",
           "top1", "top5")  # fmt: skip
_LOWER = ("loss", "error", "err", "perplexity", "ppl", "mse", "mae", "rmse", "nll", "wer", "cer")


def better(name: str) -> str | None:
    """ "max" or "min" for a metric whose name says which way is better; None when it does not."""
    for word in reversed(re.split(r"[^a-z0-9]+", name.lower())):
        if word in _LOWER:
            return "min"
        if word in _HIGHER:
            return "max"
    return None


def reported(state: SweepState, task: TaskRecord) -> dict[str, float]:
    """What the task reported with `loop.report(...)` (its metrics.jsonl): each metric's last
    value as NAME, and its best as NAME.best where the name says which way is better."""
    last: dict[str, float] = {}
    best: dict[str, float] = {}
    path = task_dir(state, task) / TaskFile.METRICS
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8", errors="replace") as fh:
        for row in json_rows(fh):
            for key, value in row.items():
                if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                last[key] = value
                way = better(key)
                if way is not None and value == value:  # NaN is never best
                    old = best.get(key)
                    if old is None or (value > old if way == "max" else value < old):
                        best[key] = value
    return {**last, **{f"{k}.best": v for k, v in best.items()}}


def task_rows(state: SweepState) -> list[dict[str, Any]]:
    params = varying_overrides(state)
    rows = []
    for t in state.tasks:
        row: dict[str, Any] = {"task": t.index, "state": t.state, "runs": runs(t), "job": t.job_id or ""}
        row.update(params.get(t.index, {}))
        row.update(reported(state, t))  # what the training reported; its return value wins where both name a key
        if isinstance(t.result, dict):
            row.update({k: v for k, v in t.result.items() if isinstance(v, (int, float, str, bool)) or v is None})
        elif t.result is not None:
            row["result"] = t.result
        if t.state != "COMPLETED" and t.error:
            row["error"] = t.error.splitlines()[0]
        rows.append(row)
    return rows


def columns(rows: list[dict[str, Any]]) -> list[str]:
    """The columns of `rows` in a stable order: task, state, runs, job, then the rest as met."""
    out: list[str] = []
    for r in rows:
        out.extend(k for k in r if k not in out)
    return out


def results_table(rows: list[dict[str, Any]], title: str) -> Table:
    table = Table(title=Text(title))
    cols = columns(rows)
    for col in cols:
        table.add_column(col)
    for r in rows:
        table.add_row(*(Text(_short(r[c]) if c in r and r[c] is not None else "") for c in cols))
    return table


def schedule_note(state: SweepState) -> str:
    """The sweep's automatic resource choices, its budget and its spend, in one line."""
    sched = state.schedule or {}
    parts = []
    for plan in sched.get("plans", []):
        chosen = ", ".join(f"{d['key'].split('.')[-1]}={d['value']}" for d in plan.get("decisions", []))
        if chosen and f"chose {chosen}" not in parts:
            parts.append(f"chose {chosen}")
    budget = sched.get("budget") or {}
    caps = [f"{budget[k]:g} {unit}" for k, unit in (("gpu_hours", "GPU-h"), ("cost", "cost")) if budget.get(k)]
    spent = sched.get("spent")
    if caps or spent:
        from slurmagent.schedule.budget import SPENT_BASIS, Usage  # the one basis and format of GPU-h and cost

        used = (
            f"{Usage(spent['gpu_hours'], spent['cost']).describe()} ({SPENT_BASIS})"
            if spent
            else "nothing measured yet"
        )
        parts.append(f"spent {used}" + (f" of budget {' / '.join(caps)}" if caps else ""))
    if sched.get("stopped"):
        parts.append(f"budget reached: {sched['stopped']}")
    return "; ".join(parts)
