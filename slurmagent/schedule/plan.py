"""The one owner of `auto` resources and of a job's priority mapping: `plan_spec` asks the
history and the cluster, calls the pure parts (predict, place), and returns the resources to
ask for with every number it used — what `slurmagent plan` shows and the launcher submits.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurmagent.config import AUTO, JobSpec, ResourcesConf, SiteConf, auto_keys, spec_key
from slurmagent.errors import ConfigError, SlurmCommandError
from slurmagent.schedule.budget import Usage, usage_of
from slurmagent.schedule.history import HistoryStore, default_history_path, fingerprint
from slurmagent.schedule.place import (
    ANY,
    FINISH_TIE_S,
    Candidate,
    candidates,
    choose,
    proportional_cpus,
    proportional_mem_mb,
    queued_ahead,
    usable,
    with_waits,
)
from slurmagent.schedule.predict import SIGNAL_RESOLUTION_S, Prediction, predict, stop_lead_s
from slurmagent.slurm.cluster import ClusterInfo
from slurmagent.slurm.sbatch import sbatch_flags
from slurmagent.slurm.seam import PendingJob, SlurmCLI
from slurmagent.syntax import mem_to_mb, seconds_to_slurm_time, slurm_time_to_seconds

LOCAL_MEM_FALLBACK = "1G"


@dataclass(frozen=True)
class Plan:
    """What one distinct job (spec × work) will ask for, and why."""

    resources: ResourcesConf  # resolved: no `auto` left
    fingerprint: str
    prediction: Prediction
    candidates: list[Candidate] = field(default_factory=list)
    chosen: Candidate | None = None
    decisions: list[dict[str, str]] = field(default_factory=list)  # {key, value, why}
    run_s: float = 0.0  # the run time its use counts (budget.BASIS): predicted, else the time limit
    counted_type: str | None = None  # the GPU type its use is priced at (an any-type request: where it lands)

    def usage(self, site: SiteConf) -> Usage:
        """The job's predicted use, on `budget.BASIS` (the same figures as its row in `plan`)."""
        res = self.resources
        return usage_of(res.gpus * res.nodes, self.run_s, self.counted_type or res.gpu_type, site)

    def record(self) -> dict[str, Any]:
        """For sweep.json (status shows it)."""
        return {
            "fingerprint": self.fingerprint,
            "prediction": self.prediction.basis,
            "history_runs": self.prediction.runs,
            "decisions": self.decisions,
            "candidates": [dataclasses.asdict(c) for c in self.candidates],
        }


def _pending(slurm: SlurmCLI) -> list[PendingJob]:
    """The queue's waiting GPU jobs; none when squeue does not answer (the estimate is then
    Slurm's alone, as before there was a queue to read)."""
    try:
        return slurm.pending()
    except SlurmCommandError:
        return []


