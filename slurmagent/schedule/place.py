"""Which partition and GPU type a job should ask for (pure: recorded cluster states in, a
choice and its reasons out).

Candidates are the GPU types on usable nodes (not drained, down or suspect) of the partitions
the job may use: the one it names, else the one its priority maps to, else the cluster's
default. Each is scored by what matters to the user: when it would start (Slurm's own
estimate, `sbatch --test-only`, filled in by plan.py), how long it would run there (the
prediction over the type's throughput), and what it would use (GPU-hours and cost, from
`budget.usage_of` on the predicted run time: `budget.BASIS`); the memory must fit. The
earliest predicted finish wins — the start plus the *expected* run time there, without the
inflation that sizes the --time and the budget (inflated run times would push a slower type's
finish back by more than a faster one's, a bias toward the faster type that grows with the
job's length); finishes within `tie_s` of each other are a tie (Slurm's
estimates come from separate `--test-only` calls, seconds apart), and a tie goes to the request
for any fitting type, then the cheaper, then the smaller GPU (the larger one stays free for
work that needs it).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from slurmagent.config import ResourcesConf, SiteConf
from slurmagent.errors import ConfigError, choices
from slurmagent.schedule.budget import usage_of
from slurmagent.schedule.predict import limit_seconds
from slurmagent.slurm.cluster import ClusterInfo, NodeInfo
from slurmagent.slurm.seam import PendingJob

UNUSABLE_STATES = ("drain", "down", "fail", "maint", "reboot", "unknown", "not_responding", "inval", "future")
GPU_HEADROOM_GIB = 1.0  # CUDA context and allocator slack
# predicted finishes this close are a tie: Slurm's start estimates come from separate
# `sbatch --test-only` calls (whole seconds, asked one after another), and a prediction is
# only as good as the history's spread; at least FINISH_TIE_S, else this share of the finish
FINISH_TIE_S = 10.0
FINISH_TIE_FRACTION = 0.05


ANY = "any"  # a candidate for every fitting type at once: an untyped GRES request, Slurm picks the node


class TypeRun(NamedTuple):
    """One GPU type of an ANY candidate: what the job would ask and take there."""

    gpu_type: str
    run_s: int  # its --time
    predicted_s: float  # history × inflation (what use is counted from)
    expected_s: float  # history alone (what a finish is predicted from)


@dataclass(frozen=True)
class Candidate:
    partition: str
    gpu_type: str | None  # None: a CPU job; ANY: whichever fitting type frees first
    nodes: tuple[str, ...]  # usable nodes with enough of this type
    memory_gib: float | None  # per GPU (catalogue); ANY: the smallest of its types
    fits: bool
    fit_note: str  # "16 GiB ≥ 3.20 GiB needed" / "16 GiB, need not known"
    run_s: int  # the --time it would ask there (the prediction with its lead; the fallback's when no history)
    cost: float  # predicted use (budget.BASIS): GPUs × predicted_s × the price of `priced_as`
    gpu_hours: float
    wait_s: float | None = None  # until Slurm would start it (None: not asked, or it cannot run)
    start_note: str = ""  # Slurm's answer
    by_type: tuple[TypeRun, ...] = ()  # ANY: each fitting type's --time and run times (run_s: the slowest's)
    lands_on: str = ""  # ANY: the type of the node Slurm would start it on now
    predicted_s: float = 0.0  # predicted run time there: history × inflation, no lead (no history: run_s)
    expected_s: float = 0.0  # expected run time there: history, no inflation, at most run_s (no history: run_s)
    gpus: int = 0  # GPUs of the job, all nodes (what usage counts)
    priced_as: str = ""  # the GPU type its use is priced at (ANY: where it lands, else its slowest)

    @property
    def expected_run_s(self) -> float:
        """The expected run time where it would start (ANY runs at the speed of the node it
        lands on): what its finish is predicted from."""
        return self.expected_s or self.predicted_s

    @property
    def finish_s(self) -> float:
        return (self.wait_s if self.wait_s is not None else math.inf) + self.expected_run_s

    @property
    def types(self) -> tuple[str, ...]:
        """ANY: the GPU types it may start on."""
        return tuple(t.gpu_type for t in self.by_type)

    @property
    def label(self) -> str:
        return f"any of {'|'.join(self.types)}" if self.gpu_type == ANY else (self.gpu_type or "cpu")


def _gib(need: float) -> str:
    """A GPU-memory need for the plan's table: 2 decimals, or 2 significant digits below
    0.01 GiB (a small model's 4 MiB is not '0.00 GiB needed')."""
    return f"{need:.2f}" if need >= 0.01 or need <= 0 else f"{need:.2g}"


def tie_s(finish_s: float) -> float:
    """How close two predicted finishes must be to count as a tie (`FINISH_TIE_S`, `FINISH_TIE_FRACTION`)."""
    return max(FINISH_TIE_S, FINISH_TIE_FRACTION * finish_s) if math.isfinite(finish_s) else 0.0


def _priced(c: Candidate, gpu_type: str, site: SiteConf) -> Candidate:
    """`c` with its run times and use on `gpu_type` (an ANY candidate's landing type; one not
    among its types keeps `c`'s run times)."""
    there = next((t for t in c.by_type if t.gpu_type == gpu_type), None)
    predicted, expected = (there.predicted_s, there.expected_s) if there else (c.predicted_s, c.expected_s)
    use = usage_of(c.gpus, predicted, gpu_type, site)
    return replace(
        c, predicted_s=predicted, expected_s=expected, priced_as=gpu_type, cost=use.cost, gpu_hours=use.gpu_hours
    )


def _run_times(reference_s: float | None, throughput: float, inflation: float, run_s: int) -> tuple[float, float]:
    """(predicted, expected) run time on a GPU of `throughput`: the history's × `inflation`
    (what the budget counts), and without it (what a finish is predicted from); each at most
    the --time `run_s`, which is both without history."""
    if reference_s is None:
        return float(run_s), float(run_s)
    expected = reference_s / max(throughput, 1e-9)
    return min(float(run_s), expected * inflation), min(float(run_s), expected)


def usable(node: NodeInfo, avoid: Collection[str]) -> bool:
    state = node.state.lower()
    return node.name not in avoid and not any(word in state for word in UNUSABLE_STATES)


def partitions_for(res: ResourcesConf, site: SiteConf, cluster: ClusterInfo) -> list[str]:
    """Explicit partition > the priority's > the cluster's default."""
    mapped = site.priorities.get(res.priority)
    name = res.partition or (mapped.partition if mapped is not None else None) or cluster.default_partition
    if name is None:
        raise ConfigError(
            f"resources.partition is not set and the cluster has no default; valid: {choices(cluster.partitions)}"
        )
    if name not in cluster.partitions:
        raise ConfigError(f"partition {name!r} does not exist; valid partitions: {choices(cluster.partitions)}")
    return [name]


def candidates(
    res: ResourcesConf,
    need_gib: float | None,
    reference_s: float | None,
    fallback_s: int,
    site: SiteConf,
    cluster: ClusterInfo,
    avoid: Collection[str] = (),
    inflation: float = 1.0,
    lead_s: float = 0.0,
) -> list[Candidate]:
    """Every (partition, GPU type) the job could ask for, with its fit, --time (the prediction
    × `inflation` + `lead_s`, whole minutes), predicted run time and use. `res.gpu_type` auto:
    every type, and one request for any fitting type when more than one fits; None (the job
    asks for any type): that request, over every type."""
    out: list[Candidate] = []
    gpus_total = res.gpus * res.nodes
    for part_name in partitions_for(res, site, cluster):
        part = cluster.partitions[part_name]
        nodes = [cluster.nodes[n] for n in part.nodes if n in cluster.nodes and usable(cluster.nodes[n], avoid)]
        if res.gpus == 0:
            run_s = limit_seconds(reference_s, 1.0, inflation, lead_s) or fallback_s
            predicted, expected = _run_times(reference_s, 1.0, inflation, run_s)
            out.append(
                Candidate(
                    part_name, None, tuple(n.name for n in nodes), None, True, "CPU job", run_s, 0.0, 0.0,
                    predicted_s=predicted, expected_s=expected,
                )
            )  # fmt: skip
            continue
        wanted = {res.gpu_type} if res.gpu_type not in (None, "auto") else {t for n in nodes for t in n.gpus if t}
        typed: list[Candidate] = []
        for gpu_type in sorted(t for t in wanted if t is not None):
            have = tuple(n.name for n in nodes if n.gpus.get(gpu_type, 0) >= res.gpus)
            if len(have) < res.nodes:
                continue
            gpu = site.gpu(gpu_type)
            memory = gpu.memory_gib if gpu is not None else None
            throughput = gpu.throughput if gpu is not None else 1.0
            if need_gib is None:
                fits, note = True, f"{memory:g} GiB, need not known" if memory is not None else "need not known"
            elif memory is None:
                fits, note = False, f"{gpu_type} is not in site.gpus"
            else:
                fits = memory - GPU_HEADROOM_GIB >= need_gib
                note = f"{memory:g} GiB {'≥' if fits else '<'} {_gib(need_gib)} GiB needed"
            run_s = limit_seconds(reference_s, throughput, inflation, lead_s) or fallback_s
            predicted, expected = _run_times(reference_s, throughput, inflation, run_s)
            use = usage_of(gpus_total, predicted, gpu_type, site)
            typed.append(
                Candidate(
                    part_name, gpu_type, have, memory, fits, note, run_s, use.cost, use.gpu_hours,
                    predicted_s=predicted, gpus=gpus_total, priced_as=gpu_type, expected_s=expected,
                )
            )  # fmt: skip
        explicit_any = res.gpu_type is None
        if not explicit_any:
            out.extend(typed)
        fitting = typed if explicit_any else [c for c in typed if c.fits]
        if (explicit_any and fitting) or (res.gpu_type == "auto" and len(fitting) > 1 and res.nodes == 1):
            # one request for every type that fits: it starts on whichever frees first, and its
            # --time covers the slowest, so no fitting GPU idles while the job waits for another
            slowest = max(fitting, key=lambda c: c.run_s)
            sizes = sorted({c.memory_gib for c in fitting if c.memory_gib is not None})
            span = f"{sizes[0]:g}–{sizes[-1]:g} GiB" if len(sizes) > 1 else (f"{sizes[0]:g} GiB" if sizes else "")
            small = [c for c in fitting if not c.fits]
            if small:
                note = f"{span}; too small: " + ", ".join(f"{c.gpu_type} ({c.fit_note})" for c in small)
            elif need_gib is None:
                note = f"{span}, need not known"
            else:
                note = f"{span}, each ≥ {_gib(need_gib)} GiB needed"
            any_c = Candidate(
                part_name,
                ANY,
                tuple(sorted({n for c in fitting for n in c.nodes})),
                min(c.memory_gib or 0 for c in fitting),
                True,
                note,
                slowest.run_s,
                0.0,
                0.0,
                by_type=tuple(TypeRun(str(c.gpu_type), c.run_s, c.predicted_s, c.expected_s) for c in fitting),
                predicted_s=slowest.predicted_s,
                gpus=gpus_total,
                expected_s=slowest.expected_s,
            )
            out.append(_priced(any_c, str(slowest.gpu_type), site))  # until Slurm says where it lands
    return out


def _gpus(nodes: Iterable[NodeInfo], gpu_type: str | None) -> int:
    """The GPUs of `gpu_type` on `nodes` (None: of every type)."""
    return sum(node.gpu_count(gpu_type) for node in nodes)


def queued_ahead(
    gpu_type: str, nodes: Collection[str], pending: Sequence[PendingJob], cluster: ClusterInfo
) -> tuple[float, int]:
    """How much later than `sbatch --test-only` says a job would start on the `gpu_type` GPUs
    of `nodes`, and for how many jobs: the GPU-seconds (GPUs × time limit, what Slurm's backfill
    plans with) of the jobs already waiting for those GPUs, spread over them. A job waiting for
    any type counts in proportion to their share of its partitions' GPUs. A fluid estimate: it
    keeps a burst of jobs from each taking the type that looks free first, one after another."""
    mine = set(nodes)
    capacity = _gpus((cluster.nodes[n] for n in mine if n in cluster.nodes), gpu_type)
    if capacity == 0:
        return 0.0, 0
    demand, count = 0.0, 0
    for job in pending:
        if job.gpu_type not in (None, gpu_type):
            continue  # it waits for another type
        theirs = [
            cluster.nodes[n]
            for n in {n for p in job.partitions if p in cluster.partitions for n in cluster.partitions[p].nodes}
            if n in cluster.nodes
        ]
        share = _gpus((n for n in theirs if n.name in mine), gpu_type) / max(_gpus(theirs, job.gpu_type), 1)
        if share > 0:
            demand += job.gpus * job.limit_s * share
            count += 1
    return demand / capacity, count


def with_waits(
    cands: list[Candidate],
    waits: Mapping[tuple[str, str | None], tuple[float | None, str]],
    lands_on: Mapping[str, str],
    site: SiteConf,
) -> list[Candidate]:
    """Slurm's start estimates (seconds from now, its words) put on the candidates; for ANY,
    the type of the node Slurm named (`lands_on`: partition → type), where its run time and
    use are then predicted (`site`: the catalogue that prices it)."""
    out = []
    for c in cands:
        wait, note = waits.get((c.partition, c.gpu_type), (None, ""))
        landing = lands_on.get(c.partition, "") if c.gpu_type == ANY else ""
        placed = replace(c, wait_s=wait, start_note=note, lands_on=landing)
        if landing in c.types:
            placed = _priced(placed, landing, site)
        out.append(placed)
    return out


def _order(c: Candidate) -> tuple[bool, float, float, str]:
    """Among tied candidates: the any-type request, then the cheaper, then the smaller GPU."""
    return (c.gpu_type != ANY, c.cost, c.memory_gib or 0, c.gpu_type or "")


def choose(cands: list[Candidate]) -> tuple[Candidate, str]:
    """The candidate to ask for, and why in one sentence: the earliest predicted finish, where
    finishes within `tie_s` are a tie that goes to the any-type request (it may start sooner
    elsewhere later), then the cheaper, then the smaller GPU."""
    fitting = [c for c in cands if c.fits]
    if not fitting:
        shown = "; ".join(f"{c.label} on {c.partition}: {c.fit_note}" for c in cands) or "no GPU node is usable"
        raise ConfigError(f"resources.gpu_type=auto: no GPU type fits this job ({shown}); nothing was submitted")
    startable = [c for c in fitting if c.wait_s is not None] or fitting
    earliest = min(c.finish_s for c in startable)
    tol = tie_s(earliest)
    tied = [c for c in startable if c.finish_s <= earliest + tol]
    best = min(tied, key=_order)
    why = [best.fit_note] if best.gpu_type else []
    if best.gpu_type == ANY:
        why.append(
            f"Slurm starts it on whichever of {'/'.join(best.types)} frees first; "
            f"--time covers the slowest ({best.run_s}s)"
        )
    if best.wait_s is not None:
        landing = f" on {best.lands_on}" if best.lands_on else ""
        head = (
            "earliest predicted finish"
            if best.finish_s <= earliest
            else f"predicted finish within {tol:.0f}s of the earliest"
        )
        why.append(f"{head}: starts in {best.wait_s:.0f}s{landing}, runs {best.expected_run_s:.0f}s")
    others = [c for c in startable if c is not best]
    if others:
        runner = min(others, key=lambda c: (c.finish_s, *_order(c)))
        if runner.wait_s is None:
            why.append(f"{runner.label} on {runner.partition}: no start estimate")
        elif runner in tied:
            rule = (
                "the any-type request"
                if best.gpu_type == ANY
                else f"the cheaper ({best.cost:.2f} vs {runner.cost:.2f})"
            )
            gap = abs(runner.finish_s - best.finish_s)
            why.append(
                f"{runner.label} on {runner.partition} finishes {gap:.0f}s apart: a tie (within {tol:.0f}s), "
                f"which goes to {rule}"
            )
        else:
            why.append(
                f"{runner.label} on {runner.partition} would finish {runner.finish_s - best.finish_s:.0f}s later"
            )
    unfit = [c for c in cands if not c.fits]
    if unfit:
        why.append("too small: " + ", ".join(f"{c.gpu_type} ({c.fit_note})" for c in unfit))
    return best, "; ".join(why)


def _gpus_on(node: NodeInfo, gpu_type: str | None) -> int:
    """The node's GPUs of `gpu_type` (None, or a type it has none of: all its GPUs), at least 1 (a divisor)."""
    return max(1, node.gpu_count(gpu_type) or node.gpu_count(None))


def proportional_cpus(res: ResourcesConf, nodes: list[NodeInfo], gpu_type: str | None) -> int:
    """CPUs per task in proportion to the GPUs asked of the type's smallest node share."""
    shares = [n.cpus * res.gpus // _gpus_on(n, gpu_type) for n in nodes if n.gpus]
    if not shares:
        return res.cpus_per_task
    return max(res.cpus_per_task, min(shares) // max(1, res.tasks_per_node))


def proportional_mem_mb(res: ResourcesConf, nodes: list[NodeInfo], gpu_type: str | None) -> int | None:
    """Memory per node in proportion to the GPUs (CPU jobs: the CPUs) asked."""
    shares = []
    for n in nodes:
        if res.gpus and n.gpus:
            shares.append(n.mem_mb * res.gpus // _gpus_on(n, gpu_type))
        elif not res.gpus and n.cpus:
            shares.append(n.mem_mb * res.tasks_per_node * res.cpus_per_task // n.cpus)
    return min(shares) if shares else None
