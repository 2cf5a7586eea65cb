"""The offline ask/tell core (slurmagent.hpo): the search-space grammar, determinism,
conditional parameters, diverged trials, promotions that resume, slow starters, and a study
continued from its journal file after the asker died."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from slurmagent.config.hpo import hpo_conf
from slurmagent.errors import ConfigError
from slurmagent.hpo.core import Optimizer, rungs
from slurmagent.hpo.space import Space
from slurmagent.hpo.storage import open_storage

SPACE = ["optim.lr=tag(log,interval(1e-4,1))", "model.width=choice(32,64,128,256)"]


def toy_curve(params: dict[str, object], upto: int, start: int = 1) -> dict[int, float]:
    """A learning curve: the best lr is 10^-2.5; lr > 0.5 diverges; wider is a little better."""
    lr, width = float(params["optim.lr"]), int(params.get("model.width", 64))  # type: ignore[call-overload]
    floor = abs(math.log10(lr) + 2.5) * 0.1 + 0.02 + 0.16 / width
    out: dict[int, float] = {}
    for epoch in range(start, upto + 1):
        out[epoch] = math.nan if lr > 0.5 else floor + 0.5 / (1 + epoch * lr * 100)
    return out


def run(opt: Optimizer, n: int) -> list[tuple[int, tuple[tuple[str, object], ...], int, int | None]]:
    asked = []
    for _ in range(n):
        a = opt.ask()
        asked.append((a.trial, tuple(sorted(a.params.items())), a.fidelity, a.resume))
        opt.tell(a.trial, toy_curve(a.params, a.fidelity))
    return asked


def test_the_grammar_of_hydras_optuna_sweeper() -> None:
    space = Space.from_overrides(
        [
            *SPACE,
            "model.depth=int(interval(1,4))",
            "train.batch=range(32,257,32)",
            "optim.name=adam",
            "+extra=choice(a,b)",
        ]
    )
    d = {p.name: p.distribution for p in space.params}
    assert d["optim.lr"] == FloatDistribution(1e-4, 1.0, log=True)
    assert d["model.width"] == CategoricalDistribution([32, 64, 128, 256])
    assert d["model.depth"] == IntDistribution(1, 4)
    assert d["train.batch"] == IntDistribution(32, 256, step=32)
    assert space.fixed == {"optim.name": "adam"}
    assert space.overrides({"optim.lr": 0.01, "extra": "b"}) == ["optim.name=adam", "optim.lr=0.01", "+extra=b"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optim.lr=interval(1,0.1)", "needs a low bound below its high bound"),
        ("optim.lr=tag(log,interval(0,1))", "needs a low bound above 0"),
        ("model.width=tag(log,choice(1,2))", "applies to interval and range, not to choice"),
        ("optim.lr=interval(", "search space:"),
    ],
)
def test_a_bad_space_is_refused_with_the_reason(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        Space.from_overrides([override])


def test_rungs() -> None:
    assert rungs(1, 27, 3) == [1, 3, 9, 27]
    assert rungs(1, 20, 3) == [1, 3, 9, 20]
    assert rungs(2, 2, 3) == [2]


def test_the_same_seed_asks_the_same_and_another_seed_does_not() -> None:
    space = Space.from_overrides(SPACE)
    first = run(Optimizer(space, 1, 27, 3, seed=7), 60)
    assert first == run(Optimizer(space, 1, 27, 3, seed=7), 60)
    assert first != run(Optimizer(space, 1, 27, 3, seed=8), 60)


def test_conditional_parameters_appear_only_when_their_condition_holds() -> None:
    space = Space.from_overrides(
        [*SPACE, "optim.name=choice(adam,sgd)", "optim.momentum=interval(0.5,0.99)"],
        {"optim.momentum": {"optim.name": ["sgd"]}},
    )
    opt = Optimizer(space, 1, 9, 3, seed=0)
    names = set()
    for _ in range(40):
        a = opt.ask()
        names.add(a.params["optim.name"])
        assert ("optim.momentum" in a.params) == (a.params["optim.name"] == "sgd"), a.params
        opt.tell(a.trial, toy_curve(a.params, a.fidelity))
    assert names == {"adam", "sgd"}
    with pytest.raises(ConfigError, match="not a parameter of the search space"):
        Space.from_overrides(SPACE, {"optim.momentum": {"optim.name": ["sgd"]}})


def test_promotions_continue_the_same_trial_from_its_checkpoint_and_only_the_best_third() -> None:
    opt = Optimizer(Space.from_overrides(SPACE), 1, 27, 3, seed=1, late_start=0)
    promoted = []
    for _ in range(40):
        a = opt.ask()
        if a.resume is not None:
            assert a.resume == a.trial and a.fidelity in (3, 9, 27)
            came_from = opt.rungs[a.rung - 1]
            assert opt.trials[a.trial].reached == came_from  # it continues from where it stopped
            # it was in the best third of those that reached that rung (or the best, while fewer than 3 had)
            at = sorted(opt._score(t, a.rung - 1) for t in opt.trials.values() if came_from in t.curve)
            rank = at.index(opt._score(opt.trials[a.trial], a.rung - 1))
            assert rank < max(1, len(at) // 3)
            promoted.append(a.trial)
        opt.tell(a.trial, toy_curve(a.params, a.fidelity, start=opt.trials[a.trial].reached + 1))
    at_1 = [t for t in opt.trials.values() if 1 in t.curve]
    at_3 = [t for t in opt.trials.values() if 3 in t.curve]
    assert promoted and len(at_3) < len(at_1) / 2
    best = opt.best()
    assert best is not None and best.reached == max(t.reached for t in opt.trials.values())


def test_a_diverged_trial_ranks_last_is_never_promoted_and_the_study_goes_on() -> None:
    opt = Optimizer(Space.from_overrides(["optim.lr=choice(0.9,0.001,0.003,0.01)"]), 1, 9, 3, seed=0, late_start=0)
    for _ in range(30):
        a = opt.ask()
        opt.tell(a.trial, toy_curve(a.params, a.fidelity, start=opt.trials[a.trial].reached + 1))
    diverged = [t for t in opt.trials.values() if t.params["optim.lr"] == 0.9]
    assert diverged and all(t.diverged and t.reached == 1 and not t.promoted_from for t in diverged)
    best = opt.best()
    assert best is not None and best.params["optim.lr"] != 0.9
    assert opt.study.trials[diverged[0].trial].state.name == "FAIL"


def test_a_failed_trial_is_never_promoted() -> None:
    opt = Optimizer(Space.from_overrides(SPACE), 1, 9, 3, seed=0, late_start=0)
    first = opt.ask()
    opt.fail(first.trial, "OUT_OF_MEMORY: host OOM, recovery gave up")
    for _ in range(20):
        a = opt.ask()
        assert a.trial != first.trial
        opt.tell(a.trial, toy_curve(a.params, a.fidelity, start=opt.trials[a.trial].reached + 1))
    assert opt.study.trials[first.trial].user_attrs["slurmagent_reason"].startswith("OUT_OF_MEMORY")


def test_a_slow_starter_still_improving_fast_ranks_above_a_flat_one() -> None:
    opt = Optimizer(Space.from_overrides(SPACE), 1, 27, 3, seed=0, projection=0.5)  # off by default
    flat, slow = opt.ask(), opt.ask()
    opt.tell(flat.trial, {1: 0.30, 2: 0.29, 3: 0.29})
    opt.tell(slow.trial, {1: 0.60, 2: 0.45, 3: 0.32})  # worse at 3 epochs, but falling steeply
    assert opt._score(opt.trials[slow.trial], 1) < opt._score(opt.trials[flat.trial], 1)
    assert opt._score(opt.trials[flat.trial], 1) == pytest.approx(0.29, abs=1e-3)  # never made worse


def test_a_study_continues_from_its_journal_after_the_asker_died(tmp_path: Path) -> None:
    space = Space.from_overrides(SPACE)
    opt = Optimizer(space, 1, 27, 3, seed=3, storage=open_storage("", tmp_path))
    run(opt, 25)
    in_flight = opt.ask()  # asked, never told: the asker dies here
    before = {n: (t.params, t.curve, t.target, t.promoted_from) for n, t in opt.trials.items()}
    again = Optimizer(space, 1, 27, 3, seed=3, storage=open_storage("", tmp_path))
    after = {n: (t.params, t.curve, t.target, t.promoted_from) for n, t in again.trials.items()}
    assert after == before  # no trial lost, every curve, target and promotion kept
    assert [a.trial for a in again.pending()] == [in_flight.trial]  # to run again (from its checkpoint)
    assert again.pending()[0].fidelity == in_flight.fidelity
    a = again.ask()
    assert a.trial not in {in_flight.trial} or a.resume == a.trial
    with pytest.raises(ConfigError, match="was started with"):
        Optimizer(space, 1, 9, 3, seed=3, storage=open_storage("", tmp_path))


def test_bad_settings_name_the_valid_ones() -> None:
    space = Space.from_overrides(SPACE)
    with pytest.raises(ConfigError, match="is not one of minimize, maximize"):
        Optimizer(space, direction="lowest")
    with pytest.raises(ConfigError, match="the search space is empty"):
        Optimizer(Space.from_overrides(["optim.lr=0.1"]))
    with pytest.raises(ConfigError, match=r"hpo\.storage='redis://x'"):
        open_storage("redis://x", ".")


def test_the_lowest_rung_is_a_tenth_of_a_full_training_unless_set() -> None:
    """Left unset, the first rung is a tenth of a full training, rounded down, at least one
    unit (bench/README.md: on mlp8 a late winner was cut after one epoch); set, it is obeyed."""
    space = Space.from_overrides(["x=interval(0.0,1.0)"])
    assert Optimizer(space, max_fidelity=20).rungs == [2, 6, 18, 20]
    assert Optimizer(space, max_fidelity=27).rungs == [2, 6, 18, 27]
    assert Optimizer(space, max_fidelity=9).rungs == [1, 3, 9]
    assert Optimizer(space, min_fidelity=1, max_fidelity=20).rungs == [1, 3, 9, 20]
    assert Optimizer(space, max_fidelity=20).ask().fidelity == 2
    budget = {"epochs": 10}
    assert hpo_conf({"budget": budget, "fidelity": {"max": 40}}).fidelity.lowest == 4
    assert hpo_conf({"budget": budget, "fidelity": {"max": 40, "min": 1}}).fidelity.lowest == 1
    for bad in ({"max": 9, "min": -1}, {"max": 9, "min": 10}, {"max": 0}):
        with pytest.raises(ConfigError, match=r"hpo\.fidelity: need eta ≥ 2 and 0 ≤ min ≤ max"):
            hpo_conf({"budget": budget, "fidelity": bad})


def test_a_study_continued_with_the_lowest_rung_unset_keeps_its_own(tmp_path: Path) -> None:
    """A study started from one unit (as every study was before the default moved to a tenth of
    the maximum) goes on from one unit when continued with the lowest rung left unset — a
    supervisor restarted after an upgrade neither refuses the study nor changes its rungs;
    a new study in the same storage gets the default."""
    space = Space.from_overrides(["x=interval(0.0,1.0)"])
    first = Optimizer(space, min_fidelity=1, max_fidelity=20, storage=open_storage("", tmp_path))
    a = first.ask()
    first.tell(a.trial, {1: 0.5})
    again = Optimizer(space, max_fidelity=20, storage=open_storage("", tmp_path))
    assert again.rungs == [1, 3, 9, 20] and again.trials[a.trial].curve == {1: 0.5}
    other = Optimizer(space, max_fidelity=20, storage=open_storage("", tmp_path), study_name="another")
    assert other.rungs == [2, 6, 18, 20]
    with pytest.raises(ConfigError, match="hpo fidelity"):
        Optimizer(space, min_fidelity=0, max_fidelity=20)
