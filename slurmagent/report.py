"""`slurmagent report SWEEP_DIR`: one HTML page for a sweep, with a PNG beside it for every
metric the tasks reported (each task's curve over its steps), and the results table.

The curves come from each task's `metrics.jsonl` (what `loop.report(...)` wrote). A
requeued or resubmitted task appends to the same file; a step run twice keeps its last
value, so a curve shows what the finished model went through. The page needs no server and
no script from elsewhere: open it from the disk.
"""

from __future__ import annotations

import html
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurmagent.runtime.env import TaskFile
from slurmagent.supervise.state import SweepState, SweepStore
from slurmagent.supervise.views import (
    STUDY_BEST,
    adapt_records,
    columns,
    load_trials,
    result_rows,
    study_line,
    summary_line,
    task_dir,
    varying_overrides,
)

MAX_METRICS = 12  # plots per report; the rest are in metrics.jsonl
MAX_CURVES = 40  # tasks drawn per plot (the first ones by index); the table lists all


@dataclass(frozen=True)
class Report:
    page: Path  # index.html
    images: list[Path]  # one PNG per metric
    tasks: int  # tasks in the sweep
    curves: int  # tasks with at least one reported metric


def task_curves(path: Path) -> dict[str, list[tuple[int, float]]]:
    """metrics.jsonl → metric name → [(step, value)], by step; a step reported twice (a run
    after a requeue redid it) keeps its last value."""
    by_name: dict[str, dict[int, float]] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut by a kill: the rest of the file still counts
        if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
            continue
        for name, value in rec.items():
            # the step and the epoch are axes, not metrics (an epoch's line marks where its values were taken)
            if name not in ("step", "epoch") and isinstance(value, (int, float)) and not isinstance(value, bool):
                by_name.setdefault(name, {})[rec["step"]] = float(value)
    return {name: sorted(points.items()) for name, points in by_name.items()}


