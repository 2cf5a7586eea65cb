"""The sweep's state on disk: `sweep.json` in the sweep directory, changed only under a
filelock lock and written atomically, so a killed launcher loses nothing and `slurmagent
watch` can pick the sweep up again.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock

from slurmagent.errors import SweepStateError
from slurmagent.files import atomic_file
from slurmagent.slurm.seam import TERMINAL_STATES

STATE_FILE = "sweep.json"
LOCK_FILE = ".sweep.lock"
# a task is done when its latest job is, or when Slurm refused to take it (supervise/submission.py)
DONE_STATES = TERMINAL_STATES | {"REFUSED"}


@dataclass
class Attempt:
    job_id: str  # Slurm job id ("123_4") or local pid
    submitted_at: float  # unix time
    state: str = "PENDING"  # last state seen
    reason: str = ""  # why it ended, when it did not complete
    nodes: str = ""  # where it ran
    restarts: int = 0  # Slurm requeues of this job


@dataclass
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


@dataclass
class SweepState:
    sweep_dir: str
    backend: str  # "slurm" or "local"
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

    @property
    def done(self) -> bool:
        return all(t.done for t in self.tasks)

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

    def to_json(self) -> dict[str, Any]:
        """Plain data for sweep.json, without copying what is already plain (10,000 tasks)."""
        out = dict(vars(self))
        out["tasks"] = [{**vars(t), "attempts": [vars(a) for a in t.attempts]} for t in self.tasks]
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> SweepState:
        tasks = [TaskRecord(**{**t, "attempts": [Attempt(**a) for a in t["attempts"]]}) for t in raw["tasks"]]
        return cls(**{**raw, "tasks": tasks})


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


class SweepStore:
    """Reads and changes a sweep's state file under its lock."""

    def __init__(self, sweep_dir: str | Path) -> None:
        self.dir = Path(sweep_dir)
        self.path = self.dir / STATE_FILE
        self.lock = FileLock(str(self.dir / LOCK_FILE), timeout=60)

    def exists(self) -> bool:
        return self.path.exists()

    def create(self, state: SweepState) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        with self.lock:
            self._write(state)

    def load(self) -> SweepState:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            raise SweepStateError(f"{self.dir} is not a slurmagent sweep directory: no {STATE_FILE} in it") from None
        except ValueError as exc:
            raise SweepStateError(f"{self.path} is not valid JSON: {exc}") from None
        return SweepState.from_json(raw)

    def write(self, state: SweepState) -> None:
        """Write `state` now; the caller holds the lock (inside `edit()`): a record that must be
        on disk before an action (a submission's intent) is persisted this way."""
        self._write(state)

    def _write(self, state: SweepState) -> None:
        for t in state.tasks:
            t.result = _jsonable(t.result)
        with atomic_file(self.path) as fh:  # streamed: a 10,000-task sweep is never one big string
            text = io.TextIOWrapper(fh, encoding="utf-8")
            json.dump(state.to_json(), text, indent=1)
            text.flush()
            text.detach()  # the file itself is closed (after fsync) by atomic_file

    @contextmanager
    def edit(self) -> Iterator[SweepState]:
        """`with store.edit() as state:` — load, change, write back, all under the lock."""
        with self.lock:
            state = self.load()
            yield state
            if state.done and state.finished_at is None:
                state.finished_at = time.time()
            self._write(state)
