"""Stop signals as the runtime sees them: a flag that handlers set and the step loop reads
at step boundaries (never a checkpoint inside a handler). Who owns the signals is decided
above: the job wrapper (`slurmagent.job`) installs the handlers from the job's start and
hands the flag to the loop through the job context; a plain script's loop installs its own."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

__all__ = ["FinishFn", "GraceFn", "StopFlag", "StopSignals", "install_handlers", "restore_handlers", "signal_number"]

# seconds from a stop signal until Slurm kills the job, by signal number (None = unknown)
GraceFn = Callable[[int], float | None]
# at a stop: (the signals received, seconds the rest of the run takes) → why the run may finish
# instead of stopping for a requeue, or None when it must stop
FinishFn = Callable[[tuple[int, ...], float], str | None]


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

    def clear(self, since: int = 0) -> None:
        """The stop was answered without stopping (the run finishes first): the flag is set
        again by the first signal after `history[since]` (one that came while the answer was
        sought) or by a later one; `history` keeps every signal."""
        later = [s for s in self.history[since:] if s != signal.SIGCONT]
        self.signum = later[0] if later else None
        self.received_at = time.monotonic() if later else None


@dataclass(frozen=True)
class StopSignals:
    """What the job wrapper gives the step loop: the flag its handlers set since the job
    started, how long the job may still run after each signal (the stop checkpoint must fit
    in it), and whether a run near its end may finish instead of stopping (job/stop.py)."""

    flag: StopFlag
    grace: GraceFn | None = None
    finish: FinishFn | None = None


def signal_number(name: str) -> int:
    return int(getattr(signal, f"SIG{name}"))


def install_handlers(flag: StopFlag, signals: list[int]) -> dict[int, Any]:
    """Point `signals` at the flag; returns the previous handlers for restoring."""
    previous: dict[int, Any] = {}
    for sig in signals:
        previous[sig] = signal.signal(sig, flag.handler)
    return previous


def restore_handlers(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


class InterruptAtSleep:
    """Ctrl-C (SIGINT) that takes effect only where the process waits: raised as
    KeyboardInterrupt from `sleep` (at once when it arrives during one, else at the next
    one), never in the middle of other work — a KeyboardInterrupt raised inside a poll could
    leave what it was reading half-done (OmegaConf nodes of the sweep's config: the cancel
    that followed it once failed on one). A second Ctrl-C before that sleep acts at once.

        with InterruptAtSleep() as ctrl_c:
            Supervisor(…, sleep=ctrl_c.sleep).wait()   # KeyboardInterrupt only from ctrl_c.sleep

    Outside the main thread (where no handler can be installed) it is a plain sleep."""

    def __init__(self, sleep: Callable[[float], None] = time.sleep) -> None:
        self._sleep = sleep
        self.pending = False  # a Ctrl-C came, not yet raised
        self._sleeping = False
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> InterruptAtSleep:
        import threading

        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)
            self._installed = True
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False

    def _handler(self, _signum: int, _frame: FrameType | None) -> None:
        if self._sleeping or self.pending:
            self.pending = False
            raise KeyboardInterrupt
        self.pending = True

    def sleep(self, seconds: float) -> None:
        if self.pending:
            self.pending = False
            raise KeyboardInterrupt
        self._sleeping = True
        try:
            self._sleep(seconds)
        finally:
            self._sleeping = False
