"""Hugging Face under slurmagent (docs/trainers.md): a `TrainerCallback` for the `Trainer`, and a
helper for a training loop of one's own written with Accelerate. Each gives the job's stop
protocol, exact resume, metrics, search rungs and the in-loop controller.

The Trainer:

    from slurmagent.integrations.hf import Slurmagent

    sa = Slurmagent()
    args = TrainingArguments(output_dir=sa.output_dir, num_train_epochs=cfg.epochs, ...)
    trainer = Trainer(model=model, args=args, train_dataset=..., callbacks=[sa])
    trainer.train(resume_from_checkpoint=sa.resume_from)

- **stop → save → requeue.** A stop signal only sets a flag; at the next step boundary the callback
  asks the Trainer for a checkpoint (`checkpoint-N/` in `output_dir`, the task's checkpoint
  directory) and, once it is written and synced, ends the run through the job's stop path. A
  stop during an epoch's last step waits for the epoch's end, so its evaluation runs first.
- **exact resume.** `resume_from` is the newest valid `checkpoint-N` of the task's earlier runs;
  the Trainer restores model, optimizer, scheduler, RNG states and skips the batches it has seen.
- **metrics.** What the Trainer logs (`on_log`: loss, learning_rate, grad_norm) and each
  evaluation's metrics are lines of the task's metrics.jsonl; each epoch's end is a line with
  `"epoch"` holding every metric's newest value.
- **search rungs.** A trial with `hpo.stop_at=E` ends after epoch E with a checkpoint (its
  evaluation done) that its promotion resumes from.
- **the in-loop controller** (`adapt=`, runtime/adapt.py) observes each optimizer step's gradient
  norm — after the Trainer's clipping (`max_grad_norm`, 1.0 by default: set 0 for the explosion
  reaction to see unclipped norms; a non-finite one is seen either way) — and each log and
  evaluation as a report; interventions go through the gate at the step boundary.
- Old `checkpoint-N` folders beyond `checkpoint.keep_last` are deleted through the gate; leave
  the Trainer's own `save_total_limit` unset (its deletions ask no one).

Accelerate, a loop of one's own:

    from slurmagent.integrations.hf import AcceleratedRun

    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    run = AcceleratedRun(accelerator, steps_per_epoch=len(loader))
    run.resume()                                  # the newest checkpoint's state, if there is one
    for epoch in run.epochs(cfg.epochs):          # from the epoch the run stopped in
        for batch in run.batches(loader):         # the resumed epoch: its batches not yet seen
            optimizer.zero_grad(); loss = ...; accelerator.backward(loss); optimizer.step(); scheduler.step()
            run.step(loss=loss.item())            # metrics; at a stop: saves, ends for a requeue
        run.epoch_end(val_loss=evaluate(model))   # the epoch's line; at a search rung: saved, ends

`accelerator.save_state`/`load_state` carry model, optimizer, scheduler and RNG states; the
helper adds the step, the epoch and the RNG states the epoch's data order was drawn from, so a
resumed epoch sees the same order with its first batches skipped (`skip_first_batches`).
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from slurmagent.config import AdaptConf
from slurmagent.errors import ConfigError
from slurmagent.integrations._bridge import Bridge, durable, floats, loader_generators, set_generators
from slurmagent.runtime.torch_state import rng_state, set_rng_state

log = logging.getLogger(__name__)

__all__ = ["AcceleratedRun", "Slurmagent"]

HF_PREFIX = "checkpoint-"  # the Trainer's checkpoint folders: checkpoint-<global step>
STATE_FILE = "slurmagent.pt"  # our part of a checkpoint folder: the controller; AcceleratedRun's RNG at epoch start
MARK_FILE = "slurmagent.json"  # AcceleratedRun's folder is complete once this is written: {"step", "epoch"}
ACC_PREFIX = "accelerate-step"  # AcceleratedRun's checkpoint folders: accelerate-step<global step, 8 digits>
NOT_METRICS = ("epoch", "total_flos")  # the Trainer's log keys that are not a metric's value
_END = object()  # an iterator's end, told from any batch


def _step_of(folder: Path, prefix: str) -> int | None:
    tail = folder.name[len(prefix) :]
    return int(tail) if folder.name.startswith(prefix) and tail.isdigit() else None


def _ours(directory: Path, prefix: str) -> list[tuple[int, Path]]:
    found = [(_step_of(p, prefix), p) for p in directory.glob(f"{prefix}*") if p.is_dir()] if directory.is_dir() else []
    return [(step, p) for step, p in found if step is not None]


def _output_dir(args: TrainingArguments) -> Path:
    """Where the Trainer saves (TrainingArguments sets "trainer_output" when none was given)."""
    return Path(args.output_dir or "trainer_output")


def _barrier() -> None:
    from slurmagent.runtime.loop import _barrier as barrier

    barrier()


class Slurmagent(TrainerCallback):
    """The Trainer's callback (module docstring). `keep_last` checkpoints are kept (default: the
    job's `checkpoint.keep_last`); `adapt` is the in-loop controller's config (or None: off)."""

    def __init__(self, keep_last: int | None = None, adapt: AdaptConf | Any = None) -> None:
        self.bridge = Bridge(lambda path: path.is_dir() and _step_of(path, HF_PREFIX) is not None, keep_last)
        self.output_dir = str(self.bridge.checkpoint_dir)  # TrainingArguments(output_dir=…): the task's own
        self.adapt = adapt
        self._resume_from: str | None = None
        self._looked = False
        self._stopping = False
        self._epoch_line: int | None = None  # an ended epoch whose line waits for its evaluation
        self._args: TrainingArguments | None = None

    @property
    def resume_from(self) -> str | None:
        """The newest valid `checkpoint-N` of this task's earlier runs in the Trainer's output_dir
        (the task's checkpoint directory until the Trainer is built), or None: a first run."""
        if not self._looked:
            where = _output_dir(self._args) if self._args is not None else None
            self._resume_from = self.bridge.find_resume(where)
            self._looked = True
        return self._resume_from

    def on_init_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self._args = args
        out, ctx = _output_dir(args).resolve(), self.bridge.ctx
        own = out == self.bridge.checkpoint_dir.resolve() or out.is_relative_to(ctx.output_dir.resolve())
        if not own and ctx.where.launched:  # in a job: a directory other tasks may share
            raise ConfigError(
                f"TrainingArguments(output_dir={args.output_dir!r}) is outside this task's directory "
                f"{ctx.output_dir}: the tasks of a sweep would resume from each other's checkpoints; pass "
                f"output_dir=<the Slurmagent callback>.output_dir ({self.bridge.checkpoint_dir}); nothing was trained"
            )
        if not own:
            log.warning(
                "TrainingArguments(output_dir=%r) is not this run's checkpoint directory %s: runs that share it "
                "resume from each other's checkpoints; pass output_dir=<the callback>.output_dir",
                args.output_dir,
                self.bridge.checkpoint_dir,
            )
        if args.save_total_limit:
            log.warning(
                "save_total_limit=%s: the Trainer deletes old checkpoints itself, asking no one; "
                "checkpoint.keep_last deletes them through the gate",
                args.save_total_limit,
            )

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        resume = self.resume_from
        saved = _step_of(Path(resume), HF_PREFIX) if resume is not None else None
        if saved is not None and state.global_step != saved:
            raise ConfigError(
                f"this task's earlier run saved {resume}, but trainer.train started at step {state.global_step}: "
                f"pass resume_from_checkpoint=<the Slurmagent callback>.resume_from, or the run would start again "
                f"from scratch; nothing was trained"
            )
        self.bridge.take_signals()
        if self.bridge.should_stop():  # a stop before the first step (while the job imported): nothing new to save
            self._end()
            self.bridge.stop(state.global_step, None)
        self.bridge.started(state.global_step)
        if self.adapt is not None:
            controller = self.bridge.control(
                self.adapt,
                kw["model"],
                kw["optimizer"],
                kw.get("lr_scheduler"),
                state.max_steps,
                state.is_world_process_zero,
            )
            if controller is not None:
                if resume is not None and (Path(resume) / STATE_FILE).exists():
                    controller.load_state_dict(torch.load(Path(resume) / STATE_FILE, weights_only=False).get("adapt"))
                controller.resumed(state.global_step)

    def on_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if self.bridge.controller is not None:  # the gradients are still there (zeroed after the scheduler's step)
            self.bridge.controller.observe(state.global_step, None, None)

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self._flush_epoch_line(state)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        writer = state.is_world_process_zero
        self.bridge.boundary(state.global_step, writer)
        self.bridge.progress(state.global_step, state.max_steps or None, writer)
        epoch_end = state.epoch is not None and float(state.epoch).is_integer()  # the epoch's end comes next
        final = state.global_step >= state.max_steps  # the run ends now: nothing to resume
        if not epoch_end and not final and self.bridge.should_stop():  # the same on every rank: all agree, or none
            self._stop_here(control)

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        if self._stopping or state.epoch is None or not float(state.epoch).is_integer():
            return  # a stop ended this epoch early: it has no line
        epoch = round(state.epoch)
        self._epoch_line = epoch  # written after the epoch's evaluation, if one follows (on_evaluate)
        final = state.global_step >= state.max_steps  # the run ends now: nothing to resume
        rung = self.bridge.ctx.stop_at
        if rung and epoch >= rung:  # the rung ends this trial here, a stop signal or not: a requeue would train past it
            if not final and not control.should_training_stop:
                control.should_save = True  # the rung: a promotion resumes from here
                log.info(
                    "search rung reached: stopped after epoch %d of %s, checkpointed", epoch, args.num_train_epochs
                )
            control.should_training_stop = True
        elif not final and self.bridge.should_stop():  # the same on every rank: all agree, or none asks
            self._stop_here(control)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: Mapping[str, Any] | None = None,
        **kw: Any,
    ) -> None:
        values = floats(logs or {}, drop=NOT_METRICS)
        if values:
            self.bridge.metrics(state.global_step, values, state.is_world_process_zero)

    def on_evaluate(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        metrics: Mapping[str, Any] | None = None,
        **kw: Any,
    ) -> None:
        values = floats(metrics or {}, drop=NOT_METRICS)
        if values:
            self.bridge.metrics(state.global_step, values, state.is_world_process_zero)
        self._flush_epoch_line(state)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self._flush_epoch_line(state)
        path = _output_dir(args) / f"{HF_PREFIX}{state.global_step}"
        if args.should_save:
            if self.bridge.controller is not None:
                torch.save({"adapt": self.bridge.controller.state_dict()}, path / STATE_FILE)
            durable(path)
            self.bridge.prune(_ours(_output_dir(args), HF_PREFIX), lambda old: shutil.rmtree(old, ignore_errors=True))
        _barrier()  # no rank leaves before rank 0's checkpoint is on disk
        if self._stopping:
            self._end()
            self.bridge.stop(state.global_step, path)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self._flush_epoch_line(state)
        self.bridge.progress(state.global_step, state.max_steps or None, state.is_world_process_zero, force=True)
        self._end()

    def _stop_here(self, control: TrainerControl) -> None:
        self._stopping = True
        control.should_save = True  # the Trainer saves at this boundary, then on_save ends the run
        control.should_training_stop = True

    def _flush_epoch_line(self, state: TrainerState) -> None:
        if self._epoch_line is not None:
            self.bridge.epoch_line(state.global_step, self._epoch_line, state.is_world_process_zero)
            self._epoch_line = None

    def _end(self) -> None:
        self.bridge.release_signals()
        self.bridge.close()


