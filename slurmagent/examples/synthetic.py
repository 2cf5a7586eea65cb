"""A synthetic workload: N steps of a fixed duration, checkpointing through the runtime.

For benchmarks and fault injection: the step time and count are configuration, the
state is a counter and a running checksum, so redone steps and exact resumption show.

With `synthetic.epochs` > 0 it is also a cheap search target: `synthetic.steps_per_epoch`
steps make an epoch, and each epoch reports `val_error = (x − 0.3)² + 0.5 / epoch` for the
parameter `synthetic.x` (NaN from the second epoch on when x > 0.9: a diverged run).
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from omegaconf import DictConfig

from slurmagent.config import checkpoint_conf
from slurmagent.runtime import StepLoop, current


class CounterState:
    def __init__(self) -> None:
        self.digest = hashlib.sha256(b"start").hexdigest()
        self.steps_run = 0  # steps executed in this process (redone ones included)

    def state_dict(self) -> dict[str, Any]:
        return {"digest": self.digest}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.digest = state["digest"]


def _ballast(mb: int) -> bytearray:
    block = bytearray(mb * 2**20)
    block[::4096] = b"x" * len(block[::4096])  # touch every page so it is really resident
    return block


def synthetic_error(x: float, epoch: int) -> float:
    """The synthetic search target's validation error after `epoch` epochs."""
    return float("nan") if x > 0.9 and epoch > 1 else round((x - 0.3) ** 2 + 0.5 / epoch, 6)


def run(cfg: DictConfig) -> dict[str, Any]:
    syn = cfg.get("synthetic", {}) or {}
    epochs, per_epoch = int(syn.get("epochs", 0) or 0), int(syn.get("steps_per_epoch", 2) or 2)
    steps = epochs * per_epoch if epochs else int(syn.get("steps", 100))
    x = float(syn.get("x", 0.5))
    step_time = float(syn.get("step_time_s", 0.0))
    timeline = bool(syn.get("timeline", False))  # each step's end time into metrics.jsonl (benchmarks)
    ck = checkpoint_conf(cfg)
    state = CounterState()
    # memory held from step `alloc_at_step` (0: before the first) to the end: lets tests drive
    # a job over its --mem mid-run (a real cgroup OOM) after some checkpoints were written
    alloc_mb, alloc_at = int(syn.get("alloc_mb", 0)), int(syn.get("alloc_at_step", 0))
    ballast = _ballast(alloc_mb) if alloc_at <= 0 else bytearray()
    ctx = current()
    loop = StepLoop(ctx, state, total_steps=steps, conf=ck, steps_per_unit=per_epoch if epochs else None)
    for step in loop:
        if step == alloc_at and alloc_at > 0:
            ballast = _ballast(alloc_mb)
        if step_time:
            time.sleep(step_time)
        state.digest = hashlib.sha256(f"{state.digest}:{step}".encode()).hexdigest()
        state.steps_run += 1
        # one metrics.jsonl line per step run (redone steps show); with the timeline, its end time too
        if timeline:
            loop.report(steps_run_here=state.steps_run, t=time.time(), attempt=ctx.attempt)
        else:
            loop.report(steps_run_here=state.steps_run)
        if epochs and (step + 1) % per_epoch == 0:  # an epoch ends: the search's objective
            loop.report(epoch=(step + 1) // per_epoch, val_error=synthetic_error(x, (step + 1) // per_epoch))
    del ballast
    reached = loop.step // per_epoch
    return {
        "steps": steps,
        "digest": state.digest,
        "state_hash": state.digest,  # the whole state: equal hashes = bit-identical runs
        "resumed_from": loop.restored_from,
        "attempt": ctx.attempt,
        "steps_run_here": state.steps_run,
        **({"epoch": reached, "val_error": synthetic_error(x, reached)} if epochs else {}),
    }
