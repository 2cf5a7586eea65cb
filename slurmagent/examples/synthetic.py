"""A synthetic workload: N steps of a fixed duration, checkpointing through the runtime.

For benchmarks and fault injection: the step time and count are configuration, the
state is a counter and a running checksum, so redone steps and exact resumption show.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from omegaconf import DictConfig, OmegaConf

from slurmagent.config import CheckpointConf, parse_conf
from slurmagent.runtime import StepLoop, current


class CounterState:
    def __init__(self) -> None:
        self.digest = hashlib.sha256(b"start").hexdigest()
        self.steps_run = 0  # steps executed in this process (redone ones included)

    def state_dict(self) -> dict[str, Any]:
        return {"digest": self.digest}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.digest = state["digest"]


def run(cfg: DictConfig) -> dict[str, Any]:
    syn = cfg.get("synthetic", {}) or {}
    steps = int(syn.get("steps", 100))
    step_time = float(syn.get("step_time_s", 0.0))
    timeline = bool(syn.get("timeline", False))  # each step's end time into metrics.jsonl (benchmarks)
    ck = parse_conf(CheckpointConf, OmegaConf.to_container(cfg.checkpoint, resolve=True), "checkpoint")  # type: ignore[arg-type]
    state = CounterState()
    # memory held for the whole run: lets tests drive a job over its --mem (a real cgroup OOM)
    ballast = bytearray(int(syn.get("alloc_mb", 0)) * 2**20)
    ballast[::4096] = b"x" * len(ballast[::4096])  # touch every page so it is really resident
    ctx = current()
    loop = StepLoop(ctx, state, total_steps=steps, conf=ck)
    for step in loop:
        if step_time:
            time.sleep(step_time)
        state.digest = hashlib.sha256(f"{state.digest}:{step}".encode()).hexdigest()
        state.steps_run += 1
        if timeline:
            loop.report(t=time.time(), attempt=ctx.attempt)
    return {
        "steps": steps,
        "digest": state.digest,
        "resumed_from": loop.restored_from,
        "attempt": ctx.attempt,
        "steps_run_here": state.steps_run,
    }
