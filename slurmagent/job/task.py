"""The task entry: what runs for each job of a sweep, or a single run, on the node.

`run_in_job` wraps any task function (slurmagent's own `run_task`, or a user's Hydra main
under our launcher): it parses the job spec, builds the job context, takes the job's stop
signals from its start (a preemption that arrives while the task still imports or loads
data is remembered, and the first step loop stops at once), and turns the loop's
`StopForRequeue` into the stop decision (`job/stop.py`). `run_task` then calls the
configured task: a Python callable (`task.target`) with the job's config, or a command line
(`task.command`) as a child process with the context in SLURMAGENT_* variables and the
signals forwarded to it.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

from slurmagent.config import HPO_STOP_AT, JobSpec, job_spec, resolve_target, spec_dict, track_conf
from slurmagent.errors import ConfigError
from slurmagent.job.boot import hold_stop_signals, release_stop_signals
from slurmagent.job.command import run_command
from slurmagent.job.stop import FinishCheck, GraceWindow, LoopApprover, handle_stop
from slurmagent.primitives.env import JobEnv, check_checkpoint_dir, task_checkpoint_dir
from slurmagent.primitives.signals import StopFlag, StopSignals, install_handlers, restore_handlers, signal_number
from slurmagent.runtime.context import JobContext, context_from_env, set_current
from slurmagent.runtime.distributed import rendezvous_env
from slurmagent.runtime.loop import StopForRequeue, record_host_peak
from slurmagent.slurm.seam import SlurmCLI
from slurmagent.track.forward import Forwarder
from slurmagent.track.job import start as tracking_start

log = logging.getLogger(__name__)


def _output_dir() -> Path:
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except (ValueError, ImportError):
        return Path(os.getcwd())


def build_context(spec: JobSpec) -> JobContext:
    out = _output_dir()
    index = os.environ.get(JobEnv.TASK_INDEX, "0")
    ckpt = task_checkpoint_dir(
        spec.checkpoint.dir, out, os.environ.get(JobEnv.SWEEP_DIR), int(index) if index.isdigit() else 0
    )
    ctx = context_from_env(output_dir=out, checkpoint_dir=ckpt)
    return replace(ctx, resources=asdict(spec.resources), checkpoint=spec.checkpoint, health=spec.health)


def run_in_job(cfg: DictConfig, call: Callable[[JobSpec, JobContext], Any], require_task: bool = True) -> Any:
    """Run `call(spec, ctx)` as the job: context set, stop signals owned from now (a
    `task.command` child gets them forwarded instead), a stop decided and acted on."""
    spec = job_spec(spec_dict(cfg), require_task=require_task)
    slurm = SlurmCLI()
    ctx = build_context(spec)
    stop_at = OmegaConf.select(cfg, HPO_STOP_AT, default=0)  # a search trial's rung (the HPO sweeper sets it)
    if isinstance(stop_at, int) and stop_at > 0:
        ctx = replace(ctx, stop_at=stop_at)
    ctx = replace(ctx, approve=LoopApprover(ctx))  # the step loop's in-loop actions go through the gate
    previous: dict[int, Any] = {}
    finish: FinishCheck | None = None
    if spec.task.command is None and ctx.where.launched:
        flag = StopFlag()
        signals = [signal_number(spec.recovery.signal), signal.SIGTERM, signal.SIGCONT]
        previous = install_handlers(flag, signals)
        release_stop_signals()  # a stop held since the process started (job/boot.py) lands on the flag now
        finish = FinishCheck(ctx, spec.recovery)
        ctx = replace(ctx, signals=StopSignals(flag, GraceWindow(spec.recovery, ctx.where, slurm), finish))
    set_current(ctx)
    os.environ.update(ctx.to_env())
    if ctx.world_size > 1:  # torchrun's variables: init_process_group("gloo"/"nccl") needs no arguments
        os.environ.update({k: v for k, v in rendezvous_env(ctx).items() if k not in os.environ})
    tracking = _start_tracking(cfg, ctx)
    if finish is not None and tracking is not None:
        finish.after_s = tracking[1]  # the trackers' last flush comes after the loop
    returned = False
    try:
        try:
            out = call(spec, ctx)
        except StopForRequeue:
            _end_tracking(tracking, "SCHEDULED")  # before the requeue: the next run continues the tracker's run
            raise
        except BaseException:
            _end_tracking(tracking, "FAILED")
            raise
        _end_tracking(tracking, "FINISHED")
        returned = True
        return out
    except StopForRequeue as stop:
        handle_stop(ctx, stop, spec.recovery, slurm)
        raise
    finally:
        set_current(None)
        if previous and returned:  # in a job's process, the task done: submitit writes its result, the process
            # exits — a stop signal now (the time limit's warning just as the task ended) would kill it by the
            # signal's default action and Slurm would record the finished run as FAILED: held until the exit
            hold_stop_signals()
        restore_handlers(previous)


def _start_tracking(cfg: DictConfig, ctx: JobContext) -> tuple[Forwarder, float] | None:
    """The task's trackers (`track.*`), sending from now on; None when none is on. A tracker
    never fails the task: what goes wrong here is a warning in the job's log."""
    try:
        conf = track_conf(spec_dict(cfg, ("track",)).get("track"))
        if not conf.enabled:
            return None
        try:
            config = OmegaConf.to_container(cfg, resolve=True)
        except Exception:
            config = OmegaConf.to_container(cfg, resolve=False)
        plain: dict[str, Any] = {str(k): v for k, v in config.items()} if isinstance(config, dict) else {}
        forwarder = tracking_start(conf, plain, _task_overrides(), ctx)
        return (forwarder, conf.flush_timeout_s) if forwarder is not None else None
    except Exception as exc:
        log.warning("trackers not started: %s", exc)
        return None


