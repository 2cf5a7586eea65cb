"""User-path input of the CLI (issue 19): a typo'd key says the key meant at once, doctor
tells a path from a job id, `slurmagent sweeps` and the newest sweep by default, render and
plan with a config directory of one's own, and bad numbers or files that cost one line (exit
2, nothing written), never a traceback. In process: `slurmagent.cli.main` as the console
script calls it."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmagent import cli
from slurmagent.supervise.state import Attempt, SweepState, SweepStore, TaskRecord

pytestmark = pytest.mark.usefixtures("own_state_dir")


@pytest.fixture(autouse=True)
def _in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """What `_hydra` changes in the process (sys.argv, HYDRA_FULL_ERROR) is put back afterwards."""
    monkeypatch.setattr(sys, "argv", ["slurmagent"])
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")


def run(*argv: str) -> tuple[int, str, str]:
    """`slurmagent ARGV` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(list(argv))
        except SystemExit as exc:  # argparse
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slurmagent: error: "), err
    return lines[0]


def tree(root: Path) -> dict[str, tuple[int, float]]:
    return {str(p): (p.lstat().st_size, p.lstat().st_mtime) for p in root.rglob("*")}


def make_sweep(sweep: Path, states: list[str], created_at: float) -> Path:
    tasks = [
        TaskRecord(i, [f"x={i}"], [Attempt(f"{100 + i}", created_at, state)], state=state)
        for i, state in enumerate(states)
    ]
    SweepStore(sweep).create(SweepState(str(sweep), "local", str(sweep / ".submitit"), created_at, tasks))
    from submitit.core.utils import JobPaths

    for i in range(len(states)):  # each task's job's stdout, where submitit leaves it
        stdout = Path(JobPaths(sweep / ".submitit", job_id=f"{100 + i}", task_id=0).stdout)
        stdout.parent.mkdir(parents=True, exist_ok=True)
        stdout.write_text(f"task {i} of {sweep.name} says hello\n")
    return sweep


# -- A: a typo of an existing key, without + -------------------------------------------------
@pytest.mark.parametrize(
    ("override", "unknown", "meant"),
    [
        ("optim.lrr=0.01", "optim.lrr", "optim.lr"),  # a nested key of the experiment
        ("lrr=0.01", "lrr", "optim.lr"),  # the key without its group
        ("modle.width=3", "modle", "model"),  # a top-level group of the experiment
        ("train.step=4", "train.step", "train.steps"),
    ],
)
def test_a_typo_of_an_existing_key_says_the_key_meant_at_once(
    tmp_path: Path, override: str, unknown: str, meant: str
) -> None:
    sweep = tmp_path / "sweep"
    code, _, err = run("+experiment=digits_mlp", "cluster=local", "-m", override, f"hydra.sweep.dir={sweep}")
    line = one_error_line(err)
    assert code == 2 and f"unknown key {unknown};" in line and f"did you mean {meant}?" in line, line
    assert f"(to add a new key: +{override})" in line  # and how to add it, when it is meant
    assert not sweep.exists()


# -- B: doctor: a job id, or a path ------------------------------------------------------------
def test_doctor_takes_what_is_not_a_job_id_as_a_path_and_never_asks_slurm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurmagent.slurm.seam import SlurmCLI

    def no_sacct(self: SlurmCLI, job_ids: object) -> object:
        raise AssertionError(f"sacct asked about {job_ids}")

    monkeypatch.setattr(SlurmCLI, "available", lambda self: True)
    monkeypatch.setattr(SlurmCLI, "statuses", no_sacct)
    here = tmp_path / "elsewhere"
    here.mkdir()
    make_sweep(tmp_path / "multirun" / "2024-01-02" / "03-04-05", ["COMPLETED"], time.time())
    monkeypatch.chdir(here)  # the sweep's relative path names nothing from here
    code, _, err = run("doctor", "multirun/2024-01-02/03-04-05")
    assert code == 2
    assert "multirun/2024-01-02/03-04-05 is not a slurmagent sweep directory: no such directory" in one_error_line(err)
    code, _, err = run("doctor", "../elsewhere")
    assert code == 2 and "not a slurmagent sweep directory" in one_error_line(err)
    monkeypatch.chdir(tmp_path)  # resolved against the working directory: found
    code, out, err = run("doctor", "multirun/2024-01-02/03-04-05")
    assert code == 0 and "no failed task" in out, err


