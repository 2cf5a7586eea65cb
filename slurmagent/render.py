"""`slurmagent render`: a standalone sbatch script a person can read, edit and submit.

The script and the resolved config land in one directory. Flags come from the same
`sbatch_flags` as the launcher's; every value in the shell body is shell-quoted, and values
in #SBATCH lines are restricted to characters sbatch reads literally.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
from omegaconf import OmegaConf

from slurmagent import __version__
from slurmagent.config import JobSpec, job_spec, spec_dict
from slurmagent.errors import ConfigError
from slurmagent.files import atomic_write
from slurmagent.primitives.env import JobEnv
from slurmagent.safety.paths import state_dir
from slurmagent.slurm.cluster import ClusterInfo, check_fits
from slurmagent.slurm.container import python_words, step_words, wrap
from slurmagent.slurm.sbatch import env_lines, safe_job_name, sbatch_flags, stop_flags
from slurmagent.slurm.seam import SlurmCLI

_DIRECTIVE_SAFE = re.compile(r"^[A-Za-z0-9_./:@%+=,\-\[\]&|!*() ]+$")


@dataclass(frozen=True)
class Rendered:
    script: Path  # the sbatch script
    config: Path  # the resolved config beside it
    run_dir: Path  # where the job runs and writes checkpoints
    checked: bool = False  # checked against the cluster (Slurm answered when it was rendered)


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(
            lambda name: resources.files("slurmagent.sbatch_templates").joinpath(name).read_text()
        ),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )
    env.filters["q"] = lambda v: shlex.quote(str(v))
    env.filters["comment"] = lambda v: " ".join(str(x) for x in v).replace("\r", "\\r").replace("\n", "\\n")
    return env


def compose(overrides: list[str], config_dir: Path | None = None) -> Any:
    """The packaged config with `overrides`, as `python -m slurmagent` composes it; `config_dir`
    is searched too, as Hydra's `--config-dir` does for a run (a user's own experiments)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    if config_dir is not None:
        overrides = [*overrides, searchpath_override(config_dir, overrides)]
    with initialize_config_module(config_module="slurmagent.conf", version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides)


def searchpath_override(config_dir: Path, overrides: list[str]) -> str:
    """`hydra.searchpath=['file:///abs/dir']`: where Hydra's --config-dir puts a directory (after
    the packaged configs, before the schemas), quoted for Hydra's override grammar."""
    from slurmagent.cli.args import check_path

    if any(o.lstrip("+~").startswith("hydra.searchpath=") for o in overrides):
        raise ConfigError("give --config-dir or a hydra.searchpath override, not both (Hydra takes only one)")
    check_path(config_dir, "dir", "--config-dir", ConfigError)
    path = f"file://{config_dir.absolute()}"
    # inside single quotes Hydra unescapes \' and the backslashes right before a quote (and at the end)
    quoted = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", path)
    quoted = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, quoted)
    return f"hydra.searchpath=['{quoted}']"


def _check_cluster(spec: JobSpec) -> bool:
    """The launcher's check before submitting, when Slurm answers here: the partition, GPU
    type, CPUs, memory and time must fit the cluster. False when it could not be checked."""
    slurm = SlurmCLI(timeout=30)
    if not slurm.available():
        return False
    try:
        check_fits(spec.resources, ClusterInfo.query(slurm))
    except ConfigError as exc:
        raise ConfigError(f"{exc}; nothing was written") from None
    return True


