"""A job's "I have ended" to whoever supervises its sweep, so that the supervisor looks at
once instead of at the end of its back-off (which grows to `max_poll_interval_s`, 30 s by
default, while nothing changes).

The job appends one line to `SWEEP/.slurmagent/wake` as its process exits (after submitit
has written the task's result); the supervisor, between two polls of the scheduler, looks
at that file's size and modification time a few times a second — a `stat`, nothing more —
and polls as soon as they change (though never sooner after its last poll than its base
interval: a thousand jobs ending poll Slurm no more often than one does). A job killed
outright (SIGKILL, a node's death) writes nothing: the supervisor's own polling sees it as
before. The wake only ever makes a poll come sooner; what a poll concludes never depends on it.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path

WAKE_FILE = Path(".slurmagent") / "wake"  # under the sweep directory
# how often a sleeping supervisor looks at the wake file (a stat each time)
WAKE_CHECK_S = 0.2


def wake_path(sweep_dir: str | Path) -> Path:
    return Path(sweep_dir) / WAKE_FILE


def wake(sweep_dir: str | Path, what: str = "") -> None:
    """Tell the sweep's supervisor to look now (best effort: a failure here changes nothing
    but how soon it looks)."""
    try:
        path = wake_path(sweep_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{time.time():.3f} {os.getpid()} {what}\n".encode())
        finally:
            os.close(fd)
    except OSError:
        pass


class WakeWatch:
    """The supervisor's side: `sleep(seconds)` returns early (True) when a job has written
    to the wake file since the last look."""

    def __init__(self, sweep_dir: str | Path, sleep: Callable[[float], None] = time.sleep) -> None:
        self.path = wake_path(sweep_dir)
        self._sleep = sleep
        self._seen = self._stamp()

    def _stamp(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_size, st.st_mtime_ns)

    def woken(self) -> bool:
        """Whether the file changed since the last look (and remember it as seen)."""
        stamp = self._stamp()
        changed, self._seen = stamp != self._seen, stamp
        return changed

    def sleep(self, seconds: float, at_least: float = 0.0) -> bool:
        """Sleep `seconds` in slices of at most WAKE_CHECK_S (as many calls of the sleep
        function, whatever clock it keeps); True when woken early — never before `at_least`
        seconds (the supervisor's base interval: many jobs ending make it poll no more often
        than its base rate)."""
        slices = max(1, math.ceil(seconds / WAKE_CHECK_S))
        step = seconds / slices
        for n in range(1, slices + 1):
            self._sleep(step)
            if n * step >= at_least - 1e-9 and self.woken():
                return True
        return False
