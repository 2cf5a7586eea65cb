"""Replays hyperparameter optimisers against the tabular benchmark (bench/hpo_table.py): no
training, each "train configuration C to epoch f" is a look-up of recorded curves.

    .venv/bin/python bench/hpo_replay.py --replays 200 --targets abs:0.5 abs:1 abs:2 [--optimizers random asha ...]

The search space the optimisers see: learning rate log-uniform on [1e-4, 1.0] (snapped to
the nearest of the table's 12 values in log space when looked up), width, depth and
optimiser as categorical choices. Each trial gets one of the table's seeds (drawn from the
replay's generator) and sees that seed's curve, so the optimisers see seed noise as they
would in a real run. One worker, sequential.

Budget: `--budget` epochs per replay (600 = 30 full 20-epoch trainings). Every epoch trained
counts, those of trials stopped early included; a trial continued from its checkpoint pays
only for the epochs it adds. A replay ends when the budget is spent (a trial that runs past
it is cut there and never counted as fully trained). slurmagent's optimisers are driven as
slurmagent's study driver drives them (`supervise/study.py`): `ask_within(budget - spent())`,
so they never start a step that does not fit and stop when none does; Optuna's have no
such call and run their last trial until the budget cuts it.

Measured per optimiser over the replays (replay r: optimiser seed r and the same seed draws
for every optimiser):
  - for each target (a validation error; see --targets): *success* = the fraction of replays
    in which some trial trained to the full 20 epochs had a final (epoch-20) validation error
    <= target, as that trial observed it (its seed); *epochs to target* = the budget spent at
    the end of that trial's 20th epoch, the median over all replays, one that never reached
    the target counting as more than the budget (the JSON also has the median and quartiles
    over the successful replays alone);
  - the *incumbent* at the end of the budget: the fully trained trial with the lowest
    observed final error; its observed error and its configuration's seed-averaged final
    error (what it is worth), averaged over the replays;
  - trials started, full trainings, and the wall time of all the replays of the optimiser;
  - *slow starters*: the configurations among the `--top` best by seed-averaged final error
    whose seed-averaged epoch-1 error ranks below `--slow-rank` of all configurations
    (default: configurations / eta, the share a halving rung at epoch 1 keeps; a diverged
    epoch ranks last); how many trials of them each optimiser started, and how many of
    those it trained to the full 20 epochs (and the same for the other top ones);
  - what it proposed: the median (over replays) of the median seed-averaged final error of
    the configurations its trials used, and the share of its trials at the two smallest or
    the two largest learning rates of the grid.

Optimisers (reduction factor 3 wherever halving applies; fidelity in epochs, 1 to 20):
  random           Optuna RandomSampler, every trial trained to 20 epochs
  asha             RandomSampler + SuccessiveHalvingPruner(reduction_factor=3, min_resource=1):
                   rungs at 1, 3, 9 epochs, trials report every epoch
  tpe_hyperband    TPESampler + HyperbandPruner(min_resource=1, max_resource=20, reduction_factor=3)
  tpe              TPESampler, no pruning (every trial to 20 epochs)
  slurmagent       slurmagent.hpo.core.Optimizer(min_fidelity=1, max_fidelity=20, eta=3): ask, look
                   up to a.fidelity (a promotion pays only its new epochs), tell the curve
  slurmagent_plain the same with its slow-starter measure off: late_start=0 (every new trial
                   at the first rung; the default starts every 4th at the second rung)
  slurmagent_projection
                   the default plus projection=0.5: a trial ranks at a rung by the better of its
                   value and its value projected one rung on from its curve's slope, damped
  slurmagent_halton, slurmagent_plain_halton
                   the two above without the focus (n_explore = 10^9: every new trial from the
                   seeded Halton design, no TPE), so both propose the same configurations in the
                   same order and differ only in how trials start and are ranked at a rung
The Optuna optimisers get 1.0 (the worst possible error) for a diverged (NaN) epoch, since
Optuna fails a trial whose value is NaN and its samplers then ignore it; slurmagent's gets NaN,
which its tell() accepts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import optuna

BENCH = Path(__file__).resolve().parent
DEFAULT_TABLE = BENCH / "data" / "hpo_table.json.gz"
DEFAULT_JSON = BENCH / "results" / "hpo_replay.json"
OPTIMIZERS = [
    "random",
    "asha",
    "tpe_hyperband",
    "tpe",
    "slurmagent",
    "slurmagent_plain",
    "slurmagent_projection",
    "slurmagent_halton",
    "slurmagent_plain_halton",
]
NO_FOCUS = 10**9  # n_explore for the *_halton variants: the exploration design never ends
ETA = 3
DIVERGED_FOR_OPTUNA = 1.0


class Table:
    """The recorded curves: val[row, seed, epoch - 1] (NaN: diverged)."""

    def __init__(self, path: Path) -> None:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            doc = json.load(fh)
        self.meta: dict[str, Any] = doc["meta"]
        grid = self.meta["grid"]
        self.lrs = np.array(grid["lr"], dtype=float)
        self.widths: list[int] = list(grid["width"])
        self.depths: list[int] = list(grid["depth"])
        self.optimizers: list[str] = list(grid["optimizer"])
        self.epochs = int(self.meta["epochs"])
        self.params: list[dict[str, Any]] = [c["params"] for c in doc["configs"]]
        self.val = np.array(
            [[[math.nan if v is None else v for v in seed] for seed in c["val_error"]] for c in doc["configs"]],
            dtype=float,
        )
        self.n_seeds = self.val.shape[1]
        self._rows = {
            (p["optimizer"], int(p["depth"]), int(p["width"]), self._lr_index(float(p["lr"]))): i
            for i, p in enumerate(self.params)
        }
        # a configuration diverged in any seed has no finite mean: it is never the best
        self.final_mean = self.val[:, :, -1].mean(axis=1)
        self.best = float(np.nanmin(self.final_mean))
        self.epoch1_mean = self.val[:, :, 0].mean(axis=1)

    def rank(self, row: int, epoch: int) -> int:
        """1-based rank (ties share the best) of the row's seed-averaged error at `epoch` among
        all rows; a diverged one (NaN) ranks last."""
        mean = self.val[:, :, epoch - 1].mean(axis=1)
        mean = np.where(np.isnan(mean), np.inf, mean)
        return int(np.sum(mean < mean[row])) + 1

    def starters(self, top: int, slow_rank: int) -> tuple[list[int], list[int]]:
        """The `top` best rows by seed-averaged final error, and those of them whose seed-averaged
        epoch-1 error ranks below `slow_rank` (a halving rung at epoch 1 would likely cut them)."""
        order = np.argsort(np.where(np.isnan(self.final_mean), np.inf, self.final_mean), kind="stable")
        best = [int(i) for i in order[:top]]
        return best, [i for i in best if self.rank(i, 1) > slow_rank]

    def _lr_index(self, lr: float) -> int:
        return int(np.argmin(np.abs(np.log(self.lrs) - math.log(lr))))

    def row(self, lr: float, width: int, depth: int, optimizer: str) -> int:
        """The configuration a proposal stands for: lr snapped to the nearest grid value (log)."""
        return self._rows[(optimizer, depth, width, self._lr_index(lr))]


@dataclass
class Run:
    """One trial's training: a configuration, the seed it got, the epochs trained so far."""

    row: int
    seed: int
    done: int = 0


