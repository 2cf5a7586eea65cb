"""CUDA errors inside a step, the stop classification and the grace window.

There is no GPU on these machines: the CUDA errors are raised from the training step as
the real exception type torch raises (torch.AcceleratorError, a RuntimeError) with the
real CUDA messages; everything else (model, optimiser, state restore) is real torch.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from slurmagent.config import CheckpointConf
from slurmagent.job.stop import classify_stop, count_time_limit_requeue
from slurmagent.recovery import Resubmit, Stop, diagnose, plan
from slurmagent.runtime.context import context_from_env
from slurmagent.runtime.faults import BatchFailedError, StepGuard, SuspectGPUError
from slurmagent.runtime.loop import StepLoop, StopForRequeue
from slurmagent.runtime.torch_state import TorchState, state_hash
from slurmagent.slurm.cluster import parse_cluster
from slurmagent.slurm.seam import parse_scontrol_config

ILLEGAL = "CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be asynchronously reported"
ECC = "CUDA error: uncorrectable ECC error encountered"


def setup() -> tuple[torch.nn.Module, torch.optim.Optimizer, TorchState, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 8), torch.randn(16, 2)
    return model, opt, TorchState(model, opt), x, y


def train(faults: dict[int, int], message: str = ILLEGAL, cpu_ok: bool = True) -> tuple[str, StepGuard]:
    model, opt, state, x, y = setup()
    left = dict(faults)

    def step_fn(step: int) -> float:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()  # the state is already changed when the error surfaces (as with async CUDA errors)
        if left.get(step, 0) > 0:
            left[step] -= 1
            raise torch.AcceleratorError(message)
        return float(loss.detach())

    def cpu_check(step: int) -> None:
        if not cpu_ok:
            raise ValueError(f"label 12 out of range for 10 classes in batch {step}")

    guard = StepGuard(state, cpu_check=cpu_check, node="t4-1")
    for step in range(5):
        guard.run(step, lambda s=step: step_fn(s))  # type: ignore[misc]
    return state_hash(model), guard


def test_transient_cuda_errors_are_retried_from_the_state_before_the_step() -> None:
    clean, _ = train({})
    retried, guard = train({1: 2, 3: 3})  # 3 failures = the last allowed retry
    assert retried == clean  # bit-identical: each retry started from the snapshot
    assert len(guard.events) == 5 and "illegal memory access" in guard.events[0]


def test_persistent_cuda_error_passing_on_cpu_suspects_the_gpu_and_excludes_the_node() -> None:
    with pytest.raises(SuspectGPUError, match="slurmagent: suspect GPU on node t4-1: step 2 failed 4 times") as exc:
        train({2: 10}, message=ECC)
    d = diagnose("FAILED", {"job.err": f"Traceback…\nslurmagent.runtime.faults.SuspectGPUError: {exc.value}\n"})
    assert d.cause == "gpu_suspect" and d.retryable and d.evidence[0].line == 2
    step = plan(spec(gpu_type="t4", gpus=1), 1, d, "t4-1", CLUSTER)
    assert isinstance(step, Resubmit) and step.resources.exclude == "t4-1"


def test_persistent_cuda_error_failing_on_cpu_is_a_code_or_data_problem_naming_the_batch() -> None:
    with pytest.raises(BatchFailedError, match="batch of step 3 fails on the CPU too") as exc:
        train({3: 10}, cpu_ok=False)
    d = diagnose("FAILED", {"job.err": f"BatchFailedError: {exc.value}"})
    assert d.cause == "batch_failed" and not d.retryable and "step 3" in d.summary
    assert isinstance(plan(spec(), 1, d, "t4-1", CLUSTER), Stop)


def test_other_errors_are_not_retried() -> None:
    state = setup()[2]
    guard = StepGuard(state)
    calls = []

    def bad() -> None:
        calls.append(1)
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (16x8 and 9x2)")

    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        guard.run(0, bad)
    assert calls == [1]


SINFO = "cpu-1|low|4|3000|(null)|cpu|idle\nt4-1|gpu|4|3000|gpu:t4:2|t4|idle\na100-1|gpu|4|4000|gpu:a100:2|a100|idle\n"
CLUSTER = parse_cluster(SINFO, "low|2:00:00|low*\ngpu|4:00:00|gpu\n", parse_scontrol_config("MaxArraySize = 1001"))


def spec(**resources: Any) -> Any:
    from slurmagent.config import job_spec

    return job_spec({"task": {"target": "a:b"}, "resources": resources, "recovery": {"max_attempts": 3}})


def test_gpu_oom_moves_to_a_gpu_type_with_more_memory() -> None:
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.74 GiB total capacity)"
    d = diagnose("FAILED", {"err": oom})
    step = plan(spec(gpu_type="t4", gpus=1, partition="gpu"), 1, d, "t4-1", CLUSTER)
    assert isinstance(step, Resubmit) and step.changes == {"gpu_type": ("t4", "a100")}
    top = plan(spec(gpu_type="a100", gpus=1, partition="gpu"), 1, d, "a100-1", CLUSTER)
    assert isinstance(top, Stop) and "no GPU type with more memory than a100" in top.reason


def test_time_limit_bound_message_is_diagnosed_as_time_limit() -> None:
    text = "slurmagent.errors.TaskFailedError: slurmagent: time limit reached 2 times (recovery.max_time_limit_re"
    d = diagnose("FAILED", {"task error": text})
    assert d.cause == "time_limit" and d.retryable
    step = plan(spec(time="00:01:00"), 1, d, "cpu-1", CLUSTER)
    assert isinstance(step, Resubmit) and step.resources.time == "00:02:00"


def test_stop_classification_uses_slurm_state_and_time_left() -> None:
    usr2, term = (signal.SIGUSR2,), (signal.SIGUSR2, signal.SIGCONT, signal.SIGTERM)
    assert classify_stop(term, "RUNNING", 3000, 60) == "ending"  # preemption: Slurm requeues itself
    assert classify_stop(usr2, "PREEMPTED", 3000, 60) == "ending"
    assert classify_stop(usr2, "RUNNING", 45, 60) == "time_limit"
    assert classify_stop(usr2, "RUNNING", 3000, 60) == "signal"
    assert classify_stop(usr2, "RUNNING", None, 60) == "signal"  # UNLIMITED


def test_time_limit_requeues_are_counted_per_slurm_job(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "41", "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "1"}
    ctx = context_from_env(env, output_dir=tmp_path)
    assert [count_time_limit_requeue(ctx) for _ in range(3)] == [1, 2, 3]
    resubmitted = context_from_env({"SLURM_JOB_ID": "77"}, output_dir=tmp_path)
    assert count_time_limit_requeue(resubmitted) == 1  # a new job starts from zero


class SlowState:
    def __init__(self) -> None:
        self.value = 0

    def state_dict(self) -> dict[str, Any]:
        time.sleep(0.3)  # a checkpoint that takes 0.3 s to gather
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = state["value"]


def test_stop_checkpoint_that_cannot_fit_the_grace_window_falls_back_to_the_periodic_one(tmp_path: Path) -> None:
    ctx = context_from_env({}, output_dir=tmp_path)
    state = SlowState()
    loop = StepLoop(ctx, state, 10, CheckpointConf(every_steps=2), grace=lambda signum: 0.1)
    loop.background_saves = False  # the periodic save is measured when the stop comes
    with pytest.raises(StopForRequeue) as stop:
        for step in loop:
            state.value += 1
            if step == 2:
                os.kill(os.getpid(), signal.SIGUSR2)
    assert stop.value.step == 2  # resumes from the periodic checkpoint at step 2
    assert "stop checkpoint skipped" in loop.stop_note and "redoes 1 steps" in loop.stop_note
    assert [e.step for e in loop.manager.entries()] == [2]
    roomy = StepLoop(context_from_env({}, output_dir=tmp_path / "b"), SlowState(), 10, grace=lambda signum: 30.0)
    with pytest.raises(StopForRequeue) as stop:
        for step in roomy:
            if step == 2:
                os.kill(os.getpid(), signal.SIGUSR2)
    assert stop.value.step == 3 and "written in" in roomy.stop_note


def test_a_stop_signal_before_the_runtime_owns_it_is_retryable() -> None:
    err = "srun: error: a100-1: task 0: User defined signal 2\n"
    d = diagnose("FAILED", {"296_0_log.err": err})
    assert d.cause == "early_stop_signal" and d.retryable and d.evidence[0].line == 1
