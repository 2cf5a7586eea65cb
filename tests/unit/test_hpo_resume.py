"""A search trial stops at its rung, checkpointed, and a promotion resumes there: digits_mlp
stopped at 1 epoch, promoted to 3, then to 9, ends bit-identical to a straight 9-epoch run,
and no epoch runs twice."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from slurmagent.examples.digits import train
from slurmagent.runtime import context_from_env
from slurmagent.runtime.context import set_current


def digits(out: Path, stop_at: int) -> dict[str, Any]:
    cfg = OmegaConf.create(
        {
            "model": {"width": 32, "depth": 1},
            "optim": {"lr": 3e-3, "weight_decay": 0.0},
            "train": {"steps": 0, "epochs": 9, "batch_size": 64, "seed": 0, "step_delay_s": 0.0},
            "checkpoint": {"every_steps": 1000},
        }
    )
    set_current(replace(context_from_env({}, output_dir=out), stop_at=stop_at))
    try:
        return train(cfg)
    finally:
        set_current(None)


def epochs_reported(out: Path) -> list[int]:
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [int(line["epoch"]) for line in lines if "epoch" in line]


def test_a_promotion_resumes_its_rung_and_ends_as_a_straight_run(tmp_path: Path) -> None:
    straight = digits(tmp_path / "straight", 9)
    rung_1 = digits(tmp_path / "trial", 1)
    assert rung_1["epoch"] == 1 and rung_1["resumed_from"] is None
    rung_3 = digits(tmp_path / "trial", 3)
    assert rung_3["epoch"] == 3 and rung_3["resumed_from"] == 22  # 1 epoch = 22 steps
    promoted = digits(tmp_path / "trial", 9)
    assert promoted["resumed_from"] == 66 and promoted["epoch"] == 9
    assert promoted["state_hash"] == straight["state_hash"]  # bit-identical parameters
    assert promoted["val_error"] == straight["val_error"]
    assert epochs_reported(tmp_path / "trial") == list(range(1, 10))  # each epoch once: nothing redone
    assert epochs_reported(tmp_path / "straight") == list(range(1, 10))
