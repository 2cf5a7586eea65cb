"""Typed job specs: the *Conf dataclasses and their strict parsing from Hydra configs.

The YAML in conf/ stays plain (so users can compose freely); at the launcher boundary each
group is parsed into its dataclass by `parse_conf`, which refuses unknown keys (listing the
valid ones), wrong types and out-of-range values with a message naming the key.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal, TypeVar, cast

from slurmagent.errors import ConfigError, choices
from slurmagent.syntax import mem_to_mb, slurm_time_to_seconds

ClusterChoice = Literal["auto", "slurm", "local"]  # where jobs run; auto = Slurm when its commands answer
CLUSTER_CHOICES: tuple[str, ...] = typing.get_args(ClusterChoice)
Backend = Literal["slurm", "local", "none"]  # where a job runs now ("none": plain python, no launcher)


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


@dataclass  # not frozen: OmegaConf makes a frozen dataclass's nodes read-only, and site.gpus entries get merged
class GpuConf:
    """One GPU type of the site's catalogue (conf/site/default.yaml)."""

    memory_gib: float  # memory per GPU, GiB
    throughput: float = 1.0  # training speed relative to an A100 (80 GB) = 1.0: run time scales as 1/throughput
    price_per_hour: float = 0.0  # what one GPU-hour costs (the site's unit of money); 0 = not priced


@dataclass  # not frozen: merged by OmegaConf like GpuConf
class PriorityConf:
    """Where jobs of one priority run (site.priorities.NAME); None = Slurm's default."""

    partition: str | None = None
    qos: str | None = None


PRIORITIES = ("urgent", "normal", "background")


@dataclass(frozen=True)
class SchedulingConf:
    """How slurmagent sizes and places jobs (site.scheduling.*; slurmagent/schedule/)."""

    history: str = ""  # the job history database: "" = history.sqlite in the user's state dir; a path (shared)
    inflation: float = 1.2  # predicted run time and memory × this (an under-estimate costs a requeue)
    recent: int = 2  # predict from the mean of this many most recent runs of the same work
    fallback_time: str = "01:00:00"  # time=auto without history (capped by the partition's limit)
    time_min_fraction: float = 0.25  # time=auto on a checkpointed job: --time-min = this × the prediction
    # keys of a task's overrides that do not change its run time or memory (fnmatch patterns): the
    # history's fingerprint of a task's work leaves them out
    ignore_in_fingerprint: list[str] = field(
        default_factory=lambda: ["*lr", "*.lr_*", "optim.*", "seed", "*.seed", "hpo.*", "adapt.*", "hydra.*"]
    )
    max_jobs_per_partition: dict[str, int] = field(default_factory=dict)  # the user's active+pending jobs, at most


@dataclass(frozen=True)
class SiteConf:
    """The site's facts Slurm does not know (site.*; conf/site/default.yaml): the GPU
    catalogue, what the priorities map to, how jobs are sized and placed."""

    gpus: dict[str, GpuConf] = field(default_factory=dict)  # GRES type name → what the GPU is
    priorities: dict[str, PriorityConf] = field(default_factory=dict)  # urgent | normal | background → where
    scheduling: SchedulingConf = field(default_factory=SchedulingConf)

    def memory_gib(self, gpu_type: str | None) -> float | None:
        """Memory per GPU of a type; None for an unknown (or no) type."""
        gpu = self.gpu(gpu_type)
        return gpu.memory_gib if gpu is not None else None

    def gpu(self, gpu_type: str | None) -> GpuConf | None:
        return self.gpus.get(str(gpu_type).lower()) if gpu_type else None


