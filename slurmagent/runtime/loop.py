"""The step loop: restore, iterate, checkpoint every N steps, stop cleanly on a signal.

Signal handlers only set a flag (`StopFlag`); the checkpoint is written at the next step
boundary, never inside the handler. After the stop checkpoint the loop raises
`StopForRequeue`, which the job wrapper turns into a requeue (or, when Slurm is already
requeueing the job, a plain exit).
"""

from __future__ import annotations

import json
import logging
import os
import resource
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, Protocol

from slurmagent.config import CheckpointConf
from slurmagent.errors import SlurmAgentError
from slurmagent.primitives.checkpoint import CheckpointEntry, CheckpointManager, Pruner
from slurmagent.primitives.env import Progress, TaskFile
from slurmagent.primitives.signals import GraceFn, StopFlag, install_handlers, restore_handlers, signal_number
from slurmagent.runtime.context import Approval, Approver, JobContext
from slurmagent.runtime.health import HealthMonitor, monitor_for

if TYPE_CHECKING:
    import torch

    from slurmagent.runtime.adapt import Controller

log = logging.getLogger(__name__)


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class PerRank(Protocol):
    """What a state may add for a multi-rank job: the part that differs between ranks (RNG
    states, data-loader generators). Rank 0 gathers every rank's into the one checkpoint and
    each rank restores its own (`TorchState` has it)."""

    def rank_state(self) -> dict[str, Any]: ...

    def load_rank_state(self, state: dict[str, Any]) -> None: ...


StopReason = Literal["signal", "health"]


class StopForRequeue(SystemExit):
    """Raised by the loop after its stop checkpoint: the job should end now and run again
    from that checkpoint. `reason` says why: a stop `signal`, or the runtime `health` check
    found this node CRITICAL. The loop knows neither Slurm nor the gate: the job wrapper
    (`slurmagent.job.handle_stop`) decides what the stop means and requeues."""

    def __init__(self, signum: int, step: int, signals: tuple[int, ...] = (), reason: StopReason = "signal") -> None:
        self.signum = signum  # the first signal (0 for a health stop)
        self.step = step  # the step the next run resumes from (the checkpoint's step)
        self.signals = signals or ((signum,) if signum else ())  # every signal received, in order
        self.reason: StopReason = reason
        super().__init__(0)


