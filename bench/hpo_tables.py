"""Tabular HPO benchmarks from real training, for the replay (bench/hpo_suite.py): each one a
search space of 8–9 dimensions (integers, log-stepped integers, a conditional parameter), a
seeded random sample of its configurations, every configuration trained with three seeds and
its validation error recorded after every fidelity unit.

    .venv/bin/python bench/hpo_tables.py mlp8 [--configs 300] [--workers 2] [--limit N]
    .venv/bin/python bench/hpo_tables.py cnn | hgb | rnn | all

Workloads (the space is in each table's meta, in the search-space grammar of docs/hpo.md):

  mlp8  an MLP on the digits data (slurmagent/examples/data, the 360-sample validation split
        of bench/hpo_table.py), 20 epochs: lr and weight decay (log), width (16…512, powers of
        two), depth (1–4), batch size (16…256, powers of two), optimiser sgd|adam, dropout,
        momentum only for sgd. The workload of issue 22.
  cnn   a small convolutional network on the same 8×8 digit images, 15 epochs: lr and weight
        decay (log), channels (4…32, powers of two), convolutional layers (1–3), kernel 3|5,
        batch size (16…256), optimiser sgd|adam, momentum only for sgd.
  hgb   scikit-learn's HistGradientBoostingClassifier on a synthetic 3-class problem
        (make_classification: 6,000 samples, 20 features, 8 informative, 3 % label noise;
        4,000 to train, 2,000 to validate), fidelity = boosting rounds in units of 10, up
        to 27 (270 trees): learning rate (log), max_leaf_nodes (4…256, powers of two),
        min_samples_leaf (2–200, log), l2 regularisation (log), max_features, max_bins,
        depth_limited true|false and max_depth only when it is true. The seed is the model's
        random_state (feature subsampling). The validation error after k units is that of the
        first 10·k trees (staged predictions: the same as stopping there and resuming with
        warm_start).
  rnn   a recurrent classifier (GRU or LSTM, embedding, last hidden state → linear) on a
        synthetic sequence task: 16 tokens of 6 symbols, the label is the symbol the sequence
        was drawn to favour (4 classes, so it must count), 1,200 sequences to train and 600
        to validate, 12 epochs: lr (log), hidden size (8…128), layers (1–2), cell gru|lstm,
        embedding size (4…32), batch size (16…128), gradient clipping (log), optimiser
        sgd|adam, momentum only for sgd.

Every run: one thread, torch.use_deterministic_algorithms, torch.manual_seed(seed) before the
model is built, a generator seeded with the seed for the data order; constant learning rate
(a run stopped after k epochs and resumed is the same run). A run whose training loss is not
finite diverges: null from that epoch on. The configurations are drawn with numpy's
default_rng(2026) through Space.from_unit (each value of a finite parameter equally likely),
without repeats (Space.key), so a table is the same on every run; `--workers` processes train
(config, seed) pairs in parallel and the results are stored in order. The wall and CPU time
of the generation are in the table's meta.

Output: bench/data/hpo_table_<name>.json.gz: {"meta": {name, description, space, conditions,
objective, fidelity: {unit, max}, seeds, configs, generated_at, total_wall_s, total_cpu_s,
versions, command}, "configs": [{"params": {...}, "val_error": [[value | null per unit] per
seed]}]}.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
DATA = BENCH / "data"
SEEDS = [0, 1, 2]
CONFIG_SEED = 2026


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    space: list[str]
    conditions: dict[str, dict[str, list[Any]]]
    max_fidelity: int
    unit: str
    configs: int
    run: Callable[[dict[str, Any], int, int], list[float]]  # (params, seed, units) → error per unit


# -- the data ------------------------------------------------------------------------------------


def digits_split() -> tuple[Any, Any, Any, Any]:
    """The digits data with bench/hpo_table.py's validation split (360 samples)."""
    import torch

    from slurmagent.examples.digits import load_digits

    x, y = load_digits()
    split = np.random.default_rng(12345).permutation(len(x))
    val, train = torch.tensor(split[:360]), torch.tensor(split[360:])
    return x[train], y[train], x[val], y[val]


def sequences(n: int, seed: int) -> tuple[Any, Any]:
    """`n` sequences of 16 tokens over 6 symbols; each favours one of the first 4 symbols
    (probability 0.3, the others 0.14), its label."""
    import torch

    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, n)
    probs = np.full((n, 6), 0.14)
    probs[np.arange(n), labels] = 0.3
    probs /= probs.sum(axis=1, keepdims=True)
    tokens = np.array([rng.choice(6, 16, p=p) for p in probs])
    return torch.tensor(tokens, dtype=torch.long), torch.tensor(labels, dtype=torch.long)


