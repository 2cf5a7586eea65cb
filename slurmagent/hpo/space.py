"""A search space, written as Hydra's sweep overrides (the grammar users of Hydra's Optuna
sweeper know) and turned into Optuna distributions:

    optim.lr=tag(log,interval(1e-4,1))     a float, log-uniform
    optim.lr=interval(1e-4,1)              a float, uniform
    model.depth=int(interval(1,4))         an int, uniform (tag(log, int(interval(…))): log-uniform)
    train.batch=range(32,257,32)           an int on a grid (stop excluded, like Python's range)
    model.dropout=range(0,0.5,0.1)         a float on a grid (0.0, 0.1, … 0.4)
    model.width=tag(log,range(16,257,2))   log-stepped: 16, 32, 64, 128, 256 (start × step^k below stop)
    optim.wd=tag(log,range(1e-6,1,10))     log-stepped floats: 1e-06, 1e-05, … 0.1
    model.width=choice(32,64,128,256)      categorical (also `model.width=32,64,128,256`)
    optim.name=sgd                         not a sweep: the same value in every trial

In `tag(log, range(a, b, s))` the step is a factor when it is above 1 (a log-stepped range);
`tag(log, range(a, b))` (step 1) is every integer from a to b - 1, log-uniform.

A parameter may be conditional: `conditions={"optim.momentum": {"optim.name": ["sgd"]}}`
samples `optim.momentum` only in trials whose `optim.name` is `sgd`.

The space rounds: `Space.snap` puts a value on its parameter's grid (an int, a step, a
log-stepped range), `Space.key` is a configuration after that rounding (two trials with the
same key run the same configuration) and `Space.distance` the distance of two configurations
with every parameter scaled to [0, 1] (log where the parameter is; a different choice, or a
parameter active in one and not the other, counts 1).
"""

from __future__ import annotations

