"""`slurmagent report SWEEP_DIR`: one HTML page for a sweep, with a PNG beside it for every
metric the tasks reported (each task's curve over its steps), and the results table.

The curves come from each task's `metrics.jsonl` (what `loop.report(...)` wrote). A
requeued or resubmitted task appends to the same file; a step run twice keeps its last
value, so a curve shows what the finished model went through. Every curve has markers, so a
run with a single value (a trial stopped at the first rung, a run that diverged after its
first report) still shows.

A grid sweep's page names its main metric — `hpo.objective` / `hpo.direction` of the sweep's
config when the runs report it (val_error, minimised, by default), else a usual name
(val_loss, val_acc, loss, …) — marks the run with the best final value in the table and on
the curves, and plots that value against each override that varies. A search's page adds the
search's own plots (history, curves with the rung decisions, parameters, parallel coordinates,
importances). Numbers in the tables are rounded to 4 significant digits (the full value is
the cell's tooltip). The page needs no server and no script from elsewhere: open it from the
disk.
"""

from __future__ import annotations

import html
import json
import math
import re
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurmagent.files import json_rows
from slurmagent.primitives.env import TaskFile, metric_values
from slurmagent.supervise.state import SweepState, SweepStore
from slurmagent.supervise.views import (
    STUDY_BEST,
    adapt_records,
    better,
    columns,
    load_trials,
    result_rows,
    search_best,
    study_line,
    summary_line,
    task_dir,
    varying_overrides,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

MAX_METRICS = 12  # plots per report; the rest are in metrics.jsonl
MAX_CURVES = 40  # tasks drawn per plot (the first ones by index, and the best); the table lists all
MAX_PARAMS = 6  # parameters drawn one below the other (a search) or side by side (a grid)
PARAM_PLOT = "metric_vs_params.png"  # a grid's main metric against each varying override

# Figures are 12 in wide at 100 dpi: 1200 px, the page's content width, so the page shows them
# at their own size and a font of 11 pt reads as about 15 px.
DPI = 100
WIDTH_IN = 12.0
STYLE: dict[Any, Any] = {  # rc_context's keys are a Literal of every rc name
    "font.size": 11,
    "axes.titlesize": 13,
    "axes.labelsize": 11,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "legend.fontsize": 9.5,
    "figure.titlesize": 13,
}
BEST_COLOUR = "black"  # the best run's curve, drawn over the others
# a grid's main metric when hpo.objective is not among what the runs report: the first of these
USUAL_METRICS = ("val_error", "val_loss", "val_acc", "val_accuracy", "test_error", "test_loss", "test_acc", "loss")


def metric_direction(name: str) -> str | None:
    """ "maximize" or "minimize" for a metric whose name says which way is better (the rule the
    results' NAME.best columns use, supervise/views.py `better`); None when it does not."""
    way = better(name)
    return None if way is None else {"max": "maximize", "min": "minimize"}[way]


@dataclass(frozen=True)
class Report:
    page: Path  # index.html
    images: list[Path]  # one PNG per metric
    tasks: int  # tasks in the sweep
    curves: int  # tasks with at least one reported metric
    best: str = ""  # the best result in a line (a search's best trial, a grid's best run); "" when none


@dataclass(frozen=True)
class Objective:
    """The metric that ranks a grid's runs, and which way is better."""

    metric: str  # a name the runs report (metrics.jsonl or the result)
    direction: str  # minimize | maximize
    source: str  # why this one: "hpo.objective" or "its name"

    def best(self, values: dict[int, float]) -> int | None:
        """The key with the best finite value (the first on a tie); None when no value is finite."""
        finite = [(k, v) for k, v in sorted(values.items()) if math.isfinite(v)]
        if not finite:
            return None
        sign = 1.0 if self.direction == "minimize" else -1.0
        return min(finite, key=lambda kv: sign * kv[1])[0]

    @property
    def better(self) -> str:
        return "lower" if self.direction == "minimize" else "higher"


# -- numbers as a person reads them ----------------------------------------------------------------
def fmt(value: Any) -> str:
    """A value for a table cell: an int (or a float without a fractional part) as an int, any
    other float to 4 significant digits (0.029999971389770508 → 0.03), NaN and ±inf spelt out,
    None as nothing, anything else as its text."""
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value.is_integer() and abs(value) < 1e6:
        return str(int(value))
    return f"{value:.4g}"


_DECIMAL = re.compile(r"[-+]?(\d+\.\d*|\.\d+)([eE][-+]?\d+)?")


def fmt_text(text: str) -> str:
    """An override's value as text: a decimal written with more digits than can be read
    (`0.2619616873214543`, as a search writes its trials' values) rounded like `fmt`; what a
    person typed (`1e-3`, `0.01`, `adam`) as typed."""
    if _DECIMAL.fullmatch(text.strip()):
        short = fmt(float(text))
        if len(short) < len(text.strip()):
            return short
    return text


def _number(value: Any) -> float | None:
    """A value as a float when it is a number or the text of one (an override's value)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


# -- figures ---------------------------------------------------------------------------------------
def _figure(height: float, width: float = WIDTH_IN) -> Figure:
    """A figure drawn by the Agg canvas (files only: no display on login or compute nodes; no
    pyplot, so nothing global changes and nothing needs closing), laid out so that titles,
    labels, legends and colour bars stay inside it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: Path) -> Path:
    with _styled():  # ticks are made while drawing: in the same style
        fig.savefig(path, dpi=DPI)
    return path


