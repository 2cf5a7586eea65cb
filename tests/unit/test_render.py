"""Golden-file tests for the rendered sbatch scripts, and hostile values that must never
reach a shell. The real-cluster half (sbatch --test-only, a real run) is in tests/slurm."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurmagent.errors import ConfigError
from slurmagent.render import render

GOLDEN = Path(__file__).resolve().parent.parent / "golden"


def normalised(text: str, run_dir: Path) -> str:
    return text.replace(str(run_dir), "<RUN_DIR>").replace(sys.executable, "<PYTHON>")


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        (
            "digits_python.sbatch",
            [
                "+experiment=digits_mlp",
                "optim.lr=1e-3",
                "resources.partition=gpu",
                "resources.gpus=1",
                "resources.gpu_type=a100",
            ],
        ),
        (
            "command_mode.sbatch",
            [
                "task.target=null",
                "task.command=[python3,train.py,--epochs,3]",
                "+resources.extra.mail_type=END",
                "recovery.signal_delay_s=120",
            ],
        ),
    ],
)
def test_golden(tmp_path: Path, name: str, overrides: list[str]) -> None:
    out = render(overrides, tmp_path / "run")
    got = normalised(out.script.read_text(), out.run_dir)
    golden = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(got)
    assert got == golden.read_text()
    subprocess.run(["bash", "-n", str(out.script)], check=True)  # parses as a shell script


def test_hostile_values_are_quoted_and_nothing_runs(weird_tmp_path: Path) -> None:
    cwd = os.getcwd()
    os.chdir(weird_tmp_path)
    try:
        out = render(
            [
                "+name='x $(touch PWNED) `touch PWNED2`; rm -rf /'",
                "task.target=null",
                "task.command=[python3,'a b.py','$(touch PWNED3)']",
            ],
            weird_tmp_path / "r u n",
        )
    finally:
        os.chdir(cwd)
    text = out.script.read_text()
    assert "#SBATCH --job-name=x___touch_PWNED___touch_PWNED2___rm_-rf__" in text
    assert "'$(touch PWNED3)'" in text and "'a b.py'" in text
    # the run directory holds a double quote: it cannot go into an #SBATCH line, so it is left out
    assert "#SBATCH --output" not in text
    # executing the script's preamble under bash (with srun/exec replaced) runs nothing hostile
    body = text.replace("exec ", "printf '%s\\n' ")
    env = dict(os.environ, SLURM_JOB_ID="1")
    subprocess.run(["bash", "-c", body], cwd=weird_tmp_path, env=env, check=True, capture_output=True)
    assert not list(weird_tmp_path.rglob("PWNED*"))
    assert not list(weird_tmp_path.parent.rglob("PWNED*"))


@pytest.mark.parametrize(
    "bad", ["resources.partition='low; rm -rf /'", "resources.constraint='a b'", "resources.account='$(id)'"]
)
def test_hostile_directive_values_are_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ConfigError, match="contains characters sbatch cannot take"):
        render([bad], tmp_path / "run")
    assert not (tmp_path / "run" / "job.sbatch").exists()


def test_requeue_can_be_turned_off_and_extra_points_at_the_key() -> None:
    """Was: no documented way to turn off --requeue; `+resources.extra.requeue=0` said "set it
    through resources.*", which has no such key."""
    import pytest

    from slurmagent.config import LauncherConf, job_spec
    from slurmagent.errors import ConfigError
    from slurmagent.launch.backend import slurm_parameters
    from slurmagent.slurm.sbatch import sbatch_flags

    on = job_spec({"task": {"target": "a:b"}})
    off = job_spec({"task": {"target": "a:b"}, "recovery": {"requeue": False}})
    launcher = LauncherConf()
    assert slurm_parameters(on, launcher, 1, "x")["additional_parameters"]["requeue"] is True
    extra = slurm_parameters(off, launcher, 1, "x")["additional_parameters"]
    assert extra["no-requeue"] is True and "requeue" not in extra
    with pytest.raises(ConfigError, match=r"resources.extra.requeue .* set it through recovery.requeue=true\|false"):
        sbatch_flags(job_spec({"task": {"target": "a:b"}, "resources": {"extra": {"requeue": "0"}}}).resources)
