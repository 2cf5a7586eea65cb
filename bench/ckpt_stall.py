"""Checkpoint stall: how long a training loop is blocked per checkpoint of a ~100M-parameter
model (parameters + Adam state) on CPU, synchronous torch.save vs slurmagent's StepLoop.
See bench/README.md for what is measured and how to rerun.

    python bench/ckpt_stall.py [--reps 3] [--saves 2] [--steps-between 3]

Three ways to checkpoint the same training loop, interleaved per repetition so they share
the machine's noise:
  torch.save       the user's loop calls torch.save(state, path) every N steps
  slurmagent sync  StepLoop with background_saves=False (atomic write, fsync, manifest)
  slurmagent bg    StepLoop as shipped: snapshot, then the write in a background thread
The blocked time is measured from outside, the same way for all three: from the end of the
step body that finishes step N to the start of the next step body. The median is over the
checkpoints after each run's first: a job checkpoints many times, and slurmagent's first
snapshot also pays for faulting in its snapshot memory (reported apart).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from slurmagent.config import CheckpointConf
from slurmagent.runtime import StepLoop, context_from_env
from slurmagent.runtime.torch_state import TorchState

BENCH = Path(__file__).resolve().parent


@dataclass
class Run:
    variant: str
    rep: int
    blocked_s: list[float] = field(default_factory=list)  # per periodic checkpoint; the first is a cold one
    step_s: list[float] = field(default_factory=list)  # step bodies with no write in flight
    step_writing_s: list[float] = field(default_factory=list)  # step bodies while a background write ran
    write_s: list[float] = field(default_factory=list)  # save start to durable file (slurmagent variants)
    snapshot_s: list[float] = field(default_factory=list)  # slurmagent bg: blocked time less waiting
    waited_s: list[float] = field(default_factory=list)  # slurmagent bg: waiting for the previous write


class Trainer:
    """A ~100M-parameter MLP with Adam; one step = forward, backward, optimiser step."""

    def __init__(self, width: int, layers: int, batch: int) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-5)
        self.x = torch.randn(batch, width)
        self.step()  # Adam's moments exist from here on: the checkpoint has its full size

    @property
    def params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def step(self) -> None:
        loss = self.model(self.x).square().mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()


def timed_loop(
    steps: Iterable[int], trainer: Trainer, every: int, run: Run, writing: Callable[[], bool] = lambda: False
) -> None:
    """Run `trainer.step` for each step; record the gap after every Nth step (the loop's
    own checkpoint, or the one `steps` does) and the step bodies' durations."""
    body_end: float | None = None
    last = -1
    for step in steps:
        start = time.perf_counter()
        if body_end is not None and last >= 0 and (last + 1) % every == 0:
            run.blocked_s.append(start - body_end)
        in_flight = writing()
        trainer.step()
        body_end = time.perf_counter()
        (run.step_writing_s if in_flight else run.step_s).append(body_end - start)
        last = step


def torch_save_steps(trainer: Trainer, total: int, every: int, path: Path) -> Iterable[int]:
    """The user's loop: torch.save(state) after every Nth step."""
    for step in range(total):
        yield step
        if (step + 1) % every == 0 and step + 1 < total:
            torch.save({"model": trainer.model.state_dict(), "optimizer": trainer.opt.state_dict()}, path)


