"""Which partition and GPU type a job should ask for (pure: recorded cluster states in, a
choice and its reasons out).

Candidates are the GPU types on usable nodes (not drained, down or suspect) of the partitions
the job may use: the one it names, else the one its priority maps to, else the cluster's
default. Each is scored by what matters to the user: when it would start (Slurm's own
estimate, `sbatch --test-only`, filled in by plan.py), how long it would run there (the
prediction over the type's throughput), and what it would cost; the memory must fit. The
earliest predicted finish wins; ties go to the cheaper, then the smaller GPU (the larger one
stays free for work that needs it).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

from slurmagent.config import ResourcesConf, SiteConf
from slurmagent.errors import ConfigError, choices
from slurmagent.schedule.predict import limit_seconds
from slurmagent.slurm.cluster import ClusterInfo, NodeInfo

UNUSABLE_STATES = ("drain", "down", "fail", "maint", "reboot", "unknown", "not_responding", "inval", "future")
GPU_HEADROOM_GIB = 1.0  # CUDA context and allocator slack


ANY = "any"  # a candidate for every fitting type at once: an untyped GRES request, Slurm picks the node


@dataclass(frozen=True)
class Candidate:
    partition: str
    gpu_type: str | None  # None: a CPU job; ANY: whichever fitting type frees first
    nodes: tuple[str, ...]  # usable nodes with enough of this type
    memory_gib: float | None  # per GPU (catalogue)
    fits: bool
    fit_note: str  # "16 GiB ≥ 3.2 GiB needed" / "unknown need"
    run_s: int  # predicted run time there (the fallback's when no history)
    cost: float  # predicted cost: GPUs × hours × price
    gpu_hours: float
    wait_s: float | None = None  # until Slurm would start it (None: not asked, or it cannot run)
    start_note: str = ""  # Slurm's answer
    by_type: tuple[tuple[str, int], ...] = ()  # ANY: each fitting type's run time (run_s is the slowest's)
    lands_on: str = ""  # ANY: the type of the node Slurm would start it on now

    @property
    def expected_run_s(self) -> int:
        """The run time where it would start: ANY runs at the speed of the node it lands on."""
        return dict(self.by_type).get(self.lands_on, self.run_s)

    @property
    def finish_s(self) -> float:
        return (self.wait_s if self.wait_s is not None else math.inf) + self.expected_run_s

    @property
    def label(self) -> str:
        return f"any of {'|'.join(t for t, _ in self.by_type)}" if self.gpu_type == ANY else (self.gpu_type or "cpu")


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
) -> list[Candidate]:
    """Every (partition, GPU type) the job could ask for, with its fit, run time and cost."""
    out: list[Candidate] = []
    gpus_total = res.gpus * res.nodes
    for part_name in partitions_for(res, site, cluster):
        part = cluster.partitions[part_name]
        nodes = [cluster.nodes[n] for n in part.nodes if n in cluster.nodes and usable(cluster.nodes[n], avoid)]
        if res.gpus == 0:
            run_s = limit_seconds(reference_s, 1.0, inflation) or fallback_s
            out.append(Candidate(part_name, None, tuple(n.name for n in nodes), None, True, "CPU job", run_s, 0.0, 0.0))
            continue
        wanted = {res.gpu_type} if res.gpu_type not in (None, "auto") else {t for n in nodes for t in n.gpus if t}
        for gpu_type in sorted(t for t in wanted if t is not None):
            have = tuple(n.name for n in nodes if n.gpus.get(gpu_type, 0) >= res.gpus)
            if len(have) < res.nodes:
                continue
            gpu = site.gpu(gpu_type)
            memory = gpu.memory_gib if gpu is not None else None
            throughput = gpu.throughput if gpu is not None else 1.0
            if need_gib is None:
                fits, note = True, "need unknown"
            elif memory is None:
                fits, note = False, f"{gpu_type} is not in site.gpus"
            else:
                fits = memory - GPU_HEADROOM_GIB >= need_gib
                note = f"{memory:g} GiB {'≥' if fits else '<'} {need_gib:.2f} GiB needed"
            run_s = limit_seconds(reference_s, throughput, inflation) or fallback_s
            hours = gpus_total * run_s / 3600
            price = gpu.price_per_hour if gpu is not None else 0.0
            out.append(Candidate(part_name, gpu_type, have, memory, fits, note, run_s, hours * price, hours))
        fitting = [c for c in out if c.partition == part_name and c.fits and c.gpu_type]
        if res.gpu_type == "auto" and len(fitting) > 1 and res.nodes == 1:
            # one request for every type that fits: it starts on whichever frees first, and its
            # --time covers the slowest, so no fitting GPU idles while the job waits for another
            slowest = max(fitting, key=lambda c: c.run_s)
            out.append(
                Candidate(
                    part_name,
                    ANY,
                    tuple(sorted({n for c in fitting for n in c.nodes})),
                    min(c.memory_gib or 0 for c in fitting),
                    True,
                    "every type here fits" + (f" ({need_gib:.2f} GiB needed)" if need_gib is not None else ""),
                    slowest.run_s,
                    max(c.cost for c in fitting),
                    slowest.gpu_hours,
                    by_type=tuple((str(c.gpu_type), c.run_s) for c in fitting),
                )
            )
    return out


def with_waits(
    cands: list[Candidate],
    waits: Mapping[tuple[str, str | None], tuple[float | None, str]],
    lands_on: Mapping[str, str] | None = None,
) -> list[Candidate]:
    """Slurm's start estimates (seconds from now, its words) put on the candidates; for ANY,
    the type of the node Slurm named (`lands_on`: partition → type)."""
    out = []
    for c in cands:
        wait, note = waits.get((c.partition, c.gpu_type), (None, ""))
        landing = (lands_on or {}).get(c.partition, "") if c.gpu_type == ANY else ""
        out.append(replace(c, wait_s=wait, start_note=note, lands_on=landing))
    return out


def choose(cands: list[Candidate]) -> tuple[Candidate, str]:
    """The candidate to ask for, and why in one sentence."""
    fitting = [c for c in cands if c.fits]
    if not fitting:
        shown = "; ".join(f"{c.label} on {c.partition}: {c.fit_note}" for c in cands) or "no GPU node is usable"
        raise ConfigError(f"resources.gpu_type=auto: no GPU type fits this job ({shown}); nothing was submitted")
    startable = [c for c in fitting if c.wait_s is not None] or fitting
    # the earliest predicted finish; on a tie the request for any fitting type (it may start
    # sooner elsewhere later), then the cheaper, then the smaller GPU
    best = min(startable, key=lambda c: (c.finish_s, c.gpu_type != ANY, c.cost, c.memory_gib or 0, c.gpu_type or ""))
    why = [best.fit_note] if best.gpu_type else []
    if best.gpu_type == ANY:
        why.append(
            f"Slurm starts it on whichever of {'/'.join(t for t, _ in best.by_type)} frees first; "
            f"--time covers the slowest ({best.run_s}s)"
        )
    if best.wait_s is not None:
        landing = f" on {best.lands_on}" if best.lands_on else ""
        why.append(f"earliest predicted finish: starts in {best.wait_s:.0f}s{landing}, runs {best.expected_run_s}s")
    others = [c for c in startable if c is not best]
    if others:
        runner = min(others, key=lambda c: (c.finish_s, c.cost))
        if runner.wait_s is not None:
            later = runner.finish_s - best.finish_s
            why.append(f"{runner.label} on {runner.partition} would finish {later:.0f}s later")
        else:
            why.append(f"{runner.label} on {runner.partition}: no start estimate")
        if runner.finish_s == best.finish_s and best.gpu_type != ANY:
            why.append(f"cheaper ({best.cost:.2f} vs {runner.cost:.2f})")
    unfit = [c for c in cands if not c.fits]
    if unfit:
        why.append("too small: " + ", ".join(f"{c.gpu_type} ({c.fit_note})" for c in unfit))
    return best, "; ".join(why)


def _gpus_on(node: NodeInfo, gpu_type: str | None) -> int:
    """The node's GPUs of `gpu_type` (None: of any type), at least 1 (a divisor)."""
    return max(1, node.gpus.get(gpu_type or "", 0) or sum(node.gpus.values()))


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
