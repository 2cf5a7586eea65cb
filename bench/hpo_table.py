"""The tabular HPO benchmark: real training curves of a small MLP on the digits data, for a
finite grid of configurations, three seeds each, recorded after every epoch.

    .venv/bin/python bench/hpo_table.py [--out bench/data/hpo_table.json.gz] [--verify-resume]

What is measured, for every configuration of the grid and every seed: the validation error
(1 - accuracy on the project's 360-sample validation split, rounded to 6 digits) after each
of 20 epochs, and the wall time of each epoch (one pass over the 1,437 training samples in
batches of 64, shuffled by a generator seeded with the seed, then the validation pass).

Grid: learning rate (12 values log-spaced from 1e-4 to 1.0) x width (32, 64, 128, 256) x
depth (1, 2, 3 hidden layers) x optimiser (adam; sgd with momentum 0.9; rmsprop), 432
configurations. The learning rate is constant (no schedule), so a run stopped at epoch k
and resumed from its state is the same run as an uninterrupted one (`--verify-resume`
checks this for one configuration). A run *diverges* when a training loss is NaN or
infinite: its validation error is null (NaN) from that epoch on; the run goes on (a user
who does not watch the loss pays for those epochs), so its epoch times are real.

Everything is deterministic: one thread, `torch.use_deterministic_algorithms(True)`,
`torch.manual_seed(seed)` before the model is built, a `torch.Generator` seeded with the
seed for the data order. bench/hpo_replay.py replays optimisers against the table;
bench/README.md describes both and the figures measured with them.

Output (gzipped JSON): {"meta": {grid, seeds, epochs, versions, generated_at, total_cpu_s,
...}, "configs": [{"params": {"lr", "width", "depth", "optimizer"}, "val_error": [[20 x
float | null] x 3 seeds], "epoch_s": [[20 x float] x 3 seeds]}]}.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import gzip
import itertools
import json
import math
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from slurmagent.examples.digits import build_model, load_digits

BENCH = Path(__file__).resolve().parent
DEFAULT_OUT = BENCH / "data" / "hpo_table.json.gz"

LEARNING_RATES: list[float] = [float(f"{10 ** (-4 + 4 * i / 11):.6g}") for i in range(12)]
WIDTHS: list[int] = [32, 64, 128, 256]
DEPTHS: list[int] = [1, 2, 3]
OPTIMIZERS: list[str] = ["adam", "sgd", "rmsprop"]
SEEDS: list[int] = [0, 1, 2]
EPOCHS = 20
BATCH_SIZE = 64
SGD_MOMENTUM = 0.9


@dataclass(frozen=True)
class Config:
    lr: float
    width: int
    depth: int
    optimizer: str

    def params(self) -> dict[str, Any]:
        return {"lr": self.lr, "width": self.width, "depth": self.depth, "optimizer": self.optimizer}


@dataclass(frozen=True)
class Data:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor


def grid() -> list[Config]:
    """The configurations, in the order they are stored (optimiser, depth, width, lr)."""
    return [
        Config(lr, width, depth, name)
        for name, depth, width, lr in itertools.product(OPTIMIZERS, DEPTHS, WIDTHS, LEARNING_RATES)
    ]


def load_data() -> Data:
    """The digits data with the project's validation split (360 validation samples)."""
    x, y = load_digits()
    split = np.random.default_rng(12345).permutation(len(x))
    val, train = torch.tensor(split[:360]), torch.tensor(split[360:])
    return Data(x[train], y[train], x[val], y[val])


def make_optimizer(config: Config, model: torch.nn.Module) -> torch.optim.Optimizer:
    if config.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=config.lr)
    if config.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=config.lr, momentum=SGD_MOMENTUM)
    if config.optimizer == "rmsprop":
        return torch.optim.RMSprop(model.parameters(), lr=config.lr)
    raise ValueError(f"unknown optimizer {config.optimizer!r}")