def gpu_memory_peak_mb() -> float | None:
    """The most GPU memory torch's caching allocator has held on one of this process's devices
    since it started, MiB (the CUDA context, ~0.3-1 GiB, is not in it); None when the process
    has not used CUDA. Read, never initialised: a CPU job pays nothing."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    try:
        peak = max(torch.cuda.max_memory_reserved(d) for d in range(torch.cuda.device_count()))
    except (RuntimeError, ValueError):  # a device lost mid-run: the health path's business, not this one's
        return None
    return float(peak) / 2**20


def host_memory_peak_mb() -> float:
    """The most host memory this process has held since it started, plus the largest of its
    children that have ended (a `task.command`'s program, data-loader workers), MiB: the
    kernel's high-water marks (getrusage ru_maxrss), not samples — exact even for a run shorter
    than Slurm's JobAcctGatherFrequency, whose MaxRSS may then be a few MB. The sum is an upper
    bound of what they held at once."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return float(own + children) / 1024  # Linux: KiB


def write_progress(path: Path, body: dict[str, Any]) -> None:
    """progress.json, atomically (a temp file renamed over it), without fsync; errors ignored."""
    tmp = path.with_name(f".{TaskFile.PROGRESS}.{os.getpid()}")
    try:
        tmp.write_text(json.dumps(body))
        os.replace(tmp, path)
    except OSError:
        pass  # progress is a view, never a reason to stop training


def record_host_peak(output_dir: Path) -> None:
    """Put this process's host-memory peak (`host_memory_peak_mb`, its ended children's
    included) into the task's progress.json, keeping a larger one already there (a
    `task.command`'s own StepLoop writes its own): for the job history, which sizes
    `resources.mem=auto` from it."""
    path = output_dir / TaskFile.PROGRESS
    try:
        body = json.loads(path.read_text())
    except (OSError, ValueError):
        body = {}
    if not isinstance(body, dict):
        body = {}
    try:
        had = float(body.get(Progress.HOST_MEM_PEAK_MB) or 0.0)
    except (TypeError, ValueError):
        had = 0.0
    body[Progress.HOST_MEM_PEAK_MB] = round(max(had, host_memory_peak_mb()), 1)
    body.setdefault("time", time.time())
    write_progress(path, body)


def _distributed() -> Any:
    """torch.distributed when the training code initialised a process group of 2+ ranks."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    return dist


def agree(*local: bool) -> tuple[bool, ...]:
    """Every rank decides the same: each flag seen by any rank is true for all (one tiny
    all-reduce per step, only in a multi-rank job). The loop agrees on stopping, on a sick
    node and on a periodic save, so every rank takes part in each save's gather."""
    dist = _distributed()
    if dist is None:
        return local
    import torch

    flags = torch.tensor([1 if x else 0 for x in local], dtype=torch.int32)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return tuple(bool(x) for x in flags.tolist())


def agree_stop(local: bool) -> bool:
    return agree(local)[0]


def rest_seconds(done: int, start_step: int, end_step: int, elapsed_s: float, save_s: float) -> float | None:
    """Pure: how long the rest of a run takes, at its pace since it started (or resumed at
    `start_step`) — `end_step - done` steps, then its last checkpoint; None before a step."""
    if done <= start_step or elapsed_s <= 0:
        return None
    return max(0, end_step - done) * elapsed_s / (done - start_step) + save_s


def _from_rank0(value: bool) -> bool:
    """Rank 0's decision, on every rank."""
    dist = _distributed()
    if dist is None:
        return value
    import torch

    flag = torch.tensor([1 if value else 0], dtype=torch.int32)
    dist.broadcast(flag, src=0)
    return bool(flag.item())


def _rank0_object(value: Any) -> Any:
    """Rank 0's object (picklable), on every rank (a collective: all ranks call it)."""
    dist = _distributed()
    if dist is None:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def intervene(adapt: Controller, approve: Approver | None, writer: bool) -> None:
    """Some rank's controller wants an intervention at this boundary (a collective: every rank
    calls it): rank 0's proposal is asked of the gate (which runs the change when it allows it),
    every rank applies the answer. StepLoop and the trainer integrations call it alike."""
    proposal = _rank0_object(adapt.pending)
    approval: Approval | None = None
    if proposal is not None:
        if writer:
            approval = adapt.request(proposal, approve)
        granted = _from_rank0(approval is not None and approval.granted)
        if approval is None:  # another rank: rank 0 asked, and ran the change there
            result = adapt.apply(proposal) if granted else {}
            approval = Approval(granted, "allow" if granted else "not granted", "rank 0 asked the gate", result)
    adapt.settle(proposal, approval)


def _gather_rank_states(state: Any) -> list[dict[str, Any]] | None:
    """Every rank's own part (PerRank.rank_state), on rank 0 (a collective: all ranks call it)."""
    dist = _distributed()
    if dist is None or not hasattr(state, "rank_state"):
        return None
    mine = state.rank_state()
    everyone: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine, everyone, dst=0)
    return everyone


def _barrier() -> None:
    dist = _distributed()
    if dist is not None:
        dist.barrier()


