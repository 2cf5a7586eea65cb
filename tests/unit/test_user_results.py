"""What a user's own training reports with `loop.report(...)` is in `results`: each metric's
last value, and its best where the name says which way is better. A real sweep of the user's
own module on the local backend, run from their directory."""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
from pathlib import Path

from slurmagent.supervise.views import better

TRAIN = """
from slurmagent.runtime import StepLoop, current


class State:
    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def train(cfg):
    loop = StepLoop(current(), State(), total_steps=4)
    for step in loop:
        acc = [0.5, 0.9, 0.7, 0.8][step] * cfg.lr  # peaks at step 1, ends lower
        loop.report(epoch=step + 1, val_acc=acc, loss=1.0 / (step + 1))
"""


def cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    return subprocess.run([sys.executable, "-m", "slurmagent", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def test_a_users_reported_metrics_are_columns_of_results(tmp_path: Path) -> None:
    """Was: `results SWEEP --sort val_acc --desc` → "not a column; columns: job, lr, result, runs,
    state, task" for a task that reports and returns nothing."""
    (tmp_path / "mytrain.py").write_text(TRAIN)
    sweep = tmp_path / "sweep"
    run = cli(["-m", "task.target=mytrain:train", "+lr=1,2", f"hydra.sweep.dir={sweep}",
               "hydra.launcher.poll_interval_s=0.2"], tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr
    out = cli(["results", str(sweep), "--sort", "val_acc", "--desc", "--csv"], tmp_path)
    assert out.returncode == 0, out.stderr
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    assert [r["+lr"] for r in rows] == ["2", "1"]  # sorted by the last val_acc, largest first
    assert [float(r["val_acc"]) for r in rows] == [1.6, 0.8]  # last value
    assert [float(r["val_acc.best"]) for r in rows] == [1.8, 0.9]  # best: higher is better for an accuracy
    assert [float(r["loss.best"]) for r in rows] == [0.25, 0.25]  # lower is better for a loss
    assert [float(r["epoch"]) for r in rows] == [4, 4] and "epoch.best" not in rows[0]


def test_which_way_is_better_is_read_from_the_name() -> None:
    assert [better(n) for n in ("val_acc", "train/loss", "val_error", "top1", "accuracy_loss", "lr", "epoch")] == [
        "max", "min", "min", "max", "min", None, None,
    ]  # fmt: skip
