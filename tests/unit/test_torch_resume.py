"""Exact resumption in process: an interrupted digits run resumed from its checkpoint ends
with bit-identical parameters to an uninterrupted one (the cluster version is in tests/slurm)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from slurmagent.config import CheckpointConf
from slurmagent.examples.digits import build_model, load_digits
from slurmagent.runtime import StepLoop, context_from_env
from slurmagent.runtime.torch_state import ResumableBatches, TorchState, state_hash

STEPS = 40


def run(ckpt: Path, stop_after: int | None, seed: int = 0) -> str:
    # a resumed process seeds differently: only the checkpoint's RNG states can make it match
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    x, y = load_digits()
    model = build_model(32, 2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)
    batches = ResumableBatches(len(x), 32, seed=0)
    loop = StepLoop(
        context_from_env({}, output_dir=ckpt),
        TorchState(model, opt, sched, batches),
        STEPS,
        CheckpointConf(every_steps=7),
        install_signal_handlers=False,
    )
    for step in loop:
        idx = batches.indices(step)
        # randomness inside the step (dropout-like noise from all three RNGs) must resume too
        noise = torch.rand(1).item() * 1e-3 + random.random() * 1e-3 + float(np.random.rand()) * 1e-3
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx]) * (1 + noise)
        loss.backward()
        opt.step()
        sched.step()
        if stop_after is not None and step + 1 == stop_after:
            break
    return state_hash(model)


def test_interrupted_twice_matches_uninterrupted(tmp_path: Path) -> None:
    straight = run(tmp_path / "a", None)
    run(tmp_path / "b", 10)  # dies after step 10: the newest checkpoint is at step 7
    run(tmp_path / "b", 30, seed=1)  # resumes at 7, dies after step 30: newest is 28
    resumed = run(tmp_path / "b", None, seed=2)  # resumes at 28
    assert resumed == straight
