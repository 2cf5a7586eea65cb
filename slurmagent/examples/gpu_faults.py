"""gpu_faults: GPU failures injected into real torch training, for fault tests and demos.

There is no NVIDIA GPU on the machines this project is tested on, so the GPU is EMULATED
here, and only the GPU: the training (model, optimiser, micro-batching, checkpoints) is
real torch on the CPU, and the failures are raised from the training step with the exact
exception types and messages torch raises on a GPU:

- `gpu_oom`: an emulated memory capacity per GPU type (`EMULATED_MEMORY_MIB`, a fixed
  fraction of the real card's memory, from resources.gpu_type); a micro-batch that needs
  more raises torch.OutOfMemoryError. The MicroBatcher halves the micro-batch (gradient
  accumulation keeps the maths); past its halvings the job fails and the supervisor
  moves it to a GPU type with more memory.
- `cuda_error`: torch.AcceleratorError "CUDA error: an illegal memory access was
  encountered" at step `fault_step`, `fault_times` times (transient: retried in process),
  or on every try when running on node `bad_node` (persistent: the StepGuard's CPU check
  passes, the node is suspect and the supervisor resubmits excluding it).
- `nccl`: torch.distributed.DistBackendError "NCCL error in: …" at `fault_step` on the
  first attempt (the supervisor retries once; the same node twice is excluded).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from omegaconf import DictConfig

from slurmagent.config import checkpoint_conf, site_conf, spec_dict
from slurmagent.runtime import StepLoop, current
from slurmagent.runtime.faults import StepGuard
from slurmagent.runtime.microbatch import MicroBatcher
from slurmagent.runtime.torch_state import ResumableBatches, TorchState, state_hash

log = logging.getLogger(__name__)

FAULTS = ("none", "gpu_oom", "cuda_error", "nccl")


def _oom(need: float, have: float) -> torch.OutOfMemoryError:
    return torch.OutOfMemoryError(
        f"CUDA out of memory. Tried to allocate {need:.2f} MiB. GPU 0 has a total capacity of {have:.2f} MiB "
        "(emulated GPU: no NVIDIA GPU on this machine)"
    )


def train(cfg: DictConfig) -> dict[str, Any]:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    g = cfg.gpu_faults
    fault = str(g.fault)
    if fault not in FAULTS:
        from slurmagent.errors import ConfigError, choices

        raise ConfigError(f"gpu_faults.fault={fault!r}; valid: {choices(FAULTS)}")
    ctx = current()
    gen = torch.Generator().manual_seed(int(g.seed))
    n, dim = int(g.samples), int(g.features)
    x = torch.randn(n, dim, generator=gen)
    y = (x @ torch.randn(dim, 1, generator=gen)).squeeze(1)
    torch.manual_seed(int(g.seed))
    model = torch.nn.Sequential(torch.nn.Linear(dim, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=float(g.lr))
    batches = ResumableBatches(n, int(g.batch_size), seed=int(g.seed))
    state = TorchState(model, opt, data=batches)
    ck = checkpoint_conf(cfg)
    loop = StepLoop(ctx, state, total_steps=int(g.steps), conf=ck)
    batcher = MicroBatcher(int(g.batch_size), max_halvings=int(g.max_halvings))
    gpu_type = str(ctx.resources.get("gpu_type") or "t4")
    # emulated capacity: 1 MiB per GiB of the real card (the site's catalogue), so small CPU models hit it
    capacity = float(site_conf(spec_dict(cfg, ("site",)).get("site")).memory_gib(gpu_type) or 16)
    per_sample = float(g.sample_mib)
    injected = {"cuda": 0}
    bad_node = str(g.bad_node)
    if bad_node == "first":  # the node of the task's first attempt has the broken GPU
        marker = ctx.output_dir / "emulated_bad_node"
        if not marker.exists():
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(ctx.node or "")
        bad_node = marker.read_text()

    def loss_fn(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        if fault == "gpu_oom" and len(xb) * per_sample > capacity:
            raise _oom(len(xb) * per_sample, capacity)
        return torch.nn.functional.mse_loss(model(xb).squeeze(1), yb)

    def one_step(step: int) -> float:
        idx = batches.indices(step)
        loss = batcher.step(x[idx], y[idx], loss_fn, opt)
        if fault == "cuda_error" and step == int(g.fault_step):
            on_bad_node = bool(bad_node) and ctx.node == bad_node
            if on_bad_node or injected["cuda"] < int(g.fault_times):
                injected["cuda"] += 1
                raise torch.AcceleratorError(
                    "CUDA error: an illegal memory access was encountered\n"
                    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
                    "below might be incorrect."
                )
        if fault == "nccl" and step == int(g.fault_step) and ctx.attempt == 1:
            raise torch.distributed.DistBackendError(
                "NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system error "
                "(run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5 (emulated: no NCCL on this machine)"
            )
        return loss

    def cpu_check(step: int) -> None:
        idx = batches.indices(step)[:8]  # the same batch, small, on the CPU
        with torch.no_grad():
            out = model(x[idx]).squeeze(1)
        if not torch.isfinite(out).all():
            raise FloatingPointError(f"non-finite output for samples {idx.tolist()}")

    guard = StepGuard(state, cpu_check=cpu_check, node=ctx.node)
    for step in loop:
        loss = guard.run(step, lambda s=step: one_step(s))  # type: ignore[misc]
        loop.report(loss=loss)
        if g.step_delay_s:
            time.sleep(float(g.step_delay_s))
    result = {
        "state_hash": state_hash(model),
        "steps": int(g.steps),
        "micro_batch": batcher.micro_batch,
        "halvings": batcher.halvings,
        "cuda_retries": len(guard.events),
        "gpu_type": gpu_type,
        "node": ctx.node,
        "attempt": ctx.attempt,
        "resumed_from": loop.restored_from,
    }
    log.info("gpu_faults done: %s", result)
    return result
