"""The Lightning callback (slurmagent/integrations/lightning.py) with the real Lightning on this
machine's CPU, outside a job (a child's protocol: the callback owns the stop signals and a stop
exits with the requeue code): a real SIGUSR2 mid-epoch saves at the next step boundary and exits
75; the next run resumes from that checkpoint and ends with the uninterrupted run's weights, bit
for bit; a fit that forgets `ckpt_path` is refused; a search rung stops with a checkpoint; USR1
with Lightning's auto_requeue armed is acted on once, by us; the in-loop controller decays the lr
of a run whose gradients explode. The cluster tests (tests/slurm/test_lightning_slurm.py) run the
README's module through the job wrapper."""

from __future__ import annotations

import hashlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl  # the [lightning] extra; [dev] installs it (tests/run)
import torch
from pytorch_lightning.plugins.environments import SLURMEnvironment
from torchdata.stateful_dataloader import StatefulDataLoader

from slurmagent.errors import ConfigError
from slurmagent.integrations.lightning import PREFIX, Slurmagent
from slurmagent.primitives.env import REQUEUE_EXIT_CODE, JobEnv

# Lightning's advice to users (use srun, add dataloader workers, …), not errors of ours
# (and torchdata 0.11's call of an API torch 2.13 deprecates), not errors of ours
pytestmark = [
    pytest.mark.filterwarnings("ignore::lightning_fabric.utilities.warnings.PossibleUserWarning"),
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning"),
    pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning"),
]
STEPS_PER_EPOCH = 16  # 256 samples, batches of 16


