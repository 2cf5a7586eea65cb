"""The adaptive search through the fake Slurm (tests/fake/fake_slurm.py): trials are array
tasks, promotions resume their checkpoints, a preempted trial keeps its trial, a killed
launcher's study is continued by `watch`, bad input submits nothing. The real cluster
runs the same in tests/slurm/test_hpo_slurm.py."""

from __future__ import annotations

import csv
import html
import io
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from tests.conftest import browser_dom
from tests.fake.conftest import first_job_id, slurmagent, start, sweep_state, wait_steps
from tests.fake.fake_slurm import FakeSlurm

SEARCH = (
    "+experiment=synthetic",
    "cluster=slurm",
    "hydra/sweeper=slurmagent_hpo",
    "hydra.launcher.poll_interval_s=0.3",
    "-m",
    "synthetic.x=interval(0,1)",
    "hpo.fidelity.key=synthetic.epochs",
    "hpo.fidelity.max=9",
    "synthetic.steps_per_epoch=3",
)


def trials(sweep: Path) -> dict[str, Any]:
    return json.loads((sweep / "hpo" / "trials.json").read_text())  # type: ignore[no-any-return]


def epochs_reported(sweep: Path, index: int) -> list[int]:
    lines = (sweep / str(index) / "metrics.jsonl").read_text().splitlines()
    return [int(row["epoch"]) for row in map(json.loads, lines) if "epoch" in row]


