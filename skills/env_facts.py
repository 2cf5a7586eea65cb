"""The facts env_check assesses, gathered on a node: Python, torch's build, CUDA runtime and
driver, NCCL, visible GPUs, Slurm's GPU allocation, unresolved shared libraries of torch, and
whether slurmagent imports. The standard library only, and syntax older Pythons read: the
launcher's pre-flight probe (launch/probe.py) runs this file's text with a job's own
interpreter (`env.python`), which may have nothing else installed — not even slurmagent.

    python env_facts.py      # prints the facts as one JSON line
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class EnvFacts:
    python: str
    torch: str | None = None  # torch.__version__, None = not importable
    torch_error: str = ""
    cuda_runtime: str | None = None  # torch.version.cuda ("12.4"); None = CPU build
    cuda_available: bool = False
    device_count: int = 0
    nccl: str | None = None
    driver_cuda: str | None = None  # CUDA version the driver supports ("12.2"), from NVML
    driver_error: str = ""
    cuda_visible_devices: str | None = None
    slurm_job_gpus: str | None = None  # SLURM_JOB_GPUS / SLURM_STEP_GPUS
    missing_libs: dict[str, list[str]] = field(default_factory=dict)  # library file → unresolved deps
    slurmagent: bool | None = None  # slurmagent importable by this interpreter (None: not asked)
    executable: str = ""  # the interpreter that gathered these facts


def unresolved_libraries(paths: list[Path]) -> dict[str, list[str]]:
    """`ldd` of each library: the dependencies it reports as `not found`."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return {}
    out: dict[str, list[str]] = {}
    for p in paths:
        try:
            text = subprocess.run([ldd, str(p)], capture_output=True, text=True, timeout=30, check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        missing = [ln.split("=>")[0].strip() for ln in text.splitlines() if "not found" in ln]
        if missing:
            out[str(p)] = missing
    return out


def gather(env: dict[str, str] | None = None) -> EnvFacts:
    env = dict(os.environ) if env is None else env
    facts: dict[str, Any] = {"python": ".".join(str(x) for x in sys.version_info[:3]), "executable": sys.executable}
    try:
        import torch

        facts.update(torch=str(torch.__version__), cuda_runtime=torch.version.cuda)
        facts["cuda_available"] = bool(torch.cuda.is_available())
        facts["device_count"] = int(torch.cuda.device_count()) if facts["cuda_available"] else 0
        if facts["cuda_available"]:
            try:
                facts["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())  # type: ignore[no-untyped-call]
            except (AttributeError, RuntimeError):
                facts["nccl"] = None
        libdir = Path(torch.__file__).parent
        libs = sorted([*libdir.glob("_C*.so"), *(libdir / "lib").glob("libtorch*.so")])
        facts["missing_libs"] = unresolved_libraries(libs)
    except Exception as exc:  # a broken install raises anything at import
        facts["torch_error"] = f"{type(exc).__name__}: {exc}"
    try:
        import pynvml as nv

        nv.nvmlInit()
        try:
            v = int(nv.nvmlSystemGetCudaDriverVersion())
            facts["driver_cuda"] = f"{v // 1000}.{(v % 1000) // 10}"
        finally:
            nv.nvmlShutdown()
    except Exception as exc:
        facts["driver_error"] = str(exc)
    facts["cuda_visible_devices"] = env.get("CUDA_VISIBLE_DEVICES")
    facts["slurm_job_gpus"] = env.get("SLURM_JOB_GPUS") or env.get("SLURM_STEP_GPUS")
    try:
        facts["slurmagent"] = importlib.util.find_spec("slurmagent") is not None
    except (ImportError, ValueError):
        facts["slurmagent"] = False
    return EnvFacts(**facts)


if __name__ == "__main__":
    print("SLURMAGENT_FACTS " + json.dumps(asdict(gather())), flush=True)
