"""The `hpo` group: an adaptive search's settings."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slurmagent.config.parse import parse_conf
from slurmagent.errors import ConfigError, choices
from slurmagent.syntax import slurm_time_to_seconds


@dataclass(frozen=True)
class HpoBudget:
    """When the search stops asking for trials (the running ones finish); at least one is set."""

    epochs: int = 0  # fidelity units in all trials together (a promotion pays only what it adds); 0 = no limit
    trials: int = 0  # new trials; 0 = no limit
    wall_time: str = ""  # Slurm time syntax (2:00:00, 1-0); "" = no limit


def lowest_rung(max_fidelity: int) -> int:
    """The lowest rung when none is set: a tenth of a full training, rounded down, at least one
    unit (20 or 27 epochs → 2; up to 19 → 1). After one unit of 20 the ranks mislead the most
    (Spearman to the final 0.75–0.84 on five tables, 0.79–0.88 after two), and a configuration
    that wins late was cut there more often than random search missed it (bench/README.md)."""
    return max(1, max_fidelity // 10)


@dataclass(frozen=True)
class HpoFidelity:
    """The fidelity: what a trial is trained for, in units the training reports (epochs)."""

    key: str = "train.epochs"  # the config key that sets a full training's length; every trial gets `max`
    max: int = 27  # a full training
    min: int = 0  # the lowest rung; 0 = lowest_rung(max): a tenth of max, at least 1
    eta: int = 3  # reduction factor: rungs min·eta^k; the best 1/eta of a rung continue to the next

    @property
    def lowest(self) -> int:
        """The lowest rung: `min`, or when it is 0 a tenth of `max` (at least 1)."""
        return self.min or lowest_rung(self.max)


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
    if fidelity.eta < 2 or fidelity.max < 1 or not 0 <= fidelity.min <= fidelity.max:
        raise ConfigError(
            f"hpo.fidelity: need eta ≥ 2 and 0 ≤ min ≤ max, max ≥ 1 (min 0: a tenth of max) "
            f"(eta={fidelity.eta}, min={fidelity.min}, max={fidelity.max})"
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
