"""What `slurmagent cancel` (and an interrupted launcher's `cancel`, or `on_refusal=cancel`)
does to a sweep: its unfinished tasks and its detached supervisor end."""

from __future__ import annotations

from pathlib import Path

from slurmagent.slurm.seam import SlurmCLI
from slurmagent.supervise.detach import stop_supervisor
from slurmagent.supervise.state import SweepStore


def cancel_sweep(sweep_dir: str | Path, slurm: SlurmCLI, why: str) -> int:
    """Cancel every unfinished task of a sweep (Slurm: its arrays; local: its task processes)
    and its detached supervisor; each ends CANCELLED with `why`. How many tasks."""
    stop_supervisor(Path(sweep_dir), slurm)
    with SweepStore(sweep_dir).edit() as state:
        live = [t for t in state.tasks if not t.done]
        state.where.end(slurm, state.array_ids, [t.job_id for t in live if t.job_id])
        for t in live:
            t.state, t.error = "CANCELLED", f"CANCELLED: {why}"
    return len(live)
