"""Trackers (slurmagent/track/): a task's metrics.jsonl sent on to TensorBoard and MLflow, one
tracker run per task for its whole life. With the real things: TensorBoard event files read back
with TensorBoard's own reader, a real MLflow tracking server on loopback stopped mid-run and
started again. The metrics file is what a job writes; a second Forwarder on the same task
directory is the task's next run (a requeue). The cluster test (tests/slurm/test_track_slurm.py)
runs a sweep with both trackers through the job wrapper and requeues it twice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from slurmagent.config import track_conf
from slurmagent.errors import ConfigError
from slurmagent.track.forward import Forwarder, new_points, read_state
from slurmagent.track.job import sinks_for
from slurmagent.track.sinks import Point, RunInfo
from tests.conftest import wandb_offline_runs

RUN = RunInfo(name="sweep #0", params={"optim.lr": "0.01"}, tags={"slurmagent.task": "0"})


def append(task: Path, *rows: dict[str, Any]) -> None:
    task.mkdir(parents=True, exist_ok=True)
    with open(task / "metrics.jsonl", "a") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)


def steps(first: int, last: int) -> list[dict[str, Any]]:
    return [{"step": s, "loss": 1.0 / s} for s in range(first, last + 1)]


def test_a_point_is_sent_once_per_metric_and_step() -> None:
    sent: dict[str, int] = {}
    lines = [
        b'{"step": 1, "loss": 0.5}',
        b'{"step": 2, "loss": 0.4}',
        b'{"step": 2, "epoch": 1, "loss": 0.4, "val_loss": 0.6}',  # an epoch's line: only val_loss is new
        b'{"step": 2, "loss": 0.45}',  # a redone step after a kill: the first value stays
        b'{"step": 3, "lo',  # cut short by a kill
        b'{"epoch": 2, "val_loss": 0.5}',  # a plain script's epoch-only line: the epoch is its position
        b'{"step": 3, "ok": true, "name": "x", "loss": 0.3}',
    ]
    points = new_points(lines, sent, ms=7)
    assert [(p.name, p.step, p.value) for p in points] == [
        ("loss", 1, 0.5),
        ("loss", 2, 0.4),
        ("val_loss", 2, 0.6),
        ("loss", 3, 0.3),
    ]
    assert sent == {"loss": 3, "val_loss": 2}  # the epoch-only line at position 2 was not past val_loss's 2


class FlakyTracker:
    """A tracker that is down for its first `down` calls (logic only; the real ones are below)."""

    name = "flaky"

    def __init__(self, down: int) -> None:
        self.down = down
        self.got: list[Point] = []
        self.ended: list[str] = []

    def where(self) -> dict[str, Any]:
        return {"to": "memory"}

    def open(self, state: dict[str, Any], run: RunInfo) -> dict[str, Any]:
        return {"run_id": state.get("run_id", "r1")}

    def send(self, points: list[Point]) -> None:
        if self.down > 0:
            self.down -= 1
            raise ConnectionError("connection refused")
        self.got.extend(points)

    def end(self, status: str) -> None:
        self.ended.append(status)


def test_a_tracker_that_is_down_gets_every_point_once_when_it_is_back(tmp_path: Path) -> None:
    task = tmp_path / "task"
    append(task, *steps(1, 5))
    tracker = FlakyTracker(down=2)
    forwarder = Forwarder(task, [tracker], RUN)
    assert not forwarder.pump(force=True)
    assert read_state(task)["flaky"]["error"] == "ConnectionError: connection refused"
    assert read_state(task)["flaky"]["behind"] == 5
    append(task, *steps(6, 8))  # training goes on while the tracker is down
    assert not forwarder.pump(force=True)
    assert forwarder.pump(force=True)
    assert [p.step for p in tracker.got] == list(range(1, 9))
    first_ms = {p.step: p.ms for p in tracker.got}
    assert first_ms[1] <= first_ms[8]
    state = read_state(task)["flaky"]
    assert state["error"] is None and state["behind"] == 0 and state["sent"] == {"loss": 8} and state["points"] == 8
    assert forwarder.close("SCHEDULED", timeout_s=1)
    assert tracker.ended == ["SCHEDULED"]


def test_a_tracker_down_at_the_tasks_end_is_caught_up_by_its_next_run(tmp_path: Path) -> None:
    task = tmp_path / "task"
    append(task, *steps(1, 4))
    assert not Forwarder(task, [FlakyTracker(down=99)], RUN).close("SCHEDULED", timeout_s=0)
    assert read_state(task)["flaky"]["behind"] == 4
    append(task, *steps(5, 6))  # the next run
    again = FlakyTracker(down=0)
    assert Forwarder(task, [again], RUN).close("FINISHED", timeout_s=1)
    assert [p.step for p in again.got] == list(range(1, 7))


def scalars(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    reader = EventAccumulator(str(log_dir))
    reader.Reload()
    return [(e.step, e.value) for e in reader.Scalars(tag)]


def test_interventions_and_rungs_reach_the_tracker_once_on_the_training_step_axis(tmp_path: Path) -> None:
    """The controller's records (adapt.jsonl) and a search trial's rungs go with the metrics:
    a promotion (a second run asked to reach rung 3) adds a rung point; nothing is sent twice."""
    task = tmp_path / "task"
    conf = track_conf({"tensorboard": True})
    append(task, *steps(1, 6))
    adapt = [{"step": 4, "kind": "lr_backoff", "applied": True}, {"step": 6, "kind": "restart_schedule"}]
    (task / "adapt.jsonl").write_text("".join(json.dumps(r) + "\n" for r in adapt))
    assert Forwarder(task, sinks_for(conf, task), RUN, stop_at=1).close("SCHEDULED", timeout_s=30)
    append(task, *steps(7, 9))
    with open(task / "adapt.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 8, "kind": "lr_backoff", "applied": False}) + "\n")
    assert Forwarder(task, sinks_for(conf, task), RUN, stop_at=3).close("FINISHED", timeout_s=30)
    log_dir = task / "tensorboard"
    assert scalars(log_dir, "slurmagent.rung") == [(1, 1.0), (3, 3.0)]
    assert scalars(log_dir, "slurmagent.adapt.lr_backoff") == [(4, 1.0), (8, 0.0)]
    assert scalars(log_dir, "slurmagent.adapt.restart_schedule") == [(6, 0.0)]
    assert [s for s, _ in scalars(log_dir, "loss")] == list(range(1, 10))
    assert read_state(task)["tensorboard"]["adapt_offset"] == (task / "adapt.jsonl").stat().st_size


def test_a_requeued_task_continues_its_tensorboard_run_with_no_point_twice(tmp_path: Path) -> None:
    task = tmp_path / "task"
    conf = track_conf({"tensorboard": True})
    append(task, *steps(1, 10))
    assert Forwarder(task, sinks_for(conf, task), RUN).close("SCHEDULED", timeout_s=30)
    # the next run resumed from step 7's checkpoint (a kill, no stop checkpoint): steps 8-10 redone
    append(task, *steps(8, 20), {"step": 20, "epoch": 1, "loss": 0.05, "val_loss": 0.3})
    assert Forwarder(task, sinks_for(conf, task), RUN).close("FINISHED", timeout_s=30)
    assert [s for s, _ in scalars(task / "tensorboard", "loss")] == list(range(1, 21))
    assert scalars(task / "tensorboard", "val_loss") == [(20, pytest.approx(0.3))]
    assert len(list((task / "tensorboard").iterdir())) == 2  # one event file a run, one folder: one run


def test_an_mlflow_server_stopped_mid_run_loses_no_point_and_a_requeue_continues_the_run(
    tmp_path: Path, mlflow_server: Any
) -> None:
    task = tmp_path / "0"
    conf = track_conf({"mlflow": {"uri": mlflow_server.uri, "experiment": "outage"}}, check_installed=True)
    append(task, *steps(1, 5))
    forwarder = Forwarder(task, sinks_for(conf, task, tmp_path), RUN)
    assert forwarder.pump(force=True)
    run_id = read_state(task)["mlflow"]["run_id"]
    mlflow_server.stop()
    append(task, *steps(6, 12))
    assert not forwarder.pump(force=True)  # the server is down: kept, said in track.json
    down = read_state(task)["mlflow"]
    assert down["behind"] == 7 and down["error"] == "MlflowException: Connection refused", down
    mlflow_server.start()  # the same store, the same port
    assert forwarder.pump(force=True)
    assert forwarder.close("SCHEDULED", timeout_s=30)
    append(task, *steps(11, 15))  # the requeued run redid 11-12
    assert Forwarder(task, sinks_for(conf, task, tmp_path), RUN).close("FINISHED", timeout_s=30)
    sibling = tmp_path / "1"  # another task of the sweep: the sweep's run is its parent too
    append(sibling, *steps(1, 2))
    assert Forwarder(sibling, sinks_for(conf, sibling, tmp_path), RUN).close("FINISHED", timeout_s=30)
    client = MlflowClient(mlflow_server.uri)
    history = client.get_metric_history(run_id, "loss")
    assert [m.step for m in sorted(history, key=lambda m: m.step)] == list(range(1, 16))
    (experiment,) = [e for e in client.search_experiments() if e.name == "outage"]
    every = client.search_runs([experiment.experiment_id])
    (parent,) = [r for r in every if r.data.tags.get("slurmagent.role") == "sweep"]
    runs = [r for r in every if r.data.tags.get("slurmagent.task") == "0" and r.info.run_id == run_id]
    assert len(every) == 3 and len(runs) == 1  # the sweep's run, one run for the task's whole life, the sibling's
    assert {r.data.tags.get("mlflow.parentRunId") for r in every if r is not parent} == {parent.info.run_id}
    assert runs[0].info.status == "FINISHED" and runs[0].data.params == {"optim.lr": "0.01"}
    assert runs[0].info.run_name == "sweep #0" and parent.info.run_name == "sweep"


def test_a_requeued_task_continues_its_wandb_run_offline_with_no_point_twice(tmp_path: Path) -> None:
    task = tmp_path / "task"
    conf = track_conf({"wandb": {"mode": "offline", "project": "p"}}, check_installed=True)
    append(task, *steps(1, 10))
    assert Forwarder(task, sinks_for(conf, task), RUN).close("SCHEDULED", timeout_s=60)
    append(task, *steps(8, 20), {"step": 20, "epoch": 1, "loss": 0.05, "val_loss": 0.3})  # 8-10 redone
    assert Forwarder(task, sinks_for(conf, task), RUN).close("FINISHED", timeout_s=60)
    runs = wandb_offline_runs(task)
    assert len(runs) == 2  # a run directory for each run of the task: `wandb sync` uploads both into one run
    run_id = read_state(task)["wandb"]["run_id"]
    assert {r[0] for r in runs} == {run_id} and runs[0][1] == {"optim.lr": "0.01"}
    history = [h for _, _, hist in runs for h in hist]
    assert [s for s, _ in history] == list(range(1, 21))  # each step once, the axis unbroken
    assert history[-1] == (20, {"loss": 0.05, "val_loss": 0.3})


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"mlflow": {"uri": "htp://x"}}, r"track.mlflow.uri=.htp://x.: not a tracking URI; its scheme is one of"),
        ({"mlflow": {"uri": "gopher://x"}}, r"scheme is one of .*http"),
        ({"tensorbord": True}, r"unknown key track.tensorbord.*did you mean track.tensorboard"),
        ({"mlflow": {"url": "http://x"}}, r"unknown key track.mlflow.url.*did you mean track.mlflow.uri"),
        ({"interval_s": 0}, r"track.interval_s=0 must be above 0"),
        ({"wandb": {"mode": "offlne"}}, r"track.wandb.mode='offlne' is not one of .*offline"),
        ({"mlflow": "http://x"}, r"track.mlflow='http://x' has the wrong type"),
    ],
)
def test_bad_track_settings_name_the_key_and_the_choices(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        track_conf(raw)


def test_a_tracker_whose_library_is_missing_is_refused_at_submission(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(ConfigError, match=r"mlflow package is not installed here: pip install 'slurmagent\[mlflow\]'"):
        track_conf({"mlflow": {"uri": "http://127.0.0.1:5000"}}, check_installed=True)
    assert track_conf({"mlflow": {"uri": "http://127.0.0.1:5000"}}).enabled == ["mlflow"]  # in a job: not asked


def test_a_sweep_that_ended_with_its_tracker_down_is_shown_in_status_and_sent_by_track(
    tmp_path: Path, home: Path
) -> None:
    """The user's path on the local backend: the MLflow server is down for the whole task; the
    task still completes, `status` says what was not sent, `slurmagent track` sends it once the
    server is up — into one run, every step once."""
    import subprocess
    import sys

    from tests.conftest import MlflowServer

    server = MlflowServer(tmp_path / "mlflow-server")  # not started yet: down
    args = ["cluster=local", "synthetic.steps=20", f"track.mlflow.uri={server.uri}", "track.flush_timeout_s=1"]

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        run = [sys.executable, "-m", "slurmagent", *argv]
        return subprocess.run(run, cwd=home, capture_output=True, text=True, timeout=300)

    ran = cli("-m", *args)
    assert ran.returncode == 0, ran.stderr  # a tracker never fails the task
    (sweep,) = [p for p in home.glob("multirun/*/*") if (p / "sweep.json").is_file()]
    status = cli("status", str(sweep))
    expected = "trackers behind: task 0 mlflow 20 point(s) not sent (MlflowException: Connection refused)"
    assert expected in status.stdout, status.stdout
    (task,) = json.loads(cli("status", str(sweep), "--json").stdout)["tasks"]
    assert task["track"]["mlflow"]["behind"] == 20
    assert cli("track", str(sweep), "--timeout", "2").returncode == 1  # still down: said, exit 1
    server.start()
    try:
        synced = cli("track", str(sweep))
        assert synced.returncode == 0 and "task 0 mlflow: 20 point(s)" in synced.stdout, synced.stdout + synced.stderr
        run_id = read_state(sweep / "0")["mlflow"]["run_id"]
        client = MlflowClient(server.uri)
        assert sorted(m.step for m in client.get_metric_history(run_id, "steps_run_here")) == list(range(20))
        assert client.get_run(run_id).data.params["synthetic.steps"] == "20"
        assert "trackers behind" not in cli("status", str(sweep)).stdout
        assert cli("track", str(sweep)).returncode == 0  # again: nothing new, nothing twice
        assert len(client.get_metric_history(run_id, "steps_run_here")) == 20
    finally:
        server.stop()
