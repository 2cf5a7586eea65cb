"""The README's plain-script examples on the real cluster, as a user runs them: the program in
a directory of their own, the README's command (`task.target=null 'task.command=[…]'`), the
default sweep dir and checkpoint dir, no `cluster=`, and a `scontrol requeue` mid-run. The
Python example (torch, no slurmagent import) must end with the parameters an uninterrupted run
of it ends with, bit for bit, with its progress in `status` while it ran and its loss among the
columns of `results`; both must do each step exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_default_paths_slurm import POLL, cli, finish, requeue, running_job, state, the_sweep
from trainer_cases import progress_in_status

from tests.conftest import readme_example, run_uninterrupted, venv_on_path

pytestmark = pytest.mark.slurm


def launch(home: Path, example: str, command: str) -> subprocess.Popen[str]:
    """The README's example `example` saved under its own name in `home`, run by the README's command."""
    (home / example.split()[1]).write_text(readme_example(example))
    return subprocess.Popen(
        [sys.executable, "-m", "slurmagent", "-m", "task.target=null", f"task.command={command}", *POLL],
        cwd=home,
        env=venv_on_path(dict(os.environ)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def steps_of(sweep: Path) -> list[dict[str, int]]:
    return [json.loads(line) for line in (sweep / "0" / "metrics.jsonl").read_text().splitlines()]


def test_the_readme_plain_scripts_resume_exactly_after_scontrol_requeue(home: Path, tmp_path: Path) -> None:
    py_home, sh_home = home / "py", home / "sh"
    py_home.mkdir()
    sh_home.mkdir()
    py = launch(py_home, "# train.py", "[python,train.py,200,0.05]")
    sh = launch(sh_home, "# train.sh", "[sh,train.sh,12]")
    py_sweep, sh_sweep = the_sweep(py_home), the_sweep(sh_home)
    py_job, sh_job = running_job(py_sweep, 0, min_lines=40), running_job(sh_sweep, 0, min_lines=3)
    progress = progress_in_status(py_home, py_sweep)  # the job turns the program's metrics lines into progress
    assert progress["step"] >= 1 and "loss" in progress["metrics"], progress
    requeue(py_job)
    requeue(sh_job)
    for proc in (py, sh):
        code, out = finish(proc)
        assert code == 0, out

    (task,) = state(py_sweep)["tasks"]
    assert task["state"] == "COMPLETED" and task["attempts"][-1]["restarts"] >= 1, task
    assert task["result"] == run_uninterrupted(py_home / "train.py", tmp_path / "reference", "200", "0")
    assert [r["step"] for r in steps_of(py_sweep)] == list(range(1, 201))  # none redone, none skipped
    saved = sorted(int(p.stem.removeprefix("step")) for p in (py_sweep / "0" / "checkpoints").glob("step*.pt"))
    assert saved and 40 <= saved[0] < 200, saved
    table = cli(py_home, "results", str(py_sweep), "--csv").stdout.splitlines()
    assert "loss" in table[0].split(","), table

    (task,) = state(sh_sweep)["tasks"]
    assert task["state"] == "COMPLETED" and task["attempts"][-1]["restarts"] >= 1, task
    rows = steps_of(sh_sweep)
    assert [r["step"] for r in rows] == list(range(1, 13)) and all(r["square"] == r["step"] ** 2 for r in rows)
    assert list((sh_sweep / "0" / "checkpoints").glob("step*.json")), "the shell script saved no checkpoint"
