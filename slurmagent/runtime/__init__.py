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
    from slurmagent.primitives.checkpoint import CheckpointEntry, CheckpointManager
    from slurmagent.primitives.signals import StopFlag
    from slurmagent.runtime.context import JobContext, context_from_env, current, set_current
    from slurmagent.runtime.loop import Stateful, StepLoop, StopForRequeue

_WHERE = {
    "CheckpointEntry": "slurmagent.primitives.checkpoint",
    "CheckpointManager": "slurmagent.primitives.checkpoint",
    "JobContext": "slurmagent.runtime.context",
    "context_from_env": "slurmagent.runtime.context",
    "current": "slurmagent.runtime.context",
    "set_current": "slurmagent.runtime.context",
    "Stateful": "slurmagent.runtime.loop",
    "StepLoop": "slurmagent.runtime.loop",
    "StopForRequeue": "slurmagent.runtime.loop",
    "StopFlag": "slurmagent.primitives.signals",
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
    return getattr(importlib.import_module(module), name)
