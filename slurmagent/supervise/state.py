"""The sweep's state on disk: `sweep.json` (a snapshot) and `sweep.journal` (what changed
since) in the sweep directory, changed only under a filelock lock, so a killed launcher
loses nothing and `slurmagent watch` can pick the sweep up again.

`sweep.json` is one JSON document laid out one task per line: a header line (every field
of `SweepState` but the tasks, with the snapshot's `token`), then the tasks in index order.
A change is appended to the journal as JSON lines (a task's whole record, a submission's
intent, a dropped intent, header fields), each append fsync'ed before the caller goes on
(a submission's intent is on disk before its sbatch). The snapshot is rewritten
(compacted: temp file, fsync, rename) when it is small (under COMPACT_BELOW: then
sweep.json alone is always current, as it was before the journal), when the journal has
grown as large as the snapshot (so every byte is rewritten at most about once per byte
appended: linear), and when the sweep ends. So recording an array of N tasks costs O(N),
whatever the sweep's size and however many arrays came before.

The journal's first line names the snapshot it extends (`{"snapshot": TOKEN}`); a journal
whose token is not the snapshot's is stale (a compaction replaced the snapshot, then the
process died before removing it) and is ignored. A last line without its newline, or not
JSON, is an append cut short by a crash: readers stop before it, the next writer cuts it
off. Readers take no lock: they open the journal first and the snapshot second, so a
snapshot that does not match the journal is the newer one and is read alone.
"""

from __future__ import annotations

import heapq
import itertools
import json
import mmap
import os
import re
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import IO, Any

from filelock import FileLock

from slurmagent.errors import SweepStateError
from slurmagent.files import atomic_file
from slurmagent.primitives.backends import Backend, backend_named
from slurmagent.slurm.seam import TERMINAL_STATES

STATE_FILE = "sweep.json"
JOURNAL_FILE = "sweep.journal"
LOCK_FILE = ".sweep.lock"
FORMAT = 2  # sweep.json's layout: header line, one task per line (1: one indented document)
COMPACT_BELOW = 256 * 1024  # bytes: a snapshot this small is rewritten at every write (sweep.json stays whole)
JOURNAL_RATIO = 1.0  # compact when the journal is this large relative to the snapshot
# a task is done when its latest job is, or when Slurm refused to take it (supervise/submission.py)
DONE_STATES = TERMINAL_STATES | {"REFUSED"}


@dataclass(slots=True)
class Attempt:
    job_id: str  # Slurm job id ("123_4") or local pid
    submitted_at: float  # unix time
    state: str = "PENDING"  # last state seen
    reason: str = ""  # why it ended, when it did not complete
    nodes: str = ""  # where it ran
    restarts: int = 0  # Slurm requeues of this job


@dataclass(slots=True)
class TaskRecord:
    index: int  # Hydra job num
    overrides: list[str]  # the task's own overrides
    attempts: list[Attempt] = field(default_factory=list)
    state: str = "PENDING"  # state of the latest attempt
    result: Any = None  # JSON form of the return value, when it completed
    error: str = ""  # failure summary: state, reason, last stderr lines
    spec_id: str = ""  # its latest attempt's JobSpec: a key of SweepState.specs (shared by tasks alike)
    diagnosis: dict[str, Any] | None = None  # the last failure's diagnosis (recovery/diagnose.py)
    stage_start: int = 0  # attempts before this stage (a search trial's promotion starts a new stage)
    promotions: int = 0  # a search trial's promotions (each a new attempt that is not a retry)

    @property
    def job_id(self) -> str | None:
        return self.attempts[-1].job_id if self.attempts else None

    @property
    def done(self) -> bool:
        return self.state in DONE_STATES

    @property
    def stage_attempts(self) -> int:
        """Attempts of this stage: what recovery.max_attempts bounds (a promotion is not a retry)."""
        return len(self.attempts) - self.stage_start


TRANSIENT = {"transient": True}  # a SweepState field that is never written (what to write next)


