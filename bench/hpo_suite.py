"""Replays hyperparameter optimisers side by side on every HPO benchmark: the tabular ones
(recorded curves of real training: bench/data/hpo_table*.json.gz) and two standard
multi-fidelity test functions. No training here: "train configuration C to fidelity f" is
a look-up (a table) or an evaluation (a function).

    .venv/bin/python bench/hpo_suite.py [--replays 100] [--benchmarks …] [--optimizers …] [--workers 2]

Benchmarks (`BENCHMARKS`; which ones the search was tuned on and which are held out:
`TUNED_ON`, `HELD_OUT`, fixed before any tuning):
  digits    bench/data/hpo_table.json.gz (bench/hpo_table.py): 432-configuration grid, 4 dimensions
  mlp8, cnn, hgb, rnn
            bench/data/hpo_table_<name>.json.gz (bench/hpo_tables.py): 200–300 random
            configurations of 8–9-dimensional spaces with integers, log-stepped integers and a
            conditional parameter
  branin    Branin with a fidelity (Kandasamy et al., "Multi-fidelity Bayesian optimisation
            with continuous approximations", ICML 2017): b, c, t shifted by 0.01, 0.1, −0.005
            × (1 − z), z = fidelity / max; x1 ∈ [−5, 10], x2 ∈ [0, 15]; no noise; minimum 0.397887
  hartmann6 Hartmann-6 with a fidelity as in mf-prior-bench (used by NePS / PriorBand): α′ =
            α − bias·(1 − z)², plus Gaussian noise of standard deviation noise·(1 − z) per
            evaluation ("moderate": bias 1, noise 0.2), z = (f − 1)/(max − 1); x ∈ [0, 1]^6;
            minimum −3.32237 (noise-free at the maximum fidelity)

A table's optimiser sees the table's search space (its meta; docs/hpo.md's grammar) and a
proposal is snapped to the nearest recorded configuration (Space.distance: every parameter
scaled to [0, 1], a different choice or activity counting 1), for every optimiser alike. Each
trial gets one of the table's seeds (drawn from the replay's generator, the same draws for
every optimiser in replay r) and sees that seed's curve. A function's trial gets a noise seed.

Budget: 30 full trainings' worth of fidelity units per replay (600 epochs for a 20-epoch
table), every unit counted; a trial continued from its checkpoint pays only what it adds.
slurmagent's Optimizer is driven as its study driver drives it (`ask_within(budget −
spent())`) and, as docs/hpo.md's offline section says to, told the parameters that actually
ran (`tell(trial, curve, params=row)`); Optuna's optimisers run their last trial until the
budget cuts it; DEHB's jobs continue the same configuration's earlier run of this replay when
there is one (a job on a configuration already trained that far costs nothing: its value is
looked up), else start one.

Optimisers (reduction factor 3, fidelity 1 … max):
  random            Optuna RandomSampler, every trial to the maximum fidelity
  asha              RandomSampler + SuccessiveHalvingPruner(min_resource=1, reduction_factor=3)
  tpe_hyperband     TPESampler + HyperbandPruner(min_resource=1, max_resource=max, reduction_factor=3)
  dehb              DEHB 0.1.2 (Awad et al., IJCAI 2021), ask/tell, ConfigSpace of the same space,
                    fidelities max·3^−k rounded to integers
  slurmagent        slurmagent.hpo.core.Optimizer as shipped, defaults
  slurmagent_before the Optimizer of commit b0239b6 (before issue 22), loaded from git, driven as
                    the issue's reporter drove it: no tell of the parameters that ran
Diverged (NaN) epochs: Optuna and DEHB get the worst possible error, 1.0 (Optuna fails a NaN
trial and its samplers then ignore it); slurmagent gets NaN, which its tell() accepts.

Measured per benchmark and optimiser over the replays (replay r: optimiser seed r):
  - the *incumbent* at the end of the budget: the trial trained to the maximum fidelity with
    the best observed final value (what a user would pick); its *true* value: its
    configuration's final value averaged over the table's seeds (a function: noise-free);
  - *success within p %*: the incumbent's true value ≤ best + p % × |best|, best = the best
    true final value of any configuration (a table) or the function's minimum;
  - digits only, the issue-13 measure as well: some fully trained trial's *observed* final
    error ≤ best + 0.5 / 1 pp;
  - the *duplicate-epoch share*: epochs (fidelity units) trained for a configuration (after the
    snapping: the same row, or the same point) up to a fidelity another trial of this replay
    had already trained it to, over all epochs trained;
  - trials started, distinct configurations, full trainings, slurmagent's best() against the
    harness's incumbent (they must agree), the wall time.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import importlib.util
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from hpo_replay import _no_nan  # bench/ is on the path: strict JSON, shared with the issue-13 replay

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
DATA = BENCH / "data"
DEFAULT_JSON = BENCH / "results" / "hpo_suite.json"
ETA = 3
FULL_TRAININGS = 30  # the budget, in full trainings' worth of fidelity units
DIVERGED_FOR_PEERS = 1.0
BEFORE_COMMIT = "b0239b6"  # the optimiser before issue 22

# Declared before any tuning of the optimiser for issue 22 (bench/README.md says the same): its
# defaults were chosen on these benchmarks only …
TUNED_ON = ("digits", "mlp8", "branin")
# … and these were run only to report them.
HELD_OUT = ("cnn", "hgb", "rnn", "hartmann6")
BENCHMARKS = (*TUNED_ON, *HELD_OUT)
OPTIMIZERS = ("random", "asha", "tpe_hyperband", "dehb", "slurmagent", "slurmagent_before")
MARGINS = (0.01, 0.05)


# -- benchmarks ----------------------------------------------------------------------------------


class Benchmark:
    """A black box: a search space, and the value of a point after each fidelity unit."""

    name: str
    space_overrides: list[str]
    conditions: dict[str, dict[str, list[Any]]]
    max_fidelity: int
    best: float  # the best true final value (success margins are relative to it)

    def space(self) -> Any:
        from slurmagent.hpo.space import Space

        return Space.from_overrides(self.space_overrides, self.conditions)

    def snap(self, params: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """The point a proposal runs as (a table's row), and its parameters."""
        raise NotImplementedError

    def value(self, point: Any, seed: int, fidelity: int) -> float:
        raise NotImplementedError

    def true_final(self, point: Any) -> float:
        raise NotImplementedError

    def seed_count(self) -> int:
        return 2**31


class TableBenchmark(Benchmark):
    def __init__(self, name: str, path: Path, space: list[str], conditions: dict[str, Any], rename: dict[str, str]):
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            doc = json.load(fh)
        self.name = name
        self.meta: dict[str, Any] = doc["meta"]
        self.space_overrides = space
        self.conditions = conditions
        self.max_fidelity = int(self.meta["epochs"])
        self.params: list[dict[str, Any]] = [
            {rename.get(k, k): v for k, v in c["params"].items()} for c in doc["configs"]
        ]
        self.val = np.array(
            [[[math.nan if v is None else v for v in seed] for seed in c["val_error"]] for c in doc["configs"]],
            dtype=float,
        )
        self.final_mean = self.val[:, :, -1].mean(axis=1)  # NaN when any seed diverged: never the best
        self.best = float(np.nanmin(self.final_mean))
        self._space = self.space()
        self._coords = np.array([self._encode(p) for p in self.params])
        self._choice = np.array([hasattr(p.distribution, "choices") for p in self._space.params])

    def _encode(self, params: dict[str, Any]) -> np.ndarray:
        out = np.full(len(self._space.params), np.nan)
        for j, p in enumerate(self._space.params):
            if p.name in params:
                v = p.snap(params[p.name])
                out[j] = float(p.distribution.choices.index(v)) if hasattr(p.distribution, "choices") else p.unit(v)
        return out

    def snap(self, params: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        x = self._encode(params)
        missing_x, missing = np.isnan(x), np.isnan(self._coords)
        diff = np.where(self._choice, (self._coords != x).astype(float), (self._coords - x) ** 2)
        diff = np.where(missing_x | missing, (missing_x != missing).astype(float), diff)
        row = int(np.argmin(diff.sum(axis=1)))
        return row, dict(self.params[row])

    def value(self, point: Any, seed: int, fidelity: int) -> float:
        return float(self.val[point, seed, fidelity - 1])

    def true_final(self, point: Any) -> float:
        return float(self.final_mean[point])

    def seed_count(self) -> int:
        return int(self.val.shape[1])


class FunctionBenchmark(Benchmark):
    def __init__(
        self,
        name: str,
        space: list[str],
        max_fidelity: int,
        best: float,
        f: Callable[[np.ndarray, float], float],
        noise: float = 0.0,
    ) -> None:
        self.name, self.space_overrides, self.conditions = name, space, {}
        self.max_fidelity, self.best, self.f, self.noise = max_fidelity, best, f, noise
        self._names = [o.split("=", 1)[0] for o in space]

    def snap(self, params: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        return tuple(float(params[n]) for n in self._names), dict(params)

    def _z(self, fidelity: int) -> float:
        return (fidelity - 1) / (self.max_fidelity - 1)

    def value(self, point: Any, seed: int, fidelity: int) -> float:
        z = self._z(fidelity)
        v = self.f(np.array(point), z)
        if self.noise and z < 1:
            v += self.noise * (1 - z) * float(np.random.default_rng([seed, fidelity]).normal())
        return float(v)

    def true_final(self, point: Any) -> float:
        return float(self.f(np.array(point), 1.0))


def branin_mf(x: np.ndarray, z: float) -> float:
    b = 5.1 / (4 * math.pi**2) - 0.01 * (1 - z)
    c = 5 / math.pi - 0.1 * (1 - z)
    t = 1 / (8 * math.pi) + 0.005 * (1 - z)
    x1, x2 = float(x[0]), float(x[1])
    return (x2 - b * x1**2 + c * x1 - 6) ** 2 + 10 * (1 - t) * math.cos(x1) + 10


_H_A = np.array(
    [[10, 3, 17, 3.5, 1.7, 8], [0.05, 10, 17, 0.1, 8, 14], [3, 3.5, 1.7, 10, 17, 8], [17, 8, 0.05, 10, 0.1, 14]]
)
_H_P = 1e-4 * np.array(
    [
        [1312, 1696, 5569, 124, 8283, 5886],
        [2329, 4135, 8307, 3736, 1004, 9991],
        [2348, 1451, 3522, 2883, 3047, 6650],
        [4047, 8828, 8732, 5743, 1091, 381],
    ]
)
_H_ALPHA = np.array([1.0, 1.2, 3.0, 3.2])


def hartmann6_mf(x: np.ndarray, z: float, bias: float = 1.0) -> float:
    alpha = _H_ALPHA - bias * (1 - z) ** 2
    return float(-(alpha * np.exp(-(_H_A * (x - _H_P) ** 2).sum(axis=1))).sum())


DIGITS_SPACE = [
    "optim.lr=tag(log,interval(1e-4,1.0))",
    "model.width=choice(32,64,128,256)",
    "model.depth=choice(1,2,3)",
    "optim.name=choice(adam,sgd,rmsprop)",
]
DIGITS_RENAME = {"lr": "optim.lr", "width": "model.width", "depth": "model.depth", "optimizer": "optim.name"}


def load_benchmark(name: str) -> Benchmark:
    if name == "digits":
        return TableBenchmark(name, DATA / "hpo_table.json.gz", DIGITS_SPACE, {}, DIGITS_RENAME)
    if name in ("mlp8", "cnn", "hgb", "rnn"):
        path = DATA / f"hpo_table_{name}.json.gz"
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            meta = json.load(fh)["meta"]
        return TableBenchmark(name, path, list(meta["space"]), dict(meta["conditions"]), {})
    if name == "branin":
        return FunctionBenchmark("branin", ["x1=interval(-5.0,10.0)", "x2=interval(0.0,15.0)"], 27, 0.397887, branin_mf)
    if name == "hartmann6":
        space = [f"x{i}=interval(0.0,1.0)" for i in range(1, 7)]
        return FunctionBenchmark("hartmann6", space, 27, -3.32237, hartmann6_mf, noise=0.2)
    raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")


# -- one replay's ledger -------------------------------------------------------------------------


@dataclass
class Run:
    """One trial's training: a point, the seed it got, the fidelity trained so far."""

    id: int
    point: Any
    seed: int
    done: int = 0
    curve: dict[int, float] = field(default_factory=dict)


@dataclass
class Outcome:
    benchmark: str
    optimizer: str
    replay: int
    spent: int = 0
    duplicate: int = 0  # units trained that another run of the same point had trained already
    trials: int = 0
    distinct: int = 0
    full: int = 0
    incumbent: float = math.nan  # observed final value of the best fully trained run
    incumbent_true: float = math.nan  # its point's true final value
    hits: dict[str, bool] = field(default_factory=dict)  # observed final ≤ target (digits' pp targets)
    best_agrees: bool | None = None  # slurmagent: best() is the harness's incumbent
    wall_s: float = 0.0


class Ledger:
    def __init__(self, bench: Benchmark, outcome: Outcome, seed: int, pp_targets: dict[str, float]) -> None:
        self.bench = bench
        self.budget = FULL_TRAININGS * bench.max_fidelity
        self.out = outcome
        self.rng = np.random.default_rng([seed, 20261202])
        self.runs: list[Run] = []
        self.by_point: dict[Any, list[Run]] = {}
        self.pp_targets = pp_targets
        self.out.hits = dict.fromkeys(pp_targets, False)
        self.incumbent: Run | None = None

    @property
    def exhausted(self) -> bool:
        return self.out.spent >= self.budget

    def start(self, point: Any) -> Run:
        self.out.trials += 1
        run = Run(len(self.runs), point, int(self.rng.integers(self.bench.seed_count())))
        self.runs.append(run)
        self.by_point.setdefault(point, []).append(run)
        return run

    def advance(self, run: Run, to: int) -> bool:
        """Trains `run` up to `to` (paying each new unit); False if the budget ran out first."""
        while run.done < to:
            if self.exhausted:
                return False
            self.out.spent += 1
            run.done += 1
            if any(r.done >= run.done for r in self.by_point[run.point] if r is not run):
                self.out.duplicate += 1
            run.curve[run.done] = self.bench.value(run.point, run.seed, run.done)
            if run.done == self.bench.max_fidelity:
                self._full(run)
        return True

    def _full(self, run: Run) -> None:
        self.out.full += 1
        final = run.curve[run.done]
        if math.isnan(final):
            return
        for name, target in self.pp_targets.items():
            self.out.hits[name] = self.out.hits[name] or final <= target
        if self.incumbent is None or final < self.incumbent.curve[self.bench.max_fidelity]:
            self.incumbent = run

    def close(self) -> None:
        self.out.distinct = len(self.by_point)
        if self.incumbent is not None:
            self.out.incumbent = self.incumbent.curve[self.bench.max_fidelity]
            self.out.incumbent_true = self.bench.true_final(self.incumbent.point)


# -- the optimisers ------------------------------------------------------------------------------


def _suggest(trial: optuna.trial.Trial, space: Any) -> dict[str, Any]:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    chosen: dict[str, Any] = {}
    for p in space.params:
        if not p.active(chosen):
            continue
        d = p.distribution
        if isinstance(d, CategoricalDistribution):
            chosen[p.name] = trial.suggest_categorical(p.name, d.choices)
        elif isinstance(d, IntDistribution):
            chosen[p.name] = trial.suggest_int(p.name, d.low, d.high, log=d.log, step=d.step)
        elif isinstance(d, FloatDistribution):
            chosen[p.name] = trial.suggest_float(p.name, d.low, d.high, log=d.log, step=d.step)
    return chosen


def replay_optuna(
    bench: Benchmark, ledger: Ledger, sampler: optuna.samplers.BaseSampler, pruner: optuna.pruners.BasePruner
) -> None:
    """Optuna's ask/tell loop; the trial reports after every unit and may be pruned. The study
    has a fixed name: HyperbandPruner assigns brackets by a hash of the study's name and the
    trial number, and an unnamed study gets a random one (the replays would not repeat)."""
    space = bench.space()
    study = optuna.create_study(study_name="replay", direction="minimize", sampler=sampler, pruner=pruner)
    top = bench.max_fidelity
    while not ledger.exhausted:
        trial = study.ask()
        point, _ = bench.snap(_suggest(trial, space))
        run = ledger.start(point)
        for f in range(1, top + 1):
            if not ledger.advance(run, f):
                return
            value = run.curve[f]
            if math.isnan(value):
                value = DIVERGED_FOR_PEERS
            if f == top:
                study.tell(trial, value)
                break
            trial.report(value, f)
            if trial.should_prune():
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                break


def replay_slurmagent(
    bench: Benchmark, ledger: Ledger, seed: int, before: bool = False, options: dict[str, Any] | None = None
) -> None:
    """slurmagent's ask/tell optimiser as its study driver runs it: ask within the budget left,
    look the ask up to its fidelity, tell the curve (and, but `before`, the parameters that ran).
    `options`: keyword arguments of Optimizer (a variant: `slurmagent:explore_share=0.5`)."""
    module = _before_module() if before else importlib.import_module("slurmagent.hpo.core")
    # its defaults (the lowest rung a tenth of a full training); the optimiser from before this
    # issue as its reporter drove it, from one unit
    settings: dict[str, Any] = {"max_fidelity": bench.max_fidelity, "eta": ETA, "seed": seed}
    if before:
        settings["min_fidelity"] = 1
    opt = module.Optimizer(bench.space(), **(settings | (options or {})))
    runs: dict[int, Run] = {}
    while not ledger.exhausted:
        a = opt.ask_within(ledger.budget - opt.spent())
        if a is None:
            break
        point, ran = bench.snap(a.params)
        if a.resume is not None:
            run = runs[a.resume]
            if run.point != point:
                raise RuntimeError(f"trial {a.trial} resumes trial {a.resume} with other parameters: {a.params}")
        else:
            run = ledger.start(point)
        runs[a.trial] = run
        start = run.done
        if not ledger.advance(run, a.fidelity):
            raise RuntimeError(f"ask_within gave trial {a.trial} to {a.fidelity}: past the budget")
        if opt.spent() != ledger.out.spent:
            raise RuntimeError(f"Optimizer.spent() = {opt.spent()}, units trained = {ledger.out.spent}")
        curve = {f: run.curve[f] for f in range(start + 1, a.fidelity + 1)}
        if before or a.resume is not None:
            opt.tell(a.trial, curve)
        else:
            opt.tell(a.trial, curve, params=ran)
    best = opt.best()
    inc = ledger.incumbent
    if inc is not None and best is not None and best.reached >= bench.max_fidelity:
        ledger.out.best_agrees = runs[best.trial] is inc or (best.curve[best.reached] == inc.curve[bench.max_fidelity])
    else:
        ledger.out.best_agrees = inc is None


_BEFORE: Any = None


def _before_module() -> Any:
    """slurmagent/hpo/core.py as of BEFORE_COMMIT, as a module of its own (it imports the
    current space.py, whose Space it uses through params, distributions and names only)."""
    global _BEFORE
    if _BEFORE is None:
        source = subprocess.run(
            ["git", "show", f"{BEFORE_COMMIT}:slurmagent/hpo/core.py"], cwd=ROOT, capture_output=True, text=True
        )
        if source.returncode != 0:
            raise RuntimeError(f"git show {BEFORE_COMMIT}: {source.stderr.strip()}")
        folder = Path(tempfile.mkdtemp(prefix="hpo_before_"))
        path = folder / "slurmagent_hpo_core_before.py"
        path.write_text(source.stdout)
        spec = importlib.util.spec_from_file_location("slurmagent_hpo_core_before", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        _BEFORE = module
    return _BEFORE


def _configspace(space: Any, seed: int) -> Any:
    import ConfigSpace as CS
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    cs = CS.ConfigurationSpace(seed=seed)
    hps: dict[str, Any] = {}
    for p in space.params:
        d = p.distribution
        if p.grid:
            hp: Any = CS.OrdinalHyperparameter(p.name, list(p.grid))
        elif isinstance(d, CategoricalDistribution):
            hp = CS.CategoricalHyperparameter(p.name, list(d.choices))
        elif isinstance(d, IntDistribution):
            hp = CS.UniformIntegerHyperparameter(p.name, d.low, d.high, log=d.log)
        elif isinstance(d, FloatDistribution):
            hp = CS.UniformFloatHyperparameter(p.name, d.low, d.high, log=d.log)
        else:
            raise ValueError(f"{p.name}: {d!r}")
        hps[p.name] = hp
    cs.add(list(hps.values()))
    for p in space.params:
        for parent, values in p.when.items():
            cs.add(CS.InCondition(hps[p.name], hps[parent], list(values)))
    return cs


def replay_dehb(bench: Benchmark, ledger: Ledger, seed: int, workdir: Path) -> None:
    """DEHB's ask/tell loop (n_workers=1). A job continues this replay's earlier run of the same
    point when one exists and has not passed the job's fidelity (paying only the new units), is
    looked up when one has, else starts a run."""
    import logging

    from dehb import DEHB
    from loguru import logger

    logger.remove()
    logging.getLogger("distributed").setLevel(logging.ERROR)
    space = bench.space()
    dehb = DEHB(
        cs=_configspace(space, seed),
        min_fidelity=1,
        max_fidelity=bench.max_fidelity,
        eta=ETA,
        n_workers=1,
        seed=seed,
        output_path=str(workdir),
        save_freq="end",
        log_level="ERROR",
    )
    logger.remove()
    top = bench.max_fidelity
    while not ledger.exhausted:
        job = dehb.ask()
        fidelity = max(1, min(top, round(float(job["fidelity"]))))
        params = {k: v for k, v in dict(job["config"]).items()}
        for p in space.params:
            if p.name in params and isinstance(params[p.name], np.generic):
                params[p.name] = params[p.name].item()
        point, _ = bench.snap(params)
        earlier = [r for r in ledger.by_point.get(point, []) if r.done <= fidelity]
        done = [r for r in ledger.by_point.get(point, []) if r.done > fidelity]
        if done:
            run = done[0]
        else:
            run = max(earlier, key=lambda r: r.done) if earlier else ledger.start(point)
            if not ledger.advance(run, fidelity):
                return
        value = run.curve[fidelity]
        if math.isnan(value):
            value = DIVERGED_FOR_PEERS
        dehb.tell(job, {"fitness": value, "cost": float(fidelity)})


def variant(name: str) -> dict[str, Any]:
    """`slurmagent:a=1,b=0.5` → {"a": 1, "b": 0.5}: an Optimizer variant, for the ablations."""
    out: dict[str, Any] = {}
    for item in name.partition(":")[2].split(","):
        if item:
            key, _, value = item.partition("=")
            if "/" in value:  # a sequence: brackets=0.6/0.3/0.1
                out[key] = tuple(float(v) for v in value.split("/"))
            else:
                out[key] = int(value) if value.lstrip("-").isdigit() else float(value)
    return out


def run_one(task: tuple[str, str, int, dict[str, float]]) -> Outcome:
    bench_name, name, seed, pp = task
    bench = _bench(bench_name)
    out = Outcome(bench_name, name, seed)
    ledger = Ledger(bench, out, seed, pp)
    t0 = time.perf_counter()
    samplers, pruners, top = optuna.samplers, optuna.pruners, bench.max_fidelity
    if name == "random":
        replay_optuna(bench, ledger, samplers.RandomSampler(seed=seed), pruners.NopPruner())
    elif name == "asha":
        replay_optuna(
            bench,
            ledger,
            samplers.RandomSampler(seed=seed),
            pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=ETA),
        )
    elif name == "tpe_hyperband":
        replay_optuna(
            bench,
            ledger,
            samplers.TPESampler(seed=seed),
            pruners.HyperbandPruner(min_resource=1, max_resource=top, reduction_factor=ETA),
        )
    elif name == "dehb":
        with tempfile.TemporaryDirectory(prefix="dehb_") as workdir:
            replay_dehb(bench, ledger, seed, Path(workdir))
    elif name == "slurmagent":
        replay_slurmagent(bench, ledger, seed)
    elif name == "slurmagent_before":
        replay_slurmagent(bench, ledger, seed, before=True)
    elif name.startswith("slurmagent:"):
        replay_slurmagent(bench, ledger, seed, options=variant(name))
    else:
        raise ValueError(f"unknown optimiser {name!r}; known: {', '.join(OPTIMIZERS)}")
    ledger.close()
    out.wall_s = time.perf_counter() - t0
    return out


_BENCHES: dict[str, Benchmark] = {}


def _bench(name: str) -> Benchmark:
    if name not in _BENCHES:
        _BENCHES[name] = load_benchmark(name)
    return _BENCHES[name]


def _init_worker() -> None:
    import warnings

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.simplefilter("ignore")


# -- measuring -----------------------------------------------------------------------------------


def summarise(bench: Benchmark, outcomes: list[Outcome]) -> dict[str, Any]:
    n = len(outcomes)
    trues = [o.incumbent_true if not math.isnan(o.incumbent_true) else math.inf for o in outcomes]
    success = {f"{100 * m:g} %": sum(t <= bench.best + m * abs(bench.best) for t in trues) / n for m in MARGINS}
    spent = sum(o.spent for o in outcomes)
    agree = [o.best_agrees for o in outcomes if o.best_agrees is not None]
    median = statistics.median(trues)
    return {
        "replays": n,
        "success": success,
        "hits": {k: sum(o.hits[k] for o in outcomes) / n for k in (outcomes[0].hits if outcomes else {})},
        "incumbent_true_median": median if math.isfinite(median) else None,
        "incumbent_true_mean": statistics.fmean(t for t in trues if math.isfinite(t))
        if any(math.isfinite(t) for t in trues)
        else None,
        "no_incumbent": sum(math.isinf(t) for t in trues),
        "duplicate_share": sum(o.duplicate for o in outcomes) / spent if spent else 0.0,
        "spent_mean": statistics.fmean(o.spent for o in outcomes),
        "trials_mean": statistics.fmean(o.trials for o in outcomes),
        "distinct_mean": statistics.fmean(o.distinct for o in outcomes),
        "full_mean": statistics.fmean(o.full for o in outcomes),
        "best_agrees": (sum(agree), len(agree)) if agree else None,
        "wall_s": sum(o.wall_s for o in outcomes),
    }


def _fmt(bench: Benchmark, x: float | None) -> str:
    if x is None:
        return "–"
    return f"{100 * x:.2f} %" if isinstance(bench, TableBenchmark) else f"{x:.4f}"


def markdown(bench: Benchmark, summary: dict[str, dict[str, Any]]) -> str:
    pp = next(iter(summary.values()))["hits"]
    head = ["optimiser", *(f"within {m}" for m in next(iter(summary.values()))["success"])]
    head += [f"hit {k}" for k in pp]
    head += ["final incumbent (median)", "duplicate epochs", "trials (distinct, full)", "wall"]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for opt, s in summary.items():
        cells = [opt, *(f"{100 * v:.0f} %" for v in s["success"].values())]
        cells += [f"{100 * v:.0f} %" for v in s["hits"].values()]
        cells.append(_fmt(bench, s["incumbent_true_median"]))
        cells.append(f"{100 * s['duplicate_share']:.1f} %")
        cells.append(f"{s['trials_mean']:.0f} ({s['distinct_mean']:.0f}, {s['full_mean']:.1f})")
        cells.append(f"{s['wall_s']:.0f} s")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def verdict(summary: dict[str, dict[str, Any]], name: str = "slurmagent") -> str:
    """The issue's 'done' test for one benchmark: the tightest margin's success ≥ ASHA's and
    random's, the median incumbent no worse than ASHA's."""
    if name not in summary or "asha" not in summary or "random" not in summary:
        return ""
    s, a, r = summary[name], summary["asha"], summary["random"]
    tight = next(iter(s["success"]))
    ok_success = s["success"][tight] >= a["success"][tight] and s["success"][tight] >= r["success"][tight]
    mine, theirs = s["incumbent_true_median"], a["incumbent_true_median"]
    ok_median = theirs is None or (mine is not None and mine <= theirs)
    return (
        f"{name}: success within {tight} {'≥' if ok_success else '<'} ASHA's and random's; "
        f"median incumbent {'≤' if ok_median else '>'} ASHA's → {'met' if ok_success and ok_median else 'NOT MET'}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replays", type=int, default=100)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--benchmarks", nargs="+", default=list(BENCHMARKS), choices=BENCHMARKS)
    parser.add_argument(
        "--optimizers",
        nargs="+",
        default=list(OPTIMIZERS),
        help=f"of {', '.join(OPTIMIZERS)}, or a variant slurmagent:KEY=VALUE,… (Optimizer's keyword arguments)",
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", type=lambda s: Path(s) if s else None, default=DEFAULT_JSON)
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.ERROR)

    wall0 = time.perf_counter()
    seeds = range(args.first_seed, args.first_seed + args.replays)
    summaries: dict[str, dict[str, dict[str, Any]]] = {}
    outcomes: dict[str, dict[str, list[dict[str, Any]]]] = {}
    bench_meta: dict[str, Any] = {}
    with ProcessPoolExecutor(max_workers=args.workers, initializer=_init_worker) as pool:
        for bname in args.benchmarks:
            bench = _bench(bname)
            pp = {f"+{x:g} pp": bench.best + x / 100 for x in (0.5, 1.0)} if bname == "digits" else {}
            tuned = "tuned on" if bname in TUNED_ON else "held out"
            bench_meta[bname] = {"best": bench.best, "max_fidelity": bench.max_fidelity, "role": tuned}
            print(f"\n### {bname} ({tuned}): best {bench.best:.6g}, fidelity 1…{bench.max_fidelity}", flush=True)
            summaries[bname], outcomes[bname] = {}, {}
            for name in args.optimizers:
                results = list(pool.map(run_one, [(bname, name, s, pp) for s in seeds]))
                summaries[bname][name] = summarise(bench, results)
                outcomes[bname][name] = [asdict(o) for o in results]
                s = summaries[bname][name]
                print(
                    f"  {name}: {' '.join(f'{k} {100 * v:.0f}%' for k, v in s['success'].items())}, median "
                    f"{_fmt(bench, s['incumbent_true_median'])}, dup {100 * s['duplicate_share']:.1f} %, "
                    f"{s['wall_s']:.0f} s",
                    flush=True,
                )
            print()
            print(markdown(bench, summaries[bname]))
            print(verdict(summaries[bname]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "meta": {
                "benchmarks": bench_meta,
                "tuned_on": TUNED_ON,
                "held_out": HELD_OUT,
                "replays": args.replays,
                "first_seed": args.first_seed,
                "budget_full_trainings": FULL_TRAININGS,
                "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
                "optuna": optuna.__version__,
                "run_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "wall_s": round(time.perf_counter() - wall0, 1),
            },
            "summary": summaries,
            "outcomes": outcomes,
        }
        args.json.write_text(json.dumps(_no_nan(doc), indent=1, allow_nan=False))
        print(f"\n{args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__: Sequence[str] = ["BENCHMARKS", "HELD_OUT", "TUNED_ON", "main"]
