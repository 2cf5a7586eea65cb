"""The ask/tell optimiser: explore → focus → adapt, across jobs, with promotions that resume.

    opt = Optimizer(space, max_fidelity=27, eta=3, seed=0)  # min_fidelity: a tenth of it, 2
    a = opt.ask()         # a.trial, a.params, a.fidelity (train to this many units in all),
                          # a.resume (the trial whose checkpoint it continues, or None)
    opt.tell(a.trial, {1: 0.41, 2: 0.33})   # the metric at each fidelity reached
    opt.tell(a.trial, {1: 0.41, 2: 0.33}, params=ran)   # … and the parameters that actually ran
    opt.fail(a.trial, "OUT_OF_MEMORY: …")            # it could not run: never promoted
    opt.add(params, {1: 0.5, 2: 0.4})                # a result obtained elsewhere: evidence only

- **Rungs** are the fidelities min·eta^k below the maximum, and the maximum: 2, 6, 18, 27 (the
  lowest, `min_fidelity`, is by default a tenth of the maximum, at least 1: `lowest_rung`).
- **Explore**: the first new trials are a quasi-random design (a Halton sequence with a
  seeded random shift) at the lowest rung, and after them half of the new trials
  (`explore_share`, 1/2) still come from that design at the lowest rung, for the whole study (as
  ASHA samples at random throughout): a region the model wrote off early is looked at again.
  `design_top` (off) starts that share of those design trials at the top rung, as DEHB's
  full-budget bracket does; on mlp8's slow-starting best it did not reach random search's rate
  (bench/README.md), so it stays off.
- **Focus**: the other new trials come from Optuna's TPE sampler fitted on every finished
  trial, ranked by the highest rung it reached on merit and then by its value there (failed
  and diverged last): a region whose trials were cut early ranks below every trial promoted
  past it, so the search narrows where the results at the highest fidelities are good.
  (Fitting TPE on one rung's results alone — only the trials promoted into it — made the cut
  regions look good and the search worse than random: bench/README.md.)
- **Never the same configuration twice**: a proposal — from the model or the design — whose
  configuration, after the space's own rounding (`Space.key`), is already running or done,
  or which lies closer than a minimum distance to one (`Space.distance`), is not asked; the
  next candidate is taken (the model's, then the design's, then the farthest of them). The
  minimum distance is `spacing` × the typical nearest-neighbour distance of as many points
  spread uniformly over the space, so it shrinks only as trials accumulate, and never below
  the median distance between what was asked and what ran (`tell(…, params=)`: a user who
  snaps proposals to a table, for one, rounds more coarsely than the space).
- **Adapt — asynchronous successive halving** (ASHA, Li et al., MLSys 2020): before a new
  trial, `ask()` looks for a promotion, from the highest rung down: a trial in the best 1/eta
  of those that reached a rung (or the best one, while fewer than eta have), not yet promoted
  from it, continues (same trial, its own checkpoint) to the next rung. Nobody waits for a
  rung to fill.
- **Slow starters**: one model-proposed trial in `late_start` (4) starts at the second rung
  (the brackets of asynchronous Hyperband), so a configuration the model favours is not
  judged on one epoch alone; it counts as having reached that rung on merit only if its
  curve would have passed the rungs it skipped. Ranking by a trial's value projected from
  the slope of its curve (`projection`) is available but off: on the tabular benchmark it
  made the search slower.
- **Diverged** (NaN/inf) or failed trials rank last and are never promoted; the study goes on.

Deterministic given the seed and the order of tells. The study is an Optuna study in
`storage` (a journal file by default, `hpo/storage.py`); a new Optimizer on the same storage
continues it (a supervisor killed and restarted loses nothing).
"""

from __future__ import annotations

import bisect
import logging
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from slurmagent.config.hpo import lowest_rung
from slurmagent.errors import ConfigError
from slurmagent.hpo.space import Param, Space

log = logging.getLogger(__name__)

