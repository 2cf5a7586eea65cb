"""What a job starts for its task's trackers (called by job/task.py): the sinks `track.*` asks
for, the run's name, params and tags from the task's config, and the forwarder's thread."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slurmagent.config.track import MlflowConf, TrackConf, WandbConf
from slurmagent.primitives.env import TaskFile
from slurmagent.runtime.context import JobContext
from slurmagent.track.forward import Forwarder
from slurmagent.track.sinks import MlflowSink, RunInfo, Sink, TensorBoardSink, WandbSink

log = logging.getLogger(__name__)

NOT_PARAMS = ("hydra", "site")  # config groups that are the machinery, not the task's parameters


def sinks_for(conf: TrackConf, task_dir: Path, sweep_dir: Path | None = None) -> list[Sink]:
    sinks: list[Sink] = []
    if conf.tensorboard:
        sinks.append(TensorBoardSink(task_dir / TaskFile.TENSORBOARD))
    if conf.mlflow.uri is not None:
        sinks.append(mlflow_sink(conf.mlflow, sweep_dir=sweep_dir))
    if conf.wandb.mode is not None:
        sinks.append(WandbSink(conf.wandb, task_dir))
    return sinks


def mlflow_sink(conf: MlflowConf, running: bool = True, sweep_dir: Path | None = None) -> MlflowSink:
    # a tracker that does not answer is retried by the forwarder, not inside MLflow's client
    # (its defaults: 7 retries, 120 s timeout); a job's own settings of these win
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    return MlflowSink(conf, running, sweep_dir)


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = str(value)
    return out


def run_info(config: Mapping[str, Any], overrides: list[str], ctx: JobContext) -> RunInfo:
    sweep = ctx.sweep_dir
    label = "/".join(sweep.parts[-2:]) if sweep is not None else ctx.output_dir.name
    own = {k: v for k, v in config.items() if k not in NOT_PARAMS}
    params = flatten(own)
    tags = {
        "slurmagent.task": str(ctx.task_index),
        "slurmagent.task_dir": str(ctx.output_dir),
        "slurmagent.overrides": " ".join(overrides),
    }
    if sweep is not None:
        tags["slurmagent.sweep_dir"] = str(sweep)
    return RunInfo(name=f"{label} #{ctx.task_index}", params=params, tags=tags, config=own)


def start(conf: TrackConf, config: Mapping[str, Any], overrides: list[str], ctx: JobContext) -> Forwarder | None:
    """The task's forwarder, started; None when no tracker is on or this rank does not write."""
    sinks = sinks_for(conf, ctx.output_dir, ctx.sweep_dir)
    if not sinks or ctx.rank != 0:
        return None
    forwarder = Forwarder(ctx.output_dir, sinks, run_info(config, overrides, ctx), conf.interval_s, ctx.stop_at)
    forwarder.start()
    log.info("metrics go to %s too (track.*)", ", ".join(s.name for s in sinks))
    return forwarder


def sync(task_dir: Path, timeout_s: float) -> dict[str, Any] | None:
    """Send what a task's trackers have not taken yet (its run ended with a tracker down), to the
    runs its track.json names; the runs' states are left as they are. Returns the trackers'
    state after it (None: the task has no trackers)."""
    from slurmagent.track.forward import RUN_KEY, read_state

    saved = read_state(task_dir)
    run = saved.get(RUN_KEY) or {}
    sweep = (run.get("tags") or {}).get("slurmagent.sweep_dir")
    sinks: list[Sink] = []
    if "tensorboard" in saved:
        sinks.append(TensorBoardSink(Path(saved["tensorboard"].get("log_dir") or task_dir / TaskFile.TENSORBOARD)))
    if "mlflow" in saved and saved["mlflow"].get("uri"):
        conf = MlflowConf(uri=saved["mlflow"]["uri"], experiment=saved["mlflow"].get("experiment", "slurmagent"))
        sinks.append(mlflow_sink(conf, running=False, sweep_dir=Path(sweep) if sweep else None))
    if "wandb" in saved and saved["wandb"].get("mode"):
        w = saved["wandb"]
        conf_w = WandbConf(mode=w["mode"], project=w.get("project", "slurmagent"), entity=w.get("entity"))
        sinks.append(WandbSink(conf_w, Path(w.get("dir") or task_dir)))
    if not sinks:
        return None
    info = RunInfo(run.get("name", task_dir.name), run.get("params", {}), run.get("tags", {}), run.get("config", {}))
    Forwarder(task_dir, sinks, info).close(None, timeout_s)
    return read_state(task_dir)