def site_conf(raw: Mapping[str, Any] | None) -> SiteConf:
    """The `site` group of a composed config; the packaged default when there is none (a
    user's own Hydra app, a sweep recorded before it existed)."""
    if raw is None:
        return default_site()
    raw = dict(raw)
    gpus = raw.pop("gpus", None) or {}
    priorities = raw.pop("priorities", None) or {}
    for key, value in (("gpus", gpus), ("priorities", priorities)):
        if not isinstance(value, Mapping):
            raise ConfigError(f"site.{key} must be a mapping, not {value!r}")
    unknown = [k for k in priorities if k not in PRIORITIES]
    if unknown:
        raise ConfigError(f"site.priorities.{unknown[0]}: not a priority; valid: {choices(PRIORITIES)}")
    scheduling = parse_conf(SchedulingConf, raw.pop("scheduling", None), "site.scheduling")
    if unknown := list(raw):
        raise unknown_key("site", unknown[0], [f.name for f in dataclasses.fields(SiteConf)])
    if scheduling.inflation < 1 or scheduling.recent < 1 or not 0 < scheduling.time_min_fraction <= 1:
        raise ConfigError(
            "site.scheduling: need inflation ≥ 1, recent ≥ 1 and 0 < time_min_fraction ≤ 1 "
            f"(inflation={scheduling.inflation}, recent={scheduling.recent}, "
            f"time_min_fraction={scheduling.time_min_fraction})"
        )
    slurm_time_to_seconds(scheduling.fallback_time)
    for part, cap in scheduling.max_jobs_per_partition.items():
        if cap < 1:
            raise ConfigError(
                f"site.scheduling.max_jobs_per_partition.{part}={cap} must be at least 1 (a job at a time)"
            )
    catalogue = {str(k): parse_conf(GpuConf, v, f"site.gpus.{k}") for k, v in gpus.items()}
    for name, gpu in catalogue.items():
        if gpu.memory_gib <= 0 or gpu.throughput <= 0 or gpu.price_per_hour < 0:
            raise ConfigError(
                f"site.gpus.{name}: need memory_gib > 0, throughput > 0, price_per_hour ≥ 0 "
                f"({gpu.memory_gib}, {gpu.throughput}, {gpu.price_per_hour})"
            )
    return SiteConf(
        catalogue,
        {str(k): parse_conf(PriorityConf, v, f"site.priorities.{k}") for k, v in priorities.items()},
        scheduling,
    )


@dataclass(frozen=True)
class BudgetConf:
    """The `budget` group: what one sweep may spend (0 = no limit). Checked on the prediction
    before anything is submitted, and on what sacct measured before each new submission."""

    gpu_hours: float = 0.0  # GPU-hours of the sweep's jobs (allocated GPUs × elapsed)
    cost: float = 0.0  # in the catalogue's prices (site.gpus.TYPE.price_per_hour)
    user_month_gpu_hours: float = 0.0  # the user's GPU-hours this calendar month (all jobs, from sacct)


def budget_conf(raw: Mapping[str, Any] | None) -> BudgetConf:
    conf = parse_conf(BudgetConf, raw, "budget")
    for key in ("gpu_hours", "cost", "user_month_gpu_hours"):
        if getattr(conf, key) < 0:
            raise ConfigError(f"budget.{key}={getattr(conf, key)} must be 0 (no limit) or positive")
    return conf


@cache
def default_site() -> SiteConf:
    from importlib import resources

    from omegaconf import OmegaConf

    text = resources.files("slurmagent.conf").joinpath("site", "default.yaml").read_text()
    raw = OmegaConf.to_container(OmegaConf.create(text), resolve=True)
    assert isinstance(raw, dict)
    return site_conf(cast(dict[str, Any], raw))


@dataclass(frozen=True)
class LauncherConf:
    """Options of the slurmagent Hydra launcher (hydra.launcher.*)."""

    _target_: str = "hydra_plugins.slurmagent_launcher.launcher.SlurmAgentLauncher"  # the class Hydra builds
    array_parallelism: int = 0  # at most N array tasks running at once (%N); 0 = no throttle
    max_array_size: int = 0  # split arrays above this many tasks; 0 = read MaxArraySize from Slurm
    poll_interval_s: float = 2.0  # seconds between status queries while supervising (grows when idle)
    max_poll_interval_s: float = 30.0  # back-off ceiling for the poll interval
    # when Slurm refuses part of a sweep for good (exit 2 either way): leave what it accepted
    # running and supervised to the end, or cancel it at once
    on_refusal: str = "leave"
    # submit, start the sweep's supervisor away from this shell, print how to follow it, return
    # (also: the --detach flag); where it runs: auto | job | process (supervise/detach.py)
    detach: bool = False
    supervisor: str = "auto"
    supervisor_partition: str = ""  # the supervisor job's partition; "" = the cluster's default
    supervisor_mem: str = "1G"
    supervisor_time: str = "02:00:00"  # at its limit it requeues itself and goes on
    # Ctrl-C while attached: leave the sweep to a detached supervisor, or cancel it (asked on a terminal)
    on_interrupt: str = "leave"


