"""Where submitit keeps a job's files, in one module: the job folder's layout (`JobPaths`:
a job's submitted and result pickles, its logs), the staging folder of a submission, and
slurmagent's own staged pickles in it (a task's pickle written before sbatch answers, under a
name of the submission, and moved to the job id's name after — by the launcher, or by the
job itself when the launcher died in between: job/boot.py).

The launcher (launch/backend.py), the job's first lines (job/boot.py) and what reads a job's
results and logs (supervise/jobfiles.py) all ask here, so submitit's layout has one reader."""

from __future__ import annotations

import os
from pathlib import Path

from submitit.core.utils import JobPaths


def job_paths(folder: str | Path, job_id: str) -> JobPaths:
    """submitit's paths of one job (its first task's: slurmagent runs one per job or array task)."""
    return JobPaths(folder, job_id=job_id, task_id=0)


def staging_folder(folder: str | Path) -> Path:
    """The folder of a submission's files before Slurm has named the job."""
    return Path(JobPaths.get_first_id_independent_folder(folder))


def staged_pickle(staging: Path, staged: str, index: int) -> Path:
    """Where a submission's task `index` (its array index; 0 for a lone job) waits for its
    job id: named by the submission (`--staged`), so the job can find it without the launcher."""
    return staging / f".staged_{staged}_{index}.pkl"


def place_pickle(staged: Path, submitted: Path, make_folder: bool = True) -> None:
    """Move a staged pickle to the job's own name; the launcher and the job both try, and
    whichever comes second finds it done. `make_folder=False`: the caller made the folder
    (once for an array's tasks)."""
    if make_folder:
        submitted.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(staged, submitted)
    except FileNotFoundError:
        if not submitted.exists():
            raise