def _styled() -> Any:
    import matplotlib

    return matplotlib.rc_context(STYLE)


def _star(ax: Axes, x: float, y: float, label: str, size: float = 320) -> None:
    """The best run's mark: a gold star over everything else."""
    ax.scatter([x], [y], marker="*", s=size, color="gold", edgecolors="black", linewidths=1.0, zorder=6, label=label)


def _marks_every(values: list[float]) -> list[int] | None:
    """Which points of a curve get a marker: all of a short curve; about 30 of a long one,
    always with its first point and its last finite one (where a diverged run ended)."""
    n = len(values)
    if n <= 60:
        return None
    picked = set(range(0, n, math.ceil(n / 30)))
    finite = [i for i, v in enumerate(values) if math.isfinite(v)]
    picked.update({0, n - 1, *(finite[-1:])})
    return sorted(picked)


def _wrap(label: str, width: int = 36) -> str:
    """A legend entry on as many lines as it needs: never cut, never wider than the legend."""
    return "\n".join(textwrap.wrap(label, width, break_on_hyphens=False)) or label


def task_curves(path: Path) -> dict[str, list[tuple[int, float]]]:
    """metrics.jsonl → metric name → [(step, value)], by step; a step reported twice (a run
    after a requeue redid it) keeps its last value."""
    by_name: dict[str, dict[int, float]] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    for rec in json_rows(lines):
        if not isinstance(rec.get("step"), int):
            continue
        # the step and the epoch are axes, not metrics (an epoch's line marks where its values were taken)
        for name, value in metric_values(rec).items():
            by_name.setdefault(name, {})[rec["step"]] = value
    return {name: sorted(points.items()) for name, points in by_name.items()}