def _file_name(metric: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", metric)[:80] + ".png"


def _label(params: dict[str, str], index: int) -> str:
    text = " ".join(f"{k}={v}" for k, v in params.items())
    return f"#{index} {text}"[:60]


def plot(metric: str, curves: dict[int, list[tuple[int, float]]], labels: dict[int, str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on login or compute nodes
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    try:
        for index, points in sorted(curves.items())[:MAX_CURVES]:
            steps, values = zip(*points, strict=True)
            ax.plot(steps, values, label=labels[index], linewidth=1.2)
        ax.set_xlabel("step")
        ax.set_ylabel(metric)
        ax.set_title(metric)
        ax.grid(alpha=0.3)
        if len(curves) <= 12:
            ax.legend(fontsize=7, loc="best")
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)


# -- a search's own plots (hydra/sweeper=slurmagent_hpo: SWEEP/hpo/trials.json) ------------------
def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    return plt


def search_plots(trials: dict[str, Any], out: Path) -> list[Path]:
    """history.png (the objective of every trial, the best so far), curves.png (every trial's
    learning curve with its rung decisions: promoted ▲, stopped ✕, diverged or failed ●),
    params.png (each parameter over the trials: the narrowing), parallel.png (parallel
    coordinates coloured by the objective) and importance.png (Optuna's parameter
    importances at the lowest rung, where every trial has a value)."""
    plt = _pyplot()
    rows = trials.get("trials", [])
    objective, rungs = str(trials.get("objective", "objective")), list(trials.get("rungs", []))
    sign = 1.0 if trials.get("direction", "minimize") == "minimize" else -1.0
    made: list[Path] = []

    def save(fig: Any, name: str) -> None:
        try:
            fig.tight_layout()
            fig.savefig(out / name)
            made.append(out / name)
        finally:
            plt.close(fig)

    # history
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    top = rungs[-1] if rungs else 0
    for row in rows:
        if row["value"] is not None:
            full = row["epochs"] >= top
            ax.scatter(
                row["trial"], row["value"], s=28 if full else 12, c="tab:blue" if full else "tab:gray", alpha=0.8
            )
    best, line = None, []
    for row in rows:
        if row["value"] is not None and row["epochs"] >= top and (best is None or sign * row["value"] < sign * best):
            best = row["value"]
        line.append(best)
    if any(v is not None for v in line):
        ax.step(
            [r["trial"] for r in rows],
            [math.nan if v is None else v for v in line],
            where="post",
            color="tab:red",
            label=f"best after {top} epochs",
        )
        ax.legend(fontsize=8)
    ax.set_xlabel("trial")
    ax.set_ylabel(f"{objective} at the epochs reached (blue: full training)")
    ax.set_title("optimisation history")
    ax.grid(alpha=0.3)
    save(fig, "history.png")

    # learning curves with the rung decisions
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    for row in rows:
        curve = sorted((int(k), v) for k, v in row["curve"].items())
        finite = [(e, v) for e, v in curve if v is not None]
        if finite:
            ax.plot(*zip(*finite, strict=True), linewidth=0.9, alpha=0.6)
        for e in row.get("promoted_at", []):
            value = row["curve"].get(str(e))
            if value is not None:
                ax.scatter(e, value, marker="^", c="tab:green", s=30, zorder=3)
        if row["state"] == "stopped" and finite:
            ax.scatter(*finite[-1], marker="x", c="tab:gray", s=30, zorder=3)
        if row["state"] in ("diverged", "failed") and finite:
            ax.scatter(*finite[-1], marker="o", c="tab:red", s=30, zorder=3)
    for r in rungs:
        ax.axvline(r, color="black", linewidth=0.5, linestyle=":")
    ax.set_xscale("log" if rungs and rungs[-1] > 10 else "linear")
    ax.set_xlabel("epoch (dotted: rungs; ▲ promoted, ✕ stopped, ● diverged/failed)")
    ax.set_ylabel(objective)
    ax.set_title("learning curves and rung decisions")
    ax.grid(alpha=0.3)
    save(fig, "curves.png")

    names = sorted({k for row in rows for k in row["params"]})
    scales: dict[str, str] = dict(trials.get("space", {}))
    numeric = [n for n in names if all(isinstance(r["params"].get(n), (int, float)) for r in rows if n in r["params"])]
    first_rung = {r["trial"]: r["curve"].get(str(rungs[0])) if rungs else None for r in rows}

    # each parameter over the trials: where the search went
    if names:
        fig, axes = plt.subplots(len(names[:6]), 1, figsize=(8, 2.0 * len(names[:6]) + 0.6), dpi=100, squeeze=False)
        for ax, name in zip(axes[:, 0], names[:6], strict=False):
            xs = [r["trial"] for r in rows if name in r["params"]]
            ys = [r["params"][name] if name in numeric else str(r["params"][name]) for r in rows if name in r["params"]]
            cs = [first_rung.get(r["trial"]) for r in rows if name in r["params"]]
            colours = [math.nan if c is None else c for c in cs]
            ax.scatter(xs, ys, c=colours, cmap="viridis_r" if sign > 0 else "viridis", s=16)
            if name in numeric and scales.get(name) == "log":
                ax.set_yscale("log")
            ax.set_ylabel(name, fontsize=8)
            ax.grid(alpha=0.3)
        axes[-1, 0].set_xlabel(f"trial (colour: {objective} at epoch {rungs[0] if rungs else '?'}; the search narrows)")
        save(fig, "params.png")

    # parallel coordinates
    if names and rows:
        fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
        scaled: dict[str, dict[int, float]] = {}
        for name in names:
            vals = {r["trial"]: r["params"][name] for r in rows if name in r["params"]}
            if name in numeric:
                nums = {t: float(v) for t, v in vals.items()}
                if scales.get(name) == "log":
                    nums = {t: math.log10(v) for t, v in nums.items()}
            else:
                order = sorted({str(v) for v in vals.values()})
                nums = {t: float(order.index(str(v))) for t, v in vals.items()}
            lo, hi = min(nums.values(), default=0.0), max(nums.values(), default=1.0)
            scaled[name] = {t: (v - lo) / (hi - lo) if hi > lo else 0.5 for t, v in nums.items()}
        values = [r["value"] for r in rows if r["value"] is not None]
        lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
        cmap = plt.get_cmap("viridis_r" if sign > 0 else "viridis")
        for row in rows:
            ys = [scaled[n].get(row["trial"], math.nan) for n in names]
            v = row["value"]
            colour = cmap((v - lo) / (hi - lo) if v is not None and hi > lo else 0.0) if v is not None else "lightgray"
            ax.plot(range(len(names)), ys, color=colour, alpha=0.7, linewidth=1.0)
        ax.set_xticks(range(len(names)), names, fontsize=8)
        ax.set_yticks([])
        ax.set_title(f"parallel coordinates (colour: {objective} at the epochs reached; grey: none)")
        save(fig, "parallel.png")

    # importances at the lowest rung (every trial has a value there)
    importances = param_importances(rows, rungs[0] if rungs else 0, names, scales)
    if importances:
        fig, ax = plt.subplots(figsize=(8, 0.5 * len(importances) + 1.2), dpi=100)
        items = sorted(importances.items(), key=lambda kv: kv[1])
        ax.barh([k for k, _ in items], [v for _, v in items], color="tab:blue")
        ax.set_xlabel(f"importance for {objective} at epoch {rungs[0]} (Optuna's evaluator)")
        ax.set_title("parameter importances")
        save(fig, "importance.png")
    return made


def param_importances(
    rows: list[dict[str, Any]], epoch: int, names: list[str], scales: dict[str, str]
) -> dict[str, float]:
    """Optuna's parameter importances over the trials' values at `epoch` ({} with fewer than 4)."""
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    done = [r for r in rows if r["curve"].get(str(epoch)) is not None and set(names) <= set(r["params"])]
    if len(done) < 4 or not names:
        return {}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    dists: dict[str, Any] = {}
    for name in names:
        vals = [r["params"][name] for r in done]
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals)
        if numeric and scales.get(name) != "choice" and min(vals) < max(vals):
            log = scales.get(name) == "log" and min(vals) > 0
            dists[name] = FloatDistribution(float(min(vals)), float(max(vals)), log=log)
        else:
            dists[name] = CategoricalDistribution(sorted({v for v in vals}, key=str))
    for r in done:
        params = {
            n: float(r["params"][n]) if isinstance(dists[n], FloatDistribution) else r["params"][n] for n in names
        }
        study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=r["curve"][str(epoch)]))
    try:
        return {k: float(v) for k, v in optuna.importance.get_param_importances(study).items()}
    except (RuntimeError, ValueError):  # e.g. every value the same
        return {}