@dataclass
class SweepState:
    sweep_dir: str
    backend: str  # the backend's name: "slurm" or "local" (`where` is its class)
    submitit_folder: str
    created_at: float
    tasks: list[TaskRecord]
    array_ids: list[str] = field(default_factory=list)  # Slurm array job ids of the sweep
    finished_at: float | None = None
    context_path: str = ""  # the pickled Hydra context jobs are built from (for resubmission)
    launcher: dict[str, Any] = field(default_factory=dict)  # hydra.launcher options of the sweep
    job_name: str = ""  # Slurm job name of the sweep's jobs
    suspect_nodes: dict[str, int] = field(default_factory=dict)  # node → failures blamed on it
    site: dict[str, Any] | None = None  # the site's catalogue the sweep was launched with (SiteConf)
    specs: dict[str, dict[str, Any]] = field(default_factory=dict)  # id → a JobSpec (asdict), stored once
    # every submission, recorded before its sbatch and completed after (supervise/submission.py)
    submissions: list[dict[str, Any]] = field(default_factory=list)
    held_back: str = ""  # why WAITING tasks are not submitted yet (a submit limit), for people
    max_array: int = 0  # the most tasks one array may hold (hydra.launcher.max_array_size or MaxArraySize)
    # resource scheduling (slurmagent/schedule/): the budget, the predicted and the measured
    # use, every automatic choice with its numbers (plan.Plan.record), the tasks in the history
    schedule: dict[str, Any] = field(default_factory=dict)
    # who is told what happens to the sweep (config/notify.py's NotifyConf as plain data: the names of
    # the variables holding secrets, never the secrets); {}: nobody (supervise/notices.py)
    notify: dict[str, Any] = field(default_factory=dict)
    # what a write in the middle of an edit must persist (SweepStore.write): tasks and intents
    # changed for a submission (`touch`); everything else is written when the edit ends
    touched_tasks: set[int] = field(default_factory=set, init=False, repr=False, compare=False, metadata=TRANSIENT)
    touched_intents: set[str] = field(default_factory=set, init=False, repr=False, compare=False, metadata=TRANSIENT)

    @property
    def done(self) -> bool:
        return all(t.done for t in self.tasks)

    @property
    def where(self) -> Backend:
        """Where the sweep's tasks run: every way the backends differ is asked of it."""
        return backend_named(self.backend)

    def counts(self) -> dict[str, int]:
        c: dict[str, int] = {}
        for t in self.tasks:
            c[t.state] = c.get(t.state, 0) + 1
        return c

    def spec_of(self, task: TaskRecord) -> dict[str, Any]:
        """The JobSpec (as a dict) `task`'s latest attempt runs with; {} when it has none."""
        return self.specs.get(task.spec_id, {})

    def add_spec(self, spec: dict[str, Any]) -> str:
        """The id of this spec in `specs`, added once however many tasks share it."""
        key = json.dumps(spec, sort_keys=True)
        for spec_id, known in self.specs.items():
            if json.dumps(known, sort_keys=True) == key:
                return spec_id
        spec_id = str(len(self.specs))
        self.specs[spec_id] = spec
        return spec_id

    def touch(self, tasks: Iterable[TaskRecord] = (), intent: dict[str, Any] | None = None) -> None:
        """Mark what the next `SweepStore.write` must put on disk (a submission's intent and
        its tasks); an edit's other changes are written when it ends."""
        self.touched_tasks.update(t.index for t in tasks)
        if intent is not None:
            self.touched_intents.add(str(intent["marker"]))

    def to_json(self) -> dict[str, Any]:
        """Plain data (the shape of sweep.json), without copying what is already plain."""
        out = {name: getattr(self, name) for name in HEADER_FIELDS}
        out["tasks"] = [task_json(t) for t in self.tasks]
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> SweepState:
        tasks = [task_from_json(t) for t in raw["tasks"]]
        return cls(**{k: v for k, v in raw.items() if k in STORED_FIELDS}, tasks=tasks)


STORED_FIELDS = tuple(f.name for f in fields(SweepState) if not f.metadata.get("transient") and f.name != "tasks")
# the header's fields in the order written; `submissions` has its own journal records
HEADER_FIELDS = STORED_FIELDS
TOP_FIELDS = tuple(f for f in STORED_FIELDS if f != "submissions")
TASK_KEYS = ("index", "state", "overrides", "attempts", "result", "error", "spec_id", "diagnosis", "stage_start",
             "promotions")  # fmt: skip  # index and state first: status reads them without parsing the line


def task_json(t: TaskRecord) -> dict[str, Any]:
    """A task as plain data, index and state first (the order of its line in sweep.json)."""
    return {
        "index": t.index,
        "state": t.state,
        "overrides": t.overrides,
        "attempts": [
            {
                "job_id": a.job_id,
                "submitted_at": a.submitted_at,
                "state": a.state,
                "reason": a.reason,
                "nodes": a.nodes,
                "restarts": a.restarts,
            }
            for a in t.attempts
        ],
        "result": t.result,
        "error": t.error,
        "spec_id": t.spec_id,
        "diagnosis": t.diagnosis,
        "stage_start": t.stage_start,
        "promotions": t.promotions,
    }