def render(
    overrides: list[str],
    out_dir: Path,
    mode: str | None = None,
    python: str | None = None,
    check_cluster: bool = True,
    config_dir: Path | None = None,
) -> Rendered:
    for override in overrides:
        if "\x00" in override:  # a shell script cannot carry it: bash would cut the argument there
            raise ConfigError(f"override {override.split('=', 1)[0]!r} contains a NUL byte, which no script can carry")
    cfg = compose(overrides, config_dir)
    spec: JobSpec = job_spec(spec_dict(cfg))
    mode = mode or ("command" if spec.task.command else "python")
    if mode == "command" and not spec.task.command:
        raise ConfigError("--mode command needs task.command (a command line as a list); this config has task.target")
    flags = sbatch_flags(spec.resources)  # raises on values sbatch would not read literally
    checked = _check_cluster(spec) if check_cluster else False
    run_dir = out_dir.absolute()
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt = Path(spec.checkpoint.dir) if spec.checkpoint.dir else run_dir / "checkpoints"
    output = str(run_dir / "slurm-%j.out")
    output_line = f'"{output}"' if _DIRECTIVE_SAFE.fullmatch(output) else None  # fullmatch: no final newline

    # the resolved config, with hydra.run.dir set here (YAML-quoted, never on a command line)
    body = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(body, dict)
    body["hydra"] = {"run": {"dir": str(run_dir)}, "job": {"chdir": False}, "output_subdir": ".hydra"}
    config_path = run_dir / "config.yaml"
    atomic_write(config_path, OmegaConf.to_yaml(OmegaConf.create(body)).encode())

    # env.container: the step's Python (or the command) in the image, the run dir, checkpoints and state bound
    binds = [str(run_dir), str(ckpt.absolute()), str(state_dir())]
    wrapped = wrap(spec.env, binds, str(run_dir), spec.resources.gpus)
    job_python = dataclasses.replace(wrapped, python=python or wrapped.python or sys.executable)
    name = safe_job_name(str(cfg.get("name", "") or experiment_name(overrides)))
    text = (
        _env()
        .get_template("job.sbatch.j2")
        .render(
            version=__version__,
            script_name="job.sbatch",
            overrides=overrides,
            mode=mode,
            job_name=name,
            flags=flags,
            stop_flags=stop_flags(spec.recovery, to_batch_script=(mode == "command")),
            output=output_line,
            run_dir=str(run_dir),
            env=_job_env(mode, spec, ckpt),
            setup=env_lines(spec.env),
            python_words=[*wrapped.srun_flags, *python_words(job_python, sys.executable, str(run_dir))],
            command=step_words(wrapped, spec.task.command or []),
        )
    )
    script = run_dir / "job.sbatch"
    atomic_write(script, text.encode())
    script.chmod(0o755)
    return Rendered(script, config_path, run_dir, checked)


def _job_env(mode: str, spec: JobSpec, checkpoint_dir: Path) -> list[tuple[str, str]]:
    """The SLURMAGENT_* variables the script exports (names from the one schema, values as
    shell words). A `task.command` gets the job's checkpoint and health policy from them;
    in python mode the runtime reads them from the config beside the script."""
    env = [
        (JobEnv.BACKEND, "slurm"),
        (JobEnv.OUTPUT_DIR, '"$RUN_DIR"'),
        (JobEnv.CHECKPOINT_DIR, shlex.quote(str(checkpoint_dir))),
        (JobEnv.ATTEMPT, "1"),
    ]
    if mode == "command":
        for name, conf in ((JobEnv.CHECKPOINT, spec.checkpoint), (JobEnv.HEALTH, spec.health)):
            env.append((name, shlex.quote(json.dumps(dataclasses.asdict(conf), sort_keys=True))))
    return [(str(k), v) for k, v in env]


def experiment_name(overrides: list[str]) -> str:
    for o in overrides:
        if o.lstrip("+").startswith("experiment="):
            return o.split("=", 1)[1]
    return "slurmagent"


def render_cli(output: Path | None, overrides: list[str], mode: str | None, config_dir: Path | None = None) -> int:
    out = output or Path("render") / safe_job_name(experiment_name(overrides))
    rendered = render(overrides, out, mode, config_dir=config_dir)
    print(f"wrote {rendered.script}\nwrote {rendered.config}\nsubmit with: sbatch {shlex.quote(str(rendered.script))}")
    if not rendered.checked:
        print("note: Slurm does not answer here, so the resources were not checked against a cluster")
    return 0
