"""The pre-flight probe (launch/probe.py; issue 20): which sweeps it checks, the batch script
it submits (the sweep's placement and env lines, then the facts gatherer run by the job's own
interpreter), what it concludes from recorded probe logs, the facts gatherer run for real by an
interpreter. Through the fake Slurm: tests/fake/test_probe_fake.py; the real cluster:
tests/slurm/test_probe_slurm.py."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from slurmagent.config import job_spec
from slurmagent.errors import ConfigError
from slurmagent.launch.probe import FACTS_MARK, findings_of, probe_key, probe_script, wanted
from slurmagent.skills._base import Status
from slurmagent.skills.env_facts import EnvFacts

TASK = {"task": {"target": "slurmagent.examples.synthetic:run"}}


def spec(**env: object) -> object:
    return job_spec({**TASK, "resources": {"partition": "gpu", "gpus": 1}, "env": env})


def test_auto_probes_a_sweep_with_its_own_environment_only() -> None:
    assert not wanted("auto", spec()) and wanted("auto", spec(setup=["module load cuda"]))
    assert wanted("auto", spec(python=sys.executable)) and wanted("on", spec()) and not wanted("off", spec(setup=["x"]))
    with pytest.raises(ConfigError) as err:
        wanted("sometimes", spec())
    assert "probe='sometimes' is not one of auto, off, on, recheck" in str(err.value)


def test_the_probe_job_has_the_sweeps_placement_and_env_lines_then_the_gatherer(tmp_path: Path) -> None:
    s = spec(setup=["module load cuda/12.4"], vars={"A": "b c"}, python="/usr/bin/python3")
    text = probe_script(s, "/usr/bin/python3", tmp_path / "p-%j.out", "digits")  # type: ignore[arg-type]
    lines = text.splitlines()
    assert "#SBATCH --job-name=digits-probe" in lines and "#SBATCH --partition=gpu" in lines
    assert "#SBATCH --gres=gpu:1" in lines and "#SBATCH --time=00:05:00" in lines
    run = next(n for n, line in enumerate(lines) if line.startswith("exec /usr/bin/python3 -c '"))
    assert lines.index("export A='b c'") < lines.index("module load cuda/12.4") < run
    # another interpreter or another line is another environment
    assert probe_key(s, "/usr/bin/python3") != probe_key(spec(python="/usr/bin/python3"), "/usr/bin/python3")  # type: ignore[arg-type]


def facts_line(**kw: object) -> str:
    return FACTS_MARK + json.dumps(asdict(EnvFacts(**{"python": "3.11.2", "slurmagent": True, **kw})))  # type: ignore[arg-type]


def test_recorded_probe_logs_give_env_checks_findings_and_slurmagents_own() -> None:
    no_torch = findings_of("loading…\n" + facts_line(torch_error="ModuleNotFoundError: No module named 'torch'"))
    assert [f.status for f in no_torch] == [Status.CRITICAL] and "torch does not import" in no_torch[0].what
    missing = findings_of(
        "/var/spool/slurmd/job17/slurm_script: line 6: /opt/py/bin/python: No such file or directory\n"
    )
    assert (
        missing[0].status == Status.CRITICAL and "did not run" in missing[0].what and "No such file" in missing[0].what
    )
    no_agent = findings_of(facts_line(torch="2.13.0", slurmagent=False, executable="/opt/py/bin/python"))
    assert [f.what for f in no_agent if f.status == Status.CRITICAL] == [
        "slurmagent does not import in /opt/py/bin/python"
    ]
    assert not [f for f in findings_of(facts_line(torch="2.13.0")) if f.status == Status.CRITICAL]


def test_the_gatherer_runs_as_text_in_an_interpreter_and_reports_what_it_has() -> None:
    from importlib import resources

    source = resources.files("slurmagent.skills").joinpath("env_facts.py").read_text()
    out = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith(FACTS_MARK)]
    facts = EnvFacts(**json.loads(line[len(FACTS_MARK) :]))
    assert facts.torch is not None and facts.slurmagent is True and facts.executable == sys.executable
