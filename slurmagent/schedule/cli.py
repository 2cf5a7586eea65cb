"""`slurmagent plan +experiment=x [overrides]`: what a job would ask Slurm for, and why.

Composes the job's config as the launcher would, plans it (schedule/plan.py: history,
catalogue, `sbatch --test-only` per candidate) and prints the candidates and the choice.
Nothing is submitted.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from rich.table import Table

from slurmagent.config import AUTO, budget_conf, job_spec, site_conf, spec_dict
from slurmagent.render import _experiment_name, compose
from slurmagent.schedule.budget import over
from slurmagent.schedule.history import HistoryStore, default_history_path, fingerprint
from slurmagent.schedule.plan import plan_spec
from slurmagent.skills.config_validator import memory_need_gib
from slurmagent.slurm.cluster import ClusterInfo, check_fits
from slurmagent.slurm.sbatch import safe_job_name, sbatch_flags
from slurmagent.slurm.seam import SlurmCLI
from slurmagent.slurm.syntax import seconds_to_slurm_time
from slurmagent.supervise.views import terminal


def plan_cli(overrides: list[str], as_json: bool = False, config_dir: Path | None = None) -> int:
    cfg = compose(list(overrides), config_dir)
    spec = job_spec(spec_dict(cfg))
    site = site_conf(spec_dict(cfg, ("site",)).get("site"))
    budget = budget_conf(spec_dict(cfg, ("budget",)).get("budget"))
    slurm = SlurmCLI(timeout=30)
    on_slurm = spec.cluster != "local" and slurm.available()
    cluster = ClusterInfo.query(slurm) if on_slurm else None
    history = HistoryStore(default_history_path(site.scheduling.history))
    need = memory_need_gib(cfg) if spec.resources.gpu_type == AUTO else None
    fp = fingerprint(safe_job_name(_experiment_name(overrides)), overrides, site.scheduling.ignore_in_fingerprint)
    plan = plan_spec(
        spec,
        fp,
        site=site,
        history=history,
        cluster=cluster,
        slurm=slurm if on_slurm else None,
        need_gib=need,
    )
    if cluster is not None:
        check_fits(plan.resources, cluster)
    usage = plan.usage(site)
    over_budget = over(budget, usage)
    if as_json:
        out = {
            **plan.record(),
            "resources": dataclasses.asdict(plan.resources),
            "sbatch": sbatch_flags(plan.resources),
            "chosen": dataclasses.asdict(plan.chosen) if plan.chosen else None,
            "predicted": dataclasses.asdict(usage),
            "over_budget": over_budget,
            "backend": "slurm" if on_slurm else "local",
        }
        print(json.dumps(out, indent=1))
        return 0
    console = terminal()
    if plan.candidates:
        table = Table(title=f"candidates for {_experiment_name(overrides)} (nothing submitted)")
        for col in ("", "GPU type", "partition", "memory fit", "run time", "Slurm's start", "cost", "GPU-h"):
            table.add_column(col)
        for c in plan.candidates:
            start = f"in {c.wait_s:.0f}s ({c.start_note})" if c.wait_s is not None else (c.start_note or "not asked")
            table.add_row(
                "→" if c == plan.chosen else "",
                c.label,
                c.partition,
                c.fit_note,
                seconds_to_slurm_time(c.run_s),
                start,
                f"{c.cost:.2f}",
                f"{c.gpu_hours:.3f}",
            )
        console.print(table)
    lines = [f"prediction: {plan.prediction.basis} (fingerprint {plan.fingerprint})"]
    lines += [f"{d['key']}={d['value']}: {d['why']}" for d in plan.decisions]
    flags = " ".join(f"--{k}={v}" for k, v in sbatch_flags(plan.resources).items())
    lines.append(f"sbatch {flags}")
    lines.append(f"predicted use: {usage.describe()}" + (f" — over budget: {over_budget}" if over_budget else ""))
    if not on_slurm:
        lines.append("note: Slurm does not answer here (or cluster=local): no GPU types, partitions or start times")
    console.print("\n".join(lines), markup=False, highlight=False)
    return 0