@dataclass
class Outcome:
    optimizer: str
    replay: int
    spent: int = 0
    trials: int = 0
    full: int = 0  # trials trained to the last epoch
    hits: dict[str, int | None] = field(default_factory=dict)  # target → epochs spent when first reached
    incumbent: float = math.nan  # observed final error of the best fully trained trial
    incumbent_true: float = math.nan  # seed-averaged final error of that trial's configuration
    wall_s: float = 0.0
    top_started: int = 0  # trials of the --top configurations (slow starters excluded)
    top_full: int = 0  # … of those trained to the last epoch
    slow_started: int = 0  # trials of the slow-starter configurations
    slow_full: int = 0  # … of those trained to the last epoch
    slow_reached: list[int] = field(default_factory=list)  # epochs each slow-starter trial reached
    proposed_final: float = math.nan  # median seed-averaged final error of the trials' configurations
    proposed_extreme_lr: float = math.nan  # share of trials at the lr grid's two ends on either side


class Ledger:
    """The budget of one replay, and what was reached with it."""

    def __init__(self, table: Table, budget: int, targets: dict[str, float], outcome: Outcome, seed: int) -> None:
        self.table = table
        self.budget = budget
        self.targets = targets
        self.out = outcome
        self.out.hits = dict.fromkeys(targets)
        self.rng = np.random.default_rng([seed, 20261201])
        self.runs: list[Run] = []

    @property
    def exhausted(self) -> bool:
        return self.out.spent >= self.budget

    def start(self, row: int) -> Run:
        self.out.trials += 1
        run = Run(row, int(self.rng.integers(self.table.n_seeds)))
        self.runs.append(run)
        return run

    def count_starters(self, top: Sequence[int], slow: Sequence[int]) -> None:
        """Fills the outcome's top/slow-starter counts and what was proposed from the trials run."""
        if self.runs:
            final = np.nan_to_num(self.table.final_mean[[r.row for r in self.runs]], nan=1.0)  # diverged: worst
            self.out.proposed_final = float(np.median(final))
            lrs = self.table.lrs
            ends = {float(lrs[0]), float(lrs[1]), float(lrs[-2]), float(lrs[-1])}
            self.out.proposed_extreme_lr = sum(float(self.table.params[r.row]["lr"]) in ends for r in self.runs) / len(
                self.runs
            )
        for run in self.runs:
            full = run.done >= self.table.epochs
            if run.row in slow:
                self.out.slow_started += 1
                self.out.slow_full += full
                self.out.slow_reached.append(run.done)
            elif run.row in top:
                self.out.top_started += 1
                self.out.top_full += full

    def value(self, run: Run, epoch: int) -> float:
        return float(self.table.val[run.row, run.seed, epoch - 1])

    def advance(self, run: Run, to_epoch: int) -> bool:
        """Trains `run` up to `to_epoch` (paying each new epoch); False if the budget ran out first."""
        while run.done < to_epoch:
            if self.exhausted:
                return False
            self.out.spent += 1
            run.done += 1
            if run.done == self.table.epochs:
                self._fully_trained(run)
        return True

    def _fully_trained(self, run: Run) -> None:
        self.out.full += 1
        final = self.value(run, self.table.epochs)
        if math.isnan(final):
            return
        for name, target in self.targets.items():
            if self.out.hits[name] is None and final <= target:
                self.out.hits[name] = self.out.spent
        if math.isnan(self.out.incumbent) or final < self.out.incumbent:
            self.out.incumbent = final
            self.out.incumbent_true = float(self.table.final_mean[run.row])