def write_trials_csv(rows: list[dict[str, Any]], path: Path) -> None:
    import csv

    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns(rows))
        writer.writeheader()
        writer.writerows(rows)


def write_report(sweep_dir: Path, out: Path | None = None) -> Report:
    state = SweepStore(sweep_dir).load()
    out = out or Path(state.sweep_dir) / "report"
    out.mkdir(parents=True, exist_ok=True)
    params = varying_overrides(state)
    labels = {t.index: _label(params.get(t.index, {}), t.index) for t in state.tasks}
    per_task = {t.index: task_curves(task_dir(state, t) / TaskFile.METRICS) for t in state.tasks}
    metrics = sorted({name for curves in per_task.values() for name in curves})[:MAX_METRICS]
    images = []
    for metric in metrics:
        curves = {i: c[metric] for i, c in per_task.items() if c.get(metric)}
        path = out / _file_name(metric)
        plot(metric, curves, labels, path)
        images.append(path)
    rows = result_rows(state)
    trials = load_trials(state.sweep_dir)
    search = None
    if trials is not None:  # a search: its own plots first, and every trial in a CSV
        search_images = search_plots(trials, out)
        write_trials_csv(rows, out / "trials.csv")
        search = render_search(Path(state.sweep_dir), trials, search_images, interventions(state))
        images = search_images + images
    page = out / "index.html"
    page.write_text(render_page(state, rows, images, search))
    return Report(page, images, len(state.tasks), sum(1 for c in per_task.values() if c))