def test_a_search_promotes_by_resuming_and_lists_one_row_per_trial(fake: FakeSlurm, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    out = slurmagent(fake, tmp_path, *SEARCH, "hpo.budget.trials=7", "hpo.max_parallel=3", f"hydra.sweep.dir={sweep}")
    assert out.returncode == 0, out.stderr
    body = trials(sweep)
    assert body["finished"] and len(body["trials"]) == 7 and body["rungs"] == [1, 3, 9]
    promoted = [t for t in body["trials"] if t["promotions"]]
    assert promoted, "7 trials at eta 3: the best of the first rung continue"
    tasks = {t["index"]: t for t in sweep_state(sweep)["tasks"]}
    for t in promoted:
        # every epoch reported once: each promotion resumed where the trial stopped, none began again
        assert epochs_reported(sweep, t["trial"]) == list(range(1, t["epochs"] + 1))
        attempts = tasks[t["trial"]]["attempts"]
        assert len(attempts) == 1 + t["promotions"] and tasks[t["trial"]]["result"]["resumed_from"] is not None
    best = json.loads((sweep / "hpo" / "best.json").read_text())
    assert best["epochs"] == 9 and "synthetic.epochs=9" in best["reproduce"]
    assert "slurmagent +experiment=synthetic" in (out.stderr + out.stdout).split("run it again: ")[1]
    # one row per trial: parameters, epochs reached, objective, state
    table = slurmagent(fake, tmp_path, "results", str(sweep), "--csv")
    rows = list(csv.DictReader(io.StringIO(table.stdout)))
    assert len(rows) == 7 and {"trial", "state", "synthetic.x", "epochs", "val_error"} <= set(rows[0])
    assert {r["state"] for r in rows} <= {"complete", "stopped"}
    status = slurmagent(fake, tmp_path, "status", str(sweep))
    assert "search: 7 trial(s)" in status.stdout and "finished" in status.stdout
    # the report: the search's plots, every trial in a CSV, the command that reproduces the best
    made = slurmagent(fake, tmp_path, "report", str(sweep))
    assert made.returncode == 0, made.stderr
    report = sweep / "report"
    for name in ("history", "curves", "params", "parallel", "importance"):
        assert (report / f"{name}.png").stat().st_size > 5000, name
    assert len(list(csv.DictReader(io.StringIO((report / "trials.csv").read_text())))) == 7
    dom = browser_dom(report / "index.html", tmp_path)
    n = len(list(report.glob("*.png")))
    assert f'data-images="{n}"' in dom and f'data-images-shown="{n}"' in dom, dom[:2000]
    assert best["reproduce"] in html.unescape(dom)
    assert "Run it again" in dom and 'src="curves.png"' in dom


def test_a_preempted_trial_keeps_its_trial_and_a_killed_launcher_is_continued_by_watch(
    fake: FakeSlurm, tmp_path: Path
) -> None:
    sweep = tmp_path / "sweep"
    slow = ("synthetic.step_time_s=0.3", "checkpoint.every_steps=2", "hpo.budget.trials=5", "hpo.max_parallel=2")
    launcher = start(fake, tmp_path, *SEARCH, *slow, f"hydra.sweep.dir={sweep}")
    job = first_job_id(sweep)
    fake.wait(job, ("RUNNING",))
    wait_steps(sweep, 1)  # mid-rung: its first rung is 3 steps of 0.3 s
    fake.preempt(job)  # requeued by Slurm: the same trial goes on from its checkpoint
    deadline = time.monotonic() + 60
    while not any(t["state"] == "COMPLETED" for t in sweep_state(sweep)["tasks"]):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    os.kill(launcher.pid, signal.SIGKILL)  # the launcher dies mid-study
    launcher.communicate(timeout=30)
    watch = slurmagent(fake, tmp_path, "watch", str(sweep), "--interval", "0.3", "--timeout", "240")
    assert watch.returncode == 0, watch.stderr
    body = trials(sweep)
    assert body["finished"] and [t["trial"] for t in body["trials"]] == [0, 1, 2, 3, 4]  # none lost
    assert all(t["state"] in ("complete", "stopped") for t in body["trials"]), body["trials"]  # none failed
    state = sweep_state(sweep)
    first = state["tasks"][0]
    assert first["state"] == "COMPLETED" and first["attempts"][0]["restarts"] >= 1  # preempted, requeued
    for t in body["trials"]:  # none started twice from scratch: epoch 1 reported once per trial
        assert epochs_reported(sweep, t["trial"]).count(1) == 1


def test_bad_search_input_names_the_key_and_submits_nothing(fake: FakeSlurm, tmp_path: Path) -> None:
    cases = [
        (("hpo.direction=down",), "hpo.direction='down' is not one of"),
        (("hpo.fidelity.key=synthetic.nope",), "hpo.fidelity.key=synthetic.nope: the experiment has no such key"),
        (("resources.mem=choice(1G,2G)",), "a search cannot sweep the job spec"),
        (("hpo.budget.trials=0",), "hpo.budget: set at least one of"),
        (("hpo.storage=mongodb://x",), "hpo.storage='mongodb://x': use ''"),
    ]
    for extra, message in cases:
        sweep = tmp_path / f"sweep-{len(os.listdir(tmp_path))}"
        out = slurmagent(fake, tmp_path, *SEARCH, "hpo.budget.trials=3", *extra, f"hydra.sweep.dir={sweep}")
        assert out.returncode != 0 and message in out.stderr, (extra, out.stderr)
        assert "Traceback" not in out.stderr
        assert not (sweep / "sweep.json").exists()
    assert not fake.jobs()


def test_a_detached_search_is_run_by_the_supervisor_job(fake: FakeSlurm, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    out = slurmagent(fake, tmp_path, *SEARCH, "hpo.budget.trials=5", "--detach", f"hydra.sweep.dir={sweep}")
    assert out.returncode == 0, out.stderr
    assert "detached: the sweep is supervised by Slurm job" in out.stderr
    deadline = time.monotonic() + 180
    while not ((sweep / "hpo" / "trials.json").exists() and trials(sweep)["finished"]):
        assert time.monotonic() < deadline, sweep_state(sweep)["tasks"]
        time.sleep(0.3)
    body = trials(sweep)
    assert len(body["trials"]) == 5 and any(t["promotions"] for t in body["trials"])  # promoted by the supervisor
    lead = json.loads((sweep / ".slurmagent" / "lead.json").read_text())
    assert lead["role"].startswith("supervisor job")