def _file_name(metric: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", metric)[:80] + ".png"


def _label(params: dict[str, str], index: int) -> str:
    """`#3 optim.lr=0.01 model.width=64`: the task and the overrides that tell it apart (a
    search's own `hpo.*` bookkeeping left out), whole: the legend wraps it."""
    text = " ".join(f"{k}={fmt_text(v)}" for k, v in params.items() if not k.startswith("hpo."))
    return f"#{index} {text}".strip()


def _diverged(points: list[tuple[int, float]]) -> str:
    """` (not finite from step 12)` for a curve whose values end not finite."""
    if not points or math.isfinite(points[-1][1]):
        return ""
    finite = [i for i, (_, v) in enumerate(points) if math.isfinite(v)]
    first_bad = points[finite[-1] + 1 if finite else 0][0]
    return f" (not finite from step {first_bad})"


def curve_figure(
    metric: str,
    curves: dict[int, list[tuple[int, float]]],
    labels: dict[int, str],
    best: int | None = None,
    objective: Objective | None = None,
) -> Figure:
    """Each task's curve of `metric` over its steps, with markers (a curve of one point still
    shows), the best task's curve drawn over the others, the legend beside the axes."""
    from matplotlib import colormaps

    chosen = sorted(curves)[:MAX_CURVES]
    if best is not None and best in curves and best not in chosen:
        chosen[-1] = best
    palette = colormaps["tab10" if len(chosen) <= 10 else "tab20"]
    # a few runs: the legend beside the axes; many: below them, in three columns, the axes full width
    beside = len(chosen) <= 12
    entries = [
        _wrap(("★ best: " if i == best else "") + labels.get(i, f"#{i}") + _diverged(curves[i]), 36 if beside else 46)
        for i in chosen
    ]
    ncols = 1 if beside else 3
    rows_of_legend = [max(e.count("\n") + 1 for e in entries[i : i + ncols]) for i in range(0, len(entries), ncols)]
    legend_in = 0.19 * sum(rows_of_legend) + 0.5
    with _styled():
        fig = _figure(max(5.2, legend_in + 0.8) if beside else 5.0 + legend_in)
        ax = fig.subplots()
        diverged = False
        for k, (index, entry) in enumerate(zip(chosen, entries, strict=True)):
            steps, values = zip(*curves[index], strict=True)
            is_best = index == best
            ax.plot(
                steps,
                values,
                label=entry,
                color=BEST_COLOUR if is_best else palette(k % palette.N),
                linewidth=2.8 if is_best else 1.4,
                marker="o",
                markersize=6 if len(values) == 1 else 3.5,
                markevery=_marks_every(list(values)),
                zorder=4 if is_best else 2,
                gid=f"task {index}",
            )
            finite = [(s, v) for s, v in zip(steps, values, strict=True) if math.isfinite(v)]
            if finite and len(finite) < len(values) and not math.isfinite(values[-1]):
                ax.scatter(*finite[-1], marker="X", s=70, color="tab:red", zorder=5)  # no finite value after this
                diverged = True
        ax.set_xlabel("step" + (" (✖ red: the last finite value of a run that diverged)" if diverged else ""))
        seen = [v for i in chosen for _, v in curves[i] if math.isfinite(v)]
        spread = bool(seen) and min(seen) > 0 and max(seen) / min(seen) >= 1000
        if spread:  # a spike of a run that blew up would flatten every other curve
            ax.set_yscale("log")
        ax.set_ylabel(metric + (" (log scale)" if spread else ""))
        more = f"; {len(curves) - len(chosen)} more run(s) in the table" if len(curves) > len(chosen) else ""
        title = f"{metric} over steps ({len(chosen)} run(s){more})"
        if objective is not None and objective.metric == metric and best is not None:
            title += f" — {objective.better} is better"
        ax.set_title(title)
        ax.grid(alpha=0.3)
        fig.legend(
            loc="outside right upper" if beside else "outside lower center",
            ncols=ncols,
            title="run" if best is None else "run (★ best)",
        )
    return fig


def _category_order(values: Iterable[Any]) -> list[str]:
    """A parameter's categories in a reading order: numerically when they are all numbers."""
    texts = {str(v) for v in values}
    if all(_number(t) is not None for t in texts):
        return sorted(texts, key=lambda t: float(t))
    return sorted(texts)


def param_effect_figure(
    objective: Objective, params: dict[int, dict[str, str]], values: dict[int, float], best: int | None
) -> Figure | None:
    """A grid's main metric (each run's final value) against each override that varies: one
    panel per override, a number axis (log when the values span more than a decade and a half)
    or the values as categories; the best run starred, a run without a finite value a red ✖
    at the top. None when nothing varies or no run reported the metric."""
    keys: list[str] = []
    for index in sorted(params):
        keys.extend(k for k in params[index] if k not in keys and not k.startswith("hpo."))
    keys = keys[:MAX_PARAMS]
    if not keys or not values:
        return None
    from matplotlib.ticker import NullLocator

    ncols = min(3, len(keys))
    nrows = math.ceil(len(keys) / ncols)
    with _styled():
        fig = _figure(4.3 * nrows + 0.8)
        axes = fig.subplots(nrows, ncols, squeeze=False)
        for ax, key in zip(axes.flat, keys, strict=False):
            raw = {i: params[i][key] for i in sorted(values) if key in params.get(i, {})}
            nums = {i: _number(v) for i, v in raw.items()}
            numeric = all(n is not None for n in nums.values())
            if numeric:
                xs = {i: float(n) for i, n in nums.items() if n is not None}
                positive = [x for x in xs.values() if x > 0]
                log = len(positive) == len(xs) and max(positive) / min(positive) >= 30
                if log:
                    ax.set_xscale("log")
                distinct = sorted(set(xs.values()))
                if len(distinct) <= 8:  # the values the grid ran, as they read
                    ax.set_xticks(distinct, [fmt(x) for x in distinct])
                    ax.xaxis.set_minor_locator(NullLocator())
            else:
                order = _category_order(raw.values())
                xs = {i: float(order.index(str(v))) for i, v in raw.items()}
                ax.set_xticks(range(len(order)), [fmt_text(c) for c in order])
                ax.set_xlim(-0.5, len(order) - 0.5)
            finite = {i: values[i] for i in xs if math.isfinite(values[i])}
            by_x: dict[float, list[float]] = {}
            for i, v in finite.items():
                by_x.setdefault(xs[i], []).append(v)
            if len(by_x) > 1:  # the best run at each value: what the value can give
                pick = min if objective.direction == "minimize" else max
                trend = sorted((x, pick(vs)) for x, vs in by_x.items())
                ax.plot(
                    *zip(*trend, strict=True),
                    color="tab:blue",
                    alpha=0.4,
                    linewidth=1.2,
                    zorder=1,
                    label="the best run at each value",
                )
            ax.scatter(
                [xs[i] for i in finite],
                list(finite.values()),
                s=46,
                color="tab:blue",
                zorder=3,
                label="a run's final value",
                gid=f"points {key}",
            )
            bad = [i for i in xs if i not in finite]
            if bad:
                ax.scatter(
                    [xs[i] for i in bad],
                    [0.96] * len(bad),
                    transform=ax.get_xaxis_transform(),  # x in data, y at the top of the axes
                    marker="X",
                    s=80,
                    color="tab:red",
                    clip_on=False,
                    zorder=5,
                    label="not finite (diverged)",
                )
                # the x axis covers them too (a marker placed in axes height does not count for its limits)
                y0 = next(iter(finite.values()), 0.0)
                ax.update_datalim([(xs[i], y0) for i in bad])
                ax.autoscale_view()
            if best is not None and best in xs:
                _star(ax, xs[best], values[best], f"best: #{best}")
            ax.set_xlabel(key)
            ax.set_ylabel(f"{objective.metric} (final)")
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(keys) :]:
            ax.set_visible(False)
        legend: dict[str, Any] = {}  # one legend for every panel, under them: it covers no point
        for ax in axes.flat:
            for handle, text in zip(*ax.get_legend_handles_labels(), strict=True):
                legend.setdefault(text, handle)
        fig.legend(list(legend.values()), list(legend), loc="outside lower center", ncols=len(legend))
        fig.suptitle(f"{objective.metric} by parameter: each run's final value ({objective.better} is better)")
    return fig


# -- a search's own plots (hydra/sweeper=slurmagent_hpo: SWEEP/hpo/trials.json) ------------------
STATE_COLOURS = {
    "complete": "tab:blue",
    "stopped": "tab:gray",
    "running": "tab:orange",
    "waiting": "tab:orange",
    "diverged": "tab:red",
    "failed": "tab:red",
}


def best_trial(trials: dict[str, Any]) -> int | None:
    """The best trial among those that reached the most epochs (what best.json names)."""
    rows = [r for r in trials.get("trials", []) if r.get("value") is not None and math.isfinite(r["value"])]
    if not rows:
        return None
    top = max(r["epochs"] for r in rows)
    sign = 1.0 if trials.get("direction", "minimize") == "minimize" else -1.0
    return int(min((r for r in rows if r["epochs"] == top), key=lambda r: sign * r["value"])["trial"])