DIRECTIONS = ("minimize", "maximize")
# how much of a trial's projected improvement counts when ranking it at a rung (the default for
# Optimizer(projection=…)): 0, off — on the tabular benchmark 0.5 made the search slower than
# plain ASHA (bench/README.md), while starting every late_start-th trial higher did not
PROJECTION_DAMPING = 0.0
# the share of new trials after the first design that still come from the design, at the lowest rung:
# 1/2 (was 1/3: on the digits table, a benchmark it is tuned on, the exact best was found in 6 of 100
# replays against ASHA's 16; with 1/2, 16. Held out, cnn: 28 % with 1/3, 23 % with 1/2, ASHA 23 % —
# bench/README.md)
EXPLORE_SHARE = 1 / 2
# the minimum distance of a new configuration to every other, in nearest-neighbour distances
SPACING = 0.5
# the quantile of the distances between what was asked and what ran that a new configuration keeps
# from those taken (a user's own rounding: a proposal nearer than that to one runs as it)
MOVED_QUANTILE = 0.9
# the share of design trials after the first design that start at the top rung (trained to the end
# at once, as DEHB's full-budget bracket and random search: a slow starter is judged on its end)
DESIGN_TOP = 0.0
# model proposals tried before the design's next points are
MODEL_TRIES = 8
# design points tried before the farthest candidate is taken
DESIGN_TRIES = 32


def _started_from(storage: optuna.storages.BaseStorage, study_name: str, max_fidelity: int) -> int | None:
    """The lowest rung a study in `storage` was started with, for the same full training: a study
    continued with the lowest rung left unset goes on from its own (one started when the default
    was 1 goes on from 1). None: no such study."""
    try:
        attrs = storage.get_study_user_attrs(storage.get_study_id_from_name(study_name))
    except KeyError:
        return None
    known = attrs.get("slurmagent_settings") or {}
    same = known.get("max_fidelity") == max_fidelity and "min_fidelity" in known
    return int(known["min_fidelity"]) if same else None


def _turn(k: int, share: float) -> bool:
    """Whether the k-th (from 0) of a run of choices is one of `share` of them, spread evenly."""
    return math.floor((k + 1) * share) > math.floor(k * share)


@dataclass(frozen=True)
class Ask:
    trial: int  # the trial's id (its Optuna trial number)
    params: dict[str, Any]
    fidelity: int  # run the trial to this many fidelity units in all
    resume: int | None  # the trial whose checkpoint this continues (a promotion: the same trial)
    rung: int  # the index of `fidelity` among the rungs


@dataclass
class TrialInfo:
    trial: int
    params: dict[str, Any]  # what ran (as told), else what was asked
    curve: dict[int, float] = field(default_factory=dict)  # fidelity → metric (NaN: diverged)
    target: int = 0  # the fidelity it was last asked to reach
    promoted_from: set[int] = field(default_factory=set)  # rung indices it was promoted from
    failed: str = ""  # why it could not run (never promoted)
    running: bool = True  # asked and not told since
    start: int = 0  # the fidelity it was first asked to reach (0: unknown, a study from before)
    external: bool = False  # told with add(): evaluated elsewhere, evidence only, never promoted
    design: int = 0  # the design point it is (0: proposed by the model, or told with add())

    @property
    def reached(self) -> int:
        return max(self.curve, default=0)

    @property
    def diverged(self) -> bool:
        return any(not math.isfinite(v) for v in self.curve.values())


