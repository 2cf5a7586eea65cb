"""torch.distributed the way torchrun and submitit users expect it, from the job context.

Inside a slurmagent job with more than one process, the job wrapper exports `MASTER_ADDR`,
`MASTER_PORT`, `RANK`, `WORLD_SIZE` and `LOCAL_RANK` (`rendezvous_env`), so
`torch.distributed.init_process_group("gloo")` — or `init_process_group()` here, which picks
NCCL when CUDA is there — needs no arguments:

    from slurmagent.runtime import current
    from slurmagent.runtime.distributed import init_process_group
    init_process_group()                 # every rank of the job joins
    ...                                  # DistributedDataParallel, StepLoop as usual

Rank 0's address is `MASTER_ADDR` when the site sets it, else the node that launched the
job's tasks (Slurm's `SLURM_LAUNCH_NODE_IPADDR`: the job's first node, where rank 0 runs),
else the first node of `SLURM_JOB_NODELIST`. The port is derived from the job id, so every
rank agrees on it and a requeued run (same id) too.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from slurmagent.runtime.context import JobContext
from slurmagent.syntax import split_hostlist

PORT_BASE, PORT_SPAN = 20000, 20000


def first_node(nodelist: str) -> str | None:
    """`cpu-[1-2],gpu-3` → `cpu-1` (the first host of a Slurm node list)."""
    parts = split_hostlist(nodelist)
    if not parts:
        return None
    head = parts[0]
    if "[" not in head:
        return head
    prefix, _, rest = head.partition("[")
    first = rest.split("]")[0].split(",")[0].split("-")[0]
    return prefix + first + rest.split("]", 1)[1]


def rendezvous_env(ctx: JobContext, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The torchrun-style variables for this process of the job."""
    env = os.environ if env is None else env
    addr = (
        env.get("MASTER_ADDR")
        or env.get("SLURM_LAUNCH_NODE_IPADDR")
        or first_node(env.get("SLURM_JOB_NODELIST", ""))
        or "127.0.0.1"
    )
    job = int(env.get("SLURM_JOB_ID", "0") or 0)
    port = env.get("MASTER_PORT") or str(PORT_BASE + job % PORT_SPAN)
    return {
        "MASTER_ADDR": addr,
        "MASTER_PORT": port,
        "RANK": str(ctx.rank),
        "WORLD_SIZE": str(ctx.world_size),
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
    }


def init_process_group(backend: str | None = None, timeout_s: float = 300.0, **kwargs: Any) -> None:
    """Join the job's process group (env:// rendezvous from `rendezvous_env`); NCCL when
    CUDA is available, else gloo."""
    import torch
    import torch.distributed as dist

    from slurmagent.runtime.context import current

    ctx = current()
    for key, value in rendezvous_env(ctx).items():
        os.environ.setdefault(key, value)
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(
        backend,
        init_method="env://",
        rank=ctx.rank,
        world_size=ctx.world_size,
        timeout=timedelta(seconds=timeout_s),
        **kwargs,
    )
