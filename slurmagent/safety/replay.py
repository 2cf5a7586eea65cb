"""Replay sandbox: run a policy over a recorded history (the supervisor's
`history.jsonl`: Slurm states, diagnoses, log excerpts, the actions asked for and what was
decided) without executing anything, and show where its decisions differ."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from slurmagent.errors import SlurmAgentError
from slurmagent.records import Action, Decision
from slurmagent.safety.paths import SWEEP_HISTORY
from slurmagent.safety.policy import Policy


@dataclass(frozen=True)
class ReplayRow:
    n: int  # line of the history
    index: int | None  # the sweep task
    slurm_state: str
    cause: str
    action: Action
    recorded: Decision | None  # what was decided then (None: not recorded)
    replayed: Decision  # what the policy decides now

    @property
    def changed(self) -> bool:
        if self.recorded is None or self.recorded.verdict == "held":
            return False  # a held action was no policy decision
        return (self.recorded.verdict, self.recorded.approvals) != (self.replayed.verdict, self.replayed.approvals)


def history_path(path: Path) -> Path:
    return path / SWEEP_HISTORY if path.is_dir() else path


def load_history(path: Path) -> list[dict[str, Any]]:
    hist = history_path(path)
    try:
        lines = hist.read_text().splitlines()
    except FileNotFoundError:
        raise SlurmAgentError(f"{hist}: no recorded history (the supervisor writes {SWEEP_HISTORY})") from None
    out = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            out.append({"_line": i, **json.loads(line)})
        except ValueError:
            raise SlurmAgentError(f"{hist} line {i} is not valid JSON") from None
    return out


def replay(entries: list[dict[str, Any]], policy: Policy) -> list[ReplayRow]:
    """Pure: the policy's decision for every recorded action; nothing is executed."""
    rows = []
    for e in entries:
        if not e.get("action"):
            continue
        action = Action.from_json(e["action"])
        rec = e.get("decision")
        recorded = Decision(rec["verdict"], rec["rule"], int(rec.get("approvals", 0))) if rec else None
        rows.append(
            ReplayRow(
                int(e.get("_line", 0)),
                e.get("index"),
                str(e.get("slurm_state", "")),
                str((e.get("diagnosis") or {}).get("cause", "")),
                action,
                recorded,
                policy.decide(action),
            )
        )
    return rows


def _verdict(d: Decision | None) -> str:
    if d is None:
        return "(not recorded)"
    extra = f" x{d.approvals}" if d.verdict == "needs_approval" else ""
    return f"{d.verdict}{extra} [{d.rule}]"


def _what(row: ReplayRow) -> str:
    params = " ".join(
        f"{k} {v[0]}->{v[1]}" if isinstance(v, list) and len(v) == 2 else f"{k}={v}"
        for k, v in row.action.params.items()
    )
    return f"{row.action.kind} {row.action.target}" + (f" ({params})" if params else "")


def replay_table(rows: list[ReplayRow], policy_name: str) -> Table:
    table = Table(
        title=Text(f"replay under policy {policy_name}: {sum(r.changed for r in rows)} of {len(rows)} change")
    )
    for col in ("line", "task", "state / cause", "action", "recorded", f"replayed ({policy_name})", "changed"):
        table.add_column(col)
    for r in rows:
        cells = (
            str(r.n),
            "" if r.index is None else str(r.index),
            f"{r.slurm_state} / {r.cause}",
            _what(r),
            _verdict(r.recorded),
            _verdict(r.replayed),
            "*" if r.changed else "",
        )
        table.add_row(*(Text(c) for c in cells))
    return table


def replay_diff(rows: list[ReplayRow]) -> list[str]:
    """A unified-style diff of the changed decisions."""
    out = []
    for r in rows:
        if r.changed:
            out.append(f"- line {r.n} task {r.index}: {_what(r)}: {_verdict(r.recorded)}")
            out.append(f"+ line {r.n} task {r.index}: {_what(r)}: {_verdict(r.replayed)}")
    return out
