"""The site's facts slurmagent cannot ask Slurm (the GPU catalogue, priorities, scheduling knobs) and a
sweep's budget."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, cast

from slurmagent.config.parse import parse_conf, unknown_key
from slurmagent.errors import ConfigError, choices
from slurmagent.syntax import slurm_time_to_seconds


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