# -- the optimisers --------------------------------------------------------------------------


def replay_optuna(
    table: Table, ledger: Ledger, sampler: optuna.samplers.BaseSampler, pruner: optuna.pruners.BasePruner
) -> None:
    """Optuna's ask/tell loop; the trial reports after every epoch and may be pruned. The study
    has a fixed name: HyperbandPruner assigns brackets by a hash of the study's name and the
    trial number, and an unnamed study gets a random one (the replays would not repeat)."""
    study = optuna.create_study(study_name="replay", direction="minimize", sampler=sampler, pruner=pruner)
    low, high = float(table.lrs[0]), float(table.lrs[-1])
    while not ledger.exhausted:
        trial = study.ask()
        lr = trial.suggest_float("lr", low, high, log=True)
        width = int(trial.suggest_categorical("width", table.widths))
        depth = int(trial.suggest_categorical("depth", table.depths))
        name = str(trial.suggest_categorical("optimizer", table.optimizers))
        run = ledger.start(table.row(lr, width, depth, name))
        for epoch in range(1, table.epochs + 1):
            if not ledger.advance(run, epoch):
                return  # the budget is spent; the trial is left unfinished
            value = ledger.value(run, epoch)
            if math.isnan(value):
                value = DIVERGED_FOR_OPTUNA
            if epoch == table.epochs:
                study.tell(trial, value)
                break
            trial.report(value, epoch)
            if trial.should_prune():
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                break


