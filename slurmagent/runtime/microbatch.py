"""`MicroBatcher`: one optimisation step as micro-batches with gradient accumulation, halving
the micro-batch on a GPU out-of-memory error and retrying the step.

The maths stays the same: each micro-batch's mean loss is weighted by its share of the batch,
so the accumulated gradient is the full batch's mean gradient (up to float summation order)
and the effective batch size never changes. Past `max_halvings` it raises
`MicroBatchExhausted`, whose message recovery reads (recovery/diagnose.py: gpu_oom) to move
the task to a GPU type with more memory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from slurmagent.errors import SlurmAgentError

__all__ = ["MicroBatchExhausted", "MicroBatcher"]

log = logging.getLogger(__name__)


class MicroBatchExhausted(SlurmAgentError, RuntimeError):
    """Out of GPU memory even at the smallest allowed micro-batch."""


@dataclass
class MicroBatcher:
    micro_batch: int  # samples per forward/backward pass
    max_halvings: int = 3  # halvings allowed before giving up (then: a bigger GPU)
    halvings: int = 0  # halvings done so far
    events: list[str] = field(default_factory=list)  # what happened, for the audit/log

    @property
    def accumulation(self) -> int:
        """Micro-batches per step at the current size (for a batch of `micro_batch × 2^halvings`)."""
        return int(2**self.halvings)

    def step(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        optimizer: torch.optim.Optimizer,
    ) -> float:
        """Zero grads, accumulate over micro-batches, step; on CUDA OOM halve and redo the step."""
        n = len(x)
        while True:
            try:
                optimizer.zero_grad(set_to_none=True)
                total = 0.0
                for start in range(0, n, self.micro_batch):
                    xb, yb = x[start : start + self.micro_batch], y[start : start + self.micro_batch]
                    loss = loss_fn(xb, yb) * (len(xb) / n)
                    loss.backward()  # type: ignore[no-untyped-call]
                    total += float(loss.detach())
                optimizer.step()
                return total
            except torch.OutOfMemoryError as exc:
                optimizer.zero_grad(set_to_none=True)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                if self.halvings >= self.max_halvings or self.micro_batch <= 1:
                    raise MicroBatchExhausted(
                        f"CUDA out of memory at micro-batch {self.micro_batch} after {self.halvings} halving(s): "
                        f"this model needs a GPU with more memory ({exc})"
                    ) from exc
                self.micro_batch //= 2
                self.halvings += 1
                msg = f"CUDA OOM: micro-batch halved to {self.micro_batch}, gradient accumulation ×{self.accumulation}"
                self.events.append(msg)
                log.warning(msg)
