"""In-loop controller (issue 13): does `slurmagent.runtime.adapt.Controller` save runs at
too-high learning rates, and does its warm restart help a run that plateaus? In-process on
CPU, no Slurm. See bench/README.md for what is measured and how to rerun.

    python bench/adapt_bench.py [--seeds 10] [--epochs 20] [--plateau-epochs 30] [--no-adam]

The digits MLP of `slurmagent/examples/digits.py` (width 64, depth 2, its data split, batch
64, `ResumableBatches`, `TorchState`, a `StepLoop` with the controller wired as the example
does: `loop.observe(loss=…)` after backward, `loop.report(val_error=…)` every epoch).

Explosion: SGD (momentum 0.9) at lr 0.1, 0.3, 1, 3 and Adam at 0.03, 0.1, 0.3, with
CosineAnnealingLR over the run (as digits_mlp), each seed trained in three arms with the
same initialisation and batch order: no controller (`off`), the controller with the
default `adapt.explosion` settings (`default`), and a more sensitive setting (`tuned`,
TUNED below); the plateau watch is off in both controller arms.

Plateau: SGD (lr 0.05, momentum 0.9) with ExponentialLR(gamma=0.98), a 2% decay meant per
epoch but stepped every step (a common slip): the lr falls to 0.64x per epoch, 1% of its start
after 10 epochs, and the run stalls short of what the model reaches; without and with a warm
restart (`adapt.plateau` defaults, explosion off), and the schedule as meant (stepped per
epoch, no controller) as a reference. 30 epochs, so that a restart has room to pay off.

Outside a slurmagent job `ctx.approve` is None: the controller acts on its own and records
decision "local". Every run is deterministic (one thread, deterministic algorithms); only the
timings depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from slurmagent.config import CheckpointConf, adapt_conf
from slurmagent.examples.digits import build_model, load_digits
from slurmagent.runtime import StepLoop, context_from_env
from slurmagent.runtime.adapt import Controller, grad_norm
from slurmagent.runtime.torch_state import ResumableBatches, TorchState

BENCH = Path(__file__).resolve().parent
CHANCE = 0.2  # a run ending below this val accuracy counts as near chance (10 classes)
DIVERGED_ACC = 0.1  # the accuracy a diverged run (non-finite weights) is scored at: chance

EXPLOSION_OFF_PLATEAU = {"plateau": {"enabled": False}}
# A more sensitive explosion watch, tuned on seeds 100-104 (not the seeds reported) among four
# variants (warmup 1 or 3, patience 1 or 2, factor 10 or 5). On digits a too-high lr spikes the
# gradient norm 15-6500x its first step's, above 10x for at most 1-8 steps in a row, mostly
# within the first 15 steps, and then kills most ReLUs (the loss stays ~2.3 and finite): the
# default warmup (10 norms, spikes included, build the running level) and patience (10 steps
# in a row above 10x it) never see it. Here the level starts at the first step's norm and two
# steps in a row above 5x it are enough.
TUNED = {"explosion": {"warmup": 1, "patience": 2, "factor": 5.0}, "plateau": {"enabled": False}}
ARMS: dict[str, dict[str, Any] | None] = {"off": None, "default": EXPLOSION_OFF_PLATEAU, "tuned": TUNED}
PLATEAU_ON = {"explosion": {"enabled": False}}  # adapt.plateau defaults

SGD_LRS = (0.1, 0.3, 1.0, 3.0)
ADAM_LRS = (0.03, 0.1, 0.3)


class Data:
    """The digits split of digits_mlp (360 validation images, 1437 training)."""

    def __init__(self) -> None:
        x, y = load_digits()
        split = np.random.default_rng(12345).permutation(len(x))
        val_idx, train_idx = torch.tensor(split[:360]), torch.tensor(split[360:])
        self.x_train, self.y_train = x[train_idx], y[train_idx]
        self.x_val, self.y_val = x[val_idx], y[val_idx]


def finite(model: torch.nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def val_acc(model: torch.nn.Module, data: Data) -> float:
    """NaN once the weights are not finite (a diverged run), as digits_mlp."""
    if not finite(model):
        return float("nan")
    model.eval()
    with torch.no_grad():
        acc = float((model(data.x_val).argmax(1) == data.y_val).float().mean().item())
    model.train()
    return acc


def train(
    data: Data,
    seed: int,
    optimizer: str,
    lr: float,
    epochs: int,
    adapt: dict[str, Any] | None,
    schedule: str = "cosine",
    gamma: float = 0.98,
) -> dict[str, Any]:
    """One run. schedule: cosine (T_max = the run, stepped per step, as digits_mlp) |
    exp-per-step (ExponentialLR(gamma) stepped every step) | exp-per-epoch (stepped per epoch)."""
    torch.manual_seed(seed)
    model = build_model(64, 2)
    if optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=lr)
    batches = ResumableBatches(len(data.x_train), 64, seed=seed)
    per_epoch = batches.per_epoch
    steps = epochs * per_epoch
    sched: torch.optim.lr_scheduler.LRScheduler
    if schedule == "cosine":
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    else:
        sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=gamma)
    controller = Controller(adapt_conf({"enabled": True, **adapt}), model, opt, sched) if adapt is not None else None
    loss_fn = torch.nn.CrossEntropyLoss()
    curve: list[float | None] = []
    starts: list[float] = []
    first_nonfinite: int | None = None
    last_loss = float("nan")
    observe_s = 0.0  # time in loop.observe(), all steps
    with tempfile.TemporaryDirectory(prefix="adapt-bench-") as out:
        loop = StepLoop(
            context_from_env({}, output_dir=out),
            TorchState(model, opt, sched, batches),
            steps,
            CheckpointConf(every_steps=0),  # no periodic checkpoints: the loop's final save only
            install_signal_handlers=False,
            adapt=controller,
        )
        for step in loop:
            starts.append(time.perf_counter())
            idx = batches.indices(step)
            opt.zero_grad()
            loss = loss_fn(model(data.x_train[idx]), data.y_train[idx])
            loss.backward()  # type: ignore[no-untyped-call]
            t = time.perf_counter()
            loop.observe(loss=loss)  # None and nothing computed without a controller
            observe_s += time.perf_counter() - t
            opt.step()
            if schedule != "exp-per-epoch" or (step + 1) % per_epoch == 0:
                sched.step()
            last_loss = loss.item()
            if first_nonfinite is None and not math.isfinite(last_loss):
                first_nonfinite = step
            loop.report(loss=last_loss)
            if (step + 1) % per_epoch == 0:
                acc = val_acc(model, data)
                curve.append(None if math.isnan(acc) else round(acc, 4))
                loop.report(epoch=(step + 1) // per_epoch, val_error=round(1 - acc, 6))
    acc = val_acc(model, data)
    diverged = not finite(model) or not math.isfinite(last_loss)
    records = controller.records if controller is not None else []
    applied = [r for r in records if r["applied"]]
    return {
        "seed": seed,
        "optimizer": optimizer,
        "lr": lr,
        "schedule": schedule,
        "epochs": epochs,
        "val_acc": None if diverged else round(acc, 4),
        "diverged": diverged,
        "bad": diverged or acc < CHANCE,
        "first_nonfinite_step": first_nonfinite,
        "decay_lr": sum(r["kind"] == "decay_lr" for r in applied),
        "restarts_at_epoch": [r["step"] / per_epoch for r in applied if r["kind"] == "restart_schedule"],
        "records": [
            {k: r[k] for k in ("step", "kind", "trigger", "decision", "applied")}
            | {"lr_after": r["result"].get("lr_after", [None])[0] if r["result"] else None}
            for r in records
        ],
        "final_lr": opt.param_groups[0]["lr"],
        "curve": curve,
        # seconds per step: first step's start to the last step's start (boundaries included,
        # the loop's set-up and final save not), over steps - 1
        "step_s": (starts[-1] - starts[0]) / (len(starts) - 1),
        "observe_s": observe_s / len(starts),  # per step
    }


# -- summaries ------------------------------------------------------------------------------
def acc_scored(run: dict[str, Any]) -> float:
    return DIVERGED_ACC if run["val_acc"] is None else float(run["val_acc"])


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    accs = [acc_scored(r) for r in runs]
    return {
        "runs": len(runs),
        "bad": sum(r["bad"] for r in runs),
        "diverged": sum(r["diverged"] for r in runs),
        "bad_fraction": sum(r["bad"] for r in runs) / len(runs),
        "acc_mean": statistics.fmean(accs),
        "acc_sd": statistics.stdev(accs) if len(accs) > 1 else 0.0,
        "acc_median": statistics.median(accs),
        "decay_lr_mean": statistics.fmean(r["decay_lr"] for r in runs),
        "step_us_median": 1e6 * statistics.median(r["step_s"] for r in runs),
    }


def paired(off: list[dict[str, Any]], on: list[dict[str, Any]]) -> dict[str, Any]:
    """Same seeds: how many bad runs the arm rescued, how many good ones it made bad."""
    by_seed = {r["seed"]: r for r in off}
    pairs = [(by_seed[r["seed"]], r) for r in on]
    return {
        "rescued": sum(a["bad"] and not b["bad"] for a, b in pairs),
        "broken": sum(b["bad"] and not a["bad"] for a, b in pairs),
        "acc_diff_mean": statistics.fmean(acc_scored(b) - acc_scored(a) for a, b in pairs),
        "step_time_ratio_median": statistics.median(b["step_s"] / a["step_s"] for a, b in pairs),
    }


def fmt_acc(s: dict[str, Any]) -> str:
    return f"{s['acc_mean']:.3f} / {s['acc_median']:.3f}"


def explosion_table(runs: list[dict[str, Any]], arms: list[str]) -> tuple[str, dict[str, Any]]:
    """One row per optimiser and lr; each cell holds the arms in order (off · default · tuned)."""
    keys = sorted({(r["optimizer"], r["lr"]) for r in runs}, key=lambda k: (k[0] != "sgd", k[1]))
    on = [a for a in arms if a != "off"]
    cols = [
        f"bad runs, diverged in () ({' · '.join(arms)})",
        f"final val acc, mean ({' · '.join(arms)})",
        f"median ({' · '.join(arms)})",
        f"lr decays per run ({' · '.join(on)})",
        *[f"{a} vs off: rescued / broken, Δ mean acc" for a in on],
    ]
    lines = ["| optimiser, lr | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    summary: dict[str, Any] = {}
    for opt, lr in keys:
        group = {a: [r for r in runs if r["arm"] == a and r["optimizer"] == opt and r["lr"] == lr] for a in arms}
        s = {a: summarise(group[a]) for a in arms}
        p = {a: paired(group["off"], group[a]) for a in on}
        summary[f"{opt} {lr:g}"] = {"arms": s, "paired": p}
        cells = [
            " · ".join(f"{s[a]['bad']}/{s[a]['runs']} ({s[a]['diverged']})" for a in arms),
            " · ".join(f"{s[a]['acc_mean']:.3f}" for a in arms),
            " · ".join(f"{s[a]['acc_median']:.3f}" for a in arms),
            " · ".join(f"{s[a]['decay_lr_mean']:.1f}" for a in on),
            *[f"{p[a]['rescued']} / {p[a]['broken']}, {p[a]['acc_diff_mean']:+.3f}" for a in on],
        ]
        name = "SGD" if opt == "sgd" else "Adam"
        lines.append(f"| {name} {lr:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines), summary


def overhead(runs: list[dict[str, Any]], arms: list[str]) -> tuple[str, dict[str, Any]]:
    lines = [
        "| arm | step time, median over runs | Δ vs off | with / without: median of paired ratios (ratio of medians) "
        "| in loop.observe(), median |",
        "|---|---:|---:|---:|---:|",
    ]
    out: dict[str, Any] = {}
    off = [r for r in runs if r["arm"] == "off"]
    base = statistics.median(r["step_s"] for r in off)
    for a in arms:
        mine = [r for r in runs if r["arm"] == a]
        med = statistics.median(r["step_s"] for r in mine)
        if a == "off":
            ratio = 1.0
        else:
            by = {(r["optimizer"], r["lr"], r["seed"]): r for r in off}
            ratio = statistics.median(r["step_s"] / by[(r["optimizer"], r["lr"], r["seed"])]["step_s"] for r in mine)
        obs = 1e6 * statistics.median(r["observe_s"] for r in mine)
        out[a] = {
            "step_us_median": 1e6 * med,
            "ratio_of_medians": med / base,
            "paired_ratio_median": ratio,
            "observe_us_median": obs,
        }
        lines.append(
            f"| {a} | {1e6 * med:.0f} µs | {1e6 * (med - base):+.0f} µs | {ratio:.2f}× ({med / base:.2f}×) "
            f"| {obs:.0f} µs |"
        )
    return "\n".join(lines), out


def plateau_table(runs: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    lines = [
        "| arm | final val acc, mean ± sd (min–max) | vs no controller, paired: Δ mean (seeds better / worse) "
        "| best epoch-end acc, mean | restarts per run | restart epochs (runs) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    out: dict[str, Any] = {}
    off = {r["seed"]: acc_scored(r) for r in runs if r["arm"] == "off"}
    for a in ("off", "restart", "reference"):
        mine = [r for r in runs if r["arm"] == a]
        if not mine:
            continue
        accs = [acc_scored(r) for r in mine]
        diffs = [acc_scored(r) - off[r["seed"]] for r in mine]
        best = [max(c for c in r["curve"] if c is not None) for r in mine]
        epochs = [e for r in mine for e in r["restarts_at_epoch"]]
        counts = [len(r["restarts_at_epoch"]) for r in mine]
        out[a] = {
            "acc_mean": statistics.fmean(accs),
            "acc_sd": statistics.stdev(accs) if len(accs) > 1 else 0.0,
            "acc_min": min(accs),
            "acc_max": max(accs),
            "best_mean": statistics.fmean(best),
            "restarts_mean": statistics.fmean(counts),
            "paired_diff_mean": statistics.fmean(diffs),
            "seeds_better": sum(d > 0 for d in diffs),
            "seeds_worse": sum(d < 0 for d in diffs),
            "restart_epochs": {f"{e:g}": epochs.count(e) for e in sorted(set(epochs))},
        }
        where = ", ".join(f"{e:g} ({epochs.count(e)}×)" for e in sorted(set(epochs))) or "–"
        label = {
            "off": "no controller",
            "restart": "warm restart (adapt.plateau defaults)",
            "reference": "reference: the schedule as meant (per epoch), no controller",
        }[a]
        o = out[a]
        vs = "–" if a == "off" else f"{o['paired_diff_mean']:+.3f} ({o['seeds_better']} / {o['seeds_worse']})"
        lines.append(
            f"| {label} | {out[a]['acc_mean']:.3f} ± {out[a]['acc_sd']:.3f} ({min(accs):.3f}–{max(accs):.3f}) | "
            f"{vs} | {out[a]['best_mean']:.3f} | {out[a]['restarts_mean']:.1f} | {where} |"
        )
    return "\n".join(lines), out


def micro(repeat: int = 2000) -> dict[str, float]:
    """Where the controller's time per step goes, on the same model (µs): the gradient norm
    it computes in observe(), the whole observe(), one snapshot (taken every snapshot_every
    steps), propose() + after_step() at a quiet boundary. Median of 5 timings each."""
    import timeit

    model = build_model(64, 2)
    model(torch.randn(64, 64)).sum().backward()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt.step()
    c = Controller(adapt_conf({"enabled": True, **EXPLOSION_OFF_PLATEAU}), model, opt, None)
    loss = torch.tensor(1.0)

    def us(fn: Callable[[], object], n: int) -> float:
        return 1e6 * min(timeit.repeat(fn, number=n, repeat=5)) / n

    return {
        "grad_norm_us": us(lambda: grad_norm(model), repeat),
        "observe_us": us(lambda: c.observe(0, None, loss), repeat),
        "snapshot_us": us(lambda: c._take_snapshot(0), repeat // 10),
        "propose_after_step_us": us(lambda: (c.propose(5), c.after_step(5)), repeat),
    }


# -- the run --------------------------------------------------------------------------------
def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=BENCH, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_all(
    cases: list[tuple[str, dict[str, Any]]], train_fn: Callable[..., dict[str, Any]], label: str
) -> list[dict[str, Any]]:
    """Run every case (arm, kwargs) in order, printing a line per run."""
    out = []
    for i, (arm, kw) in enumerate(cases):
        r = train_fn(**kw)
        r["arm"] = arm
        out.append(r)
        acc = "diverged" if r["val_acc"] is None else f"{r['val_acc']:.3f}"
        print(
            f"[{label} {i + 1}/{len(cases)}] {arm:9} {r['optimizer']} lr={r['lr']:g} seed={r['seed']} "
            f"{r['schedule']}: acc {acc}, decays {r['decay_lr']}, restarts {r['restarts_at_epoch']}, "
            f"{1e6 * r['step_s']:.0f} µs/step",
            flush=True,
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10, help="seeds per case (0..N-1)")
    ap.add_argument("--seed-offset", type=int, default=0, help="first seed (the tuned arm was tuned on 100-104)")
    ap.add_argument("--epochs", type=int, default=20, help="epochs per explosion run (22 steps each)")
    ap.add_argument("--plateau-epochs", type=int, default=30, help="epochs per plateau run")
    ap.add_argument("--plateau-lr", type=float, default=0.05, help="SGD lr of the plateau case")
    ap.add_argument("--plateau-gamma", type=float, default=0.98, help="its ExponentialLR gamma (per step)")
    ap.add_argument("--no-adam", action="store_true", help="SGD only")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--skip-plateau", action="store_true")
    ap.add_argument("--skip-explosion", action="store_true")
    ap.add_argument("--json", type=Path, default=BENCH / "results" / "adapt_bench.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    data = Data()
    seeds = range(args.seed_offset, args.seed_offset + args.seeds)
    arms = ["off", *[a for a in args.arms if a != "off"]]
    started, load_before = time.monotonic(), os.getloadavg()

    explosion: list[dict[str, Any]] = []
    if not args.skip_explosion:
        grid = [("sgd", lr) for lr in SGD_LRS] + ([] if args.no_adam else [("adam", lr) for lr in ADAM_LRS])
        cases = []
        for opt, lr in grid:
            for seed in seeds:
                # the arms of a seed back to back, their order rotated, so they share the machine's load
                order = arms[seed % len(arms) :] + arms[: seed % len(arms)]
                for arm in order:
                    kw = {"data": data, "seed": seed, "optimizer": opt, "lr": lr, "epochs": args.epochs}
                    cases.append((arm, {**kw, "adapt": ARMS[arm]}))
        explosion = run_all(cases, train, "explosion")

    plateau: list[dict[str, Any]] = []
    if not args.skip_plateau:
        cases = []
        for seed in seeds:
            kw = {"data": data, "seed": seed, "optimizer": "sgd", "lr": args.plateau_lr, "epochs": args.plateau_epochs}
            kw["gamma"] = args.plateau_gamma
            cases += [
                ("off", {**kw, "adapt": None, "schedule": "exp-per-step"}),
                ("restart", {**kw, "adapt": PLATEAU_ON, "schedule": "exp-per-step"}),
                ("reference", {**kw, "adapt": None, "schedule": "exp-per-epoch"}),
            ]
        plateau = run_all(cases, train, "plateau")

    wall = time.monotonic() - started
    result: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": git_commit(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch threads 1",
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "wall_s": round(wall, 1),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "arms": {a: ARMS[a] for a in arms},
        "plateau_arm": PLATEAU_ON,
        "chance_threshold": CHANCE,
        "diverged_scored_as": DIVERGED_ACC,
    }
    if explosion:
        table, summary = explosion_table(explosion, arms)
        otable, osummary = overhead(explosion, arms)
        osummary["parts"] = micro()
        result |= {"explosion": summary, "overhead": osummary}
        parts = ", ".join(f"{k} {v:.1f}" for k, v in osummary["parts"].items())
        print("\n" + table + "\n\n" + otable + "\n\nparts (µs): " + parts)
    if plateau:
        ptable, psummary = plateau_table(plateau)
        result["plateau"] = psummary
        print("\n" + ptable)
    result["runs"] = {"explosion": explosion, "plateau": plateau}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwall {wall:.0f} s, load {load_before} → {result['load_after']}; {args.json}")


if __name__ == "__main__":
    main()
