"""The job history store: what each finished task of the same work used, to size the next.

One row per task run to its end (all its Slurm runs together: a task requeued at its time
limit has done its work over several runs), fed from `sacct` (Elapsed, MaxRSS, ReqMem,
TotalCPU, State, nodes, GPUs) and from the runtime's progress.json (steps/s; the job's own
host-memory peak, exact where sacct's MaxRSS is sampled; on a GPU, the peak GPU memory its
allocator held; the longest checkpoint save). A run the kernel killed for memory records the
limit it was killed at (the need is at least that); a run that ran out of GPU memory records
the memory of the GPU type it ran out on (the need is more than that).
Rows are keyed by the fingerprint of the task's work: the experiment and the overrides that
change run time or memory, not the learning rate or the seed (`site.scheduling.ignore_in_fingerprint`).

SQLite in the user's state directory by default; a site points `site.scheduling.history` at
a shared file. Concurrent writers are safe (SQLite's own locking, a busy timeout). A history
that cannot be opened or read (not a database, a directory, no permission) is a warning and
an empty history — jobs are sized as without one; it never stops a plan or a launch.
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import MISSING, Field, astuple, dataclass, fields
from pathlib import Path
from typing import Any

from slurmagent.safety.paths import state_dir
from slurmagent.slurm.seam import JobUsage

log = logging.getLogger(__name__)

ENDED_STATES = frozenset({"COMPLETED", "TIMEOUT", "OUT_OF_MEMORY", "FAILED"})
# Slurm samples a job's memory every JobAcctGatherFrequency (default 30 s): the MaxRSS of a run
# shorter than that may be a few MB whatever it used
SAMPLED_AFTER_S = 30.0


def override_key(override: str) -> str:
    return override.lstrip("+~").partition("=")[0]


# how a job is run, not what it computes: left out of the fingerprint (but the GPU count stays);
# where its metrics also go (track.*) and who is told (notify.*) do not change its run time either
NOT_WORK = ("resources.*", "cluster", "checkpoint.*", "recovery.*", "health.*", "budget.*", "site.*", "hydra.*",
            "track.*", "notify.*")  # fmt: skip
WORK_RESOURCES = ("resources.gpus", "resources.nodes", "resources.tasks_per_node")


def changes_work(key: str, ignore: Sequence[str]) -> bool:
    if key in WORK_RESOURCES:
        return True
    return not any(fnmatch.fnmatch(key, p) for p in (*NOT_WORK, *ignore))


def fingerprint(experiment: str, overrides: Sequence[str], ignore: Sequence[str]) -> str:
    """A short stable id of a task's work: the experiment and its work-changing overrides
    (not how it is run: resources other than the GPU count, checkpointing, recovery…)."""
    kept = sorted(o for o in overrides if changes_work(override_key(o), ignore))
    digest = hashlib.sha256("\n".join([experiment, *kept]).encode()).hexdigest()[:16]
    return digest


@dataclass(frozen=True)
class HistoryRow:
    """One task's work, run to its end."""

    fingerprint: str
    task_key: str  # the sweep dir and task index: one row per task (a rerun of the ingest replaces it)
    experiment: str
    partition: str
    gpu_type: str  # "" for CPU jobs or an untyped request
    gpus: int  # allocated GPUs (all nodes)
    elapsed_s: float  # all its runs together
    timelimit_s: float  # the last run's limit
    max_rss_mb: float
    req_mem_mb: float
    total_cpu_s: float
    state: str  # the last run's: COMPLETED, TIMEOUT, OUT_OF_MEMORY, FAILED
    nodes: str
    runs: int  # Slurm runs (1 + requeues)
    steps_per_s: float = 0.0  # from the runtime's progress; 0 = not reported
    ended_at: float = 0.0
    gpu_mem_peak_mb: float = 0.0  # the runtime's: the most GPU memory one device held; 0 = not reported
    host_mem_peak_mb: float = 0.0  # the runtime's: the job's own host-memory peak (ru_maxrss); 0 = not reported
    oom_mem_mb: float = 0.0  # the largest --mem a run of this task was killed at (host OOM); 0 = none
    gpu_oom_gib: float = 0.0  # memory of the GPU type a run of this task ran out of GPU memory on; 0 = none
    checkpoint_s: float = 0.0  # the runtime's: what its last synchronous checkpoint save took; 0 = not reported

    @property
    def hit_limit(self) -> bool:
        return self.state == "TIMEOUT"

    @property
    def mem_need_mb(self) -> float:
        """The host memory this work needs per node, at least: the largest of sacct's MaxRSS
        (sampled every JobAcctGatherFrequency), the runtime's own peak, and the limit an
        OOM-killed run died at."""
        return max(self.max_rss_mb, self.host_mem_peak_mb, self.oom_mem_mb)

    @property
    def mem_measured(self) -> bool:
        """Whether `mem_need_mb` says more than a sample that may have missed the peak: the
        runtime measured it, a run was killed at its limit, or its runs were long enough
        for Slurm to sample them (`SAMPLED_AFTER_S`)."""
        return self.host_mem_peak_mb > 0 or self.oom_mem_mb > 0 or self.elapsed_s / max(1, self.runs) >= SAMPLED_AFTER_S


