"""The README's commands and its runtime example work as written."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import readme_named

README = Path(__file__).resolve().parent.parent / "README.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), flags=re.S)


def local_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}  # no Slurm: the local backend
    env.update(extra)
    return env


def test_readme_opens_with_exactly_two_setup_commands() -> None:
    first, second = blocks("bash")[:2]
    assert len(first.strip().splitlines()) == 1 and len(second.strip().splitlines()) == 1
    assert "python -m slurmagent +experiment=" in first and " -m " in first
    assert second.strip() == "bash tests/run"
    ci = (README.parent / ".ci" / "run").read_text()
    assert "exec bash tests/run" in ci


@pytest.mark.slow
def test_first_command_runs_the_sweep_locally(tmp_path: Path) -> None:
    first = blocks("bash")[0].strip()
    argv = shlex.split(first.split("&&")[-1])
    assert argv[:3] == [".venv/bin/python", "-m", "slurmagent"]
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [sys.executable, *argv[1:], f"hydra.sweep.dir={sweep}", "hydra.launcher.poll_interval_s=0.5"],
        cwd=tmp_path,
        env=local_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(
        subprocess.run(
            [sys.executable, "-m", "slurmagent", "status", str(sweep), "--json"],
            capture_output=True,
            text=True,
            env=local_env(),
            check=True,
        ).stdout
    )
    assert data["counts"] == {"COMPLETED": 6}
    assert all(t["result"]["val_acc"] > 0.8 for t in data["tasks"])


def test_your_own_code_runs_as_the_readme_shows(tmp_path: Path) -> None:
    """The README's own-code example, files and command exactly as written, in a fresh project
    directory: a 4-task sweep of the user's module and experiment, on the local backend."""
    project = tmp_path / "myproject"
    for name in ("mytrain.py", "conf/experiment/mine.yaml"):
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(readme_named(name)[1])
    (command,) = readme_named("run-mine")[1].strip().splitlines()
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "slurmagent"]
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [sys.executable, *argv[1:], f"hydra.sweep.dir={sweep}", "hydra.launcher.poll_interval_s=0.5"],
        cwd=project,
        env=local_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    state = json.loads((sweep / "sweep.json").read_text())
    assert [t["state"] for t in state["tasks"]] == ["COMPLETED"] * 4
    assert len({t["result"] for t in state["tasks"]}) == 4  # lr and seed reached the code
    # the job's checkpoint.every_steps (the experiment file's) is the loop's: 1000 steps, every 100, keep 3
    manifest = json.loads((sweep / "0" / "checkpoints" / "manifest.json").read_text())
    assert [e["step"] for e in manifest["checkpoints"]] == [800, 900, 1000]


def test_every_other_python_block_runs(tmp_path: Path) -> None:
    """The README's smaller snippets (the multi-node rendezvous) run as written, here as a
    one-process group."""
    env = local_env(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1")
    for code in blocks("python"):
        if code.startswith("# train.py"):
            continue  # a program with arguments, run by the plain-script tests (tests/fake, tests/slurm)
        proc = subprocess.run(
            [sys.executable, "-c", code + "\nimport torch.distributed as dist\ndist.destroy_process_group()\n"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, f"{code}\n{proc.stderr}"


@pytest.mark.slow
def test_the_search_command_runs_locally_on_a_small_budget(tmp_path: Path) -> None:
    """The README's search command as written, with its budget cut to fit a test (the budget
    and the fidelity replaced, nothing else) on the local backend: digits_mlp, real torch."""
    block = next(b for b in blocks("bash") if "hydra/sweeper=slurmagent_hpo" in b)
    argv = shlex.split(block.replace("\\\n", " "))
    assert argv[:3] == ["python", "-m", "slurmagent"] and "hpo.budget.epochs=600" in argv
    small = {"hpo.budget.epochs=600": "hpo.budget.epochs=10", "hpo.max_parallel=6": "hpo.max_parallel=2"}
    argv = [small.get(a, a) for a in argv]
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable,
            *argv[1:],
            "hpo.fidelity.max=3",
            f"hydra.sweep.dir={sweep}",
            "hydra.launcher.poll_interval_s=0.5",
        ],
        cwd=tmp_path,
        env=local_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "-m slurmagent +experiment=digits_mlp" in (proc.stdout + proc.stderr).split("run it again: ")[1]
    trials = json.loads((sweep / "hpo" / "trials.json").read_text())
    assert trials["finished"] and trials["spent_epochs"] <= 10 and trials["rungs"] == [1, 3]
    best = json.loads((sweep / "hpo" / "best.json").read_text())
    assert best["epochs"] == 3 and best["value"] < 0.5 and "model.width=" in best["reproduce"]


def test_the_plan_and_auto_commands_run_locally(tmp_path: Path) -> None:
    """The README's `plan` and `auto` commands as written, on the local backend (no Slurm
    here: no GPU types or partitions to choose from; time and memory from the fallback, then
    from the history the sweep leaves)."""
    block = next(b for b in blocks("bash") if "slurmagent plan" in b)
    plan_line, sweep_cmd = block.split("\n", 1)
    env = local_env(SLURMAGENT_STATE_DIR=str(tmp_path / "state"))
    plan = subprocess.run(
        [sys.executable, "-m", "slurmagent", *shlex.split(plan_line)[1:]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert plan.returncode == 0, plan.stderr
    assert "resources.time=01:00:00: no finished run of this work in the history" in plan.stdout, plan.stdout
    assert not (tmp_path / "multirun").exists()  # nothing run
    argv = shlex.split(sweep_cmd.replace("\\\n", " "))
    assert argv[:3] == ["python", "-m", "slurmagent"]
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [sys.executable, *argv[1:], f"hydra.sweep.dir={sweep}", "hydra.launcher.poll_interval_s=0.5"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = json.loads((sweep / "sweep.json").read_text())
    assert [t["state"] for t in state["tasks"]] == ["COMPLETED", "COMPLETED"]
    assert state["schedule"]["predicted"]["gpu_hours"] == pytest.approx(2.0)  # 2 tasks × the 1 h fallback
    decided = {d["key"] for p in state["schedule"]["plans"] for d in p["decisions"]}
    assert decided == {"resources.gpu_type", "resources.time", "resources.mem"}
