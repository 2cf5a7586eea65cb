"""The slurmagent Hydra launcher: a sweep becomes job arrays, supervised to the end.

1. Parse and validate every task's job spec (composing only the distinct override sets
   that can change it) and check it against the cluster. Any error: nothing is submitted.
2. Pickle the sweep context once; submit each group of tasks that share resources as one
   submitit job array (split at the cluster's MaxArraySize, throttled with %N if asked).
3. Record the sweep in sweep.json, then supervise with one status query per poll.
4. Return Hydra JobReturns carrying each task's return value, like Hydra's own launchers.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, overload

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, setup_globals
from hydra.errors import HydraException
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException
from rich.console import Console

from slurmagent.commands import slurmagent_command
from slurmagent.config import (
    JobSpec,
    LauncherConf,
    NotifyConf,
    SiteConf,
    adapt_conf,
    auto_keys,
    budget_conf,
    code_conf,
    config_error,
    job_spec,
    notify_conf,
    parse_conf,
    site_conf,
    spec_dict,
    spec_key,
    track_conf,
    validate_launcher,
)
from slurmagent.errors import ConfigError, SweepRefusedError, TaskFailedError
from slurmagent.job.runner import write_context
from slurmagent.job.task import run_task
from slurmagent.launch.backend import SubmititSubmitter, resolve_backend
from slurmagent.launch.index import record_sweep
from slurmagent.launch.probe import check_environments, probe_mode
from slurmagent.launch.snapshot import SnapshotPlan, plan_snapshot, wanted, write_snapshot
from slurmagent.launch.sweeper import spec_relevant
from slurmagent.primitives.backends import Backend
from slurmagent.primitives.code import read_snapshot
from slurmagent.primitives.env import check_checkpoint_dir
from slurmagent.primitives.signals import InterruptAtSleep
from slurmagent.records import Action
from slurmagent.safety.audit import AuditLog
from slurmagent.safety.gate import Gate
from slurmagent.safety.paths import SWEEP_AUDIT, current_user
from slurmagent.safety.policy import Policy, resolve_policy
from slurmagent.slurm.cluster import DEFAULT_MAX_ARRAY_SIZE, ClusterInfo, check_fits
from slurmagent.slurm.sbatch import safe_job_name
from slurmagent.slurm.seam import SlurmCLI
from slurmagent.supervise.control import cancel_sweep
from slurmagent.supervise.detach import follow_commands, start_detached, supervisor_resources
from slurmagent.supervise.state import SweepState, SweepStore, TaskRecord
from slurmagent.supervise.submission import WAITING, submit_waiting
from slurmagent.supervise.supervisor import Supervisor
from slurmagent.supervise.views import sweep_table, terminal

log = logging.getLogger(__name__)


def check_importable(target: str) -> None:
    """`task.target`'s module must import where the jobs will import it: submitit starts each
    job as `python -m submitit.core._submit` in this directory, with this environment, so the
    check runs exactly that way (a child process), before anything is submitted."""
    import subprocess
    import sys

    module = target.partition(":")[0]
    probe = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({module!r}) else 3)"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode == 0:
        return
    why = (proc.stderr.strip().splitlines() or ["not found"])[-1]
    path = os.environ.get("PYTHONPATH")
    raise ConfigError(
        f"task.target={target!r}: the jobs could not import module {module!r} ({why}); they start in "
        f"{os.getcwd()} with PYTHONPATH={path or '(unset)'}: run from the directory that holds {module}.py (or "
        "its package), add that directory to PYTHONPATH, or pip install your project; nothing was submitted"
    )


@dataclass(frozen=True)
class Checked:
    """A sweep that passed every check: nothing submitted yet."""

    conf: LauncherConf
    console: Console
    sweep_dir: Path
    specs: list[JobSpec]
    backend: Backend
    max_array: int
    schedule: dict[str, Any] = dataclasses.field(default_factory=dict)  # SweepState.schedule
    urgent: bool = False  # resources.priority=urgent, allowed by the policy: recorded through the gate
    code: SnapshotPlan | None = None  # the code snapshot to take (code.snapshot), checked: None for none
    notify: NotifyConf = dataclasses.field(default_factory=NotifyConf)  # who is told what happens (notify.*)


def _distinct(specs: Sequence[JobSpec]) -> list[JobSpec]:
    """The distinct spec objects of a sweep (its tasks share a few: see `ArrayLauncher._specs`)."""
    return list({id(s): s for s in specs}.values())


def _as_list(overrides: Sequence[str]) -> list[str]:
    """A task's overrides as a list: Hydra's own list (never changed), not a copy per task."""
    return overrides if isinstance(overrides, list) else list(overrides)


class DetachedReturns(Sequence[JobReturn]):
    """What Hydra gets for the tasks of a detached sweep: each submitted, its result to come.
    Made when Hydra asks for one, not one object per task held for the sweep's size."""

    def __init__(self, records: list[TaskRecord]) -> None:
        self._records = records
        self._cfg = OmegaConf.create({})

    def __len__(self) -> int:
        return len(self._records)

    @overload
    def __getitem__(self, i: int) -> JobReturn: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[JobReturn]: ...

    def __getitem__(self, i: int | slice) -> JobReturn | Sequence[JobReturn]:
        if isinstance(i, slice):
            return [self._one(r) for r in self._records[i]]
        return self._one(self._records[i])

    def _one(self, task: TaskRecord) -> JobReturn:
        ret = JobReturn(overrides=task.overrides, status=JobStatus.COMPLETED)
        ret.cfg = self._cfg
        ret.return_value = None
        return ret


