"""Job specs: what one task asks for (resources, checkpoint, recovery, task, health), parsed and validated
(`job_spec`), and the key that tells specs apart."""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from slurmagent.config.parse import parse_conf
from slurmagent.config.site import PRIORITIES
from slurmagent.errors import ConfigError, choices
from slurmagent.syntax import mem_to_mb, slurm_time_to_seconds

ClusterChoice = Literal["auto", "slurm", "local"]  # where jobs run; auto = Slurm when its commands answer
CLUSTER_CHOICES: tuple[str, ...] = typing.get_args(ClusterChoice)


@dataclass(frozen=True)
class ResourcesConf:
    """What one task asks of the scheduler. Turned into sbatch flags by slurm/sbatch.py."""

    partition: str | None = None  # Slurm partition; None = the cluster's default partition
    nodes: int = 1  # nodes per task (more than 1 = a multi-node torch.distributed job)
    tasks_per_node: int = 1  # processes per node (usually one per GPU)
    cpus_per_task: int = 1  # CPU cores per process
    # memory per node, Slurm size syntax (500M, 4G); None = partition default; auto = from history
    mem: str | None = "1G"
    gpus: int = 0  # GPUs per node
    gpu_type: str | None = None  # GPU model (a100, t4…); None = any type; auto = placed by slurmagent (schedule/)
    time: str = "00:30:00"  # wall-clock limit, Slurm syntax ([D-]HH:MM:SS or minutes); auto = from history
    # the least time the job may be started with (--time-min): backfill may start it in a shorter
    # hole, and it requeues at that limit and resumes; None = off (time=auto sets it for checkpointed jobs)
    time_min: str | None = None
    priority: str = "normal"  # urgent | normal | background: the site's partition/QoS for it (site.priorities)
    qos: str | None = None  # quality of service
    account: str | None = None  # account to charge
    constraint: str | None = None  # node features required (Slurm --constraint expression)
    exclude: str | None = None  # nodes never to run on (Slurm hostlist)
    extra: dict[str, str] = field(default_factory=dict)  # further sbatch long options, validated


@dataclass(frozen=True)
class CheckpointConf:
    """When and where the runtime writes checkpoints."""

    dir: str | None = None  # checkpoint directory; None = <job output dir>/checkpoints
    every_steps: int = 100  # save every N steps (0 = never by step count)
    every_seconds: float = 0.0  # also save when this long has passed since the last save (0 = off)
    keep_last: int = 3  # keep the newest K valid checkpoints, prune older ones


@dataclass(frozen=True)
class RecoveryConf:
    """Bounds and signals for surviving preemption and faults."""

    signal: str = "USR2"  # user signal Slurm sends before the end (USR1 is often NCCL's)
    signal_delay_s: int = 60  # seconds before the time limit that the signal is sent
    # submissions per task: the first and each resubmission by recovery (Slurm's own requeues on
    # preemption or a failed node are not attempts; time-limit requeues: max_time_limit_requeues)
    max_attempts: int = 5
    # let Slurm requeue the job itself on preemption or a failed node (sbatch --requeue); false:
    # --no-requeue, such a job ends and recovery resubmits it as a new job (it still resumes)
    requeue: bool = True
    max_time_limit_requeues: int = 3  # requeues at the time limit per Slurm job; then resubmit with more time
    # at the time limit's warning, a run whose rest (its remaining steps at 1.5× its pace so far,
    # and its last checkpoint) ends before the limit finishes instead of requeueing (step loop)
    finish_before_limit: bool = True
    kill_wait_s: float | None = None  # seconds from SIGTERM to SIGKILL; None = Slurm's KillWait (asked on stop)


@dataclass(frozen=True)
class TaskConf:
    """The training code to run: a Python callable, or a command line."""

    target: str | None = None  # "package.module:function", called with the job's config
    command: list[str] | None = None  # argv of a program run as a child process (no shell)


@dataclass(frozen=True)
class HealthConf:
    """Health checks while the job runs: a skill run at step boundaries every `interval_s`;
    on CRITICAL the job checkpoints and moves off the node."""

    interval_s: float = 0.0  # seconds between checks; 0 = off
    skill: str = "gpu_health_check"  # registered skill to run
    inputs: dict[str, Any] = field(default_factory=dict)  # the skill's inputs (e.g. readings_file, gpus)
    stop_on_critical: bool = True  # checkpoint, requeue and exclude this node on CRITICAL


CONTAINER_RUNTIMES = ("apptainer", "podman", "pyxis")  # how slurm/container.py wraps a job's Python


