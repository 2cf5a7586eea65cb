"""The Hugging Face integrations (slurmagent/integrations/hf.py) with the real transformers and
accelerate on this machine's CPU, outside a job (the callback owns the stop signals; a stop exits
with the requeue code): a tiny BERT built from a config (nothing downloaded) trained by the
`Trainer`, and a loop of one's own under Accelerate. A real SIGUSR2 mid-epoch ends the run with a
checkpoint; the next run resumes it and ends with the uninterrupted run's weights, bit for bit,
each step once in the metrics; a stop in an epoch's last step waits for its evaluation; a train()
that forgets the checkpoint is refused; a search rung's checkpoint resumes exactly; the in-loop
controller decays the lr when gradients explode. The cluster test (tests/slurm/test_hf_slurm.py)
runs the README's Trainer example through the job wrapper."""

from __future__ import annotations

import hashlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from accelerate import Accelerator
from transformers import (  # the [hf] extra; [dev] installs it (tests/run)
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from slurmagent.errors import ConfigError
from slurmagent.integrations.hf import ACC_PREFIX, AcceleratedRun, Slurmagent
from slurmagent.primitives.env import REQUEUE_EXIT_CODE, JobEnv

STEPS_PER_EPOCH = 16  # 256 samples, batches of 16


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randint(0, 100, (n, 16), generator=g)
        self.y = self.x.sum(1) % 2

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.y[i]}


def bert() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
    )
    return BertForSequenceClassification(config)


def digest(model: torch.nn.Module) -> str:
    return hashlib.sha256(torch.cat([p.detach().flatten() for p in model.parameters()]).numpy().tobytes()).hexdigest()


