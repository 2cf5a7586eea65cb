"""The on-node runtime: what training code sees.

    from slurmagent import runtime
    ctx = runtime.current()                 # job id, attempt, checkpoint dir, resources…
    loop = runtime.StepLoop(ctx, state, total_steps=1000)   # checkpoint.* of the job spec
    for step in loop: ...; loop.report(loss=...)

The names below are loaded on first use, so importing one runtime module (a skill reading
checkpoints, the job's environment schema) does not import the whole runtime. The torch
helper (`slurmagent.runtime.torch_state`) is imported on demand, so this package works
without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slurmagent.runtime.checkpoint import CheckpointEntry, CheckpointManager
    from slurmagent.runtime.context import JobContext, context_from_env, current, set_current
    from slurmagent.runtime.loop import Stateful, StepLoop, StopForRequeue
    from slurmagent.runtime.signals import StopFlag

_WHERE = {
    "CheckpointEntry": "checkpoint",
    "CheckpointManager": "checkpoint",
    "JobContext": "context",
    "context_from_env": "context",
    "current": "context",
    "set_current": "context",
    "Stateful": "loop",
    "StepLoop": "loop",
    "StopForRequeue": "loop",
    "StopFlag": "signals",
}

__all__ = [
    "CheckpointEntry",
    "CheckpointManager",
    "JobContext",
    "Stateful",
    "StepLoop",
    "StopFlag",
    "StopForRequeue",
    "context_from_env",
    "current",
    "set_current",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'slurmagent.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(f"slurmagent.runtime.{module}"), name)