def run_variant(variant: str, rep: int, trainer: Trainer, saves: int, every: int, root: Path) -> Run:
    run = Run(variant, rep)
    total = saves * every + 1  # the last step is followed by the loop's final save, not counted
    work = root / f"{variant.replace(' ', '_')}_{rep}"
    work.mkdir()
    if variant == "torch.save":
        timed_loop(torch_save_steps(trainer, total, every, work / "ckpt.pt"), trainer, every, run)
    else:
        ctx = context_from_env({}, output_dir=work)
        state = TorchState(trainer.model, trainer.opt)
        loop = StepLoop(
            ctx, state, total, conf=CheckpointConf(every_steps=every, keep_last=1), install_signal_handlers=False
        )
        loop.background_saves = variant == "slurmagent bg"

        def steps() -> Iterable[int]:
            seen = 0.0
            for step in loop:
                if step and step % every == 0 and loop.background_saves:  # the loop just saved
                    run.waited_s.append(loop.manager.last_wait_s)
                    run.snapshot_s.append(loop.manager.last_blocked_s - loop.manager.last_wait_s)
                if loop.last_save_seconds != seen:  # a save became durable: how long it took
                    seen = loop.last_save_seconds
                    run.write_s.append(seen)
                yield step

        timed_loop(steps(), trainer, every, run, writing=lambda: loop.manager.writing)
    shutil.rmtree(work)
    return run


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def summarise(runs: list[Run], variants: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for v in variants:
        mine = [r for r in runs if r.variant == v]
        blocked = [b for r in mine for b in r.blocked_s[1:]]
        cold = [r.blocked_s[0] for r in mine if r.blocked_s]
        out[v] = {
            "checkpoints": len(blocked),
            "blocked_median_s": median(blocked),
            "blocked_min_s": round(min(blocked), 3),
            "blocked_max_s": round(max(blocked), 3),
            "first_checkpoint_blocked_median_s": median(cold),
            "step_median_s": median([s for r in mine for s in r.step_s]),
            "step_while_writing_median_s": median([s for r in mine for s in r.step_writing_s]),
            "write_to_durable_s": median([s for r in mine for s in r.write_s]),
            "snapshot_median_s": median([s for r in mine for s in r.snapshot_s[1:]]),
            "waited_for_previous_write_median_s": median([s for r in mine for s in r.waited_s[1:]]),
        }
    base = out["torch.save"]["blocked_median_s"]
    base_cold = out["torch.save"]["first_checkpoint_blocked_median_s"]
    for v in variants:
        out[v]["ratio_to_torch_save"] = round(out[v]["blocked_median_s"] / base, 3)
        out[v]["first_checkpoint_ratio"] = round(out[v]["first_checkpoint_blocked_median_s"] / base_cold, 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--width", type=int, default=3584)
    ap.add_argument("--layers", type=int, default=8)  # 8 x (3584^2 + 3584) = 102.8M parameters
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--saves", type=int, default=3, help="checkpoints per run (the first is not in the median)")
    ap.add_argument("--steps-between", type=int, default=2)
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp"), help="where checkpoints are written (a disk)")
    ap.add_argument("--out", type=Path, default=BENCH / "results" / "ckpt_stall.json")
    args = ap.parse_args()

    trainer = Trainer(args.width, args.layers, args.batch)
    state_bytes = sum(t.numel() * t.element_size() for t in trainer.model.state_dict().values()) * 3
    print(f"model: {trainer.params / 1e6:.1f}M parameters; checkpoint ~{state_bytes / 2**30:.2f} GiB", flush=True)
    variants = ["torch.save", "slurmagent sync", "slurmagent bg"]
    runs: list[Run] = []
    root = Path(tempfile.mkdtemp(prefix="ckpt_stall.", dir=args.dir))
    try:
        for rep in range(args.reps):
            for v in variants if rep % 2 == 0 else reversed(variants):
                run = run_variant(v, rep, trainer, args.saves, args.steps_between, root)
                runs.append(run)
                print(
                    f"rep {rep} {v:16s} blocked {[round(b, 3) for b in run.blocked_s]} "
                    f"step {median(run.step_s)} step-while-writing {median(run.step_writing_s)}",
                    flush=True,
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary = summarise(runs, variants)
    result = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "host": platform.node(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "params": trainer.params,
        "checkpoint_bytes_approx": state_bytes,
        "args": {k: str(v) for k, v in vars(args).items()},
        "summary": summary,
        "runs": [asdict(r) for r in runs],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(summary, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
