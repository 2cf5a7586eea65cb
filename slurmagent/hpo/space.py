"""A search space, written as Hydra's sweep overrides (the grammar users of Hydra's Optuna
sweeper know) and turned into Optuna distributions:

    optim.lr=tag(log,interval(1e-4,1))     a float, log-uniform
    optim.lr=interval(1e-4,1)              a float, uniform
    model.depth=int(interval(1,4))         an int, uniform (tag(log, int(interval(…))): log-uniform)
    train.batch=range(32,257,32)           an int on a grid (stop excluded, like Python's range)
    model.width=choice(32,64,128,256)      categorical (also `model.width=32,64,128,256`)
    optim.name=sgd                         not a sweep: the same value in every trial

A parameter may be conditional: `conditions={"optim.momentum": {"optim.name": ["sgd"]}}`
samples `optim.momentum` only in trials whose `optim.name` is `sgd`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from slurmagent.errors import ConfigError


@dataclass(frozen=True)
class Param:
    name: str  # the config key (`optim.lr`)
    distribution: BaseDistribution
    when: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)  # parent key → values that activate it
    key: str = ""  # as the override spells it (`+optim.lr`, `db@backup`); "" = name

    def active(self, chosen: Mapping[str, Any]) -> bool:
        return all(chosen.get(parent) in values for parent, values in self.when.items())


@dataclass(frozen=True)
class Space:
    params: tuple[Param, ...]  # parents before the parameters they condition
    fixed: Mapping[str, Any] = field(default_factory=dict)  # non-sweep overrides: the same in every trial

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.params]

    def distributions(self, params: Mapping[str, Any]) -> dict[str, BaseDistribution]:
        """The distributions of the parameters `params` sets (its active ones)."""
        return {p.name: p.distribution for p in self.params if p.name in params}

    def overrides(self, params: Mapping[str, Any]) -> list[str]:
        """The Hydra overrides that run a trial with `params` (fixed values first)."""
        keys = {p.name: p.key or p.name for p in self.params}
        chosen = [f"{keys.get(k, k)}={_override_value(v)}" for k, v in params.items()]
        return [f"{k}={_override_value(v)}" for k, v in self.fixed.items()] + chosen

    @classmethod
    def from_overrides(
        cls, overrides: Sequence[str], conditions: Mapping[str, Mapping[str, Sequence[Any]]] | None = None
    ) -> Space:
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from hydra.errors import HydraException

        try:
            parsed = OverridesParser.create().parse_overrides(list(overrides))
        except HydraException as exc:
            raise ConfigError(f"search space: {exc}") from None
        params: list[Param] = []
        fixed: dict[str, Any] = {}
        conditions = conditions or {}
        for override in parsed:
            key, spelt = override.key_or_group, override.get_key_element()
            if override.is_sweep_override():
                when = {parent: tuple(values) for parent, values in conditions.get(key, {}).items()}
                params.append(Param(key, to_distribution(key, override.value()), when, spelt))
            else:
                fixed[spelt] = override.value()
        known = {p.name for p in params}
        for child, parents in conditions.items():
            if child not in known:
                names = ", ".join(sorted(known))
                raise ConfigError(f"hpo.conditions.{child}: not a parameter of the search space; parameters: {names}")
            for parent in parents:
                if parent not in known and parent not in {k.lstrip("+~").split("@")[0] for k in fixed}:
                    raise ConfigError(f"hpo.conditions.{child}: its condition's key {parent} is not in the sweep")
        return cls(tuple(_parents_first(params)), fixed)


def to_distribution(key: str, sweep: Any) -> BaseDistribution:
    """An Optuna distribution from one of Hydra's sweeps (interval, range, choice; tag(log))."""
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep

    log = "log" in (getattr(sweep, "tags", None) or set())
    if isinstance(sweep, IntervalSweep):
        low, high = sweep.start, sweep.end
        if low is None or high is None or not low < high:
            raise ConfigError(f"{key}: interval({low}, {high}) needs a low bound below its high bound")
        if log and low <= 0:
            raise ConfigError(f"{key}: tag(log, interval({low}, {high})) needs a low bound above 0")
        if isinstance(low, int) and isinstance(high, int):
            return IntDistribution(low, high, log=log)
        return FloatDistribution(float(low), float(high), log=log)
    if isinstance(sweep, RangeSweep):
        values = list(sweep.range())
        if not values:
            raise ConfigError(f"{key}: range({sweep.start}, {sweep.stop}, {sweep.step}) is empty")
        if all(isinstance(v, int) for v in values):
            step = int(sweep.step or 1)
            if log and step != 1:
                raise ConfigError(f"{key}: tag(log, range(…)) takes step 1 only")
            return IntDistribution(values[0], values[-1], log=log, step=1 if log else step)
        return FloatDistribution(float(values[0]), float(values[-1]), step=float(sweep.step or 1))
    if isinstance(sweep, ChoiceSweep):
        if log:
            raise ConfigError(f"{key}: tag(log, …) applies to interval and range, not to choice")
        choices = list(sweep.list)
        if len(choices) < 1:
            raise ConfigError(f"{key}: choice() needs at least one value")
        return CategoricalDistribution([c if isinstance(c, bool | int | float | str) else str(c) for c in choices])
    raise ConfigError(f"{key}: {sweep!r} is not a search space; use interval(), range(), choice() or tag(log, …)")


def _parents_first(params: list[Param]) -> list[Param]:
    by_name = {p.name: p for p in params}
    out: list[Param] = []
    seen: set[str] = set()

    def visit(p: Param, stack: tuple[str, ...]) -> None:
        if p.name in seen:
            return
        if p.name in stack:
            raise ConfigError(f"hpo.conditions: {' → '.join((*stack, p.name))} is a cycle")
        for parent in p.when:
            if parent in by_name:
                visit(by_name[parent], (*stack, p.name))
        seen.add(p.name)
        out.append(p)

    for p in params:
        visit(p, ())
    return out


_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:")


def _override_value(value: Any) -> str:
    """`value` as Hydra's override grammar reads it back."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        if value and set(value) <= _PLAIN:
            return value
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return str(value)
