"""A task's metrics sent on to its trackers, from the task's metrics.jsonl — the one file every
trainer writes (StepLoop, the trainer integrations, a plain script) — so the file is the buffer:
a tracker that does not answer is retried with back-off, nothing is lost while the file is there,
and training never waits on a tracker (a thread beside it sends; the job waits at most
`track.flush_timeout_s` at its end).

One tracker run per task for its whole life: the run's id, the offset in metrics.jsonl read so
far and, per metric, the last step sent are kept in the task's track.json, so a requeue, a
resubmission or a search promotion continues the same run and sends only what comes after. A
point is sent when its step is past the last one sent for its metric: a step that a resumed run
redid (after a kill that left no stop checkpoint) keeps the value first sent, and an epoch's line,
which repeats its step's values, adds only what is new (e.g. the validation's).

Besides the task's metrics, its trackers get what slurmagent decided about it: the in-loop
controller's interventions (adapt.jsonl, read the same way: `slurmagent.adapt.<kind>`, 1 applied
or 0 not, at its step) and, for a search trial, each rung it was run to (`slurmagent.rung`, at
that fidelity: a promotion adds a point)."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from slurmagent.errors import brief
from slurmagent.files import atomic_write, json_rows
from slurmagent.primitives.env import TaskFile, metric_values
from slurmagent.track.sinks import Point, RunInfo, Sink

log = logging.getLogger(__name__)

BACKOFF_S = (2.0, 4.0, 8.0, 16.0, 30.0, 60.0)  # between tries of a tracker that failed, then 60 s each
RUN_KEY = "_run"  # track.json's entry for the run's name, params and tags (the others are trackers')
ADAPT_PREFIX = "slurmagent.adapt."  # the in-loop controller's interventions, one metric per kind
RUNG = "slurmagent.rung"  # a search trial's rungs
OFFSETS = ("offset", "adapt_offset")  # how far track.json's tracker has read metrics.jsonl, adapt.jsonl


def new_points(lines: Iterable[bytes], sent: dict[str, int], ms: int) -> list[Point]:
    """The points of these metrics lines past what `sent` holds (metric → last step sent), in
    order; `sent` is advanced. A line's position is its step (or, without one, its epoch)."""
    points: list[Point] = []
    for row in json_rows(lines):
        step = row.get("step", row.get("epoch"))
        if not isinstance(step, int) or isinstance(step, bool):
            continue
        for name, value in metric_values(row).items():
            if step > sent.get(name, -math.inf):
                points.append(Point(name, step, value, ms))
                sent[name] = step
    return points


def intervention_lines(lines: Iterable[bytes]) -> list[bytes]:
    """The in-loop controller's records (adapt.jsonl) as metrics lines: at its step, a point
    `slurmagent.adapt.<kind>` of 1 where the intervention was applied, 0 where it was not (refused,
    skipped, capped): what the controller did, on the training's own step axis."""
    out = []
    for row in json_rows(lines):
        step, kind = row.get("step"), row.get("kind")
        if isinstance(step, int) and isinstance(kind, str) and kind:
            value = 1.0 if row.get("applied") else 0.0
            out.append(json.dumps({"step": step, f"{ADAPT_PREFIX}{kind}": value}).encode())
    return out


def rung_line(stop_at: int) -> bytes:
    """A search trial's rung, the fidelity this run of it is asked to reach, as a metrics line
    at that fidelity (`slurmagent.rung`): a trial promoted twice shows three points."""
    return json.dumps({"step": stop_at, RUNG: stop_at}).encode()


