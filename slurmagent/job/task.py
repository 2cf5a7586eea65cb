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

import json
import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from slurmagent.config import JobSpec, job_spec, resolve_target, spec_dict
from slurmagent.errors import TaskFailedError
from slurmagent.job.stop import GraceWindow, handle_stop
from slurmagent.runtime.context import JobContext, context_from_env, set_current
from slurmagent.runtime.loop import StopForRequeue
from slurmagent.runtime.signals import StopFlag, StopSignals, install_handlers, restore_handlers, signal_number
from slurmagent.slurm.seam import SlurmCLI


def _output_dir() -> Path:
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except (ValueError, ImportError):
        return Path(os.getcwd())


def build_context(spec: JobSpec) -> JobContext:
    out = _output_dir()
    ckpt = Path(spec.checkpoint.dir) if spec.checkpoint.dir else out / "checkpoints"
    ctx = context_from_env(output_dir=out, checkpoint_dir=ckpt)
    return replace(ctx, resources=asdict(spec.resources), checkpoint=spec.checkpoint, health=spec.health)


def run_in_job(cfg: DictConfig, call: Callable[[JobSpec, JobContext], Any], require_task: bool = True) -> Any:
    """Run `call(spec, ctx)` as the job: context set, stop signals owned from now (a
    `task.command` child gets them forwarded instead), a stop decided and acted on."""
    spec = job_spec(spec_dict(cfg), require_task=require_task)
    slurm = SlurmCLI()
    ctx = build_context(spec)
    previous: dict[int, Any] = {}
    if spec.task.command is None and ctx.backend in ("slurm", "local"):
        flag = StopFlag()
        signals = [signal_number(spec.recovery.signal), signal.SIGTERM, signal.SIGCONT]
        previous = install_handlers(flag, signals)
        ctx = replace(ctx, signals=StopSignals(flag, GraceWindow(spec.recovery, ctx.backend, slurm)))
    set_current(ctx)
    os.environ.update(ctx.to_env())
    try:
        return call(spec, ctx)
    except StopForRequeue as stop:
        handle_stop(ctx, stop, spec.recovery, slurm)
        raise
    finally:
        set_current(None)
        restore_handlers(previous)


def run_task(cfg: DictConfig) -> Any:
    """Hydra task function of `python -m slurmagent`."""

    def dispatch(spec: JobSpec, ctx: JobContext) -> Any:
        if spec.task.target is not None:
            return resolve_target(spec.task.target)(cfg)
        assert spec.task.command is not None
        return run_command(spec.task.command, ctx)

    return run_in_job(cfg, dispatch)


def wrap_user_task(task_function: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A user's own Hydra task function, run as a slurmagent job (context, signals, stop)."""

    def job(cfg: DictConfig) -> Any:
        return run_in_job(cfg, lambda _spec, _ctx: task_function(cfg), require_task=False)

    return job


FORWARDED = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGCONT, signal.SIGINT)


def run_command(argv: list[str], ctx: JobContext) -> Any:
    """Run `argv` (no shell) with the context in its environment, forwarding signals.

    A child that writes `$SLURMAGENT_OUTPUT_DIR/result.json` returns that value; a non-zero
    exit is a TaskFailedError naming the code and the last lines of its stderr.
    """
    ctx.output_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, **ctx.to_env())
    err_path = ctx.output_dir / "command.stderr"
    with open(err_path, "ab") as err:
        proc = subprocess.Popen(argv, env=env, stderr=err, cwd=ctx.output_dir)
        previous: dict[int, Any] = {sig: signal.signal(sig, lambda s, _f: proc.send_signal(s)) for sig in FORWARDED}
        try:
            code = proc.wait()
        finally:
            restore_handlers(previous)
    if code != 0:
        tail = err_path.read_text(errors="replace").splitlines()[-10:]
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        raise TaskFailedError(f"command {argv[0]!r} {how}; last stderr lines:\n" + "\n".join(tail))
    result_file = ctx.output_dir / "result.json"
    if result_file.exists():
        return json.loads(result_file.read_text())
    return None
