"""The README's plain-script example (`train.py`, no slurmagent import) through the fake Slurm,
as a user runs it: from a directory of their own, the README's command, the default sweep
dir and checkpoint dir, preempted mid-run. It must end with the parameters an uninterrupted
run of the same program ends with, bit for bit, having done each step once, and its metrics
must be the task's progress in `status` and its columns in `results`.
tests/slurm/test_plain_script_slurm.py proves the same on the real cluster."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import readme_example, run_uninterrupted, venv_on_path
from tests.fake.conftest import finish, slurmagent, sweep_state
from tests.fake.fake_slurm import FakeSlurm
from tests.fake.test_default_paths_fake import default_sweep, job_of


def test_the_readme_python_script_resumes_exactly_after_a_preemption(fake: FakeSlurm, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    program = home / "train.py"
    program.write_text(readme_example("# train.py"))
    steps = 120  # 0.05 s each: time for `status` to be asked (a process start each) before the preemption
    launcher = subprocess.Popen(
        [sys.executable, "-m", "slurmagent", "-m", "task.target=null", f"task.command=[python,train.py,{steps},0.05]"],
        cwd=home,
        env=venv_on_path(fake.env()),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    sweep = default_sweep(home)
    job = job_of(sweep)
    fake.wait(job, ("RUNNING",))
    metrics = sweep / "0" / "metrics.jsonl"
    deadline = time.monotonic() + 60
    while (not metrics.is_file() or len(metrics.read_text().splitlines()) < 10) and time.monotonic() < deadline:
        time.sleep(0.05)
    # progress is written from the metrics at most once a second: ask `status` until it shows it
    while time.monotonic() < deadline:
        progress = json.loads(slurmagent(fake, home, "status", str(sweep), "--json").stdout)
        if progress["tasks"][0].get("progress") is not None:
            break
        time.sleep(0.2)
    fake.preempt(job)
    finish(launcher)

    (task,) = sweep_state(sweep)["tasks"]
    assert task["state"] == "COMPLETED" and task["attempts"][0]["restarts"] == 1, task
    reference = run_uninterrupted(program, tmp_path / "reference", str(steps), "0")
    assert task["result"] == reference  # weights and bias, bit for bit (JSON floats round-trip exactly)
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))  # each step once: saved at the stop, resumed there
    (saved,) = (sweep / "0" / "checkpoints").glob("step*.pt")  # the default checkpoint dir, the program's own file
    assert 10 <= int(saved.stem.removeprefix("step")) < steps

    # while it ran, `status` showed the program's own step and loss (read from its metrics at most once a second)
    (shown,) = progress["tasks"]
    assert 1 <= shown["progress"]["step"] <= steps and "loss" in shown["progress"]["metrics"], shown
    table = slurmagent(fake, home, "results", str(sweep), "--csv").stdout.splitlines()
    assert "loss" in table[0].split(","), table
