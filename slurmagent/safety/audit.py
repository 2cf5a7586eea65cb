"""The audit trail: append-only JSON Lines, one record per decision and one per outcome.

Each record carries a sequence number and the hash of the previous record; a small
`<log>.head` file beside the log holds the last sequence number and hash, so a log cut
short at the end is caught too. `verify` names the first record that was edited, deleted,
reordered or truncated; `filter_records` and `audit_table` back `slurmagent audit show`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from filelock import FileLock
from rich.table import Table
from rich.text import Text

from slurmagent.errors import AuditError
from slurmagent.safety.paths import current_user

GENESIS = "0" * 64
_TAIL_CHUNK = 65536


def record_hash(record: Mapping[str, Any]) -> str:
    body = {k: v for k, v in record.items() if k != "hash"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def _last_line(path: Path) -> bytes:
    """The last non-empty line of a file, reading only its tail."""
    with open(path, "rb") as fh:
        fh.seek(0, 2)
        end = fh.tell()
        size = _TAIL_CHUNK
        while True:
            start = max(0, end - size)
            fh.seek(start)
            lines = [ln for ln in fh.read(end - start).split(b"\n") if ln.strip()]
            if len(lines) > 1 or start == 0:
                return lines[-1] if lines else b""
            size *= 4


class AuditLog:
    """Append-only JSON Lines under a filelock lock, each record chained to the previous.

    `mode` (e.g. 0o666) is given to the log, its lock and its head file when they are
    created: a sweep whose actions other users approve needs their outcomes in its log."""

    def __init__(self, path: str | os.PathLike[str], mode: int | None = None) -> None:
        self.path = Path(path)
        self.head_path = Path(str(self.path) + ".head")
        self.mode = mode
        self.lock = (
            FileLock(str(self.path) + ".lock", timeout=60)
            if mode is None
            else FileLock(str(self.path) + ".lock", timeout=60, mode=mode)
        )

    def _last(self) -> tuple[int, str]:
        if not self.path.exists() or self.path.stat().st_size == 0:
            return 0, GENESIS
        line = _last_line(self.path)
        if not line:
            return 0, GENESIS
        try:
            last = json.loads(line)
        except ValueError:
            raise AuditError(f"{self.path}: the last record is not valid JSON; run `slurmagent audit verify`") from None
        return int(last.get("seq", 0)), str(last["hash"])

    def _open(self, path: Path, flags: int) -> int:
        fd = os.open(path, flags | os.O_CREAT, 0o644 if self.mode is None else self.mode)
        if self.mode is not None and os.fstat(fd).st_uid == os.getuid():
            os.fchmod(fd, self.mode)  # the umask may have narrowed it
        return fd

    def writable(self) -> bool:
        """Whether this process may append (the log, its lock and head, or their folder)."""
        for p in (self.path, Path(str(self.path) + ".lock"), self.head_path):
            if p.exists() and not os.access(p, os.W_OK):
                return False
        folder = self.path.parent
        return os.access(folder, os.W_OK) or all(
            p.exists() for p in (self.path, Path(str(self.path) + ".lock"), self.head_path)
        )

    def append(self, record: dict[str, Any]) -> dict[str, Any]:
        try:
            return self._append(record)
        except OSError as exc:
            raise AuditError(f"cannot write the audit log {self.path}: {exc.strerror or exc}") from None

    def _append(self, record: dict[str, Any]) -> dict[str, Any]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.lock:
            seq, prev = self._last()
            full = {
                "seq": seq + 1,
                "time": time.time(),
                "user": current_user(),
                "host": socket.gethostname(),
                **record,
                "prev": prev,
            }
            full["hash"] = record_hash(full)
            fd = self._open(self.path, os.O_WRONLY | os.O_APPEND)
            with os.fdopen(fd, "a") as fh:
                fh.write(json.dumps(full, default=str) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            fd = self._open(self.head_path, os.O_WRONLY)
            with os.fdopen(fd, "w") as fh:
                fh.truncate(0)
                fh.write(json.dumps({"seq": full["seq"], "hash": full["hash"]}) + "\n")
        return full

    def records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]


# -- verification -------------------------------------------------------------------------
@dataclass(frozen=True)
class Problem:
    kind: str  # edited, deleted, reordered, truncated, unreadable
    line: int  # line of the log where it shows (0: the end of the file)
    seq: int | None  # the record's sequence number, where known
    message: str


def verify(path: str | os.PathLike[str]) -> list[Problem]:
    """Every break in the log's chain, in file order; an empty list for an intact log."""
    log_path = Path(path)
    if not log_path.exists():
        raise AuditError(f"{log_path}: no such audit log")
    data = log_path.read_bytes()
    pieces = data.split(b"\n")
    problems: list[Problem] = []
    records: list[tuple[int, dict[str, Any]]] = []
    for i, raw in enumerate(pieces, start=1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
            if not isinstance(rec, dict) or "hash" not in rec:
                raise ValueError("not an audit record")
        except ValueError:
            last_piece = i == len(pieces)  # no newline after it: the file was cut inside it
            kind = "truncated" if last_piece else "edited"
            what = "cut off in the middle (the file ends inside it)" if last_piece else "not a valid audit record"
            problems.append(Problem(kind, i, None, f"line {i}: {what}"))
            continue
        records.append((i, rec))

    seqs_at = [int(rec.get("seq", pos + 1)) for pos, (_, rec) in enumerate(records)]
    by_seq: dict[int, tuple[int, dict[str, Any]]] = {}
    for seq, (line, rec) in zip(seqs_at, records, strict=True):
        by_seq.setdefault(seq, (line, rec))
    prev_seq = 0
    for pos, (line, rec) in enumerate(records):
        seq = seqs_at[pos]
        name = f"record seq {seq} (line {line})"
        if record_hash(rec) != rec.get("hash"):
            problems.append(Problem("edited", line, seq, f"{name} was edited: its contents do not match its hash"))
        if seq <= prev_seq:
            problems.append(
                Problem("reordered", line, seq, f"{name} is out of order: it comes after seq {prev_seq} in the file")
            )
        elif seq > prev_seq + 1:
            gone = f"seq {prev_seq + 1}" if seq == prev_seq + 2 else f"seq {prev_seq + 1}..{seq - 1}"
            if set(range(prev_seq + 1, seq)) <= set(seqs_at[pos + 1 :]):  # they come later: moved, not gone
                problems.append(Problem("reordered", line, seq, f"{name} is out of order: {gone} come(s) after it"))
            else:
                follows = f"follows seq {prev_seq} directly" if prev_seq else "is the first record"
                problems.append(Problem("deleted", line, prev_seq + 1, f"{gone} deleted: {name} {follows}"))
        # the chain: this record names the hash of seq - 1, wherever that record now is
        prior = by_seq.get(seq - 1)
        want = GENESIS if seq == 1 else (str(prior[1].get("hash")) if prior else None)
        prior_intact = prior is None or record_hash(prior[1]) == prior[1].get("hash")
        if want is not None and rec.get("prev") != want and prior_intact:
            where = f"record seq {seq - 1}" if seq > 1 else "the log's start"
            problems.append(
                Problem(
                    "edited",
                    prior[0] if prior else line,
                    seq - 1 if seq > 1 else seq,
                    f"{where} was rewritten (its hash recomputed): {name} chains to a different hash",
                )
            )
        prev_seq = max(prev_seq, seq)

    head = Path(str(log_path) + ".head")
    if head.exists():
        try:
            want = json.loads(head.read_text())
            want_seq, want_hash = int(want["seq"]), str(want["hash"])
        except (ValueError, KeyError, TypeError):
            problems.append(Problem("edited", 0, None, f"{head} is not valid: the log's end cannot be checked"))
            return problems
        last_seq = int(records[-1][1].get("seq", len(records))) if records else 0
        if want_seq > last_seq:
            gone = f"seq {last_seq + 1}" if want_seq == last_seq + 1 else f"seq {last_seq + 1}..{want_seq}"
            problems.append(
                Problem(
                    "truncated",
                    0,
                    last_seq + 1,
                    f"truncated: {gone} missing at the end (the log ends at seq {last_seq})",
                )
            )
        elif want_seq < last_seq:
            extra = f"seq {want_seq + 1}" if last_seq == want_seq + 1 else f"seq {want_seq + 1}..{last_seq}"
            problems.append(
                Problem(
                    "edited",
                    records[-1][0],
                    want_seq + 1,
                    f"{extra} added at the end by something other than slurmagent (the head says seq {want_seq})",
                )
            )
        elif records and want_seq == last_seq and records[-1][1].get("hash") != want_hash:
            problems.append(
                Problem(
                    "edited", records[-1][0], last_seq, f"record seq {last_seq} (line {records[-1][0]}) was replaced"
                )
            )
    return problems


# -- filtering and the table --------------------------------------------------------------
_AGO = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, now: float | None = None) -> float:
    """`2h`, `30m`, `1d` ago, an ISO time (2026-11-30T09:00) or a unix time → unix time."""
    now = time.time() if now is None else now
    m = _AGO.match(text.strip())
    if m:
        return now - float(m.group(1)) * _UNITS[m.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise AuditError(
            f"--since {text!r} is not a time; use e.g. 30m, 2h, 1d, 2026-11-30T09:00 or a unix time"
        ) from None


def filter_records(
    records: Sequence[dict[str, Any]],
    job: str | None = None,
    action: str | None = None,
    decision: str | None = None,
    since: float | None = None,
) -> list[dict[str, Any]]:
    out = []
    for r in records:
        if job is not None and job not in (str(r.get("job", "")), str(r.get("target", ""))):
            continue
        if action is not None and r.get("action") != action:
            continue
        if decision is not None and r.get("decision") != decision:
            continue
        if since is not None and float(r.get("time", 0)) < since:
            continue
        out.append(r)
    return out


def _summary(r: dict[str, Any]) -> str:
    if r.get("type") == "outcome":
        after = r.get("metrics_after") or {}
        return ("ok " if r.get("ok") else "FAILED ") + json.dumps(after, default=str)[:80]
    return str(r.get("reason", ""))


def audit_table(records: Sequence[dict[str, Any]], title: str) -> Table:
    table = Table(title=Text(title))
    for col in ("seq", "time", "user", "type", "job", "action", "decision", "rule", "reason / result"):
        table.add_column(col)
    for r in records:
        when = datetime.fromtimestamp(float(r.get("time", 0))).strftime("%Y-%m-%d %H:%M:%S")
        cells = (
            str(r.get("seq", "")),
            when,
            str(r.get("user", "")),
            str(r.get("type", "")),
            str(r.get("job", "")),
            str(r.get("action", "")),
            str(r.get("decision", "")),
            str(r.get("rule", "")),
            _summary(r),
        )
        table.add_row(*(Text(c) for c in cells))  # user data: never rich markup
    return table
