"""How a job's Python runs inside its image (env.container.*): the argv that wraps it for
apptainer and podman, or the srun flags pyxis takes. Pure: the caller names the directories
the job must see (`binds`: the sweep, its checkpoints, slurmagent's state) and where it starts.

What crosses into the container, for every runtime: the directories bound at the same path
(so every path the launcher wrote stays true inside), the variables Slurm, submitit and
slurmagent set for the job and the torch.distributed ones, the GPUs the job was given; and
the signals — for apptainer and podman the step's process is the host side (`python_words`,
job/host.py), which hands each signal Slurm sends to the runtime, whose starter or
`--sig-proxy` (the default) passes it to the process inside, and which runs Slurm's commands
for the job inside (slurm/relay.py) — so requeue, stop and exact resume work unchanged."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from slurmagent.config import EnvConf

# the job's variables that must reach the Python inside (podman starts from an empty environment;
# apptainer and pyxis pass the host's)
PASSED_VARS: tuple[str, ...] = ("SLURM_*", "SLURMD_*", "SUBMITIT_*", "SLURMAGENT_*", "CUDA_VISIBLE_DEVICES")
PASSED_VARS += ("NVIDIA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")
PASSED_VARS += ("LOCAL_WORLD_SIZE", "TMPDIR")
DEFAULT_PYTHON = "python"  # the image's own interpreter when env.python is unset


@dataclass(frozen=True)
class Wrapped:
    """A job's command in its container: `prefix` goes before the command's words (the
    runtime's argv; empty for pyxis), `srun_flags` on the srun line that starts the step."""

    prefix: list[str]
    srun_flags: list[str]
    python: str


def _mounts(binds: Sequence[str], extra: Sequence[str]) -> list[str]:
    """SRC:DST[:ro] each once, the job's directories at their own path, then the user's."""
    seen: dict[str, None] = {}
    for b in binds:
        seen.setdefault(f"{b}:{b}", None)
    for m in extra:
        seen.setdefault(m if ":" in m else f"{m}:{m}", None)
    return list(seen)


def wrap(env: EnvConf, binds: Sequence[str], workdir: str, gpus: int) -> Wrapped:
    """The job's command wrapped for env.container (nothing when no image is set)."""
    c = env.container
    if not c.image or not c.runtime:
        return Wrapped([], [], env.python or "")
    python = env.python or DEFAULT_PYTHON
    mounts = _mounts([*binds, workdir], c.mounts)
    if c.runtime == "apptainer":
        argv = ["apptainer", "exec"]
        if gpus:
            argv.append("--nv")
        argv += ["--bind", ",".join(mounts), "--pwd", workdir, *c.args, c.image]
        return Wrapped(argv, [], python)
    if c.runtime == "pyxis":
        flags = [f"--container-image={c.image}", f"--container-mounts={','.join(mounts)}"]
        flags += [f"--container-workdir={workdir}", *c.args]
        return Wrapped([], flags, python)
    argv = ["podman", "run", "--rm", "--init", "--network=host", "--ipc=host", f"--workdir={workdir}"]
    argv += [f"--volume={m}" for m in mounts]
    argv += [f"--env={name}" for name in (*PASSED_VARS, *env.vars)]
    if gpus:
        argv.append("--device=nvidia.com/gpu=all")  # CDI; CUDA_VISIBLE_DEVICES (passed) picks the job's own
    argv += c.args
    argv += ["--rootfs", f"{c.image}:O"] if c.image.startswith("/") else [c.image]
    return Wrapped(argv, [], python)


HOST_MODULE = "slurmagent.job.host"  # the host side of a job in apptainer or podman (job/host.py)


def python_words(wrapped: Wrapped, host_python: str, relay_dir: str) -> list[str]:
    """The words that start the job's Python: in an apptainer or podman container, the job's
    host side first (`host_python -m slurmagent.job.host`: it runs Slurm's commands for the job
    inside, through a socket in `relay_dir`, which must be bound), then the runtime's argv and
    the image's Python; without one, env.python (empty when unset)."""
    if not wrapped.prefix:
        return [wrapped.python] if wrapped.python else []
    return [host_python, "-u", "-m", HOST_MODULE, "--relay", relay_dir, "--", *wrapped.prefix, wrapped.python]


def step_words(wrapped: Wrapped, words: Sequence[str]) -> list[str]:
    """A one-task step running `words` (the job's Python and its arguments) in the container:
    the runtime's argv before them, or srun with pyxis' flags (a batch shell's own line)."""
    if wrapped.srun_flags:
        return ["srun", "--ntasks=1", *wrapped.srun_flags, *words]
    return [*wrapped.prefix, *words]