@dataclass(frozen=True)
class ContainerConf:
    """The image a job's Python runs in (env.container.*), and how: slurm/container.py turns it
    into the runtime's argv (apptainer, podman) or srun's flags (pyxis), with the sweep's
    directories bound in."""

    image: str | None = None  # apptainer: a .sif file (or a docker:// URI); pyxis: a registry image or a .sqsh file;
    # podman: an image name in its storage, or a root directory (used as an overlay: --rootfs DIR:O)
    runtime: str | None = None  # apptainer | podman | pyxis
    mounts: list[str] = field(default_factory=list)  # more binds: "SRC", "SRC:DST" or "SRC:DST:ro" (data paths)
    args: list[str] = field(default_factory=list)  # more of the runtime's own flags, as argv words


@dataclass(frozen=True)
class EnvConf:
    """Where a job's Python runs on a site: the shell lines its batch script runs first
    (module loads, conda or venv activation — the one place a shell line is allowed, written
    into the batch script, never run through a Python shell), the interpreter the job starts,
    and variables exported before either. slurm/sbatch.py (`env_lines`) writes them."""

    setup: list[str] = field(default_factory=list)  # e.g. ["module load cuda/12.4", "source /sw/venv/bin/activate"]
    python: str | None = None  # the jobs' interpreter: an absolute path, or a name found on PATH after setup
    vars: dict[str, str] = field(default_factory=dict)  # exported before the setup lines (they may use them)
    container: ContainerConf = field(default_factory=ContainerConf)  # the job's image; none by default


def env_conf(raw: Mapping[str, Any] | None) -> EnvConf:
    """The `env` group, its `container` part parsed as its own group (env.container.*)."""
    data = dict(raw or {})
    container = data.pop("container", None)
    if isinstance(container, ContainerConf):
        return dataclasses.replace(parse_conf(EnvConf, data, "env"), container=container)
    if container is not None and not isinstance(container, Mapping):
        raise ConfigError(f"env.container={container!r} has the wrong type; expected keys image, runtime, mounts, args")
    return dataclasses.replace(
        parse_conf(EnvConf, data, "env"), container=parse_conf(ContainerConf, container, "env.container")
    )


SIGNAL_CHOICES = ("USR1", "USR2", "TERM", "INT", "HUP")
# names a job's environment gets from Slurm or slurmagent itself: env.vars may not set them
RESERVED_VAR_PREFIXES = ("SLURM_", "SLURMAGENT_", "SUBMITIT_")
_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def validate_resources(res: ResourcesConf) -> None:
    """Checks that need no cluster: ranges and syntax. Cluster fit is slurm/cluster.py."""
    for key in ("nodes", "tasks_per_node", "cpus_per_task"):
        if getattr(res, key) < 1:
            raise ConfigError(f"resources.{key}={getattr(res, key)} must be at least 1")
    if res.gpus < 0:
        raise ConfigError(f"resources.gpus={res.gpus} must be 0 or more")
    if res.gpu_type is not None and res.gpus == 0:
        raise ConfigError(f"resources.gpu_type={res.gpu_type!r} is set but resources.gpus=0; ask for at least 1 GPU")
    if res.mem is not None and res.mem != AUTO:
        mem_to_mb(res.mem)
    if res.time != AUTO and slurm_time_to_seconds(res.time) <= 0:
        raise ConfigError(f"resources.time={res.time!r} must be longer than zero (or auto)")
    if res.time_min is not None:
        lo = slurm_time_to_seconds(res.time_min)
        if lo <= 0 or (res.time != AUTO and lo > slurm_time_to_seconds(res.time)):
            raise ConfigError(f"resources.time_min={res.time_min!r} must be above zero and at most resources.time")
    if res.priority not in PRIORITIES:
        raise ConfigError(f"resources.priority={res.priority!r} is not one of {choices(PRIORITIES)}")


AUTO = "auto"  # resources.gpu_type / time / mem: decided by slurmagent (slurmagent/schedule/)


def auto_keys(res: ResourcesConf) -> list[str]:
    """The resources a spec leaves to slurmagent."""
    return [k for k in ("gpu_type", "time", "mem") if getattr(res, k) == AUTO]


def validate_task(task: TaskConf) -> None:
    if (task.target is None) == (task.command is None):
        raise ConfigError(
            "set exactly one of task.target (a Python callable, 'module:function') "
            "or task.command (a command line as a list)"
        )
    if task.target is not None and not re.fullmatch(r"[\w.]+:[\w.]+", task.target):
        raise ConfigError(f"task.target={task.target!r} must look like 'package.module:function'")
    if task.command is not None and not task.command:
        raise ConfigError("task.command is empty; give the program and its arguments as a list")


