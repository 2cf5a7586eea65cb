"""Every command slurmagent prints for a person to paste runs as printed: pasted into a shell
(bash -c), from another directory, with the virtualenv not activated (the README's first
command runs `.venv/bin/python -m slurmagent` without activating it), for a user's own
experiment in their own `--config-dir`. On the local backend: real processes, real files."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from slurmagent.commands import config_flags, slurmagent_argv

EXPERIMENT = """# @package _global_
task:
  target: slurmagent.examples.synthetic:run
synthetic:
  steps_per_epoch: 2
  step_time_s: 0
  epochs: 3
checkpoint:
  every_steps: 1
"""


def user_env() -> dict[str, str]:
    """A shell without the virtualenv on PATH and without Slurm (the local backend)."""
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_CONF", "VIRTUAL_ENV")}
    env["PATH"] = path or os.defpath
    return env


@pytest.fixture()
def home(tmp_path: Path) -> Path:
    home = tmp_path / "my project"  # a space: the printed paths must be quoted
    (home / "conf" / "experiment").mkdir(parents=True)
    (home / "conf" / "experiment" / "mine.yaml").write_text(EXPERIMENT)
    (tmp_path / "elsewhere").mkdir()
    return home


def launch(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurmagent", "--config-dir", "conf", "+experiment=mine", *args],
        cwd=home,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )


def paste(line: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", line], cwd=cwd, env=user_env(), capture_output=True, text=True, timeout=timeout
    )


def printed(out: str, label: str) -> list[str]:
    """The commands after `label:` in the launcher's lines (`[slurmagent] label: CMD[; other: CMD]`)."""
    found = []
    for line in out.splitlines():
        m = re.match(rf"\[slurmagent\]\s+{re.escape(label)}:? (.*)$", line)
        if m:
            found += [part.split(": ", 1)[-1] for part in m.group(1).split("; ")]
    return found


def test_a_searchs_commands_run_as_printed(home: Path) -> None:
    """Was: the "run it again" line, hpo/best.json and the report dropped `--config-dir conf`
    (pasted: "Could not find 'experiment/mine'", exit 2)."""
    out = launch(home, "hydra/sweeper=slurmagent_hpo", "-m", "synthetic.x=interval(0,1)",
                 "hpo.fidelity.key=synthetic.epochs", "hpo.fidelity.max=3", "hpo.budget.trials=3",
                 "hydra.launcher.poll_interval_s=0.2")  # fmt: skip
    assert out.returncode == 0, out.stderr
    text = out.stdout + out.stderr
    (again,) = printed(text, "run it again")
    (sweep,) = [p for p in home.glob("multirun/*/*") if (p / "hpo").is_dir()]
    best = json.loads((sweep / "hpo" / "best.json").read_text())
    assert best["reproduce"] == again and "--config-dir" in again and str(home / "conf") in again, again
    listed = printed(text, "all trials")
    assert len(listed) == 2, text  # the results and the report
    elsewhere = home.parent / "elsewhere"
    for line in listed:
        ran = paste(line, elsewhere)
        assert ran.returncode == 0, f"{line}\n{ran.stderr}"
    rerun = paste(again, elsewhere)
    assert rerun.returncode == 0, f"{again}\n{rerun.stderr}"
    assert "1 COMPLETED" in rerun.stderr, rerun.stderr
    # the report shows the same line (report.py prints best.json's)
    page = (sweep / "report" / "index.html").read_text()
    import html

    assert html.escape(again) in page


def test_a_detached_sweeps_follow_commands_run_as_printed(home: Path) -> None:
    out = launch(home, "-m", "synthetic.x=0.1,0.2", "--detach")
    assert out.returncode == 0, out.stderr
    text = out.stdout + out.stderr
    follow = [line.strip() for line in text.splitlines()[text.splitlines().index(
        next(ln for ln in text.splitlines() if ln.endswith("follow it with:"))) + 1 :]]  # fmt: skip
    commands = [re.sub(r"^\[slurmagent\]\s+", "", line) for line in follow if line]
    assert [c.split()[len(slurmagent_argv())] for c in commands] == ["status", "watch", "logs", "cancel"], commands
    elsewhere = home.parent / "elsewhere"
    watch = paste(commands[1], elsewhere)  # follows (or takes over) to the end
    assert watch.returncode == 0, watch.stderr
    status = paste(commands[0], elsewhere)
    assert status.returncode == 0 and "2 COMPLETED" in status.stdout, status.stdout + status.stderr
    caption = next(ln for ln in status.stdout.splitlines() if ln.startswith("logs: "))
    for line in (commands[2].replace(" TASK", " 0"), caption.removeprefix("logs: ").replace(" TASK", " 1")):
        logs = paste(line, elsewhere)
        assert logs.returncode == 0 and "==>" in logs.stdout, f"{line}\n{logs.stderr}"
    cancel = paste(commands[3], elsewhere)
    assert cancel.returncode == 0, cancel.stderr


def test_config_flags_are_kept_long_and_absolute(tmp_path: Path) -> None:
    argv = ["-cd", "conf", "--config-name=train", "+experiment=x", "--config-path", "cfgs", "-m"]
    assert config_flags(argv, tmp_path) == [
        "--config-dir", str(tmp_path / "conf"), "--config-name", "train", "--config-path", "cfgs",
    ]  # fmt: skip


def test_the_kill_switchs_printed_command_lifts_it(home: Path) -> None:
    sweep = home / "a sweep"
    sweep.mkdir()
    env = {**user_env(), "SLURMAGENT_STATE_DIR": str(home / "state")}
    paused = subprocess.run([sys.executable, "-m", "slurmagent", "pause", "--sweep", str(sweep)], cwd=home, env=env,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert paused.returncode == 0, paused.stderr
    lift = re.search(r"`([^`]+)` lifts it", paused.stdout)
    assert lift is not None, paused.stdout
    ran = subprocess.run(["bash", "-c", lift.group(1)], cwd=home.parent / "elsewhere", env=env, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert ran.returncode == 0 and "resumed sweep" in ran.stdout, ran.stdout + ran.stderr
