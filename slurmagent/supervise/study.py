"""The adaptive search's driver: a thin layer between the ask/tell optimiser (slurmagent.hpo)
and the sweep's tasks.

A trial is a task of the sweep (task index = trial number, its directory `SWEEP/<n>/`). A
new trial is a task added to `sweep.json` as WAITING with the overrides of its parameters,
the full training length (`<hpo.fidelity.key>=<max>`, so the schedule is the full one) and
its rung (`hpo.stop_at=F`: the training loop stops there, checkpointed). A promotion is a new
attempt of the same task with a higher `hpo.stop_at`: it resumes its own checkpoint, so it
costs only the added epochs. Everything else — submission, recovery of preempted, failed or
out-of-memory attempts, the gate — is the supervisor's as for any sweep, so a requeued or
resubmitted trial keeps its trial and is never counted failed.

The driver runs inside the supervisor's poll, under the sweep's lock, by whoever holds the
sweep's lead (the attached launcher, `watch`, the detached supervisor): one driver at a time.
Its order of writes makes a killed driver lose nothing: the optimiser's storage records an
ask before the task is written, and a trial asked but missing from `sweep.json` is added by
the next driver; a trial's result is told once its task completed at the trial's target.

Files in `SWEEP/hpo/`: `settings.json` (what the sweeper started: the hpo group, the search
space's overrides, the job spec), `study.journal` (the Optuna study, unless hpo.storage
names another), `trials.json` (one entry per trial, for status/results/report) and
`best.json` (the best trial and how to run it again).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shlex
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from slurmagent.config import HPO_STOP_AT, HPO_TRIAL, HpoConf, hpo_conf
from slurmagent.errors import SweepStateError
from slurmagent.files import atomic_write
from slurmagent.hpo.core import Ask, Optimizer, TrialInfo
from slurmagent.hpo.space import Space
from slurmagent.hpo.storage import describe, open_storage
from slurmagent.primitives.env import TaskFile, task_checkpoint_dir
from slurmagent.supervise.state import SweepState, TaskRecord
from slurmagent.supervise.submission import WAITING
from slurmagent.supervise.views import STUDY_BEST, STUDY_SETTINGS, STUDY_TRIALS, load_trials
from slurmagent.syntax import slurm_time_to_seconds

log = logging.getLogger(__name__)

SETTINGS, TRIALS, BEST = STUDY_SETTINGS, STUDY_TRIALS, STUDY_BEST


@dataclasses.dataclass(frozen=True)
class StudySettings:
    """What the sweeper started: enough for any later supervisor to continue the study."""

    hpo: dict[str, Any]  # the hpo group (HpoConf as plain data)
    space: list[str]  # the sweep's overrides: the search space and the values every trial shares
    spec_id: str  # the job spec every trial runs with (a key of SweepState.specs)
    started_at: float
    command: list[str]  # how the study was started (the reproduce line builds on it)

    @property
    def conf(self) -> HpoConf:
        return hpo_conf(self.hpo)

    def write(self, sweep_dir: Path) -> None:
        path = sweep_dir / SETTINGS
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(dataclasses.asdict(self), indent=1).encode())

    @classmethod
    def read(cls, sweep_dir: Path) -> StudySettings | None:
        try:
            raw = json.loads((sweep_dir / SETTINGS).read_text())
        except FileNotFoundError:
            return None
        except ValueError as exc:
            raise SweepStateError(f"{sweep_dir / SETTINGS} is not valid JSON: {exc}") from None
        return cls(**raw)


def study_name(conf: HpoConf, sweep_dir: Path) -> str:
    """hpo.study_name, else one that names the sweep (unique in a storage shared by sweeps)."""
    return conf.study_name or f"slurmagent:{sweep_dir.absolute()}"


def open_optimizer(settings: StudySettings, sweep_dir: Path) -> Optimizer:
    conf = settings.conf
    space = Space.from_overrides(settings.space, conf.conditions)
    return Optimizer(
        space,
        min_fidelity=conf.fidelity.min or None,  # unset: the study's own, else a tenth of max
        max_fidelity=conf.fidelity.max,
        eta=conf.fidelity.eta,
        seed=conf.seed,
        direction=conf.direction,
        storage=open_storage(conf.storage, sweep_dir),
        study_name=study_name(conf, sweep_dir),
        n_explore=conf.explore or None,
    )


def override_value(task: TaskRecord, key: str) -> str | None:
    for o in task.overrides:
        k, _, v = o.partition("=")
        if k.lstrip("+") == key:
            return v
    return None


def read_curve(task_dir: Path, objective: str) -> dict[int, float]:
    """The objective at each epoch a trial reported (`loop.report(epoch=…, <objective>=…)` in
    its metrics.jsonl; an epoch reported twice — redone after a requeue — keeps its last value)."""
    curve: dict[int, float] = {}
    try:
        lines = (task_dir / TaskFile.METRICS).read_text().splitlines()
    except OSError:
        return curve
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line cut short by a kill
        if isinstance(row, dict) and "epoch" in row and objective in row:
            try:
                curve[int(row["epoch"])] = float(row[objective])
            except (TypeError, ValueError):
                continue
    return curve


class StudyDriver:
    """Advances a sweep's study by one poll: results told, losers left stopped at their rung,
    promotions and new trials written as WAITING tasks (the supervisor submits them)."""

    def __init__(self, sweep_dir: str | Path, settings: StudySettings) -> None:
        self.dir = Path(sweep_dir)
        self.settings = settings
        self.conf = settings.conf
        self.space = Space.from_overrides(settings.space, self.conf.conditions)
        self.opt = open_optimizer(settings, self.dir)
        self.finished = False

    @classmethod
    def open(cls, sweep_dir: str | Path) -> StudyDriver | None:
        """The driver of this sweep's study; None when the sweep is not a search."""
        settings = StudySettings.read(Path(sweep_dir))
        return None if settings is None else cls(sweep_dir, settings)

    # -- one poll ----------------------------------------------------------------------------
    def step(self, state: SweepState, held: Collection[int] = ()) -> bool:
        """Called under the sweep's lock after the supervisor updated every task; `held` are
        tasks whose recovery waits (for approval or a limit): not failed. True when it changed
        something."""
        tasks = {t.index: t for t in state.tasks}
        changed = False
        for ask in self.opt.pending():
            task = tasks.get(ask.trial)
            if task is None or override_value(task, HPO_STOP_AT) != str(ask.fidelity):
                self._write_task(state, tasks, ask)  # asked by a driver that died before writing it
                changed = True
            elif task.state == "COMPLETED":
                self._tell(state, task, ask)
                changed = True
            elif task.done and task.index not in held:
                reason = (task.error or task.state).splitlines()[0]
                self.opt.fail(ask.trial, reason)
                log.warning("trial %d failed: %s", ask.trial, reason)
                changed = True
        while len(self.opt.pending()) < self.conf.max_parallel:
            asked = self._ask()
            if asked is None:
                break
            self._write_task(state, tasks, asked)
            changed = True
        done = not self.opt.pending() and all(t.done for t in state.tasks)
        if done and not self.finished:
            self.opt.finish()
            self.finished = changed = True
        if changed:
            self.write_views(state)
        return changed

    def _ask(self) -> Ask | None:
        budget = self.conf.budget
        if budget.wall_time and time.time() - self.settings.started_at > slurm_time_to_seconds(budget.wall_time):
            return None
        room = budget.epochs - self.opt.spent() if budget.epochs else math.inf
        new = not budget.trials or len(self.opt.trials) < budget.trials
        return self.opt.ask_within(room, new)

    def _write_task(self, state: SweepState, tasks: dict[int, TaskRecord], ask: Ask) -> None:
        fid = self.conf.fidelity
        overrides = [
            *self.space.overrides(ask.params),
            f"{fid.key}={fid.max}",  # the full schedule: a trial's learning-rate schedule does not depend on its rung
            f"{HPO_STOP_AT}={ask.fidelity}",
            f"{HPO_TRIAL}={ask.trial}",
        ]
        task = tasks.get(ask.trial)
        if task is None:
            if any(t.index == ask.trial for t in state.tasks):  # pragma: no cover - tasks mirrors state.tasks
                raise SweepStateError(f"task {ask.trial} exists twice")
            task = TaskRecord(ask.trial, overrides, state=WAITING, spec_id=self.settings.spec_id)
            state.tasks.append(task)
            state.tasks.sort(key=lambda t: t.index)
            tasks[ask.trial] = task
        else:  # a promotion: the same task's next attempt, resuming its checkpoint
            task.overrides, task.state, task.result, task.error, task.diagnosis = overrides, WAITING, None, "", None
            task.stage_start, task.promotions = len(task.attempts), task.promotions + 1
        state.finished_at = None
        what = f"promoted to {ask.fidelity}" if ask.resume is not None else f"new, to {ask.fidelity}"
        log.info("trial %d %s: %s", ask.trial, what, " ".join(self.space.overrides(ask.params)))

    def _tell(self, state: SweepState, task: TaskRecord, ask: Ask) -> None:
        objective = self.conf.objective
        curve = {e: v for e, v in read_curve(self.dir / str(task.index), objective).items() if e <= ask.fidelity}
        result = task.result if isinstance(task.result, dict) else {}
        if ask.fidelity not in curve and result.get("epoch") == ask.fidelity and objective in result:
            curve[ask.fidelity] = float(result[objective])
        if ask.fidelity not in curve:
            reason = (
                f"completed without reporting {objective} at epoch {ask.fidelity}: the training must call "
                f"loop.report(epoch=<n>, {objective}=<value>) at the end of each epoch (hpo.objective names the metric)"
            )
            task.error = reason
            self.opt.fail(ask.trial, reason)
            log.error("trial %d: %s", ask.trial, reason)
            return
        self.opt.tell(ask.trial, curve)

    # -- what people read ------------------------------------------------------------------
    def trial_rows(self, state: SweepState) -> list[dict[str, Any]]:
        tasks = {t.index: t for t in state.tasks}
        rows = []
        for info in sorted(self.opt.trials.values(), key=lambda t: t.trial):
            task = tasks.get(info.trial)
            rows.append(trial_row(info, task, self.opt))
        return rows

    def write_views(self, state: SweepState) -> None:
        rows = self.trial_rows(state)
        body = {
            "objective": self.conf.objective,
            "direction": self.conf.direction,
            "rungs": self.opt.rungs,
            "spent_epochs": self.opt.spent(),
            "budget": dataclasses.asdict(self.conf.budget),
            "storage": describe(self.conf.storage, self.dir),
            "study_name": study_name(self.conf, self.dir),
            "finished": self.finished,
            # each parameter's scale, for plots: log, linear, or choice
            "space": {p.name: _scale(p.distribution) for p in self.space.params},
            "trials": rows,
        }
        atomic_write(self.dir / TRIALS, json.dumps(body, indent=1, allow_nan=True).encode())
        best = self.opt.best()
        if best is not None:
            fid = self.conf.fidelity
            plain = [o for o in self.space.overrides(best.params) if not o.lstrip("+~").startswith("hpo.")]
            # a one-task sweep (-m): it runs where the search ran, on Slurm or here
            reproduce = [*self.settings.command, *plain, f"{fid.key}={fid.max}", "-m"]
            entry = {
                "trial": best.trial,
                "params": best.params,
                "epochs": best.reached,
                "value": best.curve[best.reached],
                "objective": self.conf.objective,
                "full_training": best.reached >= fid.max,
                "checkpoint_dir": str(self._checkpoint_dir(state, best.trial)),
                "overrides": plain,  # the trial's, without the search's own settings (hpo.*)
                "reproduce": shlex.join(reproduce),
                "finished": self.finished,
            }
            atomic_write(self.dir / BEST, json.dumps(entry, indent=1).encode())

    def _checkpoint_dir(self, state: SweepState, trial: int) -> Path:
        """Where the trial's checkpoints are (primitives/env.py decides, as in the job)."""
        task = next((t for t in state.tasks if t.index == trial), None)
        configured = (state.spec_of(task).get("checkpoint") or {}).get("dir") if task is not None else None
        return task_checkpoint_dir(configured, self.dir / str(trial), self.dir, trial)


