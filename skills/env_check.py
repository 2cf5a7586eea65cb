"""env_check: can this job's software use this node's GPUs? Each finding comes with a fix.

Facts are gathered into an `EnvFacts` record (Python, torch build, CUDA runtime, driver's
CUDA version from NVML, NCCL, visible GPUs, Slurm's GPU allocation, unresolved shared
libraries of torch's extension modules); `assess` is a pure function of those facts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from slurmagent.skills._base import SkillResult, Status, TypedSkill, worst


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


@dataclass(frozen=True)
class EnvFinding:
    status: Status
    what: str
    fix: str = ""


def _ver(v: str | None) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in (v or "").split(".")[:2])
    except ValueError:
        return ()


def _count(ids: str | None) -> int | None:
    if ids is None:
        return None
    return len([x for x in ids.split(",") if x.strip()])


def assess(f: EnvFacts, min_python: tuple[int, int] = (3, 11)) -> list[EnvFinding]:
    out: list[EnvFinding] = []
    if _ver(f.python) < min_python:
        out.append(
            EnvFinding(
                Status.CRITICAL,
                f"Python {f.python} is older than {min_python[0]}.{min_python[1]}",
                "use Python 3.11+ in the job's environment",
            )
        )
    if f.torch is None:
        out.append(
            EnvFinding(
                Status.CRITICAL,
                f"torch does not import: {f.torch_error}",
                "pip install torch (the wheel matching the node's CUDA driver)",
            )
        )
    wants_gpu = bool(f.slurm_job_gpus)
    expected = _count(f.slurm_job_gpus)
    if f.torch is not None and f.cuda_runtime is None and wants_gpu:
        out.append(
            EnvFinding(
                Status.CRITICAL,
                f"torch {f.torch} is a CPU-only build but Slurm gave this job GPUs {f.slurm_job_gpus}",
                "install a CUDA build of torch (e.g. pip install torch --index-url https://download.pytorch.org/whl/cu124)",
            )
        )
    if f.cuda_runtime is not None:
        if f.driver_cuda is None:
            sev = Status.CRITICAL if wants_gpu else Status.WARNING
            out.append(
                EnvFinding(
                    sev,
                    f"torch uses CUDA {f.cuda_runtime} but no NVIDIA driver answers "
                    f"({f.driver_error or 'NVML unavailable'})",
                    "run on a GPU node, or check that the driver is loaded (nvidia-smi)",
                )
            )
        elif _ver(f.driver_cuda)[:1] < _ver(f.cuda_runtime)[:1]:
            out.append(
                EnvFinding(
                    Status.CRITICAL,
                    f"driver supports CUDA {f.driver_cuda}, torch needs CUDA {f.cuda_runtime} "
                    "(major version newer than the driver)",
                    f"upgrade the NVIDIA driver, or install a torch build for CUDA {f.driver_cuda}",
                )
            )
        elif _ver(f.driver_cuda) < _ver(f.cuda_runtime):
            out.append(
                EnvFinding(
                    Status.WARNING,
                    f"driver supports CUDA {f.driver_cuda}, torch was built for {f.cuda_runtime}: "
                    "minor-version compatibility only (no PTX JIT)",
                    "upgrade the driver or use a torch build for the driver's CUDA version",
                )
            )
        if wants_gpu and f.nccl is None and (expected or 0) > 1:
            out.append(
                EnvFinding(
                    Status.WARNING,
                    "NCCL is not available to torch: multi-GPU training will fail",
                    "install a torch build with NCCL (the CUDA wheels include it)",
                )
            )
    if expected is not None:
        visible = _count(f.cuda_visible_devices)
        if visible is not None and visible != expected:
            out.append(
                EnvFinding(
                    Status.CRITICAL,
                    f"CUDA_VISIBLE_DEVICES={f.cuda_visible_devices} shows {visible} GPU(s), "
                    f"Slurm allocated {expected} ({f.slurm_job_gpus})",
                    "do not set CUDA_VISIBLE_DEVICES yourself inside a Slurm job; Slurm sets it",
                )
            )
        if f.cuda_runtime is not None and f.driver_cuda is not None and f.device_count != expected:
            out.append(
                EnvFinding(
                    Status.CRITICAL,
                    f"torch sees {f.device_count} GPU(s), Slurm allocated {expected}",
                    "check the GPU cgroup (ConstrainDevices) and CUDA_VISIBLE_DEVICES",
                )
            )
    for lib, deps in sorted(f.missing_libs.items()):
        out.append(
            EnvFinding(
                Status.CRITICAL,
                f"{lib} needs missing shared libraries: {', '.join(deps)}",
                "install the packages that provide them or add their directory to LD_LIBRARY_PATH (module load cuda)",
            )
        )
    return out


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
    facts: dict[str, Any] = {"python": ".".join(str(x) for x in sys.version_info[:3])}
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
    return EnvFacts(**facts)


@dataclass(frozen=True)
class EnvCheckInput:
    facts_file: Path | None = field(
        default=None, metadata={"help": "recorded facts (JSON) to assess instead of this node"}
    )


class EnvCheck(TypedSkill[EnvCheckInput]):
    name = "env_check"
    description = (
        "Python, torch, CUDA runtime vs driver, NCCL, visible GPUs vs SLURM_JOB_GPUS, missing shared libraries"
    )
    Input = EnvCheckInput

    def check(self, inp: EnvCheckInput) -> SkillResult:
        import json

        try:
            facts = EnvFacts(**json.loads(inp.facts_file.read_text())) if inp.facts_file else gather()
        except (OSError, ValueError, TypeError) as exc:
            return self.unknown(f"cannot read facts: {exc}")
        found = assess(facts)
        status = worst(f.status for f in found)
        return SkillResult(
            self.name,
            status,
            [f"{f.what}; fix: {f.fix}" for f in found if f.status != Status.OK],
            {"facts": asdict(facts), "findings": [dict(asdict(f), status=f.status.name) for f in found]},
        )
