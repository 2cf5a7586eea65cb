"""What every trainer integration shares (docs/trainers.md): the job context, the stop signals
and the stop itself, where a run resumes from, metrics and progress for `status`, `results` and
`report`, old checkpoints deleted through the gate, and the in-loop controller's boundary.

A trainer's adapter (`lightning.py`, `hf.py`) maps its library's hooks onto a `Bridge`; the
bridge knows nothing of any library. It runs in one of two ways, found from the job context:
- **in-process**: `task.target` is a function that builds the trainer; the job wrapper
  (`job/task.run_in_job`) already owns the stop signals and hands their flag over in the context;
  a stop raises `StopForRequeue`, and the job's stop decision (`job/stop.py`) requeues;
- **a child** (`task.command`, or outside slurmagent): the bridge takes the stop signals itself
  and a stop exits with `$SLURMAGENT_REQUEUE_EXIT` — the plain-script protocol (`job/command.py`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn

from slurmagent.config import AdaptConf, adapt_conf
from slurmagent.files import fsync_dir
from slurmagent.primitives.checkpoint import CheckpointEntry
from slurmagent.primitives.env import REQUEUE_EXIT_CODE, JobEnv, Progress, TaskFile
from slurmagent.primitives.signals import StopFlag, install_handlers, restore_handlers, signal_number
from slurmagent.runtime import context as job_context
from slurmagent.runtime.loop import (
    StopForRequeue,
    agree_stop,
    host_memory_peak_mb,
    intervene,
    keep_last_pruner,
    write_progress,
)
from slurmagent.skills.auto_resume import newest_checkpoint

if TYPE_CHECKING:
    from slurmagent.runtime.adapt import Controller

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 1.0  # progress.json is rewritten at most this often
# the signals a trainer's stop listens to: Lightning's requeue signal, slurmagent's default, the
# preemption's (and `scontrol requeue`'s) SIGTERM; SIGCONT is swallowed (Slurm sends it with SIGTERM)
STOP_SIGNALS = ("USR1", "USR2", "TERM")


def floats(metrics: Mapping[str, Any], drop: Iterable[str] = ()) -> dict[str, float]:
    """The values that are single finite numbers (one-element tensors included), `drop` left out."""
    out: dict[str, float] = {}
    skip = set(drop)
    for key, value in metrics.items():
        if key in skip or isinstance(value, bool):
            continue
        try:
            number = float(value.item() if hasattr(value, "item") else value)
        except (TypeError, ValueError, RuntimeError):
            continue
        if math.isfinite(number):
            out[str(key)] = number
    return out


def _flat(loaders: Any) -> list[Any]:
    if isinstance(loaders, dict):
        return list(loaders.values())
    return list(loaders) if isinstance(loaders, list | tuple) else [loaders]


def loader_generators(loaders: Any) -> list[Any]:
    """The torch generators of training loaders (the loader's own and its sampler's, once each),
    in a stable order: an epoch's data order is drawn from them (Accelerate gives a shuffling
    sampler one of its own), so a checkpoint holds their states and a resume puts them back where
    the saved run had them, or the next epochs would be shuffled differently."""
    import torch

    found: list[Any] = []
    for loader in _flat(loaders):
        sampler = getattr(loader, "sampler", None)
        batch_sampler = getattr(loader, "batch_sampler", None)
        for g in (
            getattr(loader, "generator", None),
            getattr(sampler, "generator", None),
            getattr(getattr(batch_sampler, "sampler", None), "generator", None),
        ):
            if isinstance(g, torch.Generator) and all(g is not seen for seen in found):
                found.append(g)
    return found


def set_generators(loaders: Any, states: list[Any]) -> None:
    generators = loader_generators(loaders)
    if len(states) != len(generators):
        log.warning(
            "the training loaders have %d generators, the checkpoint %d: not restored", len(generators), len(states)
        )
        return
    for generator, state in zip(generators, states, strict=True):
        generator.set_state(state)


def durable(path: Path) -> None:
    """fsync a checkpoint a library wrote in place — a file, or a folder's files — and its folder."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        with open(file, "rb") as fh:
            os.fsync(fh.fileno())
    if path.is_dir():
        fsync_dir(path)
    fsync_dir(path.parent)


