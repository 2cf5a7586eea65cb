"""The pre-flight probe through the fake Slurm (tests/fake/fake_slurm.py; issue 20): a sweep whose
interpreter lacks torch is refused by the probe job before any task is submitted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.fake.conftest import slurmagent
from tests.fake.fake_slurm import FakeSlurm


def test_a_sweep_whose_interpreter_lacks_torch_is_refused_before_any_task_is_submitted(
    fake: FakeSlurm, tmp_path: Path
) -> None:
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    sweep = tmp_path / "sweep"
    args = ("+experiment=synthetic", "cluster=slurm", f"env.python={venv}/bin/python", f"hydra.sweep.dir={sweep}")
    out = slurmagent(fake, tmp_path, *args, "-m")
    assert out.returncode == 2, out.stderr
    assert "the environment probe (Slurm job" in out.stderr and "torch does not import" in out.stderr, out.stderr
    assert "slurmagent does not import" in out.stderr and "nothing was submitted" in out.stderr
    jobs = fake.jobs()
    assert [j["name"] for j in jobs.values()] == ["synthetic-probe"], jobs  # the probe, and nothing else
    assert not (sweep / "sweep.json").exists()