class StepLoop:
    """`for step in loop:` yields the steps still to run, checkpointing as configured.

    On entry it restores the newest valid checkpoint into `state` (or starts fresh), so
    `loop.start_step` is where this attempt begins. `loop.report(**metrics)` records
    metrics; `loop.metrics` keeps the last ones. Checkpoint policy and health checks default
    to the job's own (`ctx.checkpoint`, `ctx.health`: the job spec's `checkpoint.*`, `health.*`).
    Inside a slurmagent job the stop signals are the job's (`ctx.signals`, owned since the job
    started); elsewhere the loop installs its own handlers while it runs.

    A trial of a hyperparameter search runs to a rung and stops there: give `steps_per_unit`
    (the steps of one fidelity unit, e.g. one epoch) and, when the job's `hpo.stop_at` is set
    (`ctx.stop_at`), the loop ends after `stop_at × steps_per_unit` steps with a checkpoint, so
    that a promotion resumes from it exactly; the schedule still spans `total_steps`.

    `adapt` (a `runtime.adapt.Controller`) reacts inside the loop to exploding gradients and
    to a plateau of a metric: `loop.observe(loss=…)` after backward gives it each step's
    gradient norm, `loop.report()` its metrics; it acts at step boundaries, through the gate
    (`ctx.approve`), and its state is in every checkpoint.
    """

    def __init__(
        self,
        ctx: JobContext,
        state: Stateful,
        total_steps: int,
        conf: CheckpointConf | None = None,
        stop_signals: tuple[str, ...] = ("USR2", "TERM"),
        clock: Callable[[], float] = time.monotonic,
        install_signal_handlers: bool = True,
        is_writer: bool | None = None,
        grace: GraceFn | None = None,
        health: HealthMonitor | None = None,
        steps_per_unit: int | None = None,
        adapt: Controller | None = None,
    ) -> None:
        self.ctx = ctx
        self.state = state
        self.total_steps = total_steps
        # where this run ends: a trial's rung (hpo.stop_at units), else the whole schedule
        rung = ctx.stop_at * steps_per_unit if ctx.stop_at and steps_per_unit else total_steps
        self.end_step = min(total_steps, rung)
        self.conf = conf or ctx.checkpoint
        self.manager = CheckpointManager(
            ctx.checkpoint_dir, keep_last=self.conf.keep_last, prune=keep_last_pruner(ctx.approve, self.conf.keep_last)
        )
        self._owned = ctx.signals is not None  # the job wrapper owns the signals and the flag
        self.flag = ctx.signals.flag if ctx.signals is not None else StopFlag()
        self._clock = clock
        self._signals = [signal_number(s) for s in stop_signals] + [signal.SIGCONT]
        self._install = install_signal_handlers
        self.is_writer = ctx.rank == 0 if is_writer is None else is_writer
        self.metrics: dict[str, float] = {}
        self.start_step = 0
        self.restored_from: int | None = None
        self._last_save = clock()
        self.step = 0
        self._metrics_file: IO[str] | None = None
        self._run_started = time.monotonic()
        self._progress_at = 0.0
        self._grace = grace if grace is not None else (ctx.signals.grace if ctx.signals is not None else None)
        self._finish = ctx.signals.finish if ctx.signals is not None else None  # job/stop.py's FinishCheck
        self.last_saved_step: int | None = None
        self.stop_note = ""  # what the stop did about its checkpoint, for logs and tests
        self._gather_s = 0.0  # time the last save took to gather the state (state_dict)
        # -- runtime health (slurmagent/runtime/health.py): None unless configured --
        self.health = health if health is not None else monitor_for(ctx)
        # -- in-loop adaptation (slurmagent/runtime/adapt.py): None unless given and enabled --
        self.adapt = adapt if adapt is not None and adapt.active else None

    def restore(self) -> int:
        found = self.manager.latest()
        if found is None:
            self.start_step = 0
            return 0
        entry, payload = found
        self.state.load_state_dict(payload["state"])
        ranks = payload.get("ranks")
        if ranks is not None and hasattr(self.state, "load_rank_state"):
            if len(ranks) == self.ctx.world_size:
                self.state.load_rank_state(ranks[self.ctx.rank])  # this rank's own RNG and data order
            else:
                log.warning(
                    "checkpoint at step %d holds %d ranks' states, this job has %d ranks: each rank restores "
                    "rank 0's shared state only, so randomness is not exactly the uninterrupted run's",
                    entry.step,
                    len(ranks),
                    self.ctx.world_size,
                )
        self.metrics = dict(payload.get("metrics", {}))
        if self.adapt is not None:
            self.adapt.load_state_dict(payload.get("adapt"))
        self.start_step = self.restored_from = entry.step
        log.info("resumed from checkpoint at step %d (%s)", entry.step, entry.file)
        return entry.step

    # -- checkpoint saves (background periodic saves: see CheckpointManager.save_background) --
    background_saves = True  # periodic saves block only for a snapshot; set False for synchronous ones

    def save(self, step: int, background: bool = False) -> None:
        """Checkpoint after `step` steps. background=True (periodic saves): returns after a
        snapshot, the write runs in a thread. Otherwise the write (and any earlier background
        one) is durable when this returns: stop-for-requeue and final saves."""
        ranks = _gather_rank_states(self.state)  # every rank takes part; rank 0 receives
        if self.is_writer:
            started = time.monotonic()
            payload = {"state": self.state.state_dict(), "metrics": self.metrics, "step": step}
            if self.adapt is not None:
                payload["adapt"] = self.adapt.state_dict()
            if ranks is not None:
                payload["ranks"] = ranks
            self._gather_s = time.monotonic() - started
            if background and self.background_saves:
                self.manager.save_background(step, payload)
            else:
                self.manager.save(step, payload)
        self.last_saved_step = step
        self._last_save = self._clock()

    @property
    def last_save_seconds(self) -> float:
        """Duration of the last completed save, start to durable file (0.0 before the first)."""
        return self.manager.last_save_s

    @property
    def save_cost_estimate(self) -> float:
        """What a synchronous save costs now, from the last one: gathering the state plus
        writing it durably (0.0 before the first save)."""
        return self._gather_s + self.manager.last_save_s if self.manager.last_save_s else 0.0

    # -- end of checkpoint saves --

    def _stop_save(self, done: int) -> int:
        """The checkpoint at a stop: written when it fits the grace window left after the
        signal, else skipped in favour of the newest periodic one (said in the log).
        Returns the step the next attempt resumes from."""
        signum = int(self.flag.signum or 0)
        grace = self._grace(signum) if (self._grace is not None and signum) else None
        elapsed = time.monotonic() - self.flag.received_at if self.flag.received_at is not None else 0.0
        cost = self.save_cost_estimate  # a background write's time counts in full: conservative
        # rank 0 writes, so rank 0 decides whether the stop checkpoint fits; every rank follows
        if _from_rank0(self.is_writer and grace is not None and cost > 0 and elapsed + cost > grace):
            fallback = self.last_saved_step if self.last_saved_step is not None else self.restored_from
            left = max(0.0, (grace or 0.0) - elapsed)
            self.stop_note = (
                f"stop checkpoint skipped: it takes about {cost:.1f} s and {left:.1f} s of the "
                f"{grace or 0:.0f} s grace window are left; the next attempt resumes from the periodic checkpoint at "
                f"step {fallback or 0} and redoes {done - (fallback or 0)} steps"
            )
            log.warning("%s", self.stop_note)
            self.manager.wait(raise_errors=False)  # a periodic write in flight still lands
            _barrier()
            return fallback or 0
        self.save(done)
        self.stop_note = f"stop checkpoint at step {done} written in {self.last_save_seconds:.2f} s"
        _barrier()  # no rank leaves before rank 0's checkpoint is on disk
        return done

    def _finishes_first(self, done: int, resume_at: int) -> bool:
        """At a stop, after its checkpoint: may the run finish instead? The job wrapper's
        `finish` says, from Slurm's view of the job (job/stop.py `FinishCheck`); never once any
        rank got a SIGTERM, nor when the stop checkpoint was skipped for lack of time. Rank 0
        asks, every rank follows. A signal that lands while it asks stays on the flag."""
        seen = len(self.flag.history)
        (ending,) = agree(signal.SIGTERM in self.flag.history)  # on every rank: a collective
        ask = None
        if self.is_writer and self._finish is not None and not ending and resume_at == done and self.flag.history:
            elapsed = time.monotonic() - self._run_started
            rest_s = rest_seconds(done, self.start_step, self.end_step, elapsed, self.save_cost_estimate)
            try:
                ask = self._finish(tuple(self.flag.history), rest_s) if rest_s is not None else None
            except Exception as exc:  # the stop must not fail (or hang the other ranks) on the question
                log.warning("could not ask whether the run may finish before the limit: %s", exc)
        if not _from_rank0(ask is not None):
            return False
        self.stop_note += f"; {ask}" if ask else "; finishing (rank 0's decision)"
        self.flag.clear(since=seen)
        return True

    def report(self, **metrics: float) -> None:
        """Record metrics for this step: kept in `loop.metrics` and in checkpoints, and
        appended (rank 0) to `<output dir>/metrics.jsonl` as {"step": …, name: value}."""
        values = {k: float(v) for k, v in metrics.items()}
        self.metrics.update(values)
        if self.adapt is not None:
            self.adapt.evaluate(self.step, values)
        if self.is_writer:
            if self._metrics_file is None:
                self.ctx.output_dir.mkdir(parents=True, exist_ok=True)
                self._metrics_file = open(self.ctx.output_dir / TaskFile.METRICS, "a", buffering=1)  # noqa: SIM115 - closed at loop end
            self._metrics_file.write(json.dumps({"step": self.step, **values}) + "\n")
            self._progress()

    def observe(
        self, grad_norm: float | torch.Tensor | None = None, loss: float | torch.Tensor | None = None
    ) -> float | None:
        """After backward, before the optimiser's step: this step's gradient norm (computed from
        the model's gradients when not given, e.g. pass clip_grad_norm_'s) and loss, for the
        in-loop controller. Returns the norm (None without a controller: nothing is computed)."""
        if self.adapt is None:
            return None
        return self.adapt.observe(self.step, grad_norm, loss)

    PROGRESS_EVERY_S = 1.0  # progress.json is rewritten at most this often

    def _progress(self, force: bool = False) -> None:
        """`<output dir>/progress.json`: where this run is (step of total, the latest metrics,
        steps per second since it started or resumed), for `slurmagent status`; and what the
        job history sizes the next run from (`env.Progress`: host- and GPU-memory peaks, the
        checkpoint save's time). Best effort: written without fsync, at most once a second."""
        now = time.monotonic()
        if not force and now - self._progress_at < self.PROGRESS_EVERY_S:
            return
        self._progress_at = now
        done = self.step + 1 if not force else self.step
        elapsed = now - self._run_started
        rate = (done - self.start_step) / elapsed if elapsed > 0 and done > self.start_step else None
        body: dict[str, Any] = {
            "step": done,
            "total_steps": self.end_step,
            "start_step": self.start_step,
            Progress.STEPS_PER_S: rate,
            "metrics": self.metrics,
            "time": time.time(),
            "attempt": self.ctx.attempt,
            Progress.HOST_MEM_PEAK_MB: round(host_memory_peak_mb(), 1),
        }
        peak = gpu_memory_peak_mb()
        if peak is not None:
            body[Progress.GPU_MEM_PEAK_MB] = round(peak, 1)
        if self.save_cost_estimate > 0:
            body[Progress.CHECKPOINT_S] = round(self.save_cost_estimate, 3)
        write_progress(self.ctx.output_dir / TaskFile.PROGRESS, body)

    def _due(self, done: int) -> bool:
        if self.conf.every_steps and done % self.conf.every_steps == 0:
            return True
        return bool(self.conf.every_seconds and self._clock() - self._last_save >= self.conf.every_seconds)

    def __iter__(self) -> Iterator[int]:
        previous = install_handlers(self.flag, self._signals) if self._install and not self._owned else {}
        periodic = 0 < self.conf.every_steps < self.total_steps or self.conf.every_seconds
        try:
            self.restore()
            if self.adapt is not None:
                records = self.ctx.output_dir / TaskFile.ADAPT if self.is_writer else None
                self.adapt.bind(records, self.total_steps, self.ctx.attempt)
                self.adapt.resumed(self.start_step)
            self._run_started = time.monotonic()
            if self.is_writer and self.background_saves and periodic:
                self.manager.prepare(self.state.state_dict())  # snapshot memory, allocated in the background
            if agree_stop(self.flag.set):  # stopped before the first step: nothing new to save
                raise StopForRequeue(int(self.flag.signum or 0), self.start_step, tuple(self.flag.history))
            for step in range(self.start_step, self.end_step):
                self.step = step
                yield step
                done = step + 1
                wants = self.adapt is not None and self.adapt.propose(done) is not None
                sick = self.health is not None and self.health.check(done)  # runtime health (health_stop.json)
                due = done < self.end_step and self._due(done)
                stop, sick, due, wants = agree(self.flag.set, sick, due, wants)
                if wants:  # before any save at this boundary: the checkpoint holds the intervention
                    assert self.adapt is not None
                    intervene(self.adapt, self.ctx.approve, self.is_writer)
                if self.adapt is not None:
                    self.adapt.after_step(done)
                if sick:  # a rank's node is CRITICAL: every rank checkpoints and stops for requeue
                    self.save(done)
                    _barrier()
                    raise StopForRequeue(0, done, tuple(self.flag.history), reason="health")
                if stop:
                    resume_at = self._stop_save(done)
                    if self._finishes_first(done, resume_at):  # the time limit's warning, seconds of work left
                        log.warning("%s", self.stop_note)
                        continue
                    log.warning("signal %s: %s; stopping for requeue", self.flag.signum, self.stop_note)
                    raise StopForRequeue(int(self.flag.signum or 0), resume_at, tuple(self.flag.history))
                if due:
                    self.save(done, background=True)
            self.step = max(self.end_step, self.start_step)
            if (self.end_step > self.start_step or self.restored_from is None) and self.last_saved_step != self.step:
                self.save(self.step)  # the end of the schedule, or the rung a promotion resumes from
            if self.is_writer and self._metrics_file is not None:
                self._progress(force=True)
        finally:
            self.manager.wait(raise_errors=False)  # leaving early: let a background write finish
            restore_handlers(previous)
            if self._metrics_file is not None:
                self._metrics_file.close()
                self._metrics_file = None