class Net(pl.LightningModule):
    def __init__(self, explode_at: int = -1) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1)
        )
        self.explode_at = explode_at

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        if self.global_step >= self.explode_at >= 0:
            loss = loss * 1e4  # gradients 10,000× their level: an explosion
        self.log("loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 10)}


class SignalAt(pl.Callback):
    """Sends this process a real signal during training step `step` (as Slurm would, mid-step)."""

    def __init__(self, step: int, signum: int = signal.SIGUSR2) -> None:
        self.step, self.signum = step, signum

    def on_train_batch_start(self, trainer: pl.Trainer, *_: Any) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


def fit(
    epochs: int = 3, callbacks: tuple[Any, ...] = (), plugins: tuple[Any, ...] = (), **kw: Any
) -> tuple[str, Slurmagent, Net]:
    pl.seed_everything(0, verbose=False)
    x = torch.randn(320, 4, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    train, val = torch.utils.data.random_split(data, [256, 64], generator=torch.Generator().manual_seed(0))
    model = Net(explode_at=kw.pop("explode_at", -1))
    loader = kw.pop("loader", StatefulDataLoader)
    trainer_kw = kw.pop("trainer", {})
    sa = Slurmagent(**kw)
    trainer = pl.Trainer(
        max_epochs=epochs,
        callbacks=[sa, *callbacks],
        plugins=list(plugins),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
        default_root_dir=Path(os.environ["SLURMAGENT_OUTPUT_DIR"]).parent,  # where Lightning's own hpc_ckpt would go
        **trainer_kw,
    )
    trainer.fit(
        model,
        loader(train, batch_size=16, shuffle=True),
        loader(val, batch_size=64),
        ckpt_path=sa.resume_from,
    )
    weights = torch.cat([p.detach().flatten() for p in model.parameters()]).numpy().tobytes()
    return hashlib.sha256(weights).hexdigest(), sa, model


def rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_stop_signal_saves_at_the_step_boundary_and_the_next_run_resumes_bit_identically(task: Path) -> None:
    reference, _, _ = fit()
    os.rename(task, task.with_name("reference"))

    with pytest.raises(SystemExit) as stopped:
        fit(callbacks=(SignalAt(21),))  # mid-epoch 2
    assert stopped.value.code == REQUEUE_EXIT_CODE
    assert [p.name for p in (task / "checkpoints").iterdir()] == [f"{PREFIX}{22:08d}.ckpt"]  # step 21 finished first

    resumed, sa, _ = fit()
    assert sa.resume_from is not None and sa.resume_from.endswith(f"{PREFIX}{22:08d}.ckpt")
    assert resumed == reference
    steps = [r["step"] for r in rows(task) if "epoch" not in r and "loss" in r]
    assert steps == list(range(1, 3 * STEPS_PER_EPOCH + 1))  # each step once
    assert [r["epoch"] for r in rows(task) if "epoch" in r] == [1, 2, 3]
    assert all("val_loss" not in r for r in rows(task) if "epoch" not in r and "loss" in r)  # no stale values


def test_with_a_plain_dataloader_no_step_is_redone_but_the_resumed_epoch_draws_other_batches(task: Path) -> None:
    """The documented difference (docs/trainers.md): a DataLoader that cannot save its place lets
    Lightning finish the epoch's remaining steps from a fresh iterator — each step once, the
    epochs' lines in order, but not the batches an uninterrupted run would have seen."""
    reference, _, _ = fit(loader=torch.utils.data.DataLoader)
    os.rename(task, task.with_name("reference"))
    with pytest.raises(SystemExit):
        fit(callbacks=(SignalAt(21),), loader=torch.utils.data.DataLoader)
    resumed, _, _ = fit(loader=torch.utils.data.DataLoader)
    steps = [r["step"] for r in rows(task) if "epoch" not in r and "loss" in r]
    assert steps == list(range(1, 3 * STEPS_PER_EPOCH + 1))  # steps redone: 0
    assert [r["epoch"] for r in rows(task) if "epoch" in r] == [1, 2, 3]
    assert resumed != reference  # StatefulDataLoader (the test above) makes it exact


def test_a_stop_at_an_epoch_end_resumes_bit_identically(task: Path) -> None:
    reference, _, _ = fit()
    os.rename(task, task.with_name("reference"))
    with pytest.raises(SystemExit):
        fit(callbacks=(SignalAt(STEPS_PER_EPOCH - 1),))  # during the epoch's last step: saved at its end
    (saved,) = (task / "checkpoints").iterdir()
    assert saved.name == f"{PREFIX}{STEPS_PER_EPOCH:08d}.ckpt"
    assert fit()[0] == reference


class SignalAtFitStart(pl.Callback):
    """A stop signal before the first step (Slurm's warning while the job still imported)."""

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        os.kill(os.getpid(), signal.SIGUSR2)


def test_a_stop_before_the_first_step_ends_the_run_with_nothing_saved(task: Path) -> None:
    with pytest.raises(SystemExit) as stopped:
        fit(callbacks=(SignalAtFitStart(),))
    assert stopped.value.code == REQUEUE_EXIT_CODE
    assert not (task / "checkpoints").exists() or not list((task / "checkpoints").iterdir())
    assert not (task / "metrics.jsonl").exists()  # not one step trained


def test_a_stop_in_the_last_step_lets_the_fit_finish(task: Path) -> None:
    fit(callbacks=(SignalAt(3 * STEPS_PER_EPOCH - 1),))  # returns: no stop for requeue
    assert not (task / "checkpoints").exists() or not list((task / "checkpoints").iterdir())  # nothing to resume
    assert [r["epoch"] for r in rows(task) if "epoch" in r] == [1, 2, 3]


def test_a_fit_without_ckpt_path_while_a_checkpoint_exists_is_refused(task: Path) -> None:
    with pytest.raises(SystemExit):
        fit(callbacks=(SignalAt(5),))
    sa = Slurmagent()
    assert sa.resume_from is not None
    trainer = pl.Trainer(
        max_epochs=1, callbacks=[sa], logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    x = torch.randn(32, 4)
    with pytest.raises(ConfigError, match=r"ckpt_path=None.*resume_from"):
        trainer.fit(Net(), torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x[:, :1]), batch_size=8))


@pytest.mark.parametrize("signal_at", [None, STEPS_PER_EPOCH - 1], ids=["no-signal", "signal-in-the-rungs-last-step"])
def test_a_search_rung_stops_after_its_epoch_with_a_checkpoint_the_promotion_resumes(
    task: Path, monkeypatch: pytest.MonkeyPatch, signal_at: int | None
) -> None:
    """With a stop signal in the rung epoch's last step too: the rung ends the trial, no requeue
    that would train past it."""
    reference, _, _ = fit()
    os.rename(task, task.with_name("reference"))
    monkeypatch.setenv(JobEnv.STOP_AT, "1")
    fit(callbacks=(SignalAt(signal_at),) if signal_at is not None else ())  # returns: the rung is an end
    assert [p.name for p in (task / "checkpoints").iterdir()] == [f"{PREFIX}{STEPS_PER_EPOCH:08d}.ckpt"]
    assert [r["epoch"] for r in rows(task) if "epoch" in r] == [1]
    monkeypatch.setenv(JobEnv.STOP_AT, "3")
    promoted, _, _ = fit()
    assert promoted == reference
    assert [r["epoch"] for r in rows(task) if "epoch" in r] == [1, 2, 3]  # epoch 1 trained once


def test_usr1_with_lightnings_auto_requeue_armed_is_acted_on_once_by_us(
    task: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "4242")  # Lightning's own handler would requeue this id
    environment = SLURMEnvironment(auto_requeue=True)
    with caplog.at_level("INFO"), pytest.raises(SystemExit) as stopped:
        fit(callbacks=(SignalAt(5, signal.SIGUSR1),), plugins=(environment,))
    assert stopped.value.code == REQUEUE_EXIT_CODE
    assert environment.auto_requeue is False
    assert "auto_requeue switched off" in caplog.text
    assert "Handling auto-requeue signal" not in caplog.text  # Lightning's handler never ran
    assert not list(task.parent.rglob("hpc_ckpt_*.ckpt"))
    assert len(list((task / "checkpoints").iterdir())) == 1


def test_the_in_loop_controller_decays_the_lr_when_gradients_explode(task: Path) -> None:
    adapt = {"enabled": True, "explosion": {"enabled": True, "warmup": 5, "patience": 2, "factor": 10.0}}
    _, sa, _ = fit(epochs=1, adapt=adapt, explode_at=8)
    records = [json.loads(line) for line in (task / "adapt.jsonl").read_text().splitlines()]
    decays = [r for r in records if r["kind"] == "decay_lr"]
    assert decays and decays[0]["decision"] == "local" and decays[0]["applied"], records
    assert decays[0]["step"] >= 9  # after two suspect steps in a row
    assert sa.bridge.controller is not None and sa.bridge.controller.explosion_granted >= 1


class SigtermAtSanityCheck(pl.Callback):
    def on_sanity_check_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_during_the_sanity_check_is_a_stop_for_requeue_not_an_exit_0(task: Path) -> None:
    with pytest.raises(SystemExit) as stopped:  # Lightning's own handler would end it with SIGTERMException (code None)
        fit(callbacks=(SigtermAtSanityCheck(),))
    assert stopped.value.code == REQUEUE_EXIT_CODE


def test_with_gradient_accumulation_a_stop_lands_on_an_optimizer_step_and_resumes_exactly(task: Path) -> None:
    accumulate = {"accumulate_grad_batches": 2}
    reference, _, _ = fit(trainer=accumulate)
    os.rename(task, task.with_name("reference"))
    with pytest.raises(SystemExit):
        fit(callbacks=(SignalAt(5),), trainer=accumulate)  # during the micro-batches of optimizer step 6
    (saved,) = (task / "checkpoints").iterdir()
    assert saved.name == f"{PREFIX}{6:08d}.ckpt"
    assert fit(trainer=accumulate)[0] == reference
    steps = [r["step"] for r in rows(task) if "loss" in r and "epoch" not in r]
    assert steps == list(range(1, 3 * STEPS_PER_EPOCH // 2 + 1))  # one line per optimizer step, each once


def test_a_stop_in_the_last_step_of_max_steps_mid_epoch_lets_the_fit_finish(task: Path) -> None:
    fit(callbacks=(SignalAt(19),), trainer={"max_steps": 20})  # returns
    assert not (task / "checkpoints").exists() or not list((task / "checkpoints").iterdir())


def test_resume_falls_back_to_the_newest_checkpoint_lightning_reads(task: Path) -> None:
    with pytest.raises(SystemExit):
        fit(callbacks=(SignalAt(5),))
    (task / "checkpoints" / "notes.json").write_text('{"step": 999}')  # newer, but not a Lightning checkpoint
    assert Slurmagent().resume_from == str(task / "checkpoints" / f"{PREFIX}{6:08d}.ckpt")


def test_after_the_fit_the_stop_signals_mean_what_they_meant_before(task: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    fit(epochs=1)
    assert signal.getsignal(signal.SIGTERM) == before


def test_an_epochs_line_holds_only_what_was_logged_during_it(task: Path) -> None:
    fit(trainer={"check_val_every_n_epoch": 2})
    lines = {r["epoch"]: r for r in rows(task) if "epoch" in r}
    assert "val_loss" not in lines[1] and "val_loss" in lines[2] and "val_loss" not in lines[3], lines
