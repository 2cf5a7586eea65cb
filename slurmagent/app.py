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

from slurmagent.config import JobSpec, RecoveryConf, job_spec
from slurmagent.errors import ConfigError, SlurmAgentError, TaskFailedError
from slurmagent.files import atomic_write
from slurmagent.records import Evidence
from slurmagent.runtime.actions import job_action, job_gate
from slurmagent.runtime.context import JobContext, context_from_env, set_current
from slurmagent.runtime.loop import StopForRequeue, own_job_signals, release_job_signals, signal_number
from slurmagent.slurm.syntax import parse_time_limit

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
        own_job_signals((spec.recovery.signal, "TERM"), grace=GraceWindow(spec.recovery, ctx.backend))
    try:
        if spec.task.target is not None:
            return resolve_target(spec.task.target)(cfg)
        assert spec.task.command is not None
        return run_command(spec.task.command, ctx)
    except StopForRequeue as stop:
        handle_stop(ctx, stop, spec.recovery)
        raise
    finally:
        set_current(None)
        release_job_signals()


class GraceWindow:
    """Seconds a job may still run after a stop signal: the user signal comes
    `recovery.signal_delay_s` before the time limit; after SIGTERM, Slurm kills at KillWait
    (asked from Slurm once, on the first SIGTERM, unless `recovery.kill_wait_s` is set)."""

    def __init__(self, recovery: RecoveryConf, backend: str) -> None:
        self.recovery = recovery
        self.backend = backend
        self._kill_wait: float | None = recovery.kill_wait_s

    def __call__(self, signum: int) -> float | None:
        if signum == signal_number(self.recovery.signal):
            return float(self.recovery.signal_delay_s)
        if signum != signal.SIGTERM:
            return None
        if self._kill_wait is None and self.backend == "slurm":
            from slurmagent.slurm.seam import SlurmCLI, parse_scontrol_config

            try:
                config = parse_scontrol_config(SlurmCLI(timeout=5).run(["scontrol", "show", "config"]))
                self._kill_wait = float(config.get("KillWait", "30 sec").split()[0])
            except (SlurmAgentError, ValueError):
                self._kill_wait = 30.0  # Slurm's default
        return self._kill_wait


def classify_stop(signals: tuple[int, ...], state: str, time_left_s: int | None, signal_delay_s: int) -> str:
    """Why the job was told to stop, from Slurm's own view of it (pure):
    `ending` — Slurm is ending the job itself (SIGTERM, or no longer RUNNING: preemption
    requeues it, a time limit or cancel ends it); `time_limit` — the user signal came and
    the job's remaining time is within the signal's lead; `signal` — the user signal came
    with time to spare (preemption with a grace time, or a person's `scancel --signal`)."""
    if signal.SIGTERM in signals or (state and state != "RUNNING"):
        return "ending"
    # Slurm may send the signal up to a minute early (its timer resolution): allow slack
    if time_left_s is not None and time_left_s <= signal_delay_s + 60:
        return "time_limit"
    return "signal"


TIME_LIMIT_FILE = ".slurmagent-time-limit-requeues.json"


def count_time_limit_requeue(ctx: JobContext) -> int:
    """Time-limit stops of this Slurm job so far, this one included (a resubmission is a
    new job and starts again from zero)."""
    path = ctx.output_dir / TIME_LIMIT_FILE
    job = ctx.slurm_requeue_id or ""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        saved = {}
    count = int(saved.get("count", 0)) + 1 if saved.get("job") == job else 1
    atomic_write(path, json.dumps({"job": job, "count": count}).encode())
    return count


def handle_stop(ctx: JobContext, stop: StopForRequeue, recovery: RecoveryConf | None = None) -> None:
    """After a signal stop: requeue this job (through the action gate) unless Slurm is
    already ending it; at the time limit only `recovery.max_time_limit_requeues` times,
    then fail with a sentence the supervisor turns into a resubmission with more time."""
    recovery = recovery or RecoveryConf()
    if ctx.backend != "slurm" or ctx.slurm_requeue_id is None:
        log.warning("stopped at step %d on signal %d; no Slurm here to requeue", stop.step, stop.signum)
        return
    if ctx.rank != 0:
        return  # rank 0 speaks for the job; every rank stopped at the same step
    from slurmagent.slurm.seam import SlurmCLI

    try:
        out = SlurmCLI().run(["squeue", "-h", "-j", ctx.slurm_requeue_id, "-o", "%T|%r|%L"], check=False)
        state, reason, left = [*out.strip().split("|"), "", "", ""][:3]
    except SlurmAgentError:
        state, reason, left = "", "", ""
    why = classify_stop(stop.signals, state, parse_time_limit(left), recovery.signal_delay_s)
    if why == "ending":
        log.warning(
            "stopped at step %d: Slurm is ending this job (state %s, reason %s); it requeues preempted jobs itself",
            stop.step,
            state or "unknown",
            reason or "unknown",
        )
        return
    metrics = {"step": stop.step, "state": state, "reason": reason, "time_left": left, "signals": list(stop.signals)}
    if why == "time_limit":
        count = count_time_limit_requeue(ctx)
        if count > recovery.max_time_limit_requeues:
            raise TaskFailedError(
                f"slurmagent: time limit reached {count} times (recovery.max_time_limit_requeues="
                f"{recovery.max_time_limit_requeues}); checkpoint at step {stop.step}: resubmit with a longer time"
            )
        reason_text = f"time limit near ({left} left): requeue {count} of {recovery.max_time_limit_requeues}"
    else:
        reason_text = f"signal {stop.signum} with {left or 'unknown'} left: requeue to resume from step {stop.step}"
    names = ", ".join(signal.Signals(n).name for n in stop.signals if n in signal.Signals._value2member_map_)
    evidence = [
        Evidence("slurm", 0, f"squeue: State={state or '?'} Reason={reason or '?'} TimeLeft={left or '?'}"),
        Evidence("runtime", 0, f"signals received: {names}; stop checkpoint at step {stop.step}"),
    ]
    cause = "time_limit" if why == "time_limit" else "signal"
    action = job_action(ctx, "requeue", reason_text, "runtime", evidence=evidence, metrics=metrics, cause=cause)
    outcome = job_gate(ctx).request(action)
    if outcome.executed:
        log.warning("stopped at step %d: %s", stop.step, reason_text)
    else:
        log.warning(
            "stopped at step %d: requeue not done (%s: %s); the checkpoint stays for a later run",
            stop.step,
            outcome.decision.verdict,
            outcome.result.get("error") or outcome.decision.rule,
        )


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
