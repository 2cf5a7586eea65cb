"""PyTorch Lightning under slurmagent: one callback that gives a `Trainer` the job's stop
protocol, exact resume, metrics, search rungs and the in-loop controller (docs/trainers.md).

    from slurmagent.integrations.lightning import Slurmagent

    sa = Slurmagent(adapt=cfg.get("adapt"))     # adapt: optional, the in-loop controller's config
    trainer = pl.Trainer(max_epochs=cfg.epochs, callbacks=[sa])
    trainer.fit(model, datamodule=dm, ckpt_path=sa.resume_from)

What it does:
- **owns the stop signals.** Lightning's `SLURMEnvironment(auto_requeue=True)` saves inside its
  USR1 handler (mid-step) and calls `scontrol requeue` itself; its SIGTERM handler ends the fit
  without a checkpoint. Here a stop signal (the job's `recovery.signal`, USR1, USR2, SIGTERM) only
  sets a flag; at the next step boundary (every rank agreeing) the callback saves one checkpoint
  and ends the fit through the job's stop path — the job decides the requeue, through the gate.
  The environment's auto_requeue is switched off before the trainer registers its handlers, and
  ours are put back in front once training starts, so a signal is acted on once.
- **resumes exactly.** `resume_from` is the newest valid checkpoint of the task's earlier runs
  (the job's `$SLURMAGENT_RESUME_FROM` for a `task.command`, else the newest one in the task's
  checkpoint directory); Lightning restores model, optimizers, schedulers, loops and — for a
  stateful loader (torchdata's `StatefulDataLoader`) — the data position; this callback adds
  every rank's python, numpy and torch RNG states and the loaders' generators, put back just
  before the first resumed step. A fit started without it while a checkpoint exists is refused
  (it would train from scratch).
- **reports metrics.** What the module logs in `training_step` goes to the task's metrics.jsonl
  after each step, each validation's values as a line of their own, and every metric's newest
  value with `"epoch"` after each epoch: `status` shows the progress, `results` the columns,
  `report` the curves, a search reads its objective per epoch.
- **stops at a search rung.** A trial with `hpo.stop_at=E` ends after epoch E with a checkpoint;
  its promotion resumes from it and trains only the epochs past E.
- **lets the in-loop controller act** (`adapt=`, runtime/adapt.py): each step's loss and gradient
  norm are observed after the optimizer step (Lightning has zeroed nothing yet), each logged value
  is a report; an intervention (decay_lr, restart_schedule) is asked of the gate at the step
  boundary, and the controller's state is in every checkpoint.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback

from slurmagent.config import AdaptConf
from slurmagent.errors import ConfigError
from slurmagent.files import fsync_dir
from slurmagent.integrations._bridge import Bridge, floats, loader_generators, set_generators
from slurmagent.runtime.torch_state import rng_state, set_rng_state

log = logging.getLogger(__name__)

__all__ = ["Slurmagent"]

PREFIX = "lightning-step"  # our checkpoints: lightning-step<global step>.ckpt in the task's checkpoint dir
STATE_KEY = "slurmagent"  # our part of a Lightning checkpoint: every rank's RNG and loader-generator states


def _rng_plain() -> dict[str, Any]:
    """This rank's RNG states in types a `weights_only` load accepts (Lightning loads checkpoints
    so): numpy's key array as a list of ints."""
    state = rng_state()
    kind, keys, pos, has_gauss, cached = state["numpy"]
    state["numpy"] = (str(kind), [int(k) for k in keys], int(pos), int(has_gauss), float(cached))
    return state


def _when_loaders_made(trainer: pl.Trainer, apply: Any) -> None:
    """`apply(loaders)` to the fit's training loaders as soon as they exist: at once when they were
    given to `fit`, else when the datamodule's (or module's) `train_dataloader()` makes them."""
    source = getattr(getattr(trainer.fit_loop, "_data_source", None), "instance", None)
    if source is None:
        return
    if not isinstance(source, pl.LightningDataModule | pl.LightningModule):
        apply(source)
        return
    original = source.train_dataloader

    def made() -> Any:
        loaders = original()
        apply(loaders)
        del source.train_dataloader  # once: the instance's own method again
        return loaders

    source.train_dataloader = made  # type: ignore[method-assign]


def _loss(outputs: Any) -> Any:
    """The training step's loss from what `training_step` returned (a tensor or {"loss": …})."""
    return outputs.get("loss") if isinstance(outputs, dict) else outputs