@dataclass(frozen=True)
class SweeperConf:
    """Options of the slurmagent Hydra sweeper (hydra.sweeper.*): Hydra's basic sweeper that
    composes one representative job per distinct job shape before launching."""

    _target_: str = "hydra_plugins.slurmagent_launcher.sweeper.SlurmAgentSweeper"  # the class Hydra builds
    max_batch_size: int | None = None  # jobs per launch batch; None = the whole sweep at once
    params: dict[str, str] | None = None  # sweep parameters in config, as for Hydra's basic sweeper


@dataclass(frozen=True)
class HpoSweeperConf:
    """`hydra/sweeper=slurmagent_hpo`: an adaptive search instead of a grid. Its settings are
    the `hpo` group (HpoConf), so that trials see them too."""

    _target_: str = "hydra_plugins.slurmagent_launcher.hpo_sweeper.SlurmAgentHpoSweeper"


@dataclass(frozen=True)
class HpoBudget:
    """When the search stops asking for trials (the running ones finish); at least one is set."""

    epochs: int = 0  # fidelity units in all trials together (a promotion pays only what it adds); 0 = no limit
    trials: int = 0  # new trials; 0 = no limit
    wall_time: str = ""  # Slurm time syntax (2:00:00, 1-0); "" = no limit


@dataclass(frozen=True)
class HpoFidelity:
    """The fidelity: what a trial is trained for, in units the training reports (epochs)."""

    key: str = "train.epochs"  # the config key that sets a full training's length; every trial gets `max`
    max: int = 27  # a full training
    min: int = 1  # the lowest rung
    eta: int = 3  # reduction factor: rungs min·eta^k; the best 1/eta of a rung continue to the next


@dataclass(frozen=True)
class HpoConf:
    """The `hpo` group: the study the HPO sweeper runs (slurmagent/hpo, docs/hpo.md)."""

    objective: str = "val_error"  # the metric the training reports once per fidelity unit
    direction: str = "minimize"  # minimize | maximize
    budget: HpoBudget = field(default_factory=HpoBudget)
    max_parallel: int = 4  # trials running at once
    fidelity: HpoFidelity = field(default_factory=HpoFidelity)
    seed: int = 0
    storage: str = ""  # "" = a journal file in the sweep directory; journal:PATH; a database URL
    study_name: str = ""  # "" = the sweep directory's name
    explore: int = 0  # new trials from the quasi-random design before the model; 0 = 2 per parameter (≥ 6)
    conditions: dict[str, Any] = field(default_factory=dict)  # child key → {parent key: [values]}
    # set by the sweeper in each trial: stop at this fidelity, checkpointed (0 = run to the end)
    stop_at: int = 0
    trial: int = -1  # the trial's id (-1: not a trial)


HPO_DIRECTIONS = ("minimize", "maximize")
# the keys the search sweeper sets in each trial (HpoConf.stop_at, HpoConf.trial), as overrides
HPO_STOP_AT = "hpo.stop_at"
HPO_TRIAL = "hpo.trial"


