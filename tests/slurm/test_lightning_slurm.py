"""The README's Lightning example on the real cluster, as a user runs it (tests/slurm/trainer_cases.py):
(a) `scontrol requeue` mid-run: the task ends with the weights of an uninterrupted run, bit for
bit, each step done once, its progress in `status` while it ran and its metrics in `results`;
(b) USR1, Lightning's own requeue signal, sent to a job whose `recovery.signal` is USR1: exactly one
requeue (ours), no Lightning hpc checkpoint; (c) a search of 3 trials, rungs 1 and 3 epochs: every
promoted trial resumes its rung checkpoint and trains only epochs 2 and 3."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainer_cases import (
    POLL,
    Example,
    check_exact_resume_after_scontrol_requeue,
    cli,
    epochs,
    finish,
    launch,
    running_job,
    scancel_signal,
    state,
    the_sweep,
    training_steps,
)

pytestmark = pytest.mark.slurm

LIGHTNING = Example(
    files=("lit.py", "conf/experiment/lit.yaml"),
    run="run-lit",
    slow="""
import time

import lit

_step = lit.Regression.training_step


def training_step(self, batch, batch_idx):
    time.sleep(0.01)
    return _step(self, batch, batch_idx)


lit.Regression.training_step = training_step
train = lit.train
""",
    steps_per_epoch=64,  # the README's example: 1024 samples, batches of 16
    checkpoints="lightning-step*.ckpt",
)


def test_the_readme_lightning_module_resumes_exactly_after_scontrol_requeue(home: Path, tmp_path: Path) -> None:
    check_exact_resume_after_scontrol_requeue(LIGHTNING, home, tmp_path, 5, "lr=", {"loss", "val_loss", "epoch"})


def test_usr1_is_requeued_once_by_slurmagent_and_never_by_lightning(home: Path) -> None:
    argv = LIGHTNING.project(home)
    proc = launch(home, *argv, "task.target=slow:train", "lr=0.01", "epochs=3", "recovery.signal=USR1")
    sweep = the_sweep(home)
    scancel_signal(running_job(sweep, 0, min_lines=40), "USR1")
    code, out = finish(proc)
    assert code == 0, out
    (task,) = state(sweep)["tasks"]
    assert task["state"] == "COMPLETED", task
    assert sum(a["restarts"] for a in task["attempts"]) == 1, task["attempts"]  # one requeue: ours
    log = (sweep / "0" / "task.log").read_text()
    assert "auto_requeue switched off" in log, log[-3000:]  # Lightning's requeue was armed, and disarmed
    assert "Handling auto-requeue signal" not in log, log[-3000:]
    assert not list(home.rglob("hpc_ckpt_*.ckpt")), "Lightning's own requeue handler saved a checkpoint"
    assert training_steps(sweep / "0") == list(range(1, 3 * LIGHTNING.steps_per_epoch + 1))


def test_a_lightning_search_promotes_by_resume_without_retraining_an_epoch(home: Path) -> None:
    argv = LIGHTNING.project(home)
    run = cli(
        home,
        *[a for a in argv if not a.startswith("lr=")],
        "hydra/sweeper=slurmagent_hpo",
        "lr=interval(0.005,0.1)",
        "hpo.fidelity.key=epochs",
        "hpo.fidelity.max=3",
        "hpo.objective=val_loss",
        "hpo.budget.trials=3",
        "hpo.max_parallel=3",
        *POLL,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    sweep = the_sweep(home)
    trials = json.loads((sweep / "hpo" / "trials.json").read_text())
    assert trials["rungs"] == [1, 3] and len(trials["trials"]) == 3, trials
    promoted = [t for t in trials["trials"] if t["promotions"]]  # how many: the order trials finish in decides
    assert promoted, trials
    assert trials["spent_epochs"] == sum(t["epochs"] for t in trials["trials"])  # no epoch trained twice
    for trial in promoted:
        assert trial["epochs"] == 3 and trial["task_state"] == "COMPLETED", trial
        task = sweep / str(trial["trial"])
        assert epochs(task) == [1, 2, 3]  # epoch 1 not trained again
        assert training_steps(task) == list(range(1, 3 * LIGHTNING.steps_per_epoch + 1))
        assert (task / "checkpoints" / f"lightning-step{LIGHTNING.steps_per_epoch:08d}.ckpt").exists()  # the rung's