_intern = sys.intern


def task_from_json(raw: dict[str, Any]) -> TaskRecord:
    """A task from its plain data; strings many tasks share (overrides, states) are stored once."""
    return TaskRecord(
        raw["index"],
        [_intern(o) for o in raw["overrides"]],
        [
            Attempt(
                a["job_id"], a["submitted_at"], _intern(a["state"]), a["reason"], _intern(a["nodes"]), a["restarts"]
            )
            for a in raw["attempts"]
        ],
        _intern(raw["state"]),
        raw.get("result"),
        raw.get("error", ""),
        _intern(raw.get("spec_id", "")),
        raw.get("diagnosis"),
        raw.get("stage_start", 0),
        raw.get("promotions", 0),
    )


_encode = json.JSONEncoder(separators=(",", ":")).encode  # C-accelerated, ASCII: one line per value


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def encode_task(t: TaskRecord) -> str:
    """A task's line: its JSON, one line (a result that is not JSON is stored as its repr)."""
    try:
        return _encode(task_json(t))
    except (TypeError, ValueError):
        t.result = _jsonable(t.result)
        return _encode(task_json(t))


_TOKEN = re.compile(rb'^\{"format":(\d+),"token":"([0-9a-f]+)"')


@dataclass
class _Snapshot:
    """sweep.json, read: its token (None: the old layout, or none), the header fields, and the tasks."""

    token: str | None
    header: dict[str, Any]
    size: int


