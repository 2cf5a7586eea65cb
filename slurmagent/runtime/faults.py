"""In-process handling of CUDA errors inside a training step.

`StepGuard.run(step, fn)` snapshots the training state before the step; when the step
raises a CUDA error (illegal memory access, launch failure, uncorrectable ECC…) it puts
the state back and retries, up to `retries` times. When the error persists, the same
batch is run once on the CPU with a small batch (a callable the training code provides):

- it passes on the CPU → the GPU or its node is suspect: `SuspectGPUError`, which the
  supervisor's diagnosis turns into a resubmission excluding the node;
- it fails on the CPU too → a code or data problem: `BatchFailedError`, naming the batch;
  not retried.

The messages carry fixed markers (`slurmagent: suspect GPU`, `slurmagent: batch … fails
on the CPU`) that the diagnosis rules match in the job's log.
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

from slurmagent.errors import SlurmAgentError
from slurmagent.primitives.checkpoint import Staging, snapshot
from slurmagent.runtime.loop import Stateful

log = logging.getLogger(__name__)

# the messages CUDA (through torch) gives for errors a retry or another GPU can cure
CUDA_ERROR = re.compile(
    r"CUDA error: (an illegal memory access was encountered|unspecified launch failure|"
    r"uncorrectable ECC error encountered|an illegal instruction was encountered|misaligned address)"
)

R = TypeVar("R")


class SuspectGPUError(SlurmAgentError, RuntimeError):
    """A CUDA error persisted over retries while the same batch runs fine on the CPU."""


class BatchFailedError(SlurmAgentError, RuntimeError):
    """A step fails on the GPU and on the CPU alike: a code or data problem."""


def is_cuda_error(exc: BaseException) -> bool:
    """A CUDA runtime error (torch raises torch.AcceleratorError, a RuntimeError) that a
    retry or another GPU may cure; device-side asserts and OOM are not in this set."""
    return isinstance(exc, RuntimeError) and CUDA_ERROR.search(str(exc)) is not None


@dataclass
class StepGuard:
    state: Stateful  # what a retry puts back (model, optimiser, RNG…)
    cpu_check: Callable[[int], Any] | None = None  # runs step N's batch on the CPU, small batch; raises on failure
    retries: int = 3  # retries of a failing step from the state before it
    node: str | None = None  # this job's node, named in the suspect-GPU message
    events: list[str] = field(default_factory=list)  # what happened, for logs and tests

    _staging: Staging = field(default_factory=Staging, repr=False)  # snapshot memory, reused every step

    def run(self, step: int, fn: Callable[[], R]) -> R:
        # the same snapshot as a background checkpoint's: tensors copied into memory reused
        # from the previous step, so the per-step cost is a copy, not an allocation
        before = snapshot(self.state.state_dict(), self._staging)
        last: BaseException | None = None
        for attempt in range(self.retries + 1):
            try:
                return fn()
            except RuntimeError as exc:
                if not is_cuda_error(exc):
                    raise
                last = exc
                # a private copy: an optimiser may keep the tensors it is given, and the
                # staging memory is reused by the next step's snapshot
                self.state.load_state_dict(copy.deepcopy(before))
                msg = f"step {step}: {first_line(exc)} (try {attempt + 1} of {self.retries + 1})"
                self.events.append(msg)
                log.warning(msg)
        assert last is not None
        self._after_retries(step, last)

    def _after_retries(self, step: int, error: BaseException) -> NoReturn:
        where = f" on node {self.node}" if self.node else ""
        if self.cpu_check is None:
            raise SuspectGPUError(
                f"slurmagent: suspect GPU{where}: step {step} failed {self.retries + 1} times with "
                f"{first_line(error)!r}; no CPU check was given, so the batch was not re-run on the CPU"
            ) from error
        try:
            self.cpu_check(step)
        except Exception as cpu_exc:
            raise BatchFailedError(
                f"slurmagent: batch of step {step} fails on the CPU too ({type(cpu_exc).__name__}: {cpu_exc}): "
                f"a code or data problem, not the GPU; first GPU error: {first_line(error)}"
            ) from cpu_exc
        self.events.append(f"step {step}: passes on the CPU")
        raise SuspectGPUError(
            f"slurmagent: suspect GPU{where}: step {step} failed {self.retries + 1} times with "
            f"{first_line(error)!r} but its batch passes on the CPU"
        ) from error


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