class _ParamAxis:
    """One parameter's axis: how its values map to a position, and its ticks."""

    def __init__(self, name: str, values: list[Any], scale: str) -> None:
        self.name = name
        nums = [_number(v) for v in values]
        self.numeric = scale != "choice" and bool(values) and all(n is not None for n in nums)
        self.log = self.numeric and scale == "log" and all(n is not None and n > 0 for n in nums)
        self.categories = [] if self.numeric else _category_order(values)
        if self.numeric:
            ts = [self._t(float(n)) for n in nums if n is not None]
            lo, hi = min(ts), max(ts)
            pad = (hi - lo) * 0.05 or (abs(lo) * 0.1 if lo else 1.0)
            self.lo, self.hi = lo - pad, hi + pad
        else:
            self.lo, self.hi = -0.5, len(self.categories) - 0.5

    def _t(self, x: float) -> float:
        return math.log10(x) if self.log else x

    def data(self, value: Any) -> float:
        """The value on this axis's own scale (a category: its index)."""
        if not self.numeric:
            return float(self.categories.index(str(value)))
        n = _number(value)
        return math.nan if n is None else n

    def unit(self, value: Any) -> float:
        """The value's height on the axis, 0 (bottom) to 1 (top)."""
        d = self.data(value)
        if math.isnan(d) or (self.log and d <= 0):
            return math.nan
        t = self._t(d) if self.numeric else d
        return (t - self.lo) / (self.hi - self.lo)

    def apply(self, ax: Axes) -> None:
        """Scale, limits and ticks of this parameter on an axes' y axis: log where the
        parameter is log-scaled, its categories' names for a choice."""
        if self.log:
            ax.set_yscale("log")
            ax.set_ylim(10**self.lo, 10**self.hi)
        else:
            ax.set_ylim(self.lo, self.hi)
        if not self.numeric:
            ax.set_yticks(range(len(self.categories)), [fmt_text(c) for c in self.categories])


