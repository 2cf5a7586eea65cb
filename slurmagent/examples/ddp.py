"""ddp_gloo: a multi-node torch.distributed (gloo, CPU) job through the runtime.

One process per task (`resources.nodes` × `resources.tasks_per_node`), data-parallel over
a fixed regression data set. Every rank agrees on the step to stop at (the step loop's
all-reduce), rank 0 writes the checkpoint and all ranks resume from it, so a preempted run
ends with the same parameters as one that never stopped. The data order is a function of
the step and no rank draws random numbers, so rank 0's state is the whole state.
"""

from __future__ import annotations

import logging
import os
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel

from slurmagent.config import CheckpointConf, parse_conf
from slurmagent.runtime import StepLoop, current
from slurmagent.runtime.torch_state import ResumableBatches, TorchState, state_hash

log = logging.getLogger(__name__)


def master_address() -> tuple[str, int]:
    """Rank 0's address: MASTER_ADDR/PORT when set, else the node that launched the job's
    tasks (Slurm's SLURM_LAUNCH_NODE_IPADDR: submitit runs srun on the job's first node,
    where rank 0 is), and a port derived from the job id so requeued runs agree."""
    addr = os.environ.get("MASTER_ADDR") or os.environ.get("SLURM_LAUNCH_NODE_IPADDR") or "127.0.0.1"
    job = int(os.environ.get("SLURM_JOB_ID", "0") or 0)
    port = int(os.environ.get("MASTER_PORT") or 20000 + job % 20000)
    return addr, port


def train(cfg: DictConfig) -> dict[str, Any]:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    d = cfg.ddp
    ctx = current()
    addr, port = master_address()
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{addr}:{port}",
        rank=ctx.rank,
        world_size=ctx.world_size,
        timeout=timedelta(seconds=int(d.get("timeout_s", 120))),
    )
    try:
        gen = torch.Generator().manual_seed(int(d.seed))
        x = torch.randn(int(d.samples), int(d.features), generator=gen)
        y = x @ torch.randn(int(d.features), 1, generator=gen) + 0.1 * torch.randn(int(d.samples), 1, generator=gen)
        torch.manual_seed(int(d.seed))
        model = torch.nn.Sequential(torch.nn.Linear(int(d.features), 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
        ddp = DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=float(d.lr), momentum=0.9)
        batches = ResumableBatches(int(d.samples), int(d.batch_size), seed=int(d.seed))
        ck = parse_conf(CheckpointConf, OmegaConf.to_container(cfg.checkpoint, resolve=True), "checkpoint")  # type: ignore[arg-type]
        loop = StepLoop(ctx, TorchState(model, opt, data=batches), total_steps=int(d.steps), conf=ck)
        for step in loop:
            shard = batches.indices(step)[ctx.rank :: ctx.world_size]  # this rank's part of the global batch
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x[shard]), y[shard])
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            loop.report(loss=loss.item())
            if d.get("step_delay_s"):
                time.sleep(float(d.step_delay_s))  # lets tests preempt mid-run
        result = {
            "state_hash": state_hash(model),
            "steps": int(d.steps),
            "resumed_from": loop.restored_from,
            "attempt": ctx.attempt,
            "world_size": ctx.world_size,
            "rank": ctx.rank,
        }
        log.info("ddp_gloo rank %d done: %s", ctx.rank, result)
        return result
    finally:
        dist.destroy_process_group()
