"""The Hydra task function: what runs for each job of a sweep (or a single run).

It builds the job context, then calls the configured task: a Python callable
(`task.target`) with the job's config, or a command line (`task.command`) as a child
process with the context in SLURMAGENT_* variables and signals forwarded to it.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from slurmagent.config import JobSpec, job_spec
from slurmagent.errors import ConfigError, SlurmAgentError, TaskFailedError
from slurmagent.runtime.context import JobContext, context_from_env, set_current
from slurmagent.runtime.loop import StopForRequeue, own_job_signals, release_job_signals

log = logging.getLogger(__name__)


def _output_dir() -> Path:
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except (ValueError, ImportError):
        return Path(os.getcwd())


def spec_dict(cfg: DictConfig) -> dict[str, Any]:
    keys = ("cluster", "resources", "checkpoint", "recovery", "task")
    out = {
        k: OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg.get(k)) else cfg.get(k)
        for k in keys
        if k in cfg
    }
    return out


def build_context(spec: JobSpec) -> JobContext:
    out = _output_dir()
    ckpt = Path(spec.checkpoint.dir) if spec.checkpoint.dir else out / "checkpoints"
    ctx = context_from_env(output_dir=out, checkpoint_dir=ckpt)
    return replace(ctx, resources=asdict(spec.resources))


def resolve_target(target: str) -> Callable[..., Any]:
    module_name, _, attr = target.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"task.target={target!r}: cannot import module {module_name!r} ({exc})") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"task.target={target!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"task.target={target!r} is not callable")
    return obj  # type: ignore[no-any-return]


def run_task(cfg: DictConfig) -> Any:
    """Hydra task function of `python -m slurmagent`."""
    spec = job_spec(spec_dict(cfg))
    ctx = build_context(spec)
    set_current(ctx)
    os.environ.update(ctx.to_env())
    if spec.task.target is not None and ctx.backend in ("slurm", "local"):
        own_job_signals((spec.recovery.signal, "TERM"))
    try:
        if spec.task.target is not None:
            return resolve_target(spec.task.target)(cfg)
        assert spec.task.command is not None
        return run_command(spec.task.command, ctx)
    except StopForRequeue as stop:
        handle_stop(ctx, stop)
        raise
    finally:
        set_current(None)
        release_job_signals()


def handle_stop(ctx: JobContext, stop: StopForRequeue) -> None:
    """After a signal checkpoint: requeue this job unless Slurm is already doing so."""
    if ctx.backend != "slurm" or ctx.slurm_requeue_id is None:
        log.warning("stopped at step %d on signal %d; no Slurm here to requeue", stop.step, stop.signum)
        return
    from slurmagent.slurm.seam import SlurmCLI

    slurm = SlurmCLI()
    try:
        state = slurm.run(["squeue", "-h", "-j", ctx.slurm_requeue_id, "-o", "%T"], check=False).strip()
    except SlurmAgentError:
        state = ""
    # preemption sends SIGTERM (with SIGCONT and, with preempt_send_user_signal, the user
    # signal at the same moment): Slurm requeues a preempted job itself
    if signal.SIGTERM in stop.signals or (state and state != "RUNNING"):
        log.warning(
            "stopped at step %d: Slurm is ending this job (state %s); it requeues preempted jobs itself",
            stop.step,
            state or "unknown",
        )
        return
    log.warning("stopped at step %d on signal %d: requeueing %s", stop.step, stop.signum, ctx.slurm_requeue_id)
    slurm.requeue(ctx.slurm_requeue_id)


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
        previous = {sig: signal.signal(sig, lambda s, _f: proc.send_signal(s)) for sig in FORWARDED}
        try:
            code = proc.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    if code != 0:
        tail = err_path.read_text(errors="replace").splitlines()[-10:]
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        raise TaskFailedError(f"command {argv[0]!r} {how}; last stderr lines:\n" + "\n".join(tail))
    result_file = ctx.output_dir / "result.json"
    if result_file.exists():
        return json.loads(result_file.read_text())
    return None
