"""Runtime health checks during a job: the StepLoop runs a health skill every
`interval_s` seconds (at a step boundary), appends each result to
`<output dir>/health.jsonl`, and on CRITICAL writes `<output dir>/health_stop.json` and
tells the loop to checkpoint and stop (`StopForRequeue(reason="health")`); the job wrapper
then requeues the job away from this node, and the record tells the supervisor which node
was sick and why.

Off unless configured: the job spec's `health.interval_s=300` (the loop's default, through
`ctx.health`), or `StepLoop(..., health=HealthMonitor(ctx, HealthConf(interval_s=300)))`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from slurmagent.config import HealthConf
from slurmagent.errors import ConfigError
from slurmagent.files import atomic_write
from slurmagent.primitives.env import TaskFile
from slurmagent.runtime.context import JobContext

log = logging.getLogger(__name__)

STOP_RECORD = TaskFile.HEALTH_STOP
HISTORY = TaskFile.HEALTH


class HealthMonitor:
    def __init__(
        self,
        ctx: JobContext,
        conf: HealthConf,
        clock: Callable[[], float] = time.monotonic,
        runner: Callable[..., Any] | None = None,
    ) -> None:
        if conf.interval_s < 0:
            raise ConfigError(f"health.interval_s={conf.interval_s} must be 0 (off) or positive")
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
        # every rank that sees its GPU fail writes it: the supervisor reads the node from here
        atomic_write(
            self.ctx.output_dir / STOP_RECORD,
            json.dumps({**record, "action": "checkpoint and requeue; exclude this node"}, default=str).encode(),
        )
        log.error("health check CRITICAL on %s at step %d: %s", self.ctx.node, step, "; ".join(result.reasons))
        return True


def monitor_for(ctx: JobContext) -> HealthMonitor | None:
    """The monitor the job's spec asks for (`ctx.health`), or None (off)."""
    return HealthMonitor(ctx, ctx.health) if ctx.health.interval_s > 0 else None