def row_from_usage(
    fp: str,
    task_key: str,
    experiment: str,
    gpu_type: str,
    runs: Sequence[JobUsage],
    steps_per_s: float = 0.0,
    gpu_mem_peak_mb: float = 0.0,
    host_mem_peak_mb: float = 0.0,
    gpu_oom_gib: float = 0.0,
    checkpoint_s: float = 0.0,
) -> HistoryRow | None:
    """The task's history row from its Slurm runs (oldest first); None until it has ended.
    The runtime's figures (0 = not reported) and the GPU memory of a type it ran out of
    memory on come from the caller (supervise/usage.py)."""
    ended = [r for r in runs if r.state in ENDED_STATES or r.state in ("REQUEUED", "PREEMPTED")]
    if not runs or runs[-1].state not in ENDED_STATES:
        return None
    last = runs[-1]
    killed_at = [float(r.req_mem_mb) for r in runs if r.state == "OUT_OF_MEMORY" and r.req_mem_mb]
    return HistoryRow(
        fingerprint=fp,
        task_key=task_key,
        experiment=experiment,
        partition=last.partition,
        gpu_type=gpu_type,
        gpus=last.gpus,
        elapsed_s=float(sum(r.elapsed_s for r in ended)),
        timelimit_s=float(last.timelimit_s or 0),
        max_rss_mb=max(r.max_rss_mb for r in runs),
        req_mem_mb=float(last.req_mem_mb),
        total_cpu_s=sum(r.total_cpu_s for r in runs),
        state=last.state,
        nodes=last.nodes,
        runs=len(ended),
        steps_per_s=steps_per_s,
        ended_at=time.time(),
        gpu_mem_peak_mb=gpu_mem_peak_mb,
        host_mem_peak_mb=host_mem_peak_mb,
        oom_mem_mb=max(killed_at, default=0.0),
        gpu_oom_gib=gpu_oom_gib,
        checkpoint_s=checkpoint_s,
    )


_COLUMNS = [f.name for f in fields(HistoryRow)]
_SQL_TYPES = {"str": "TEXT", "int": "INTEGER", "float": "REAL"}
_KEYS = {"fingerprint": " NOT NULL", "task_key": " PRIMARY KEY"}


def _column(f: Field[Any]) -> str:
    """A row field's column: its SQL type, the key constraints, a default where the field has one."""
    default = f" DEFAULT {f.default!r}" if f.default is not MISSING else ""
    return f"{f.name} {_SQL_TYPES[str(f.type)]}{_KEYS.get(f.name, '')}{default}"


# the table is the row: a store written by an older slurmagent gains the row's newer columns on open
_SCHEMA = f"CREATE TABLE IF NOT EXISTS runs ({', '.join(_column(f) for f in fields(HistoryRow))})"


def default_history_path(configured: str = "") -> Path:
    return Path(configured).expanduser() if configured else state_dir() / "history.sqlite"


class HistoryStore:
    """`HistoryStore(path)`: add rows, read the recent ones of a fingerprint."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.problem = ""  # why the history cannot be read ("" = it can): then it reads as empty
        try:
            self._open()
        except (OSError, sqlite3.Error) as exc:
            self._unusable(exc)

    def _unusable(self, exc: BaseException) -> None:
        """Said once per store: what is wrong, and that jobs are sized as without history."""
        if not self.problem:
            self.problem = str(exc) or type(exc).__name__
            log.warning(
                "slurmagent: warning: the job history %s cannot be used (%s): sizing as without history; "
                "fix or remove it, or point site.scheduling.history elsewhere",
                self.path,
                self.problem,
            )

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.execute(_SCHEMA)
            have = {row[1] for row in db.execute("PRAGMA table_info(runs)")}
            for f in fields(HistoryRow):
                if f.name not in have:
                    try:
                        db.execute(f"ALTER TABLE runs ADD COLUMN {_column(f)}")
                    except sqlite3.OperationalError as exc:  # another process added it first
                        if "duplicate column" not in str(exc):
                            raise
            db.execute("CREATE INDEX IF NOT EXISTS by_fp ON runs (fingerprint, ended_at)")

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30)

    def add(self, rows: Iterable[HistoryRow]) -> int:
        rows = list(rows)
        if rows:
            marks = ",".join("?" * len(_COLUMNS))
            with self._connect() as db:
                db.executemany(
                    f"INSERT OR REPLACE INTO runs ({','.join(_COLUMNS)}) VALUES ({marks})", map(astuple, rows)
                )
        return len(rows)

    def recent(self, fp: str, limit: int = 20) -> list[HistoryRow]:
        """The fingerprint's rows, newest first; none when the history cannot be read (a warning)."""
        if self.problem:
            return []
        try:
            with self._connect() as db:
                cur = db.execute(
                    f"SELECT {','.join(_COLUMNS)} FROM runs WHERE fingerprint = ? ORDER BY ended_at DESC LIMIT ?",
                    (fp, limit),
                )
                return [HistoryRow(*row) for row in cur.fetchall()]
        except (OSError, sqlite3.Error) as exc:
            self._unusable(exc)
            return []

    def known(self, task_keys: Iterable[str]) -> set[str]:
        keys = list(task_keys)
        if not keys:
            return set()
        with self._connect() as db:
            marks = ",".join("?" * len(keys))
            return {r[0] for r in db.execute(f"SELECT task_key FROM runs WHERE task_key IN ({marks})", keys)}