KEEP_LAST_SOURCE = "checkpoint:keep_last"  # who asks the gate to delete an old checkpoint (the policy's source_in)


def keep_last_pruner(approve: Approver | None, keep_last: int) -> Pruner | None:
    """Old checkpoints (beyond checkpoint.keep_last) are deleted through the gate: each one a
    delete_checkpoint action, source checkpoint:keep_last, decided by the sweep's policy and
    kill switch and recorded in its audit log, the deletion its executor. Not allowed (or the
    gate unreachable): the file stays, listed in the manifest. None outside a job: no gate."""
    if approve is None:
        return None

    def prune(entry: CheckpointEntry, delete: Callable[[], None]) -> bool:
        def run() -> dict[str, Any]:
            delete()
            return {"deleted": entry.file, "step": entry.step, "bytes": entry.bytes}

        try:
            return approve(
                "delete_checkpoint",
                f"checkpoint.keep_last={keep_last}: step {entry.step} is older than the newest {keep_last}",
                {"trigger": "keep_last", "file": entry.file, "step": entry.step},
                {"file": entry.file, "keep_last": keep_last},
                run,
                source=KEEP_LAST_SOURCE,
            ).granted
        except (SlurmAgentError, OSError) as exc:  # e.g. an audit log that cannot be written: nothing deleted
            log.warning("checkpoint %s kept: could not ask the gate to delete it: %s", entry.file, exc)
            return False

    return prune
