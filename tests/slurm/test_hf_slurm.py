"""The README's Hugging Face Trainer example on the real cluster, as a user runs it
(tests/slurm/trainer_cases.py): `scontrol requeue` mid-run, past its first epoch; the task ends
with the weights of an uninterrupted run, bit for bit (the Trainer restores model, optimizer,
scheduler and RNG states and skips the batches it has seen), each step once in its metrics, its
progress in `status` while it ran and its metrics in `results`."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_cases import Example, check_exact_resume_after_scontrol_requeue

pytestmark = pytest.mark.slurm

HF = Example(
    files=("hf_train.py", "conf/experiment/hf.yaml"),
    run="run-hf",
    slow="""
import time

import hf_train
import transformers

_step = transformers.Trainer.training_step


def training_step(self, *args, **kwargs):
    time.sleep(0.02)
    return _step(self, *args, **kwargs)


transformers.Trainer.training_step = training_step
train = hf_train.train
""",
    steps_per_epoch=64,  # the README's example: 1024 samples, batches of 16
    checkpoints="checkpoint-*",
)


def test_the_readme_hf_trainer_resumes_exactly_after_scontrol_requeue(home: Path, tmp_path: Path) -> None:
    check_exact_resume_after_scontrol_requeue(HF, home, tmp_path, 4, "lr=", {"loss", "eval_loss", "epoch"})