def search_figures(trials: dict[str, Any], best: int | None = None) -> dict[str, Figure]:
    """history.png (the objective of every trial, the best so far), curves.png (every trial's
    learning curve with its rung decisions: promoted ▲, stopped ✕, diverged or failed ●),
    params.png (each parameter over the trials: the narrowing), parallel.png (parallel
    coordinates coloured by the objective) and importance.png (Optuna's parameter
    importances at the lowest rung, where every trial has a value), by file name. The best
    trial (`best`, else the best of those that went furthest) is marked on each."""
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    rows = trials.get("trials", [])
    objective, rungs = str(trials.get("objective", "objective")), list(trials.get("rungs", []))
    minimize = trials.get("direction", "minimize") == "minimize"
    sign = 1.0 if minimize else -1.0
    better = "lower" if minimize else "higher"
    best = best_trial(trials) if best is None else best
    cmap = colormaps["viridis_r" if minimize else "viridis"]  # yellow: good
    figures: dict[str, Figure] = {}
    top = rungs[-1] if rungs else 0

    with _styled():
        # history
        fig = _figure(5.2)
        ax = fig.subplots()
        full = [r for r in rows if r["value"] is not None and r["epochs"] >= top]
        short = [r for r in rows if r["value"] is not None and r["epochs"] < top]
        ax.scatter([r["trial"] for r in full], [r["value"] for r in full], s=40, c="tab:blue", label="full training")
        ax.scatter(
            [r["trial"] for r in short], [r["value"] for r in short], s=18, c="tab:gray", label="stopped earlier"
        )
        running_best: float | None = None
        line: list[float] = []
        for row in rows:
            if row in full and math.isfinite(row["value"]):
                v = float(row["value"])
                running_best = v if running_best is None or sign * v < sign * running_best else running_best
            line.append(math.nan if running_best is None else running_best)
        if any(math.isfinite(v) for v in line):
            ax.step([r["trial"] for r in rows], line, where="post", color="tab:red", label=f"best after {top} epochs")
        lost = [r["trial"] for r in rows if r["value"] is None or not math.isfinite(r["value"])]
        if lost:  # diverged, failed, or no value yet: at the top, so every trial shows
            ax.scatter(
                lost,
                [1.0] * len(lost),
                transform=ax.get_xaxis_transform(),
                marker="X",
                s=60,
                color="tab:red",
                clip_on=False,
                zorder=5,
                label="no finite value",
            )
        b = next((r for r in rows if r["trial"] == best and r["value"] is not None), None)
        if b is not None and math.isfinite(b["value"]):
            _star(ax, b["trial"], b["value"], f"best: trial {best}")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("trial")
        ax.set_ylabel(f"{objective} at the epochs reached")
        ax.set_title(f"optimisation history ({better} is better)")
        ax.grid(alpha=0.3)
        fig.legend(loc="outside right upper")
        figures["history.png"] = fig

        # learning curves with the rung decisions
        fig = _figure(5.6)
        ax = fig.subplots()
        missing = []
        for row in sorted(rows, key=lambda r: r["trial"] == best):  # the best last: on top
            curve = sorted((int(k), v) for k, v in row["curve"].items())
            finite = [(e, float(v)) for e, v in curve if v is not None and math.isfinite(v)]
            if not finite:
                missing.append(row["trial"])
                continue
            is_best = row["trial"] == best
            ax.plot(
                *zip(*finite, strict=True),
                color=BEST_COLOUR if is_best else STATE_COLOURS.get(row["state"], "tab:purple"),
                linewidth=2.8 if is_best else 1.0,
                alpha=1.0 if is_best else 0.65,
                marker="o",
                markersize=5 if len(finite) == 1 else 3,
                zorder=4 if is_best else 2,
                gid=f"trial {row['trial']}",
            )
            for e in row.get("promoted_at", []):
                value = row["curve"].get(str(e))
                if value is not None:
                    ax.scatter(e, value, marker="^", c="tab:green", s=42, zorder=5)
            if row["state"] == "stopped":
                ax.scatter(*finite[-1], marker="x", c="0.25", s=42, zorder=5)
            if row["state"] in ("diverged", "failed"):
                ax.scatter(*finite[-1], marker="o", c="tab:red", s=42, zorder=5)
        for r in rungs:
            ax.axvline(r, color="black", linewidth=0.6, linestyle=":")
        if rungs and rungs[-1] > 10:
            ax.set_xscale("log")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("epoch (dotted lines: the rungs)")
        ax.set_ylabel(objective)
        title = "learning curves and rung decisions"
        if missing:
            title += f" (no value: trial {', '.join(map(str, missing))})"
        ax.set_title(title)
        ax.grid(alpha=0.3)
        handles = [
            Line2D([], [], color=c, marker="o", markersize=4, label=s)
            for s, c in (("complete", "tab:blue"), ("stopped at a rung", "tab:gray"), ("running", "tab:orange"))
            if any(STATE_COLOURS.get(r["state"]) == c for r in rows)
        ]
        if best is not None:
            handles.append(Line2D([], [], color=BEST_COLOUR, linewidth=2.8, label=f"best: trial {best}"))
        handles += [
            Line2D([], [], color="tab:green", marker="^", linestyle="", label="promoted at this rung"),
            Line2D([], [], color="0.25", marker="x", linestyle="", label="stopped here"),
            Line2D([], [], color="tab:red", marker="o", linestyle="", label="diverged / failed here"),
        ]
        fig.legend(handles=handles, loc="outside right upper")
        figures["curves.png"] = fig

        names = sorted({k for row in rows for k in row["params"]})
        scales: dict[str, str] = dict(trials.get("space", {}))
        axes_of = {
            n: _ParamAxis(n, [r["params"][n] for r in rows if n in r["params"]], scales.get(n, "")) for n in names
        }
        first = rungs[0] if rungs else None
        at_first = {
            r["trial"]: float(r["curve"][str(first)])
            for r in rows
            if first is not None and r["curve"].get(str(first)) is not None
        }
        seen = [v for v in at_first.values() if math.isfinite(v)]
        norm1 = Normalize(min(seen), max(seen)) if seen else Normalize(0.0, 1.0)

        # each parameter over the trials: where the search went
        if names:
            shown = names[:MAX_PARAMS]
            fig = _figure(2.3 * len(shown) + 1.0)
            axes = fig.subplots(len(shown), 1, squeeze=False, sharex=True)
            for ax, name in zip(axes[:, 0], shown, strict=True):
                pa = axes_of[name]
                have = [r for r in rows if name in r["params"]]
                coloured = [r for r in have if math.isfinite(at_first.get(r["trial"], math.nan))]
                grey = [r for r in have if r not in coloured]
                ax.scatter(
                    [r["trial"] for r in coloured],
                    [pa.data(r["params"][name]) for r in coloured],
                    c=[at_first[r["trial"]] for r in coloured],
                    cmap=cmap,
                    norm=norm1,
                    s=30,
                    edgecolors="0.3",
                    linewidths=0.4,
                    zorder=3,
                    gid=f"values {name}",
                )
                if grey:
                    ax.scatter(
                        [r["trial"] for r in grey],
                        [pa.data(r["params"][name]) for r in grey],
                        c="lightgray",
                        edgecolors="0.4",
                        s=30,
                        zorder=3,
                    )
                if best is not None and any(r["trial"] == best for r in have):
                    top_row = next(r for r in have if r["trial"] == best)
                    _star(ax, best, pa.data(top_row["params"][name]), f"best: trial {best}", size=200)
                pa.apply(ax)
                ax.set_ylabel(name + (" (log)" if pa.log else ""))
                ax.grid(alpha=0.3)
            axes[-1, 0].xaxis.set_major_locator(MaxNLocator(integer=True))
            axes[-1, 0].set_xlabel("trial (★ the best trial; grey: no value at the first rung)")
            fig.suptitle("each parameter over the trials: where the search went")
            bar = fig.colorbar(
                ScalarMappable(norm=norm1, cmap=cmap),
                ax=list(axes[:, 0]),
                label=f"{objective} at epoch {first} ({better} is better)",
                aspect=30,
            )
            bar.ax.set_gid("colour bar")
            figures["params.png"] = fig

        # parallel coordinates: one axis per parameter and the objective last, each with its values
        if names and rows:
            values = [float(r["value"]) for r in rows if r["value"] is not None and math.isfinite(r["value"])]
            norm = Normalize(min(values), max(values)) if values else Normalize(0.0, 1.0)
            axes_list = [axes_of[n] for n in names] + [_ParamAxis(objective, values or [0.0], "linear")]
            n_axes = len(axes_list)
            fig = _figure(5.8)
            grid = fig.add_gridspec(1, 2, width_ratios=[60, 1])
            host = fig.add_subplot(grid[0])
            cax = fig.add_subplot(grid[1])
            host.set_xlim(0, n_axes - 1)
            host.set_ylim(0, 1)
            host.set_yticks([])
            for side in ("left", "right", "top", "bottom"):
                host.spines[side].set_visible(False)
            host.set_xticks(range(n_axes), [_wrap(a.name, 22) for a in axes_list])
            host.tick_params(axis="x", length=0, pad=8)
            for i, pa in enumerate(axes_list):
                twin = host.twinx()
                twin.set_gid(f"axis {pa.name}")
                for side in ("left", "top", "bottom"):
                    twin.spines[side].set_visible(False)
                twin.spines["right"].set_position(("axes", i / (n_axes - 1)))
                twin.spines["right"].set_linewidth(1.2)
                pa.apply(twin)
                if i == 0:  # the first axis's values outside the plot, on its left
                    twin.yaxis.set_ticks_position("left")
                    twin.spines["left"].set_position(("axes", 0.0))
                    twin.spines["left"].set_visible(True)
                    twin.spines["left"].set_linewidth(1.2)
                    twin.spines["right"].set_visible(False)
                twin.tick_params(axis="y", labelsize=9)
                for label in twin.get_yticklabels(which="both"):  # readable over the lines
                    label.set_bbox({"facecolor": "white", "alpha": 0.75, "edgecolor": "none", "pad": 1.0})
            for row in sorted(rows, key=lambda r: (r["trial"] == best, r["value"] is not None)):
                ys = [
                    pa.unit(row["params"].get(pa.name)) if pa.name in row["params"] else math.nan
                    for pa in axes_list[:-1]
                ]
                v = row["value"]
                ok = v is not None and math.isfinite(v)
                ys.append(axes_list[-1].unit(v) if ok else math.nan)
                is_best = row["trial"] == best
                host.plot(
                    range(n_axes),
                    ys,
                    color=BEST_COLOUR if is_best else (cmap(norm(v)) if ok else "lightgray"),
                    alpha=1.0 if is_best else 0.75,
                    linewidth=2.8 if is_best else 1.2,
                    marker="o",
                    markersize=3,
                    zorder=4 if is_best else 2,
                    gid=f"trial {row['trial']}",
                )
            host.set_title(
                f"parallel coordinates (black: the best trial{f' {best}' if best is not None else ''}; grey: no value)"
            )
            fig.colorbar(
                ScalarMappable(norm=norm, cmap=cmap),
                cax=cax,
                label=f"{objective} at the epochs reached ({better} is better)",
            )
            cax.set_gid("colour bar")
            figures["parallel.png"] = fig

        # importances at the lowest rung (every trial has a value there)
        importances = param_importances(rows, rungs[0] if rungs else 0, names, scales)
        if importances:
            fig = _figure(max(3.0, 0.5 * len(importances) + 1.6))
            ax = fig.subplots()
            items = sorted(importances.items(), key=lambda kv: kv[1])
            ax.barh([k for k, _ in items], [v for _, v in items], color="tab:blue", height=0.5)
            for k, v in items:
                ax.annotate(f" {fmt(v)}", (v, k), va="center", fontsize=9)
            ax.set_xlabel(f"importance for {objective} at epoch {rungs[0]} (Optuna's evaluator)")
            ax.set_title("parameter importances")
            figures["importance.png"] = fig
    return figures


