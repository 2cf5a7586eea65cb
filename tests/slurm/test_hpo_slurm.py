"""The adaptive search on the real test cluster: digits_mlp (real torch training) searched
with its study in the test PostgreSQL, trials as array tasks, promotions resuming their
checkpoints; and a synthetic search whose trial Slurm requeues and whose launcher is
killed, continued by `slurmagent watch` with no trial lost or begun twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fault_cases import sweep_state

pytestmark = pytest.mark.slurm

POLL = ("hydra.launcher.poll_interval_s=1", "hydra.launcher.max_poll_interval_s=2")


def slurmagent(cwd: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurmagent", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def trials(sweep: Path) -> dict[str, Any]:
    return json.loads((sweep / "hpo" / "trials.json").read_text())  # type: ignore[no-any-return]


def epochs_reported(sweep: Path, index: int) -> list[int]:
    lines = (sweep / str(index) / "metrics.jsonl").read_text().splitlines()
    return [int(row["epoch"]) for row in map(json.loads, lines) if "epoch" in row]


def test_digits_search_with_its_study_in_postgresql(tmp_path: Path, postgres_db: str) -> None:
    sweep = tmp_path / "sweep"
    out = slurmagent(
        tmp_path,
        "+experiment=digits_mlp",
        "cluster=slurm",
        "hydra/sweeper=slurmagent_hpo",
        *POLL,
        "-m",
        "optim.lr=tag(log,interval(1e-3,1e-1))",
        "model.width=choice(16,32,64)",
        "hpo.fidelity.max=4",
        "hpo.fidelity.eta=2",
        "hpo.budget.trials=6",
        "hpo.max_parallel=3",
        f"hpo.storage={postgres_db}",
        "resources.time=00:10:00",
        f"hydra.sweep.dir={sweep}",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    body = trials(sweep)
    assert body["finished"] and len(body["trials"]) == 6 and body["rungs"] == [1, 2, 4]
    assert body["storage"].startswith("postgresql+psycopg2://slurmagent:***@127.0.0.1")  # the password hidden
    assert all(t["state"] in ("complete", "stopped") for t in body["trials"]), body["trials"]
    promoted = [t for t in body["trials"] if t["promotions"]]
    assert promoted
    tasks = {t["index"]: t for t in sweep_state(sweep)["tasks"]}
    for t in promoted:  # resumed from its checkpoint: each epoch trained and reported once
        assert epochs_reported(sweep, t["trial"]) == list(range(1, t["epochs"] + 1))
        assert tasks[t["trial"]]["result"]["resumed_from"] == 22 * (t["epochs"] // 2)  # 22 steps an epoch
    # the study is Optuna's, in PostgreSQL: optuna (or optuna-dashboard) opens it there
    import optuna

    study = optuna.load_study(study_name=body["study_name"], storage=postgres_db)
    assert len(study.trials) == 6
    states = {t.number: t.state.name for t in study.trials}
    assert {states[t["trial"]] for t in body["trials"] if t["state"] == "complete"} <= {"COMPLETE"}
    assert {states[t["trial"]] for t in body["trials"] if t["state"] == "stopped"} <= {"PRUNED"}
    best = json.loads((sweep / "hpo" / "best.json").read_text())
    assert best["epochs"] == 4 and 0 <= best["value"] < 0.5 and "train.epochs=4" in best["reproduce"]


def test_a_requeued_trial_and_a_killed_launcher_lose_nothing(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "slurmagent",
            "+experiment=synthetic",
            "cluster=slurm",
            "hydra/sweeper=slurmagent_hpo",
            *POLL,
            "-m",
            "synthetic.x=interval(0,1)",
            "hpo.fidelity.key=synthetic.epochs",
            "hpo.fidelity.max=9",
            "synthetic.steps_per_epoch=4",
            "synthetic.step_time_s=0.5",
            "checkpoint.every_steps=2",
            "hpo.budget.trials=5",
            "hpo.max_parallel=2",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 180
    job = ""
    while time.monotonic() < deadline and not job:  # trial 0's job, running (asked of Slurm: polls may miss it)
        first = next((t for t in sweep_state(sweep)["tasks"] if t["index"] == 0 and t["attempts"]), None)
        if first is not None:
            seen = subprocess.run(
                ["squeue", "-h", "-j", first["attempts"][-1]["job_id"], "-o", "%T"], text=True, capture_output=True
            ).stdout.strip()
            job = first["attempts"][-1]["job_id"] if seen == "RUNNING" else ""
        time.sleep(0.2)
    assert job, "trial 0 did not start"
    time.sleep(2.0)
    requeue = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    assert requeue.returncode == 0, requeue.stderr  # Slurm requeues the trial's job: not a failure
    while time.monotonic() < deadline + 120 and not any(t["state"] == "COMPLETED" for t in sweep_state(sweep)["tasks"]):
        time.sleep(0.5)
    os.killpg(launcher.pid, signal.SIGKILL)  # the login session dies mid-study
    launcher.communicate(timeout=30)
    watch = slurmagent(tmp_path, "watch", str(sweep), "--interval", "1", "--timeout", "600")
    assert watch.returncode == 0, watch.stderr[-3000:]
    body = trials(sweep)
    assert body["finished"] and [t["trial"] for t in body["trials"]] == [0, 1, 2, 3, 4]
    assert all(t["state"] in ("complete", "stopped") for t in body["trials"]), body["trials"]
    assert sweep_state(sweep)["tasks"][0]["attempts"][0]["restarts"] >= 1  # the requeue was seen, the trial kept
    for t in body["trials"]:  # no trial begun twice from scratch (the requeued one redid at most its last steps)
        seen = epochs_reported(sweep, t["trial"])
        assert sorted(set(seen)) == list(range(1, t["epochs"] + 1)), t
        assert t["trial"] == 0 or seen.count(1) == 1, t
    rows = slurmagent(tmp_path, "results", str(sweep), "--csv").stdout.splitlines()
    assert len(rows) == 6 and rows[0].startswith("trial,state,synthetic.x,epochs,val_error")
