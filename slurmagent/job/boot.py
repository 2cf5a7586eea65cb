"""The first lines of every slurmagent job process (`python -u -m slurmagent.job.boot FOLDER
--staged ID`,
what the batch script starts in place of submitit's own entry point).

Slurm may send its stop signals at any moment of a job's life — the time-limit warning up to
a minute early, a preemption right after the start. Before the runtime has installed its
handlers, the default action of SIGUSR2 or SIGTERM ends the process. So the very first thing
this module does, before importing anything heavy, is to *block* them: a blocked signal is
held by the kernel, not lost, and is delivered the moment the job wrapper
(`job/task.py:run_in_job`) installs its handlers and unblocks them — the first step loop
then stops at once and the job requeues as for any other stop.

Then it puts the task's pickle where submitit looks for it, unless the launcher has: the
launcher stages it under a name of the submission (`--staged ID`) and moves it to the job
id's name once sbatch answers. A launcher killed between the two would otherwise leave a job
that waits 60 s for its pickle and fails, though `supervise/submission.py:reconcile` finds
the job again. Then submitit runs the task as usual.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

# every signal a stop can come as (the user signal may be USR1 or USR2; preemption is TERM)
HELD = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)


def hold_stop_signals() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, HELD)


def release_stop_signals() -> None:
    """Deliver what was held (to the handlers installed by now) and let new ones through."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)


def claim_staged_pickle(folder: str, staged: str, env: dict[str, str]) -> Path | None:
    """In the job: put this task's staged pickle in place unless it is there (what the
    launcher does right after sbatch). Returns where it went, None when there was nothing to do."""
    from slurmagent.primitives.env import slurm_job_id
    from slurmagent.primitives.submitit_layout import job_paths, place_pickle, staged_pickle, staging_folder

    job_id = slurm_job_id(env)
    if job_id is None:
        return None
    paths = job_paths(folder, job_id)
    index = int(env.get("SLURM_ARRAY_TASK_ID") or 0)
    source = staged_pickle(staging_folder(folder), staged, index)
    if paths.submitted_pickle.exists() or not source.exists():
        return None
    try:
        place_pickle(source, paths.submitted_pickle)
    except FileNotFoundError:  # another task of a multi-task job was first
        return None
    return paths.submitted_pickle


def main() -> None:
    hold_stop_signals()
    from submitit.core.submission import submitit_main

    args = sys.argv[1:]
    if len(args) == 3 and args[1] == "--staged":
        claim_staged_pickle(args[0], args[2], dict(os.environ))
        sys.argv = [sys.argv[0], args[0]]  # what submitit's own parser expects
    submitit_main()


if __name__ == "__main__":
    main()