def read_state(task_dir: Path) -> dict[str, Any]:
    """The task's track.json: tracker name → its run id, offset, last steps sent, error (and
    RUN_KEY: the run's name, params and tags)."""
    try:
        state = json.loads((task_dir / TaskFile.TRACK).read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


class Forwarder:
    """Sends the lines appended to `task_dir`'s metrics.jsonl to each sink, in a thread while the
    task runs (`start`, `close`) or once (`pump` until caught up: `slurmagent track sync`)."""

    def __init__(
        self, task_dir: Path, sinks: list[Sink], run: RunInfo, interval_s: float = 2.0, stop_at: int = 0
    ) -> None:
        self.task_dir = task_dir
        self.metrics = task_dir / TaskFile.METRICS
        self.adapt = task_dir / TaskFile.ADAPT
        self.extra = [rung_line(stop_at)] if stop_at else []  # what this run adds besides the files
        self.sinks = sinks
        self.run = run
        self.interval_s = interval_s
        self.state = read_state(task_dir)
        self.state.setdefault(RUN_KEY, asdict(run))  # what `slurmagent track` makes a run of, if none was made
        for sink in sinks:  # where each sends: what `slurmagent track` sends to later
            self.state.setdefault(sink.name, {}).update(sink.where())
        self._opened: set[str] = set()
        self._extra_read: set[str] = set()
        self._pending: dict[str, tuple[list[Point], dict[str, int], dict[str, int]]] = {}  # read, not yet taken
        self._failures: dict[str, int] = {}
        self._next_try: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the thread ------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="slurmagent-track", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.pump()

    def close(self, status: str | None, timeout_s: float) -> bool:
        """The task's end: the thread stopped, what is left sent within `timeout_s`, each run
        ended with `status` (None: left as it is). True when every tracker has everything."""
        deadline = time.monotonic() + timeout_s
        self._stop.set()
        if self._thread is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()))
        done = self.pump(force=True)
        while not done and time.monotonic() < deadline:
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
            done = self.pump(force=True)
        for sink in self.sinks:
            if sink.name in self._opened and status is not None:
                try:
                    sink.end(status)
                except Exception as exc:
                    log.warning("tracker %s: could not end its run: %s", sink.name, brief(exc))
        if not done:
            behind = {s.name: self.state.get(s.name, {}).get("behind") for s in self.sinks}
            log.warning(
                "trackers not caught up at the task's end (points not sent: %s); the task's next run sends them, "
                "or: slurmagent track SWEEP",
                behind,
            )
        return done

    # -- one round ---------------------------------------------------------------------------
    def pump(self, force: bool = False) -> bool:
        """One round: each tracker due (or every one, `force`) is sent what it has not taken.
        True when every tracker is caught up with the file."""
        with self._lock:
            caught_up = True
            for sink in self.sinks:
                if not force and time.monotonic() < self._next_try.get(sink.name, 0.0):
                    caught_up = False
                    continue
                caught_up = self._pump(sink) and caught_up
            return caught_up

    def _pump(self, sink: Sink) -> bool:
        st: dict[str, Any] = self.state.setdefault(sink.name, {})
        try:
            points, at, sent = self._read(sink.name, st)
            if sink.name not in self._opened:
                st.update(sink.open(st, self.run))
                self._opened.add(sink.name)
                self._save()
            if points:
                sink.send(points)
        except Exception as exc:
            n = self._failures.get(sink.name, 0)
            self._failures[sink.name] = n + 1
            self._next_try[sink.name] = time.monotonic() + BACKOFF_S[min(n, len(BACKOFF_S) - 1)]
            pending = self._pending.get(sink.name)
            st.update(error=brief(exc), behind=len(pending[0]) if pending else None)
            st["failed_at"] = time.time()
            if n == 0:
                log.warning("tracker %s: %s; retrying with back-off", sink.name, st["error"])
            self._save()
            return False
        self._pending.pop(sink.name, None)
        if points or st.get("error") or any(st.get(key) != at[key] for key in OFFSETS):
            st.update(at, sent=sent, behind=0, error=None, sent_at=time.time())
            st["points"] = int(st.get("points", 0)) + len(points)
            self._save()
        if self._failures.pop(sink.name, 0):
            log.info("tracker %s: back, %d points sent", sink.name, len(points))
        return True

    def _read(self, name: str, st: dict[str, Any]) -> tuple[list[Point], dict[str, int], dict[str, int]]:
        """The points not yet taken by tracker `name`: those read before (kept with their
        timestamps) and those of the lines appended since — to metrics.jsonl, to adapt.jsonl (the
        controller's interventions) — and this run's rung; the files' offsets and the last steps
        sent after them."""
        points, at, sent = self._pending.get(name) or (
            [],
            {key: int(st.get(key, 0)) for key in OFFSETS},
            dict(st.get("sent", {})),
        )
        ms = int(time.time() * 1000)
        if name not in self._extra_read:
            self._extra_read.add(name)
            points = points + new_points(self.extra, sent, ms)
        at = dict(at)
        at["offset"], chunk = _appended(self.metrics, at["offset"])
        points = points + new_points(chunk, sent, ms)
        at["adapt_offset"], chunk = _appended(self.adapt, at["adapt_offset"])
        points = points + new_points(intervention_lines(chunk), sent, ms)
        self._pending[name] = (points, at, sent)
        return points, at, sent

    def _save(self) -> None:
        atomic_write(self.task_dir / TaskFile.TRACK, json.dumps(self.state, indent=1, sort_keys=True).encode())


def _appended(path: Path, offset: int) -> tuple[int, list[bytes]]:
    """The whole lines appended to `path` past `offset`, and the offset after them (a line being
    written waits for the next round; a file replaced by a shorter one is read again from 0)."""
    try:
        size = path.stat().st_size
    except OSError:
        return offset, []
    if size < offset:  # the last steps sent keep a reread free of repeats
        offset = 0
    if size == offset:
        return offset, []
    with open(path, "rb") as fh:
        fh.seek(offset)
        chunk = fh.read(size - offset)
    end = chunk.rfind(b"\n") + 1
    return offset + end, chunk[:end].splitlines()
