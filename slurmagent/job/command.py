"""A `task.command` program in a job: the plain-script protocol (docs/trainers.md).

The program — any language, no slurmagent import — is run as a child (argv, no shell) with the
job's context in SLURMAGENT_* variables, and:
- gets every signal Slurm sends the job (the stop signal, SIGTERM, SIGCONT, SIGINT) forwarded;
- saves its state where `$SLURMAGENT_CHECKPOINT_DIR` says and exits with `$SLURMAGENT_REQUEUE_EXIT`
  (75) to be run again: the job's stop decision (`job/stop.py`) requeues it through the gate;
- finds the newest valid checkpoint of the task's earlier runs in `$SLURMAGENT_RESUME_FROM`
  (unset on a first run), chosen by the `auto_resume` skill in any format it knows;
- stops at `$SLURMAGENT_STOP_AT` (a search trial's rung, in its fidelity unit) when it is set;
- appends metrics to `$SLURMAGENT_METRICS`, one JSON object a line (`{"step": 3, "loss": 0.2}`,
  `"epoch"` for a search's fidelity): `results`, `report` and the search read them, and this
  module turns the newest into the task's progress for `status` while the program runs;
- returns a value by writing `$SLURMAGENT_OUTPUT_DIR/result.json`.
It runs in the task's output directory; a relative path in its command line that names a file of
the project (`[python,train.py]`, `[bash,train.sh,data/cfg.json]`) is taken from the sweep's code
snapshot (`primitives/code.py`), else from the directory the job started in — the launch directory.
Any other non-zero exit is a failure, named with the code and the last lines of its stderr.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from slurmagent.errors import TaskFailedError
from slurmagent.job.boot import release_stop_signals
from slurmagent.primitives.code import read_snapshot, snapshot_root
from slurmagent.primitives.env import REQUEUE_EXIT_CODE, JobEnv, TaskFile
from slurmagent.primitives.signals import restore_handlers
from slurmagent.runtime.context import JobContext
from slurmagent.runtime.loop import StopForRequeue, record_host_peak, write_progress
from slurmagent.skills.auto_resume import newest_checkpoint

log = logging.getLogger(__name__)

FORWARDED = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGCONT, signal.SIGINT)
PROGRESS_EVERY_S = 1.0  # the metrics file is read for progress at most this often
RESULT_FILE = "result.json"


def protocol_env(ctx: JobContext, resume: tuple[str, int | None] | None) -> dict[str, str]:
    """The protocol's variables, beside the context's own (`JobContext.to_env`)."""
    env = {
        JobEnv.METRICS: str(ctx.output_dir / TaskFile.METRICS),
        JobEnv.REQUEUE_EXIT: str(REQUEUE_EXIT_CODE),
    }
    if resume is not None:
        env[JobEnv.RESUME_FROM] = resume[0]
    return {str(k): v for k, v in env.items()}


def code_root(ctx: JobContext) -> Path:
    """Where the project's files are for this job: the sweep's snapshot of the launch directory,
    else the directory the job started in."""
    snapshot = read_snapshot(ctx.sweep_dir) if ctx.sweep_dir is not None else None
    if snapshot is not None and ctx.sweep_dir is not None:
        return snapshot_root(ctx.sweep_dir, snapshot)
    return Path.cwd()


def resolve_argv(argv: list[str], root: Path) -> list[str]:
    """`argv` with each relative word that names a file under `root` made absolute (the program
    runs elsewhere, in the task's output directory); every other word as it is."""
    out = []
    for word in argv:
        candidate = root / word
        out.append(str(candidate) if word and not Path(word).is_absolute() and candidate.is_file() else word)
    return out


class MetricsTail:
    """Follows the metrics file the program appends to: its newest step and values, read
    incrementally (whole lines only), as the task's progress.json."""

    def __init__(self, path: Path, attempt: int) -> None:
        self.path = path
        self.attempt = attempt
        self.offset = path.stat().st_size if path.exists() else 0  # earlier runs' lines are not this run's
        self.step: int | None = None
        self.start_step: int | None = None
        self.started = time.monotonic()
        self.metrics: dict[str, float] = {}
        self._read_at = 0.0

    def read(self) -> bool:
        """Take in the lines appended since the last read; True when there were any."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except OSError:
            return False
        end = chunk.rfind(b"\n") + 1  # a line being written stays for the next read
        self.offset += end
        seen = False
        for line in chunk[:end].splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if not isinstance(row, dict):
                continue
            seen = True
            position = row.get("step", row.get("epoch"))
            if isinstance(position, int) and not isinstance(position, bool):
                self.step = position
                self.start_step = position if self.start_step is None else self.start_step
            self.metrics.update(
                {
                    k: float(v)
                    for k, v in row.items()
                    if k != "step" and isinstance(v, int | float) and not isinstance(v, bool)
                }
            )
        return seen

    def progress(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._read_at < PROGRESS_EVERY_S:
            return
        self._read_at = now
        if not self.read() and not force:
            return
        if self.step is None:
            return
        elapsed = now - self.started
        done = self.step - (self.start_step or 0)
        body: dict[str, Any] = {
            "step": self.step,
            "total_steps": None,
            "start_step": self.start_step,
            "steps_per_s": done / elapsed if done > 0 and elapsed > 0 else None,
            "metrics": self.metrics,
            "time": time.time(),
            "attempt": self.attempt,
        }
        write_progress(self.path.with_name(str(TaskFile.PROGRESS)), body)


def run_command(argv: list[str], ctx: JobContext) -> Any:
    """Run `argv` under the plain-script protocol (the module docstring). Raises StopForRequeue
    when the program exits with the requeue code (the caller's stop decision acts on it), a
    TaskFailedError on any other non-zero exit; returns the program's result.json or None. Once
    it has ended, its host-memory peak goes into the task's progress.json for the job history."""
    ctx.output_dir.mkdir(parents=True, exist_ok=True)
    ctx.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    resume = newest_checkpoint(ctx.checkpoint_dir)
    if resume is not None:
        log.info("resuming from %s (step %s)", resume[0], resume[1])
    env = dict(os.environ, **ctx.to_env(), **protocol_env(ctx, resume))
    argv = resolve_argv(argv, code_root(ctx))
    err_path = ctx.output_dir / TaskFile.COMMAND_STDERR
    started: list[subprocess.Popen[bytes]] = []
    received: list[int] = []  # every signal the job got while the program ran, in order
    early: list[int] = []  # those that came before the child existed: forwarded once it does

    def forward(signum: int, _frame: Any) -> None:
        received.append(signum)
        if started:
            started[0].send_signal(signum)
        else:
            early.append(signum)

    previous: dict[int, Any] = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    release_stop_signals()  # held since the process started (job/boot.py): now they are forwarded
    tail = MetricsTail(ctx.output_dir / TaskFile.METRICS, ctx.attempt) if ctx.rank == 0 else None
    try:
        with open(err_path, "ab") as err:
            started.append(subprocess.Popen(argv, env=env, stderr=err, cwd=ctx.output_dir))
        for signum in early:
            started[0].send_signal(signum)
        while True:
            try:
                code = started[0].wait(timeout=PROGRESS_EVERY_S)
                break
            except subprocess.TimeoutExpired:
                if tail is not None:
                    tail.progress()
    finally:
        restore_handlers(previous)
    if tail is not None:
        tail.progress(force=True)
        record_host_peak(ctx.output_dir)
    if code == REQUEUE_EXIT_CODE:
        saved = newest_checkpoint(ctx.checkpoint_dir)
        step = saved[1] if saved is not None and saved[1] is not None else 0
        stops = tuple(s for s in received if s != signal.SIGCONT)
        log.warning("the program saved (checkpoint %s) and asks to run again", saved[0] if saved else "none found")
        raise StopForRequeue(stops[0] if stops else 0, step, stops)
    if code != 0:
        tail_lines = err_path.read_text(errors="replace").splitlines()[-10:]
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        raise TaskFailedError(f"command {argv[0]!r} {how}; last stderr lines:\n" + "\n".join(tail_lines))
    result_file = ctx.output_dir / RESULT_FILE
    if result_file.exists():
        return json.loads(result_file.read_text())
    return None
