"""The ask/tell optimiser: explore → focus → adapt, across jobs, with promotions that resume.

    opt = Optimizer(space, min_fidelity=1, max_fidelity=27, eta=3, seed=0)
    a = opt.ask()         # a.trial, a.params, a.fidelity (train to this many units in all),
                          # a.resume (the trial whose checkpoint it continues, or None)
    opt.tell(a.trial, {1: 0.41, 2: 0.33, 3: 0.30})   # the metric at each fidelity reached
    opt.fail(a.trial, "OUT_OF_MEMORY: …")            # it could not run: never promoted

- **Rungs** are the fidelities min·eta^k below the maximum, and the maximum: 1, 3, 9, 27.
- **Explore**: the first new trials are a quasi-random design (a Halton sequence with a
  seeded random shift) at the lowest rung.
- **Focus**: after that, new trials come from Optuna's TPE sampler fitted on every finished
  trial, ranked by the highest rung it reached and then by its value there (failed and
  diverged last): a region whose trials were cut early ranks below every trial promoted past
  it, so the search narrows where the results at the highest fidelities are good. (Fitting
  TPE on one rung's results alone — only the trials promoted into it — made the cut regions
  look good and the search worse than random: bench/README.md.)
- **Adapt — asynchronous successive halving**: before a new trial, `ask()` looks for a
  promotion, from the highest rung down: a trial in the best 1/eta of those that reached a
  rung (or the best one, while fewer than eta have), not yet promoted from it, continues
  (same trial, its own checkpoint) to the next rung. Nobody waits for a rung to fill.
- **Slow starters**: one new trial in `late_start` (4) starts at the second rung
  (asynchronous Hyperband's brackets), so a late bloomer is not judged on one epoch alone.
  Ranking by a trial's value projected from the slope of its curve (`projection`) is
  available but off: on the tabular benchmark it made the search slower.
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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from slurmagent.errors import ConfigError
from slurmagent.hpo.space import Space

log = logging.getLogger(__name__)

DIRECTIONS = ("minimize", "maximize")
# how much of a trial's projected improvement counts when ranking it at a rung (the default for
# Optimizer(projection=…)): 0, off — on the tabular benchmark 0.5 made the search slower than
# plain ASHA (bench/README.md), while starting every late_start-th trial higher did not
PROJECTION_DAMPING = 0.0


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
    params: dict[str, Any]
    curve: dict[int, float] = field(default_factory=dict)  # fidelity → metric (NaN: diverged)
    target: int = 0  # the fidelity it was last asked to reach
    promoted_from: set[int] = field(default_factory=set)  # rung indices it was promoted from
    failed: str = ""  # why it could not run (never promoted)
    running: bool = True  # asked and not told since

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
        min_fidelity: int = 1,
        max_fidelity: int = 27,
        eta: int = 3,
        seed: int = 0,
        direction: str = "minimize",
        storage: str | optuna.storages.BaseStorage | None = None,
        study_name: str = "slurmagent",
        n_explore: int | None = None,
        late_start: int = 4,
        projection: float | None = None,
    ) -> None:
        if direction not in DIRECTIONS:
            raise ConfigError(f"hpo.direction={direction!r} is not one of {', '.join(DIRECTIONS)}")
        if not 1 <= min_fidelity <= max_fidelity:
            raise ConfigError(f"hpo fidelity: need 1 ≤ min ({min_fidelity}) ≤ max ({max_fidelity})")
        if eta < 2:
            raise ConfigError(f"hpo.eta={eta}: the reduction factor must be at least 2")
        if not space.params:
            raise ConfigError("the search space is empty: sweep at least one parameter (interval, range, choice)")
        self.space = space
        self.eta = eta
        self.seed = seed
        self.sign = 1.0 if direction == "minimize" else -1.0  # internally, lower is better
        self.rungs = rungs(min_fidelity, max_fidelity, eta)
        self.n_explore = n_explore if n_explore is not None else max(6, 2 * len(space.params))
        self.late_start = late_start  # every late_start-th new trial starts at the second rung (0: never)
        self.projection = PROJECTION_DAMPING if projection is None else projection
        self.trials: dict[int, TrialInfo] = {}
        self._new = 0  # new trials asked so far (the exploration design's index)
        self._shift = np.random.default_rng(seed).random(len(space.params))  # the design's random shift
        self._focus_model: _RankModel | None = None  # TPE on every finished trial, refitted as results grow
        self._ranked: dict[int, list[tuple[float, int]]] = {}  # rung → (score, trial), sorted: promotion order
        self._in_rung: set[tuple[int, int]] = set()  # (trial, rung) already in _ranked
        self._ids: dict[int, int] = {}  # trial number → Optuna's trial id in the storage
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
        if promotion is not None:
            info, rung = promotion
            if self.rungs[rung + 1] - self.rungs[rung] <= max_cost:
                info.promoted_from.add(rung)
                info.target, info.running = self.rungs[rung + 1], True
                self._save_attrs(info)
                return Ask(info.trial, dict(info.params), info.target, info.trial, rung + 1)
        late = self.late_start and len(self.rungs) > 2 and self._new % self.late_start == self.late_start - 1
        start = 1 if late and self.rungs[1] <= max_cost else 0  # a late start that does not fit starts low
        if not new_trials or self.rungs[start] > max_cost:
            return None
        params = self._explore() if self._new < self.n_explore else self._focus()
        self._new += 1
        number = self._create(params, self.rungs[start])
        return Ask(number, params, self.rungs[start], None, start)

    def spent(self) -> int:
        """Fidelity units asked for so far, all trials together (a promotion adds only its difference)."""
        return sum(t.target for t in self.trials.values())

    def tell(self, trial: int, curve: Mapping[int, float]) -> None:
        """The metric at each fidelity the trial reached (all of them so far, or the new ones)."""
        info = self._info(trial)
        fresh = {int(k): float(v) for k, v in curve.items() if int(k) not in info.curve}
        info.curve.update(fresh)
        info.running = False
        otrial = optuna.trial.Trial(self.study, self._trial_id(trial))
        for step, value in sorted(fresh.items()):
            if math.isfinite(value):
                otrial.report(value, step)
        self._index(info)
        if info.diverged:
            self._finish(info, TrialState.FAIL, reason="diverged (NaN or inf)")
        elif info.reached >= self.rungs[-1]:
            self._finish(info, TrialState.COMPLETE)
        else:
            self._save_attrs(info)

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
        return min((t for t in ok if t.reached == top), key=lambda t: self.sign * t.curve[top])

    def rung_of(self, fidelity: int) -> int:
        return max(i for i, f in enumerate(self.rungs) if f <= fidelity) if fidelity >= self.rungs[0] else -1

    # -- promotions -------------------------------------------------------------------------
    def _promotion(self) -> tuple[TrialInfo, int] | None:
        for rung in range(len(self.rungs) - 2, -1, -1):
            fidelity = self.rungs[rung]
            ranked = self._ranked.get(rung, [])
            # the best 1/eta of those that reached the rung, and the best one from the first on
            # (as Optuna's successive halving: a full training comes early, a lone leader is not held)
            keep = max(1, len(ranked) // self.eta) if ranked else 0
            for _, number in ranked[:keep]:
                info = self.trials[number]
                free = not info.running and not info.failed and not info.diverged
                if free and rung not in info.promoted_from and info.reached == fidelity:  # not told past it
                    return info, rung
        return None

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
        if not math.isfinite(value) or rung + 1 >= len(self.rungs):
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
    def _explore(self) -> dict[str, Any]:
        u = (halton(self._new + 1, len(self.space.params)) + self._shift) % 1.0
        chosen: dict[str, Any] = {}
        for p, x in zip(self.space.params, u, strict=True):
            if p.active(chosen):
                chosen[p.name] = from_unit(p.distribution, float(x))
        return chosen

    def _focus(self) -> dict[str, Any]:
        """A new trial from TPE fitted on every finished trial, ranked by the highest rung it
        reached and its value there (failed and diverged last): a trial cut at a low rung
        counts as worse than every trial promoted past it, so the regions cut early look bad."""
        done = [t for t in self.trials.values() if not t.running and (t.curve or t.failed)]
        if len(done) < len(self.space.params) + 2:
            return self._explore()
        model = self._focus_model
        if model is None or len(done) - model.fitted >= max(1, model.fitted // 20):  # refit as results grow 5 %
            ranked = sorted(done, key=lambda t: (self._rank_key(t), t.trial))
            model = self._focus_model = _RankModel(self.space, self.seed * 1009 + len(self.trials), ranked)
        return model.sample()

    def _rank_key(self, info: TrialInfo) -> tuple[int, float]:
        if info.failed or info.diverged or not info.curve:
            return (1, 0.0)
        rung = self.rung_of(info.reached)
        fidelity = self.rungs[rung] if rung >= 0 else info.reached
        value = info.curve.get(fidelity, info.curve[info.reached])
        return (-rung, self.sign * value)

    # -- storage ----------------------------------------------------------------------------
    def _create(self, params: dict[str, Any], target: int) -> int:
        """A RUNNING trial with these parameters, written to the storage at once (no sampler,
        no scan of the study's waiting trials: constant time however long the study)."""
        template = optuna.trial.create_trial(
            state=TrialState.RUNNING, params=params, distributions=self.space.distributions(params)
        )
        storage = self.study._storage
        trial_id = storage.create_new_trial(self.study._study_id, template_trial=template)
        number = storage.get_trial_number_from_id(trial_id)
        info = TrialInfo(number, dict(params), target=target)
        self.trials[number] = info
        self._ids[number] = trial_id
        self._save_attrs(info)
        return number

    def _save_attrs(self, info: TrialInfo) -> None:
        storage, trial_id = self.study._storage, self._trial_id(info.trial)
        attrs = {"target": info.target, "promoted_from": sorted(info.promoted_from), "running": info.running}
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
                dict(ft.params),
                curve={int(k): float(v) for k, v in ft.intermediate_values.items()},
                target=int(attrs.get("target", 0)),
                promoted_from=set(attrs.get("promoted_from", [])),
                running=ft.state == TrialState.RUNNING and bool(attrs.get("running", True)),
            )
            if ft.state == TrialState.FAIL:
                reason = str(ft.user_attrs.get("slurmagent_reason", "failed"))
                if reason.startswith("diverged"):
                    info.curve[max(info.curve, default=0) + 1] = math.nan
                else:
                    info.failed = reason
            self.trials[ft.number] = info
            self._new += 1  # every trial was once a new one (the design's index goes on from here)
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

    def sample(self) -> dict[str, Any]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trial = self.study.ask()
            chosen: dict[str, Any] = {}
            for p in self.space.params:
                if p.active(chosen):
                    chosen[p.name] = _suggest(trial, p.name, p.distribution)
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
    """The value of `dist` at quantile-like position u ∈ [0, 1)."""
    if isinstance(dist, CategoricalDistribution):
        return dist.choices[min(int(u * len(dist.choices)), len(dist.choices) - 1)]
    if isinstance(dist, FloatDistribution | IntDistribution):
        low, high = float(dist.low), float(dist.high)
        x = math.exp(math.log(low) + u * (math.log(high) - math.log(low))) if dist.log else low + u * (high - low)
        if dist.step is not None and not dist.log:
            x = low + round((x - low) / dist.step) * dist.step
        x = min(max(x, low), high)
        return round(x) if isinstance(dist, IntDistribution) else float(x)
    raise ConfigError(f"unsupported distribution {dist!r}")


def rungs(min_fidelity: int, max_fidelity: int, eta: int) -> list[int]:
    """min·eta^k below the maximum, then the maximum: (1, 27, 3) → [1, 3, 9, 27]; (1, 20, 3) → [1, 3, 9, 20]."""
    out, f = [], min_fidelity
    while f < max_fidelity:
        out.append(f)
        f *= eta
    return [*out, max_fidelity]