def search_plots(trials: dict[str, Any], out: Path, best: int | None = None) -> list[Path]:
    """The search's figures (`search_figures`) as PNG files in `out`."""
    return [_save(fig, out / name) for name, fig in search_figures(trials, best).items()]


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


# -- a grid's main metric ------------------------------------------------------------------------
def configured_objective(sweep_dir: Path) -> tuple[str, str] | None:
    """`hpo.objective` and `hpo.direction` as the sweep was launched with them (its multirun.yaml)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        cfg = OmegaConf.load(sweep_dir / "multirun.yaml")
        metric = OmegaConf.select(cfg, "hpo.objective", default=None, throw_on_resolution_failure=False)
        direction = OmegaConf.select(cfg, "hpo.direction", default=None, throw_on_resolution_failure=False)
    except (OSError, OmegaConfBaseException, ValueError):
        return None
    if isinstance(metric, str) and metric and direction in ("minimize", "maximize"):
        return metric, str(direction)
    return None


def choose_objective(sweep_dir: Path, reported: Iterable[str]) -> Objective | None:
    """The metric that ranks a grid's runs: `hpo.objective` (the same key a search uses;
    val_error, minimised, by default) when the runs report it; else the first of the usual
    names, else the first name that looks like a loss, an error or a score — better when
    higher if its name says accuracy, score, F1, …; None when nothing looks like one."""
    names = set(reported)
    configured = configured_objective(sweep_dir)
    if configured is not None and configured[0] in names:
        return Objective(configured[0], configured[1], "hpo.objective")
    pick = next((n for n in USUAL_METRICS if n in names), None)
    pick = pick or next((n for n in sorted(names) if metric_direction(n)), None)
    if pick is None:
        return None
    return Objective(pick, metric_direction(pick) or "minimize", "its name")


def final_values(
    state: SweepState, per_task: dict[int, dict[str, list[tuple[int, float]]]], metric: str
) -> dict[int, float]:
    """Each task's final value of `metric`: its result's, else the last one it reported (NaN
    when it diverged); a task with neither has none."""
    out: dict[int, float] = {}
    for t in state.tasks:
        value = t.result.get(metric) if isinstance(t.result, dict) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[t.index] = float(value)
        elif per_task.get(t.index, {}).get(metric):
            out[t.index] = per_task[t.index][metric][-1][1]
    return out


def write_report(sweep_dir: Path, out: Path | None = None) -> Report:
    state = SweepStore(sweep_dir).load()
    out = out or Path(state.sweep_dir) / "report"
    out.mkdir(parents=True, exist_ok=True)
    params = varying_overrides(state)
    labels = {t.index: _label(params.get(t.index, {}), t.index) for t in state.tasks}
    per_task = {t.index: task_curves(task_dir(state, t) / TaskFile.METRICS) for t in state.tasks}
    rows = result_rows(state)
    trials = load_trials(state.sweep_dir)
    reported = {name for curves in per_task.values() for name in curves}
    numeric_results = {k for r in rows for k, v in r.items() if _number(v) is not None and not isinstance(v, str)}
    if trials is not None:
        objective: Objective | None = Objective(
            str(trials.get("objective", "objective")), str(trials.get("direction", "minimize")), "hpo.objective"
        )
        best = best_of_search(Path(state.sweep_dir), trials)
        values: dict[int, float] = {}
    else:
        objective = choose_objective(Path(state.sweep_dir), reported | (numeric_results - {"task", "runs", "job"}))
        values = final_values(state, per_task, objective.metric) if objective else {}
        best = objective.best(values) if objective else None
    # the main metric's plot first, then the others by name
    metrics = sorted(reported, key=lambda m: (objective is None or m != objective.metric, m))[:MAX_METRICS]
    images = []
    if trials is None and objective is not None:
        fig = param_effect_figure(objective, params, values, best)
        if fig is not None:
            images.append(_save(fig, out / PARAM_PLOT))
    for metric in metrics:
        curves = {i: c[metric] for i, c in per_task.items() if c.get(metric)}
        images.append(_save(curve_figure(metric, curves, labels, best, objective), out / _file_name(metric)))
    search = None
    if trials is not None:  # a search: its own plots first, and every trial in a CSV
        search_images = search_plots(trials, out, best)
        write_trials_csv(rows, out / "trials.csv")
        search = render_search(Path(state.sweep_dir), trials, search_images, interventions(state))
        images = search_images + images
    best_line = None if trials is not None else grid_best_line(objective, best, values, params)
    page = out / "index.html"
    page.write_text(render_page(state, rows, images, search, best=best, best_line=best_line, params=params))
    best_text = search_best(trials) if trials is not None else ""  # the trials read above, not read again
    if trials is None and best is not None:
        best_text = (best_line or "").removeprefix("Best run: ")
    return Report(page, images, len(state.tasks), sum(1 for c in per_task.values() if c), best_text)


def best_of_search(sweep: Path, trials: dict[str, Any]) -> int | None:
    """The search's best trial: best.json's, else the best among those that went furthest."""
    try:
        return int(json.loads((sweep / STUDY_BEST).read_text())["trial"])
    except (OSError, ValueError, KeyError, TypeError):
        return best_trial(trials)


def grid_best_line(
    objective: Objective | None, best: int | None, values: dict[int, float], params: dict[int, dict[str, str]]
) -> str:
    """The sentence above a grid's plots: which metric ranks the runs, and the best run."""
    if objective is None:
        return (
            "No main metric: no run reported val_error, val_loss, val_acc, loss or another name that looks "
            "like one; name yours with hpo.objective=NAME hpo.direction=minimize|maximize when you launch."
        )
    why = "hpo.objective" if objective.source == "hpo.objective" else "its name; hpo.objective=NAME chooses another"
    if best is None:
        return f"Main metric: {objective.metric} (by {why}); no run has a finite final value."
    overrides = " ".join(f"{k}={fmt_text(v)}" for k, v in params.get(best, {}).items())
    return (
        f"Best run: task {best}, {objective.metric}={fmt(values[best])}"
        + (f": {overrides}" if overrides else "")
        + f" (the final value; {objective.better} is better; main metric by {why})"
    )


