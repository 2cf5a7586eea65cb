"""ddp_gloo: a multi-node torch.distributed (gloo, CPU) job through the runtime.

One process per task (`resources.nodes` × `resources.tasks_per_node`), data-parallel over
a fixed regression data set. Every rank draws its own random numbers — dropout from its own
torch seed, input noise from its own generator — as augmentation and sampling do in real
training. Every rank agrees on the step to stop at (the step loop's all-reduce), rank 0
writes the checkpoint with every rank's RNG and generator state gathered into it, and each
rank resumes with its own: a preempted run ends with the same parameters as one that never
stopped, on the same nodes or on others.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig
from torch.nn.parallel import DistributedDataParallel

from slurmagent.runtime import StepLoop, current
from slurmagent.runtime.distributed import init_process_group
from slurmagent.runtime.torch_state import ResumableBatches, TorchState, state_hash

log = logging.getLogger(__name__)


def train(cfg: DictConfig) -> dict[str, Any]:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    d = cfg.ddp
    ctx = current()
    init_process_group("gloo", timeout_s=float(d.get("timeout_s", 120)))  # rendezvous from the job
    ddp: DistributedDataParallel | None = None
    try:
        gen = torch.Generator().manual_seed(int(d.seed))
        x = torch.randn(int(d.samples), int(d.features), generator=gen)
        y = x @ torch.randn(int(d.features), 1, generator=gen) + 0.1 * torch.randn(int(d.samples), 1, generator=gen)
        torch.manual_seed(int(d.seed))  # the same initial model on every rank
        model = torch.nn.Sequential(
            torch.nn.Linear(int(d.features), 32),
            torch.nn.Tanh(),
            torch.nn.Dropout(float(d.get("dropout", 0.1))),
            torch.nn.Linear(32, 1),
        )
        ddp = DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=float(d.lr), momentum=0.9)
        batches = ResumableBatches(int(d.samples), int(d.batch_size), seed=int(d.seed))
        torch.manual_seed(int(d.seed) + 1000 * (ctx.rank + 1))  # each rank's own dropout masks
        noise = torch.Generator().manual_seed(int(d.seed) + ctx.rank)  # each rank's own augmentation
        state = TorchState(model, opt, data=batches, generators={"noise": noise})
        loop = StepLoop(ctx, state, total_steps=int(d.steps))  # the job's checkpoint.* policy
        for step in loop:
            shard = batches.indices(step)[ctx.rank :: ctx.world_size]  # this rank's part of the global batch
            inputs = x[shard] + float(d.get("noise", 0.01)) * torch.randn(len(shard), x.shape[1], generator=noise)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(inputs), y[shard])
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
        dist.barrier()  # no rank tears the group down while another still uses it
        return result
    finally:
        # DDP's reducer holds the process group: freed after destroy_process_group, the gloo
        # group's destructor can hang joining its threads (seen: a rank alive to its time limit)
        del ddp
        dist.destroy_process_group()