import math
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
    grid: tuple[Any, ...] = ()  # a log-stepped range's values (its distribution: their log-scaled hull)

    def active(self, chosen: Mapping[str, Any]) -> bool:
        return all(chosen.get(parent) in values for parent, values in self.when.items())

    @property
    def levels(self) -> int:
        """How many values the parameter has after rounding (0: a continuous float)."""
        d = self.distribution
        if self.grid:
            return len(self.grid)
        if isinstance(d, CategoricalDistribution):
            return len(d.choices)
        if isinstance(d, IntDistribution):
            return (d.high - d.low) // d.step + 1
        if isinstance(d, FloatDistribution) and d.step is not None:
            return round((d.high - d.low) / d.step) + 1
        return 0

    def from_unit(self, u: float) -> Any:
        """The value at position u ∈ [0, 1) of a uniform draw: every value of a finite parameter
        (a choice, an int range, a step, a log-stepped range) over an equal share of [0, 1), a
        log-scaled int over its log hull [low - ½, high + ½] (as Optuna samples it), a float
        over its interval (log-scaled where it is)."""
        d, u = self.distribution, min(max(float(u), 0.0), math.nextafter(1.0, 0.0))
        if self.grid:
            return self.grid[int(u * len(self.grid))]
        if isinstance(d, CategoricalDistribution):
            return d.choices[int(u * len(d.choices))]
        if isinstance(d, IntDistribution):
            if d.log:
                lo, hi = math.log(d.low - 0.5), math.log(d.high + 0.5)
                return min(max(round(math.exp(lo + u * (hi - lo))), d.low), d.high)
            return d.low + int(u * self.levels) * d.step
        if isinstance(d, FloatDistribution):
            if d.step is not None:
                return self._on_step(d.low + int(u * self.levels) * d.step)
            if d.log:
                return min(max(math.exp(math.log(d.low) + u * (math.log(d.high) - math.log(d.low))), d.low), d.high)
            return min(max(d.low + u * (d.high - d.low), d.low), d.high)
        raise ConfigError(f"{self.name}: unsupported distribution {d!r}")

    def snap(self, value: Any) -> Any:
        """`value` as the space rounds it: onto its grid, inside its bounds."""
        d = self.distribution
        if isinstance(d, CategoricalDistribution):
            if value not in d.choices:
                raise ConfigError(f"{self.name}={value!r} is not one of its choices {list(d.choices)}")
            return value
        x = float(value)
        if not math.isfinite(x):
            raise ConfigError(f"{self.name}={value!r} is not a number")
        if self.grid:
            logs = [math.log(g) for g in self.grid]
            at = math.log(x) if x > 0 else -math.inf
            return self.grid[min(range(len(logs)), key=lambda i: abs(logs[i] - at))]
        if isinstance(d, IntDistribution):
            n = round((min(max(x, d.low), d.high) - d.low) / d.step)
            return min(d.low + n * d.step, d.low + (self.levels - 1) * d.step)
        if isinstance(d, FloatDistribution):
            x = min(max(x, d.low), d.high)
            if d.step is not None:
                return self._on_step(d.low + min(round((x - d.low) / d.step), self.levels - 1) * d.step)
            return x
        raise ConfigError(f"{self.name}: unsupported distribution {d!r}")

    def unit(self, value: Any) -> float:
        """The position of a (rounded) numeric value in [0, 1]; log-scaled where the parameter is."""
        d = self.distribution
        if self.grid:
            return self.grid.index(value) / max(1, len(self.grid) - 1)
        if isinstance(d, FloatDistribution | IntDistribution):
            low, high, x = float(d.low), float(d.high), float(value)
            if high <= low:
                return 0.0
            if d.log:
                return (math.log(x) - math.log(low)) / (math.log(high) - math.log(low))
            return (x - low) / (high - low)
        raise ConfigError(f"{self.name}: a choice has no position")

    def _on_step(self, x: float) -> float:
        d = self.distribution
        assert isinstance(d, FloatDistribution) and d.step is not None
        return min(max(float(f"{x:.12g}"), d.low), d.high)  # 0.1 * 3 is 0.30000000000000004: not a new value


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

    def from_unit(self, u: Sequence[float]) -> dict[str, Any]:
        """A configuration from a point of [0, 1)^len(params): each active parameter from its coordinate."""
        chosen: dict[str, Any] = {}
        for p, x in zip(self.params, u, strict=True):
            if p.active(chosen):
                chosen[p.name] = p.from_unit(float(x))
        return chosen

    def snap(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The configuration as the space rounds it (only its active parameters)."""
        chosen: dict[str, Any] = {}
        for p in self.params:
            if p.active(chosen) and p.name in params:
                chosen[p.name] = p.snap(params[p.name])
        return chosen

    def check(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """`params` if they are a configuration of the space (every active parameter set, within
        its bounds, nothing else), else ConfigError naming what is wrong. Values are kept as
        given: what ran is what ran."""
        chosen: dict[str, Any] = {}
        for p in self.params:
            if not p.active(chosen):
                if p.name in params:
                    raise ConfigError(f"{p.name} is set but inactive here (it applies when {dict(p.when)})")
                continue
            if p.name not in params:
                raise ConfigError(f"{p.name} is missing: every active parameter needs a value")
            value = params[p.name]
            d = p.distribution
            if isinstance(d, CategoricalDistribution):
                p.snap(value)  # raises unless one of the choices
            elif isinstance(value, bool) or not isinstance(value, int | float) or not d._contains(float(value)):
                bounds = f"[{d.low}, {d.high}]" if isinstance(d, FloatDistribution | IntDistribution) else ""
                raise ConfigError(f"{p.name}={value!r} is outside its distribution {bounds}")
            chosen[p.name] = int(value) if isinstance(d, IntDistribution) else value
        unknown = sorted(set(params) - {p.name for p in self.params})
        if unknown:
            raise ConfigError(f"{', '.join(unknown)}: not a parameter of the search space; parameters: {self.names}")
        return chosen

    def configurations(self, limit: int = 20000) -> list[dict[str, Any]] | None:
        """Every configuration after rounding (conditions respected), when every parameter is
        finite and there are at most `limit`; else None."""
        if any(p.levels == 0 for p in self.params):
            return None
        out: list[dict[str, Any]] = [{}]
        for p in self.params:
            values = [p.from_unit((i + 0.5) / p.levels) for i in range(p.levels)]
            grown: list[dict[str, Any]] = []
            for chosen in out:
                if p.active(chosen):
                    grown += [{**chosen, p.name: v} for v in values]
                else:
                    grown.append(chosen)
            if len(grown) > limit:
                return None
            out = grown
        return out

    def key(self, params: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
        """The configuration after the space's rounding, as a hashable key (continuous floats to 10
        significant digits): two trials with one key run the same configuration."""
        out = []
        for name, value in self.snap(params).items():
            if isinstance(value, float):
                value = float(f"{value:.10g}")
            out.append((name, value))
        return tuple(out)

    def distance(self, a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
        """Root mean square over the parameters of the difference in each, scaled to [0, 1]."""
        total = 0.0
        for p in self.params:
            inside_a, inside_b = p.name in a, p.name in b
            if inside_a != inside_b:
                total += 1.0
            elif inside_a:
                if isinstance(p.distribution, CategoricalDistribution):
                    total += float(a[p.name] != b[p.name])
                else:
                    total += (p.unit(p.snap(a[p.name])) - p.unit(p.snap(b[p.name]))) ** 2
        return math.sqrt(total / len(self.params)) if self.params else 0.0

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
                distribution, grid = _to_distribution(key, override.value())
                params.append(Param(key, distribution, when, spelt, grid))
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
    return _to_distribution(key, sweep)[0]


def _to_distribution(key: str, sweep: Any) -> tuple[BaseDistribution, tuple[Any, ...]]:
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep

    log = "log" in (getattr(sweep, "tags", None) or set())
    if isinstance(sweep, IntervalSweep):
        low, high = sweep.start, sweep.end
        if low is None or high is None or not low < high:
            raise ConfigError(f"{key}: interval({low}, {high}) needs a low bound below its high bound")
        if log and low <= 0:
            raise ConfigError(f"{key}: tag(log, interval({low}, {high})) needs a low bound above 0")
        if isinstance(low, int) and isinstance(high, int):
            return IntDistribution(low, high, log=log), ()
        return FloatDistribution(float(low), float(high), log=log), ()
    if isinstance(sweep, RangeSweep):
        step = 1 if sweep.step is None else sweep.step
        if log and step != 1:
            return _log_stepped(key, sweep.start, sweep.stop, step)
        values = list(sweep.range())
        if not values:
            raise ConfigError(f"{key}: range({sweep.start}, {sweep.stop}, {sweep.step}) is empty")
        if all(isinstance(v, int) for v in values):
            if log and values[0] <= 0:
                raise ConfigError(f"{key}: tag(log, range({sweep.start}, {sweep.stop})) needs a start above 0")
            return IntDistribution(values[0], values[-1], log=log, step=1 if log else int(step)), ()
        if len(values) == 1:
            return FloatDistribution(float(values[0]), float(values[0])), ()
        return FloatDistribution(float(values[0]), float(values[-1]), step=float(step)), ()
    if isinstance(sweep, ChoiceSweep):
        if log:
            raise ConfigError(f"{key}: tag(log, …) applies to interval and range, not to choice")
        choices = list(sweep.list)
        if len(choices) < 1:
            raise ConfigError(f"{key}: choice() needs at least one value")
        return CategoricalDistribution([c if isinstance(c, bool | int | float | str) else str(c) for c in choices]), ()
    raise ConfigError(f"{key}: {sweep!r} is not a search space; use interval(), range(), choice() or tag(log, …)")


def _log_stepped(key: str, start: Any, stop: Any, factor: Any) -> tuple[BaseDistribution, tuple[Any, ...]]:
    """tag(log, range(start, stop, factor)): start × factor^k below stop; ints when start and
    factor are ints. Its distribution is the log-scaled hull, its grid the values."""
    spelt = f"tag(log, range({start}, {stop}, {factor}))"
    if start is None or stop is None or not start > 0:
        raise ConfigError(f"{key}: {spelt} needs a start above 0")
    if not factor > 1:
        raise ConfigError(f"{key}: {spelt}: a log-stepped range's step is a factor above 1 (2: powers of two)")
    ints = isinstance(start, int) and isinstance(factor, int)
    values: list[Any] = []
    k = 0
    while True:
        v = start * factor**k if ints else float(f"{float(start) * float(factor) ** k:.12g}")
        if v >= stop:
            break
        values.append(v)
        k += 1
    if not values:
        raise ConfigError(f"{key}: {spelt} is empty")
    if len(values) == 1:
        d: BaseDistribution = IntDistribution(values[0], values[0]) if ints else FloatDistribution(values[0], values[0])
        return d, tuple(values)
    if ints:
        return IntDistribution(values[0], values[-1], log=True), tuple(values)
    return FloatDistribution(values[0], values[-1], log=True), tuple(values)


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
