"""The synthetic workload written the submitit way, for bench/preempt_goodput.py.

It does what slurmagent.examples.synthetic does (N steps of a fixed sleep, a running
sha256 over the step numbers, so a redone or skipped step changes the result) as a
submitit user writes it: a `submitit.helpers.Checkpointable` whose state is saved to a file
every `every` steps. On preemption submitit's USR2 handler calls `checkpoint()` (the
Checkpointable default: run this callable again with the same arguments), requeues the job
and exits; the requeued run resumes from the file. Each step's end time goes to
`timeline.jsonl` as {"step", "t", "attempt"}, the format slurmagent's synthetic task writes
to metrics.jsonl with `+synthetic.timeline=true`.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import time
from pathlib import Path
from typing import Any

import submitit


class SubmititSynthetic(submitit.helpers.Checkpointable):
    def __call__(self, steps: int, step_time_s: float, every: int, workdir: str) -> dict[str, Any]:
        work = Path(workdir)
        ckpt = work / "state.pkl"
        digest, start = hashlib.sha256(b"start").hexdigest(), 0
        if ckpt.exists():
            with open(ckpt, "rb") as fh:
                saved = pickle.load(fh)
            digest, start = saved["digest"], saved["step"]
        attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0")) + 1
        run_here = 0
        with open(work / "timeline.jsonl", "a") as timeline:
            for step in range(start, steps):
                time.sleep(step_time_s)
                digest = hashlib.sha256(f"{digest}:{step}".encode()).hexdigest()
                run_here += 1
                timeline.write(json.dumps({"step": step, "t": time.time(), "attempt": attempt}) + "\n")
                timeline.flush()
                if (step + 1) % every == 0:  # periodic checkpoint, written atomically
                    tmp = ckpt.with_suffix(".tmp")
                    with open(tmp, "wb") as fh:
                        pickle.dump({"digest": digest, "step": step + 1}, fh)
                        fh.flush()
                        os.fsync(fh.fileno())
                    os.replace(tmp, ckpt)
        return {"digest": digest, "steps": steps, "resumed_from": start, "attempt": attempt, "steps_run_here": run_here}