def hpo_conf(data: Mapping[str, Any] | None) -> HpoConf:
    """The `hpo` group from plain data, checked: errors name the key and the valid values."""
    raw = dict(data or {})
    budget = parse_conf(HpoBudget, raw.pop("budget", None), "hpo.budget")
    fidelity = parse_conf(HpoFidelity, raw.pop("fidelity", None), "hpo.fidelity")
    conf = dataclasses.replace(parse_conf(HpoConf, raw, "hpo"), budget=budget, fidelity=fidelity)
    if conf.direction not in HPO_DIRECTIONS:
        raise ConfigError(f"hpo.direction={conf.direction!r} is not one of {choices(HPO_DIRECTIONS)}")
    if not conf.objective:
        raise ConfigError("hpo.objective is empty: name the metric the training reports (e.g. val_error)")
    if conf.max_parallel < 1:
        raise ConfigError(f"hpo.max_parallel={conf.max_parallel}: at least 1")
    if fidelity.eta < 2 or not 1 <= fidelity.min <= fidelity.max:
        raise ConfigError(
            f"hpo.fidelity: need eta ≥ 2 and 1 ≤ min ≤ max (eta={fidelity.eta}, min={fidelity.min}, max={fidelity.max})"
        )
    if budget.epochs < 0 or budget.trials < 0:
        raise ConfigError("hpo.budget.epochs and hpo.budget.trials count up from 0 (0 = no limit)")
    if not 0 <= conf.seed < 2**32:
        raise ConfigError(f"hpo.seed={conf.seed} must be in [0, 2**32): the samplers' seed range")
    for key, value in (("explore", conf.explore), ("stop_at", conf.stop_at)):
        if value < 0:
            raise ConfigError(f"hpo.{key}={value} must be 0 or more")
    if conf.trial < -1:
        raise ConfigError(f"hpo.trial={conf.trial} must be a trial's id (0 or more), or -1 (not a trial)")
    if budget.wall_time:
        slurm_time_to_seconds(budget.wall_time)  # a clear error for a bad time
    if not (budget.epochs or budget.trials or budget.wall_time):
        raise ConfigError("hpo.budget: set at least one of hpo.budget.epochs, hpo.budget.trials, hpo.budget.wall_time")
    return conf


@dataclass(frozen=True)
class ExplosionConf:
    """adapt.explosion: a gradient blow-up → restore the last good state and decay the lr."""

    enabled: bool = True  # react to exploding gradients (when adapt.enabled)
    factor: float = 10.0  # a step's gradient norm above factor × its running level is "far above"
    patience: int = 10  # that many such steps in a row → intervene; a non-finite norm or loss → at once
    ema: float = 0.9  # the running level: an EMA of normal steps' norms, this weight on its past
    warmup: int = 10  # steps whose norms only build the running level (a non-finite one still counts)
    gamma: float = 0.5  # each intervention multiplies every param group's lr (and the scheduler's base lrs) by it
    restore: bool = True  # restore the last good snapshot (model + optimizer) before decaying
    snapshot_every: int = 20  # steps between snapshots of the last good state (taken only after normal steps)
    max_interventions: int = 5  # gate requests of this kind per run (granted or not); then it stops and says so


@dataclass(frozen=True)
class PlateauConf:
    """adapt.plateau: the monitored metric stops improving → warm restart of the lr schedule."""

    enabled: bool = True  # react to a plateau (when adapt.enabled)
    metric: str = "val_error"  # the metric watched; an evaluation is a loop.report() call that contains it
    mode: str = "min"  # min | max: which way is better
    patience: int = 5  # evaluations without improvement → restart
    min_delta: float = 0.0  # an improvement must beat the best by more than this
    cooldown: int = 5  # evaluations after a restart before a plateau counts again
    anneal_to_end: bool = True  # CosineAnnealingLR: the restart's T_max is the steps left, ending with the run
    max_restarts: int = 3  # gate requests of this kind per run (granted or not); then it stops and says so


@dataclass(frozen=True)
class AdaptConf:
    """The `adapt` group: the step loop's in-loop controller (slurmagent/runtime/adapt.py). Not a
    job-spec group: the training code reads it (`adapt_conf(cfg.get("adapt"))`) and hands the
    controller to its StepLoop; every intervention is an action through the gate."""

    enabled: bool = False  # off unless asked for
    explosion: ExplosionConf = field(default_factory=ExplosionConf)
    plateau: PlateauConf = field(default_factory=PlateauConf)