def replay_slurmagent(
    table: Table, ledger: Ledger, seed: int, plain: bool = False, focus: bool = True, projection: float = 0.0
) -> None:
    """slurmagent's ask/tell optimiser as its study driver runs it: ask within the budget left,
    look the ask up to its fidelity, tell the curve. `plain`: late_start=0 (no trial starts at
    the second rung); `projection`: rank by the damped projection too (off by default); not
    `focus`: no TPE, the Halton design throughout."""
    n_explore = None if focus else NO_FOCUS
    _replay_slurmagent(table, ledger, seed, late_start=0 if plain else 4, n_explore=n_explore, projection=projection)


def _replay_slurmagent(
    table: Table, ledger: Ledger, seed: int, late_start: int, n_explore: int | None, projection: float = 0.0
) -> None:
    from slurmagent.hpo.core import Optimizer
    from slurmagent.hpo.space import Space

    def choice(values: Sequence[Any]) -> str:
        return "choice(" + ",".join(str(v) for v in values) + ")"

    space = Space.from_overrides(
        [
            f"optim.lr=tag(log,interval({float(table.lrs[0])!r},{float(table.lrs[-1])!r}))",
            f"model.width={choice(table.widths)}",
            f"model.depth={choice(table.depths)}",
            f"optim.name={choice(table.optimizers)}",
        ]
    )
    opt = Optimizer(
        space,
        min_fidelity=1,
        max_fidelity=table.epochs,
        eta=ETA,
        seed=seed,
        direction="minimize",
        late_start=late_start,
        n_explore=n_explore,
        projection=projection,
    )
    runs: dict[int, Run] = {}
    while not ledger.exhausted:
        a = opt.ask_within(ledger.budget - opt.spent())
        if a is None:
            return  # nothing fits in what is left of the budget
        p = a.params
        row = table.row(float(p["optim.lr"]), int(p["model.width"]), int(p["model.depth"]), str(p["optim.name"]))
        if a.resume is not None:
            run = runs[a.resume]
            if run.row != row:
                raise RuntimeError(f"trial {a.trial} resumes trial {a.resume} with other parameters: {p}")
        else:
            run = ledger.start(row)
        runs[a.trial] = run
        if not ledger.advance(run, a.fidelity):
            raise RuntimeError(f"ask_within gave trial {a.trial} to epoch {a.fidelity}: past the budget")
        if opt.spent() != ledger.out.spent:
            raise RuntimeError(f"Optimizer.spent() = {opt.spent()}, epochs trained = {ledger.out.spent}")
        opt.tell(a.trial, {epoch: ledger.value(run, epoch) for epoch in range(1, a.fidelity + 1)})


