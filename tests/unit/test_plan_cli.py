"""`slurmagent plan` takes what the launcher takes (issue 25): the README's own-code sweep as
written, `-m` with sweep values (each distinct job planned once, as the launcher does), the
launcher's flags anywhere among the overrides, `--config-name`; and it refuses a sweep value
without `-m` as the launcher's run mode would. No Slurm here: the local backend's plan."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from slurmagent.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"


def named(name: str) -> str:
    found = re.findall(rf"```\w+ {re.escape(name)}\n(.*?)```", README.read_text(), flags=re.S)
    assert len(found) == 1, f"README needs exactly one block named {name}"
    return str(found[0])


@pytest.fixture()
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The README's own-code project (mytrain.py, conf/experiment/mine.yaml), as its user has it."""
    root = tmp_path / "myproject"
    for name in ("mytrain.py", "conf/experiment/mine.yaml"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(named(name))
    monkeypatch.delenv("SLURM_CONF", raising=False)  # no Slurm: the local backend
    monkeypatch.setenv("SLURMAGENT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(root)
    return root


def test_the_readmes_own_code_sweep_runs_through_plan_as_written(project: Path) -> None:
    (command,) = named("run-mine").strip().splitlines()
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "slurmagent"] and "-m" in argv[3:] and "--config-dir" in argv
    env = {**os.environ}
    proc = subprocess.run(
        [sys.executable, "-m", "slurmagent", "plan", *argv[3:]],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "4 task(s), 1 distinct job(s)" in proc.stdout, proc.stdout  # lr and seed do not change the job
    assert "sbatch --nodes=1" in proc.stdout and "(fingerprint " in proc.stdout
    assert not (project / "multirun").exists()  # nothing run
    as_json = subprocess.run(
        [sys.executable, "-m", "slurmagent", "plan", *argv[3:], "--json"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert as_json.returncode == 0, as_json.stderr
    out = json.loads(as_json.stdout)
    assert out["tasks"] == 4 and [j["tasks"] for j in out["jobs"]] == [[0, 1, 2, 3]]
    assert out["jobs"][0]["overrides"] == ["+experiment=mine", "lr=0.01", "seed=0"]
    assert "predicted run time" in out["basis"]


def test_a_sweep_is_planned_per_distinct_job_with_the_flags_anywhere(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["plan", "+experiment=mine", "-m", "resources.mem=1G,2G", "seed=0,1", "-cd", "conf", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tasks"] == 4 and len(out["jobs"]) == 2  # the memory changes the spec; the seed does not
    assert sorted(j["resources"]["mem"] for j in out["jobs"]) == ["1G", "2G"]
    assert sorted(t for j in out["jobs"] for t in j["tasks"]) == [0, 1, 2, 3]
    assert main(["plan", "--config-dir=conf", "+experiment=mine", "--detach", "-m", "lr=range(1,4)"]) == 0
    assert "3 task(s), 1 distinct job(s)" in capsys.readouterr().out


def test_a_primary_config_of_the_users_own_is_taken_with_config_name(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "conf" / "mine_app.yaml").write_text(
        "defaults:\n  - config\n  - _self_\nresources:\n  mem: 3G\ntask:\n  target: mytrain:train\nlr: 0.1\nseed: 0\n"
    )
    assert main(["plan", "-cd", "conf", "-cn", "mine_app", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["resources"]["mem"] == "3G" and out["backend"] == "local"


def test_a_sweep_value_without_m_is_refused_as_the_launcher_would(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "-cd", "conf", "+experiment=mine", "lr=0.01,0.05"]) == 2
    err = capsys.readouterr().err
    assert "lr=0.01,0.05 is a sweep: add -m, as for the launcher" in err, err
    assert main(["plan", "+experiment=mine", "-cd", "conf", "--cfg", "job"]) == 2
    assert "--cfg makes the launcher show Hydra's information instead of launching" in capsys.readouterr().err
