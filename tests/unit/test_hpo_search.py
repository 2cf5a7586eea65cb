"""Issue 22's contract of the search (slurmagent.hpo): the explore design's marginals are
uniform over an integer range and a step, log-stepped ranges (powers of two), no new trial
repeats a configuration that is running or done after the space's rounding, the parameters
that actually ran can be told (and externally evaluated trials added), and the minimum
distance between configurations shrinks only as trials accumulate."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from optuna.distributions import FloatDistribution, IntDistribution

from slurmagent.errors import ConfigError
from slurmagent.hpo.core import Optimizer, from_unit, halton
from slurmagent.hpo.space import Space
from slurmagent.hpo.storage import open_storage


def chi_square_ok(counts: list[int]) -> bool:
    """Counts uniform within sampling error: the chi-square statistic under its 99.9 % quantile
    (Wilson–Hilferty), so a correct implementation fails about once in a thousand seeds."""
    n, k = sum(counts), len(counts)
    expected = n / k
    stat = sum((c - expected) ** 2 / expected for c in counts)
    df = k - 1
    z = 3.09  # the normal's 99.9 % quantile
    limit = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return stat <= limit


@pytest.mark.parametrize(
    ("override", "values"),
    [
        ("model.depth=int(interval(1,3))", [1, 2, 3]),
        ("model.depth=int(interval(1,4))", [1, 2, 3, 4]),
        ("train.batch=range(32,257,32)", [32, 64, 96, 128, 160, 192, 224, 256]),
        ("model.dropout=range(0,0.5,0.1)", [0.0, 0.1, 0.2, 0.3, 0.4]),
        ("model.width=tag(log,range(16,257,2))", [16, 32, 64, 128, 256]),
        ("model.width=choice(32,64,128)", [32, 64, 128]),
    ],
)
def test_every_value_of_a_finite_parameter_gets_an_equal_share(override: str, values: list[Any]) -> None:
    space = Space.from_overrides([override])
    param = space.params[0]
    # uniform draws: counts uniform within sampling error (the old rounding gave the ends half weight)
    draws = np.random.default_rng(0).random(1600)
    counts = Counter(param.from_unit(float(u)) for u in draws)
    assert set(counts) == set(values)
    assert chi_square_ok([counts[v] for v in values]), counts
    # the explore design itself (Halton, shifted): as even as a low-discrepancy sequence gets
    opt = Optimizer(space, 1, 9, 3, seed=5)
    design = Counter(opt._design_point(i)[param.name] for i in range(1, 1601))
    assert max(design.values()) - min(design.values()) <= 2, design
    assert from_unit(param.distribution, 0.999) == values[-1] or param.grid


def test_a_log_scaled_integer_range_follows_the_log_uniform_law() -> None:
    param = Space.from_overrides(["model.width=tag(log,int(interval(1,8)))"]).params[0]
    draws = np.random.default_rng(1).random(20000)
    counts = Counter(param.from_unit(float(u)) for u in draws)
    hull = math.log(8.5) - math.log(0.5)
    for k in range(1, 9):  # P(k) = log((k + ½) / (k − ½)) / log(8.5 / 0.5), as Optuna samples it
        p = (math.log(k + 0.5) - math.log(k - 0.5)) / hull
        assert abs(counts[k] / 20000 - p) < 4 * math.sqrt(p * (1 - p) / 20000), (k, counts)


def test_log_stepped_ranges() -> None:
    space = Space.from_overrides(
        ["model.width=tag(log,range(16,257,2))", "optim.wd=tag(log,range(1e-6,1,10))", "model.d=tag(log,range(1,9))"]
    )
    width, wd, d = space.params
    assert width.grid == (16, 32, 64, 128, 256) and width.distribution == IntDistribution(16, 256, log=True)
    assert wd.grid == (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1) and wd.distribution == FloatDistribution(1e-6, 0.1, log=True)
    assert not d.grid and d.distribution == IntDistribution(1, 8, log=True)  # step 1: every integer, log-uniform
    assert width.snap(45) == 32 and width.snap(46) == 64 and width.snap(1000) == 256  # nearest in log
    assert space.key({"model.width": 100, "optim.wd": 2e-3, "model.d": 3}) == (
        ("model.width", 128),
        ("optim.wd", 1e-3),
        ("model.d", 3),
    )
    opt = Optimizer(space, 1, 9, 3, seed=0)
    for _ in range(40):
        a = opt.ask()
        assert a.params["model.width"] in width.grid and a.params["optim.wd"] in wd.grid, a.params
        opt.tell(a.trial, {f: 1 / (f * a.params["model.width"]) for f in range(1, a.fidelity + 1)})
    for spelt, message in [
        ("a=tag(log,range(16,257,0.5))", "a factor above 1"),
        ("a=tag(log,range(0,8,2))", "needs a start above 0"),
        ("a=tag(log,range(16,8,2))", "is empty"),
    ]:
        with pytest.raises(ConfigError, match=message):
            Space.from_overrides([spelt])


def toy(params: dict[str, Any], upto: int, start: int = 1) -> dict[int, float]:
    """One sharp optimum (a=2, b=4, c=0.5): TPE would keep proposing it."""
    floor = abs(params["a"] - 2) * 0.1 + abs(params["b"] - 4) * 0.05 + abs(params["c"] - 0.5) * 0.2
    return {f: floor + 0.3 / f for f in range(start, upto + 1)}


def test_no_new_trial_repeats_a_running_or_finished_configuration() -> None:
    """80 configurations after rounding; trials asked four at a time (three running while the
    fourth is asked): no two new trials share a configuration, in the explore or the focus
    phase, until the space is used up."""
    space = Space.from_overrides(["a=choice(1,2,3,4)", "b=int(interval(1,5))", "c=range(0,1,0.25)"])
    opt = Optimizer(space, 1, 9, 3, seed=2)
    keys: list[tuple[Any, ...]] = []
    focus = 0
    while len(keys) < 80:
        batch = [opt.ask() for _ in range(4)]
        for a in batch:
            if a.resume is None:
                keys.append(space.key(a.params))
                focus += len(keys) > opt.n_explore
            opt.tell(a.trial, toy(a.params, a.fidelity, opt.trials[a.trial].reached + 1))
    assert focus > 40
    assert len(set(keys[:80])) == 80  # every configuration once before any twice


def test_a_continuous_focus_keeps_its_distance_and_the_distance_shrinks_with_evidence() -> None:
    space = Space.from_overrides(["x=interval(0.0,1.0)", "y=tag(log,interval(1e-3,1.0))"])
    opt = Optimizer(space, 1, 9, 3, seed=0)
    radii = []
    for _ in range(120):
        radius = opt._radius()
        a = opt.ask()
        if a.resume is None:
            others = [t.params for n, t in opt.trials.items() if n != a.trial]
            assert all(space.distance(a.params, o) >= radius for o in others)
            radii.append(radius)
        x, y = a.params["x"], math.log10(a.params["y"])
        opt.tell(a.trial, {f: (x - 0.3) ** 2 + (y + 2) ** 2 / 9 + 0.2 / f for f in range(1, a.fidelity + 1)})
    assert radii == sorted(radii, reverse=True) and radii[-1] < radii[0] / 3


def test_tell_with_the_parameters_that_actually_ran(tmp_path: Path) -> None:
    space = Space.from_overrides(
        ["optim.lr=tag(log,interval(1e-4,1.0))", "optim.name=choice(sgd,adam)", "optim.momentum=interval(0.5,0.99)"],
        {"optim.momentum": {"optim.name": ["sgd"]}},
    )
    opt = Optimizer(space, 1, 9, 3, seed=0, storage=open_storage("", tmp_path))
    asked = [opt.ask() for _ in range(6)]
    ran = []
    for a in asked:
        # the user runs the nearest of their own grid: lr a power of ten, always adam
        params = {"optim.lr": 10.0 ** round(math.log10(a.params["optim.lr"])), "optim.name": "adam"}
        ran.append(params)
        opt.tell(a.trial, {1: abs(math.log10(params["optim.lr"]) + 2) / 4 + 0.1}, params=params)
    for a, params in zip(asked, ran, strict=True):
        assert opt.trials[a.trial].params == params  # what ran, the conditional momentum gone
        assert opt.study.trials[a.trial].params["optim.lr"] == params["optim.lr"]  # the storage too
    # a promotion continues with what ran
    promoted = next(a for a in iter(opt.ask, None) if a.resume is not None)
    assert promoted.params in ran
    # a study continued from its storage has what ran
    again = Optimizer(space, 1, 9, 3, seed=0, storage=open_storage("", tmp_path))
    ran_by_trial = {a.trial: p for a, p in zip(asked, ran, strict=True)}
    assert {n: t.params for n, t in again.trials.items() if n < 6} == ran_by_trial
    # what ran counts as taken: no new trial repeats it
    taken = {space.key(p) for p in ran}
    for _ in range(30):
        a = again.ask()
        if a.resume is None:
            assert space.key(a.params) not in taken
            taken.add(space.key(a.params))
        again.tell(a.trial, {f: 0.5 / f for f in range(again.trials[a.trial].reached + 1, a.fidelity + 1)})
    # the parameters change with the first result only, and must be a configuration of the space
    with pytest.raises(ConfigError, match="first result only"):
        again.tell(asked[0].trial, {3: 0.1}, params={"optim.lr": 0.5, "optim.name": "adam"})
    b = again.ask()
    with pytest.raises(ConfigError, match="inactive"):
        again.tell(b.trial, {1: 0.2}, params={"optim.lr": 0.01, "optim.name": "adam", "optim.momentum": 0.9})
    with pytest.raises(ConfigError, match="outside its distribution"):
        again.tell(b.trial, {1: 0.2}, params={"optim.lr": 5.0, "optim.name": "adam"})


def test_the_model_learns_from_what_ran_not_from_what_was_asked() -> None:
    """Every proposal is run at x = 0.9 (a user's fixed setting) and told so: the model's
    observations are all at 0.9, none where it asked."""
    space = Space.from_overrides(["x=interval(0.0,1.0)"])
    opt = Optimizer(space, 1, 3, 3, seed=0)
    for _ in range(12):
        a = opt.ask()
        if a.resume is None:
            opt.tell(a.trial, {1: 0.5}, params={"x": 0.9})
        else:
            opt.tell(a.trial, {3: 0.4})
    assert {t.params["x"] for t in opt.trials.values()} == {0.9}


def test_an_externally_evaluated_trial_is_evidence_only() -> None:
    space = Space.from_overrides(["x=interval(0.0,1.0)"])
    opt = Optimizer(space, 1, 9, 3, seed=0)
    n = opt.add({"x": 0.3}, {1: 0.2, 3: 0.1, 9: 0.01})
    assert opt.spent() == 0 and not opt.pending()
    best = opt.best()
    assert best is not None and best.trial == n and best.external
    for _ in range(20):
        a = opt.ask()
        assert a.trial != n and a.resume != n
        opt.tell(a.trial, {f: 0.5 + 0.1 / f for f in range(opt.trials[a.trial].reached + 1, a.fidelity + 1)})
    assert opt.study.trials[n].state.name == "COMPLETE"
    with pytest.raises(ConfigError, match="at least one"):
        opt.add({"x": 0.5}, {})


def test_the_design_goes_on_after_a_restart(tmp_path: Path) -> None:
    space = Space.from_overrides(["x=interval(0.0,1.0)", "y=interval(0.0,1.0)"])
    opt = Optimizer(space, 1, 9, 3, seed=4, storage=open_storage("", tmp_path))
    for _ in range(10):
        a = opt.ask()
        opt.tell(a.trial, {f: a.params["x"] for f in range(opt.trials[a.trial].reached + 1, a.fidelity + 1)})
    again = Optimizer(space, 1, 9, 3, seed=4, storage=open_storage("", tmp_path))
    assert again._design == opt._design and again._new == opt._new and again._focused == opt._focused
    assert halton(1, 2).shape == (2,)


def test_a_share_of_the_design_starts_at_the_top_rung_and_counts_on_after_a_restart(tmp_path: Path) -> None:
    """design_top=1/4: of the design trials after the first design, every fourth starts at the
    top rung (trained to the end at once); the count goes on in a study continued from storage."""
    space = Space.from_overrides(["x=interval(0.0,1.0)", "y=interval(0.0,1.0)"])

    def run(opt: Optimizer, n: int) -> None:
        for _ in range(n):
            a = opt.ask()
            curve = {f: a.params["x"] + 1 / f for f in range(opt.trials[a.trial].reached + 1, a.fidelity + 1)}
            opt.tell(a.trial, curve)

    opt = Optimizer(space, 1, 9, 3, seed=1, design_top=0.25, storage=open_storage("", tmp_path))
    run(opt, 60)
    again = Optimizer(space, 1, 9, 3, seed=1, design_top=0.25, storage=open_storage("", tmp_path))
    assert again._design_new == opt._design_new > 0
    run(again, 60)
    later = sorted((t for t in again.trials.values() if t.design), key=lambda t: t.trial)[again.n_explore :]
    starts = [t.start for t in later]
    assert starts.count(9) == len(starts) // 4 and set(starts) <= {1, 9}
    with pytest.raises(ConfigError, match="design_top"):
        Optimizer(space, design_top=1.5)