class Run:
    """One training run of one configuration and seed, advanced one epoch at a time."""

    def __init__(self, config: Config, seed: int, data: Data) -> None:
        self.data = data
        torch.manual_seed(seed)
        self.model = build_model(config.width, config.depth)
        self.opt = make_optimizer(config, self.model)
        self.order = torch.Generator().manual_seed(seed)
        self.loss_fn = torch.nn.CrossEntropyLoss()
        self.diverged = False
        self.epoch = 0

    def train_epoch(self) -> float:
        """One pass over the training data; returns the validation error after it (NaN once
        the run has diverged)."""
        n = len(self.data.x_train)
        perm = torch.randperm(n, generator=self.order)
        self.model.train()
        for start in range(0, n, BATCH_SIZE):
            idx = perm[start : start + BATCH_SIZE]
            self.opt.zero_grad()
            loss = self.loss_fn(self.model(self.data.x_train[idx]), self.data.y_train[idx])
            if not math.isfinite(loss.item()):
                self.diverged = True
            loss.backward()
            self.opt.step()
        self.epoch += 1
        if self.diverged:
            return math.nan
        self.model.eval()
        with torch.no_grad():
            correct = float((self.model(self.data.x_val).argmax(1) == self.data.y_val).float().mean().item())
        return round(1.0 - correct, 6)

    def state(self) -> dict[str, Any]:
        """What a checkpoint would hold: parameters, optimiser, data order, divergence flag."""
        return copy.deepcopy(
            {
                "model": self.model.state_dict(),
                "opt": self.opt.state_dict(),
                "order": self.order.get_state(),
                "diverged": self.diverged,
                "epoch": self.epoch,
            }
        )

    def restore(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        self.order.set_state(state["order"])
        self.diverged = bool(state["diverged"])
        self.epoch = int(state["epoch"])


def curve(config: Config, seed: int, data: Data, epochs: int) -> tuple[list[float], list[float]]:
    """Validation error and wall seconds of each epoch of one run."""
    run = Run(config, seed, data)
    errors: list[float] = []
    seconds: list[float] = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        errors.append(run.train_epoch())
        seconds.append(round(time.perf_counter() - t0, 5))
    return errors, seconds


def verify_resume(data: Data, config: Config, seed: int, stop_at: int, epochs: int) -> None:
    """Train `config` straight through, and again stopped at `stop_at` (state copied, fresh
    objects built, state restored); the two curves must be equal."""
    straight, _ = curve(config, seed, data, epochs)
    first = Run(config, seed, data)
    resumed = [first.train_epoch() for _ in range(stop_at)]
    saved = first.state()
    del first
    second = Run(config, seed + 1000, data)  # different init and order: the restore must overwrite both
    second.restore(saved)
    resumed += [second.train_epoch() for _ in range(epochs - stop_at)]
    same = all((a == b) or (math.isnan(a) and math.isnan(b)) for a, b in zip(straight, resumed, strict=True))
    verdict = "identical" if same else "DIFFERENT"
    print(f"resume check {config.params()} seed {seed}, stopped at epoch {stop_at}: {verdict}")
    if not same:
        print(f"  straight: {straight}\n  resumed:  {resumed}")
        raise SystemExit(1)


def _json_errors(errors: list[float]) -> list[float | None]:
    return [None if math.isnan(e) else e for e in errors]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="gzipped JSON table to write")
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--seeds", type=int, nargs="+", default=SEEDS)
    parser.add_argument("--limit", type=int, default=None, help="only the first N configurations (a quick try)")
    parser.add_argument(
        "--verify-resume", action="store_true", help="first check that stop-at-epoch-k + resume equals a straight run"
    )
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    data = load_data()
    configs = grid()[: args.limit] if args.limit else grid()

    if args.verify_resume:
        for config, stop in (
            (Config(LEARNING_RATES[7], 128, 2, "sgd"), 7),
            (Config(LEARNING_RATES[3], 64, 3, "adam"), 3),
        ):
            verify_resume(data, config, seed=1, stop_at=stop, epochs=args.epochs)

    wall0, cpu0 = time.perf_counter(), time.process_time()
    rows: list[dict[str, Any]] = []
    for i, config in enumerate(configs):
        val_error: list[list[float | None]] = []
        epoch_s: list[list[float]] = []
        for seed in args.seeds:
            errors, seconds = curve(config, seed, data, args.epochs)
            val_error.append(_json_errors(errors))
            epoch_s.append(seconds)
        rows.append({"params": config.params(), "val_error": val_error, "epoch_s": epoch_s})
        if (i + 1) % 24 == 0 or i + 1 == len(configs):
            print(f"{i + 1}/{len(configs)} configurations, {time.perf_counter() - wall0:.0f} s", flush=True)
    wall_s, cpu_s = time.perf_counter() - wall0, time.process_time() - cpu0

    meta: dict[str, Any] = {
        "description": "digits MLP (slurmagent.examples.digits.build_model): validation error after each epoch",
        "grid": {"lr": LEARNING_RATES, "width": WIDTHS, "depth": DEPTHS, "optimizer": OPTIMIZERS},
        "optimizers": {
            "adam": "torch.optim.Adam defaults",
            "sgd": f"torch.optim.SGD momentum={SGD_MOMENTUM}",
            "rmsprop": "torch.optim.RMSprop defaults",
        },
        "lr_schedule": "constant",
        "seeds": args.seeds,
        "epochs": args.epochs,
        "batch_size": BATCH_SIZE,
        "train_samples": len(data.x_train),
        "val_samples": len(data.x_val),
        "split": "np.random.default_rng(12345).permutation(1797): first 360 validation, rest training",
        "val_error": "1 - accuracy, rounded to 6 digits; null: diverged (a NaN/inf training loss by this epoch)",
        "epoch_s": "wall seconds of the epoch (training pass + validation), one thread, under nice -n 19",
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "generated_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "total_cpu_s": round(cpu_s, 1),
        "total_wall_s": round(wall_s, 1),
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = json.dumps({"meta": meta, "configs": rows}, separators=(",", ":"), allow_nan=False)
    with gzip.open(args.out, "wt", encoding="utf-8", compresslevel=9) as fh:
        fh.write(payload)

    diverged = sum(any(e is None for s in r["val_error"] for e in s) for r in rows)
    print(
        f"{len(rows)} configurations x {len(args.seeds)} seeds x {args.epochs} epochs in {wall_s:.0f} s wall, "
        f"{cpu_s:.0f} s CPU; {diverged} configurations diverged in some seed; "
        f"{args.out} ({args.out.stat().st_size / 1e6:.2f} MB)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