ADAPT_MODES = ("min", "max")


def adapt_conf(data: Mapping[str, Any] | None, where: str = "adapt") -> AdaptConf:
    """The `adapt` group from plain data, checked: errors name the key and the valid values."""
    raw = dict(data or {})
    explosion = parse_conf(ExplosionConf, raw.pop("explosion", None), f"{where}.explosion")
    plateau = parse_conf(PlateauConf, raw.pop("plateau", None), f"{where}.plateau")
    conf = dataclasses.replace(parse_conf(AdaptConf, raw, where), explosion=explosion, plateau=plateau)
    e, p = f"{where}.explosion", f"{where}.plateau"
    if not explosion.factor > 1:
        raise ConfigError(f"{e}.factor={explosion.factor} must be above 1 (a norm this many times its running level)")
    if not 0 < explosion.gamma < 1:
        raise ConfigError(f"{e}.gamma={explosion.gamma} must be between 0 and 1 (exclusive): the lr's decay")
    if not 0 <= explosion.ema < 1:
        raise ConfigError(f"{e}.ema={explosion.ema} must be in [0, 1): the running level's weight on its past")
    for key in ("patience", "snapshot_every"):
        if getattr(explosion, key) < 1:
            raise ConfigError(f"{e}.{key}={getattr(explosion, key)} must be at least 1")
    for key, value in (("warmup", explosion.warmup), ("max_interventions", explosion.max_interventions)):
        if value < 0:
            raise ConfigError(f"{e}.{key}={value} must be 0 or more")
    if plateau.mode not in ADAPT_MODES:
        raise ConfigError(f"{p}.mode={plateau.mode!r} is not one of {choices(ADAPT_MODES)}")
    if not plateau.metric:
        raise ConfigError(f"{p}.metric is empty: name the metric the training reports (e.g. val_error)")
    if plateau.patience < 1:
        raise ConfigError(f"{p}.patience={plateau.patience} must be at least 1")
    for key, num in (("cooldown", plateau.cooldown), ("max_restarts", plateau.max_restarts)):
        if num < 0:
            raise ConfigError(f"{p}.{key}={num} must be 0 or more")
    if plateau.min_delta < 0:
        raise ConfigError(f"{p}.min_delta={plateau.min_delta} must be 0 or more")
    return conf


T = TypeVar("T")


def _type_ok(value: Any, annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if origin is Literal:
        return value in typing.get_args(annotation)
    if origin is list:
        (inner,) = typing.get_args(annotation)
        return isinstance(value, list) and all(_type_ok(v, inner) for v in value)
    if origin is dict:
        k, v = typing.get_args(annotation)
        return isinstance(value, dict) and all(_type_ok(a, k) and _type_ok(b, v) for a, b in value.items())
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


def _type_name(annotation: Any) -> str:
    return str(annotation).replace("typing.", "").replace("<class '", "").replace("'>", "")


def unknown_key(group: str, key: str, valid: list[str]) -> ConfigError:
    """`unknown key resources.gpu; valid keys of resources: …; did you mean resources.gpus?`"""
    import difflib

    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    hint = f"; did you mean {group}.{close[0]}?" if close else ""
    return ConfigError(f"unknown key {group}.{key}; valid keys of {group}: {choices(valid)}{hint}")


def parse_conf(cls: type[T], data: Mapping[str, Any] | None, where: str) -> T:
    """Build dataclass `cls` from a plain mapping; `where` names the config group in errors."""
    data = dict(data or {})
    assert dataclasses.is_dataclass(cls)
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in data if k not in known]
    if unknown:
        raise unknown_key(where, unknown[0], known)
    for key, value in data.items():
        if isinstance(value, float) and hints[key] is int and value.is_integer():
            data[key] = int(value)
            value = data[key]
        if (
            isinstance(value, list)
            and _type_ok(["x"], hints[key])
            and all(isinstance(v, (str, int, float)) for v in value)
        ):
            # command lines: Hydra reads `--epochs,3` as an int; argv elements are strings
            data[key] = value = [str(v) for v in value]
        if not _type_ok(value, hints[key]):
            raise ConfigError(f"{where}.{key}={value!r} has the wrong type; expected {_type_name(hints[key])}")
        if any(isinstance(v, float) and not math.isfinite(v) for v in _numbers(value)):
            raise ConfigError(f"{where}.{key}={value!r} is not a finite number; nan and inf are refused")
    return cls(**data)


