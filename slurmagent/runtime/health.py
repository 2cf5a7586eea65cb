"""Runtime health checks during a job: the StepLoop runs a health skill every
`interval_s` seconds (at a step boundary), appends each result to
`<output dir>/health.jsonl`, and on CRITICAL writes `<output dir>/health_stop.json` and
asks the loop to checkpoint and stop (`HealthStop`, a StopForRequeue): the job is
requeued, and the record tells the supervisor which node was sick and why.

Off unless configured: `StepLoop(..., health=HealthMonitor(ctx, HealthConf(interval_s=300)))`,
or for any job through the environment: SLURMAGENT_HEALTH_INTERVAL_S=300 (and optionally
SLURMAGENT_HEALTH_SKILL, SLURMAGENT_HEALTH_INPUTS as JSON).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from slurmagent.errors import ConfigError
from slurmagent.runtime.context import ENV_PREFIX, JobContext

log = logging.getLogger(__name__)

STOP_RECORD = "health_stop.json"
HISTORY = "health.jsonl"


@dataclass(frozen=True)
class HealthConf:
    interval_s: float = 0.0  # seconds between checks; 0 = off
    skill: str = "gpu_health_check"  # registered skill to run
    inputs: dict[str, Any] = field(default_factory=dict)  # the skill's inputs
    stop_on_critical: bool = True  # checkpoint and stop for requeue on CRITICAL


def conf_from_env(env: Mapping[str, str] | None = None) -> HealthConf:
    env = os.environ if env is None else env
    try:
        interval = float(env.get(f"{ENV_PREFIX}HEALTH_INTERVAL_S", "0") or 0)
        inputs = json.loads(env.get(f"{ENV_PREFIX}HEALTH_INPUTS", "{}") or "{}")
    except ValueError as exc:
        raise ConfigError(f"{ENV_PREFIX}HEALTH_INTERVAL_S / {ENV_PREFIX}HEALTH_INPUTS: {exc}") from None
    if interval < 0 or not isinstance(inputs, dict):
        raise ConfigError(f"{ENV_PREFIX}HEALTH_INTERVAL_S must be >= 0 and {ENV_PREFIX}HEALTH_INPUTS a JSON object")
    return HealthConf(interval, env.get(f"{ENV_PREFIX}HEALTH_SKILL", "gpu_health_check"), inputs)


class HealthStop(SystemExit):
    """Marker mixed into the loop's StopForRequeue when the health check stops the job."""


class HealthMonitor:
    def __init__(
        self,
        ctx: JobContext,
        conf: HealthConf,
        clock: Callable[[], float] = time.monotonic,
        runner: Callable[..., Any] | None = None,
    ) -> None:
        if conf.interval_s < 0:
            raise ConfigError(f"health interval_s={conf.interval_s} must be 0 (off) or positive")
        self.ctx = ctx
        self.conf = conf
        self._clock = clock
        self._next = clock() + conf.interval_s
        self._runner = runner
        self.checks = 0
        self.last: dict[str, Any] | None = None

    def _run(self) -> Any:
        if self._runner is not None:
            return self._runner(self.conf.skill, **self.conf.inputs)
        from slurmagent.skills.registry import run_skill

        return run_skill(self.conf.skill, **self.conf.inputs)

    def check(self, step: int) -> bool:
        """Run the skill if due; True when the job should checkpoint and stop."""
        if not self.conf.interval_s or self._clock() < self._next:
            return False
        self._next = self._clock() + self.conf.interval_s
        result = self._run()
        self.checks += 1
        record = {
            "time": time.time(),
            "step": step,
            "node": self.ctx.node,
            "job_id": self.ctx.job_id,
            "attempt": self.ctx.attempt,
            **result.to_json(),
        }
        self.last = record
        if self.ctx.rank == 0 or self.ctx.world_size == 1:
            self.ctx.output_dir.mkdir(parents=True, exist_ok=True)
            with open(self.ctx.output_dir / HISTORY, "a") as fh:
                fh.write(json.dumps(record, default=str) + "\n")
        if result.status.name != "CRITICAL" or not self.conf.stop_on_critical:
            return False
        from slurmagent.files import atomic_write

        # every rank that sees its GPU fail writes it: the supervisor reads the node from here
        atomic_write(
            self.ctx.output_dir / STOP_RECORD,
            json.dumps({**record, "action": "checkpoint and requeue; exclude this node"}, default=str).encode(),
        )
        log.error("health check CRITICAL on %s at step %d: %s", self.ctx.node, step, "; ".join(result.reasons))
        return True


def requeue_elsewhere(ctx: JobContext) -> dict[str, Any]:
    """Under Slurm (rank 0 only): requeue this job and add this node to its ExcNodeList, so
    its next run starts on another node (Slurm allows ExcNodeList changes only once the job
    is pending again, hence the order) — both through the action gate, as automated
    actions from a CRITICAL health check. Recorded in health_stop.json. Elsewhere: nothing."""
    from slurmagent.errors import SlurmAgentError
    from slurmagent.files import atomic_write
    from slurmagent.records import Evidence
    from slurmagent.runtime.actions import job_action, job_gate
    from slurmagent.slurm.seam import SlurmCLI

    job = ctx.slurm_requeue_id
    if ctx.backend != "slurm" or not job or not ctx.node or ctx.rank != 0:
        return {}
    source = "health_check:CRITICAL"
    done: dict[str, Any] = {"requeued": False, "excluded": None}
    path = ctx.output_dir / STOP_RECORD
    record = json.loads(path.read_text()) if path.exists() else {}
    evidence = [Evidence(str(path), 0, str(r)) for r in (record.get("reasons") or [])[:3]]
    gate = job_gate(ctx)
    try:
        show = SlurmCLI(timeout=30).run(["scontrol", "show", "job", "-o", job])
        current = next((f.split("=", 1)[1] for f in show.split() if f.startswith("ExcNodeList=")), "(null)")
        why = f"health check CRITICAL on {ctx.node}: requeue from the checkpoint just written"
        requeue = job_action(
            ctx, "requeue", why, source, evidence=evidence, metrics={"node": ctx.node}, cause="gpu_health"
        )
        requeued = gate.request(requeue)
        done["requeued"] = requeued.executed
        if requeued.executed:
            excluded = ",".join(x for x in (current if current != "(null)" else "", ctx.node) if x)
            params = {"exclude": excluded, "node": ctx.node}
            elsewhere = f"health check CRITICAL on {ctx.node}: run elsewhere"
            moved = gate.request(job_action(ctx, "exclude_node", elsewhere, source, params=params, evidence=evidence))
            done["excluded"] = excluded if moved.executed else None
            if not moved.executed:
                done["error"] = str(moved.result.get("error") or moved.decision.rule)
        else:
            done["error"] = (
                f"requeue {requeued.decision.verdict}: {requeued.result.get('error') or requeued.decision.rule}"
            )
    except SlurmAgentError as exc:
        done["error"] = str(exc)
        log.error("could not requeue %s away from %s: %s", job, ctx.node, exc)
    atomic_write(path, json.dumps({**record, **done}, default=str).encode())
    return done


def monitor_for(ctx: JobContext) -> HealthMonitor | None:
    """The monitor the environment asks for, or None (off)."""
    conf = conf_from_env()
    return HealthMonitor(ctx, conf) if conf.interval_s > 0 else None