# -- torch training, shared ----------------------------------------------------------------------


def _optimizer(params: dict[str, Any], model: Any) -> Any:
    import torch

    wd = float(params.get("optim.weight_decay", 0.0))
    if params["optim.name"] == "sgd":
        return torch.optim.SGD(
            model.parameters(), lr=params["optim.lr"], momentum=params["optim.momentum"], weight_decay=wd
        )
    return torch.optim.Adam(model.parameters(), lr=params["optim.lr"], weight_decay=wd)


def _train(
    model: Any,
    params: dict[str, Any],
    seed: int,
    epochs: int,
    data: tuple[Any, Any, Any, Any],
    batch: int,
    clip: float = 0.0,
) -> list[float]:
    """Validation error (1 - accuracy) after each epoch; NaN from the epoch the loss went non-finite."""
    import torch

    x_train, y_train, x_val, y_val = data
    opt = _optimizer(params, model)
    order = torch.Generator().manual_seed(seed)
    loss_fn = torch.nn.CrossEntropyLoss()
    diverged = False
    out: list[float] = []
    n = len(x_train)
    for _ in range(epochs):
        if not diverged:
            model.train()
            perm = torch.randperm(n, generator=order)
            for start in range(0, n, batch):
                idx = perm[start : start + batch]
                opt.zero_grad()
                loss = loss_fn(model(x_train[idx]), y_train[idx])
                if not math.isfinite(loss.item()):
                    diverged = True
                    break
                loss.backward()
                if clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
                opt.step()
        if diverged:
            out.append(math.nan)
            continue
        model.eval()
        with torch.no_grad():
            logits = model(x_val)
            if not bool(torch.isfinite(logits).all()):
                diverged = True
                out.append(math.nan)
                continue
            correct = float((logits.argmax(1) == y_val).float().mean().item())
        out.append(round(1.0 - correct, 6))
    return out


def _torch_setup(seed: int) -> None:
    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(seed)


_CACHE: dict[str, Any] = {}


def _cached(name: str, make: Callable[[], Any]) -> Any:
    if name not in _CACHE:
        _CACHE[name] = make()
    return _CACHE[name]


# -- the workloads -------------------------------------------------------------------------------


def run_mlp8(params: dict[str, Any], seed: int, epochs: int) -> list[float]:
    import torch

    data = _cached("digits", digits_split)
    _torch_setup(seed)
    layers: list[torch.nn.Module] = []
    dim = 64
    for _ in range(int(params["model.depth"])):
        layers += [torch.nn.Linear(dim, int(params["model.width"])), torch.nn.ReLU()]
        if params["model.dropout"] > 0:
            layers.append(torch.nn.Dropout(float(params["model.dropout"])))
        dim = int(params["model.width"])
    layers.append(torch.nn.Linear(dim, 10))
    return _train(torch.nn.Sequential(*layers), params, seed, epochs, data, int(params["train.batch_size"]))


