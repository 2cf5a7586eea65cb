"""What `slurmagent cancel` (and an interrupted launcher's `cancel`, or `on_refusal=cancel`)
does to a sweep: its unfinished tasks and its detached supervisor end."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from slurmagent.slurm.seam import SlurmCLI
from slurmagent.supervise.detach import stop_supervisor
from slurmagent.supervise.procs import cmdline
from slurmagent.supervise.state import SweepStore


def cancel_sweep(sweep_dir: str | Path, slurm: SlurmCLI, why: str) -> int:
    """Cancel every unfinished task of a sweep (Slurm: its arrays; local: its task processes)
    and its detached supervisor; each ends CANCELLED with `why`. How many tasks."""
    stop_supervisor(Path(sweep_dir), slurm)
    with SweepStore(sweep_dir).edit() as state:
        live = [t for t in state.tasks if not t.done]
        if state.backend == "slurm":
            slurm.cancel(state.array_ids)
        else:
            for t in live:
                if t.job_id and _is_local_task(t.job_id):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(t.job_id), signal.SIGTERM)
        for t in live:
            t.state, t.error = "CANCELLED", f"CANCELLED: {why}"
    return len(live)


def _is_local_task(pid: str) -> bool:
    """True only if `pid` still runs a submitit task (a pid may have been reused since)."""
    return any(b"submitit" in arg for arg in cmdline(pid))
