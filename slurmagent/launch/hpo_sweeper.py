"""`hydra/sweeper=slurmagent_hpo`: an adaptive search instead of a grid.

    python -m slurmagent +experiment=digits_mlp hydra/sweeper=slurmagent_hpo -m \\
      'optim.lr=tag(log,interval(1e-4,1))' 'model.width=choice(32,64,128,256)' \\
      hpo.budget.epochs=600 hpo.max_parallel=6

The sweep's overrides are the search space (slurmagent/hpo/space.py); the `hpo` group says
what to optimise and within which budget. Everything is checked before anything is
submitted — the space, the hpo group, the fidelity key, every trial's job spec against the
cluster — then the sweep starts empty, the study's driver (supervise/study.py) asks its
first trials, and the launcher submits and supervises them as for any sweep (attached, or
detached with -d). Trials are tasks of the sweep; promotions are new attempts of them.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.errors import HydraException
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from slurmagent.commands import rerun_prefix, slurmagent_command
from slurmagent.config import HPO_STOP_AT, HPO_TRIAL, SPEC_GROUPS, HpoConf, config_error, hpo_conf, spec_key
from slurmagent.errors import ConfigError, TaskFailedError
from slurmagent.hpo.space import Space
from slurmagent.hpo.storage import describe
from slurmagent.job.task import run_task
from slurmagent.launch.launcher import ArrayLauncher
from slurmagent.launch.sweeper import SPEC_ROOTS
from slurmagent.supervise.state import SweepStore
from slurmagent.supervise.study import StudyDriver, StudySettings
from slurmagent.supervise.views import STUDY_BEST, load_trials, trials_by_state


class HpoSweeper(Sweeper):
    def __init__(self, **params: Any) -> None:
        params.pop("_target_", None)
        if params:
            raise ConfigError(
                f"hydra.sweeper: unknown option(s) {', '.join(sorted(params))}; the search's settings are the hpo "
                "group (hpo.objective, hpo.budget.*, hpo.fidelity.*, hpo.max_parallel, …)"
            )
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.launcher: Any = None
        self.task_function: TaskFunction | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    # -- checks -----------------------------------------------------------------------------
    def _array_launcher(self) -> ArrayLauncher:
        """The launcher's implementation, through the shim's public `array_launcher`."""
        impl = getattr(self.launcher, "array_launcher", None)
        if not isinstance(impl, ArrayLauncher):
            raise ConfigError(
                "hydra/sweeper=slurmagent_hpo runs its trials through slurmagent's launcher: use "
                f"hydra/launcher=slurmagent (python -m slurmagent's default), not {type(self.launcher).__name__}"
            )
        return impl

    def _conf(self) -> HpoConf:
        assert self.config is not None
        raw = OmegaConf.to_container(self.config.get("hpo") or {}, resolve=True)
        assert isinstance(raw, dict)
        conf = hpo_conf({str(k): v for k, v in raw.items()})
        if conf.stop_at or conf.trial != -1:
            raise ConfigError("hpo.stop_at and hpo.trial are set by the sweeper for each trial; leave them unset")
        if conf.budget.epochs and conf.budget.epochs < conf.fidelity.lowest:
            raise ConfigError(
                f"hpo.budget.epochs={conf.budget.epochs} is below one trial's first rung "
                f"({conf.fidelity.lowest}: hpo.fidelity.min={conf.fidelity.min}): nothing could run"
            )
        return conf

    @staticmethod
    def _space(arguments: Sequence[str], conf: HpoConf) -> Space:
        space = Space.from_overrides(arguments, conf.conditions)
        if not space.params:
            raise ConfigError(
                "no search space: sweep at least one key, e.g. 'optim.lr=tag(log,interval(1e-4,1))' or "
                "'model.width=choice(32,64,128)' (hydra/sweeper=slurmagent_hpo)"
            )
        for p in space.params:
            root = p.name.split(".", 1)[0]
            if "." in p.name and root in SPEC_ROOTS:
                raise ConfigError(
                    f"{p.key or p.name}: a search cannot sweep the job spec ({', '.join(SPEC_GROUPS)}, hydra): every "
                    "trial runs with one; sweep it with the grid sweeper (hydra/sweeper=slurmagent) instead"
                )
            if p.name.lstrip("+").startswith("hpo."):
                raise ConfigError(f"{p.name}: the hpo group configures the search; it cannot be searched")
        fid = conf.fidelity.key
        if fid in space.names or fid in {k.lstrip("+") for k in space.fixed}:
            raise ConfigError(f"{fid} is hpo.fidelity.key: the sweeper sets it (to hpo.fidelity.max) in every trial")
        return space

    def _trial_overrides(self, space: Space, params: dict[str, Any], conf: HpoConf) -> list[str]:
        return [
            *space.overrides(params),
            f"{conf.fidelity.key}={conf.fidelity.max}",
            f"{HPO_STOP_AT}=1",
            f"{HPO_TRIAL}=0",
        ]

    def _representatives(self, space: Space, conf: HpoConf) -> list[list[str]]:
        """One trial per value of each config-group choice (a group may change the job spec)."""
        first = {p.name: _first(p.distribution) for p in space.params}
        reps = [self._trial_overrides(space, first, conf)]
        for p in space.params:
            if "." not in p.name and hasattr(p.distribution, "choices"):
                for value in p.distribution.choices[1:]:
                    reps.append(self._trial_overrides(space, {**first, p.name: value}, conf))
        return reps

    def _check_fidelity_key(self, overrides: list[str], conf: HpoConf) -> None:
        assert self.config is not None and self.hydra_context is not None
        key = conf.fidelity.key
        own = [o for o in overrides if o.split("=", 1)[0] != key]  # the key as the experiment has it
        try:
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, own)
        except (HydraException, OmegaConfBaseException) as exc:
            why = config_error(exc) or exc
            raise ConfigError(f"{why} (a trial's overrides: {' '.join(own)}); nothing was submitted") from None
        value = OmegaConf.select(cfg, key, default=None)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(
                f"hpo.fidelity.key={key}: the experiment has {'no such key' if value is None else repr(value)}; it "
                "must be the integer that sets the training's length in epochs (train.epochs in digits_mlp, "
                "synthetic.epochs in the synthetic example); nothing was submitted"
            )

    def _command(self) -> list[str]:
        """How the search was started, as a person can run it again: the entry, the config flags."""
        return rerun_prefix(own_app=self.task_function is run_task)

    # -- the sweep --------------------------------------------------------------------------
    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None
        impl = self._array_launcher()
        conf = self._conf()
        space = self._space(arguments, conf)
        reps = self._representatives(space, conf)
        self._check_fidelity_key(reps[0], conf)
        # every trial's job spec, against the cluster, as one spec; errors: nothing submitted
        checked = impl.check(reps, one_spec=True)
        if len({spec_key(s) for s in checked.specs}) > 1:
            raise ConfigError(
                "the search space's config-group choices give trials different job specs (resources, checkpoint, "
                "recovery…); a search runs every trial with one spec: sweep those groups with the grid sweeper"
            )
        sweep_dir = checked.sweep_dir
        store = SweepStore(sweep_dir)
        if store.exists():
            raise ConfigError(
                f"{sweep_dir} already holds a sweep; continue it with: {slurmagent_command('watch', sweep_dir)}"
            )
        settings = StudySettings(dataclasses.asdict(conf), list(arguments), "", time.time(), self._command())
        driver = StudyDriver(sweep_dir, settings)  # opens the study's storage: a bad one stops here
        if driver.opt.trials:
            raise ConfigError(
                f"study {driver.opt.study.study_name!r} in hpo.storage already has {len(driver.opt.trials)} trial(s): "
                "continue its own sweep with slurmagent watch, or name a new study (hpo.study_name)"
            )
        store, _, ids = impl.open_sweep(checked, [], 0)
        driver.settings = dataclasses.replace(settings, spec_id=next(iter(ids.values())))
        driver.settings.write(sweep_dir)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        with store.edit() as state:
            driver.step(state)  # the first trials, WAITING
        checked.console.print(
            f"[slurmagent] search: {len(space.params)} parameter(s) ({', '.join(space.names)}), rungs "
            f"{driver.opt.rungs} of {conf.fidelity.key}, objective {conf.objective} ({conf.direction}), "
            f"at most {conf.max_parallel} trial(s) at once; study in {describe(conf.storage, sweep_dir)}",
            markup=False,
            highlight=False,
        )
        out = impl.submit_and_supervise(checked, store)
        if out is None:  # detached: the supervisor runs the study
            return None
        return self._summary(checked.console, sweep_dir)

    @staticmethod
    def _summary(console: Any, sweep_dir: Path) -> dict[str, Any]:
        trials = load_trials(sweep_dir) or {}
        best_path = sweep_dir / STUDY_BEST
        done = trials_by_state(trials.get("trials", []))
        lines = [f"search done: {done}, {trials.get('spent_epochs', 0)} epoch(s) asked"]
        if not best_path.exists():
            console.print("\n".join(f"[slurmagent] {line}" for line in lines), markup=False, highlight=False)
            raise TaskFailedError(
                f"no trial of the search produced a finite {trials.get('objective', 'objective')}; see "
                f"{slurmagent_command('results', sweep_dir)} and the trials' logs "
                f"({slurmagent_command('logs', sweep_dir)} N)"
            )
        best = json.loads(best_path.read_text())
        lines.append(
            f"best: trial {best['trial']}, {best['objective']}={best['value']:.6g} after {best['epochs']} epoch(s): "
            f"{' '.join(best['overrides'])}"
        )
        lines.append(f"run it again: {best['reproduce']}")
        lines.append(
            f"all trials: {slurmagent_command('results', sweep_dir, '--csv')}; "
            f"report: {slurmagent_command('report', sweep_dir)}"
        )
        console.print("\n".join(f"[slurmagent] {line}" for line in lines), markup=False, highlight=False)
        return dict(best)


def _first(dist: Any) -> Any:
    """A value inside an Optuna distribution (its low end, or its first choice)."""
    if hasattr(dist, "choices"):
        return dist.choices[0]
    return dist.low