def run_cnn(params: dict[str, Any], seed: int, epochs: int) -> list[float]:
    import torch

    x_train, y_train, x_val, y_val = _cached("digits", digits_split)
    data = (x_train.view(-1, 1, 8, 8), y_train, x_val.view(-1, 1, 8, 8), y_val)
    _torch_setup(seed)
    channels, kernel = int(params["model.channels"]), int(params["model.kernel"])
    layers: list[torch.nn.Module] = []
    c_in = 1
    for _ in range(int(params["model.conv_layers"])):
        layers += [torch.nn.Conv2d(c_in, channels, kernel, padding=kernel // 2), torch.nn.ReLU()]
        c_in = channels
    layers += [torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(channels * 16, 10)]
    return _train(torch.nn.Sequential(*layers), params, seed, epochs, data, int(params["train.batch_size"]))


def _rnn_data() -> tuple[Any, Any, Any, Any]:
    x_train, y_train = sequences(1200, 7)
    x_val, y_val = sequences(600, 8)
    return x_train, y_train, x_val, y_val


def run_rnn(params: dict[str, Any], seed: int, epochs: int) -> list[float]:
    import torch

    data = _cached("sequences", _rnn_data)
    _torch_setup(seed)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            embed, hidden = int(params["model.embed"]), int(params["model.hidden"])
            self.embed = torch.nn.Embedding(6, embed)
            cell = torch.nn.GRU if params["model.cell"] == "gru" else torch.nn.LSTM
            self.rnn = cell(embed, hidden, num_layers=int(params["model.layers"]), batch_first=True)
            self.out = torch.nn.Linear(hidden, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seq, _ = self.rnn(self.embed(x))
            result: torch.Tensor = self.out(seq[:, -1])
            return result

    return _train(Net(), params, seed, epochs, data, int(params["train.batch_size"]), clip=float(params["train.clip"]))


def _hgb_data() -> tuple[Any, Any, Any, Any]:
    from sklearn.datasets import make_classification

    x, y = make_classification(
        n_samples=6000,
        n_features=20,
        n_informative=8,
        n_redundant=4,
        n_classes=3,
        n_clusters_per_class=2,
        flip_y=0.03,
        class_sep=0.8,
        random_state=0,
    )
    return x[:4000], y[:4000], x[4000:], y[4000:]


def run_hgb(params: dict[str, Any], seed: int, units: int) -> list[float]:
    from sklearn.ensemble import HistGradientBoostingClassifier

    x_train, y_train, x_val, y_val = _cached("hgb", _hgb_data)
    depth = int(params["model.max_depth"]) if params["model.depth_limited"] else None
    model = HistGradientBoostingClassifier(
        learning_rate=float(params["model.learning_rate"]),
        max_iter=10 * units,
        max_leaf_nodes=int(params["model.max_leaf_nodes"]),
        min_samples_leaf=int(params["model.min_samples_leaf"]),
        l2_regularization=float(params["model.l2"]),
        max_features=float(params["model.max_features"]),
        max_bins=int(params["model.max_bins"]),
        max_depth=depth,
        early_stopping=False,
        random_state=seed,
    )
    model.fit(x_train, y_train)
    out: list[float] = []
    for i, pred in enumerate(model.staged_predict(x_val), start=1):
        if i % 10 == 0:
            out.append(round(1.0 - float(np.mean(pred == y_val)), 6))
    while len(out) < units:  # the model never stops early (early_stopping=False); a guard all the same
        out.append(out[-1])
    return out


SGD = {"optim.momentum": {"optim.name": ["sgd"]}}
WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in [
        Workload(
            "mlp8",
            "MLP on the digits data (8-dimensional space, the workload of issue 22): validation error per epoch",
            [
                "optim.lr=tag(log,interval(1e-4,1.0))",
                "optim.weight_decay=tag(log,interval(1e-6,1e-2))",
                "model.width=tag(log,range(16,513,2))",
                "model.depth=int(interval(1,4))",
                "train.batch_size=tag(log,range(16,257,2))",
                "optim.name=choice(sgd,adam)",
                "model.dropout=interval(0.0,0.5)",
                "optim.momentum=interval(0.5,0.99)",
            ],
            SGD,
            20,
            "epoch",
            300,
            run_mlp8,
        ),
        Workload(
            "cnn",
            "small CNN on the 8x8 digit images: validation error per epoch",
            [
                "optim.lr=tag(log,interval(1e-4,0.3))",
                "optim.weight_decay=tag(log,interval(1e-6,1e-2))",
                "model.channels=tag(log,range(4,33,2))",
                "model.conv_layers=int(interval(1,3))",
                "model.kernel=choice(3,5)",
                "train.batch_size=tag(log,range(16,257,2))",
                "optim.name=choice(sgd,adam)",
                "optim.momentum=interval(0.5,0.99)",
            ],
            SGD,
            15,
            "epoch",
            250,
            run_cnn,
        ),
        Workload(
            "hgb",
            "HistGradientBoostingClassifier on a synthetic 3-class problem: validation error per 10 boosting rounds",
            [
                "model.learning_rate=tag(log,interval(0.01,1.0))",
                "model.max_leaf_nodes=tag(log,range(4,257,2))",
                "model.min_samples_leaf=tag(log,int(interval(2,200)))",
                "model.l2=tag(log,interval(1e-4,10.0))",
                "model.max_features=interval(0.2,1.0)",
                "model.max_bins=int(interval(16,255))",
                "model.depth_limited=choice(true,false)",
                "model.max_depth=int(interval(2,10))",
            ],
            {"model.max_depth": {"model.depth_limited": [True]}},
            27,
            "10 boosting rounds",
            300,
            run_hgb,
        ),
        Workload(
            "rnn",
            "GRU/LSTM sequence classifier on a synthetic counting task: validation error per epoch",
            [
                "optim.lr=tag(log,interval(1e-4,0.1))",
                "model.hidden=tag(log,range(8,129,2))",
                "model.layers=int(interval(1,2))",
                "model.cell=choice(gru,lstm)",
                "model.embed=tag(log,range(4,33,2))",
                "train.batch_size=tag(log,range(16,129,2))",
                "train.clip=tag(log,interval(0.1,10.0))",
                "optim.name=choice(sgd,adam)",
                "optim.momentum=interval(0.5,0.99)",
            ],
            SGD,
            12,
            "epoch",
            200,
            run_rnn,
        ),
    ]
}


def configurations(workload: Workload, n: int) -> list[dict[str, Any]]:
    """`n` distinct configurations of the workload's space, drawn with default_rng(CONFIG_SEED)."""
    from slurmagent.hpo.space import Space

    space = Space.from_overrides(workload.space, workload.conditions)
    rng = np.random.default_rng(CONFIG_SEED)
    out: list[dict[str, Any]] = []
    seen: set[Any] = set()
    while len(out) < n:
        params = space.from_unit(rng.random(len(space.params)))
        key = space.key(params)
        if key not in seen:
            seen.add(key)
            out.append(params)
    return out


def _job(args: tuple[str, dict[str, Any], int, int]) -> tuple[list[float], float]:
    name, params, seed, units = args
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.process_time()
    curve = WORKLOADS[name].run(params, seed, units)
    return curve, time.process_time() - t0


def generate(workload: Workload, n: int, seeds: list[int], workers: int, out: Path, argv: list[str]) -> None:
    configs = configurations(workload, n)
    jobs = [(workload.name, p, s, workload.max_fidelity) for p in configs for s in seeds]
    wall0 = time.perf_counter()
    results: list[tuple[list[float], float]] = []
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for i, result in enumerate(pool.map(_job, jobs, chunksize=1)):
            results.append(result)
            if (i + 1) % (10 * len(seeds)) == 0 or i + 1 == len(jobs):
                print(f"{workload.name}: {i + 1}/{len(jobs)} runs, {time.perf_counter() - wall0:.0f} s", flush=True)
    wall_s = time.perf_counter() - wall0
    cpu_s = sum(r[1] for r in results)
    rows = []
    for i, params in enumerate(configs):
        curves = [results[i * len(seeds) + k][0] for k in range(len(seeds))]
        rows.append({"params": params, "val_error": [[None if math.isnan(v) else v for v in c] for c in curves]})
    import sklearn
    import torch

    meta: dict[str, Any] = {
        "name": workload.name,
        "description": workload.description,
        "space": workload.space,
        "conditions": workload.conditions,
        "objective": "val_error",
        "direction": "minimize",
        "fidelity": {"unit": workload.unit, "max": workload.max_fidelity},
        "epochs": workload.max_fidelity,
        "seeds": seeds,
        "configs": len(configs),
        "config_seed": CONFIG_SEED,
        "val_error": "1 - accuracy on the validation split, rounded to 6 digits; null: diverged",
        "generated_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "total_wall_s": round(wall_s, 1),
        "total_cpu_s": round(cpu_s, 1),
        "workers": workers,
        "torch": torch.__version__,
        "sklearn": sklearn.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "command": " ".join([Path(sys.argv[0]).name, *argv]),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = json.dumps({"meta": meta, "configs": rows}, separators=(",", ":"), allow_nan=False)
    with gzip.open(out, "wt", encoding="utf-8", compresslevel=9) as fh:
        fh.write(payload)
    diverged = sum(any(v is None for c in r["val_error"] for v in c) for r in rows)
    print(
        f"{workload.name}: {len(rows)} configurations x {len(seeds)} seeds x {workload.max_fidelity} "
        f"× {workload.unit} in {wall_s:.0f} s wall ({cpu_s:.0f} s CPU, {workers} workers); "
        f"{diverged} diverged in some seed; {out} ({out.stat().st_size / 1e3:.0f} KB)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload", choices=[*WORKLOADS, "all"])
    parser.add_argument("--configs", type=int, default=None, help="configurations (default: the workload's)")
    parser.add_argument("--seeds", type=int, nargs="+", default=SEEDS)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--limit", type=int, default=None, help="only the first N configurations (a quick try)")
    parser.add_argument("--out", type=Path, default=None, help="default: bench/data/hpo_table_<name>.json.gz")
    args = parser.parse_args(argv)
    names = list(WORKLOADS) if args.workload == "all" else [args.workload]
    for name in names:
        w = WORKLOADS[name]
        n = args.limit or args.configs or w.configs
        out = args.out or DATA / f"hpo_table_{name}.json.gz"
        generate(w, n, args.seeds, args.workers, out, argv if argv is not None else sys.argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
