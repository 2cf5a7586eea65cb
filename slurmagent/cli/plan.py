"""`slurmagent plan [launcher arguments]`: what the jobs would ask Slurm for, and why.

Takes what the launcher takes (`python -m slurmagent …`): Hydra overrides, `--config-dir`/
`-cd`, `--config-name`/`-cn`, `--config-path`/`-cp`, `-m` with sweep values (`a=1,2`,
`range(…)`, the sweeper's `params`), `--detach`; composes each task's config as the launcher
would, and plans each distinct job (spec × work) once, as the launcher does before submitting
(schedule/plan.py: history, catalogue, `sbatch --test-only` per candidate). It prints the
candidates and the choice of each, and the sweep's predicted use against its budget.
Nothing is submitted.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from slurmagent.cli.args import CONFIG_DIR_HELP
from slurmagent.config import budget_conf, job_spec, site_conf, spec_dict
from slurmagent.errors import ConfigError
from slurmagent.render import experiment_name
from slurmagent.schedule.budget import BASIS, Usage, over, total
from slurmagent.schedule.plan import Plan, PlannedJob, SweepPlanner
from slurmagent.slurm.cluster import ClusterInfo, check_fits
from slurmagent.slurm.sbatch import safe_job_name, sbatch_flags
from slurmagent.slurm.seam import SlurmCLI
from slurmagent.supervise.views import terminal
from slurmagent.syntax import seconds_to_slurm_time

# the launcher's flags that take a value (Hydra's, as `python -m slurmagent` accepts them)
VALUE_FLAGS = {"--config-dir": "config_dir", "-cd": "config_dir", "--config-name": "config_name"}
VALUE_FLAGS |= {"-cn": "config_name", "--config-path": "config_path", "-cp": "config_path"}
SWEEP_FLAGS = ("-m", "--multirun")
IGNORED_FLAGS = ("--detach", "-d", "--run", "-r")  # how it runs, not what it asks for: the plan is the same
# Hydra's flags that show something instead of launching: nothing to plan
SHOW_FLAGS: tuple[str, ...] = ("--cfg", "-c", "--info", "-i", "--resolve", "--package", "-p", "--hydra-help")
SHOW_FLAGS += ("--version", "--shell-completion", "-sc", "--experimental-rerun", "--help", "-h")


@dataclass
class PlanArgs:
    """The launcher's arguments, as `plan` reads them."""

    overrides: list[str] = field(default_factory=list)
    config_dir: Path | None = None
    config_name: str | None = None
    config_path: str | None = None
    multirun: bool = False
    as_json: bool = False


def parse_args(argv: Sequence[str], base: PlanArgs | None = None) -> PlanArgs:
    """The launcher's flags wherever they stand among the overrides (as `python -m slurmagent`
    hoists them); `--json` is plan's own."""
    out = dataclasses.replace(base) if base is not None else PlanArgs()
    out.overrides = list(out.overrides)
    args = list(argv)
    i = 0
    while i < len(args):
        a = args[i]
        name, eq, value = a.partition("=")
        if name in VALUE_FLAGS and a.startswith("-"):
            if not eq:
                if i + 1 >= len(args) or args[i + 1] in ("--", ""):
                    raise ConfigError(f"{name} needs a value")
                value = args[i + 1]
                i += 1
            setattr(out, VALUE_FLAGS[name], Path(value) if VALUE_FLAGS[name] == "config_dir" else value)
        elif a in SWEEP_FLAGS:
            out.multirun = True
        elif a == "--json":
            out.as_json = True
        elif a in IGNORED_FLAGS:
            pass
        elif name in SHOW_FLAGS:
            raise ConfigError(
                f"{name} makes the launcher show Hydra's information instead of launching: run it without plan"
            )
        elif a.startswith("-"):
            raise ConfigError(f"unknown option {a}; plan takes the launcher's: -m, -cd, -cn, -cp, --detach, and --json")
        else:
            out.overrides.append(a)
        i += 1
    return out