def validate_env(env: EnvConf) -> None:
    """Each setup line one line of shell, each variable a name the shell can export, the
    interpreter a path that exists here or a bare name (found on PATH after the setup lines)."""
    for n, line in enumerate(env.setup):
        if not isinstance(line, str) or not line.strip():
            raise ConfigError(f"env.setup[{n}]={line!r}: each setup line is a non-empty line of shell")
        if "\x00" in line:
            raise ConfigError(f"env.setup[{n}] contains a NUL byte, which no batch script can carry")
        if "\n" in line or "\r" in line:
            raise ConfigError(f"env.setup[{n}] holds more than one line: give each line as its own item of the list")
    for name, value in env.vars.items():
        if not _VAR_NAME.fullmatch(str(name)):
            raise ConfigError(f"env.vars.{name}: not a variable name the shell can export (letters, digits, _)")
        if str(name).startswith(RESERVED_VAR_PREFIXES):
            raise ConfigError(
                f"env.vars.{name}: names starting with {', '.join(RESERVED_VAR_PREFIXES)} are set by Slurm and "
                "slurmagent for each job; choose another name"
            )
        if "\x00" in str(value):
            raise ConfigError(f"env.vars.{name} contains a NUL byte, which no batch script can carry")
    validate_container(env.container)
    py = env.python
    if py is not None:
        if not py.strip() or any(c in py for c in "\x00\n\r"):
            raise ConfigError(f"env.python={py!r}: an interpreter's path, or its name on PATH")
        if "/" in py and not os.path.isabs(py):
            raise ConfigError(f"env.python={py!r}: give an absolute path (the jobs start elsewhere), or a bare name")
        if os.path.isabs(py) and not env.container.image and not os.access(py, os.X_OK):
            raise ConfigError(
                f"env.python={py!r}: no executable file there on this machine; the jobs' interpreter must be where "
                "they run (a shared file system), or name it bare (e.g. python) to be found on PATH after env.setup"
            )


def _one_line(value: str, key: str) -> None:
    if any(c in value for c in "\x00\n\r"):
        raise ConfigError(f"{key}={value!r} holds a NUL byte or a line break, which no batch script can carry")


def container_image_path(image: str, runtime: str) -> str | None:
    """The local file or directory an image names, or None for a name the runtime looks up
    (a registry image, a URI, podman's storage)."""
    if runtime == "apptainer":
        return None if "://" in image else image
    return image if image.startswith(("/", "./", "../", "~")) or image.endswith((".sqsh", ".sif")) else None


def validate_container(c: ContainerConf) -> None:
    """The runtime one of CONTAINER_RUNTIMES, the image there when it is a file, each mount a
    path that exists here; each refusal names the key."""
    if c.image is None and c.runtime is None:
        if c.mounts or c.args:
            raise ConfigError("env.container.mounts and env.container.args need env.container.image (no image is set)")
        return
    if c.runtime not in CONTAINER_RUNTIMES:
        raise ConfigError(f"env.container.runtime={c.runtime!r} is not one of {choices(CONTAINER_RUNTIMES)}")
    if not c.image or not c.image.strip():
        raise ConfigError(f"env.container.runtime={c.runtime} needs env.container.image (the image to run)")
    _one_line(c.image, "env.container.image")
    path = container_image_path(c.image, c.runtime)
    if path is not None:
        full = os.path.expanduser(path)
        if not os.path.isabs(full):
            raise ConfigError(
                f"env.container.image={c.image!r}: give the image file's absolute path (jobs start elsewhere)"
            )
        if not os.path.exists(full):
            raise ConfigError(f"env.container.image={c.image!r}: no such file on this machine")
        if c.runtime == "podman" and not os.path.isdir(full):
            raise ConfigError(
                f"env.container.image={c.image!r}: podman runs an image by name or a root directory; load an archive "
                f"into podman's storage first (podman load -i {c.image}) and name the image"
            )
    for n, m in enumerate(c.mounts):
        _one_line(m, f"env.container.mounts[{n}]")
        parts = m.split(":")
        if len(parts) > 3 or not all(parts) or "," in m:
            raise ConfigError(f"env.container.mounts[{n}]={m!r}: write SRC, SRC:DST or SRC:DST:ro (no commas)")
        if len(parts) == 3 and parts[2] not in ("ro", "rw"):
            raise ConfigError(f"env.container.mounts[{n}]={m!r}: the third part is ro or rw")
        if not (os.path.isabs(parts[0]) and (len(parts) < 2 or os.path.isabs(parts[1]))):
            raise ConfigError(f"env.container.mounts[{n}]={m!r}: both paths must be absolute")
        if not os.path.exists(parts[0]):
            raise ConfigError(f"env.container.mounts[{n}]={m!r}: {parts[0]} does not exist on this machine")
    for n, a in enumerate(c.args):
        _one_line(a, f"env.container.args[{n}]")


