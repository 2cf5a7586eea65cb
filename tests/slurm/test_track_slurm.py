"""Trackers on the real cluster, as a user runs them: from a directory outside the checkout, the
default sweep dir and checkpoint dir, a real MLflow tracking server on loopback, TensorBoard
event files read back with TensorBoard's own reader, W&B offline runs read back from their run
files. (a) The README's digits task requeued twice with `scontrol requeue` is one MLflow run,
one TensorBoard run and one W&B run id, every step once, the step axis unbroken; (b) a search
whose trials are promoted by resuming: one run per trial, its epochs each once across the
promotions."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fault_cases import wait_for
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_default_paths_slurm import POLL, finish, requeue, running_job, start, state, the_sweep

from tests.conftest import MlflowServer, wandb_offline_runs

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """One tracking server for this module's tests (each its own experiment): started once."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    server.start()
    yield server
    server.stop()


def lines(task_dir: Path) -> int:
    path = task_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def runs_of(client: MlflowClient, experiment: str) -> list[Any]:
    (found,) = [e for e in client.search_experiments() if e.name == experiment]
    return list(client.search_runs([found.experiment_id]))


def steps_of(client: MlflowClient, run_id: str, metric: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, metric))


def test_a_task_requeued_twice_is_one_tracker_run_with_every_step_once(home: Path, mlflow_server: Any) -> None:
    launcher = start(
        home, "+experiment=digits_mlp", "-m", "train.steps=200", "train.step_delay_s=0.05", "track.tensorboard=true",
        f"track.mlflow.uri={mlflow_server.uri}", "track.mlflow.experiment=digits", "track.wandb.mode=offline",
        *POLL,
    )  # fmt: skip
    sweep = the_sweep(home)
    task_dir = sweep / "0"
    job = running_job(sweep, 0, min_lines=40)
    for _ in range(2):
        seen = lines(task_dir)
        requeue(job)
        wait_for(lambda seen=seen: lines(task_dir) > seen + 40, "the requeued run to train on", 240, 0.5)
    code, out = finish(launcher)
    assert code == 0, out
    (task,) = state(sweep)["tasks"]
    assert task["state"] == "COMPLETED" and task["attempts"][0]["restarts"] >= 2, task

    tracked = json.loads((task_dir / "track.json").read_text())
    client = MlflowClient(mlflow_server.uri)
    sweep_run, run = sorted(runs_of(client, "digits"), key=lambda r: "slurmagent.task" in r.data.tags)
    assert sweep_run.data.tags["slurmagent.role"] == "sweep"  # the sweep's own run, and one for the task's three
    assert run.data.tags["mlflow.parentRunId"] == sweep_run.info.run_id
    assert run.info.run_id == tracked["mlflow"]["run_id"] and run.info.status == "FINISHED"
    assert run.data.params["optim.lr"] == "0.003" and run.data.tags["slurmagent.task"] == "0"
    expected = sorted({json.loads(r)["step"] for r in (task_dir / "metrics.jsonl").read_text().splitlines()})
    assert expected == list(range(expected[0], expected[0] + 200))  # 200 steps, the axis unbroken
    assert steps_of(client, run.info.run_id, "loss") == expected  # each step once, none missing
    assert len(steps_of(client, run.info.run_id, "val_error")) == len(
        set(steps_of(client, run.info.run_id, "val_error"))
    )

    reader = EventAccumulator(str(task_dir / "tensorboard"))
    reader.Reload()
    assert [e.step for e in reader.Scalars("loss")] == expected
    assert len(list((task_dir / "tensorboard").glob("events.out.tfevents.*"))) >= 3  # a file a run, one folder
    assert tracked["mlflow"]["behind"] == 0 and tracked["tensorboard"]["behind"] == 0

    runs = wandb_offline_runs(task_dir)  # W&B offline: a run directory a run, all of them the task's one run id
    assert len(runs) >= 3 and {r[0] for r in runs} == {tracked["wandb"]["run_id"]}, [r[0] for r in runs]
    assert runs[0][1]["optim"] == {"lr": 0.003, "weight_decay": 0.0}
    loss_steps = [step for _, _, history in runs for step, values in history if "loss" in values]
    assert loss_steps == expected


def test_a_search_trial_promoted_twice_is_one_tracker_run(home: Path, mlflow_server: Any) -> None:
    launcher = start(
        home, "+experiment=synthetic", "hydra/sweeper=slurmagent_hpo", "-m", "synthetic.x=interval(0,1)",
        "hpo.fidelity.key=synthetic.epochs", "hpo.fidelity.max=4", "hpo.fidelity.eta=2",
        "synthetic.steps_per_epoch=3", "synthetic.step_time_s=0.2", "hpo.budget.trials=6", "hpo.max_parallel=3",
        f"track.mlflow.uri={mlflow_server.uri}", "track.mlflow.experiment=search", *POLL,
    )  # fmt: skip
    sweep = the_sweep(home)
    code, out = finish(launcher, timeout=600)
    assert code == 0, out
    trials = json.loads((sweep / "hpo" / "trials.json").read_text())["trials"]
    client = MlflowClient(mlflow_server.uri)
    every = runs_of(client, "search")
    (parent,) = [r for r in every if r.data.tags.get("slurmagent.role") == "sweep"]  # the search's own run
    assert parent.data.tags["slurmagent.sweep_dir"] == str(sweep) and parent.info.status == "FINISHED"
    runs = {r.data.tags["slurmagent.task"]: r for r in every if r is not parent}
    assert sorted(runs) == sorted(str(t["trial"]) for t in trials)  # one run a trial, promotions included
    assert {r.data.tags["mlflow.parentRunId"] for r in runs.values()} == {parent.info.run_id}  # all its children
    twice = [t for t in trials if t["promotions"] >= 2]
    assert twice, trials
    for t in trials:
        run = runs[str(t["trial"])]
        assert "synthetic.x" in run.data.params
        points = client.get_metric_history(run.info.run_id, "val_error")
        steps = sorted(m.step for m in points)
        assert len(steps) == len(set(steps)) == t["epochs"], (t, steps)  # each epoch's value once across promotions
        rungs = steps_of(client, run.info.run_id, "slurmagent.rung")  # a point for each rung it was run to
        assert len(rungs) == t["promotions"] + 1 and rungs[-1] == t["epochs"], (t, rungs)