class SweepStore:
    """Reads and changes a sweep's state: `edit()` under the lock; `load()` a copy, `view()`
    the store's own copy brought up to date, both without the lock."""

    def __init__(self, sweep_dir: str | Path) -> None:
        self.dir = Path(sweep_dir)
        self.path = self.dir / STATE_FILE
        self.journal = self.dir / JOURNAL_FILE
        self.lock = FileLock(str(self.dir / LOCK_FILE), timeout=60)
        # the state as this store last read or wrote it, and what is on disk of it
        self._state: SweepState | None = None
        self._token: str | None = None  # the snapshot's token
        self._snap_bytes = 0
        self._journal_bytes = 0  # the journal's valid length (0: none)
        self._sigs: dict[int, int] = {}  # task index → hash of its line on disk
        self._top: dict[str, str] = {}  # header field → its JSON on disk
        self._subs: dict[str, str] = {}  # intent marker → its JSON on disk
        self._pos: dict[int, int] = {}  # task index → position in _state.tasks (checked on use)

    def exists(self) -> bool:
        return self.path.exists()

    # -- reading ---------------------------------------------------------------------------
    def load(self) -> SweepState:
        """The sweep's state as on disk now: a new object, the caller's to change."""
        return self._read_all(track=False)

    def view(self) -> SweepState:
        """This store's copy of the state, brought up to date (only what was appended since
        it was last read is read): for reading; change it only inside `edit()`."""
        self._sync(locked=False)
        assert self._state is not None
        return self._state

    def scan(self) -> SweepScan:
        """Each task's index and state without reading the rest of its record: what `status`
        needs for the counts and the first rows of a large sweep (`SweepScan`)."""
        return SweepScan.open(self)

    # -- writing ---------------------------------------------------------------------------
    def create(self, state: SweepState) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        with self.lock:
            self._compact(state)

    def write(self, state: SweepState) -> None:
        """Persist now what `state.touch` marked (a submission's intent, its tasks) and the
        header's changes; the caller holds the lock (inside `edit()`): a record that must be
        on disk before an action (a submission's intent) is persisted this way. Nothing
        marked: every change is written."""
        if state is not self._state:
            self._compact(state)
            return
        self._persist(state, full=not (state.touched_tasks or state.touched_intents))

    def compact(self) -> None:
        """Rewrite sweep.json whole now (and drop the journal)."""
        with self.lock:
            self._sync(locked=True)
            assert self._state is not None
            self._compact(self._state)

    @contextmanager
    def edit(self) -> Iterator[SweepState]:
        """`with store.edit() as state:` — read (what changed since this store last did),
        change, write what changed, all under the lock."""
        with self.lock:
            self._sync(locked=True)
            state = self._state
            assert state is not None
            try:
                yield state
            except BaseException:
                self._forget()  # changed in memory, not on disk: read again next time
                raise
            if state.done and state.finished_at is None:
                state.finished_at = time.time()
            try:
                self._persist(state, full=True)
            except BaseException:
                self._forget()
                raise

    # -- the snapshot and the journal ----------------------------------------------------------
    def _forget(self) -> None:
        self._state, self._token = None, None

    def _peek_token(self) -> str | None:
        try:
            with open(self.path, "rb") as fh:
                head = fh.read(64)
        except FileNotFoundError:
            raise SweepStateError(f"{self.dir} is not a slurmagent sweep directory: no {STATE_FILE} in it") from None
        m = _TOKEN.match(head)
        return m[2].decode() if m and int(m[1]) == FORMAT else None

    def _sync(self, locked: bool) -> None:
        """Bring `_state` up to date: replay what was appended to the journal since it was
        read, or read everything when the snapshot changed (or nothing was read yet)."""
        token = self._peek_token()
        if self._state is None or token is None or token != self._token:
            self._state = self._read_all(track=True, locked=locked)
            return
        fh = _open(self.journal)
        if fh is None:
            if self._journal_bytes:  # ours vanished under the same snapshot: not our doing, read again
                self._state = self._read_all(track=True, locked=locked)
            return
        with fh:
            start = self._journal_bytes
            if start == 0:
                head = fh.readline()
                if _journal_token(head) != token:
                    return  # stale (from before this snapshot): ignored, replaced at the next append
                start = len(head)  # another process started it: replayed from its first record
            fh.seek(start)
            self._journal_bytes = self._replay(self._state, fh, start, track=True)
            if locked:
                self._cut_torn_tail(fh, self._journal_bytes)

    def _replay(self, state: SweepState, fh: IO[bytes], start: int, track: bool) -> int:
        """Apply the journal's committed records from `start` (where `fh` is); the end of the
        last commit. Records after it (an append cut short: no commit) are left out."""
        pos = end = start
        pending: list[tuple[dict[str, Any], bytes]] = []
        for line in fh:
            rec = _record(line)
            if rec is None:
                break
            pos += len(line)
            if "commit" not in rec:
                pending.append((rec, line))
                continue
            if rec["commit"] != len(pending):  # not the records it commits: damaged
                break
            for r, text in pending:
                self._apply(state, r, text, track)
            pending, end = [], pos
        return end

    def _cut_torn_tail(self, fh: IO[bytes], end: int) -> None:
        """What follows the last commit (an append cut short by a crash): cut off before
        anything is appended after it."""
        if os.fstat(fh.fileno()).st_size > end:
            os.truncate(self.journal, end)

    def _read_all(self, track: bool, locked: bool = False) -> SweepState:
        """The snapshot and its journal, read whole."""
        jfh = _open(self.journal)  # the journal first: see the module's doc
        try:
            with open(self.path, "rb") as fh:
                snap, tasks, sigs = _read_snapshot(fh, self.path, track)
            state = _state_from(snap.header, tasks, self.path)
            if track:
                self._sigs, self._pos = sigs, {}
                self._top = {k: _encode(getattr(state, k)) for k in TOP_FIELDS}
                self._subs = {str(i["marker"]): _encode(i) for i in state.submissions}
                self._token, self._snap_bytes, self._journal_bytes = snap.token, snap.size, 0
            if jfh is not None and snap.token is not None:
                head = jfh.readline()
                if _journal_token(head) == snap.token:
                    end = self._replay(state, jfh, len(head), track)
                    if locked:
                        self._cut_torn_tail(jfh, end)
                    if track:
                        self._journal_bytes = end
        except FileNotFoundError:
            raise SweepStateError(f"{self.dir} is not a slurmagent sweep directory: no {STATE_FILE} in it") from None
        finally:
            if jfh is not None:
                jfh.close()
        return state

    def _apply(self, state: SweepState, rec: dict[str, Any], line: bytes, track: bool) -> None:
        """One journal record onto `state` (and, tracking, onto what is known to be on disk)."""
        if "task" in rec:
            task = task_from_json(rec["task"])
            at = self._position(state, task.index)
            if at is None:
                state.tasks.append(task)
                if len(state.tasks) > 1 and state.tasks[-2].index > task.index:
                    state.tasks.sort(key=lambda t: t.index)
                self._pos = {}
            else:
                state.tasks[at] = task
            if track:
                self._sigs[task.index] = hash(line[8:].rstrip(b"\n")[:-1].decode())
        elif "intent" in rec:
            intent, marker = rec["intent"], str(rec["intent"]["marker"])
            for i, known in enumerate(state.submissions):
                if known["marker"] == marker:
                    state.submissions[i] = intent
                    break
            else:
                state.submissions.append(intent)
            if track:
                self._subs[marker] = _encode(intent)
        elif "drop" in rec:
            state.submissions = [i for i in state.submissions if i["marker"] != rec["drop"]]
            if track:
                self._subs.pop(str(rec["drop"]), None)
        elif "untask" in rec:
            state.tasks = [t for t in state.tasks if t.index != rec["untask"]]
            self._pos = {}
            if track:
                self._sigs.pop(int(rec["untask"]), None)
        elif "set" in rec:
            for name, value in rec["set"].items():
                if name in TOP_FIELDS:
                    setattr(state, name, value)
                    if track:
                        self._top[name] = _encode(value)

    def _position(self, state: SweepState, index: int) -> int | None:
        """Where task `index` is in state.tasks (tasks are in index order, usually contiguous)."""
        tasks = state.tasks
        if tasks:
            guess = index - tasks[0].index
            if 0 <= guess < len(tasks) and tasks[guess].index == index:
                return guess
        at = self._pos.get(index)
        if at is not None and at < len(tasks) and tasks[at].index == index:
            return at
        self._pos = {t.index: i for i, t in enumerate(tasks)}
        return self._pos.get(index)

    def _persist(self, state: SweepState, full: bool) -> None:
        """Write what changed since the state was last on disk: the tasks and intents marked
        (or, `full`, every one) and the header; appended to the journal, or the snapshot
        rewritten (see the module's doc)."""
        if self._token is None:  # the old layout (or none yet): the first write converts it
            self._compact(state)
            return
        records: list[str] = []
        top: dict[str, str] = {}
        for name in TOP_FIELDS:
            text = _encode(getattr(state, name))
            if self._top.get(name) != text:
                top[name] = text
        if top:
            records.append('{"set":{' + ",".join(f'"{k}":{v}' for k, v in top.items()) + "}}")
        markers = {str(i["marker"]) for i in state.submissions}
        intents = state.submissions if full else [i for i in state.submissions if i["marker"] in state.touched_intents]
        subs: dict[str, str] = {}
        for intent in intents:
            text = _encode(intent)
            if self._subs.get(str(intent["marker"])) != text:
                subs[str(intent["marker"])] = text
                records.append('{"intent":' + text + "}")
        gone = [m for m in (self._subs if full else state.touched_intents) if m in self._subs and m not in markers]
        records.extend('{"drop":' + _encode(m) + "}" for m in gone)
        if full:
            tasks: Iterable[TaskRecord] = state.tasks
        else:
            wanted = set(state.touched_tasks)
            for intent in state.submissions:
                if intent["marker"] in state.touched_intents:
                    wanted.update(intent["tasks"])
            found = (self._position(state, i) for i in sorted(wanted))
            tasks = [state.tasks[at] for at in found if at is not None]
        sigs: dict[int, int] = {}
        for t in tasks:
            text = encode_task(t)
            sig = hash(text)
            if self._sigs.get(t.index) != sig:
                sigs[t.index] = sig
                records.append('{"task":' + text + "}")
        removed: list[int] = []
        if full and len(self._sigs) != len(state.tasks) - len([i for i in sigs if i not in self._sigs]):
            present = {t.index for t in state.tasks}
            removed = [i for i in self._sigs if i not in present]
            records.extend('{"untask":' + str(i) + "}" for i in removed)
        state.touched_tasks.clear()
        state.touched_intents.clear()
        if not records:
            return
        records.append(f'{{"commit":{len(records)}}}')  # all of them, or (cut short) none
        data = "".join(r + "\n" for r in records).encode()
        grown = self._journal_bytes + len(data)
        if self._snap_bytes < COMPACT_BELOW or grown > JOURNAL_RATIO * self._snap_bytes or (full and state.done):
            self._compact(state)
            return
        self._append(data)
        self._top.update(top)
        self._subs.update(subs)
        for m in gone:
            self._subs.pop(m, None)
        self._sigs.update(sigs)
        for i in removed:
            self._sigs.pop(i, None)

    def _append(self, data: bytes) -> None:
        """Append records to the journal, fsync'ed; a new journal appears whole (temp, rename)."""
        if self._journal_bytes == 0:
            head = _encode({"snapshot": self._token}).encode() + b"\n"
            with atomic_file(self.journal) as fh:
                fh.write(head + data)
            self._journal_bytes = len(head) + len(data)
            return
        fd = os.open(self.journal, os.O_WRONLY | os.O_APPEND)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        self._journal_bytes += len(data)

    def _compact(self, state: SweepState) -> None:
        """Rewrite sweep.json whole (temp file, fsync, rename) under a new token; the journal
        it absorbed is removed (left behind by a crash, its old token marks it stale)."""
        token = uuid.uuid4().hex[:16]
        header = {"format": FORMAT, "token": token, **{name: getattr(state, name) for name in HEADER_FIELDS}}
        header["common"] = common_overrides(state.tasks)  # for `status`, which reads no task's overrides
        sigs: dict[int, int] = {}
        with atomic_file(self.path) as fh:
            fh.write(_encode(header)[:-1].encode() + b',\n"tasks":[\n')
            chunk: list[str] = []
            last = len(state.tasks) - 1
            for i, t in enumerate(state.tasks):
                text = encode_task(t)
                sigs[t.index] = hash(text)
                chunk.append(text + (",\n" if i < last else "\n"))
                if len(chunk) >= 2000:
                    fh.write("".join(chunk).encode())
                    chunk = []
            fh.write(("".join(chunk) + "]}\n").encode())
            size = fh.tell()
        self.journal.unlink(missing_ok=True)
        self._state, self._token, self._snap_bytes, self._journal_bytes = state, token, size, 0
        self._sigs, self._pos = sigs, {}
        self._top = {k: _encode(getattr(state, k)) for k in TOP_FIELDS}
        self._subs = {str(i["marker"]): _encode(i) for i in state.submissions}
        state.touched_tasks.clear()
        state.touched_intents.clear()