def interventions(state: SweepState) -> list[dict[str, Any]]:
    """The in-loop controller's interventions (each task's adapt.jsonl), task by task."""
    return [{"task": t.index, **r} for t in state.tasks for r in adapt_records(state, t)]


def render_search(sweep: Path, trials: dict[str, Any], images: list[Path], acts: list[dict[str, Any]]) -> str:
    """The search's section: the best configuration and its command, its plots, the controller's actions."""
    e = html.escape
    parts = [f"<h2>Search</h2><p>{e(study_line(sweep))}</p>"]
    try:
        best = json.loads((sweep / STUDY_BEST).read_text())
    except (OSError, ValueError):
        best = None
    if best:
        params = " ".join(f"{k}={v}" for k, v in best["params"].items())
        value = f"{best['value']:.6g}"
        parts.append(
            f"<p>Best: trial {e(str(best['trial']))}, {e(str(best['objective']))}={e(value)} "
            f"after {e(str(best['epochs']))} epoch(s): {e(params)}</p>"
            f'<p>Run it again:</p><pre id="reproduce">{e(best["reproduce"])}</pre>'
        )
    parts.append(
        "".join(
            f'<figure><img src="{e(p.name)}" alt="{e(p.stem)}"><figcaption>{e(p.stem)}</figcaption></figure>'
            for p in images
        )
    )
    parts.append('<p>Every trial: <a href="trials.csv">trials.csv</a></p>')
    if acts:
        cols = ["task", "step", "kind", "trigger", "decision", "applied", "reason"]
        head = "".join(f"<th>{c}</th>" for c in cols)
        body = "".join("<tr>" + "".join(f"<td>{e(str(a.get(c, '')))}</td>" for c in cols) + "</tr>" for a in acts)
        parts.append(
            f"<h3>In-loop interventions</h3><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        )
    return "\n".join(parts)


def render_page(state: SweepState, rows: list[dict[str, Any]], images: list[Path], search: str | None = None) -> str:
    e = html.escape
    cols = columns(rows)
    head = "".join(f"<th>{e(c)}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{e('' if r.get(c) is None else str(r[c]))}</td>" for c in cols) + "</tr>" for r in rows
    )
    figures = "".join(
        f'<figure><img src="{e(p.name)}" alt="{e(p.stem)} over steps"><figcaption>{e(p.stem)}</figcaption></figure>'
        for p in images
        if search is None or p.name not in search
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>slurmagent sweep {e(state.sweep_dir)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }} table {{ border-collapse: collapse; font-size: 0.9em; }}
td, th {{ border: 1px solid #ccc; padding: 0.2em 0.6em; }} figure {{ display: inline-block; margin: 0.5em; }}
</style></head>
<body data-images="{len(images)}">
<h1>Sweep {e(state.sweep_dir)}</h1>
<p>{e(summary_line(state))}</p>
{search or ""}
<h2>Curves</h2>
{figures or "<p>No task reported metrics (loop.report) yet.</p>"}
<h2>Results</h2>
<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>
<script>
// how many plots the browser really decoded: a test (and a person) can see the page rendered
window.addEventListener("load", () => {{
  const shown = [...document.images].filter((img) => img.complete && img.naturalWidth > 0).length;
  document.body.setAttribute("data-images-shown", String(shown));
}});
</script>
</body></html>
"""