def make_replay(name: str, table: Table) -> Callable[[Ledger, int], None]:
    samplers = optuna.samplers
    pruners = optuna.pruners
    if name == "random":
        return lambda ledger, seed: replay_optuna(table, ledger, samplers.RandomSampler(seed=seed), pruners.NopPruner())
    if name == "asha":
        return lambda ledger, seed: replay_optuna(
            table,
            ledger,
            samplers.RandomSampler(seed=seed),
            pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=ETA),
        )
    if name == "tpe_hyperband":
        return lambda ledger, seed: replay_optuna(
            table,
            ledger,
            samplers.TPESampler(seed=seed),
            pruners.HyperbandPruner(min_resource=1, max_resource=table.epochs, reduction_factor=ETA),
        )
    if name == "tpe":
        return lambda ledger, seed: replay_optuna(table, ledger, samplers.TPESampler(seed=seed), pruners.NopPruner())
    if name == "slurmagent":
        return lambda ledger, seed: replay_slurmagent(table, ledger, seed)
    if name == "slurmagent_plain":
        return lambda ledger, seed: replay_slurmagent(table, ledger, seed, plain=True)
    if name == "slurmagent_projection":
        return lambda ledger, seed: replay_slurmagent(table, ledger, seed, projection=0.5)
    if name == "slurmagent_halton":
        return lambda ledger, seed: replay_slurmagent(table, ledger, seed, focus=False)
    if name == "slurmagent_plain_halton":
        return lambda ledger, seed: replay_slurmagent(table, ledger, seed, plain=True, focus=False)
    raise ValueError(f"unknown optimiser {name!r}; known: {', '.join(OPTIMIZERS)}")


# -- measuring ------------------------------------------------------------------------------


def parse_targets(specs: Sequence[str], best: float) -> dict[str, float]:
    """'rel:5' = best x 1.05; 'abs:1' = best + 1 percentage point (0.01 of error)."""
    targets: dict[str, float] = {}
    for spec in specs:
        kind, _, amount = spec.partition(":")
        x = float(amount)
        if kind == "rel":
            targets[f"best × {1 + x / 100:g}"] = best * (1 + x / 100)
        elif kind == "abs":
            targets[f"best + {x:g} pp"] = best + x / 100
        else:
            raise SystemExit(f"--targets: {spec!r} is not rel:PERCENT or abs:POINTS")
    return targets


def summarise(outcomes: list[Outcome], targets: dict[str, float], budget: int) -> dict[str, Any]:
    n = len(outcomes)
    per_target: dict[str, Any] = {}
    for name in targets:
        hits = sorted(h for o in outcomes if (h := o.hits[name]) is not None)
        every = [math.inf if o.hits[name] is None else float(o.hits[name]) for o in outcomes]  # type: ignore[arg-type]
        median_all = statistics.median(every)
        per_target[name] = {
            "success": len(hits) / n,
            # over every replay, a replay that never reached the target counting as "more than the budget"
            "median_epochs_all": median_all if math.isfinite(median_all) else None,
            "median_epochs": statistics.median(hits) if hits else None,  # over the successful replays
            "q25_epochs": float(np.percentile(hits, 25)) if hits else None,
            "q75_epochs": float(np.percentile(hits, 75)) if hits else None,
        }
    incumbents = [o.incumbent for o in outcomes if not math.isnan(o.incumbent)]
    trues = [o.incumbent_true for o in outcomes if not math.isnan(o.incumbent_true)]
    slow_started = sum(o.slow_started for o in outcomes)
    slow_full = sum(o.slow_full for o in outcomes)
    top_started = sum(o.top_started for o in outcomes)
    top_full = sum(o.top_full for o in outcomes)
    reached = [e for o in outcomes for e in o.slow_reached]
    return {
        "replays": n,
        "budget": budget,
        "targets": per_target,
        "incumbent_mean": statistics.fmean(incumbents) if incumbents else None,
        "incumbent_true_mean": statistics.fmean(trues) if trues else None,
        "no_incumbent": n - len(incumbents),
        "spent_mean": statistics.fmean(o.spent for o in outcomes),
        "trials_mean": statistics.fmean(o.trials for o in outcomes),
        "full_mean": statistics.fmean(o.full for o in outcomes),
        "proposed_final_median": statistics.median(o.proposed_final for o in outcomes),
        "proposed_extreme_lr_mean": statistics.fmean(o.proposed_extreme_lr for o in outcomes),
        "slow": {
            "started": slow_started,
            "full": slow_full,
            "full_rate": slow_full / slow_started if slow_started else None,
            "replays_started": sum(o.slow_started > 0 for o in outcomes),
            "replays_full": sum(o.slow_full > 0 for o in outcomes),
            "reached_median": statistics.median(reached) if reached else None,
            "reached_ge3": sum(e >= 3 for e in reached),
            "reached_ge9": sum(e >= 9 for e in reached),
        },
        "top_other": {
            "started": top_started,
            "full": top_full,
            "full_rate": top_full / top_started if top_started else None,
            "replays_full": sum(o.top_full > 0 for o in outcomes),
        },
        "wall_s": sum(o.wall_s for o in outcomes),
    }


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.2f} %"