def _numbers(value: Any) -> list[Any]:
    """A value's numbers: itself, or a list's or a mapping's values (one level)."""
    if isinstance(value, Mapping):
        return list(value.values())
    return list(value) if isinstance(value, list) else [value]


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


def validate_checkpoint(ck: CheckpointConf) -> None:
    if ck.every_steps < 0 or ck.every_seconds < 0:
        raise ConfigError("checkpoint.every_steps and checkpoint.every_seconds must be 0 (off) or positive")
    if ck.keep_last < 1:
        raise ConfigError(f"checkpoint.keep_last={ck.keep_last} must be at least 1")


SIGNAL_CHOICES = ("USR1", "USR2", "TERM", "INT", "HUP")
ON_REFUSAL_CHOICES = ("leave", "cancel")


SUPERVISOR_CHOICES = ("auto", "job", "process")


def validate_launcher(conf: LauncherConf) -> None:
    for key, value, valid in (
        ("on_refusal", conf.on_refusal, ON_REFUSAL_CHOICES),
        ("on_interrupt", conf.on_interrupt, ON_REFUSAL_CHOICES),
        ("supervisor", conf.supervisor, SUPERVISOR_CHOICES),
    ):
        if value not in valid:
            raise ConfigError(f"hydra.launcher.{key}={value!r} is not one of {choices(valid)}; nothing was submitted")
    for key, num in (("array_parallelism", conf.array_parallelism), ("max_array_size", conf.max_array_size)):
        if num < 0:
            raise ConfigError(f"hydra.launcher.{key}={num} must be 0 (no limit) or positive; nothing was submitted")
    for key, sec in (("poll_interval_s", conf.poll_interval_s), ("max_poll_interval_s", conf.max_poll_interval_s)):
        if sec <= 0:
            raise ConfigError(f"hydra.launcher.{key}={sec} must be a positive number of seconds; nothing was submitted")


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


# The config groups a job spec is made of, in one place: `spec_dict` takes them from a
# composed config, the sweeper knows overrides under them can change a spec.
SPEC_GROUPS = ("cluster", "resources", "checkpoint", "recovery", "task", "health")


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
    )
    validate_resources(spec.resources)
    if require_task or spec.task != TaskConf():
        validate_task(spec.task)
    validate_checkpoint(spec.checkpoint)
    validate_recovery(spec.recovery)
    validate_health(spec.health)
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


# -- Hydra structured configs: the dataclasses above are the one source of every default --
SPEC_NODE = "slurmagent/spec"  # put `- slurmagent/spec` in a defaults list to get the typed groups


def _typed(cls: type[Any]) -> Any:
    """A dataclass as a Hydra config node: typed and closed to unknown keys, but writable
    (OmegaConf makes frozen dataclasses read-only, which would refuse every override)."""
    from omegaconf import DictConfig, OmegaConf

    def writable(n: Any) -> None:  # nested frozen dataclasses (hpo.budget, hpo.fidelity) carry their own flag
        OmegaConf.set_readonly(n, False)
        if isinstance(n, DictConfig):
            for key in n:
                child = n._get_node(key)
                if isinstance(child, DictConfig):
                    writable(child)
                    if child._metadata.object_type in (dict, None):  # a free mapping (hpo.conditions): open to keys
                        OmegaConf.set_struct(child, False)

    node = OmegaConf.structured(cls)
    writable(node)
    return node