def interventions(state: SweepState) -> list[dict[str, Any]]:
    """The in-loop controller's interventions (each task's adapt.jsonl), task by task."""
    return [{"task": t.index, **r} for t in state.tasks for r in adapt_records(state, t)]


CAPTIONS = {
    "history": "The objective of every trial at the epochs it reached; the red line is the best after full training.",
    "curves": "Every trial's learning curve, coloured by its state, with the rung decisions.",
    "params": "Each parameter's value over the trials, coloured by the objective at the first rung.",
    "parallel": "Parallel coordinates: one axis per parameter and the objective, a line per trial.",
    "importance": "How much each parameter explains of the objective at the first rung.",
    PARAM_PLOT[:-4]: "The main metric's final value of each run against each override that varies.",
}


def _figures(images: list[Path]) -> str:
    e = html.escape
    out = []
    for p in images:
        caption = CAPTIONS.get(p.stem, f"{p.stem} of each run over its steps.")
        out.append(
            f'<figure id="fig-{e(p.stem)}"><img src="{e(p.name)}" alt="{e(caption)}">'
            f"<figcaption>{e(caption)}</figcaption></figure>"
        )
    return "".join(out)


def render_search(sweep: Path, trials: dict[str, Any], images: list[Path], acts: list[dict[str, Any]]) -> str:
    """The search's section: the best configuration and its command, its plots, the controller's actions."""
    e = html.escape
    parts = [f"<h2>Search</h2><p>{e(study_line(sweep))}</p>"]
    try:
        best = json.loads((sweep / STUDY_BEST).read_text())
    except (OSError, ValueError):
        best = None
    if best:
        params = " ".join(f"{k}={fmt(v)}" for k, v in best["params"].items())
        value = fmt(best["value"])
        parts.append(
            f'<p class="best-line">Best: trial {e(str(best["trial"]))}, {e(str(best["objective"]))}={e(value)} '
            f"after {e(str(best['epochs']))} epoch(s): {e(params)}</p>"
            f'<p>Run it again:</p><pre id="reproduce">{e(best["reproduce"])}</pre>'
        )
    parts.append(_figures(images))
    parts.append('<p>Every trial: <a href="trials.csv">trials.csv</a></p>')
    if acts:
        cols = ["task", "step", "kind", "trigger", "decision", "applied", "reason"]
        parts.append("<h3>In-loop interventions</h3>" + render_table(acts, cols))
    return "\n".join(parts)