def _scale(dist: Any) -> str:
    if hasattr(dist, "choices"):
        return "choice"
    return "log" if getattr(dist, "log", False) else "linear"


def trial_row(info: TrialInfo, task: TaskRecord | None, opt: Optimizer) -> dict[str, Any]:
    """One trial as plain data: its parameters, how far it got, its objective there, its state."""
    if info.failed:
        status = "failed"
    elif info.diverged:
        status = "diverged"
    elif info.running:
        status = "running" if task is not None and task.state not in (WAITING,) else "waiting"
    elif info.reached >= opt.rungs[-1]:
        status = "complete"
    else:
        status = "stopped"  # at its rung: not (yet) promoted
    value = info.curve.get(info.reached) if info.curve else None
    return {
        "trial": info.trial,
        "params": info.params,
        "epochs": info.reached,
        "target": info.target,
        "value": value if value is None or math.isfinite(value) else None,
        "curve": {str(k): (v if math.isfinite(v) else None) for k, v in sorted(info.curve.items())},
        "state": status,
        "promotions": len(info.promoted_from),
        "promoted_at": [opt.rungs[r] for r in sorted(info.promoted_from)],  # the rungs it was promoted from
        "task_state": task.state if task is not None else "",
        "attempts": len(task.attempts) if task is not None else 0,
        "reason": info.failed,
    }


__all__ = ["StudyDriver", "StudySettings", "load_trials", "open_optimizer", "read_curve", "trial_row"]