class ArrayLauncher:
    """What `hydra/launcher=slurmagent` runs (the Hydra plugin class is a thin shim in
    hydra_plugins/slurmagent_launcher that imports this when a sweep is launched)."""

    def __init__(self, **params: Any) -> None:
        params.pop("_target_", None)
        self.params = params
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None
        self.slurm = SlurmCLI()

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    # -- step 1: specs ---------------------------------------------------------
    def _specs(self, job_overrides: Sequence[Sequence[str]]) -> list[JobSpec]:
        assert self.config is not None and self.hydra_context is not None
        cache: dict[tuple[str, ...], JobSpec] = {}
        specs: list[JobSpec] = []
        for overrides in job_overrides:
            # the spec's keys, and the in-loop controller's (checked here: its ranges fail on the node otherwise)
            key = tuple(o for o in overrides if spec_relevant(o) or o.lstrip("+~").startswith(("adapt.", "track.")))
            if key not in cache:
                try:
                    cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(key))
                    # a user's own Hydra app brings its own task function: no `task` needed
                    cache[key] = job_spec(spec_dict(cfg), require_task=self.task_function is run_task)
                    if cfg.get("adapt") is not None:
                        adapt = OmegaConf.to_container(cfg.adapt, resolve=True)
                        adapt_conf({str(k): v for k, v in adapt.items()} if isinstance(adapt, dict) else None)
                    # the trackers' settings, and their libraries installed: checked before anything is submitted
                    track_conf(spec_dict(cfg, ("track",)).get("track"), check_installed=True)
                except (ConfigError, HydraException, OmegaConfBaseException) as exc:
                    why = exc if isinstance(exc, ConfigError) else (config_error(exc) or exc)
                    raise ConfigError(
                        f"{why} (task overrides: {' '.join(overrides) or 'none'}); nothing was submitted"
                    ) from None
            specs.append(cache[key])
        return specs

    # -- step 1: check everything; step 2: the sweep on disk (HPO's sweeper uses both) ------
    def check(self, job_overrides: Sequence[Sequence[str]], one_spec: bool = False) -> Checked:
        """Compose and validate every task's spec and check it against the cluster. Any error:
        a ConfigError, nothing submitted."""
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        console = terminal(stderr=True)
        conf = parse_conf(LauncherConf, {k: v for k, v in self.params.items()}, "hydra.launcher")
        validate_launcher(conf)
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).absolute()
        specs = self._specs(job_overrides)
        # config_validator skill: keys/ranges, experience rules, GPU memory; errors → nothing submitted
        from slurmagent.skills.config_validator import validate_sweep

        for warning in validate_sweep(
            lambda ov: self.hydra_context.config_loader.load_sweep_config(self.config, ov),  # type: ignore[union-attr,arg-type]
            job_overrides,
            memory=any(s.resources.gpus > 0 for s in specs),
        ):
            console.print(f"[slurmagent] warning: {warning}", markup=False, highlight=False)
        for target in sorted({s.task.target for s in specs if s.task.target}):
            check_importable(target)
        for ckpt in sorted({s.checkpoint.dir for s in specs if s.checkpoint.dir}):
            try:
                check_checkpoint_dir(ckpt)
            except ConfigError as exc:
                raise ConfigError(f"{exc}; nothing was submitted") from None
        try:  # the policy every automated action of this sweep will be decided by: broken → refuse now
            policy = resolve_policy(sweep_dir)
        except ConfigError as exc:
            raise ConfigError(f"{exc}; nothing was submitted") from None
        choices = {s.cluster for s in specs}
        if len(choices) > 1:
            raise ConfigError(
                f"cluster differs between tasks of one sweep ({', '.join(sorted(choices))}); sweep it separately"
            )
        probe = probe_mode(self.config.get("probe", "auto"))
        backend = resolve_backend(specs[0].cluster, self.slurm)
        max_array = conf.max_array_size
        info = ClusterInfo.query(self.slurm) if backend.queued else None
        urgent = any(s.resources.priority == "urgent" for s in specs)
        if urgent:
            self._may_use_urgent(policy, sweep_dir)
        try:
            specs, schedule = self._schedule(job_overrides, specs, info, one_spec)
        except ConfigError as exc:
            raise type(exc)(
                f"{exc}{'' if 'nothing was submitted' in str(exc) else '; nothing was submitted'}"
            ) from None
        if info is not None:
            for spec in {spec_key(s.resources): s for s in _distinct(specs)}.values():
                try:
                    check_fits(spec.resources, info)
                except ConfigError as exc:
                    raise ConfigError(f"{exc}; nothing was submitted") from None
            max_array = max_array or info.max_array_size
            for out in check_environments(_distinct(specs), probe, sys.executable, self.slurm, self._job_name()):
                console.print(f"[slurmagent] {out.describe()}", markup=False, highlight=False)
            if conf.detach and conf.supervisor != "process":
                try:
                    check_fits(supervisor_resources(conf, specs[0].resources.account), info)
                except ConfigError as exc:
                    raise ConfigError(f"the sweep's supervisor job: {exc}; nothing was submitted") from None
        elif conf.supervisor == "job":
            raise ConfigError(
                "hydra.launcher.supervisor=job needs Slurm, and this sweep runs locally; use supervisor=process "
                "(or auto); nothing was submitted"
            )
        else:
            for spec in specs:
                if spec.resources.nodes > 1:
                    raise ConfigError(
                        f"resources.nodes={spec.resources.nodes}: the local backend runs on one machine; use a Slurm "
                        "cluster for multi-node jobs; nothing was submitted"
                    )
                if spec.env.setup:
                    raise ConfigError(
                        f"env.setup={spec.env.setup!r}: setup lines run in a Slurm job's batch script, and the local "
                        "backend has none (it runs no shell); set up this shell before launching, or use env.vars and "
                        "env.python, which the local backend honours; nothing was submitted"
                    )
                if spec.env.container.image:
                    raise ConfigError(
                        f"env.container.image={spec.env.container.image!r}: containers run on Slurm (the runtime wraps "
                        "the job's step); the local backend runs the launcher's own Python; use cluster=slurm, or "
                        "run this launcher inside the image; nothing was submitted"
                    )
        max_array = max_array or DEFAULT_MAX_ARRAY_SIZE
        try:  # who is told (notify.*): its channels, and their secrets readable here, before submitting
            notify = notify_conf(spec_dict(self.config, ("notify",)).get("notify"), check_secrets=True)
        except ConfigError as exc:
            raise ConfigError(f"{exc}; nothing was submitted") from None
        code = code_conf(spec_dict(self.config, ("code",)).get("code"))
        # the files and their size checked now; copied when the sweep is opened (once: a batch adds none)
        snap = (
            plan_snapshot(Path.cwd(), sweep_dir, code)
            if wanted(code, backend) and not read_snapshot(sweep_dir)
            else None
        )
        return Checked(conf, console, sweep_dir, specs, backend, max_array, schedule, urgent, snap, notify)

    # -- resource scheduling: auto values, priority, budget (slurmagent/schedule/) ----------
    def _site(self) -> SiteConf:
        assert self.config is not None
        return site_conf(spec_dict(self.config, ("site",)).get("site"))

    def _may_use_urgent(self, policy: Policy, sweep_dir: Path) -> None:
        """resources.priority=urgent is a rule of the sweep's policy (action priority_urgent)."""
        decision = policy.decide(self._urgent_action(sweep_dir))
        if decision.verdict != "allow":
            raise ConfigError(
                f"resources.priority=urgent is not allowed for user {current_user()!r} by the policy (rule "
                f"{decision.rule or 'none matched'}: {decision.verdict}); valid priorities for you: normal, "
                "background; nothing was submitted"
            )

    @staticmethod
    def _urgent_action(sweep_dir: Path) -> Action:
        return Action(
            kind="priority_urgent",
            target=str(sweep_dir),
            reason="the sweep asks for resources.priority=urgent",
            context={"user": current_user(), "source": "launcher"},
        )

    def _schedule(
        self,
        job_overrides: Sequence[Sequence[str]],
        specs: list[JobSpec],
        info: ClusterInfo | None,
        one_spec: bool = False,
    ) -> tuple[list[JobSpec], dict[str, Any]]:
        """Each task's spec with its auto values and priority resolved (schedule/plan.py), and
        the sweep's predicted use checked against its budget. Nothing to do: the specs as given."""
        assert self.config is not None
        from slurmagent.schedule.budget import check_prediction, total
        from slurmagent.schedule.plan import SweepPlanner

        site = self._site()
        budget = budget_conf(spec_dict(self.config, ("budget",)).get("budget"))
        capped = bool(budget.gpu_hours or budget.cost or budget.user_month_gpu_hours)
        mapped = any(p.partition or p.qos for p in site.priorities.values())
        if not (capped or mapped or any(auto_keys(s.resources) for s in _distinct(specs))):
            return specs, {}
        experiment = self._job_name()
        planner = SweepPlanner.for_site(site, info, self.slurm)
        per_task = [
            planner.add(index, overrides, spec, experiment, functools.partial(self._need_gib, overrides))[0]
            for index, (overrides, spec) in enumerate(zip(job_overrides, specs, strict=True))
        ]
        distinct = [job.plan for job in planner.jobs.values()]
        if one_spec and per_task:  # a search: every trial one spec, its `auto` values the most any trial needs
            distinct = [max(per_task, key=lambda p: p.run_s)]
            per_task = distinct * len(per_task)
        predicted = total(p.usage(site) for p in per_task)
        month = None
        if budget.user_month_gpu_hours and info is not None:
            start = time.strftime("%Y-%m-01T00:00:00")
            month = sum(u.gpu_seconds for u in self.slurm.user_usage_since(current_user(), start)) / 3600
        check_prediction(budget, predicted, month)
        schedule = {
            "budget": dataclasses.asdict(budget),
            "predicted": dataclasses.asdict(predicted),
            "plans": [p.record() for p in distinct],
            "history": str(planner.history.path) if planner.history is not None else "",
        }
        resolved = [dataclasses.replace(s, resources=p.resources) for s, p in zip(specs, per_task, strict=True)]
        return resolved, schedule

    def _need_gib(self, overrides: Sequence[str]) -> float | None:
        """The config validator's estimate of the GPU memory the task needs (None: no recipe)."""
        assert self.config is not None and self.hydra_context is not None
        from slurmagent.skills.config_validator import memory_need_gib

        return memory_need_gib(self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides)))

    def open_sweep(
        self, checked: Checked, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> tuple[SweepStore, list[TaskRecord], dict[str, str]]:
        """Pickle the sweep's context and put the tasks in sweep.json as WAITING (creating the
        sweep, or adding a batch to it); (the store, the new tasks, spec key → spec id)."""
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        conf, sweep_dir, specs, backend, max_array = (
            checked.conf,
            checked.sweep_dir,
            checked.specs,
            checked.backend,
            checked.max_array,
        )
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if checked.code is not None:  # before the first job exists: every run of every task imports from it
            snapshot = write_snapshot(checked.code, sweep_dir)
            checked.console.print(f"[slurmagent] {snapshot.describe()}", markup=False, highlight=False)
        folder = sweep_dir / ".submitit"
        config = copy.deepcopy(self.config)
        with read_write(config.hydra), open_dict(config.hydra):
            config.hydra.sweep.dir = str(sweep_dir)
        ctx_path = sweep_dir / ".slurmagent" / f"context-{initial_job_idx}.pkl"
        write_context(ctx_path, self.hydra_context, self.task_function, config, Singleton.get_state())
        name = self._job_name()
        # one key per distinct spec object (tasks share them: a 100,000-task sweep has a handful)
        keys = {id(s): spec_key(s) for s in _distinct(specs)}
        # no job_overrides: an empty sweep with the checked specs (a search adds its trials later)
        records = [
            TaskRecord(initial_job_idx + i, _as_list(overrides), state=WAITING, spec_id=keys[id(spec)])
            for i, (overrides, spec) in enumerate(zip(job_overrides, specs, strict=bool(job_overrides)))
        ]
        distinct = {keys[id(s)]: s for s in _distinct(specs)}

        ids: dict[str, str] = {}

        def add(state: SweepState) -> None:
            ids.update({key: state.add_spec(dataclasses.asdict(spec)) for key, spec in distinct.items()})
            for r in records:
                r.spec_id = ids[r.spec_id]
            state.tasks.extend(records)
            state.max_array = max_array

        # every task is in sweep.json before anything is submitted; each submission is
        # recorded before its sbatch and after it (supervise/submission.py)
        store = SweepStore(sweep_dir)
        if store.exists():  # a later batch of the same sweep (e.g. an adaptive sweeper)
            with store.edit() as existing:
                add(existing)
        else:
            site = site_conf(spec_dict(self.config, ("site",)).get("site"))
            new = SweepState(str(sweep_dir), backend.name, str(folder), time.time(), [], [], context_path=str(ctx_path))
            new.launcher, new.job_name, new.site = dataclasses.asdict(conf), name, dataclasses.asdict(site)
            new.schedule = checked.schedule
            new.notify = dataclasses.asdict(checked.notify) if checked.notify.channels else {}
            add(new)
            store.create(new)
            record_sweep(sweep_dir)  # the user's index: `slurmagent sweeps` finds it from anywhere
            if checked.urgent:  # the policy allowed it at the check; recorded through the gate now
                Gate(AuditLog(sweep_dir / SWEEP_AUDIT), {"priority_urgent": lambda _a: {"granted": True}}).request(
                    self._urgent_action(sweep_dir)
                )
        return store, records, ids

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        checked = self.check(job_overrides)
        store, records, _ = self.open_sweep(checked, job_overrides, initial_job_idx)
        out = self.submit_and_supervise(checked, store)
        if out is None:  # detached
            return DetachedReturns(records)
        state, results = out
        mine = {r.index for r in records}  # this batch's tasks (a sweep may have several batches)
        return [self._job_return(task, results.get(task.index)) for task in state.tasks if task.index in mine]

    # -- step 3: submit, then supervise here or detach -------------------------------------
    def submit_and_supervise(self, checked: Checked, store: SweepStore) -> tuple[SweepState, dict[int, Any]] | None:
        """Submit the sweep's WAITING tasks, then supervise to the end (the final state and the
        tasks' raw returns) or, detached, hand the sweep to a supervisor and return None."""
        conf, console, sweep_dir, specs = checked.conf, checked.console, checked.sweep_dir, checked.specs
        backend, max_array = checked.backend, checked.max_array
        t0 = time.monotonic()
        submitter = SubmititSubmitter(self.slurm)
        with store.edit() as state:  # each array's intent and job ids: appended to the state's journal
            report = submit_waiting(
                state, lambda: store.write(state), submitter, self.slurm if backend.queued else None, max_array
            )
        arrays = f"array(s) {', '.join(report.arrays)}" if backend.queued else "local process(es)"
        lines = [
            f"{report.submitted} task(s) submitted to {backend.name} as {len(report.arrays)} {arrays} in "
            f"{time.monotonic() - t0:.2f}s; sweep dir {sweep_dir}"
        ]
        if report.waiting:
            lines.append(f"{report.waiting} task(s) wait: {report.held_back}; they are submitted as earlier ones end")
        if report.refused:
            lines.append(f"Slurm refused {report.refused_tasks} task(s): {report.refused}")
        if not conf.detach:
            lines.append(f"if this launcher dies: {slurmagent_command('watch', sweep_dir)}")
        console.print("\n".join(f"[slurmagent] {line}" for line in lines), markup=False, highlight=False)
        if report.refused and conf.on_refusal == "cancel":
            cancel_sweep(
                sweep_dir, self.slurm, "hydra.launcher.on_refusal=cancel after Slurm refused part of the sweep"
            )
            raise SweepRefusedError(
                f"Slurm refused {report.refused_tasks} task(s): {report.refused}; the jobs it had accepted were "
                "cancelled (hydra.launcher.on_refusal=cancel)"
            )

        if conf.detach:
            where = start_detached(store.view(), conf, self.slurm, specs[0].resources.account)
            self._print_follow(console, sweep_dir, f"detached: the sweep is supervised by {where}")
            return None

        # Ctrl-C from the moment the sweep is said to be submitted, the supervisor's set-up included;
        # it takes effect between two polls (InterruptAtSleep), never in the middle of one
        try:
            with InterruptAtSleep() as ctrl_c:
                sup = Supervisor(
                    sweep_dir,
                    self.slurm,
                    conf.poll_interval_s,
                    conf.max_poll_interval_s,
                    console,
                    submit=submitter,
                    sleep=ctrl_c.sleep,
                    store=store,  # the state this launcher holds already: not read again
                )
                state = sup.wait(role="launcher")
        except KeyboardInterrupt:
            self._interrupted(store, conf, console, specs[0].resources.account)
        console.print(sweep_table(state))
        if report.refused:  # on_refusal=leave: what was accepted ran to its end; the sweep still failed
            raise SweepRefusedError(
                f"Slurm refused {report.refused_tasks} task(s): {report.refused}; the tasks it accepted were "
                "supervised to the end (hydra.launcher.on_refusal=leave)"
            )
        return state, sup.results

    def _interrupted(self, store: SweepStore, conf: LauncherConf, console: Console, account: str | None) -> NoReturn:
        """Ctrl-C while attached: leave the sweep to a detached supervisor, or cancel it. On a
        terminal the user is asked (Enter: hydra.launcher.on_interrupt); elsewhere that option decides."""
        state = store.load()
        unfinished = sum(not t.done for t in state.tasks)
        choice = conf.on_interrupt
        if sys.stdin.isatty() and unfinished:
            sys.stderr.write(  # where the launcher's other messages go (stdout may be a pipe)
                f"\n[slurmagent] interrupted: leave the sweep's {unfinished} unfinished task(s) to a detached "
                f"supervisor, or cancel them? [l]eave / [c]ancel (Enter: {conf.on_interrupt}) "
            )
            sys.stderr.flush()
            try:
                answer = input()
            except (EOFError, KeyboardInterrupt):
                answer = ""
            choice = {"l": "leave", "c": "cancel"}.get(answer.strip().lower()[:1], conf.on_interrupt)
        if not unfinished:
            pass
        elif choice == "cancel":
            n = cancel_sweep(store.dir, self.slurm, "the launcher was interrupted (hydra.launcher.on_interrupt=cancel)")
            console.print(f"[slurmagent] interrupted: cancelled {n} unfinished task(s)", markup=False, highlight=False)
        else:
            where = start_detached(state, conf, self.slurm, account)
            self._print_follow(console, store.dir, f"interrupted: the sweep goes on, supervised by {where}")
        raise SystemExit(130)

    @staticmethod
    def _print_follow(console: Console, sweep_dir: Path, head: str) -> None:
        lines = [head, "follow it with:", *(f"  {c}" for c in follow_commands(sweep_dir))]
        console.print("\n".join(f"[slurmagent] {line}" for line in lines), markup=False, highlight=False)

    def _job_name(self) -> str:
        """What squeue and sacct show: the experiment (+experiment=NAME), else the app's name."""
        assert self.config is not None
        experiment = self.config.hydra.runtime.choices.get("experiment")
        app = "slurmagent" if self.task_function is run_task else str(self.config.hydra.job.name)
        return safe_job_name(str(experiment or app))

    @staticmethod
    def _job_return(task: TaskRecord, raw: Any) -> JobReturn:
        if isinstance(raw, JobReturn) and task.state == "COMPLETED":
            return raw
        ret = JobReturn(overrides=task.overrides, status=JobStatus.FAILED)
        ret.cfg = OmegaConf.create({})
        ret.return_value = TaskFailedError(f"task {task.index} ({' '.join(task.overrides)}): {task.error}")
        return ret