def _is_hydra(override: str) -> bool:
    key = override.lstrip("+~").partition("=")[0]
    return key == "hydra" or key.startswith(("hydra.", "hydra/"))


@contextlib.contextmanager
def _hydra(args: PlanArgs) -> Iterator[None]:
    """Hydra initialised with the launcher's search path: the app's config path (or `-cp`), and
    `-cd`'s directory where Hydra's command line puts it (before the schemas)."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import (
        compute_search_path_dir,
        create_config_search_path,
        detect_calling_file_or_module_from_task_function,
    )
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.global_hydra import GlobalHydra

    from slurmagent.cli.args import check_path
    from slurmagent.job.task import run_task

    calling_file, calling_module = detect_calling_file_or_module_from_task_function(run_task)
    main_dir = compute_search_path_dir(calling_file, calling_module, args.config_path or "pkg://slurmagent.conf")
    search = create_config_search_path(main_dir)
    if args.config_dir is not None:
        check_path(args.config_dir, "dir", "--config-dir", ConfigError)
        search.prepend(
            provider="command-line",
            path=f"file://{args.config_dir.absolute()}",
            anchor=SearchPathQuery(provider="schema"),
        )
    gh = GlobalHydra.instance()
    gh.clear()
    Hydra.create_main_hydra2(task_name="slurmagent", config_search_path=search)
    try:
        yield
    finally:
        gh.clear()


def _compose(args: PlanArgs, overrides: list[str]) -> Any:
    from hydra import compose

    return compose(config_name=args.config_name or "config", overrides=overrides, return_hydra_config=True)


def _jobs(args: PlanArgs, hydra_over: list[str], task_over: list[str]) -> tuple[list[list[str]], str]:
    """Each task's overrides, as the launcher gets them (Hydra's basic sweeper expands a
    sweep's values, its `params` first); a search (its own sweeper) is planned once."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    parsed = parser.parse_overrides(task_over)
    swept = [str(o.input_line) for o in parsed if o.is_sweep_override()]
    fixed = [str(o.input_line) for o in parsed if not o.is_sweep_override()]
    if not args.multirun and swept:
        raise ConfigError(f"{swept[0]} is a sweep: add -m, as for the launcher (without -m it would run one task here)")
    if not args.multirun:  # one task, its overrides spelt as the launcher's sweeper hands them over (escaped)
        return [list(job) for batch in BasicSweeper.split_arguments(parsed, None) for job in batch], ""
    base = _compose(args, [*hydra_over, *fixed])
    sweeper = str(base.hydra.sweeper.get("_target_", ""))
    if "hpo" in sweeper.lower():  # a search asks its trials as it goes: every trial runs with one spec
        return [fixed], "a search: its trials run with one spec, planned here from the overrides it does not search"
    params = [f"{k}={v}" for k, v in (base.hydra.sweeper.get("params") or {}).items()]
    batches = BasicSweeper.split_arguments(parser.parse_overrides([*params, *task_over]), None)
    return [list(job) for batch in batches for job in batch], ""


