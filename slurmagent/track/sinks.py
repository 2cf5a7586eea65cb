"""One class per tracker (TensorBoard, MLflow, Weights & Biases), each behind the same calls
(`where`, `open`, `send`, `end`): the only code that imports a tracker's library. A call that
fails raises; `forward.py` retries it."""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from slurmagent.config.track import MlflowConf, WandbConf

# MLflow caps a batch at 1000 metrics and 100 params, a param's value at 6000 characters
MLFLOW_METRICS_PER_BATCH = 1000
MLFLOW_PARAMS_PER_BATCH = 100
MLFLOW_PARAM_CHARS = 6000


@dataclass(frozen=True)
class Point:
    """One value of one metric at one step; `ms` is when it was first read (a resend carries the
    same, so a store that already has it keeps one)."""

    name: str
    step: int
    value: float
    ms: int


@dataclass(frozen=True)
class RunInfo:
    """What every tracker is told of the task when its run is made."""

    name: str  # "<sweep> #<task index>"
    params: dict[str, str]  # the task's config, flattened (a.b.c → value)
    tags: dict[str, str]  # the sweep directory, the task's index and overrides
    config: dict[str, Any] = field(default_factory=dict)  # the task's config as it is (W&B keeps its types)


class Sink(Protocol):
    name: str

    def where(self) -> dict[str, Any]:
        """Where it sends, as track.json keeps it (for `slurmagent track`): no secret in it."""
        ...

    def open(self, state: dict[str, Any], run: RunInfo) -> dict[str, Any]:
        """Continue the run `state` names (from an earlier run of the task), or make it; returns
        what to keep in the task's track.json to continue it next time."""
        ...

    def send(self, points: list[Point]) -> None: ...

    def end(self, status: str) -> None:
        """The task's run ends here: FINISHED, FAILED, or SCHEDULED (stopped for a requeue)."""
        ...


class TensorBoardSink:
    """Event files in the task's directory (`<task>/tensorboard/`): each run of the task adds a
    file to the same folder, which TensorBoard shows as one run."""

    name = "tensorboard"

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.writer: Any = None

    def where(self) -> dict[str, Any]:
        return {"log_dir": str(self.log_dir)}

    def open(self, state: dict[str, Any], run: RunInfo) -> dict[str, Any]:
        from torch.utils.tensorboard import SummaryWriter

        if self.writer is None:
            self.writer = SummaryWriter(log_dir=str(self.log_dir))
            if not state.get("log_dir"):  # the task's first run: its config as text, once
                self.writer.add_text("config", "\n".join(f"    {k}: {v}" for k, v in run.params.items()), 0)
        return self.where()

    def send(self, points: list[Point]) -> None:
        for p in points:
            self.writer.add_scalar(p.name, p.value, global_step=p.step, walltime=p.ms / 1000)
        self.writer.flush()  # on disk before what was sent is written down

    def end(self, status: str) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


PARENT_FILE = ".slurmagent/mlflow-parent.json"  # in the sweep directory: the sweep's own MLflow run