def markdown(summary: dict[str, dict[str, Any]], targets: dict[str, float]) -> str:
    """The main table: per target success, median epochs (all replays) and its ratio to random's."""
    names = list(targets)
    head = ["optimiser"]
    for t in names:
        head += [f"success, {t}", f"median epochs to {t}", "× random"]
    head += ["incumbent final error: observed / seed-mean", "trials started (full)", "replay wall"]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    ref = summary.get("random")
    for opt, s in summary.items():
        cells = [opt]
        for t in names:
            r = s["targets"][t]
            cells.append(f"{100 * r['success']:.0f} %")
            med = r["median_epochs_all"]
            cells.append(f"> {s['budget']}" if med is None else f"{med:.0f}")
            base = None if ref is None else ref["targets"][t]["median_epochs_all"]
            cells.append("–" if med is None or base is None else f"{med / base:.2f}")
        cells.append(f"{_pct(s['incumbent_mean'])} / {_pct(s['incumbent_true_mean'])}")
        cells.append(f"{s['trials_mean']:.1f} ({s['full_mean']:.1f})")
        cells.append(f"{s['wall_s']:.1f} s")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_starters(summary: dict[str, dict[str, Any]]) -> str:
    """Slow starters vs the other top configurations: started, and trained to the full length."""
    head = [
        "optimiser",
        "slow-starter trials started",
        "… trained to 20 epochs",
        "… reached ≥ 3 / ≥ 9 epochs",
        "replays with one fully trained",
        "other top trials started",
        "… trained to 20 epochs",
        "proposed: median seed-mean final error",
        "… lr at the grid's ends",
    ]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for opt, s in summary.items():
        slow, top, n = s["slow"], s["top_other"], s["replays"]

        def rate(full: int, started: int) -> str:
            return f"{full} ({100 * full / started:.0f} %)" if started else "0"

        cells = [
            opt,
            str(slow["started"]),
            rate(slow["full"], slow["started"]),
            f"{slow['reached_ge3']} / {slow['reached_ge9']}",
            f"{slow['replays_full']} of {n}",
            str(top["started"]),
            rate(top["full"], top["started"]),
            _pct(s["proposed_final_median"]),
            f"{100 * s['proposed_extreme_lr_mean']:.0f} %",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", type=Path, default=DEFAULT_TABLE)
    parser.add_argument("--replays", type=int, default=30)
    parser.add_argument("--first-seed", type=int, default=0, help="replays use seeds first-seed … first-seed+replays-1")
    parser.add_argument("--budget", type=int, default=600, help="epochs per replay (600 = 30 full trainings)")
    parser.add_argument("--optimizers", nargs="+", default=OPTIMIZERS, choices=OPTIMIZERS)
    parser.add_argument(
        "--targets",
        nargs="+",
        default=["rel:1", "rel:5", "abs:0.5", "abs:1"],
        help="rel:P = best x (1 + P/100); abs:Q = best + Q percentage points",
    )
    parser.add_argument(
        "--top", type=int, default=60, help="the best configurations (seed-averaged final error) to follow"
    )
    parser.add_argument(
        "--slow-rank",
        type=int,
        default=None,
        help="a top configuration whose epoch-1 rank is worse than this is a slow starter "
        "(default: configurations / eta, the share a halving rung at epoch 1 keeps)",
    )
    parser.add_argument(
        "--json",
        type=lambda s: Path(s) if s else None,
        default=DEFAULT_JSON,
        help="per-replay outcomes and the summary ('': none)",
    )
    args = parser.parse_args(argv)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    table = Table(args.table)
    targets = parse_targets(args.targets, table.best)
    best_row = int(np.nanargmin(table.final_mean))
    resolution = 1 / int(table.meta["val_samples"])
    print(
        f"table: {len(table.params)} configurations x {table.n_seeds} seeds x {table.epochs} epochs; "
        f"best seed-averaged final error {100 * table.best:.3f} % ({table.params[best_row]}); "
        f"one validation sample = {100 * resolution:.3f} pp"
    )
    for name, value in targets.items():
        n_cfg = int(np.sum(table.final_mean <= value))
        print(f"  target {name}: {100 * value:.3f} %  ({n_cfg} configurations' seed-mean at or below it)")
    slow_rank = args.slow_rank if args.slow_rank is not None else len(table.params) // ETA
    top, slow = table.starters(args.top, slow_rank)
    starters: list[dict[str, Any]] = [
        {
            "params": table.params[row],
            "final_mean": float(table.final_mean[row]),
            "final_rank": table.rank(row, table.epochs),
            "epoch1_mean": None if math.isnan(table.epoch1_mean[row]) else float(table.epoch1_mean[row]),
            "rank_at": {e: table.rank(row, e) for e in (1, 3, 9)},
            "slow": row in slow,
        }
        for row in top
    ]
    print(
        f"top {args.top} configurations by seed-averaged final error: {len(slow)} slow starters "
        f"(epoch-1 rank > {slow_rank}):"
    )
    for st in starters:
        if st["slow"]:
            e1 = "diverged" if st["epoch1_mean"] is None else f"{100 * st['epoch1_mean']:.2f} %"
            ranks = ", ".join(f"epoch {e} #{r}" for e, r in st["rank_at"].items())
            print(
                f"  final {100 * st['final_mean']:.2f} % (#{st['final_rank']}); epoch 1 {e1}; {ranks}: {st['params']}"
            )

    wall0, cpu0 = time.perf_counter(), time.process_time()
    outcomes: dict[str, list[Outcome]] = {}
    summary: dict[str, dict[str, Any]] = {}
    for name in args.optimizers:
        replay = make_replay(name, table)
        outcomes[name] = []
        for seed in range(args.first_seed, args.first_seed + args.replays):
            out = Outcome(name, seed)
            ledger = Ledger(table, args.budget, targets, out, seed)
            t0 = time.perf_counter()
            replay(ledger, seed)
            out.wall_s = time.perf_counter() - t0
            ledger.count_starters(top, slow)
            outcomes[name].append(out)
        summary[name] = summarise(outcomes[name], targets, args.budget)
        print(f"{name}: {args.replays} replays in {summary[name]['wall_s']:.1f} s", flush=True)

    print()
    print(markdown(summary, targets))
    print()
    print(markdown_starters(summary))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "meta": {
                "table": str(args.table),
                "table_generated_at": table.meta.get("generated_at"),
                "best": table.best,
                "best_params": table.params[best_row],
                "targets": targets,
                "budget": args.budget,
                "replays": args.replays,
                "first_seed": args.first_seed,
                "top": args.top,
                "slow_rank": slow_rank,
                "starters": starters,
                "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
                "optuna": optuna.__version__,
                "run_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "wall_s": round(time.perf_counter() - wall0, 1),
                "cpu_s": round(time.process_time() - cpu0, 1),
            },
            "summary": summary,
            "outcomes": {k: [asdict(o) for o in v] for k, v in outcomes.items()},
        }
        args.json.write_text(json.dumps(_no_nan(doc), indent=1, allow_nan=False))
        print(f"\n{args.json}")
    return 0


def _no_nan(value: Any) -> Any:
    """NaN and ±inf → None, all the way down (strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_no_nan(v) for v in value]
    return value


if __name__ == "__main__":
    sys.exit(main())