def plan_sweep(args: PlanArgs) -> tuple[list[PlannedJob], dict[str, Any]]:
    """Every distinct job of the launch `args` describes, planned as the launcher would."""
    from slurmagent.launch.backend import resolve_backend
    from slurmagent.launch.sweeper import spec_relevant
    from slurmagent.skills.config_validator import memory_need_gib

    hydra_over = [o for o in args.overrides if _is_hydra(o)]
    task_over = [o for o in args.overrides if not _is_hydra(o)]
    slurm = SlurmCLI(timeout=30)
    with _hydra(args):
        jobs, note = _jobs(args, hydra_over, task_over)
        composed: dict[tuple[str, ...], Any] = {}
        planner: SweepPlanner | None = None
        context: dict[str, Any] = {"note": note, "tasks": len(jobs)}
        for index, overrides in enumerate(jobs):
            key = tuple(o for o in overrides if spec_relevant(o))
            if key not in composed:
                composed[key] = _compose(args, [*hydra_over, *overrides])
            cfg = composed[key]
            if planner is None:
                site = site_conf(spec_dict(cfg, ("site",)).get("site"))
                where = resolve_backend(job_spec(spec_dict(cfg)).cluster, slurm)  # as the launcher decides it
                cluster = ClusterInfo.query(slurm) if where.queued else None
                planner = SweepPlanner.for_site(site, cluster, slurm)
                budget = budget_conf(spec_dict(cfg, ("budget",)).get("budget"))
                context.update(site=site, budget=budget, where=where, cluster=cluster, history=planner.history)
            spec = job_spec(spec_dict(cfg))
            experiment = cfg.hydra.runtime.choices.get("experiment") or experiment_name(overrides)

            def need(cfg: Any = cfg, overrides: list[str] = overrides, key: tuple[str, ...] = key) -> float | None:
                return memory_need_gib(cfg if list(key) == overrides else _compose(args, [*hydra_over, *overrides]))

            plan, new = planner.add(index, overrides, spec, safe_job_name(str(experiment)), need)
            if new and planner.cluster is not None:
                check_fits(plan.resources, planner.cluster)
    return list(planner.jobs.values()) if planner is not None else [], context


def plan_args(pl: argparse.ArgumentParser) -> None:
    # the launcher's arguments, flags anywhere among the overrides (parse_args reads those after the first)
    pl.add_argument("overrides", nargs=argparse.REMAINDER, help="what python -m slurmagent takes: Hydra overrides")
    pl.add_argument("--config-dir", "-cd", type=Path, default=None, help=CONFIG_DIR_HELP)
    pl.add_argument("--config-name", "-cn", default=None, help="the primary config's name, as for the launcher")
    pl.add_argument("--config-path", "-cp", default=None, help="the primary config's path, as for the launcher")
    pl.add_argument("--multirun", "-m", action="store_true", help="a sweep: plan each distinct job of it once")
    pl.add_argument("--detach", "-d", action="store_true", help="accepted as the launcher does; the plan is the same")
    pl.add_argument("--json", action="store_true", help="the plan as JSON, for scripts")


def plan(ns: argparse.Namespace) -> int:
    """Example: slurmagent plan +experiment=digits_mlp resources.gpus=1 resources.gpu_type=auto resources.time=auto
    Takes the launcher's arguments (-cd, -cn, -cp, -m with a sweep's values: each distinct job planned once).
    A table of candidates (GPU type, partition, GPU memory, predicted run time, --time, Slurm's predicted start
    from `sbatch --test-only`, GPU-h and cost on one basis) and the choice; nothing is submitted."""
    base = PlanArgs([], ns.config_dir, ns.config_name, ns.config_path, ns.multirun, ns.json)
    args = parse_args(ns.overrides, base)
    plans, ctx = plan_sweep(args)
    site = ctx["site"]
    per_task = [p.plan.usage(site) for p in plans for _ in p.tasks]
    predicted = total(per_task)
    over_budget = over(ctx["budget"], predicted)
    backend = ctx["where"].name
    if args.as_json:
        print(json.dumps(_json(args, plans, site, predicted, over_budget, backend, ctx), indent=1))
        return 0
    console = terminal()
    sweep = args.multirun
    if sweep:
        head = f"{ctx['tasks']} task(s), {len(plans)} distinct job(s) (spec × work), each planned once (as launched)"
        console.print(head + (f"; {ctx['note']}" if ctx["note"] else ""), markup=False, highlight=False)
    for n, p in enumerate(plans, 1):
        title = f" — job {n} of {len(plans)}: tasks {_span(p.tasks)} ({' '.join(p.overrides) or 'no overrides'})"
        _show(console, p.plan, site, args.overrides, title if sweep else "")
    who = f"the sweep's {ctx['tasks']} task(s)" if sweep else "this job"
    lines = [f"predicted use of {who}: {predicted.describe()} ({BASIS})"]
    if over_budget:
        lines[-1] += f" — over budget: {over_budget}"
    if not ctx["where"].queued:
        lines.append("note: Slurm does not answer here (or cluster=local): no GPU types, partitions or start times")
    console.print("\n".join(lines), markup=False, highlight=False)
    return 0