def _open(path: Path) -> IO[bytes] | None:
    """`path` open for reading (the caller closes it); None when it does not exist."""
    try:
        return open(path, "rb")  # the caller closes it
    except FileNotFoundError:
        return None


def common_overrides(tasks: list[TaskRecord]) -> list[str]:
    """The overrides every task has (none for a single task: its own are what it varies)."""
    if len(tasks) < 2:
        return []
    common = set(tasks[0].overrides)
    for t in tasks[1:]:
        common.intersection_update(t.overrides)
        if not common:
            break
    return sorted(common)


def _journal_token(head: bytes) -> str | None:
    rec = _record(head)
    return str(rec["snapshot"]) if rec is not None and "snapshot" in rec else None


def _record(line: bytes) -> dict[str, Any] | None:
    """A journal line's record; None for a line cut short (no newline, or not JSON)."""
    if not line.endswith(b"\n"):
        return None
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) else None


def _read_snapshot(fh: IO[bytes], path: Path, track: bool) -> tuple[_Snapshot, list[TaskRecord], dict[int, int]]:
    """sweep.json: its header and tasks (and each task line's hash, when tracking)."""
    first = fh.readline()
    m = _TOKEN.match(first)
    sigs: dict[int, int] = {}
    if m is None or int(m[1]) != FORMAT:  # the old layout: one document
        rest = fh.read()
        try:
            raw = json.loads(first + rest)
        except ValueError as exc:
            raise SweepStateError(f"{path} is not valid JSON: {exc}") from None
        if not isinstance(raw, dict) or not isinstance(raw.get("tasks"), list):
            raise SweepStateError(f"{path} is not a slurmagent sweep state: no task list in it")
        try:
            tasks = [task_from_json(t) for t in raw.pop("tasks")]
        except (KeyError, TypeError) as exc:
            raise SweepStateError(f"{path} is not a slurmagent sweep state: {exc!r}") from None
        return _Snapshot(None, raw, len(first) + len(rest)), tasks, sigs
    try:
        header = json.loads(first.rstrip().rstrip(b",") + b"}")
        size = len(first) + len(fh.readline())
        tasks = []
        ended = False
        for line in fh:
            size += len(line)
            if line.startswith(b"]"):
                ended = True
                break
            text = line.rstrip(b",\n").decode()
            tasks.append(task_from_json(json.loads(text)))
            if track:
                sigs[tasks[-1].index] = hash(text)
    except (ValueError, KeyError, TypeError) as exc:
        raise SweepStateError(f"{path} is not valid JSON: {exc}") from None
    if not ended:
        raise SweepStateError(f"{path} is cut short (no end of its task list)")
    return _Snapshot(str(header.pop("token")), header, size), tasks, sigs


