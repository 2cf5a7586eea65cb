"""A new user's first hour, as issue 11 found it: help and commands, typos and bad values,
the user's own training code. Each test failed before the fix it names. (Progress, logs,
results, report and job names on a real run: tests/fake/test_first_hour_fake.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurmagent.cli import SUBCOMMANDS, main
from slurmagent.commands import slurmagent_command
from slurmagent.config import CheckpointConf, job_spec
from slurmagent.runtime import StepLoop, context_from_env
from slurmagent.safety.audit import AuditLog
from slurmagent.slurm.sbatch import sbatch_flags


def cli(args: list[str], cwd: Path, timeout: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}  # no Slurm: as on a laptop
    return subprocess.run(
        [sys.executable, "-m", "slurmagent", *args],
        cwd=cwd,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# -- help and commands ---------------------------------------------------------------------------------
def test_help_lists_every_command_with_one_line_and_points_at_hydra(capsys: pytest.CaptureFixture[str]) -> None:
    for words in (["--help"], ["-h"], ["help"]):
        assert main(words) == 0
        out = capsys.readouterr().out
        for command in SUBCOMMANDS:
            assert f"\n  {command} " in out, command
        assert "slurmagent help config" in out and "--hydra-help" in out and "-m" in out


def test_help_config_is_hydras_page_for_this_app(tmp_path: Path) -> None:
    proc = cli(["help", "config"], tmp_path)
    assert proc.returncode == 0 and "== Configuration groups ==" in proc.stdout and "experiment:" in proc.stdout


def test_a_misspelt_command_is_refused_with_the_closest_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stauts", "somewhere"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'stauts'; did you mean status?" in err and "key=value" in err


@pytest.mark.parametrize(
    ("command", "options"),
    [
        ("status", ["--rows", "--refresh", "--json"]),
        ("watch", ["--interval", "--timeout"]),
        ("logs", ["--follow", "--tail"]),
        ("results", ["--sort", "--csv"]),
        ("doctor", ["--json"]),
    ],
)
def test_each_command_help_describes_its_options(
    command: str, options: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for option in options:
        line = next(i for i, text in enumerate(lines) if text.strip().startswith(option))
        described = lines[line].strip()[len(option) :].strip() or lines[line + 1].strip()
        assert len(described.split()) >= 3, f"{command} {option}: {described!r}"


def test_audit_takes_a_sweep_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    # nothing recorded yet: show and verify agree, exit 0
    for sub in ("show", "verify"):
        assert main(["audit", sub, str(sweep)]) == 0
        assert "no automated action has been recorded there yet" in capsys.readouterr().out
    AuditLog(sweep / "audit.jsonl").append({"type": "decision", "action": "requeue", "decision": "allow"})
    assert main(["audit", "verify", str(sweep)]) == 0
    assert "1 record(s), hash chain intact" in capsys.readouterr().out
    assert main(["audit", "show", str(sweep)]) == 0
    assert "1 of 1 record(s)" in capsys.readouterr().out
    (sweep / "audit.jsonl").unlink()  # the head file stays: the log was deleted
    assert main(["audit", "verify", str(sweep)]) == 1
    assert "deleted" in capsys.readouterr().out
    assert main(["audit", "show", str(tmp_path / "nowhere" / "x")]) == 2


def test_doctor_without_slurm_says_so_in_one_line(tmp_path: Path) -> None:
    proc = cli(["doctor", "7943"], tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "Slurm does not answer here" in proc.stderr and "slurmagent doctor DIR" in proc.stderr


# -- typos and bad values --------------------------------------------------------------------------------
def test_an_added_key_one_edit_from_a_real_one_is_refused(tmp_path: Path) -> None:
    run = cli(["+experiment=digits_mlp", "+optim.lrr=0.1", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert run.returncode == 2 and "did you mean optim.lr?" in run.stderr and "++optim.lrr=0.1" in run.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing ran
    sweep = tmp_path / "sweep"
    swept = cli(["+experiment=digits_mlp", "-m", "+optim.lrr=0.1,0.2", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert (
        swept.returncode == 2 and "did you mean optim.lr?" in swept.stderr and "nothing was submitted" in swept.stderr
    )
    insist = cli(
        ["+experiment=digits_mlp", "++optim.lrr=0.1", "train.steps=2", f"hydra.run.dir={tmp_path / 'r2'}"], tmp_path
    )
    assert insist.returncode == 0, insist.stderr


def test_a_single_run_is_validated_like_a_sweep(tmp_path: Path) -> None:
    proc = cli(["+experiment=digits_mlp", "model.width=abc", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "model.width='abc' has the wrong type; expected int" in proc.stderr and "nothing was run" in proc.stderr


def test_cluster_slurm_without_m_never_runs_here(tmp_path: Path) -> None:
    proc = cli(["cluster=slurm", "resources.partition=no_such_partition", f"hydra.run.dir={tmp_path / 'r'}"], tmp_path)
    assert proc.returncode == 2 and "add -m to submit it to Slurm" in proc.stderr
    assert not (tmp_path / "r" / "checkpoints").exists()


@pytest.mark.parametrize(("given", "minutes"), [(99, 99), ("99", 99), ("1-0", 1440), ("60:00", 60), ("1:00:00", 60)])
def test_every_time_format_sbatch_accepts(given: object, minutes: int) -> None:
    spec = job_spec({"task": {"target": "a:b"}, "resources": {"time": str(given)}})
    assert sbatch_flags(spec.resources)["time"] == str(given)
    from slurmagent.syntax import time_to_minutes

    assert time_to_minutes(spec.resources.time) == minutes


def test_resources_time_in_minutes_on_the_command_line(tmp_path: Path) -> None:
    proc = cli(["resources.time=99", "--cfg", "job"], tmp_path)
    assert proc.returncode == 0 and "time: '99'" in proc.stdout


def test_a_refused_sweep_leaves_nothing_behind(tmp_path: Path) -> None:
    proc = cli(["-m", "resources.nodes=0,1"], tmp_path)  # refused: nodes must be at least 1
    assert proc.returncode == 2 and "nothing was submitted" in proc.stderr
    assert not (tmp_path / "multirun").exists()


# -- the user's own training code -------------------------------------------------------------------------
def test_a_task_reading_a_missing_key_is_told_which_and_how(tmp_path: Path) -> None:
    (tmp_path / "mytrain.py").write_text("def train(cfg):\n    return cfg.lr\n")
    proc = cli(["task.target=mytrain:train", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert proc.returncode == 2
    assert "read cfg.lr, which the config does not have: pass +lr=VALUE" in proc.stderr


def test_the_console_script_finds_code_in_the_working_directory_like_jobs_do(tmp_path: Path) -> None:
    (tmp_path / "mytrain.py").write_text("def train(cfg):\n    return {'x': 1}\n")
    script = Path(sys.executable).with_name("slurmagent")
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_CONF", "PYTHONPATH")}
    proc = subprocess.run(
        [str(script), "task.target=mytrain:train", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr


def test_a_task_module_the_jobs_cannot_import_is_refused_before_submitting(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc = cli(["task.target=mytrain:train", "-m", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert proc.returncode == 2 and "nothing was submitted" in proc.stderr
    assert "could not import module 'mytrain'" in proc.stderr and "PYTHONPATH" in proc.stderr
    assert not sweep.exists()
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "mytrain.py").write_text("def train(cfg):\n    return {'ok': 1}\n")
    ok = cli(
        ["task.target=mytrain:train", "-m", f"hydra.sweep.dir={sweep}", "hydra.launcher.poll_interval_s=0.2"],
        tmp_path,
        PYTHONPATH=str(tmp_path / "code"),
    )
    assert ok.returncode == 0, ok.stderr


def test_the_loop_uses_the_jobs_checkpoint_policy(tmp_path: Path) -> None:
    class Counter:
        n = 0

        def state_dict(self) -> dict[str, int]:
            return {"n": self.n}

        def load_state_dict(self, state: dict[str, int]) -> None:
            self.n = state["n"]

    env = {"SLURMAGENT_CHECKPOINT": json.dumps({"every_steps": 7, "keep_last": 10})}
    loop = StepLoop(context_from_env(env, output_dir=tmp_path), Counter(), 20, install_signal_handlers=False)
    assert loop.conf == CheckpointConf(every_steps=7, keep_last=10)
    for _ in loop:
        pass
    manifest = json.loads((tmp_path / "checkpoints" / "manifest.json").read_text())
    assert [e["step"] for e in manifest["checkpoints"]] == [7, 14, 20]


def test_a_failing_task_is_a_failed_job(tmp_path: Path) -> None:
    """Hydra catches a task's exception; the job must still exit non-zero (Slurm: FAILED)."""
    (tmp_path / "boom.py").write_text("def train(cfg):\n    raise RuntimeError('disk full')\n")
    sweep = tmp_path / "sweep"
    proc = cli(
        ["task.target=boom:train", "-m", f"hydra.sweep.dir={sweep}", "hydra.launcher.poll_interval_s=0.2"], tmp_path
    )
    assert proc.returncode == 1
    job = json.loads((sweep / "sweep.json").read_text())["tasks"][0]["attempts"][0]["job_id"]
    out = "".join((sweep / ".submitit" / f"{job}_0_log.{kind}").read_text() for kind in ("out", "err"))
    assert "Job completed successfully" not in out and "RuntimeError: disk full" in out


def test_the_reattach_hint_is_one_line_in_a_log_file(tmp_path: Path) -> None:
    sweep = tmp_path / ("a-long-sweep-directory-name-" * 3) / "sweep"
    proc = cli(["-m", "synthetic.steps=2", f"hydra.sweep.dir={sweep}", "hydra.launcher.poll_interval_s=0.2"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"if this launcher dies: {slurmagent_command('watch', sweep)}\n" in proc.stderr  # stderr is a pipe here


def test_a_broken_policy_refuses_the_sweep_before_anything_is_submitted(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc = cli(["+policy=strict", "policy.rules.0.decision=maybe", "-m", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert proc.returncode == 2 and "decision='maybe' is not one of allow, deny, needs_approval" in proc.stderr
    assert "nothing was submitted" in proc.stderr and not sweep.exists()