def _span(tasks: list[int]) -> str:
    return ",".join(map(str, tasks)) if len(tasks) <= 6 else f"{tasks[0]}…{tasks[-1]} ({len(tasks)})"


def _show(console: Any, plan: Plan, site: Any, overrides: list[str], title: str) -> None:
    """One plan: the candidates' table (its title names the basis of GPU-h and cost) and the
    decisions, each reason on its own line."""
    if plan.candidates:
        name = experiment_name(overrides)
        table = Table(title=f"candidates for {name}{title} (nothing submitted)", caption=f"GPU-h and cost: {BASIS}")
        for col in (
            "",
            "GPU type",
            "partition",
            "GPU memory",
            "predicted run",
            "--time",
            "Slurm's start",
            "GPU-h",
            "cost",
        ):
            table.add_column(col)
        for c in plan.candidates:
            start = f"in {c.wait_s:.0f}s ({c.start_note})" if c.wait_s is not None else (c.start_note or "not asked")
            priced = f" ({c.priced_as})" if c.gpu_type == "any" and c.priced_as else ""
            table.add_row(
                "→" if c == plan.chosen else "",
                c.label,
                c.partition,
                c.fit_note,
                seconds_to_slurm_time(round(c.predicted_s)) + priced,
                seconds_to_slurm_time(c.run_s),
                start,
                f"{c.gpu_hours:.3f}",
                f"{c.cost:.2f}",
            )
        console.print(table)
    elif title:
        console.print(title.removeprefix(" — "), markup=False, highlight=False)
    pred = plan.prediction
    lines = [f"run time: {pred.basis} (fingerprint {plan.fingerprint})"]
    if pred.mem_basis:
        lines.append(f"host memory: {pred.mem_basis}")
    if pred.gpu_basis:
        lines.append(f"GPU memory: {pred.gpu_basis}")
    lines += [f"{d['key']}={d['value']}: {d['why']}" for d in plan.decisions]
    flags = " ".join(f"--{k}={v}" for k, v in sbatch_flags(plan.resources).items())
    lines.append(f"sbatch {flags}")
    if title:  # one of a sweep's jobs; a single job's use is the summary line below
        lines.append(f"predicted use of this job: {plan.usage(site).describe()}")
    console.print("\n".join(lines), markup=False, highlight=False)


def _json(
    args: PlanArgs,
    plans: list[PlannedJob],
    site: Any,
    predicted: Usage,
    over_budget: str,
    backend: str,
    ctx: dict[str, Any],
) -> dict[str, Any]:
    def one(p: Plan) -> dict[str, Any]:
        return {
            **p.record(),
            "resources": dataclasses.asdict(p.resources),
            "sbatch": sbatch_flags(p.resources),
            "chosen": dataclasses.asdict(p.chosen) if p.chosen else None,
            "predicted": dataclasses.asdict(p.usage(site)),
        }

    basis = {"basis": BASIS, "over_budget": over_budget, "backend": backend}
    if not args.multirun:
        return {**one(plans[0].plan), **basis}
    jobs = [{**one(p.plan), "tasks": p.tasks, "overrides": p.overrides} for p in plans]
    return {
        "tasks": ctx["tasks"],
        "jobs": jobs,
        "predicted": dataclasses.asdict(predicted),
        "note": ctx["note"],
        **basis,
    }