def validate_checkpoint(ck: CheckpointConf) -> None:
    if ck.every_steps < 0 or ck.every_seconds < 0:
        raise ConfigError("checkpoint.every_steps and checkpoint.every_seconds must be 0 (off) or positive")
    if ck.keep_last < 1:
        raise ConfigError(f"checkpoint.keep_last={ck.keep_last} must be at least 1")


def validate_recovery(rc: RecoveryConf) -> None:
    if rc.signal not in SIGNAL_CHOICES:
        raise ConfigError(f"recovery.signal={rc.signal!r} is not one of {choices(SIGNAL_CHOICES)}")
    if not 1 <= rc.signal_delay_s <= 65535:  # sbatch --signal's range
        raise ConfigError(f"recovery.signal_delay_s={rc.signal_delay_s} must be between 1 and 65535 (sbatch --signal)")
    if rc.max_attempts < 1:
        raise ConfigError(f"recovery.max_attempts={rc.max_attempts} must be at least 1")
    if rc.max_time_limit_requeues < 0:
        raise ConfigError(f"recovery.max_time_limit_requeues={rc.max_time_limit_requeues} must be 0 or more")
    if rc.kill_wait_s is not None and rc.kill_wait_s <= 0:
        raise ConfigError(f"recovery.kill_wait_s={rc.kill_wait_s} must be positive (or null: ask Slurm)")


def validate_health(hc: HealthConf) -> None:
    if hc.interval_s < 0:
        raise ConfigError(f"health.interval_s={hc.interval_s} must be 0 (off) or positive")


@dataclass(frozen=True)
class JobSpec:
    """One task of a sweep, parsed and validated: what the launcher submits."""

    cluster: ClusterChoice
    resources: ResourcesConf
    checkpoint: CheckpointConf
    recovery: RecoveryConf
    task: TaskConf
    health: HealthConf = field(default_factory=HealthConf)
    env: EnvConf = field(default_factory=EnvConf)


# The config groups a job spec is made of, in one place: `spec_dict` takes them from a
# composed config, the sweeper knows overrides under them can change a spec.
SPEC_GROUPS = ("cluster", "resources", "checkpoint", "recovery", "task", "health", "env")


def spec_dict(cfg: Any, groups: tuple[str, ...] = SPEC_GROUPS) -> dict[str, Any]:
    """The job-spec groups (or other `groups`) of a composed Hydra config, as plain data."""
    from omegaconf import OmegaConf

    return {
        k: OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg.get(k)) else cfg.get(k)
        for k in groups
        if k in cfg
    }


def checkpoint_conf(cfg: Any) -> CheckpointConf:
    """The `checkpoint` group of the composed config a training function receives, checked."""
    return parse_conf(CheckpointConf, spec_dict(cfg, ("checkpoint",)).get("checkpoint"), "checkpoint")


def job_spec(cfg: Mapping[str, Any], require_task: bool = True) -> JobSpec:
    """Parse the slurmagent parts of a composed job config (a plain dict) into a JobSpec.

    `require_task=False` for users' own Hydra apps, whose task is their Hydra main."""
    cluster = cfg.get("cluster", "auto")
    if cluster not in CLUSTER_CHOICES:
        raise ConfigError(f"cluster={cluster!r} is not one of {choices(CLUSTER_CHOICES)}")
    spec = JobSpec(
        cluster=cluster,
        resources=parse_conf(ResourcesConf, cfg.get("resources"), "resources"),
        checkpoint=parse_conf(CheckpointConf, cfg.get("checkpoint"), "checkpoint"),
        recovery=parse_conf(RecoveryConf, cfg.get("recovery"), "recovery"),
        task=parse_conf(TaskConf, cfg.get("task"), "task"),
        health=parse_conf(HealthConf, cfg.get("health"), "health"),
        env=env_conf(cfg.get("env")),
    )
    validate_resources(spec.resources)
    if require_task or spec.task != TaskConf():
        validate_task(spec.task)
    validate_checkpoint(spec.checkpoint)
    validate_recovery(spec.recovery)
    validate_health(spec.health)
    validate_env(spec.env)
    return spec


def spec_key(spec: JobSpec | ResourcesConf) -> str:
    """A stable, hashable identity for grouping tasks that can share one job array."""
    import json

    return json.dumps(dataclasses.asdict(spec), sort_keys=True)


def resolve_target(target: str) -> Callable[..., Any]:
    """`package.module:function` (task.target) → the callable; ConfigError naming what is missing."""
    import importlib

    module_name, _, attr = target.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"task.target={target!r}: cannot import module {module_name!r} ({exc}); the job imports it from its "
            f"working directory ({os.getcwd()}) and PYTHONPATH: run from the directory that holds it, add that "
            "directory to PYTHONPATH, or pip install your project"
        ) from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"task.target={target!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"task.target={target!r} is not callable")
    return obj  # type: ignore[no-any-return]
