"""The first lines of every slurmagent job process (`python -u -m slurmagent.job.boot FOLDER`,
what the batch script starts in place of submitit's own entry point).

Slurm may send its stop signals at any moment of a job's life — the time-limit warning up to
a minute early, a preemption right after the start. Before the runtime has installed its
handlers, the default action of SIGUSR2 or SIGTERM ends the process. So the very first thing
this module does, before importing anything heavy, is to *block* them: a blocked signal is
held by the kernel, not lost, and is delivered the moment the job wrapper
(`job/task.py:run_in_job`) installs its handlers and unblocks them — the first step loop
then stops at once and the job requeues as for any other stop. Then submitit runs the task
as usual.
"""

from __future__ import annotations

import signal

# every signal a stop can come as (the user signal may be USR1 or USR2; preemption is TERM)
HELD = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)


def hold_stop_signals() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, HELD)


def release_stop_signals() -> None:
    """Deliver what was held (to the handlers installed by now) and let new ones through."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)


def main() -> None:
    hold_stop_signals()
    from submitit.core.submission import submitit_main

    submitit_main()


if __name__ == "__main__":
    main()