def _cell(col: str, value: Any, params: set[str]) -> str:
    """One table cell: a number rounded (`fmt`), an override's long decimal too, a long text
    cut; the full value as the cell's tooltip whenever what shows differs."""
    e = html.escape
    full = "" if value is None else str(value)
    shown = fmt_text(value) if isinstance(value, str) and col in params else fmt(value)
    number = _number(value) is not None and (not isinstance(value, str) or col in params)
    if col != "error" and len(shown) > 32:
        shown = shown[:24] + "…"
    title = f' title="{e(full)}"' if shown != full else ""
    klass = ' class="num"' if number else ' class="text"' if col == "error" else ""
    return f"<td{klass}{title}>{e(shown)}</td>"


def render_table(
    rows: list[dict[str, Any]], cols: list[str], best: int | None = None, key: str = "", params: Iterable[str] = ()
) -> str:
    """A table of `rows` with readable numbers; the row whose `key` is `best` marked (class
    "best", a ★ in its first cell)."""
    e = html.escape
    param_cols = set(params)
    head = "".join(f"<th>{e(c)}</th>" for c in cols)
    body = []
    for r in rows:
        is_best = best is not None and bool(key) and r.get(key) == best
        cells = [_cell(c, r.get(c), param_cols) for c in cols]
        if is_best and cells:
            cells[0] = cells[0].replace(">", ' aria-label="best">★ ', 1)
        body.append(('<tr class="best">' if is_best else "<tr>") + "".join(cells) + "</tr>")
    return f'<div class="table"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


def render_page(
    state: SweepState,
    rows: list[dict[str, Any]],
    images: list[Path],
    search: str | None = None,
    best: int | None = None,
    best_line: str | None = None,
    params: dict[int, dict[str, str]] | None = None,
) -> str:
    e = html.escape
    cols = columns(rows)
    key = "trial" if search is not None else "task"
    param_cols = {k for p in (params or {}).values() for k in p}
    if search is not None:
        trials = load_trials(state.sweep_dir) or {}
        param_cols |= {k for r in trials.get("trials", []) for k in r.get("params", {})}
    table = render_table(rows, cols, best, key, param_cols)
    grid_plots = [p for p in images if p.name == PARAM_PLOT]
    figures = _figures([p for p in images if p.name != PARAM_PLOT and (search is None or p.name not in search)])
    best_html = f'<p class="best-line" id="best">{e(best_line)}</p>' if best_line else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>slurmagent sweep {e(state.sweep_dir)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body {{ font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0 auto; padding: 1.5em 2em;
  max-width: 1200px; line-height: 1.45; color: #1f2328; }}
h1 {{ font-size: 1.6em; overflow-wrap: anywhere; }} h2 {{ margin-top: 1.6em; border-bottom: 1px solid #ddd; }}
figure {{ margin: 1.2em 0 2em; }} figure img {{ display: block; width: 100%; height: auto; }}
figcaption {{ color: #555; font-size: 0.92em; margin-top: 0.3em; }}
pre {{ background: #f6f8fa; padding: 0.6em 0.8em; overflow-x: auto; }}
.best-line {{ background: #fff4c2; padding: 0.4em 0.7em; border-left: 4px solid #e0b000; }}
.table {{ overflow-x: auto; }}
table {{ border-collapse: collapse; font-size: 0.9em; font-variant-numeric: tabular-nums; }}
td, th {{ border: 1px solid #d0d7de; padding: 0.25em 0.6em; white-space: nowrap; }}
th {{ background: #f6f8fa; }} td.num {{ text-align: right; }}
td.text {{ white-space: normal; min-width: 24em; }}
tr.best td {{ background: #fff4c2; font-weight: 600; }}
</style></head>
<body data-images="{len(images)}">
<h1>Sweep {e(state.sweep_dir)}</h1>
<p>{e(summary_line(state))}</p>
{best_html}
{search or ""}
{_figures(grid_plots)}
<h2>Curves</h2>
{figures or "<p>No task reported metrics (loop.report) yet.</p>"}
<h2>Results</h2>
{table}
<script>
// how many plots the browser really decoded: a test (and a person) can see the page rendered
window.addEventListener("load", () => {{
  const shown = [...document.images].filter((img) => img.complete && img.naturalWidth > 0).length;
  document.body.setAttribute("data-images-shown", String(shown));
  // and how wide the narrowest plot is drawn, in percent of the page's content width
  const style = getComputedStyle(document.body);
  const content = document.body.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  const widths = [...document.images].map((img) => Math.round((100 * img.getBoundingClientRect().width) / content));
  if (widths.length) document.body.setAttribute("data-narrowest-plot", String(Math.min(...widths)));
}});
</script>
</body></html>
"""
