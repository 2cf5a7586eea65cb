"""The `adapt` group: the in-loop controller's settings (runtime/adapt.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slurmagent.config.parse import parse_conf
from slurmagent.errors import ConfigError, choices


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