def register_configs() -> None:
    """Register the job-spec groups (`slurmagent/spec`, package _global_), the launcher
    (`hydra/launcher=slurmagent`) and the sweeper (`hydra/sweeper=slurmagent`) with Hydra's
    ConfigStore. Called when Hydra discovers the plugins (hydra_plugins/slurmagent_launcher)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    groups = {"resources": ResourcesConf, "checkpoint": CheckpointConf, "recovery": RecoveryConf}
    spec: dict[str, Any] = {"cluster": "auto", **{k: _typed(v) for k, v in groups.items()}}
    spec.update(task=_typed(TaskConf), health=_typed(HealthConf), site=_typed(SiteConf), hpo=_typed(HpoConf))
    spec["budget"] = _typed(BudgetConf)  # the sweep's spending limits (schedule/budget.py)
    spec["adapt"] = _typed(AdaptConf)  # the in-loop controller (runtime/adapt.py): typed, not a job-spec group
    group, name = SPEC_NODE.split("/")
    store.store(group=group, name=name, node=spec, package="_global_", provider="slurmagent")
    store.store(group="hydra/launcher", name="slurmagent", node=_typed(LauncherConf), provider="slurmagent")
    store.store(group="hydra/sweeper", name="slurmagent", node=_typed(SweeperConf), provider="slurmagent")
    store.store(group="hydra/sweeper", name="slurmagent_hpo", node=_typed(HpoSweeperConf), provider="slurmagent")


def config_error(exc: BaseException) -> ConfigError | None:
    """An error Hydra or OmegaConf raised about a key of a typed group, as a ConfigError that
    names the key, the valid keys and the closest one (`resources.gpu` → did you mean
    resources.gpus?); None when the error is about something else."""
    from omegaconf import DictConfig
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    seen: BaseException | None = exc
    while seen is not None:
        full_key = str(getattr(seen, "full_key", "") or "")
        owner = getattr(seen, "object_type", None)
        missing = isinstance(seen, (ConfigKeyError, ConfigAttributeError))
        if missing and full_key and owner is not None and dataclasses.is_dataclass(owner):
            group, _, leaf = full_key.rpartition(".")
            return unknown_key(group, leaf, [f.name for f in dataclasses.fields(owner) if f.name != "_target_"])
        if missing and full_key and isinstance(getattr(seen, "parent_node", None), DictConfig):
            return _free_key_error(full_key, seen.parent_node, str(exc))  # type: ignore[attr-defined]
        if isinstance(seen, ValidationError) and full_key:
            reason = str(seen).splitlines()[0]
            return ConfigError(f"{full_key}: {reason}")
        seen = seen.__cause__ or seen.__context__
    return None


def _free_key_error(full_key: str, parent: Any, hydra_message: str) -> ConfigError:
    """A key the (free-form) config does not have, overridden without `+` (`optim.lrr=0.01`):
    the keys at its level and the closest one (`optim.lr`); for a top-level key, else the
    closest key of that name in a group (`lrr=0.01` → `optim.lr`); and how to add it when meant."""
    import difflib

    from omegaconf import OmegaConf

    group, _, leaf = full_key.rpartition(".")
    siblings = [str(k) for k in parent]
    close = difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.6)
    guess = f"{group}.{close[0]}" if close and group else (close[0] if close else "")
    if not guess and not group:  # a key of a group, given without the group
        root = OmegaConf.to_container(parent._get_root(), resolve=False)
        nested: dict[str, str] = {}  # leaf name → its first dotted path
        stack = [(f"{k!s}.", v) for k, v in (root.items() if isinstance(root, dict) else ()) if k != "hydra"]
        while stack:
            prefix, node = stack.pop(0)
            if isinstance(node, dict):
                for k, v in node.items():
                    nested.setdefault(str(k), f"{prefix}{k}")
                    stack.append((f"{prefix}{k}.", v))
        close = difflib.get_close_matches(leaf, sorted(nested), n=1, cutoff=0.6)
        guess = nested[close[0]] if close else ""
    where = f"valid keys of {group}" if group else "valid top-level keys"
    add = re.search(r"use (\+\S.*)$", hydra_message)
    return ConfigError(
        f"unknown key {full_key}; {where}: {choices(siblings)}"
        + (f"; did you mean {guess}?" if guess else "")
        + (f" (to add a new key: {add.group(1)})" if add else "")
    )
