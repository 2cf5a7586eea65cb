"""`slurmagent report` (issue 19, point 8): every run visible in the curves, legends whole,
value axes and a colour bar on the search's parameter plots, readable numbers in every table,
plots as wide as the page, and a grid's best run marked with its metric plotted against each
override. The sweeps are real: a grid and a search of the synthetic example on the local
backend (a few seconds each); the figures are inspected as matplotlib objects, the page as
HTML and, in the `browser` test, as headless Chromium leaves it after loading."""

from __future__ import annotations

import json
import math
import os
import re
import struct
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from slurmagent.supervise.report import (
    PARAM_PLOT,
    Objective,
    _label,
    choose_objective,
    curve_figure,
    final_values,
    fmt,
    fmt_text,
    param_effect_figure,
    render_table,
    search_figures,
    task_curves,
    write_report,
)
from slurmagent.supervise.state import SweepStore
from slurmagent.supervise.views import task_dir, varying_overrides
from tests.conftest import built_once

# x=0.3 is the best (val_error = (x-0.3)² + 0.5/epoch); x=0.95 diverges after its first epoch:
# a curve with a single finite point
GRID = ("synthetic.epochs=4", "synthetic.steps_per_epoch=3", "synthetic.x=0.1,0.3,0.6,0.95")
SEARCH = (
    "hydra/sweeper=slurmagent_hpo",
    "synthetic.x=interval(0,1)",
    "hpo.fidelity.key=synthetic.epochs",
    "hpo.fidelity.max=9",
    "hpo.budget.trials=8",
)


def sweep(tmp: Path, *overrides: str) -> Path:
    """`python -m slurmagent +experiment=synthetic cluster=local -m OVERRIDES` into tmp/sweep."""
    out = tmp / "sweep"
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}  # no Slurm: as on a laptop
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurmagent",
            "+experiment=synthetic",
            "cluster=local",
            "-m",
            *overrides,
            f"hydra.sweep.dir={out}",
            "hydra.launcher.poll_interval_s=0.2",
        ],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def reported(tmp: Path, *overrides: str) -> None:
    write_report(sweep(tmp, *overrides))


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_once(tmp_path_factory, "report-grid", lambda tmp: reported(tmp, *GRID)) / "sweep"


