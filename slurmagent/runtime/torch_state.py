"""Torch helper: everything exact resumption needs, as one Stateful object.

Captures model, optimiser, scheduler, the RNG states of python, numpy and torch, and the
data position (`ResumableBatches`), so a run resumed from a checkpoint continues with the
same numbers as one that never stopped.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@dataclass
class ResumableBatches:
    """Deterministic shuffled mini-batches whose position is a function of the step.

    Epoch e uses the permutation seeded by (seed, e); step s is batch s % per_epoch of
    epoch s // per_epoch. Nothing to save beyond the step — but the parameters are saved
    and checked so that a resumed run with a different batch size fails loudly.
    """

    n: int  # samples in the data set
    batch_size: int  # samples per batch
    seed: int = 0  # shuffling seed
    drop_last: bool = True  # skip the last short batch of an epoch

    @property
    def per_epoch(self) -> int:
        return self.n // self.batch_size if self.drop_last else -(-self.n // self.batch_size)

    def indices(self, step: int) -> torch.Tensor:
        epoch, k = divmod(step, self.per_epoch)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        perm = torch.randperm(self.n, generator=g)
        return perm[k * self.batch_size : (k + 1) * self.batch_size]

    def epoch(self, step: int) -> int:
        return step // self.per_epoch

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.n, "batch_size": self.batch_size, "seed": self.seed, "drop_last": self.drop_last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state != self.state_dict():
            raise ValueError(f"data order changed since the checkpoint: saved {state}, now {self.state_dict()}")


class TorchState:
    """Model + optimiser + scheduler + RNG + data position, for `StepLoop`.

    In a multi-rank job each rank's own randomness — the python/numpy/torch(/CUDA) RNG
    states and the `generators` given here (a DataLoader's or a sampler's) — is its
    `rank_state()`: rank 0 gathers every rank's into the one checkpoint and each rank gets its
    own back, so dropout, augmentation and sampling resume exactly, on any nodes."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: Any | None = None,
        data: ResumableBatches | None = None,
        extra: dict[str, Any] | None = None,
        generators: dict[str, torch.Generator] | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.data = data
        self.extra = extra if extra is not None else {}
        self.generators = generators if generators is not None else {}

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "data": self.data.state_dict() if self.data is not None else None,
            "rng": rng_state(),
            "generators": {k: g.get_state() for k, g in self.generators.items()},
            "extra": dict(self.extra),
        }

    def rank_state(self) -> dict[str, Any]:
        """What differs between ranks: RNG states and the named generators."""
        return {"rng": rng_state(), "generators": {k: g.get_state() for k, g in self.generators.items()}}

    def load_rank_state(self, state: dict[str, Any]) -> None:
        set_rng_state(state["rng"])
        for name, g in self.generators.items():
            if name in state.get("generators", {}):
                g.set_state(state["generators"][name])

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        if self.optimizer is not None and state.get("optimizer") is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.data is not None and state.get("data") is not None:
            self.data.load_state_dict(state["data"])
        set_rng_state(state["rng"])
        for name, g in self.generators.items():
            if name in state.get("generators", {}):
                g.set_state(state["generators"][name])
        self.extra.clear()
        self.extra.update(state.get("extra", {}))


def state_hash(model: torch.nn.Module) -> str:
    """sha256 over the model's parameters and buffers, for bit-exactness checks."""
    import hashlib

    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()
