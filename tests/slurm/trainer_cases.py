"""The README's trainer examples (PyTorch Lightning, the Hugging Face Trainer) on the real cluster,
as a user runs them: the module and its experiment file in a directory of their own, the README's
command, the default sweep dir and checkpoint dir, no `cluster=`. Each example is slowed by a
wrapper module (a sleep in each training step, nothing else) so that a signal lands mid-run."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fault_cases import wait_for
from test_default_paths_slurm import POLL, cli, finish, requeue, running_job, start, state, the_sweep

from tests.conftest import readme_named


@dataclass(frozen=True)
class Example:
    files: tuple[str, ...]  # the README blocks the user saves, by their names (the module first)
    run: str  # the README block holding the command
    slow: str  # a module that wraps the example's training step with a sleep; it defines `train`
    steps_per_epoch: int
    checkpoints: str  # a glob for the checkpoints the stop writes in the task's checkpoint directory

    def project(self, home: Path) -> list[str]:
        """The README's files and the slowing module in `home`; the README's command as argv after
        `python -m slurmagent`."""
        for name in self.files:
            (home / name).parent.mkdir(parents=True, exist_ok=True)
            (home / name).write_text(readme_named(name)[1])
        (home / "slow.py").write_text(self.slow)
        (command,) = readme_named(self.run)[1].strip().splitlines()
        argv = command.split()
        assert argv[:3] == ["python", "-m", "slurmagent"], argv
        return argv[3:]


def launch(home: Path, *args: str) -> subprocess.Popen[str]:
    return start(home, *args, *POLL)


def rows(task_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (task_dir / "metrics.jsonl").read_text().splitlines()]


def training_steps(task_dir: Path) -> list[int]:
    """The steps of the training lines (those with a loss: not an evaluation's, not an epoch's end)."""
    return [r["step"] for r in rows(task_dir) if "loss" in r and "epoch" not in r]


def epochs(task_dir: Path) -> list[int]:
    return [r["epoch"] for r in rows(task_dir) if "epoch" in r]


def uninterrupted(example: Example, tmp_path: Path, argv: list[str], *overrides: str) -> dict[str, Any]:
    """The same task run start to end on this machine (cluster=local), the README's module as it is."""
    ref = tmp_path / "reference"
    ref.mkdir()
    example.project(ref)
    run = cli(ref, *argv, *overrides, "cluster=local", *POLL)
    assert run.returncode == 0, run.stderr[-3000:]
    (task,) = state(the_sweep(ref))["tasks"]
    return task["result"]  # type: ignore[no-any-return]


def progress_in_status(home: Path, sweep: Path) -> dict[str, Any]:
    """Task 0's progress as `status --json` shows it, once it shows one (progress.json is written at
    most once a second)."""

    def shown() -> dict[str, Any] | None:
        out = cli(home, "status", str(sweep), "--json")
        task = json.loads(out.stdout)["tasks"][0] if out.returncode == 0 else {}
        return task.get("progress")  # type: ignore[no-any-return]

    return wait_for(shown, "task 0's progress in status", 60, 0.5)  # type: ignore[no-any-return]


def check_exact_resume_after_scontrol_requeue(
    example: Example, home: Path, tmp_path: Path, n_epochs: int, first_value: str, metrics: set[str]
) -> None:
    """The README's command, its first task slowed and requeued mid-run past its first epoch: both
    tasks complete; the requeued one ends with an uninterrupted run's result (its weights' digest,
    bit for bit, and its value), each training step once in its metrics, each epoch's line once,
    its progress in `status` while it ran and `metrics` among the columns of `results`. The
    command's first value of `first_value` (e.g. lr=) is the requeued task's."""
    argv = example.project(home)
    proc = launch(home, *argv, "task.target=slow:train", f"epochs={n_epochs}")
    sweep = the_sweep(home)
    job = running_job(sweep, 0, min_lines=example.steps_per_epoch + 16)  # past the first epoch
    progress = progress_in_status(home, sweep)
    assert progress["step"] >= 1 and "loss" in progress["metrics"], progress
    requeue(job)
    code, out = finish(proc)
    assert code == 0, out

    tasks = state(sweep)["tasks"]
    assert [t["state"] for t in tasks] == ["COMPLETED", "COMPLETED"], tasks
    assert tasks[0]["attempts"][-1]["restarts"] >= 1, tasks[0]
    assert training_steps(sweep / "0") == list(range(1, n_epochs * example.steps_per_epoch + 1))  # none redone
    assert epochs(sweep / "0") == list(range(1, n_epochs + 1))
    assert list((sweep / "0" / "checkpoints").glob(example.checkpoints)), "the stop wrote no checkpoint"
    (first,) = [a for a in argv if a.startswith(first_value)]
    value = f"{first_value}{first.split('=', 1)[1].split(',')[0]}"
    assert tasks[0]["result"] == uninterrupted(example, tmp_path, argv, value, f"epochs={n_epochs}")

    table = cli(home, "results", str(sweep), "--csv").stdout.splitlines()
    assert metrics <= set(table[0].split(",")), table


def scancel_signal(job: str, name: str) -> None:
    subprocess.run(["scancel", f"--signal={name}", job], check=True, capture_output=True, timeout=60)


__all__ = [
    "POLL",
    "Example",
    "check_exact_resume_after_scontrol_requeue",
    "cli",
    "epochs",
    "finish",
    "launch",
    "rows",
    "running_job",
    "scancel_signal",
    "state",
    "the_sweep",
    "training_steps",
]