class Optimizer:
    def __init__(
        self,
        space: Space,
        min_fidelity: int | None = None,
        max_fidelity: int = 27,
        eta: int = 3,
        seed: int = 0,
        direction: str = "minimize",
        storage: str | optuna.storages.BaseStorage | None = None,
        study_name: str = "slurmagent",
        n_explore: int | None = None,
        late_start: int = 4,
        brackets: Sequence[float] | None = None,
        projection: float | None = None,
        explore_share: float = EXPLORE_SHARE,
        spacing: float = SPACING,
        endgame: bool = True,
        moved_quantile: float = MOVED_QUANTILE,
        design_top: float = DESIGN_TOP,
    ) -> None:
        if direction not in DIRECTIONS:
            raise ConfigError(f"hpo.direction={direction!r} is not one of {', '.join(DIRECTIONS)}")
        if not 1 <= (1 if min_fidelity is None else min_fidelity) <= max_fidelity:
            raise ConfigError(f"hpo fidelity: need 1 ≤ min ({min_fidelity}) ≤ max ({max_fidelity})")
        if eta < 2:
            raise ConfigError(f"hpo.eta={eta}: the reduction factor must be at least 2")
        if not space.params:
            raise ConfigError("the search space is empty: sweep at least one parameter (interval, range, choice)")
        if not 0 <= explore_share <= 1:
            raise ConfigError(f"explore_share={explore_share}: a share, between 0 and 1")
        if not 0 <= design_top <= 1:
            raise ConfigError(f"design_top={design_top}: a share, between 0 and 1")
        self.space = space
        self.eta = eta
        self.seed = seed
        self.sign = 1.0 if direction == "minimize" else -1.0  # internally, lower is better
        storage = optuna.storages.get_storage(storage)  # None: in memory
        if min_fidelity is None:
            min_fidelity = _started_from(storage, study_name, max_fidelity) or lowest_rung(max_fidelity)
        self.rungs = rungs(min_fidelity, max_fidelity, eta)
        self.n_explore = n_explore if n_explore is not None else max(6, 2 * len(space.params))
        self.late_start = late_start  # every late_start-th model trial starts at the second rung (0: never)
        if brackets is None:
            brackets = (1 - 1 / late_start, 1 / late_start) if late_start and len(self.rungs) > 2 else (1.0,)
        if not brackets or any(b < 0 for b in brackets) or sum(brackets) <= 0 or len(brackets) > len(self.rungs):
            raise ConfigError(f"brackets={list(brackets)}: shares (≥ 0) of model trials starting at each rung")
        self.brackets = [b / sum(brackets) for b in brackets]  # model trials starting at rung 0, 1, …
        self._brackets = [0] * len(self.brackets)  # … so far
        self.projection = PROJECTION_DAMPING if projection is None else projection
        self.explore_share = explore_share
        self.design_top = design_top  # the share of design trials after the first design that start at the top rung
        self._design_new = 0  # design trials after the first design so far
        self.spacing = spacing
        self.moved_quantile = moved_quantile
        self.endgame = endgame  # when the budget left cannot finish a new trial, finish stopped ones instead
        self.trials: dict[int, TrialInfo] = {}
        self._new = 0  # new trials asked so far
        self._focused = 0  # … of them proposed by the model
        self._design = 0  # design points used so far (the next is Halton point _design + 1)
        self._shift = np.random.default_rng(seed).random(len(space.params))  # the design's random shift
        self._focus_model: _RankModel | None = None  # TPE on every finished trial, refitted as results grow
        self._ranked: dict[int, list[tuple[float, int]]] = {}  # rung → (score, trial), sorted: promotion order
        self._in_rung: set[tuple[int, int]] = set()  # (trial, rung) already in _ranked
        self._ids: dict[int, int] = {}  # trial number → Optuna's trial id in the storage
        self._points = _Points(space)  # every trial's configuration: what is taken
        self._moved: list[float] = []  # distance between what was asked and what ran, per trial told with params
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.study = optuna.create_study(
            storage=storage,
            study_name=study_name,
            direction=optuna.study.StudyDirection.MINIMIZE if self.sign > 0 else optuna.study.StudyDirection.MAXIMIZE,
            load_if_exists=True,
            sampler=optuna.samplers.RandomSampler(seed=seed),  # only ever fills enqueued values
        )
        self._check_settings({"min_fidelity": min_fidelity, "max_fidelity": max_fidelity, "eta": eta, "seed": seed})
        self._load()

    # -- the interface ----------------------------------------------------------------------
    def ask(self) -> Ask:
        out = self.ask_within()
        assert out is not None  # new trials allowed, no cost bound: there is always one
        return out

    def ask_within(self, max_cost: float = math.inf, new_trials: bool = True) -> Ask | None:
        """`ask()` under a budget: a promotion whose added fidelity is at most `max_cost`,
        else (when `new_trials`) a new trial whose first rung is; None when neither fits."""
        promotion = self._promotion()
        if promotion is not None and self.rungs[promotion[1] + 1] - self.rungs[promotion[1]] > max_cost:
            promotion = None
        if promotion is None and self.endgame and max_cost < self.rungs[-1]:
            promotion = self._last_promotion(max_cost)
        if promotion is not None:
            info, rung = promotion
            info.promoted_from.add(rung)
            info.target, info.running = self.rungs[rung + 1], True
            self._save_attrs(info)
            return Ask(info.trial, dict(info.params), info.target, info.trial, rung + 1)
        if not new_trials or self.rungs[0] > max_cost:
            return None
        design = self._new < self.n_explore or self._design_turn()
        if design:
            params, index = self._from_design(), self._design
            start = 0  # the design explores at the lowest rung, for the whole study …
            if self._new >= self.n_explore:
                k, self._design_new = self._design_new, self._design_new + 1
                if _turn(k, self.design_top) and self.rungs[-1] <= max_cost:
                    start = len(self.rungs) - 1  # … and a share of it trains to the end at once
        else:
            params, index = self._focus(), 0
            start = self._bracket()
            while start and self.rungs[start] > max_cost:  # a late start that does not fit starts lower
                start -= 1
            self._brackets[start] += 1
            self._focused += 1
        self._new += 1
        number = self._create(params, self.rungs[start], design=index)
        return Ask(number, params, self.rungs[start], None, start)

    def spent(self) -> int:
        """Fidelity units asked for so far, all trials together (a promotion adds only its
        difference; a trial told with add() cost nothing here)."""
        return sum(t.target for t in self.trials.values() if not t.external)

    def tell(self, trial: int, curve: Mapping[int, float], params: Mapping[str, Any] | None = None) -> None:
        """The metric at each fidelity the trial reached (all of them so far, or the new ones).
        `params`: the parameters that actually ran, when they differ from those asked (snapped
        to a grid of your own, changed by hand); the model then learns from what ran, and a
        promotion continues with them. Given with the trial's first result only."""
        info = self._info(trial)
        if params is not None:
            ran = self.space.check(params)
            if ran != info.params:
                if info.curve or info.promoted_from:
                    raise ConfigError(
                        f"trial {trial}: its parameters can change with its first result only "
                        f"(it ran {info.params}, now told {ran})"
                    )
                self._moved.append(self.space.distance(info.params, ran))
                self._set_params(info, ran)
        fresh = {int(k): float(v) for k, v in curve.items() if int(k) not in info.curve}
        info.curve.update(fresh)
        info.running = False
        otrial = optuna.trial.Trial(self.study, self._trial_id(trial))
        for step, value in sorted(fresh.items()):
            if math.isfinite(value):
                otrial.report(value, step)
        self._index(info)
        self._settle(info)

    def add(self, params: Mapping[str, Any], curve: Mapping[int, float]) -> int:
        """A trial evaluated elsewhere (its parameters and its metric at each fidelity it
        reached): the model learns from it, `best()` counts it, it costs nothing in `spent()`,
        it is never asked again nor promoted (there is no checkpoint to continue). Its number."""
        ran = self.space.check(params)
        if not curve:
            raise ConfigError("add(): a curve with at least one fidelity's value is needed")
        number = self._create(ran, max(int(k) for k in curve), external=True)
        info = self.trials[number]
        info.curve.update({int(k): float(v) for k, v in curve.items()})
        info.running = False
        otrial = optuna.trial.Trial(self.study, self._trial_id(number))
        for step, value in sorted(info.curve.items()):
            if math.isfinite(value):
                otrial.report(value, step)
        self._index(info)
        self._settle(info)
        return number

    def fail(self, trial: int, reason: str) -> None:
        """The trial could not run (a crash, a cause recovery gave up on): ranked last, never promoted."""
        info = self._info(trial)
        info.failed, info.running = reason or "failed", False
        self._index(info)
        self._finish(info, TrialState.FAIL, reason=info.failed)

    def finish(self) -> None:
        """The study is over: trials stopped at a rung are marked PRUNED in the storage."""
        for info in self.trials.values():
            if not info.failed and not info.diverged and info.reached < self.rungs[-1]:
                self._finish(info, TrialState.PRUNED)

    def best(self) -> TrialInfo | None:
        """The best trial at the highest fidelity any trial reached."""
        ok = [t for t in self.trials.values() if t.curve and not t.diverged and not t.failed]
        if not ok:
            return None
        top = max(t.reached for t in ok)
        return min((t for t in ok if t.reached == top), key=lambda t: (self.sign * t.curve[top], t.trial))

    def rung_of(self, fidelity: int) -> int:
        return max(i for i, f in enumerate(self.rungs) if f <= fidelity) if fidelity >= self.rungs[0] else -1

    def _settle(self, info: TrialInfo) -> None:
        if info.diverged:
            self._finish(info, TrialState.FAIL, reason="diverged (NaN or inf)")
        elif info.reached >= self.rungs[-1]:
            self._finish(info, TrialState.COMPLETE)
        else:
            self._save_attrs(info)

    # -- promotions -------------------------------------------------------------------------
    def _promotion(self) -> tuple[TrialInfo, int] | None:
        for rung in range(len(self.rungs) - 2, -1, -1):
            fidelity = self.rungs[rung]
            ranked = self._ranked.get(rung, [])
            # the best 1/eta of those that reached the rung, and the best one from the first on
            # (as Optuna's successive halving: a full training comes early, a lone leader is not held)
            for _, number in ranked[: self._keep(rung)]:
                info = self.trials[number]
                free = not info.running and not info.failed and not info.diverged and not info.external
                if free and rung not in info.promoted_from and info.reached == fidelity:  # not told past it
                    return info, rung
        return None

    def _last_promotion(self, max_cost: float) -> tuple[TrialInfo, int] | None:
        """The budget left cannot take a new trial to the top rung: the best trial, highest rung
        first, that has stopped at a rung and can still be taken to the top within it — beyond
        the best 1/eta (a new trial now would end unfinished)."""
        for rung in range(len(self.rungs) - 2, -1, -1):
            if self.rungs[-1] - self.rungs[rung] > max_cost:
                continue
            for _, number in self._ranked.get(rung, []):
                info = self.trials[number]
                free = not info.running and not info.failed and not info.diverged and not info.external
                if free and rung not in info.promoted_from and info.reached == self.rungs[rung]:
                    return info, rung
        return None

    def _keep(self, rung: int) -> int:
        ranked = self._ranked.get(rung, [])
        return max(1, len(ranked) // self.eta) if ranked else 0

    def _index(self, info: TrialInfo) -> None:
        """Put the trial in the ranking of every rung it has reached (or failed on), once: its
        score there is fixed by then (the curve up to the rung)."""
        for rung, fidelity in enumerate(self.rungs[:-1]):
            if (info.trial, rung) in self._in_rung:
                continue
            if fidelity in info.curve or (info.failed and info.target == fidelity):  # failed on its way there
                self._in_rung.add((info.trial, rung))
                bisect.insort(self._ranked.setdefault(rung, []), (self._score(info, rung), info.trial))

    def _score(self, info: TrialInfo, rung: int) -> float:
        """Rank at `rung` (lower is better): the better of the value there and the value
        projected to the next rung from the curve's last slope, damped."""
        fidelity = self.rungs[rung]
        value = self._rung_value(info, fidelity)
        if not math.isfinite(value) or rung + 1 >= len(self.rungs) or not self.projection:
            return value
        steps = sorted(f for f in info.curve if f <= fidelity)
        if len(steps) < 2:
            return value
        prev, last = steps[-2], steps[-1]
        v0, v1 = self.sign * info.curve[prev], self.sign * info.curve[last]
        if not (math.isfinite(v0) and math.isfinite(v1)):
            return value
        slope = (v1 - v0) / (math.log(last) - math.log(prev))  # per log-unit of fidelity; < 0: improving
        projected = v1 + self.projection * slope * (math.log(self.rungs[rung + 1]) - math.log(last))
        return min(value, projected)

    def _rung_value(self, info: TrialInfo, fidelity: int) -> float:
        value = info.curve.get(fidelity, math.nan)
        return self.sign * value if math.isfinite(value) else math.inf

    # -- new trials -------------------------------------------------------------------------
    def _bracket(self) -> int:
        """The rung the next model trial starts at: the bracket furthest below its share
        (asynchronous Hyperband's brackets, in fixed shares; ties to the lower rung)."""
        total = sum(self._brackets) + 1
        return max(range(len(self.brackets)), key=lambda b: (self.brackets[b] * total - self._brackets[b], -b))

    def _design_turn(self) -> bool:
        """Whether the next new trial after the first design is a design point: explore_share
        of them, spread evenly."""
        return _turn(self._new - self.n_explore, self.explore_share)

    def _design_point(self, index: int) -> dict[str, Any]:
        u = (halton(index, len(self.space.params)) + self._shift) % 1.0
        return self.space.from_unit([float(x) for x in u])

    def _from_design(self, tried: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The design's next point that is a configuration no trial has, after the space's
        rounding, and far enough from every other; else the farthest of the points tried."""
        radius = self._radius()
        tried = tried if tried is not None else []
        for _ in range(DESIGN_TRIES):
            self._design += 1
            params = self._design_point(self._design)
            if self._points.novel(params, radius):
                return params
            tried.append(params)
        return self._points.farthest(tried)

    def _focus(self) -> dict[str, Any]:
        """A new trial from TPE fitted on every finished trial, ranked by the highest rung it
        reached on merit and its value there (failed and diverged last): a trial cut at a low
        rung counts as worse than every trial promoted past it, so the regions cut early look
        bad. A proposal that repeats a configuration (or lies too close to one) is passed over."""
        done = [t for t in self.trials.values() if not t.running and (t.curve or t.failed)]
        if len(done) < len(self.space.params) + 2:
            return self._from_design()
        model = self._focus_model
        if model is None or len(done) - model.fitted >= max(1, model.fitted // 20):  # refit as results grow 5 %
            ranked = sorted(done, key=lambda t: (self._rank_key(t), t.trial))
            model = self._focus_model = _RankModel(self.space, self.seed * 1009 + len(self.trials), ranked)
        radius = self._radius()
        tried: list[dict[str, Any]] = []
        for _ in range(MODEL_TRIES):
            params = model.sample()
            if self._points.novel(params, radius):
                return params
            tried.append(params)
            model.reject(params)  # a lie, as Optuna's constant liar tells of running trials: look elsewhere
        return self._from_design(tried)

    def _radius(self) -> float:
        """The minimum distance of a new configuration to those taken: `spacing` × the expected
        nearest-neighbour distance of as many uniform points (it shrinks as trials accumulate),
        at least the median distance between what was asked and what ran."""
        d = len(self.space.params)
        n = max(1, len(self.trials))
        ball = math.pi ** (d / 2) / math.gamma(d / 2 + 1)  # the unit ball's volume
        nearest = math.gamma(1 + 1 / d) * (ball * n) ** (-1 / d) / math.sqrt(d)  # in Space.distance's scale
        moved = float(np.quantile(self._moved, self.moved_quantile)) if self._moved else 0.0
        return float(max(self.spacing * nearest, moved))

    def _rank_key(self, info: TrialInfo) -> tuple[int, float]:
        if info.failed or info.diverged or not info.curve:
            return (1, 0.0)
        rung = self._merit_rung(info)
        fidelity = self.rungs[rung] if rung >= 0 else info.reached
        value = info.curve.get(fidelity, info.curve[info.reached])
        return (-rung, self.sign * value)

    def _merit_rung(self, info: TrialInfo) -> int:
        """The highest rung the trial reached, unless it started above a rung its curve would
        not have passed (the best 1/eta there): then that rung."""
        top = self.rung_of(info.reached)
        for rung in range(max(0, min(self.rung_of(info.start), top))):
            ranked = self._ranked.get(rung, [])
            score = self._score(info, rung)
            if math.isfinite(score) and bisect.bisect_left(ranked, (score, -1)) >= self._keep(rung):
                return rung
        return top

    def _set_params(self, info: TrialInfo, params: dict[str, Any]) -> None:
        """What ran replaces what was asked: in the trial, the taken points and the storage (each
        parameter that ran, and the whole set in the user attribute `slurmagent_params`)."""
        self._points.add(info.trial, params)  # what was asked stays taken too: a proposal near it would run as this
        info.params = dict(params)
        storage, trial_id = self.study._storage, self._trial_id(info.trial)
        dists = self.space.distributions(params)
        for name, value in params.items():
            storage.set_trial_param(trial_id, name, dists[name].to_internal_repr(value), dists[name])
        storage.set_trial_user_attr(trial_id, "slurmagent_params", dict(params))

    # -- storage ----------------------------------------------------------------------------
    def _create(self, params: dict[str, Any], target: int, design: int = 0, external: bool = False) -> int:
        """A RUNNING trial with these parameters, written to the storage at once (no sampler,
        no scan of the study's waiting trials: constant time however long the study)."""
        template = optuna.trial.create_trial(
            state=TrialState.RUNNING, params=params, distributions=self.space.distributions(params)
        )
        storage = self.study._storage
        trial_id = storage.create_new_trial(self.study._study_id, template_trial=template)
        number = storage.get_trial_number_from_id(trial_id)
        info = TrialInfo(number, dict(params), target=target, start=target, external=external, design=design)
        self.trials[number] = info
        self._ids[number] = trial_id
        self._points.add(number, params)
        self._save_attrs(info)
        return number

    def _save_attrs(self, info: TrialInfo) -> None:
        storage, trial_id = self.study._storage, self._trial_id(info.trial)
        attrs: dict[str, Any] = {
            "target": info.target,
            "promoted_from": sorted(info.promoted_from),
            "running": info.running,
            "start": info.start,
        }
        if info.external:
            attrs["external"] = True
        if info.design:
            attrs["design"] = info.design  # the design goes on from there after a restart
        storage.set_trial_user_attr(trial_id, "slurmagent", attrs)

    def _finish(self, info: TrialInfo, state: TrialState, reason: str = "") -> None:
        self._save_attrs(info)
        trial_id = self._trial_id(info.trial)
        storage = self.study._storage
        if reason:
            storage.set_trial_user_attr(trial_id, "slurmagent_reason", reason)
        if storage.get_trial(trial_id).state.is_finished():
            return
        values = [info.curve[info.reached]] if state == TrialState.COMPLETE else None
        storage.set_trial_state_values(trial_id, state, values)

    def _trial_id(self, number: int) -> int:
        return self._ids[number]

    def _info(self, trial: int) -> TrialInfo:
        if trial not in self.trials:
            raise ConfigError(f"trial {trial} is not a trial of this study")
        return self.trials[trial]

    def _check_settings(self, settings: dict[str, Any]) -> None:
        known = self.study.user_attrs.get("slurmagent_settings")
        if known is None:
            self.study.set_user_attr("slurmagent_settings", settings)
            self.study.set_user_attr("slurmagent_space", self.space.names)
        elif known != settings or self.study.user_attrs.get("slurmagent_space") != self.space.names:
            raise ConfigError(
                f"study {self.study.study_name!r} in this storage was started with {known} and parameters "
                f"{self.study.user_attrs.get('slurmagent_space')}; this run asks {settings} and {self.space.names}: "
                "use another study (hpo.study_name) or the same settings"
            )

    def _load(self) -> None:
        """Continue a study from its storage: every trial, its curve, targets and promotions."""
        for ft in self.study.get_trials(deepcopy=False):
            self._ids[ft.number] = ft._trial_id
            attrs = ft.user_attrs.get("slurmagent", {})
            info = TrialInfo(
                ft.number,
                dict(ft.user_attrs.get("slurmagent_params", ft.params)),
                curve={int(k): float(v) for k, v in ft.intermediate_values.items()},
                target=int(attrs.get("target", 0)),
                promoted_from=set(attrs.get("promoted_from", [])),
                running=ft.state == TrialState.RUNNING and bool(attrs.get("running", True)),
                start=int(attrs.get("start", 0)),
                external=bool(attrs.get("external", False)),
                design=int(attrs.get("design", 0)),
            )
            if ft.state == TrialState.FAIL:
                reason = str(ft.user_attrs.get("slurmagent_reason", "failed"))
                if reason.startswith("diverged"):  # NaN is never reported: NaN from the last finite value on
                    for f in range(
                        max(info.curve, default=0) + 1, max(info.target, max(info.curve, default=0) + 1) + 1
                    ):
                        info.curve[f] = math.nan
                else:
                    info.failed = reason
            self.trials[ft.number] = info
            self._points.add(ft.number, info.params)
            if not info.external:
                self._new += 1  # every trial was once a new one
                if info.design and self._new > self.n_explore:
                    self._design_new += 1
                if not info.design:
                    self._focused += 1
                    self._brackets[min(max(0, self.rung_of(info.start)), len(self._brackets) - 1)] += 1
            self._design = max(self._design, info.design)
            self._index(info)
        # a trial asked but never told (the asker died) runs again from its checkpoint: the driver re-asks it
        if self.trials:
            log.info("continuing study %s: %d trial(s)", self.study.study_name, len(self.trials))

    def pending(self) -> list[Ask]:
        """Trials asked and not told yet (after a restart: those to run again, from their checkpoints)."""
        out = []
        for info in sorted(self.trials.values(), key=lambda t: t.trial):
            if info.running and not info.failed:
                rung = self.rung_of(info.target)
                out.append(Ask(info.trial, dict(info.params), info.target, info.trial if info.curve else None, rung))
        return out


class _Points:
    """The configurations taken (every trial's, after the space's rounding; for a trial told
    the parameters that ran, both those and the ones asked), for "is this one new, and far
    enough from all of them?" in one vectorised pass."""

    def __init__(self, space: Space) -> None:
        self.space = space
        self.keys: dict[tuple[tuple[str, Any], ...], set[int]] = {}
        self.coords = np.zeros((0, len(space.params)))
        self.n = 0
        self.choice = np.array([isinstance(p.distribution, CategoricalDistribution) for p in space.params])
        self.every: list[dict[str, Any]] | None = None  # a finite space's configurations, once needed

    def encode(self, params: dict[str, Any]) -> np.ndarray:
        """Each parameter's position in [0, 1] (a choice: its index), NaN where it is inactive."""
        out = np.full(len(self.space.params), np.nan)
        snapped = self.space.snap(params)
        for j, p in enumerate(self.space.params):
            if p.name in snapped:
                out[j] = _position(p, snapped[p.name])
        return out

    def add(self, trial: int, params: dict[str, Any]) -> None:
        self.keys.setdefault(self.space.key(params), set()).add(trial)
        if self.n == len(self.coords):
            self.coords = np.vstack([self.coords, np.zeros((max(16, self.n), len(self.space.params)))])
        self.coords[self.n] = self.encode(params)
        self.n += 1

    def distances(self, params: dict[str, Any]) -> np.ndarray:
        """Space.distance from `params` to every configuration taken."""
        x, taken = self.encode(params), self.coords[: self.n]
        missing_x, missing = np.isnan(x), np.isnan(taken)
        diff = np.where(self.choice, (taken != x).astype(float), (taken - x) ** 2)
        diff = np.where(missing_x | missing, (missing_x != missing).astype(float), diff)
        result: np.ndarray = np.sqrt(diff.mean(axis=1))
        return result

    def novel(self, params: dict[str, Any], radius: float) -> bool:
        if self.keys.get(self.space.key(params)):
            return False
        return self.n == 0 or float(self.distances(params).min()) >= radius

    def farthest(self, candidates: list[dict[str, Any]]) -> dict[str, Any]:
        """The candidate farthest from every configuration taken (a new key before a repeated
        one); when all of them repeat one and the space is finite, its farthest configuration
        that no trial has, while there is one."""

        def reach(params: dict[str, Any]) -> tuple[bool, float]:
            near = float(self.distances(params).min()) if self.n else math.inf
            return (not self.keys.get(self.space.key(params)), near)

        best = max(candidates, key=reach)
        if not self.keys.get(self.space.key(best)):
            return best
        if self.every is None:
            self.every = self.space.configurations() or []
        free = [c for c in self.every if not self.keys.get(self.space.key(c))]
        return max(free, key=reach) if free else best


def _position(p: Param, value: Any) -> float:
    if isinstance(p.distribution, CategoricalDistribution):
        return float(p.distribution.choices.index(value))
    return p.unit(value)


class _RankModel:
    """TPE fitted on finished trials in rank order (best first): an in-memory Optuna study whose
    values are the ranks. At most MAX_MODEL trials, taken evenly along the ranking."""

    MAX_MODEL = 1000

    def __init__(self, space: Space, seed: int, ranked: list[TrialInfo]) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, n_startup_trials=0)
        self.space = space
        self.fitted = len(ranked)
        self.study = optuna.create_study(sampler=sampler)
        step = max(1, math.ceil(len(ranked) / self.MAX_MODEL))
        for rank, info in list(enumerate(ranked))[::step]:
            self.study.add_trial(
                optuna.trial.create_trial(
                    params=dict(info.params), distributions=self.space.distributions(info.params), value=float(rank)
                )
            )

    def reject(self, params: dict[str, Any]) -> None:
        """`params` count as the worst result from now on (the next samples move away)."""
        self.study.add_trial(
            optuna.trial.create_trial(
                params=dict(params), distributions=self.space.distributions(params), value=float(self.fitted)
            )
        )

    def sample(self) -> dict[str, Any]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trial = self.study.ask()
            chosen: dict[str, Any] = {}
            for p in self.space.params:
                if p.active(chosen):
                    chosen[p.name] = p.snap(_suggest(trial, p.name, p.distribution))
            self.study.tell(trial, state=TrialState.FAIL)  # a probe, not an observation
        return chosen


def _suggest(trial: optuna.trial.Trial, name: str, dist: BaseDistribution) -> Any:
    if isinstance(dist, FloatDistribution):
        return trial.suggest_float(name, dist.low, dist.high, log=dist.log, step=dist.step)
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, log=dist.log, step=dist.step)
    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(name, dist.choices)
    raise ConfigError(f"{name}: unsupported distribution {dist!r}")


# -- the exploration design ----------------------------------------------------------------------
_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97)


def halton(index: int, dims: int) -> np.ndarray:
    """Point `index` (≥ 1) of the Halton sequence in [0, 1)^dims."""
    if dims > len(_PRIMES):
        raise ConfigError(f"the exploration design supports up to {len(_PRIMES)} parameters, not {dims}")
    out = np.empty(dims)
    for d in range(dims):
        base, f, r, i = _PRIMES[d], 1.0, 0.0, index
        while i > 0:
            f /= base
            r += f * (i % base)
            i //= base
        out[d] = r
    return out


def from_unit(dist: BaseDistribution, u: float) -> Any:
    """The value of `dist` at position u ∈ [0, 1) of a uniform draw (Param.from_unit: every
    value of a finite distribution over an equal share of [0, 1))."""
    return Param("", dist).from_unit(u)


def rungs(min_fidelity: int, max_fidelity: int, eta: int) -> list[int]:
    """min·eta^k below the maximum, then the maximum: (1, 27, 3) → [1, 3, 9, 27]; (1, 20, 3) → [1, 3, 9, 20]."""
    out, f = [], min_fidelity
    while f < max_fidelity:
        out.append(f)
        f *= eta
    return [*out, max_fidelity]
