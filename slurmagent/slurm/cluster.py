"""What the cluster offers (partitions, nodes, GPU types, limits) and whether a job fits.

`ClusterInfo.query` asks Slurm with three calls; `check_fits` is pure and refuses a spec
before anything is submitted, naming the key and the valid values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from slurmagent.errors import ConfigError, choices
from slurmagent.slurm.seam import SlurmCLI, parse_scontrol_config
from slurmagent.syntax import (
    mem_to_mb,
    parse_gres,
    parse_time_limit,
    seconds_to_slurm_time,
    slurm_time_to_seconds,
)

if TYPE_CHECKING:  # a type only: the config package costs a Slurm command's process tens of ms to import
    from slurmagent.config import ResourcesConf


@dataclass(frozen=True)
class NodeInfo:
    name: str
    cpus: int
    mem_mb: int
    gpus: dict[str, int]  # GPU type → count ("" for an untyped gpu GRES)
    features: frozenset[str]
    state: str

    def gpu_count(self, gpu_type: str | None) -> int:
        """Its GPUs of `gpu_type` (None or "": of every type)."""
        return self.gpus.get(gpu_type, 0) if gpu_type else sum(self.gpus.values())


@dataclass(frozen=True)
class PartitionInfo:
    name: str
    max_time_s: int | None  # None = infinite
    nodes: tuple[str, ...]
    default: bool = False


# Slurm's default MaxArraySize (slurm.conf(5)): a cluster that does not say otherwise takes arrays of up to 1,001 tasks
DEFAULT_MAX_ARRAY_SIZE = 1001


@dataclass(frozen=True)
class ClusterInfo:
    partitions: dict[str, PartitionInfo]
    nodes: dict[str, NodeInfo]
    max_array_size: int = DEFAULT_MAX_ARRAY_SIZE

    @property
    def default_partition(self) -> str | None:
        for p in self.partitions.values():
            if p.default:
                return p.name
        return None

    @classmethod
    def query(cls, slurm: SlurmCLI) -> ClusterInfo:
        nodes_out = slurm.run(["sinfo", "-h", "-N", "-o", "%N|%R|%c|%m|%G|%f|%T"])
        parts_out = slurm.run(["sinfo", "-h", "-o", "%R|%l|%P"])
        config = parse_scontrol_config(slurm.run(["scontrol", "show", "config"]))
        return parse_cluster(nodes_out, parts_out, config)


def parse_cluster(nodes_out: str, parts_out: str, config: dict[str, str]) -> ClusterInfo:
    nodes: dict[str, NodeInfo] = {}
    members: dict[str, list[str]] = {}
    for line in nodes_out.splitlines():
        f = line.split("|")
        if len(f) < 7:
            continue
        name, part, cpus, mem, gres, feats, state = (x.strip() for x in f[:7])
        members.setdefault(part, []).append(name)
        nodes[name] = NodeInfo(
            name=name,
            cpus=int(cpus.rstrip("+")),
            mem_mb=int(mem.rstrip("+")),
            gpus=parse_gres(gres),
            features=frozenset(x for x in feats.split(",") if x and x != "(null)"),
            state=state,
        )
    partitions: dict[str, PartitionInfo] = {}
    for line in parts_out.splitlines():
        f = line.split("|")
        if len(f) < 3:
            continue
        name, limit, flagged = (x.strip() for x in f[:3])
        partitions[name] = PartitionInfo(
            name=name,
            max_time_s=parse_time_limit(limit),
            nodes=tuple(members.get(name, [])),
            default=flagged.endswith("*"),
        )
    max_array = int(config.get("MaxArraySize") or DEFAULT_MAX_ARRAY_SIZE)
    return ClusterInfo(partitions=partitions, nodes=nodes, max_array_size=max_array)


def check_fits(res: ResourcesConf, cluster: ClusterInfo) -> None:
    """Refuse a spec the cluster cannot run: partition, GPU type, CPUs, memory, time."""
    part_name = res.partition or cluster.default_partition
    if part_name is None:
        raise ConfigError(
            f"resources.partition is not set and the cluster has no default partition; "
            f"valid partitions: {choices(cluster.partitions)}"
        )
    part = cluster.partitions.get(part_name)
    if part is None:
        raise ConfigError(
            f"resources.partition={part_name!r} does not exist; valid partitions: {choices(cluster.partitions)}"
        )
    candidates = [cluster.nodes[n] for n in part.nodes if n in cluster.nodes]
    if res.gpus > 0:
        types_here = {t for n in candidates for t in n.gpus if t}
        if res.gpu_type is not None and res.gpu_type not in types_here:
            where = [
                p.name
                for p in cluster.partitions.values()
                if any(res.gpu_type in cluster.nodes[n].gpus for n in p.nodes if n in cluster.nodes)
            ]
            hint = f" (it exists in partition(s) {choices(where)})" if where else ""
            raise ConfigError(
                f"resources.gpu_type={res.gpu_type!r} is on no node of partition {part_name!r}{hint}; "
                f"GPU types there: {choices(types_here)}"
            )
        candidates = [n for n in candidates if n.gpu_count(res.gpu_type) >= res.gpus]
        if not candidates:
            raise ConfigError(
                f"resources.gpus={res.gpus} per node: no node of partition {part_name!r} has that many"
                f"{' ' + res.gpu_type if res.gpu_type else ''} GPUs"
            )
    cpus_needed = res.tasks_per_node * res.cpus_per_task
    max_cpus = max((n.cpus for n in candidates), default=0)
    if cpus_needed > max_cpus:
        raise ConfigError(
            f"resources.tasks_per_node × resources.cpus_per_task = {cpus_needed} CPUs per node, but nodes of "
            f"partition {part_name!r} have at most {max_cpus}"
        )
    if res.mem is not None:
        mb = mem_to_mb(res.mem)
        max_mem = max((n.mem_mb for n in candidates), default=0)
        if mb > max_mem:
            raise ConfigError(
                f"resources.mem={res.mem!r} ({mb} MB) exceeds the largest node of partition {part_name!r} "
                f"({max_mem} MB)"
            )
    if len(candidates) < res.nodes:
        raise ConfigError(
            f"resources.nodes={res.nodes} but partition {part_name!r} has only {len(candidates)} node(s) that fit"
        )
    seconds = slurm_time_to_seconds(res.time)
    if part.max_time_s is not None and seconds > part.max_time_s:
        raise ConfigError(
            f"resources.time={res.time!r} exceeds the limit of partition {part_name!r} "
            f"({seconds_to_slurm_time(part.max_time_s)})"
        )