class Slurmagent(Callback):
    """The callback (module docstring). `keep_last` checkpoints of its own are kept (default: the
    job's `checkpoint.keep_last`), older ones deleted through the gate; `adapt` is the in-loop
    controller's config (the `adapt` group, an AdaptConf, or None: off)."""

    def __init__(self, keep_last: int | None = None, adapt: AdaptConf | Any = None) -> None:
        self.bridge = Bridge(lambda path: path.suffix == ".ckpt", keep_last)
        self.checkpoint_dir = self.bridge.checkpoint_dir
        self.resume_from: str | None = self.bridge.find_resume()
        self.adapt = adapt
        self.saved: list[Path] = []  # checkpoints this run wrote, oldest first
        self._rng_to_load: dict[str, Any] | None = None  # this rank's saved RNG states, put back once
        self._adapt_to_load: dict[str, Any] | None = None  # the controller's saved state, loaded once it exists
        self._resume_at_epoch_end = False  # the checkpoint resumed from was taken at an epoch's end
        self._at_epoch_end = False  # the save in progress is at an epoch's end
        self._before_validation: dict[str, float] = {}
        self._validation_keys: set[str] = set()  # what validation logs: not part of a training step's line
        self._step_seen = -1  # the global step of the last optimizer step acted on (accumulation: one per step)

    # -- set-up --------------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        environment = getattr(getattr(trainer, "_accelerator_connector", None), "cluster_environment", None)
        # runs before the trainer registers its signal handlers (Trainer._run): with auto_requeue off it
        # installs neither its USR1 save-and-requeue nor its "bypass SIGTERM" handler
        if getattr(environment, "auto_requeue", False):
            environment.auto_requeue = False  # type: ignore[union-attr]  # ours requeues, never both
            log.info("Lightning's SLURMEnvironment auto_requeue switched off: slurmagent's stop path requeues")

    def on_sanity_check_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # the trainer has registered its handlers (its SIGTERM one would end the sanity check with
        # SIGTERMException, a SystemExit with no code): ours go in front before any step of it runs
        self.bridge.take_signals()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        given = trainer.ckpt_path  # what the fit restored from (known once it has)
        if self.resume_from is not None and (
            given is None or Path(given).resolve() != Path(self.resume_from).resolve()
        ):
            raise ConfigError(
                f"this task's earlier run saved {self.resume_from}, but trainer.fit was called with "
                f"ckpt_path={given!r}: pass ckpt_path=<the Slurmagent callback>.resume_from, or the run would "
                f"start again from scratch; nothing was trained"
            )
        # Lightning has just put its SIGTERM handler (it ends the fit without a checkpoint) in front of
        # ours: the stop signals are ours for the fit; its teardown puts back what was there before
        self.bridge.take_signals()
        if self.bridge.should_stop():  # a stop before the first step (while the job imported): nothing new to save
            self.bridge.stop(trainer.global_step, None)
        self.bridge.started(trainer.global_step)
        self._step_seen = trainer.global_step  # a batch that leaves it there has not stepped the optimizer
        if self.adapt is not None:
            schedulers = trainer.lr_scheduler_configs
            controller = self.bridge.control(
                self.adapt,
                pl_module,
                trainer.optimizers[0],
                schedulers[0].scheduler if schedulers else None,
                self._total(trainer) or 0,
                trainer.is_global_zero,
            )
            if controller is not None:
                controller.load_state_dict(self._adapt_to_load)
                controller.resumed(trainer.global_step)
        self._adapt_to_load = None

    @staticmethod
    def _total(trainer: pl.Trainer) -> int | None:
        total = trainer.max_steps if trainer.max_steps > 0 else trainer.estimated_stepping_batches
        return int(total) if total != float("inf") else None

    # -- every rank's RNG states, its loaders' generators and the controller, in the checkpoint ----
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        from slurmagent.runtime.loop import _distributed

        mine = {"rng": _rng_plain(), "generators": [g.get_state() for g in loader_generators(trainer.train_dataloader)]}
        dist = _distributed()
        everyone: list[Any] = [mine]
        if dist is not None:  # a collective: every rank saves (dump_checkpoint runs on each), rank 0 writes
            everyone = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, mine)
        ours: dict[str, Any] = {"ranks": everyone, "epoch_end": self._at_epoch_end}
        if self.bridge.controller is not None:
            ours["adapt"] = self.bridge.controller.state_dict()
        checkpoint[STATE_KEY] = ours

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        ours = checkpoint.get(STATE_KEY) or {}
        ranks = ours.get("ranks") or []
        rank, world = self.bridge.ctx.rank, self.bridge.ctx.world_size
        if len(ranks) != world:
            log.warning(
                "checkpoint holds the RNG states of %d ranks, this job has %d: randomness is not the "
                "uninterrupted run's",
                len(ranks),
                world,
            )
        self._rng_to_load = ranks[rank] if len(ranks) == world else (ranks[0] if ranks else None)
        self._resume_at_epoch_end = bool(ours.get("epoch_end"))
        self._adapt_to_load = ours.get("adapt")

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # a checkpoint from an epoch's end: Lightning starts the next epoch afresh (it does not load the
        # loaders' states of an ended epoch), so the RNGs and the loaders' generators go back before the
        # fit draws the next epoch's order and its iterator's base seed, as the saved run drew them next
        if self._rng_to_load is None or not self._resume_at_epoch_end:
            return
        saved = self._rng_to_load
        self._rng_to_load = None
        set_rng_state(saved["rng"])
        _when_loaders_made(trainer, lambda loaders: set_generators(loaders, saved.get("generators") or []))

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        # a checkpoint from the middle of an epoch: the RNGs go back just before the first resumed step,
        # so that what ran between the restore and it (the loader's new iterator) leaves no trace
        if self._rng_to_load is None:
            return
        set_rng_state(self._rng_to_load["rng"])
        set_generators(trainer.train_dataloader, self._rng_to_load.get("generators") or [])
        self._rng_to_load = None

    # -- metrics, progress, the controller ---------------------------------------------------
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._before_validation = floats(trainer.callback_metrics)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        now = floats(trainer.callback_metrics)
        logged = {k: v for k, v in now.items() if self._before_validation.get(k) != v or k in self._validation_keys}
        self._validation_keys |= set(logged)
        if logged:  # an evaluation: a line of its own (the controller's plateau reads it)
            self.bridge.metrics(trainer.global_step, logged, trainer.is_global_zero)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step, writer = trainer.global_step, trainer.is_global_zero
        if step == self._step_seen:  # a batch that only accumulated gradients: no optimizer step, no boundary
            return
        self._step_seen = step
        values = floats(trainer.callback_metrics, drop=self._validation_keys)
        if self.bridge.controller is not None:
            self.bridge.controller.observe(step, None, _loss(outputs))
        if values:
            self.bridge.metrics(step, values, writer)
        self.bridge.boundary(step, writer)  # before any save at this boundary: the checkpoint holds it
        self.bridge.progress(step, self._total(trainer), writer)
        last = batch_idx + 1 >= trainer.num_training_batches  # the epoch's end comes next: validation, then ours
        final = 0 < trainer.max_steps <= step  # the fit ends now: nothing to resume
        # `last` and `final` are the same on every rank: all agree, or none asks
        if not last and not final and self.bridge.should_stop():
            self._stop(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        epoch = trainer.current_epoch + 1  # epochs done
        step, writer = trainer.global_step, trainer.is_global_zero
        # the epoch's line: what was logged during it (its validation's values only if one ran in it),
        # with the trainer's epoch-level aggregates of training metrics
        self.bridge.epoch_line(step, epoch, writer, **floats(trainer.callback_metrics, drop=self._validation_keys))
        self.bridge.progress(step, self._total(trainer), writer, force=True)
        max_epochs = trainer.max_epochs if trainer.max_epochs is not None else -1
        final = 0 <= max_epochs <= epoch or 0 < trainer.max_steps <= step  # the fit ends now: nothing to resume
        rung = self.bridge.ctx.stop_at
        if rung and epoch >= rung:  # the rung ends this trial here, a stop signal or not: a requeue would train past it
            if not final and not trainer.should_stop:
                self.save(trainer, at_epoch_end=True)  # the rung: a promotion resumes from here
                log.info("search rung reached: stopped after epoch %d of %s, checkpointed", epoch, max_epochs)
            trainer.should_stop = True
        elif not final and self.bridge.should_stop():  # the same on every rank: all agree, or none asks
            self._stop(trainer, at_epoch_end=True)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.bridge.close()
        self.bridge.release_signals()  # after the trainer's own teardown put back what it found

    # -- the stop -----------------------------------------------------------------------------
    def save(self, trainer: pl.Trainer, at_epoch_end: bool = False) -> Path:
        """One checkpoint of the whole fit, durable when this returns (every rank calls it)."""
        self._at_epoch_end = at_epoch_end
        step = trainer.global_step
        path = self.checkpoint_dir / f"{PREFIX}{step:08d}.ckpt"
        tmp = path.with_name(f".{path.name}.partial")
        if trainer.is_global_zero:
            self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        trainer.save_checkpoint(tmp)  # a collective: every rank gathers, rank 0 writes
        if trainer.is_global_zero:
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, path)
            fsync_dir(self.checkpoint_dir)
            self.saved.append(path)
            ours = [(int(p.stem[len(PREFIX) :]), p) for p in self.checkpoint_dir.glob(f"{PREFIX}*.ckpt")]
            self.bridge.prune(ours, lambda old: old.unlink(missing_ok=True))
        trainer.strategy.barrier("slurmagent.save")
        log.info("checkpoint at step %d written in %.2f s: %s", step, time.monotonic() - started, path)
        return path

    def _stop(self, trainer: pl.Trainer, at_epoch_end: bool = False) -> None:
        path = self.save(trainer, at_epoch_end)
        self.bridge.close()
        self.bridge.stop(trainer.global_step, path)
