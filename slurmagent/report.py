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
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurmagent.runtime.env import TaskFile
from slurmagent.supervise.state import SweepState, SweepStore
from slurmagent.supervise.views import columns, result_rows, summary_line, task_dir, varying_overrides

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
    page = out / "index.html"
    page.write_text(render_page(state, result_rows(state), images))
    return Report(page, images, len(state.tasks), sum(1 for c in per_task.values() if c))


def render_page(state: SweepState, rows: list[dict[str, Any]], images: list[Path]) -> str:
    e = html.escape
    cols = columns(rows)
    head = "".join(f"<th>{e(c)}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{e('' if r.get(c) is None else str(r[c]))}</td>" for c in cols) + "</tr>" for r in rows
    )
    figures = "".join(
        f'<figure><img src="{e(p.name)}" alt="{e(p.stem)} over steps"><figcaption>{e(p.stem)}</figcaption></figure>'
        for p in images
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