def _end_tracking(tracking: tuple[Forwarder, float] | None, status: str) -> None:
    if tracking is not None:
        forwarder, timeout_s = tracking
        forwarder.close(status, timeout_s)


def _task_overrides() -> list[str]:
    try:
        from hydra.core.hydra_config import HydraConfig

        return [str(o) for o in HydraConfig.get().overrides.task]
    except (ValueError, ImportError):
        return []


def check_single_run(cfg: DictConfig) -> None:
    """`python -m slurmagent …` without -m runs the task right here: refuse what cannot be
    meant (cluster=slurm on a machine that is not inside a Slurm job), and check the config as
    a sweep's tasks are checked before submission, so that nothing runs on a bad config."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    try:
        hydra = HydraConfig.get()
    except ValueError:
        return  # not under Hydra's run mode
    if hydra.mode != RunMode.RUN or os.environ.get(JobEnv.BACKEND):
        return  # a task of a sweep: the launcher checked it before submitting
    if cfg.get("cluster") == "slurm" and not os.environ.get("SLURM_JOB_ID"):
        raise ConfigError(
            "cluster=slurm asks for Slurm, but without -m this run would start here, on this machine; "
            "add -m to submit it to Slurm as a one-task sweep (or use cluster=local to run it here); nothing was run"
        )
    from slurmagent.skills.config_validator import validate_run

    check_checkpoint_dir(OmegaConf.select(cfg, "checkpoint.dir", default=None))
    for line in validate_run(cfg, list(hydra.overrides.task)):
        log.warning("config_validator: %s", line)


def run_task(cfg: DictConfig) -> Any:
    """Hydra task function of `python -m slurmagent`."""
    check_single_run(cfg)
    if "" not in sys.path and os.getcwd() not in sys.path:
        # user code is found as jobs find it (submitit starts them with `python -m`, the working
        # directory first on sys.path): the `slurmagent` console script lacks that entry
        sys.path.insert(0, os.getcwd())

    def dispatch(spec: JobSpec, ctx: JobContext) -> Any:
        if spec.task.target is not None:
            task = resolve_target(spec.task.target)
            try:
                return task(cfg)
            except (ConfigAttributeError, ConfigKeyError) as exc:
                raise missing_key(spec.task.target, exc) from exc
            finally:
                if ctx.rank == 0:  # the job history sizes resources.mem=auto from it
                    record_host_peak(ctx.output_dir)
        assert spec.task.command is not None
        return run_command(spec.task.command, ctx)

    return run_in_job(cfg, dispatch)


def missing_key(target: str, exc: Exception) -> ConfigError:
    """The task read a key its config does not have: say which, and how to give it one."""
    key = str(getattr(exc, "full_key", "") or "")
    if not key:
        return ConfigError(f"task.target={target!r} read a key its config does not have: {exc}")
    value = "VALUE"
    return ConfigError(
        f"task.target={target!r} read cfg.{key}, which the config does not have: pass +{key}={value} on the command "
        f"line, or set {key} in your experiment file (conf/experiment/NAME.yaml, selected with +experiment=NAME)"
    )


def wrap_user_task(task_function: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A user's own Hydra task function, run as a slurmagent job (context, signals, stop)."""

    def job(cfg: DictConfig) -> Any:
        return run_in_job(cfg, lambda _spec, _ctx: task_function(cfg), require_task=False)

    return job