class AcceleratedRun:
    """A training loop of one's own under Accelerate (module docstring). `steps_per_epoch`: the
    prepared training loader's length (optimizer steps per epoch: one batch a step)."""

    def __init__(
        self, accelerator: Any, steps_per_epoch: int, keep_last: int | None = None, adapt: AdaptConf | Any = None
    ) -> None:
        if steps_per_epoch <= 0:
            raise ConfigError(f"AcceleratedRun: steps_per_epoch must be > 0, got {steps_per_epoch}")
        self.accelerator = accelerator
        self.steps_per_epoch = steps_per_epoch
        self.bridge = Bridge(
            lambda path: path.name == MARK_FILE and _step_of(path.parent, ACC_PREFIX) is not None, keep_last
        )
        self.bridge.take_signals()
        self.checkpoint_dir = self.bridge.checkpoint_dir
        self.resume_from = self.bridge.find_resume()  # the marker file of the newest complete folder
        self.adapt = adapt
        self.step_count = 0  # optimizer steps done
        self.epoch = 0  # the epoch in progress
        self._epoch_rng: dict[str, Any] | None = (
            None  # the RNG and loader-generator states this epoch's order came from
        )
        self._resumed = False
        self._total_epochs = 0  # what epochs() was asked for
        self._generators_at_save: list[Any] = []  # the loader's generators when the resumed checkpoint was saved
        self._loader: Any = None  # the loader of the epoch in progress

    @property
    def writer(self) -> bool:
        return bool(self.accelerator.is_main_process)

    def resume(self, model: Any = None, optimizer: Any = None, scheduler: Any = None) -> int:
        """Load the newest checkpoint of this task's earlier runs, if any (every prepared object,
        the RNG states, our counters); returns the step to go on from (0: a first run). Give the
        model, optimizer and scheduler to have the in-loop controller (`adapt=`) built on them."""
        saved: dict[str, Any] = {}
        if self.resume_from is not None:
            folder = Path(self.resume_from).parent
            self.accelerator.load_state(str(folder))
            mark = json.loads((folder / MARK_FILE).read_text())
            saved = torch.load(folder / STATE_FILE, weights_only=False)
            self.step_count, self.epoch = int(mark["step"]), int(mark["epoch"])
            self._epoch_rng = saved["epoch_rng"][self.bridge.ctx.rank]
            self._generators_at_save = saved["generators"][self.bridge.ctx.rank]
            self._resumed = True
            log.info("resumed from %s: step %d, epoch %d", folder, self.step_count, self.epoch + 1)
        if self.adapt is not None and model is not None and optimizer is not None:
            # the controller acts on the objects Accelerate wraps (its optimizer and scheduler proxies)
            optimizer = getattr(optimizer, "optimizer", optimizer)
            scheduler = getattr(scheduler, "scheduler", scheduler)
            controller = self.bridge.control(self.adapt, model, optimizer, scheduler, 0, self.writer)
            if controller is not None:
                controller.load_state_dict(saved.get("adapt"))
                controller.resumed(self.step_count)
        if self.bridge.should_stop():  # a stop before the first step (while the job imported): nothing new to save
            self.bridge.stop(self.step_count, None)
        self.bridge.started(self.step_count)
        return self.step_count

    def epochs(self, total: int) -> Iterator[int]:
        """The epochs left to train, from the one the run stopped in; at a search rung it ends there."""
        self._total_epochs = total
        try:
            while self.epoch < total:
                yield self.epoch
                self.epoch += 1
                rung = self.bridge.ctx.stop_at
                if rung and self.epoch >= rung:
                    if self.epoch < total:
                        self._save()  # the rung: a promotion resumes from here
                        log.info("search rung reached: stopped after epoch %d of %d, checkpointed", self.epoch, total)
                    return
        finally:
            self.bridge.close()
            self.bridge.release_signals()  # training is over: the stop signals mean again what they meant

    def batches(self, loader: Any) -> Iterator[Any]:
        """This epoch's batches. The epoch's data order is drawn with the RNG states saved for it, so a
        resumed epoch sees the same order, the batches it saw before skipped."""
        self._loader = loader
        done = self.step_count - self.epoch * self.steps_per_epoch
        if self._resumed and done > 0 and self._epoch_rng is not None:
            at_stop = rng_state()  # the states at the stop: the next step's dropout draws from them
            set_rng_state(self._epoch_rng["rng"])
            set_generators(loader, self._epoch_rng["generators"])
            iterator = iter(self.accelerator.skip_first_batches(loader, done))
            # the order (and the loader's base seed) is drawn at the first fetch, not at iter(): fetch now
            first = next(iterator, _END)
            set_rng_state(at_stop)
            if first is not _END:
                yield first
        else:
            if self._resumed:  # at an epoch's start: the loader's generators as the saved run left them
                set_generators(loader, self._generators_at_save)
            self._epoch_rng = {"rng": rng_state(), "generators": [g.get_state() for g in loader_generators(loader)]}
            iterator = iter(loader)
        self._resumed = False
        yield from iterator

    def step(self, **metrics: float) -> None:
        """One optimizer step done: its metrics; at a stop signal the state is saved and the run ends
        for a requeue (a collective in a multi-rank job: every rank calls it). Call it before the next
        `zero_grad()`: the in-loop controller reads this step's gradients."""
        self.step_count += 1
        if self.bridge.controller is not None:
            self.bridge.controller.observe(self.step_count, None, metrics.get("loss"))
        if metrics:
            self.bridge.metrics(self.step_count, floats(metrics), self.writer)
        self.bridge.boundary(self.step_count, self.writer)
        self.bridge.progress(self.step_count, None, self.writer)
        epoch_end = self.step_count % self.steps_per_epoch == 0
        if not epoch_end and self.bridge.should_stop():
            self.bridge.stop(self.step_count, self._save())

    def epoch_end(self, **metrics: float) -> None:
        """The epoch's end: its evaluation's metrics, and the epoch's line (the newest value of each metric
        logged during it). A stop signal here ends the run for a requeue, unless the run or its search rung
        ends with this epoch anyway (`epochs()` then saves the rung's checkpoint)."""
        values = floats(metrics)
        if values:
            self.bridge.metrics(self.step_count, values, self.writer)
        self.bridge.epoch_line(self.step_count, self.epoch + 1, self.writer)
        self.bridge.progress(self.step_count, None, self.writer, force=True)
        done = self.epoch + 1
        rung = self.bridge.ctx.stop_at
        if 0 < self._total_epochs <= done or (rung and done >= rung):  # the same on every rank
            return
        if self.bridge.should_stop():
            self.epoch += 1  # this epoch is done: the next run starts the next one
            path = self._save()
            self.bridge.stop(self.step_count, path)

    def _save(self) -> Path:
        folder = self.checkpoint_dir / f"{ACC_PREFIX}{self.step_count:08d}"
        self.accelerator.save_state(str(folder))  # model, optimizers, schedulers, RNG states (every rank's)
        from slurmagent.runtime.loop import _distributed

        mine = (
            self._epoch_rng,
            [g.get_state() for g in loader_generators(self._loader)] if self._loader is not None else [],
        )
        everyone: list[Any] = [mine]
        dist = _distributed()
        if dist is not None:
            everyone = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, mine)
        if self.writer:
            state: dict[str, Any] = {"epoch_rng": [e for e, _ in everyone], "generators": [g for _, g in everyone]}
            if self.bridge.controller is not None:
                state["adapt"] = self.bridge.controller.state_dict()
            torch.save(state, folder / STATE_FILE)
            (folder / MARK_FILE).write_text(json.dumps({"step": self.step_count, "epoch": self.epoch}))
            durable(folder)
            self.bridge.prune(
                _ours(self.checkpoint_dir, ACC_PREFIX), lambda old: shutil.rmtree(old, ignore_errors=True)
            )
        _barrier()
        log.info("checkpoint at step %d: %s", self.step_count, folder)
        return folder
