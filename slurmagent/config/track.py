"""The `track` group: where a task's metrics are also sent, besides its own metrics.jsonl —
TensorBoard event files in the task's directory, an MLflow tracking server or store, Weights &
Biases (online, or offline into the task's directory). Off unless configured; each tracker
needs its library (the extras `[tensorboard]`, `[mlflow]`, `[wandb]`). The sending is
slurmagent/track/ (run by the job, job/task.py)."""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slurmagent.config.parse import parse_conf, parse_part
from slurmagent.errors import ConfigError, choices

# the schemes an MLflow tracking URI may have (a path with no scheme is a file store too)
MLFLOW_SCHEMES = ("http", "https", "file", "sqlite", "postgresql", "mysql", "mssql", "databricks")


@dataclass(frozen=True)
class MlflowConf:
    """An MLflow tracking server or store: one MLflow run per task, for the task's whole life."""

    uri: str | None = None  # tracking URI: http://host:5000, file:/path/mlruns, sqlite:///path.db; None = off
    experiment: str = "slurmagent"  # the MLflow experiment the sweep's runs go in (made when missing)


WANDB_MODES = ("online", "offline")


@dataclass(frozen=True)
class WandbConf:
    """A Weights & Biases run per task, for the task's whole life (its id kept in track.json)."""

    mode: str | None = None  # online | offline (written under <task>/wandb/, `wandb sync` later); None = off
    project: str = "slurmagent"
    entity: str | None = None  # the team or user; None = the API key's default


@dataclass(frozen=True)
class TrackConf:
    """Trackers a task's metrics (every line of its metrics.jsonl) and its config go to."""

    tensorboard: bool = False  # event files in each task's directory (<task>/tensorboard/): tensorboard --logdir SWEEP
    mlflow: MlflowConf = field(default_factory=MlflowConf)
    wandb: WandbConf = field(default_factory=WandbConf)
    interval_s: float = 2.0  # how often new metrics are sent while the task runs
    # at the task's end (done, stopped for a requeue, failed): how long the job may wait for a tracker
    # to take what is left; what it does not take is sent by the task's next run, or `slurmagent track sync`
    flush_timeout_s: float = 15.0

    @property
    def enabled(self) -> list[str]:
        """The trackers switched on, by name."""
        trackers = (("tensorboard", self.tensorboard), ("mlflow", self.mlflow.uri), ("wandb", self.wandb.mode))
        return [name for name, on in trackers if on]


# tracker → (the module it needs, the extra that installs it)
NEEDS = {"tensorboard": ("tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow"), "wandb": ("wandb", "wandb")}


def track_conf(data: Mapping[str, Any] | None, check_installed: bool = False) -> TrackConf:
    """The `track` group from plain data, checked: errors name the key and the valid values;
    `check_installed` (at submission) also refuses a tracker whose library is not installed here."""
    raw = dict(data or {})
    ml = parse_part(MlflowConf, raw.pop("mlflow", None), "track.mlflow")
    wb = parse_part(WandbConf, raw.pop("wandb", None), "track.wandb")
    conf = dataclasses.replace(parse_conf(TrackConf, raw, "track"), mlflow=ml, wandb=wb)
    if wb.mode is not None and wb.mode not in WANDB_MODES:
        raise ConfigError(f"track.wandb.mode={wb.mode!r} is not one of {choices(WANDB_MODES)} (null: off)")
    if wb.mode is not None and not wb.project.strip():
        raise ConfigError("track.wandb.project is empty: name the W&B project the runs go in")
    if conf.interval_s <= 0:
        raise ConfigError(f"track.interval_s={conf.interval_s} must be above 0 (seconds between sends)")
    if conf.flush_timeout_s < 0:
        raise ConfigError(f"track.flush_timeout_s={conf.flush_timeout_s} must be 0 or more (seconds)")
    if ml.uri is not None:
        scheme = ml.uri.split(":", 1)[0].split("+", 1)[0] if ":" in ml.uri else "file"
        if not ml.uri.strip() or scheme not in MLFLOW_SCHEMES:
            raise ConfigError(
                f"track.mlflow.uri={ml.uri!r}: not a tracking URI; its scheme is one of {choices(MLFLOW_SCHEMES)} "
                "(e.g. http://127.0.0.1:5000, file:/shared/mlruns)"
            )
        if not ml.experiment.strip():
            raise ConfigError("track.mlflow.experiment is empty: name the MLflow experiment the runs go in")
    if check_installed:
        for name in conf.enabled:
            module, extra = NEEDS[name]
            if importlib.util.find_spec(module) is None:
                raise ConfigError(
                    f"track.{name} is on but the {module} package is not installed here: "
                    f"pip install 'slurmagent[{extra}]' (where the jobs run too)"
                )
    return conf
