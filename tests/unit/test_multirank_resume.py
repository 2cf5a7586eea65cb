"""Exact resume with per-rank randomness, on two local gloo processes (the real 2-node case,
preempted by Slurm: tests/slurm/test_multinode_slurm.py). Each rank draws its own dropout
masks and input noise; rank 0 gathers every rank's RNG and generator state into the one
checkpoint, each rank restores its own, and a run stopped at step 7 and resumed ends with
the same parameters as a run never stopped. Restoring only rank 0's state would not."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

WORKER = r"""
import json, os, signal, sys
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from slurmagent.config import CheckpointConf
from slurmagent.runtime import StepLoop, StopForRequeue, context_from_env
from slurmagent.runtime.torch_state import ResumableBatches, TorchState, state_hash

out, stop_at = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(1)
ctx = context_from_env(output_dir=out)
dist.init_process_group("gloo", init_method="env://", rank=ctx.rank, world_size=ctx.world_size)
gen = torch.Generator().manual_seed(0)
x, y = torch.randn(256, 8, generator=gen), torch.randn(256, 1, generator=gen)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
ddp = DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
torch.manual_seed(100 + ctx.rank)
noise = torch.Generator().manual_seed(7 + ctx.rank)
batches = ResumableBatches(256, 32, seed=1)
loop = StepLoop(ctx, TorchState(model, opt, data=batches, generators={"noise": noise}), 20,
                CheckpointConf(every_steps=0), install_signal_handlers=False)
try:
    for step in loop:
        if step == stop_at and ctx.rank == 1:
            loop.flag.handler(signal.SIGUSR2, None)  # the stop reaches one rank; all agree on it
        shard = batches.indices(step)[ctx.rank :: ctx.world_size]
        inp = x[shard] + 0.1 * torch.randn(len(shard), 8, generator=noise)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(inp), y[shard]).backward()
        opt.step()
    result = {"hash": state_hash(model), "resumed_from": loop.restored_from}
except StopForRequeue as stop:
    result = {"stopped_at": stop.step}
# as slurmagent/examples/ddp.py ends: no rank tears the group down while another still uses it,
# and DDP (its reducer holds the group) goes first, else gloo's destructor may abort or hang at exit
dist.barrier()
del ddp
dist.destroy_process_group()
print(json.dumps(result), flush=True)
# the result is out: skip the interpreter's and C++ static teardown, where a gloo/c10d thread
# still joinable can std::terminate (SIGABRT, 'terminate called without an active exception';
# seen twice in CI, never in 160 local runs). What these tests check is done by now.
os._exit(0)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(script: Path, out: Path, stop_at: int) -> list[dict[str, object]]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "SLURMAGENT"))}
    # PYTHONFAULTHANDLER: a rank that aborts prints every thread's Python stack into the failure
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(out), str(stop_at)],
            env={
                **env,
                "PYTHONFAULTHANDLER": "1",
                "RANK": str(r),
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    results = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr[-3000:]
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    return results


def test_two_ranks_with_their_own_randomness_resume_exactly(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    straight = run_ranks(script, tmp_path / "straight", stop_at=-1)
    stopped = run_ranks(script, tmp_path / "stopped", stop_at=7)
    assert stopped == [{"stopped_at": 8}, {"stopped_at": 8}]  # every rank stopped at the same step
    resumed = run_ranks(script, tmp_path / "stopped", stop_at=-1)
    assert [r["resumed_from"] for r in resumed] == [8, 8]
    assert resumed[0]["hash"] == resumed[1]["hash"] == straight[0]["hash"]  # bit-identical parameters