def _seconds_until(stamp: str, now: float) -> float | None:
    try:
        return max(0.0, dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S").timestamp() - now)
    except ValueError:
        return None


def checkpointed(spec: JobSpec) -> bool:
    """The job saves checkpoints, so a time limit only means a clean requeue and resume."""
    return spec.checkpoint.every_steps > 0 or spec.checkpoint.every_seconds > 0


def plan_spec(
    spec: JobSpec,
    fp: str,
    *,
    site: SiteConf,
    history: HistoryStore | None,
    cluster: ClusterInfo | None,
    slurm: SlurmCLI | None,
    need_gib: float | None = None,
    avoid: Collection[str] = (),
    now: float | None = None,
) -> Plan:
    """Resolve `spec`'s auto values and priority for the work `fp` (history.fingerprint);
    `cluster`/`slurm` None = the local backend; `need_gib`: the config validator's estimate of
    one GPU's memory need, replaced by the peak measured on this work's runs when there is one."""
    sched = site.scheduling
    res = spec.resources
    pred = predict(history.recent(fp) if history is not None else [], site)
    if pred.gpu_mem_gib is not None:  # measured on this work's own runs: it wins over the config's estimate
        need_gib = pred.gpu_mem_gib
    decisions: list[dict[str, str]] = []

    def decide(key: str, value: Any, why: str) -> None:
        decisions.append({"key": f"resources.{key}", "value": str(value), "why": why})

    mapped = site.priorities.get(res.priority)
    if mapped is not None:
        for key in ("partition", "qos"):
            value = getattr(mapped, key)
            if value and getattr(res, key) is None:
                res = dataclasses.replace(res, **{key: value})
                decide(key, value, f"resources.priority={res.priority} (site.priorities.{res.priority}.{key})")
    auto = auto_keys(res)
    if res.gpu_type == AUTO and res.gpus == 0:
        raise ConfigError("resources.gpu_type=auto needs resources.gpus ≥ 1 (a CPU job has no GPU type to choose)")
    if not auto:
        return Plan(res, fp, pred, decisions=decisions, run_s=_run_s(res, pred, site))
    fallback_s = slurm_time_to_seconds(sched.fallback_time)
    # a checkpointed job stops at Slurm's warning: its --time holds the warning's lead and a save
    lead_s = stop_lead_s(spec.recovery.signal_delay_s, pred.checkpoint_s) if checkpointed(spec) else 0.0
    if cluster is None or slurm is None:  # local: no GPU types, no partitions
        return _plan_local(spec, res, fp, pred, site, fallback_s, decisions, lead_s)

    part_name = res.partition or cluster.default_partition or ""
    part = cluster.partitions.get(part_name)
    if part is not None and part.max_time_s is not None:
        fallback_s = min(fallback_s, part.max_time_s)
    lead = lead_s if res.time == AUTO else 0.0
    cands = candidates(res, need_gib, pred.reference_s, fallback_s, site, cluster, avoid, sched.inflation, lead)
    if not cands:
        raise ConfigError(
            f"resources.gpu_type=auto: no usable node of partition {part_name!r} has {res.gpus} GPU(s) of one type; "
            "nothing was submitted"
        )
    trial = [c for c in cands if c.fits] or cands
    waits: dict[tuple[str, str | None], tuple[float | None, str]] = {}
    lands_on: dict[str, str] = {}
    stamp = time.time() if now is None else now
    pending = _pending(slurm) if res.gpus > 0 else []
    for c in trial:
        probe = _fill(res, c, c.run_s, pred, cluster, spec, site)
        answer = slurm.test_only(sbatch_flags(dataclasses.replace(probe, time_min=None)))
        if answer.start:
            wait, note = _seconds_until(answer.start, stamp), f"{answer.start} on {answer.nodes}"
            node = cluster.nodes.get(answer.nodes.split(",")[0])
            if c.gpu_type == ANY and node is not None:
                lands_on[c.partition] = next((t for t in node.gpus if t), "")
            queue = lands_on.get(c.partition, "") if c.gpu_type == ANY else c.gpu_type
            if queue and wait is not None and wait > FINISH_TIE_S:  # not now: jobs waiting for those GPUs go first
                ahead_s, ahead = queued_ahead(queue, c.nodes, pending, cluster)
                if ahead:
                    wait += ahead_s
                    note += f", then {ahead_s:.0f}s for the {ahead} job(s) queued ahead for its {queue} GPUs"
            waits[(c.partition, c.gpu_type)] = (wait, note)
        else:
            waits[(c.partition, c.gpu_type)] = (None, answer.error)
    cands = with_waits(cands, waits, lands_on, site)
    if res.gpu_type == AUTO:
        chosen, why = choose(cands)
        decide("gpu_type", chosen.gpu_type, why)  # "any": an untyped --gres
        if res.partition is None:
            res = dataclasses.replace(res, partition=chosen.partition)
    else:  # a typed request, an untyped one (the any-type candidate) or a CPU job
        wanted = ANY if res.gpu_type is None and res.gpus > 0 else res.gpu_type
        chosen = next(c for c in cands if c.gpu_type == wanted)
    resolved = _fill(res, chosen, chosen.run_s, pred, cluster, spec, site, decide, lead)
    limit = float(slurm_time_to_seconds(resolved.time))
    run_s = min(chosen.predicted_s, limit) if pred.reference_s is not None else limit
    counted = chosen.priced_as or resolved.gpu_type
    return Plan(resolved, fp, pred, cands, chosen, decisions, run_s=run_s, counted_type=counted)


@dataclass
class PlannedJob:
    """One distinct job of a sweep (spec × work), planned, and the tasks that share it."""

    plan: Plan
    overrides: list[str]  # its first task's overrides
    tasks: list[int] = field(default_factory=list)


@dataclass
class SweepPlanner:
    """A sweep's tasks planned as the launcher submits them and `slurmagent plan` shows them:
    one `plan_spec` per distinct (spec, work) — the work is the task's fingerprint
    (history.fingerprint: the experiment and its overrides, less `ignore_in_fingerprint`) —
    shared by every task with the same pair. The one place both gather a plan's inputs."""

    site: SiteConf
    history: HistoryStore | None
    cluster: ClusterInfo | None
    slurm: SlurmCLI | None  # None: the local backend
    jobs: dict[tuple[str, str], PlannedJob] = field(default_factory=dict)

    @classmethod
    def for_site(cls, site: SiteConf, cluster: ClusterInfo | None, slurm: SlurmCLI) -> SweepPlanner:
        """The planner the launcher and `slurmagent plan` both build: the site's history store,
        and Slurm asked (`--test-only`) only for a queued sweep (`cluster` given; None: local)."""
        history = HistoryStore(default_history_path(site.scheduling.history))
        return cls(site, history, cluster, slurm if cluster is not None else None)

    def add(
        self,
        index: int,
        overrides: Sequence[str],
        spec: JobSpec,
        experiment: str,
        need_gib: Callable[[], float | None],
    ) -> tuple[Plan, bool]:
        """Task `index`'s plan, and whether it is new (the first task of its job). `need_gib`:
        the config validator's estimate of its GPU memory, asked only for a new job whose
        GPU type is `auto`."""
        fp = fingerprint(experiment, overrides, self.site.scheduling.ignore_in_fingerprint)
        key = (spec_key(spec), fp)
        job = self.jobs.get(key)
        new = job is None
        if job is None:
            plan = plan_spec(
                spec,
                fp,
                site=self.site,
                history=self.history,
                cluster=self.cluster,
                slurm=self.slurm,
                need_gib=need_gib() if spec.resources.gpu_type == AUTO else None,
            )
            job = self.jobs[key] = PlannedJob(plan, list(overrides))
        job.tasks.append(index)
        return job.plan, new


def _run_s(res: ResourcesConf, pred: Prediction, site: SiteConf) -> float:
    """What the budget counts a task as running: the prediction on its GPU type (at most its
    limit), else its limit (the most it can use)."""
    gpu = site.gpu(res.gpu_type)
    predicted = pred.expected_on(gpu.throughput if gpu is not None else 1.0, site.scheduling.inflation)
    limit = float(slurm_time_to_seconds(res.time)) if res.time != AUTO else 0.0
    if predicted is None:
        return limit
    return min(predicted, limit) if limit else predicted


def _lead_note(spec: JobSpec, pred: Prediction, lead_s: float) -> str:
    """Why --time holds more than the prediction: the stop warning's lead, in its parts."""
    save = (
        f"{pred.checkpoint_s:.0f}s checkpoint (measured)"
        if pred.checkpoint_s
        else f"{lead_s - spec.recovery.signal_delay_s - SIGNAL_RESOLUTION_S:.0f}s checkpoint (none measured yet)"
    )
    return (
        f" + {lead_s:.0f}s so it ends before the stop warning (recovery.signal_delay_s={spec.recovery.signal_delay_s}, "
        f"{SIGNAL_RESOLUTION_S}s that Slurm may send it early, {save})"
    )


def _fill(
    res: ResourcesConf,
    chosen: Candidate,
    run_s: int,
    pred: Prediction,
    cluster: ClusterInfo,
    spec: JobSpec,
    site: SiteConf,
    decide: Callable[[str, Any, str], None] | None = None,
    lead_s: float = 0.0,
) -> ResourcesConf:
    """`res` with its auto values replaced for the chosen candidate (`run_s`: its --time,
    `lead_s` of it for the stop warning)."""
    note = decide or (lambda *_: None)
    nodes = [cluster.nodes[n] for n in chosen.nodes if n in cluster.nodes and usable(cluster.nodes[n], ())]
    out = res
    if res.gpu_type == AUTO:
        gpu_type = None if chosen.gpu_type == ANY else chosen.gpu_type
        out = dataclasses.replace(out, gpu_type=gpu_type)
        cpus = proportional_cpus(res, nodes, gpu_type)
        if cpus != res.cpus_per_task:
            out = dataclasses.replace(out, cpus_per_task=cpus)
            where = f"the {'/'.join(chosen.types)} nodes" if chosen.by_type else f"the {chosen.label} nodes"
            note("cpus_per_task", cpus, f"in proportion to {res.gpus} GPU(s) of {where}")
    if res.time == AUTO:
        time_s = run_s
        part = cluster.partitions.get(chosen.partition)
        capped = part is not None and part.max_time_s is not None and part.max_time_s < time_s
        if capped and part is not None and part.max_time_s is not None:
            time_s = part.max_time_s
        out = dataclasses.replace(out, time=seconds_to_slurm_time(time_s))
        if pred.reference_s is not None:
            why = f"predicted: {pred.basis}, on {chosen.label}" + (_lead_note(spec, pred, lead_s) if lead_s else "")
        else:
            why = f"no history: site.scheduling.fallback_time={site.scheduling.fallback_time}"
        note("time", out.time, why + (f"; capped at partition {chosen.partition}'s limit" if capped else ""))
        # a floor that leaves a minute of work before the warning; none when that is the whole
        # --time (no shorter hole is worth starting in, and Slurm would treat it as absent)
        lo = math.ceil(max(lead_s + 60, site.scheduling.time_min_fraction * time_s) / 60) * 60
        if res.time_min is None and checkpointed(spec) and lo < time_s:
            out = dataclasses.replace(out, time_min=seconds_to_slurm_time(int(lo)))
            note(
                "time_min",
                out.time_min,
                "checkpointed: backfill may start it in a shorter hole; it requeues at that limit",
            )
    if res.mem == AUTO:
        if pred.mem_mb is not None:
            mem_mb, why = pred.mem_mb, pred.mem_basis
        else:
            mem_mb = proportional_mem_mb(out, nodes, out.gpu_type) or mem_to_mb(LOCAL_MEM_FALLBACK)
            why = "no history: a share of the node's memory in proportion to the GPUs (CPUs) asked"
        out = dataclasses.replace(out, mem=f"{mem_mb}M")
        note("mem", out.mem, why)
    return out


def _plan_local(
    spec: JobSpec,
    res: ResourcesConf,
    fp: str,
    pred: Prediction,
    site: SiteConf,
    fallback_s: int,
    decisions: list[dict[str, str]],
    lead_s: float = 0.0,
) -> Plan:
    out = res
    if res.gpu_type == AUTO:
        out = dataclasses.replace(out, gpu_type=None)
        decisions.append({"key": "resources.gpu_type", "value": "None", "why": "the local backend has no GPU types"})
    if res.time == AUTO:
        seconds = pred.seconds_on(1.0, site.scheduling.inflation, lead_s) or fallback_s
        out = dataclasses.replace(out, time=seconds_to_slurm_time(seconds))
        why = pred.basis + (_lead_note(spec, pred, lead_s) if lead_s and pred.reference_s is not None else "")
        decisions.append({"key": "resources.time", "value": out.time, "why": why})
    if res.mem == AUTO:
        out = dataclasses.replace(out, mem=f"{pred.mem_mb}M" if pred.mem_mb else LOCAL_MEM_FALLBACK)
        why = pred.mem_basis or "no history: the local fallback"
        decisions.append({"key": "resources.mem", "value": str(out.mem), "why": why})
    return Plan(out, fp, pred, decisions=decisions, run_s=_run_s(out, pred, site))
