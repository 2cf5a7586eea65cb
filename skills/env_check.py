"""env_check: can this job's software use this node's GPUs? Each finding comes with a fix.

Facts are gathered into an `EnvFacts` record (Python, torch build, CUDA runtime, driver's
CUDA version from NVML, NCCL, visible GPUs, Slurm's GPU allocation, unresolved shared
libraries of torch's extension modules: skills/env_facts.py, the standard library only, which
the launcher's pre-flight probe also runs with a job's own interpreter); `assess` is a pure
function of those facts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from slurmagent.skills._base import SkillResult, Status, TypedSkill, worst
from slurmagent.skills.env_facts import EnvFacts, gather, unresolved_libraries

__all__ = ["EnvCheck", "EnvFacts", "EnvFinding", "assess", "gather", "unresolved_libraries"]


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
