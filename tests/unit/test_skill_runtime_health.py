"""The runtime health check inside the StepLoop: periodic (by the loop's clock), recorded
in health.jsonl, and on CRITICAL a checkpoint, health_stop.json and a stop for requeue.
No NVIDIA GPU here: the skill reads recorded readings (tests/data/gpu_health) in place of NVML."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from slurmagent.config import CheckpointConf, HealthConf
from slurmagent.errors import ConfigError
from slurmagent.runtime import CheckpointManager, StepLoop, context_from_env
from slurmagent.runtime.health import HealthMonitor
from slurmagent.runtime.loop import StopForRequeue

DATA = Path(__file__).resolve().parents[1] / "data" / "gpu_health"


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.n}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.n = state["n"]


class Clock:
    """One second per call: the loop's and the monitor's time advance with the steps."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def run(tmp_path: Path, readings: str, interval: float) -> tuple[StepLoop, Counter]:
    ctx = replace(context_from_env({}, output_dir=tmp_path, checkpoint_dir=tmp_path / "ck"), node="t4-1", job_id="42")
    clock = Clock()
    monitor = HealthMonitor(
        ctx, HealthConf(interval, inputs={"readings_file": str(DATA / readings), "gpus": [0]}), clock
    )
    state = Counter()
    loop = StepLoop(
        ctx, state, 50, CheckpointConf(every_steps=100), clock=clock, install_signal_handlers=False, health=monitor
    )
    for _ in loop:
        state.n += 1
    return loop, state


def test_healthy_gpu_is_checked_periodically_and_recorded(tmp_path: Path) -> None:
    loop, state = run(tmp_path, "healthy.json", interval=10)
    assert state.n == 50 and loop.health is not None
    records = [json.loads(x) for x in (tmp_path / "health.jsonl").read_text().splitlines()]
    assert len(records) == loop.health.checks >= 3 and {r["status"] for r in records} == {"OK"}
    steps = [r["step"] for r in records]
    assert all(b - a >= 4 for a, b in itertools.pairwise(steps))  # ≥ 10 clock ticks apart, 2 per step
    assert not (tmp_path / "health_stop.json").exists()


def test_critical_gpu_checkpoints_records_and_stops_for_requeue(tmp_path: Path) -> None:
    with pytest.raises(StopForRequeue) as stop:
        run(tmp_path, "broken.json", interval=5)
    assert stop.value.reason == "health"
    step = stop.value.step
    assert 0 < step < 50
    entry, payload = CheckpointManager(tmp_path / "ck").latest() or (None, None)
    assert entry is not None and entry.step == step and payload["state"] == {"n": step}
    record = json.loads((tmp_path / "health_stop.json").read_text())
    assert record["status"] == "CRITICAL" and record["node"] == "t4-1" and record["job_id"] == "42"
    assert record["step"] == step and "uncorrected ECC" in record["reasons"][0]


def test_off_by_default_and_configured_by_the_job_spec(tmp_path: Path) -> None:
    ctx = context_from_env({}, output_dir=tmp_path)
    assert StepLoop(ctx, Counter(), 1, install_signal_handlers=False).health is None
    # the job spec's health.* reaches a child process's loop through SLURMAGENT_HEALTH
    spec = HealthConf(60.0, inputs={"readings_file": "x.json"})
    env = replace(ctx, health=spec).to_env()
    loop = StepLoop(context_from_env(env), Counter(), 1, install_signal_handlers=False)
    assert loop.health is not None and loop.health.conf == HealthConf(
        60.0, "gpu_health_check", {"readings_file": "x.json"}
    )
    with pytest.raises(ConfigError, match="SLURMAGENT_HEALTH"):
        context_from_env({"SLURMAGENT_HEALTH": "soon"})
    with pytest.raises(ConfigError, match="interval_s"):
        context_from_env({"SLURMAGENT_HEALTH": '{"interval_s": "soon"}'})