class Bridge:
    """One trainer's run under slurmagent (the module docstring). `accept(path)` says which of
    the checkpoints found in the task's checkpoint directory this trainer can resume from."""

    def __init__(self, accept: Callable[[Path], bool], keep_last: int | None = None) -> None:
        self.ctx = job_context.current()
        self.child = self.ctx.signals is None  # a task.command child, or outside slurmagent
        self.flag = self.ctx.signals.flag if self.ctx.signals is not None else StopFlag()
        self.signals = [signal_number(s) for s in STOP_SIGNALS] + [signal.SIGCONT]
        # what these signals did before the run (the job's handlers in-process, the defaults in a
        # child): put back when training ends, so that a signal after it means what it meant before
        self._outside: dict[int, Any] = {sig: signal.getsignal(sig) for sig in self.signals}
        if self.child:  # before the trainer exists: a library finds its requeue signal taken
            self.take_signals()
        self.keep_last = keep_last if keep_last is not None else self.ctx.checkpoint.keep_last
        self.checkpoint_dir = self.ctx.checkpoint_dir
        self.accept = accept
        self.controller: Controller | None = None
        self._metrics_file: IO[str] | None = None
        self._started = time.monotonic()
        self._start_step = 0
        self._progress_at = 0.0
        self.last: dict[str, float] = {}  # the newest value of every metric logged
        self.this_epoch: dict[str, float] = {}  # the newest value of each metric logged in the epoch in progress

    # -- the signals ----------------------------------------------------------------------
    def take_signals(self) -> None:
        """The stop signals set our flag (again: a library may have put its own handlers in front)."""
        install_handlers(self.flag, self.signals)

    def release_signals(self) -> None:
        """Training is over: the stop signals go back to what they did before the run."""
        restore_handlers(self._outside)

    def should_stop(self) -> bool:
        """At a step boundary: a stop signal came, on any rank (a collective in a multi-rank job)."""
        return agree_stop(self.flag.set)

    # -- where a run resumes from ---------------------------------------------------------
    def find_resume(self, directory: Path | None = None) -> str | None:
        """The newest valid checkpoint of the task's earlier runs that this trainer reads: the one the
        job handed a child (`$SLURMAGENT_RESUME_FROM`), else the newest in `directory` (default: the
        task's checkpoint directory) by the `auto_resume` skill."""
        handed = os.environ.get(JobEnv.RESUME_FROM)
        if handed and self.child and directory is None and self.accept(Path(handed)):
            return handed
        found = newest_checkpoint(directory or self.checkpoint_dir, self.accept)  # the newest this trainer reads
        return found[0] if found is not None else None

    # -- metrics and progress ---------------------------------------------------------------
    def started(self, step: int) -> None:
        """The run trains from `step` on (0, or the step it resumed at)."""
        self._started = time.monotonic()
        self._start_step = step

    def metrics(self, step: int, values: Mapping[str, float], writer: bool, **extra: int) -> None:
        """One line of the task's metrics.jsonl (rank 0 writes): `{"step": …, **extra, **values}`;
        `extra` is `epoch=N` for an epoch's end, the line a search reads its objective from."""
        self.last.update(values)
        if not extra:
            self.this_epoch.update(values)
        if self.controller is not None and values and not extra:  # an epoch's line repeats what was logged
            self.controller.evaluate(step - 1, values)  # the controller counts from the step in flight (StepLoop's)
        if not writer:
            return
        if self._metrics_file is None:
            path = Path(os.environ.get(JobEnv.METRICS) or self.ctx.output_dir / TaskFile.METRICS)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._metrics_file = open(path, "a", buffering=1)  # noqa: SIM115 - closed by close()
        self._metrics_file.write(json.dumps({"step": step, **extra, **values}) + "\n")

    def epoch_line(self, step: int, epoch: int, writer: bool, **values: float) -> None:
        """The epoch's end: a line with `"epoch"` holding the newest value of each metric logged during
        the epoch (`values` added), the line a search reads its objective from; then a new epoch."""
        self.metrics(step, {**self.this_epoch, **values}, writer, epoch=epoch)
        self.this_epoch = {}

    def progress(self, step: int, total: int | None, writer: bool, force: bool = False) -> None:
        """progress.json for `status` (in-process only: a child's job reads its metrics for it)."""
        now = time.monotonic()
        if self.child or not writer or (not force and now - self._progress_at < PROGRESS_EVERY_S):
            return
        self._progress_at = now
        elapsed = now - self._started
        write_progress(
            self.ctx.output_dir / TaskFile.PROGRESS,
            {
                "step": step,
                "total_steps": total,
                "start_step": self._start_step,
                Progress.STEPS_PER_S: (step - self._start_step) / elapsed
                if step > self._start_step and elapsed > 0
                else None,
                "metrics": self.last,
                "time": time.time(),
                "attempt": self.ctx.attempt,
                Progress.HOST_MEM_PEAK_MB: round(host_memory_peak_mb(), 1),
            },
        )

    def close(self) -> None:
        if self._metrics_file is not None:
            self._metrics_file.close()
            self._metrics_file = None

    # -- old checkpoints ----------------------------------------------------------------------
    def prune(self, ours: list[tuple[int, Path]], delete: Callable[[Path], None]) -> None:
        """`ours`: (step, path) of this trainer's checkpoints; those beyond keep_last, oldest first,
        are deleted by `delete`, each deletion asked of the gate (plain keep-last outside a job)."""
        if self.keep_last <= 0:
            return
        ours = sorted(ours)
        prune = keep_last_pruner(self.ctx.approve, self.keep_last)
        for step, old in ours[: -self.keep_last]:
            if prune is None:
                delete(old)
                continue
            size = old.stat().st_size if old.is_file() else sum(p.stat().st_size for p in old.rglob("*") if p.is_file())
            entry = CheckpointEntry(step, old.name, old.stat().st_mtime, "", size)
            prune(entry, lambda old=old: delete(old))  # type: ignore[misc]

    # -- the stop -------------------------------------------------------------------------
    def stop(self, step: int, path: Path | None) -> NoReturn:
        """The run saved its stop checkpoint at `path` (None: stopped before its first step, nothing new
        to save): end it for a requeue — the job's stop path in-process, the requeue exit code in a child."""
        signum = int(self.flag.signum or 0)
        self.close()
        self.release_signals()
        saved = (
            f"stop checkpoint at step {step}: {path}"
            if path is not None
            else f"stopped at step {step}, before training"
        )
        log.warning("signal %s: %s; stopping for requeue", signum, saved)
        if self.child:
            raise SystemExit(int(os.environ.get(JobEnv.REQUEUE_EXIT) or REQUEUE_EXIT_CODE))
        raise StopForRequeue(signum, step, tuple(self.flag.history))

    # -- the in-loop controller (runtime/adapt.py) ------------------------------------------
    def control(
        self,
        adapt: AdaptConf | Mapping[str, Any] | None,
        model: Any,
        optimizer: Any,
        scheduler: Any,
        total_steps: int,
        writer: bool,
    ) -> Controller | None:
        """Build the in-loop controller for this run when `adapt` (the `adapt` config group, or an
        AdaptConf) enables it — None when it does not; its records go to the task's adapt.jsonl."""
        conf = adapt if isinstance(adapt, AdaptConf) else adapt_conf(adapt)
        if not conf.enabled:
            return None
        from slurmagent.runtime.adapt import Controller

        controller = Controller(conf, model, optimizer, scheduler)
        if not controller.active:
            return None
        controller.bind(self.ctx.output_dir / TaskFile.ADAPT if writer else None, total_steps, self.ctx.attempt)
        self.controller = controller
        return controller

    def boundary(self, done: int, writer: bool) -> None:
        """At a step boundary, `done` steps done: the controller's proposal, if any rank has one, asked
        of the gate and applied on every rank (collectives in a multi-rank job, as in StepLoop)."""
        if self.controller is None:
            return
        if agree_stop(self.controller.propose(done) is not None):
            intervene(self.controller, self.ctx.approve, writer)
        self.controller.after_step(done)
