"""GPU OOM inside a step: halve the micro-batch, accumulate gradients, same maths.

There is no GPU on the test machines: the OOM is raised by the loss function with the
real exception type (torch.OutOfMemoryError) and PyTorch's real message wording, whenever
a micro-batch is larger than a simulated memory limit.
"""

from __future__ import annotations

import pytest
import torch

from slurmagent.runtime.adapt import MicroBatcher, MicroBatchExhausted

MSG = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 15.77 GiB of which 1.12 GiB is free."
)


def trajectory(limit: int | None, steps: int = 25) -> tuple[list[float], torch.Tensor, MicroBatcher]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
    target = data.sum(1, keepdim=True)

    def loss_fn(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        if limit is not None and len(xb) > limit:
            raise torch.OutOfMemoryError(MSG)  # stands in for a real GPU running out of memory
        return torch.nn.functional.mse_loss(model(xb), yb)

    mb = MicroBatcher(micro_batch=64, max_halvings=3)
    losses = [mb.step(data, target, loss_fn, opt) for _ in range(steps)]
    return losses, torch.cat([p.detach().flatten() for p in model.parameters()]), mb


def test_halved_micro_batches_follow_the_same_loss_trajectory() -> None:
    straight, params, mb0 = trajectory(None)
    split, params_split, mb = trajectory(limit=20)  # 64 → 32 → 16 fits
    assert mb0.halvings == 0 and mb.halvings == 2 and mb.micro_batch == 16 and mb.accumulation == 4
    assert split == pytest.approx(straight, rel=1e-5, abs=1e-6)
    assert torch.allclose(params, params_split, rtol=1e-5, atol=1e-6)
    assert len(mb.events) == 2 and "gradient accumulation ×4" in mb.events[-1]


def test_gives_up_after_the_configured_halvings() -> None:
    with pytest.raises(MicroBatchExhausted, match="after 3 halving"):
        trajectory(limit=4)  # would need 64 → 4: four halvings