def _state_from(header: dict[str, Any], tasks: list[TaskRecord], path: Path) -> SweepState:
    try:
        return SweepState(**{k: v for k, v in header.items() if k in STORED_FIELDS}, tasks=tasks)
    except TypeError as exc:
        raise SweepStateError(f"{path} is not a slurmagent sweep state: {exc}") from None


# -- status of a large sweep without reading every record -------------------------------------------
Blob = bytes | mmap.mmap  # a file's bytes, read or mapped
# a task's line starts with its index and state (task_json's order): read without parsing the
# line. Each pattern starts with the newline before the line: the regex engine then skips to it.
_SNAP_TASK = re.compile(rb'\n\{"index":(-?\d+),"state":"([^"\\]*)"')
_JOURNAL_TASK = re.compile(rb'\n\{"task":\{"index":(-?\d+),"state":"([^"\\]*)"')
_JOURNAL_OTHER = re.compile(rb'\n\{"(?!task":|commit":)')


@dataclass
class SweepScan:
    """A sweep read for `status`: the header's fields (`state`, with no tasks), every task's
    index and state (from the head of its line: no JSON parsed), and the whole records of only
    the tasks asked for. Lock-free, like `SweepStore.load`."""

    state: SweepState  # the header's fields; tasks: []
    indices: list[int]  # every task's index, in index order
    states: list[str]  # and its state
    _snapshot: Blob  # sweep.json's bytes (mapped)
    _journal: Blob  # the journal's committed bytes
    _newer: dict[int, int]  # task index → offset of its newest journal record
    _removed: set[int]  # tasks the journal removed
    _whole: list[TaskRecord] | None = None  # an old-layout sweep.json: read whole
    common: list[str] | None = None  # the overrides every task had at the last compaction

    @classmethod
    def open(cls, store: SweepStore) -> SweepScan:
        jbytes = _map(store.journal)  # the journal first (see the module's doc)
        sbytes = _map(store.path)
        if sbytes is None:
            raise SweepStateError(f"{store.dir} is not a slurmagent sweep directory: no {STATE_FILE} in it")
        m = _TOKEN.match(sbytes[:64])
        if m is None or int(m[1]) != FORMAT:
            state = store.load()
            tasks, state.tasks = sorted(state.tasks, key=lambda t: t.index), []
            states = [t.state for t in tasks]
            return cls(state, [t.index for t in tasks], states, b"", b"", {}, set(), tasks)
        newline = sbytes.find(b"\n")
        try:
            header = json.loads(sbytes[:newline].rstrip().rstrip(b",") + b"}")
        except ValueError as exc:
            raise SweepStateError(f"{store.path} is not valid JSON: {exc}") from None
        token = str(header.pop("token"))
        common = header.pop("common", None)
        state = _state_from(header, [], store.path)
        newer: dict[int, tuple[bytes, int]] = {}  # index → (state, offset) of its newest journal record
        removed: set[int] = set()
        journal: Blob = b""
        if jbytes is not None and _journal_token(jbytes[: jbytes.find(b"\n") + 1]) == token:
            # what follows the last commit is an append in progress, or one cut short: left out
            journal = jbytes[: _committed_end(jbytes)]
            for jm in _JOURNAL_TASK.finditer(journal):
                newer[int(jm[1])] = (jm[2], jm.start() + 1)
            untasked: dict[int, int] = {}
            for om in _JOURNAL_OTHER.finditer(journal):  # header fields, intents: parsed, in order
                rec = _record(journal[om.start() + 1 : journal.find(b"\n", om.start() + 1) + 1])
                if rec is None:
                    continue
                if "untask" in rec:
                    untasked[int(rec["untask"])] = om.start() + 1
                else:
                    store._apply(state, rec, b"", track=False)
            for index, at in untasked.items():
                if index not in newer or newer[index][1] < at:  # not added again since
                    newer.pop(index, None)
                    removed.add(index)
        pairs = _SNAP_TASK.findall(sbytes, newline)
        indices = [int(i) for i, _ in pairs]
        raw = [s for _, s in pairs]
        if newer or removed:
            for k, index in enumerate(indices):
                if index in newer:
                    raw[k] = newer[index][0]
            if removed:
                kept = [k for k, index in enumerate(indices) if index not in removed]
                indices, raw = [indices[k] for k in kept], [raw[k] for k in kept]
            known = set(indices)
            added = sorted(i for i in newer if i not in known)  # tasks added since the snapshot
            if added:
                indices += added
                raw += [newer[i][0] for i in added]
                if any(a > b for a, b in itertools.pairwise(indices)):
                    order = sorted(range(len(indices)), key=indices.__getitem__)
                    indices, raw = [indices[k] for k in order], [raw[k] for k in order]
        names: dict[bytes, str] = {}
        states = [names.get(r) or names.setdefault(r, _intern(r.decode())) for r in raw]
        offsets = {i: off for i, (_, off) in newer.items()}
        return cls(state, indices, states, sbytes, journal, offsets, removed, None, common)

    @property
    def total(self) -> int:
        return len(self.indices)

    def counts(self) -> dict[str, int]:
        return dict(Counter(self.states))

    @property
    def done(self) -> bool:
        return all(s in DONE_STATES for s in self.states)

    def common_overrides(self) -> list[str]:
        """The overrides every task had when sweep.json was last rewritten (a task changed
        since may lack one: intersect with the rows shown)."""
        if self._whole is not None:
            return common_overrides(self._whole)
        return list(self.common or [])

    def page(self, rows: int) -> list[TaskRecord]:
        """The first `rows` tasks as the table shows them: unfinished first, by index."""
        keys = ((s == "COMPLETED", i, k) for k, (i, s) in enumerate(zip(self.indices, self.states, strict=True)))
        chosen = [k for _, _, k in heapq.nsmallest(max(0, rows), keys)]
        if self._whole is not None:
            return [self._whole[k] for k in chosen]
        found: dict[int, TaskRecord] = {}
        hint = 0
        for k in sorted(chosen):  # in index order: the snapshot is searched forward only
            index = self.indices[k]
            if index in self._newer:
                found[k] = self._from_journal(index)
                continue
            start = self._snapshot.find(b'\n{"index":%d,' % index, hint)
            if start < 0:
                raise SweepStateError(f"task {index} is not in {STATE_FILE}")
            hint = start + 1
            found[k] = _task_line(self._snapshot, start + 1)
        return [found[k] for k in chosen]

    def tasks(self) -> Iterator[TaskRecord]:
        """Every task, in index order, one record read at a time."""
        if self._whole is not None:
            yield from self._whole
            return
        data = self._snapshot
        pos = data.find(b"\n", data.find(b"\n") + 1) + 1  # the first task's line (after the header's two)
        for index in self.indices:
            if index in self._newer:
                yield self._from_journal(index)
                continue
            while True:  # the snapshot's lines are in index order: this task's is ahead
                end = data.find(b"\n", pos)
                line = data[pos : end if end >= 0 else len(data)]
                pos = end + 1
                if line.startswith(b'{"index":%d,' % index):
                    yield _task_from_line(line.rstrip(b","))
                    break
                if end < 0 or line.startswith(b"]"):
                    raise SweepStateError(f"task {index} is not in {STATE_FILE}: changed while read?")

    def _from_journal(self, index: int) -> TaskRecord:
        at = self._newer[index]
        end = self._journal.find(b"\n", at)
        return _task_from_line(self._journal[at + 8 : end - 1])


def _task_line(data: Blob, start: int) -> TaskRecord:
    end = data.find(b"\n", start)
    return _task_from_line(data[start : end if end >= 0 else len(data)].rstrip(b","))


def _task_from_line(line: bytes) -> TaskRecord:
    return task_from_json(json.loads(line))


def _committed_end(journal: Blob) -> int:
    """Where the journal's last complete commit ends (after its header when there is none)."""
    at = len(journal)
    while True:
        start = journal.rfind(b'\n{"commit":', 0, at)
        if start < 0:
            return journal.find(b"\n") + 1
        end = journal.find(b"\n", start + 1) + 1
        if end > 0 and _record(journal[start + 1 : end]) is not None:
            return end
        at = start


def _map(path: Path) -> Blob | None:
    """A file's bytes, mapped (not copied) when it is large; None when it does not exist."""
    fh = _open(path)
    if fh is None:
        return None
    with fh:
        size = os.fstat(fh.fileno()).st_size
        if size < 1 << 20:
            return fh.read()
        return mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ)