class MlflowSink:
    """An MLflow run per task in `track.mlflow.experiment`: the task's config as params, its
    sweep, index and overrides as tags, every metric with its step. A sweep's tasks (a search's
    trials) are children of one run of the sweep's own (`mlflow.parentRunId`), made by the first
    task to start — under a lock in the sweep directory, so that there is one — and marked
    FINISHED at once: it holds the tasks together, not metrics."""

    name = "mlflow"

    def __init__(self, conf: MlflowConf, running: bool = True, sweep_dir: Path | None = None) -> None:
        assert conf.uri is not None
        self.conf = conf
        self.running = running  # a run continued by a job is RUNNING again; by `slurmagent track`, left as it is
        self.sweep_dir = sweep_dir
        self.client: Any = None
        self.run_id: str | None = None

    def parent(self, experiment: str, run: RunInfo) -> str:
        """The sweep's run in this experiment: the one a sibling made, or made now."""
        import json

        from filelock import FileLock

        from slurmagent.files import atomic_write

        assert self.sweep_dir is not None
        path = self.sweep_dir / PARENT_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        key = {**self.where(), "experiment_id": experiment}
        with FileLock(str(path) + ".lock"):
            try:
                known = json.loads(path.read_text())
            except (OSError, ValueError):
                known = {}
            if known.get("key") == key and known.get("run_id"):
                return str(known["run_id"])
            tags = {"slurmagent.sweep_dir": str(self.sweep_dir), "slurmagent.role": "sweep"}
            made = self.client.create_run(experiment, run_name=run.name.rsplit(" #", 1)[0], tags=tags)
            self.client.set_terminated(made.info.run_id, status="FINISHED")
            atomic_write(path, json.dumps({"key": key, "run_id": made.info.run_id}).encode())
            return str(made.info.run_id)

    def where(self) -> dict[str, Any]:
        # without a user:password@ (credentials belong in MLFLOW_TRACKING_USERNAME/_PASSWORD/_TOKEN)
        return {"uri": re.sub(r"(//)[^/@\s]+@", r"\1", self.conf.uri or ""), "experiment": self.conf.experiment}

    def open(self, state: dict[str, Any], run: RunInfo) -> dict[str, Any]:
        from mlflow.entities import Param, RunStatus
        from mlflow.tracking import MlflowClient

        if self.client is None:
            self.client = MlflowClient(tracking_uri=self.conf.uri)
        run_id = state.get("run_id")
        if run_id and self.running:
            self.client.update_run(run_id, status=RunStatus.to_string(RunStatus.RUNNING))
        else:
            found = self.client.get_experiment_by_name(self.conf.experiment)
            name = self.conf.experiment
            experiment = found.experiment_id if found is not None else self.client.create_experiment(name)
            tags = dict(run.tags)
            if self.sweep_dir is not None:
                tags["mlflow.parentRunId"] = self.parent(experiment, run)
            made = self.client.create_run(experiment, run_name=run.name, tags=tags)  # RUNNING
            run_id = made.info.run_id
            params = [Param(k, v[:MLFLOW_PARAM_CHARS]) for k, v in run.params.items()]
            for i in range(0, len(params), MLFLOW_PARAMS_PER_BATCH):
                self.client.log_batch(run_id, params=params[i : i + MLFLOW_PARAMS_PER_BATCH])
        self.run_id = run_id
        return {"run_id": run_id, **self.where()}

    def send(self, points: list[Point]) -> None:
        from mlflow.entities import Metric

        metrics = [Metric(p.name, p.value, p.ms, p.step) for p in points]
        for i in range(0, len(metrics), MLFLOW_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + MLFLOW_METRICS_PER_BATCH])

    def end(self, status: str) -> None:
        if self.client is not None and self.run_id is not None:
            self.client.set_terminated(self.run_id, status=status, end_time=int(time.time() * 1000))


class WandbSink:
    """A W&B run per task, its id made once and kept in track.json: each run of the task opens it
    again (`resume="allow"`); offline, each writes `<task>/wandb/offline-run-*-<id>/`, which
    `wandb sync` uploads into the one run. The run's config is the task's; W&B's own console
    capture and system metrics are off (the job's log is the job's)."""

    name = "wandb"

    def __init__(self, conf: WandbConf, task_dir: Path) -> None:
        self.conf = conf
        self.task_dir = task_dir
        self.run: Any = None

    def where(self) -> dict[str, Any]:
        return {
            "mode": self.conf.mode,
            "project": self.conf.project,
            "entity": self.conf.entity,
            "dir": str(self.task_dir),
        }

    def open(self, state: dict[str, Any], run: RunInfo) -> dict[str, Any]:
        import wandb

        run_id = state.get("run_id") or uuid.uuid4().hex[:16]
        if self.run is None:
            settings = wandb.Settings(console="off", x_disable_stats=True, silent=True, x_save_requirements=False)
            self.run = wandb.init(
                project=self.conf.project,
                entity=self.conf.entity,
                id=run_id,
                resume="allow",
                dir=str(self.task_dir),
                name=run.name,
                group=run.tags.get("slurmagent.sweep_dir"),  # a sweep's tasks together, as W&B groups runs
                config=run.config or run.params,
                mode=self.conf.mode,  # type: ignore[arg-type]
                reinit="create_new",  # beside a run the training code opened itself
                settings=settings,
            )
        return {"run_id": run_id, **self.where()}

    def send(self, points: list[Point]) -> None:
        by_step: dict[int, dict[str, float]] = {}
        for p in points:
            by_step.setdefault(p.step, {})[p.name] = p.value
        for step in sorted(by_step):  # W&B's step only goes up: one log() a step, in order
            self.run.log(by_step[step], step=step)

    def end(self, status: str) -> None:
        if self.run is not None:
            self.run.finish(exit_code=1 if status == "FAILED" else 0)
            self.run = None
