"""Which process supervises a sweep: one at a time, by a lock.

Acting on a sweep — polling Slurm, recovering a failed task, submitting waiting tasks — is
the right of whoever holds the sweep's lead lock (`.slurmagent/lead.lock`, a filelock
lock on the sweep's shared filesystem, released by the kernel when its holder dies): the
attached launcher, a `watch`, or the detached supervisor (a Slurm job or a process,
`supervise/detach.py`). Everyone else follows: reads `sweep.json` and shows it, and takes
the lead when its holder is gone. `lead.json` says who holds it, for people.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from slurmagent.files import atomic_write

LEAD_LOCK = ".slurmagent/lead.lock"
LEAD_FILE = ".slurmagent/lead.json"


class Lead:
    """The right to act on one sweep. `take()` never blocks: False when another holds it."""

    def __init__(self, sweep_dir: str | Path, role: str) -> None:
        self.dir = Path(sweep_dir)
        self.role = role  # launcher | watch | supervisor job | supervisor process | status
        (self.dir / LEAD_LOCK).parent.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(str(self.dir / LEAD_LOCK), timeout=0)
        self.held = False

    def take(self) -> bool:
        if self.held:
            return True
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            return False
        self.held = True
        who = {"role": self.role, "pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        if os.environ.get("SLURM_JOB_ID"):
            who["job_id"] = os.environ["SLURM_JOB_ID"]
        atomic_write(self.dir / LEAD_FILE, json.dumps(who).encode())
        return True

    def release(self) -> None:
        if self.held:
            self.held = False
            self._lock.release()

    def holder(self) -> dict[str, Any]:
        """Who holds (or last held) the lead: role, pid, host, since, job_id."""
        try:
            raw = json.loads((self.dir / LEAD_FILE).read_text())
        except (OSError, ValueError):
            return {}
        return raw if isinstance(raw, dict) else {}

    def describe_holder(self) -> str:
        who = self.holder()
        if not who:
            return "another process"
        where = f"Slurm job {who['job_id']}" if who.get("job_id") else f"pid {who.get('pid')} on {who.get('host')}"
        return f"the {who.get('role', 'supervisor')} ({where})"