@pytest.fixture(scope="module")
def search(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_once(tmp_path_factory, "report-search", lambda tmp: reported(tmp, *SEARCH)) / "sweep"


class Page(HTMLParser):
    """A page's tables (each row: its attributes and its cells, a cell: its attributes and text) and images."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tables: list[list[tuple[dict[str, str], list[tuple[dict[str, str], str]]]]] = []
        self.images: list[str] = []
        self._cell: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append((a, []))
        elif tag in ("td", "th"):
            self._cell = []
            self.tables[-1][-1][1].append((a, ""))
        elif tag == "img":
            self.images.append(a["src"])

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            cells = self.tables[-1][-1][1]
            cells[-1] = (cells[-1][0], "".join(self._cell))
            self._cell = None

    def table(self) -> list[dict[str, tuple[dict[str, str], str]]]:
        """The results table (the page's last) as a dict per row: column → (attributes, text), and
        the row's own attributes under ''."""
        head, *body = self.tables[-1]
        names = [text for _, text in head[1]]
        return [{**dict(zip(names, cells, strict=True)), "": (attrs, "")} for attrs, cells in body]


def page(sweep_dir: Path) -> Page:
    return Page((sweep_dir / "report" / "index.html").read_text())


def png_size(path: Path) -> tuple[int, int]:
    width, height = struct.unpack(">II", path.read_bytes()[16:24])  # the IHDR chunk
    return width, height


def trials(sweep_dir: Path) -> dict[str, Any]:
    return json.loads((sweep_dir / "hpo" / "trials.json").read_text())  # type: ignore[no-any-return]


def grid_curves(grid: Path, metric: str) -> tuple[dict[int, list[tuple[int, float]]], dict[int, str]]:
    state = SweepStore(grid).load()
    params = varying_overrides(state)
    curves = {t.index: task_curves(task_dir(state, t) / "metrics.jsonl").get(metric, []) for t in state.tasks}
    return curves, {i: _label(params[i], i) for i in curves}


# -- numbers -------------------------------------------------------------------------------------
def test_numbers_read_as_numbers() -> None:
    assert fmt(0.029999971389770508) == "0.03"
    assert fmt(0.057002) == "0.057" and fmt(1234567.0) == "1.235e+06" and fmt(12.0) == "12"
    assert fmt(3) == "3" and fmt(float("nan")) == "NaN" and fmt(float("-inf")) == "-inf" and fmt(None) == ""
    assert fmt(True) == "True" and fmt("adam") == "adam"
    # an override's value: a long decimal (a search's sample) rounded, what a person typed kept
    assert fmt_text("0.2619616873214543") == "0.262" and fmt_text("1e-3") == "1e-3" and fmt_text("0.01") == "0.01"
    assert fmt_text("abc") == "abc" and fmt_text("64") == "64"
    # every table of the page goes through it: the interventions' table too
    table = render_table([{"task": 0, "step": 12, "lr": 0.029999971389770508, "reason": "plateau"}], ["task", "lr"])
    assert '<td class="num" title="0.029999971389770508">0.03</td>' in table and ">12<" not in table


def test_every_table_cell_of_a_search_holds_a_readable_number(search: Path) -> None:
    rows = page(search).table()
    body = trials(search)
    assert len(rows) == len(body["trials"])
    for row, trial in zip(rows, body["trials"], strict=True):
        attrs, text = row["synthetic.x"]
        assert text == fmt(trial["params"]["synthetic.x"]), row
        assert attrs["title"] == str(trial["params"]["synthetic.x"])  # the full value: the tooltip
        for name, (_, text) in row.items():
            decimal = re.fullmatch(r"-?(\d*)\.(\d+)(e[-+]\d+)?", text)
            if decimal:  # a fraction: at most 4 significant digits (ints are ints)
                assert len((decimal[1] + decimal[2]).lstrip("0")) <= 4, (name, text)
        assert row["val_error"][1] == fmt(trial["value"])


def test_grid_table_cells_hold_readable_numbers(grid: Path) -> None:
    rows = {r["task"][1].lstrip("★ "): r for r in page(grid).table()}
    assert rows["3"]["val_error"][1] == "NaN" and rows["1"]["val_error"][1] == "0.125"
    assert all(r["synthetic.x"][0].get("class") == "num" for r in rows.values())  # right-aligned numbers
    digest = rows["0"]["digest"]
    assert len(digest[1]) < 30 and digest[0]["title"].startswith(digest[1].rstrip("…"))  # a hash cut, whole on hover


# -- the best run ----------------------------------------------------------------------------------
def test_grid_marks_the_best_run_in_the_table_and_on_the_curves(grid: Path) -> None:
    text = (grid / "report" / "index.html").read_text()
    best = [r for r in page(grid).table() if r[""][0].get("class") == "best"]
    assert [r["task"][1] for r in best] == ["★ 1"] and best[0]["synthetic.x"][1] == "0.3"
    assert "Best run: task 1, val_error=0.125: synthetic.x=0.3 (the final value; lower is better" in text
    curves, labels = grid_curves(grid, "val_error")
    objective = Objective("val_error", "minimize", "hpo.objective")
    fig = curve_figure("val_error", curves, labels, best=1, objective=objective)
    lines = {line.get_gid(): line for line in fig.axes[0].get_lines()}
    assert lines["task 1"].get_linewidth() >= 2 * lines["task 0"].get_linewidth()
    assert lines["task 1"].get_zorder() > lines["task 0"].get_zorder()  # drawn over the others
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[1].startswith("★ best: #1 synthetic.x=0.3")


def test_the_main_metric_is_hpo_objective_or_a_usual_name(grid: Path, tmp_path: Path) -> None:
    assert choose_objective(grid, {"val_error", "loss"}) == Objective("val_error", "minimize", "hpo.objective")
    assert choose_objective(tmp_path, {"val_acc", "loss"}) == Objective("val_acc", "maximize", "its name")
    assert choose_objective(tmp_path, {"my_f1_score"}) == Objective("my_f1_score", "maximize", "its name")
    assert choose_objective(tmp_path, {"accuracy_loss"}) == Objective("accuracy_loss", "minimize", "its name")
    assert choose_objective(tmp_path, {"steps_run_here"}) is None
    state = SweepStore(grid).load()
    values = final_values(state, {}, "val_error")
    assert values[1] == 0.125 and math.isnan(values[3])
    assert Objective("val_error", "minimize", "").best(values) == 1
    assert Objective("val_error", "maximize", "").best(values) == 2  # NaN never wins


# -- every run visible ---------------------------------------------------------------------------
def test_a_curve_with_one_point_shows_with_a_marker(grid: Path) -> None:
    curves, labels = grid_curves(grid, "val_error")
    assert sum(math.isfinite(v) for _, v in curves[3]) == 1  # x=0.95: NaN after its first epoch
    fig = curve_figure("val_error", curves, labels)
    lines = {line.get_gid(): line for line in fig.axes[0].get_lines()}
    assert set(lines) == {f"task {i}" for i in range(4)}
    for line in lines.values():
        assert line.get_marker() == "o" and line.get_markevery() is None  # short curves: a marker per point
    legend = " ".join(t.get_text().replace("\n", " ") for t in fig.legends[0].get_texts())
    assert "#3 synthetic.x=0.95 (not finite from step 5)" in legend


def test_a_trial_stopped_at_the_first_rung_shows_in_the_search_curves(search: Path) -> None:
    body = trials(search)
    first = body["rungs"][0]
    stopped = [t["trial"] for t in body["trials"] if t["state"] == "stopped" and t["epochs"] == first]
    assert stopped, "8 trials at eta 3: some stop at the first rung"
    lines = {line.get_gid(): line for line in search_figures(body)["curves.png"].axes[0].get_lines()}
    for trial in stopped:
        line = lines[f"trial {trial}"]
        assert len(line.get_xdata()) == 1 and line.get_marker() == "o" and line.get_markersize() >= 4
    # the curves over steps too: every task, with markers
    state = SweepStore(search).load()
    curves = {t.index: task_curves(task_dir(state, t) / "metrics.jsonl")["val_error"] for t in state.tasks}
    fig = curve_figure("val_error", curves, {i: f"#{i}" for i in curves})
    drawn = {line.get_gid(): line for line in fig.axes[0].get_lines()}
    assert all(drawn[f"task {t}"].get_marker() == "o" for t in stopped)


def test_long_curves_mark_about_thirty_points_and_the_last_finite_one() -> None:
    points = [(s, 1.0 / (s + 1)) for s in range(300)] + [(300, math.nan)]
    fig = curve_figure("loss", {0: points}, {0: "#0"})
    every = fig.axes[0].get_lines()[0].get_markevery()
    assert isinstance(every, list) and 20 <= len(every) <= 40 and 299 in every and 0 in every


# -- legends ---------------------------------------------------------------------------------------
def test_legends_are_whole_and_inside_the_image(tmp_path: Path) -> None:
    params = {
        i: {"model.encoder.hidden_size": str(64 * 2**i), "optim.learning_rate": f"{10**-i}", "data.augment": "mixup"}
        for i in range(3)
    }
    labels = {i: _label(p, i) for i, p in params.items()}
    assert labels[2] == "#2 model.encoder.hidden_size=256 optim.learning_rate=0.01 data.augment=mixup"  # not cut
    curves = {i: [(s, 1.0 / (s + i + 1)) for s in range(5)] for i in params}
    for count in (3, 16):  # beside the axes, and below them in columns
        many = {i: curves[i % 3] for i in range(count)}
        names = {i: labels[i % 3] for i in range(count)}
        fig = curve_figure("loss", many, names)
        fig.canvas.draw()
        legend = fig.legends[0]
        texts = [t.get_text().replace("\n", " ") for t in legend.get_texts()]
        assert texts == [names[i] for i in range(count)]  # every key, whole (wrapped, never cut)
        box, frame = legend.get_window_extent(), fig.bbox
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
        axes = fig.axes[0].get_window_extent()
        assert not axes.overlaps(box)  # outside the axes: covers no curve


# -- value axes and colour bars on a search's parameter plots --------------------------------------
def synthetic_trials() -> dict[str, Any]:
    """trials.json as supervise/study.py writes it, for a space with a log, a linear and a choice parameter."""
    rows = []
    for t in range(9):
        lr, width, x = 10 ** (-1 - t % 4), [32, 64, 128][t % 3], t / 10
        value = abs(math.log10(lr) + 2) / 4 + x / 5 + (0.1 if width == 32 else 0.0)
        epochs = 9 if t in (2, 5) else 3 if t in (1, 4) else 1
        curve = {str(e): value + 0.5 / e for e in range(1, epochs + 1)}
        rows.append(
            {
                "trial": t,
                "params": {"optim.lr": lr, "model.width": width, "synthetic.x": x},
                "epochs": epochs,
                "value": curve[str(epochs)],
                "curve": curve,
                "state": "complete" if epochs == 9 else "stopped",
                "promotions": 0,
                "promoted_at": [1, 3][: [1, 3, 9].index(epochs)],
            }
        )
    return {
        "objective": "val_error",
        "direction": "minimize",
        "rungs": [1, 3, 9],
        "space": {"optim.lr": "log", "model.width": "choice", "synthetic.x": "linear"},
        "trials": rows,
    }


def colour_bar_label(fig: Any) -> str:
    bars = [a for a in fig.axes if a.get_gid() == "colour bar"]
    assert len(bars) == 1, [a.get_gid() for a in fig.axes]
    return str(bars[0].get_ylabel())


def test_parallel_coordinates_give_every_axis_its_values_and_a_colour_bar() -> None:
    fig = search_figures(synthetic_trials())["parallel.png"]
    fig.canvas.draw()
    axes = {a.get_gid(): a for a in fig.axes if str(a.get_gid()).startswith("axis ")}
    assert set(axes) == {"axis model.width", "axis optim.lr", "axis synthetic.x", "axis val_error"}
    assert axes["axis optim.lr"].get_yscale() == "log"
    assert {t.get_text() for t in axes["axis model.width"].get_yticklabels()} == {"32", "64", "128"}
    for name in ("axis synthetic.x", "axis val_error", "axis optim.lr"):
        shown = [t.get_text() for t in axes[name].get_yticklabels() if t.get_text()]
        assert len(shown) >= 2, (name, shown)
    assert "val_error" in colour_bar_label(fig)
    lines = [line for line in fig.axes[0].get_lines() if str(line.get_gid()).startswith("trial ")]
    assert len(lines) == 9 and all(len(line.get_xdata()) == 4 for line in lines)  # 3 parameters + the objective


def test_the_parameter_plot_has_value_axes_and_a_colour_bar() -> None:
    fig = search_figures(synthetic_trials())["params.png"]
    fig.canvas.draw()
    by_name = {a.get_ylabel(): a for a in fig.axes if a.get_gid() != "colour bar"}
    assert by_name["optim.lr (log)"].get_yscale() == "log"
    assert [t.get_text() for t in by_name["model.width"].get_yticklabels()] == ["32", "64", "128"]
    assert "val_error at epoch 1" in colour_bar_label(fig)


def test_a_real_search_has_them_too(search: Path) -> None:
    figures = search_figures(trials(search))
    assert "val_error" in colour_bar_label(figures["parallel.png"])
    assert "val_error" in colour_bar_label(figures["params.png"])


# -- sizes -------------------------------------------------------------------------------------------
def test_plots_are_as_wide_as_the_page(grid: Path, search: Path) -> None:
    for sweep_dir in (grid, search):
        report = sweep_dir / "report"
        shown = page(sweep_dir).images
        assert shown and sorted(shown) == sorted(p.name for p in report.glob("*.png"))
        for name in shown:
            width, height = png_size(report / name)
            assert width == 1200 and 250 <= height < 2000, (name, width, height)
    css = (grid / "report" / "index.html").read_text()
    assert "max-width: 1200px" in css and "figure img { display: block; width: 100%" in css


# -- a grid's metric against its parameters -----------------------------------------------------------
def test_a_grid_report_plots_its_metric_against_each_varying_override(grid: Path) -> None:
    report = grid / "report"
    assert PARAM_PLOT in page(grid).images and png_size(report / PARAM_PLOT)[0] == 1200
    state = SweepStore(grid).load()
    values = final_values(state, {}, "val_error")
    objective = Objective("val_error", "minimize", "hpo.objective")
    fig = param_effect_figure(objective, varying_overrides(state), values, best=1)
    assert fig is not None
    (ax,) = [a for a in fig.axes if a.get_visible()]
    assert ax.get_xlabel() == "synthetic.x" and ax.get_ylabel() == "val_error (final)"
    marks = {c.get_label(): c.get_offsets() for c in ax.collections}
    assert sorted(float(x) for x, _ in marks["a run's final value"]) == [0.1, 0.3, 0.6]
    assert [tuple(map(float, p)) for p in marks["best: #1"]] == [(0.3, 0.125)]
    assert [float(x) for x, _ in marks["not finite (diverged)"]] == [0.95]  # x=0.95 is there, in red
    low, high = ax.get_xlim()
    assert low < 0.1 and high > 0.95  # and inside the axes


def test_a_categorical_override_gets_its_values_as_ticks() -> None:
    params = {0: {"optim": "adam", "lr": "1e-3"}, 1: {"optim": "sgd", "lr": "1e-3"}, 2: {"optim": "adam", "lr": "1"}}
    fig = param_effect_figure(Objective("val_acc", "maximize", ""), params, {0: 0.9, 1: 0.8, 2: 0.5}, best=0)
    assert fig is not None
    fig.canvas.draw()
    optim, lr = fig.axes[0], fig.axes[1]
    assert [t.get_text() for t in optim.get_xticklabels()] == ["adam", "sgd"]
    assert lr.get_xscale() == "log" and [t.get_text() for t in lr.get_xticklabels()] == ["0.001", "1"]


# -- in a real browser ------------------------------------------------------------------------------------
@pytest.mark.browser
def test_both_reports_render_in_a_real_browser(grid: Path, search: Path, tmp_path: Path) -> None:
    from tests.conftest import browser_dom  # fails, not skips, without Chromium under CI=true

    for sweep_dir, best_row in ((grid, "★ 1"), (search, None)):
        dom = browser_dom(sweep_dir / "report" / "index.html", tmp_path)
        n = len(list((sweep_dir / "report").glob("*.png")))
        assert n >= 3 and f'data-images="{n}"' in dom and f'data-images-shown="{n}"' in dom, dom[:2000]
        # every plot drawn across the page's whole width (the page's script measures it)
        assert 'data-narrowest-plot="100"' in dom, dom[:2000]
        shown = Page(dom)
        best = [r for r in shown.table() if r[""][0].get("class") == "best"]
        assert len(best) == 1
        if best_row is not None:
            assert best[0]["task"][1] == best_row and "Best run: task 1, val_error=0.125" in dom
            assert 'src="metric_vs_params.png"' in dom
        else:
            trial = json.loads((sweep_dir / "hpo" / "best.json").read_text())["trial"]
            assert best[0]["trial"][1] == f"★ {trial}" and 'src="parallel.png"' in dom and "Run it again" in dom
