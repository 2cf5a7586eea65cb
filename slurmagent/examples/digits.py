"""digits_mlp: a torch MLP on the bundled digits data, deterministic on CPU.

Checkpoints through the runtime (model, optimiser, scheduler, RNG, data position), so a
preempted run resumes exactly; returns the validation accuracy. `adapt.enabled=true` turns on
the in-loop controller (runtime/adapt.py: gradient explosion, plateau of val_error); it then
reports each step's gradient norm (`grad_norm`).
"""

from __future__ import annotations

import logging
from importlib import resources
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from slurmagent.config import adapt_conf, checkpoint_conf, spec_dict
from slurmagent.runtime import StepLoop, current
from slurmagent.runtime.adapt import Controller
from slurmagent.runtime.torch_state import ResumableBatches, TorchState, state_hash

log = logging.getLogger(__name__)


def load_digits() -> tuple[torch.Tensor, torch.Tensor]:
    with resources.files("slurmagent.examples").joinpath("data/digits.npz").open("rb") as fh:
        data = np.load(fh)
        x = torch.tensor(data["images"], dtype=torch.float32) / 16.0
        y = torch.tensor(data["labels"], dtype=torch.long)
    return x, y


def build_model(width: int, depth: int) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    dim = 64
    for _ in range(depth):
        layers += [torch.nn.Linear(dim, width), torch.nn.ReLU()]
        dim = width
    layers.append(torch.nn.Linear(dim, 10))
    return torch.nn.Sequential(*layers)


def train(cfg: DictConfig) -> dict[str, Any]:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    seed = int(cfg.train.seed)
    torch.manual_seed(seed)
    x, y = load_digits()
    split = np.random.default_rng(12345).permutation(len(x))
    val_idx, train_idx = torch.tensor(split[:360]), torch.tensor(split[360:])
    x_train, y_train, x_val, y_val = x[train_idx], y[train_idx], x[val_idx], y[val_idx]

    model = build_model(int(cfg.model.width), int(cfg.model.depth))
    opt = torch.optim.Adam(model.parameters(), lr=float(cfg.optim.lr), weight_decay=float(cfg.optim.weight_decay))
    batches = ResumableBatches(len(x_train), int(cfg.train.batch_size), seed=seed)
    # train.epochs (the search's fidelity, hpo.fidelity.key) or train.steps sets the schedule's length
    epochs, per_epoch = int(cfg.train.get("epochs", 0) or 0), batches.per_epoch
    steps = epochs * per_epoch if epochs else int(cfg.train.steps)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    state = TorchState(model, opt, sched, batches)
    ck = checkpoint_conf(cfg)
    ctx = current()
    step_delay = float(cfg.train.get("step_delay_s", 0.0))
    # a search trial stops at its rung (hpo.stop_at epochs), checkpointed; a promotion resumes there
    adapt = adapt_conf(spec_dict(cfg, ("adapt",)).get("adapt"))
    controller = Controller(adapt, model, opt, sched) if adapt.enabled else None
    loop = StepLoop(ctx, state, total_steps=steps, conf=ck, steps_per_unit=per_epoch, adapt=controller)
    loss_fn = torch.nn.CrossEntropyLoss()

    def val_acc() -> float:
        """Validation accuracy; NaN once the weights are not finite (a diverged run: the search ranks it last)."""
        if not all(bool(torch.isfinite(p).all()) for p in model.parameters()):
            return float("nan")
        model.eval()
        with torch.no_grad():
            acc = float((model(x_val).argmax(1) == y_val).float().mean().item())
        model.train()
        return acc

    for step in loop:
        idx = batches.indices(step)
        model.train()
        opt.zero_grad()
        loss = loss_fn(model(x_train[idx]), y_train[idx])
        loss.backward()
        grad_norm = loop.observe(loss=loss)  # the in-loop controller's input (None when it is off)
        opt.step()
        sched.step()
        loop.report(loss=loss.item(), **({"grad_norm": grad_norm} if grad_norm is not None else {}))
        if (step + 1) % per_epoch == 0:  # an epoch ends: the validation error, the search's objective
            acc = val_acc()
            loop.report(epoch=(step + 1) // per_epoch, val_error=round(1 - acc, 6), val_acc=round(acc, 6))
        if step_delay:
            import time

            time.sleep(step_delay)  # lets tests and benchmarks preempt a run mid-way
    acc = val_acc()
    result = {
        "val_acc": round(acc, 6),
        "val_error": round(1 - acc, 6),
        "epoch": loop.step // per_epoch,
        "loss": round(loop.metrics.get("loss", float("nan")), 6),
        "steps": steps,
        "resumed_from": loop.restored_from,
        "attempt": ctx.attempt,
        "state_hash": state_hash(model),
    }
    log.info("digits_mlp done: %s", result)
    return result