class SignalAt(TrainerCallback):  # type: ignore[misc]
    """Sends this process a real signal during optimizer step `step` (as Slurm would, mid-step)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGUSR2)


class Exploding(Trainer):  # type: ignore[misc]
    """From step 8 on, the loss (and so every gradient) is 10,000× what it was: an explosion."""

    def compute_loss(
        self, model: Any, inputs: Any, return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        out = super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
        if return_outputs or self.state.global_step < 8:  # evaluation asks for the outputs too: left alone
            return out
        return out * 1e4


def train(epochs: int = 3, stop_at_step: int | None = None, **kw: Any) -> tuple[str, Slurmagent, Trainer]:
    max_grad_norm = kw.pop("max_grad_norm", 1.0)
    trainer_class = kw.pop("trainer_class", Trainer)
    sa = Slurmagent(**kw)
    args = TrainingArguments(
        output_dir=sa.output_dir,
        per_device_train_batch_size=16,
        num_train_epochs=epochs,
        learning_rate=1e-3,
        lr_scheduler_type="cosine",  # over the whole run's steps: a resumed run must land on the same lr
        seed=0,
        save_strategy="no",
        eval_strategy="epoch",
        logging_steps=1,
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        max_grad_norm=max_grad_norm,
    )
    callbacks = [sa] + ([SignalAt(stop_at_step)] if stop_at_step is not None else [])
    trainer = trainer_class(
        model=bert(), args=args, train_dataset=Tokens(256, 0), eval_dataset=Tokens(64, 1), callbacks=callbacks
    )
    trainer.train(resume_from_checkpoint=sa.resume_from)
    return digest(trainer.model), sa, trainer


def rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def uninterrupted(task: Path, run: Any) -> str:
    reference: str = run()[0]
    os.rename(task, task.with_name("reference"))
    return reference


def test_a_stop_signal_ends_the_trainer_with_a_checkpoint_and_the_next_run_resumes_bit_identically(task: Path) -> None:
    reference = uninterrupted(task, train)
    with pytest.raises(SystemExit) as stopped:
        train(stop_at_step=21)  # mid-epoch 2
    assert stopped.value.code == REQUEUE_EXIT_CODE
    assert [p.name for p in (task / "checkpoints").iterdir()] == ["checkpoint-22"]  # step 22 finished first

    resumed, sa, _ = train()
    assert sa.resume_from is not None and sa.resume_from.endswith("checkpoint-22")
    assert resumed == reference
    losses = [r["step"] for r in rows(task) if "loss" in r and "epoch" not in r]
    assert losses == list(range(1, 3 * STEPS_PER_EPOCH + 1))  # each step once
    epochs = [r for r in rows(task) if "epoch" in r]
    assert [r["epoch"] for r in epochs] == [1, 2, 3] and all("eval_loss" in r for r in epochs)


def test_a_stop_in_an_epochs_last_step_waits_for_its_evaluation(task: Path) -> None:
    reference = uninterrupted(task, train)
    with pytest.raises(SystemExit):
        train(stop_at_step=STEPS_PER_EPOCH - 1)
    assert [p.name for p in (task / "checkpoints").iterdir()] == [f"checkpoint-{STEPS_PER_EPOCH}"]
    assert [r["epoch"] for r in rows(task) if "epoch" in r] == [1]  # evaluated before the stop
    assert train()[0] == reference
    assert [r["epoch"] for r in rows(task) if "epoch" in r] == [1, 2, 3]


class SignalAtInit(TrainerCallback):
    """A stop signal before the first step (Slurm's warning while the job still set up)."""

    def on_init_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        os.kill(os.getpid(), signal.SIGUSR2)


def test_a_stop_before_the_first_step_ends_the_run_with_nothing_saved(task: Path) -> None:
    sa = Slurmagent()
    args = TrainingArguments(
        output_dir=sa.output_dir, report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no"
    )
    trainer = Trainer(model=bert(), args=args, train_dataset=Tokens(32, 0), callbacks=[sa, SignalAtInit()])
    with pytest.raises(SystemExit) as stopped:
        trainer.train(resume_from_checkpoint=sa.resume_from)
    assert stopped.value.code == REQUEUE_EXIT_CODE and trainer.state.global_step == 0
    assert not (task / "checkpoints").exists() or not list((task / "checkpoints").iterdir())


def test_a_stop_in_the_last_step_lets_the_run_finish(task: Path) -> None:
    train(stop_at_step=3 * STEPS_PER_EPOCH - 1)  # returns: no stop for requeue
    assert not (task / "checkpoints").exists() or not list((task / "checkpoints").iterdir())  # nothing to resume
    assert [r["epoch"] for r in rows(task) if "epoch" in r] == [1, 2, 3]


def test_a_train_without_the_checkpoint_is_refused(task: Path) -> None:
    with pytest.raises(SystemExit):
        train(stop_at_step=5)
    sa = Slurmagent()
    args = TrainingArguments(
        output_dir=sa.output_dir, report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no"
    )
    trainer = Trainer(model=bert(), args=args, train_dataset=Tokens(32, 0), callbacks=[sa])
    with pytest.raises(ConfigError, match=r"started at step 0.*resume_from"):
        trainer.train()


def test_a_search_rung_checkpoint_resumes_to_the_uninterrupted_weights(
    task: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = uninterrupted(task, train)
    monkeypatch.setenv(JobEnv.STOP_AT, "1")
    train()
    assert [p.name for p in (task / "checkpoints").iterdir()] == [f"checkpoint-{STEPS_PER_EPOCH}"]
    monkeypatch.setenv(JobEnv.STOP_AT, "3")
    assert train()[0] == reference
    assert [r["epoch"] for r in rows(task) if "epoch" in r] == [1, 2, 3]


def test_the_in_loop_controller_sees_a_gradient_explosion_through_the_trainer(task: Path) -> None:
    adapt = {  # the Trainer's schedules are LambdaLRs, which a warm restart refuses (a clear error): plateau off
        "enabled": True,
        "explosion": {"enabled": True, "warmup": 5, "patience": 2, "factor": 3.0},
        "plateau": {"enabled": False},
    }
    _, _, trainer = train(epochs=1, adapt=adapt, max_grad_norm=0.0, trainer_class=Exploding)  # unclipped norms
    records = [json.loads(line) for line in (task / "adapt.jsonl").read_text().splitlines()]
    decays = [r for r in records if r["kind"] == "decay_lr"]
    assert decays and decays[0]["decision"] == "local" and decays[0]["applied"], records
    assert decays[0]["step"] >= 9  # after two suspect steps in a row
    assert trainer.optimizer.param_groups[0]["lr"] < 1e-3 * 0.5  # decayed (and the cosine goes on from there)


def test_a_stop_at_the_search_rungs_epoch_ends_the_trial_at_the_rung_not_for_a_requeue(
    task: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = uninterrupted(task, train)
    monkeypatch.setenv(JobEnv.STOP_AT, "1")
    train(stop_at_step=STEPS_PER_EPOCH - 1)  # the signal in the rung epoch's last step: returns, no requeue
    assert [p.name for p in (task / "checkpoints").iterdir()] == [f"checkpoint-{STEPS_PER_EPOCH}"]
    monkeypatch.setenv(JobEnv.STOP_AT, "3")  # promoted
    assert train()[0] == reference


def test_an_output_dir_outside_the_task_is_refused_in_a_job(
    task: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(JobEnv.BACKEND, "local")
    shared = tmp_path / "shared-checkpoints"
    sa = Slurmagent()
    args = TrainingArguments(output_dir=str(shared), report_to=[], use_cpu=True, disable_tqdm=True)
    with pytest.raises(ConfigError, match=r"output_dir=.*shared-checkpoints.*outside this task's directory"):
        Trainer(model=bert(), args=args, train_dataset=Tokens(32, 0), callbacks=[sa])
    assert not shared.exists() or not list(
        shared.iterdir()
    )  # nothing trained, nothing written (the Trainer makes the folder)


def test_the_stop_signals_mean_what_they_meant_once_training_is_over(task: Path) -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGUSR2, signal.SIGTERM)}
    train(epochs=1)
    assert {sig: signal.getsignal(sig) for sig in before} == before
    accelerate_loop(epochs=1)
    assert {sig: signal.getsignal(sig) for sig in before} == before


# -- Accelerate ------------------------------------------------------------------------------------


def accelerate_loop(epochs: int = 3, stop_at_step: int | None = None, adapt: Any = None, explode_at: int = -1) -> str:
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = bert()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(Tokens(256, 0), batch_size=16, shuffle=True)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs * STEPS_PER_EPOCH)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    run = AcceleratedRun(accelerator, steps_per_epoch=len(loader), adapt=adapt)
    run.resume(model, optimizer, scheduler)
    for _ in run.epochs(epochs):
        for batch in run.batches(loader):
            if stop_at_step is not None and run.step_count == stop_at_step:
                os.kill(os.getpid(), signal.SIGUSR2)
            optimizer.zero_grad()
            loss = model(**batch).loss * (1e4 if 0 <= explode_at <= run.step_count else 1)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            run.step(loss=loss.item())
        run.epoch_end(lr=scheduler.get_last_lr()[0])
    return digest(model)


def test_an_accelerate_loop_stopped_mid_epoch_resumes_bit_identically(task: Path) -> None:
    reference = uninterrupted(task, lambda: (accelerate_loop(),))
    with pytest.raises(SystemExit) as stopped:
        accelerate_loop(stop_at_step=21)
    assert stopped.value.code == REQUEUE_EXIT_CODE
    assert [p.name for p in (task / "checkpoints").iterdir()] == [f"{ACC_PREFIX}{22:08d}"]
    assert accelerate_loop() == reference
    steps = [r["step"] for r in rows(task) if "loss" in r and "epoch" not in r]
    assert steps == list(range(1, 3 * STEPS_PER_EPOCH + 1))
    assert [r["epoch"] for r in rows(task) if "epoch" in r] == [1, 2, 3]


def test_an_accelerate_search_rung_resumes_bit_identically(task: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reference = uninterrupted(task, lambda: (accelerate_loop(),))
    monkeypatch.setenv(JobEnv.STOP_AT, "1")
    accelerate_loop()
    assert [p.name for p in (task / "checkpoints").iterdir()] == [f"{ACC_PREFIX}{STEPS_PER_EPOCH:08d}"]
    monkeypatch.setenv(JobEnv.STOP_AT, "3")
    assert accelerate_loop() == reference


def test_the_in_loop_controller_acts_in_an_accelerate_loop(task: Path) -> None:
    adapt = {"enabled": True, "explosion": {"enabled": True, "warmup": 5, "patience": 2, "factor": 10.0}}
    accelerate_loop(epochs=1, adapt=adapt, explode_at=8)  # from step 8 the loss is 10,000× its level
    records = [json.loads(line) for line in (task / "adapt.jsonl").read_text().splitlines()]
    decays = [r for r in records if r["kind"] == "decay_lr"]
    assert decays and decays[0]["decision"] == "local" and decays[0]["applied"], records
    assert decays[0]["step"] >= 9


def test_an_accelerate_stop_in_the_last_epochs_last_step_lets_the_run_finish(task: Path) -> None:
    reference = uninterrupted(task, lambda: (accelerate_loop(),))
    assert accelerate_loop(stop_at_step=3 * STEPS_PER_EPOCH - 1) == reference  # returns: nothing to requeue
    assert not (task / "checkpoints").exists() or not list((task / "checkpoints").iterdir())


def test_an_accelerate_stop_at_the_rungs_epoch_ends_at_the_rung(task: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reference = uninterrupted(task, lambda: (accelerate_loop(),))
    monkeypatch.setenv(JobEnv.STOP_AT, "1")
    accelerate_loop(stop_at_step=STEPS_PER_EPOCH - 1)  # the signal in the rung epoch's last step: returns
    assert [p.name for p in (task / "checkpoints").iterdir()] == [f"{ACC_PREFIX}{STEPS_PER_EPOCH:08d}"]
    monkeypatch.setenv(JobEnv.STOP_AT, "3")
    assert accelerate_loop() == reference
