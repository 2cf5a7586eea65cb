"""A job's environment on a site (`env.setup`, `env.python`, `env.vars`; issue 20): validated
before anything is submitted, written into the batch script by one function
(slurm/sbatch.env_lines) for the launcher's jobs and for `slurmagent render`, honoured by the
local backend where it can be (variables, interpreter) and refused where it cannot (setup
lines: it runs no shell). The real cluster runs them in tests/slurm/test_env_slurm.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slurmagent.config import EnvConf, LauncherConf, job_spec
from slurmagent.errors import ConfigError
from slurmagent.launch.backend import slurm_parameters
from slurmagent.slurm.sbatch import env_lines

TASK = {"task": {"target": "slurmagent.examples.synthetic:run"}}


def spec_with(env: dict[str, object]) -> object:
    return job_spec({**TASK, "env": env})


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"setup": ["module load cuda\x00"]}, "env.setup[0] contains a NUL byte"),
        ({"setup": ["module load cuda\nsource x"]}, "env.setup[0] holds more than one line"),
        ({"setup": ["ok", "  "]}, "env.setup[1]="),
        ({"vars": {"1BAD": "x"}}, "env.vars.1BAD: not a variable name"),
        ({"vars": {"SLURM_JOB_ID": "1"}}, "env.vars.SLURM_JOB_ID: names starting with SLURM_"),
        ({"vars": {"SLURMAGENT_ATTEMPT": "1"}}, "env.vars.SLURMAGENT_ATTEMPT"),
        ({"vars": {"X": "a\x00b"}}, "env.vars.X contains a NUL byte"),
        ({"python": "bin/python"}, "env.python='bin/python': give an absolute path"),
        ({"python": "/no/such/python3"}, "env.python='/no/such/python3': no executable file there"),
    ],
)
def test_bad_env_input_is_refused_naming_the_key(env: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError) as err:
        spec_with(env)
    assert named in str(err.value)


def test_env_lines_export_each_variable_as_one_word_then_run_the_setup_lines() -> None:
    env = EnvConf(setup=["module load cuda/12.4", "source $VENV/bin/activate"], vars={"VENV": "/sw/my env", "N": "1"})
    assert env_lines(env) == [
        "export VENV='/sw/my env'",
        "export N=1",
        "module load cuda/12.4",
        "source $VENV/bin/activate",  # the user's own shell, as written: the one place it is allowed
    ]
    assert env_lines(EnvConf()) == []


def test_the_launchers_jobs_get_the_lines_as_submitits_setup_and_the_interpreter() -> None:
    spec = spec_with({"setup": ["module load x"], "vars": {"A": "b"}, "python": sys.executable})
    params = slurm_parameters(spec, LauncherConf(), 1, "job")  # type: ignore[arg-type]
    assert params["setup"] == ["export A=b", "module load x"]
    assert "setup" not in slurm_parameters(spec_with({}), LauncherConf(), 1, "job")  # type: ignore[arg-type]


def test_render_writes_the_same_lines_before_the_jobs_python(tmp_path: Path) -> None:
    from slurmagent.render import render

    python = str(Path(sys.executable).with_name("python3"))
    out = render(
        ["+experiment=synthetic", '+env.vars.SITE="a b"', "env.setup=[module load cuda]", f"env.python={python}"],
        tmp_path / "out",
        check_cluster=False,
    )
    text = out.script.read_text()
    setup, srun = text.index("\nmodule load cuda\n"), text.index("\nsrun ")
    assert text.index("export SITE='a b'") < setup < srun
    assert f"srun --kill-on-bad-exit=1 {python} -m slurmagent" in text


def launch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurmagent", "+experiment=synthetic", "cluster=local", "synthetic.steps=1", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_the_local_backend_refuses_setup_lines_and_submits_nothing(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    out = launch(tmp_path, "env.setup=[module load cuda]", f"hydra.sweep.dir={sweep}", "-m")
    assert out.returncode == 2, out.stderr
    assert "env.setup=['module load cuda']: setup lines run in a Slurm job's batch script" in out.stderr
    assert "nothing was submitted" in out.stderr and not (sweep / "sweep.json").exists()


def test_the_local_backend_exports_the_variables_and_starts_the_interpreter(tmp_path: Path) -> None:
    (tmp_path / "envtask.py").write_text(
        "import os, sys\n\ndef run(cfg):\n    return {'site': os.environ.get('SITE_VAR'), 'python': sys.executable}\n"
    )
    python = str(Path(sys.executable).with_name("python3"))
    sweep = tmp_path / "sweep"
    out = launch(
        tmp_path,
        "task.target=envtask:run",
        "+env.vars.SITE_VAR=from the config",
        f"env.python={python}",
        f"hydra.sweep.dir={sweep}",
        "-m",
    )
    assert out.returncode == 0, out.stderr
    status = subprocess.run(
        [sys.executable, "-m", "slurmagent", "status", str(sweep), "--json"], capture_output=True, text=True
    )
    (task,) = json.loads(status.stdout)["tasks"]
    assert task["result"] == {"site": "from the config", "python": python}


def test_the_readmes_site_environment_renders_as_written(tmp_path: Path, project_root: Path) -> None:
    from slurmagent.render import render

    readme = (project_root / "README.md").read_text()
    section = readme[readme.index("### The jobs' environment") :]
    block = section[section.index("```yaml\n") + 8 : section.index("```\n", section.index("```yaml\n") + 8)]
    assert "/shared/envs/train/bin/python" in block
    # the interpreter must exist here: the one path a reader replaces with their own
    (tmp_path / "conf" / "env").mkdir(parents=True)
    (tmp_path / "conf" / "env" / "site.yaml").write_text(block.replace("/shared/envs/train/bin/python", sys.executable))
    conf = tmp_path / "conf"
    out = render(["+experiment=synthetic", "+env=site"], tmp_path / "out", check_cluster=False, config_dir=conf)
    lines = out.script.read_text().splitlines()
    want = ["export CUDA_VERSION=12.4", "module load cuda/$CUDA_VERSION", "source /shared/envs/train/bin/activate"]
    assert [line for line in lines if line in want] == want
    assert any(line.startswith(f"srun --kill-on-bad-exit=1 {sys.executable} -m slurmagent") for line in lines)
