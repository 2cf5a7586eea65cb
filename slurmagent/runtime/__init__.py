"""The on-node runtime: what training code sees.

    from slurmagent import runtime
    ctx = runtime.current()                 # job id, attempt, checkpoint dir, resources…
    loop = runtime.StepLoop(ctx, state, total_steps=1000, conf=cfg_checkpoint)
    for step in loop: ...; loop.report(loss=...)

The torch helper (`slurmagent.runtime.torch_state`) is imported on demand, so this
package works without torch.
"""

from slurmagent.runtime.checkpoint import CheckpointEntry, CheckpointManager
from slurmagent.runtime.context import JobContext, context_from_env, current, set_current
from slurmagent.runtime.loop import Stateful, StepLoop, StopFlag, StopForRequeue

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