# -- C: slurmagent sweeps, and the newest sweep by default ------------------------------------------
@pytest.fixture()
def three_sweeps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Path]]:
    """Two sweeps under ./multirun and a newer one launched elsewhere (only in the index)."""
    from slurmagent.launch.index import record_sweep

    work = tmp_path / "work"
    old = make_sweep(work / "multirun" / "2024-01-02" / "03-04-05", ["COMPLETED", "COMPLETED", "FAILED"], 1)
    mid = make_sweep(work / "multirun" / "2024-03-04" / "05-06-07", ["COMPLETED", "RUNNING", "COMPLETED", "PENDING"], 2)
    new = make_sweep(tmp_path / "other" / "mysweep", ["RUNNING"], 3)
    record_sweep(new)
    monkeypatch.chdir(work)
    yield {"old": old, "mid": mid, "new": new}


def test_sweeps_lists_the_recent_sweeps_newest_first_with_their_states(three_sweeps: dict[str, Path]) -> None:
    code, out, err = run("sweeps")
    assert code == 0, err
    lines = out.strip().splitlines()
    assert len(lines) == 3
    assert lines[0].endswith(str(three_sweeps["new"])) and "1 RUNNING" in lines[0]
    assert lines[1].endswith("multirun/2024-03-04/05-06-07") and "2 COMPLETED, 1 PENDING, 1 RUNNING" in lines[1]
    assert lines[2].endswith("multirun/2024-01-02/03-04-05") and "2 COMPLETED, 1 FAILED" in lines[2]
    code, out, _ = run("sweeps", "--json", "--limit", "2")
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["sweep_dir"] for r in rows] == [str(three_sweeps["new"]), str(three_sweeps["mid"].absolute())]
    assert rows[0]["counts"] == {"RUNNING": 1}


def test_a_deleted_sweep_is_skipped_and_a_broken_one_said(three_sweeps: dict[str, Path]) -> None:
    import shutil

    shutil.rmtree(three_sweeps["new"])
    (three_sweeps["old"] / "sweep.json").write_text("{not json")
    code, out, _ = run("sweeps")
    lines = out.strip().splitlines()
    assert code == 0 and len(lines) == 2
    assert "unreadable" in lines[1] and lines[1].endswith("03-04-05")


