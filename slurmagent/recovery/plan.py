"""What to do after a task ended without a result: resubmit with adjusted resources, or
stop with the diagnosis. Pure: it takes the spec, the attempts, the diagnosis and the
cluster's facts, so every rule is tested on recorded inputs.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from slurmagent.commands import module_argv
from slurmagent.config import JobSpec, ResourcesConf, SiteConf, default_site
from slurmagent.recovery.diagnose import Diagnosis
from slurmagent.slurm.cluster import ClusterInfo
from slurmagent.syntax import format_mb, mem_to_mb, seconds_to_slurm_time, slurm_time_to_seconds, split_hostlist

MEM_FACTOR = 1.5  # host OOM: ask for this much more memory, up to the largest node's
TIME_FACTOR = 2.0  # time limit: ask for this much more time, up to the partition's limit
NODE_SUSPECT_CAUSES = frozenset(
    {"node_failure", "ecc_error", "xid", "nccl_error", "nccl_timeout", "cuda_illegal_address", "gpu_suspect"}
)
# causes that exclude the node at once; the others only when the same node failed before
EXCLUDE_AT_ONCE = frozenset({"node_failure", "gpu_suspect"})


@dataclass(frozen=True)
class Resubmit:
    resources: ResourcesConf  # the adjusted request
    reason: str  # why, in one sentence
    changes: dict[str, tuple[object, object]]  # key → (old, new)


@dataclass(frozen=True)
class Stop:
    reason: str  # the one clear sentence the task ends with


def _grown(current: int, factor: float, cap: int | None) -> int | None:
    """`current` × `factor`, at most `cap`; None when that is no more than `current`."""
    new = int(max(current, 1) * factor)
    if cap:
        new = min(new, cap)
    return new if new > current else None


def _partition(spec: JobSpec, cluster: ClusterInfo | None) -> str | None:
    if cluster is None:
        return spec.resources.partition
    return spec.resources.partition or cluster.default_partition


def _add_exclude(current: str | None, nodes: str) -> str:
    have = split_hostlist(current)
    have += [n for n in split_hostlist(nodes) if n not in have]
    return ",".join(have)


def exclude_nodes(res: ResourcesConf, nodes: str) -> tuple[ResourcesConf, dict[str, tuple[object, object]]]:
    """`res` with `nodes` added to `exclude`, and taken out of a `resources.extra.nodelist`
    that names them (sbatch refuses a node both required and excluded; a job pinned to a
    failed node would otherwise wait for it forever). Returns the changes, key → (old, new)."""
    excl = _add_exclude(res.exclude, nodes)
    changes: dict[str, tuple[object, object]] = {"exclude": (res.exclude, excl)}
    extra = dict(res.extra)
    for key in [k for k in extra if k.replace("_", "-") == "nodelist"]:
        required = split_hostlist(extra[key])
        excluded = set(split_hostlist(excl))
        # a bracketed range cannot be checked without Slurm's hostlist code: drop the pin
        keep = [n for n in required if n not in excluded and "[" not in n]
        if keep != required:
            if keep:
                extra[key] = ",".join(keep)
            else:
                del extra[key]
            changes[f"extra.{key}"] = (",".join(required), ",".join(keep) or None)
    return dataclasses.replace(res, exclude=excl, extra=extra), changes


def plan(
    spec: JobSpec,
    attempts_so_far: int,
    diagnosis: Diagnosis,
    last_nodes: str,
    cluster: ClusterInfo | None,
    suspect_nodes: dict[str, int] | None = None,
    site: SiteConf | None = None,
) -> Resubmit | Stop:
    """What to do after attempt `attempts_so_far` ended with `diagnosis`; `site` is the GPU
    catalogue (memory per type: Slurm does not know it), the packaged one when not given."""
    res = spec.resources
    bound = spec.recovery.max_attempts
    if not diagnosis.retryable:
        return Stop(f"{diagnosis.summary} Not retried: {diagnosis.suggestion}.")
    if attempts_so_far >= bound:
        return Stop(f"gave up after {attempts_so_far} attempt(s) (recovery.max_attempts={bound}): {diagnosis.summary}")
    part = _partition(spec, cluster)
    if diagnosis.cause == "gpu_oom":
        # the runtime's MicroBatcher halves the micro-batch in process first; reaching here
        # means that was not used or not enough: move to a GPU type with more memory than the
        # one it ran on (a job asking for any type: the type of the node it ran on)
        catalogue = site or default_site()
        ran_type = res.gpu_type or type_ran_on(last_nodes, cluster, catalogue)
        excluded = split_hostlist(res.exclude)
        bigger = bigger_gpu(ran_type, cluster, part, catalogue, avoid=excluded)
        if bigger is None:
            have = catalogue.memory_gib(ran_type)
            what = f"{ran_type} ({have:g} GiB)" if ran_type and have is not None else (ran_type or "the one it ran on")
            where = f" outside resources.exclude={res.exclude}" if excluded else ""
            return Stop(
                f"{diagnosis.summary} Not retried: no GPU type with more memory than {what} on this cluster{where}; "
                "use slurmagent.runtime.microbatch.MicroBatcher (halves the micro-batch with gradient "
                "accumulation) or a smaller model."
            )
        new_type, new_part = bigger
        changes: dict[str, tuple[object, object]] = {"gpu_type": (res.gpu_type, new_type)}
        new_res = dataclasses.replace(res, gpu_type=new_type)
        if new_part != part:
            changes["partition"] = (res.partition, new_part)
            new_res = dataclasses.replace(new_res, partition=new_part)
        ran = ran_type if res.gpu_type else f"{ran_type} (any type asked; it ran on {last_nodes})"
        return Resubmit(new_res, f"GPU OOM on {ran}: resubmit on {new_type}", changes)
    if diagnosis.cause == "host_oom":
        current = mem_to_mb(res.mem) if res.mem else 0
        largest = None
        if cluster is not None and part in cluster.partitions:
            largest = max(
                (cluster.nodes[n].mem_mb for n in cluster.partitions[part].nodes if n in cluster.nodes), default=None
            )
        new = _grown(current, MEM_FACTOR, largest)
        if new is None:
            return Stop(
                f"{diagnosis.summary} It already asks for {res.mem}, the most a node of partition {part!r} "
                "has; reduce the job's memory use (batch size, data loader workers)."
            )
        new_mem = format_mb(new)
        return Resubmit(
            dataclasses.replace(res, mem=new_mem),
            f"host OOM at --mem={res.mem}: resubmit with --mem={new_mem}",
            {"mem": (res.mem, new_mem)},
        )
    if diagnosis.cause == "time_limit":
        current_s = slurm_time_to_seconds(res.time)
        limit = cluster.partitions[part].max_time_s if cluster is not None and part in cluster.partitions else None
        new_s = _grown(current_s, TIME_FACTOR, limit)
        if new_s is None:
            return Stop(
                f"{diagnosis.summary} It already asks for {res.time}, partition {part!r}'s limit; "
                "checkpoint more often or use a partition with a longer limit."
            )
        new_time = seconds_to_slurm_time(new_s)
        return Resubmit(
            dataclasses.replace(res, time=new_time),
            f"time limit {res.time} reached: resubmit with --time={new_time}",
            {"time": (res.time, new_time)},
        )
    if diagnosis.cause in NODE_SUSPECT_CAUSES and last_nodes:
        seen = dict(suspect_nodes or {})
        # a node failure excludes at once; GPU/NCCL errors only when the same node failed before
        repeat = any(seen.get(n, 0) >= 1 for n in last_nodes.split(","))
        if diagnosis.cause in EXCLUDE_AT_ONCE or repeat:
            new_res, changes = exclude_nodes(res, last_nodes)
            return Resubmit(
                new_res, f"{diagnosis.cause} on {last_nodes}: resubmit excluding {new_res.exclude}", changes
            )
    return Resubmit(res, f"{diagnosis.cause}: resubmit unchanged (attempt {attempts_so_far + 1} of {bound})", {})


def type_ran_on(nodes: str, cluster: ClusterInfo | None, site: SiteConf) -> str | None:
    """The GPU type a job that asked for any type ran on: the type of its nodes (on a node
    with several types, the one with the most memory: the job needs more than any it may have had)."""
    if cluster is None:
        return None
    types = {t for n in split_hostlist(nodes) if n in cluster.nodes for t in cluster.nodes[n].gpus if t}
    return max(types, key=lambda t: (site.memory_gib(t) or 0, t), default=None)


def bigger_gpu(
    current: str | None,
    cluster: ClusterInfo | None,
    partition: str | None,
    site: SiteConf,
    avoid: Sequence[str] = (),
) -> tuple[str, str] | None:
    """The smallest GPU type on the cluster with more memory than `current` (memory from the
    site's catalogue), and a partition with nodes of that type (the job's own partition
    first, then the default), on nodes not in `avoid` (the job's excluded nodes); None when
    there is none."""
    have = site.memory_gib(current)
    if cluster is None or have is None:
        return None
    found: dict[str, str] = {}
    ordered = sorted(cluster.partitions.values(), key=lambda p: (p.name != partition, not p.default))
    for p in ordered:
        for n in p.nodes:
            node = cluster.nodes.get(n)
            if node is None or n in avoid:
                continue
            for gpu in node.gpus:
                if (site.memory_gib(gpu) or 0) > have:
                    found.setdefault(gpu, p.name)
    if not found:
        return None
    best = min(found, key=lambda g: site.memory_gib(g) or 0)
    return best, found[best]


# the keys recovery changes (plan's Resubmit.changes), as overrides of the task's command line
_RESOURCE_KEYS = ("partition", "gpu_type", "mem", "time", "exclude")
_MISSING_MODULE = re.compile(r"No module named '([^']+)'")


def _key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def install_command(diagnosis: Diagnosis, python: str) -> str | None:
    """`PYTHON -m pip install MODULE` for a module missing from the job's environment (the
    distribution that provides a top-level module usually has its name; not always: sklearn)."""
    if diagnosis.cause != "missing_module":
        return None
    found = next((m for e in diagnosis.evidence if (m := _MISSING_MODULE.search(e.text))), None)
    return shlex.join([python, "-m", "pip", "install", found.group(1).split(".")[0]]) if found else None


def fix_command(
    diagnosis: Diagnosis,
    spec: JobSpec,
    overrides: Sequence[str],
    last_nodes: str,
    cluster: ClusterInfo | None,
    python: str,
    suspect_nodes: dict[str, int] | None = None,
    site: SiteConf | None = None,
) -> str | None:
    """The command that applies the fix of a task recovery did not (or no longer may) retry,
    where the fix is a command; None where it is not (a code bug, a full disk, a bad path).

    - a module missing from the job's environment: `PYTHON -m pip install MODULE`;
    - a cause a resubmission can fix (host or GPU OOM, a time limit, a failed node): the task
      launched again — its own overrides, `-m` so it goes to the same backend — with the
      resources recovery would give its next attempt (`plan` as if no attempt had been made),
      every resource recovery has changed so far included (`spec` is the latest attempt's)."""
    if diagnosis.cause == "missing_module":
        return install_command(diagnosis, python)
    if not diagnosis.retryable:
        return None
    step = plan(spec, 0, diagnosis, last_nodes, cluster, suspect_nodes, site)
    if not isinstance(step, Resubmit) or not step.changes:
        return None
    res = step.resources
    changed = {k: getattr(res, k) for k in _RESOURCE_KEYS if getattr(res, k) != getattr(ResourcesConf(), k)}
    extra = {k.split(".", 1)[1]: new for k, (_old, new) in step.changes.items() if k.startswith("extra.")}
    set_keys = {f"resources.{k}" for k in changed} | {f"resources.extra.{k}" for k in extra}
    argv = [*module_argv(python), *(o for o in overrides if _key(o) not in set_keys)]
    argv += [f"resources.{k}={_value(v)}" for k, v in changed.items()]
    argv += [
        f"++resources.extra.{k}={_value(v)}" if v is not None else f"~resources.extra.{k}" for k, v in extra.items()
    ]
    return shlex.join([*argv, "-m"])


def _value(value: object) -> str:
    """A value as Hydra's override grammar reads it back as that string: quoted where it has
    a comma (a sweep under -m), brackets (a list) or other characters of the grammar."""
    if value is None:
        return "null"
    text = str(value)
    if re.fullmatch(r"[\w.:/@-]+", text):
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'
