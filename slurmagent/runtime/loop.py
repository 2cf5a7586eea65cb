"""The step loop: restore, iterate, checkpoint every N steps, stop cleanly on a signal.

Signal handlers only set a flag (`StopFlag`); the checkpoint is written at the next step
boundary, never inside the handler. After the stop checkpoint the loop raises
`StopForRequeue`, which the job wrapper turns into a requeue (or, when Slurm is already
requeueing the job, a plain exit).
"""

from __future__ import annotations

import json
import logging
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import IO, Any, Protocol

from slurmagent.config import CheckpointConf
from slurmagent.runtime.checkpoint import CheckpointManager
from slurmagent.runtime.context import JobContext

log = logging.getLogger(__name__)


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class StopForRequeue(SystemExit):
    """Raised by the loop after a signal-triggered checkpoint: the job should end now."""

    def __init__(self, signum: int, step: int, signals: tuple[int, ...] = ()) -> None:
        self.signum = signum  # the first signal
        self.step = step  # steps done (the checkpoint's step)
        self.signals = signals or (signum,)  # every signal received, in order
        super().__init__(0)


@dataclass
class StopFlag:
    """Set by signal handlers; read at step boundaries."""

    signum: int | None = None
    received_at: float | None = None
    history: list[int] = field(default_factory=list)

    def handler(self, signum: int, frame: FrameType | None) -> None:
        del frame
        self.history.append(signum)
        if signum == signal.SIGCONT:
            return  # Slurm sends SIGCONT with SIGTERM at preemption; nothing to do on its own
        if self.signum is None:
            self.signum = signum
            self.received_at = time.monotonic()

    @property
    def set(self) -> bool:
        return self.signum is not None


def install_handlers(flag: StopFlag, signals: list[int]) -> dict[int, Any]:
    """Point `signals` at the flag; returns the previous handlers for restoring."""
    previous: dict[int, Any] = {}
    for sig in signals:
        previous[sig] = signal.signal(sig, flag.handler)
    return previous


def signal_number(name: str) -> int:
    return int(getattr(signal, f"SIG{name}"))


_job_flag: StopFlag | None = None


def own_job_signals(stop_signals: tuple[str, ...] = ("USR2", "TERM")) -> StopFlag:
    """Take the stop signals for the whole job, from its start: a preemption that arrives
    while the task is still importing or loading data is remembered, and the first step
    loop stops at once. Replaces submitit's handlers (which only log SIGTERM)."""
    global _job_flag
    _job_flag = StopFlag()
    install_handlers(_job_flag, [signal_number(s) for s in stop_signals] + [signal.SIGCONT])
    return _job_flag


def release_job_signals() -> None:
    global _job_flag
    _job_flag = None


class StepLoop:
    """`for step in loop:` yields the steps still to run, checkpointing as configured.

    On entry it restores the newest valid checkpoint into `state` (or starts fresh), so
    `loop.start_step` is where this attempt begins. `loop.report(**metrics)` records
    metrics; `loop.metrics` keeps the last ones.
    """

    def __init__(
        self,
        ctx: JobContext,
        state: Stateful,
        total_steps: int,
        conf: CheckpointConf | None = None,
        stop_signals: tuple[str, ...] = ("USR2", "TERM"),
        clock: Callable[[], float] = time.monotonic,
        install_signal_handlers: bool = True,
        is_writer: bool | None = None,
    ) -> None:
        self.ctx = ctx
        self.state = state
        self.total_steps = total_steps
        self.conf = conf or CheckpointConf()
        self.manager = CheckpointManager(ctx.checkpoint_dir, keep_last=self.conf.keep_last)
        self.flag = _job_flag if _job_flag is not None else StopFlag()
        self._clock = clock
        self._signals = [signal_number(s) for s in stop_signals] + [signal.SIGCONT]
        self._install = install_signal_handlers
        self.is_writer = ctx.rank == 0 if is_writer is None else is_writer
        self.metrics: dict[str, float] = {}
        self.start_step = 0
        self.restored_from: int | None = None
        self._last_save = clock()
        self.step = 0
        self._metrics_file: IO[str] | None = None

    def restore(self) -> int:
        found = self.manager.latest()
        if found is None:
            self.start_step = 0
            return 0
        entry, payload = found
        self.state.load_state_dict(payload["state"])
        self.metrics = dict(payload.get("metrics", {}))
        self.start_step = self.restored_from = entry.step
        log.info("resumed from checkpoint at step %d (%s)", entry.step, entry.file)
        return entry.step

    # -- checkpoint saves (background periodic saves: see CheckpointManager.save_background) --
    background_saves = True  # periodic saves block only for a snapshot; set False for synchronous ones

    def save(self, step: int, background: bool = False) -> None:
        """Checkpoint after `step` steps. background=True (periodic saves): returns after a
        snapshot, the write runs in a thread. Otherwise the write (and any earlier background
        one) is durable when this returns: stop-for-requeue and final saves."""
        if self.is_writer:
            payload = {"state": self.state.state_dict(), "metrics": self.metrics, "step": step}
            if background and self.background_saves:
                self.manager.save_background(step, payload)
            else:
                self.manager.save(step, payload)
        self._last_save = self._clock()

    @property
    def last_save_seconds(self) -> float:
        """Duration of the last completed save, start to durable file (0.0 before the first)."""
        return self.manager.last_save_s

    # -- end of checkpoint saves --

    def report(self, **metrics: float) -> None:
        """Record metrics for this step: kept in `loop.metrics` and in checkpoints, and
        appended (rank 0) to `<output dir>/metrics.jsonl` as {"step": …, name: value}."""
        values = {k: float(v) for k, v in metrics.items()}
        self.metrics.update(values)
        if self.is_writer:
            if self._metrics_file is None:
                self.ctx.output_dir.mkdir(parents=True, exist_ok=True)
                self._metrics_file = open(self.ctx.output_dir / "metrics.jsonl", "a")  # noqa: SIM115 - closed at loop end
            self._metrics_file.write(json.dumps({"step": self.step, **values}) + "\n")

    def _due(self, done: int) -> bool:
        if self.conf.every_steps and done % self.conf.every_steps == 0:
            return True
        return bool(self.conf.every_seconds and self._clock() - self._last_save >= self.conf.every_seconds)

    def __iter__(self) -> Iterator[int]:
        owned = self.flag is _job_flag  # the job wrapper already owns the signals
        previous = install_handlers(self.flag, self._signals) if self._install and not owned else {}
        periodic = 0 < self.conf.every_steps < self.total_steps or self.conf.every_seconds
        try:
            self.restore()
            if self.is_writer and self.background_saves and periodic:
                self.manager.prepare(self.state.state_dict())  # snapshot memory, allocated in the background
            if self.flag.set:  # stopped before the first step: nothing new to save
                raise StopForRequeue(int(self.flag.signum or 0), self.start_step, tuple(self.flag.history))
            for step in range(self.start_step, self.total_steps):
                self.step = step
                yield step
                done = step + 1
                if self.flag.set:
                    self.save(done)
                    log.warning("signal %s: checkpointed at step %d, stopping for requeue", self.flag.signum, done)
                    raise StopForRequeue(int(self.flag.signum or 0), done, tuple(self.flag.history))
                if done < self.total_steps and self._due(done):
                    self.save(done, background=True)
            self.step = self.total_steps
            if self.total_steps > self.start_step or self.restored_from is None:
                self.save(self.total_steps)
        finally:
            self.manager.wait(raise_errors=False)  # leaving early: let a background write finish
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self._metrics_file is not None:
                self._metrics_file.close()
                self._metrics_file = None
