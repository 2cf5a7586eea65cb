"""GPU failures on the real cluster, with the GPU EMULATED: there is no NVIDIA GPU on these
machines, so slurmagent/examples/gpu_faults.py raises the real torch exception types with
the real CUDA/NCCL messages from a real torch training step (its docstring says how).
Everything else is real: Slurm jobs on GPU-typed nodes, the in-process retries and
micro-batch halving, the supervisor's diagnosis and resubmission through the gate.

Each recovered run must end with the same parameters as a run that never failed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slurm

GPU = ["resources.partition=gpu", "resources.gpus=1", "resources.gpu_type=t4"]


@dataclass(frozen=True)
class Case:
    name: str
    overrides: tuple[str, ...]
    reference: tuple[str, ...]  # the same training that never failed (local backend)


CASES = (
    Case("cuda_transient", ("gpu_faults.fault=cuda_error", "gpu_faults.fault_times=2", *GPU), ()),
    Case("cuda_persistent", ("gpu_faults.fault=cuda_error", "gpu_faults.bad_node=first", *GPU), ()),
    Case("nccl", ("gpu_faults.fault=nccl", *GPU), ()),
    # past its halvings on a t4 the job moves to an a100, where one halving is enough
    Case(
        "gpu_oom",
        ("gpu_faults.fault=gpu_oom", "gpu_faults.sample_mib=2", *GPU),
        ("gpu_faults.fault=gpu_oom", "gpu_faults.sample_mib=2", "resources.gpus=1", "resources.gpu_type=a100"),
    ),
)


def launch(tmp_path: Path, name: str, overrides: tuple[str, ...], local: bool) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"} if local else None
    argv = [sys.executable, "-m", "slurmagent", "-m", "+experiment=gpu_faults", *overrides]
    argv += [f"hydra.sweep.dir={tmp_path / name}", "hydra.launcher.poll_interval_s=1"]
    argv += ["hydra.launcher.max_poll_interval_s=2"] + (["cluster=local"] if local else [])
    return subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def task(tmp_path: Path, name: str) -> dict[str, Any]:
    return json.loads((tmp_path / name / "sweep.json").read_text())["tasks"][0]  # type: ignore[no-any-return]


def audit(tmp_path: Path, name: str) -> list[dict[str, Any]]:
    path = tmp_path / name / "audit.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def runs(slurm_conf: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """All cases and their references at once (they use different nodes or no Slurm)."""
    tmp = tmp_path_factory.mktemp("gpu_faults")
    procs = [launch(tmp, c.name, c.overrides, local=False) for c in CASES]
    procs += [launch(tmp, "ref", (), local=True), launch(tmp, "ref_a100", CASES[3].reference, local=True)]
    for p in procs:
        p.communicate(timeout=400)
    return tmp


def test_transient_cuda_error_is_retried_in_process(runs: Path) -> None:
    t = task(runs, "cuda_transient")
    assert t["state"] == "COMPLETED" and len(t["attempts"]) == 1
    assert t["result"]["cuda_retries"] == 2
    assert t["result"]["state_hash"] == task(runs, "ref")["result"]["state_hash"]


def test_persistent_cuda_error_passing_on_cpu_excludes_the_node(runs: Path) -> None:
    t = task(runs, "cuda_persistent")
    first = t["attempts"][0]
    assert t["state"] == "COMPLETED" and len(t["attempts"]) == 2 and first["state"] == "FAILED"
    assert t["spec"]["resources"]["exclude"] == first["nodes"] and t["result"]["node"] != first["nodes"]
    assert t["result"]["resumed_from"] == 20  # from the last checkpoint before the broken step
    assert t["result"]["state_hash"] == task(runs, "ref")["result"]["state_hash"]
    decision = audit(runs, "cuda_persistent")[0]
    assert decision["action"] == "resubmit" and decision["params"] == {"exclude": [None, first["nodes"]]}
    assert any("suspect GPU on node" in e["text"] for e in decision["evidence"]), decision["evidence"]
    state = json.loads((runs / "cuda_persistent" / "sweep.json").read_text())
    assert state["suspect_nodes"] == {first["nodes"]: 1}


def test_nccl_error_is_retried_once(runs: Path) -> None:
    t = task(runs, "nccl")
    assert t["state"] == "COMPLETED" and [a["state"] for a in t["attempts"]] == ["FAILED", "COMPLETED"]
    decision = audit(runs, "nccl")[0]
    assert decision["metrics_before"]["cause"] == "nccl_error" and decision["params"] == {}
    assert any("NCCL error in:" in e["text"] for e in decision["evidence"])
    assert t["result"]["state_hash"] == task(runs, "ref")["result"]["state_hash"]


def test_gpu_oom_halves_then_moves_to_a_bigger_gpu(runs: Path) -> None:
    t = task(runs, "gpu_oom")
    assert t["state"] == "COMPLETED" and len(t["attempts"]) == 2
    assert t["attempts"][0]["nodes"].startswith("t4-") and t["attempts"][1]["nodes"] == "a100-1"
    assert (t["result"]["gpu_type"], t["result"]["micro_batch"], t["result"]["halvings"]) == ("a100", 32, 1)
    decision = audit(runs, "gpu_oom")[0]
    assert decision["params"] == {"gpu_type": ["t4", "a100"]}
    assert t["result"]["state_hash"] == task(runs, "ref_a100")["result"]["state_hash"]
