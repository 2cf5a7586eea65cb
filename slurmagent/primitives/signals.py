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

__all__ = ["GraceFn", "StopFlag", "StopSignals", "install_handlers", "restore_handlers", "signal_number"]

# seconds from a stop signal until Slurm kills the job, by signal number (None = unknown)
GraceFn = Callable[[int], float | None]


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


@dataclass(frozen=True)
class StopSignals:
    """What the job wrapper gives the step loop: the flag its handlers set since the job
    started, and how long the job may still run after each signal (the stop checkpoint must
    fit in it)."""

    flag: StopFlag
    grace: GraceFn | None = None


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