@pytest.mark.parametrize("command", ["status", "results", "logs", "report"])
def test_commands_take_the_newest_sweep_when_none_is_given(
    three_sweeps: dict[str, Path], command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(three_sweeps["mid"].parents[2])
    (three_sweeps["new"] / "sweep.json").unlink()  # gone: the newest is the one under ./multirun
    argv = [command, "--json"] if command == "status" else [command]
    code, out, err = run(*argv)
    assert code == 0, err
    assert err.strip() == f"slurmagent: {command}: the newest sweep, multirun/2024-03-04/05-06-07"
    if command == "status":
        assert json.loads(out)["sweep_dir"] == str(three_sweeps["mid"])


def test_logs_with_a_task_index_only_is_that_task_of_the_newest_sweep(three_sweeps: dict[str, Path]) -> None:
    code, out, err = run("logs", "0")
    assert code == 0, err
    assert err.strip() == f"slurmagent: logs: the newest sweep, {three_sweeps['new']}"
    assert "task 0 of mysweep says hello" in out
    code, out, err = run("logs", "3")  # the newest sweep has one task
    assert code == 2 and "task 3 is not in" in one_error_line(err.split("\n", 1)[1])


def test_cancel_never_guesses_its_sweep(three_sweeps: dict[str, Path]) -> None:
    code, _, err = run("cancel")
    assert code == 2 and "sweep_dir" in err
    assert SweepStore(three_sweeps["new"]).load().tasks[0].state == "RUNNING"


def test_no_sweep_anywhere_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run("status")
    assert code == 2 and "no sweep directory given" in one_error_line(err) and "status DIR" in err


def test_a_local_sweep_is_in_the_index_and_found_from_anywhere(tmp_path: Path, own_state_dir: Path) -> None:
    """The launcher's side: a sweep launched with its own hydra.sweep.dir, listed from elsewhere."""
    import subprocess

    sweep = tmp_path / "mine" / "run1"
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    launch = [sys.executable, "-m", "slurmagent", "cluster=local", "-m", "synthetic.steps=2"]
    proc = subprocess.run(
        [*launch, f"hydra.sweep.dir={sweep}", "hydra.launcher.poll_interval_s=0.2"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    listed = subprocess.run(
        [sys.executable, "-m", "slurmagent", "sweeps"], cwd=elsewhere, env=env, capture_output=True, text=True
    )
    line = listed.stdout.strip()
    assert line.endswith(f"  {sweep}") and line.split()[2:4] == ["1", "COMPLETED"], listed.stdout + listed.stderr


# -- D: render and plan with a config directory of one's own --------------------------------------
@pytest.fixture()
def my_conf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    conf = tmp_path / "conf"
    (conf / "experiment").mkdir(parents=True)
    (conf / "experiment" / "mine.yaml").write_text(
        "# @package _global_\n"
        "task:\n  target: slurmagent.examples.synthetic:run\n"
        "synthetic:\n  steps: 17\n"
        "resources:\n  cpus_per_task: 3\n"
    )
    monkeypatch.chdir(tmp_path)
    return conf


@pytest.mark.parametrize("flag", ["--config-dir", "-cd"])
def test_render_composes_with_a_config_dir_of_ones_own(my_conf: Path, flag: str) -> None:
    code, _, err = run("render", flag, "conf", "+experiment=mine", "-o", "out")
    assert code == 0, err
    from omegaconf import OmegaConf

    rendered = OmegaConf.load(my_conf.parent / "out" / "config.yaml")
    assert rendered.synthetic.steps == 17 and rendered.resources.cpus_per_task == 3
    assert "--cpus-per-task=3" in (my_conf.parent / "out" / "job.sbatch").read_text()


@pytest.mark.parametrize("flag", ["--config-dir", "-cd"])
def test_plan_composes_with_a_config_dir_of_ones_own(my_conf: Path, flag: str) -> None:
    code, out, err = run("plan", flag, str(my_conf), "+experiment=mine", "cluster=local", "--json")
    assert code == 0, err
    assert json.loads(out)["sbatch"]["cpus-per-task"] == "3"


def test_a_config_dir_that_is_not_one_is_one_line(my_conf: Path) -> None:
    for command in ("render", "plan"):
        code, _, err = run(command, "--config-dir", "nope", "+experiment=mine")
        assert code == 2 and "--config-dir nope: no such file or directory" in one_error_line(err)
    assert not (my_conf.parent / "render").exists()


# -- E: bad numbers and files ----------------------------------------------------------------
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_budget_that_is_not_a_number_is_refused(tmp_path: Path, value: str) -> None:
    sweep = tmp_path / "sweep"
    code, _, err = run("cluster=local", "-m", f"budget.gpu_hours={value}", f"hydra.sweep.dir={sweep}")
    assert code == 2 and "budget.gpu_hours" in one_error_line(err) and "finite" in err
    assert not sweep.exists()


def test_a_history_that_is_not_a_database_is_a_warning_not_the_end_of_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    broken = tmp_path / "history.sqlite"
    broken.write_text("this is not a database\n" * 100)
    with caplog.at_level(logging.WARNING):
        code, out, err = run(
            "plan", "cluster=local", "resources.time=auto", f"site.scheduling.history={broken}", "--json"
        )
    assert code == 0, err
    plan = json.loads(out)
    assert plan["resources"]["time"] == "01:00:00"  # the fallback: as without history
    assert "cannot be used (file is not a database)" in caplog.text and str(broken) in caplog.text
    assert broken.read_text().startswith("this is not a database")  # left as it was


def test_a_history_store_that_cannot_be_read_reads_as_empty(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from slurmagent.schedule.history import HistoryStore

    folder = tmp_path / "a-folder"
    folder.mkdir()
    not_db = tmp_path / "x.sqlite"
    not_db.write_bytes(os.urandom(4096))
    for path in (folder, not_db, tmp_path / "file" / "below-a-file.sqlite"):
        if path.parent.name == "file":
            path.parent.write_text("a file")
        with caplog.at_level(logging.WARNING):
            store = HistoryStore(path)
            assert store.recent("fp") == [] and store.problem
        assert "sizing as without history" in caplog.text


def test_status_of_a_file_is_one_line(tmp_path: Path) -> None:
    code, _, err = run("status", "/etc/passwd")
    assert code == 2 and "sweep directory /etc/passwd is a file, not a directory" in one_error_line(err)


def test_the_sweep_index_does_not_grow_without_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurmagent.launch import index

    monkeypatch.setenv("SLURMAGENT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(index, "INDEX_KEEP", 5)
    live = tmp_path / "live"
    live.mkdir()
    (live / "sweep.json").write_text("{}")
    for i in range(40):
        index.record_sweep(live if i % 2 else tmp_path / f"gone-{i}")
    lines = index.index_path().read_text().splitlines()
    assert len(lines) < 40 and all("gone" not in line for line in lines[: len(lines) - 10]), lines


@pytest.mark.parametrize("command", ["plan", "render"])
def test_a_path_option_given_a_bare_double_dash_is_one_line(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """argparse hands `--config-dir=--` over as [] (found by the property test in CI)."""
    from slurmagent.cli import main

    assert main([command, "--config-dir=--"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "slurmagent: error: --config-dir needs a path (got '--')", err
