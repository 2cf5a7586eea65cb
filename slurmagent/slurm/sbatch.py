"""One source of truth: ResourcesConf → sbatch long options.

Both the submitit path and the rendered sbatch templates use `sbatch_flags`, so what a
person reads in a rendered script is what the launcher submits.
"""

from __future__ import annotations

import re
import shlex

from slurmagent.config import EnvConf, RecoveryConf, ResourcesConf, auto_keys
from slurmagent.errors import ConfigError, choices

# sbatch long options that `resources.extra` may set. Options that ResourcesConf owns
# (partition, mem, gres…) are refused there so that one value has one place.
SBATCH_EXTRA_OPTIONS = frozenset(
    {
        "begin",
        "chdir",
        "comment",
        "contiguous",
        "cores-per-socket",
        "cpu-freq",
        "deadline",
        "dependency",
        "distribution",
        "exclusive",
        "gpu-bind",
        "gpu-freq",
        "hint",
        "licenses",
        "mail-type",
        "mail-user",
        "mem-bind",
        "mincpus",
        "network",
        "nice",
        "nodelist",
        "open-mode",
        "power",
        "prefer",
        "priority",
        "profile",
        "reservation",
        "sockets-per-node",
        "spread-job",
        "switches",
        "threads-per-core",
        "tmp",
        "uid",
        "wckey",
    }
)

OWNED = (
    "partition",
    "nodes",
    "ntasks-per-node",
    "cpus-per-task",
    "mem",
    "gres",
    "time",
    "time-min",
    "qos",
    "account",
    "constraint",
    "exclude",
    "signal",
    "requeue",
    "no-requeue",
    "array",
    "output",
    "error",
    "job-name",
)


# the keys that set an owned option that is not a resources.* key of the same name
OWNED_BY = {
    "requeue": "recovery.requeue=true|false",
    "no-requeue": "recovery.requeue=false",
    "signal": "recovery.signal and recovery.signal_delay_s",
    "gres": "resources.gpus and resources.gpu_type",
    "ntasks-per-node": "resources.tasks_per_node",
}


def gres_string(res: ResourcesConf) -> str | None:
    if res.gpus <= 0:
        return None
    return f"gpu:{res.gpu_type}:{res.gpus}" if res.gpu_type else f"gpu:{res.gpus}"


# What a value in an `#SBATCH --key=value` line may contain: sbatch reads these lines
# itself (no shell), but whitespace, quotes and newlines would split or end the directive.
_SAFE_VALUE = re.compile(r"^[A-Za-z0-9_./:@%+=,\-\[\]&|!*()]+$")


def safe_directive_value(value: str) -> bool:
    """Whether `value` can stand in an `#SBATCH --key=value` line as it is."""
    return _SAFE_VALUE.fullmatch(value) is not None  # not match(): `$` also matches before a final newline


def _check_value(key: str, value: str) -> str:
    if not safe_directive_value(value):
        raise ConfigError(
            f"resources.{key}={value!r} contains characters sbatch cannot take in a directive "
            "(whitespace, quotes, $, `, ;, newlines…); use letters, digits and _ . / : @ % + = , - [ ] & | ! * ( )"
        )
    return value


def sbatch_flags(res: ResourcesConf) -> dict[str, str]:
    """Long option name (without --) → value, in a stable order. Values are checked to be
    safe in an #SBATCH line; a bad one is a ConfigError naming the key."""
    flags = _raw_flags(res)
    keys = {
        "ntasks-per-node": "tasks_per_node",
        "cpus-per-task": "cpus_per_task",
        "gres": "gpu_type",
        "time-min": "time_min",
    }
    for flag, value in flags.items():
        _check_value(keys.get(flag, flag if hasattr(res, flag) else f"extra.{flag}"), value)
    return flags


def _raw_flags(res: ResourcesConf) -> dict[str, str]:
    if auto := auto_keys(res):
        raise ConfigError(
            f"resources.{auto[0]}=auto is decided when the job is launched or planned "
            "(python -m slurmagent … -m, slurmagent plan …); give a value to render a script"
        )
    flags: dict[str, str] = {}
    if res.partition:
        flags["partition"] = res.partition
    flags["nodes"] = str(res.nodes)
    flags["ntasks-per-node"] = str(res.tasks_per_node)
    flags["cpus-per-task"] = str(res.cpus_per_task)
    if res.mem:
        flags["mem"] = res.mem
    gres = gres_string(res)
    if gres:
        flags["gres"] = gres
    flags["time"] = res.time
    if res.time_min:
        flags["time-min"] = res.time_min
    for key in ("qos", "account", "constraint", "exclude"):
        value = getattr(res, key)
        if value:
            flags[key] = str(value)
    for key, value in res.extra.items():
        name = key.replace("_", "-")
        if name in OWNED:
            where = OWNED_BY.get(name, "resources.*")
            raise ConfigError(
                f"resources.extra.{key} duplicates a setting slurmagent owns; set it through "
                f"{where} (valid keys of resources.extra: {choices(SBATCH_EXTRA_OPTIONS)})"
            )
        if name not in SBATCH_EXTRA_OPTIONS:
            raise ConfigError(
                f"unknown sbatch option resources.extra.{key}; valid keys: {choices(SBATCH_EXTRA_OPTIONS)}"
            )
        flags[name] = str(value)
    return flags


def safe_job_name(name: str) -> str:
    """A job name sbatch takes literally: letters, digits and _ . - (at most 64 characters)."""
    cleaned = re.sub(r"[^A-Za-z0-9_.\-]", "_", name)[:64]
    return cleaned or "slurmagent"


def requeue_flag(recovery: RecoveryConf) -> str:
    """--requeue (Slurm requeues the job on preemption or node failure) or --no-requeue."""
    return "requeue" if recovery.requeue else "no-requeue"


def signal_flag(recovery: RecoveryConf, to_batch_script: bool) -> str:
    """--signal value: `B:` sends it to the batch script's own process only (the supervisor job);
    without, to the job steps."""
    prefix = "B:" if to_batch_script else ""
    return f"{prefix}{recovery.signal}@{recovery.signal_delay_s}"


def stop_flags(recovery: RecoveryConf, to_batch_script: bool) -> dict[str, str | None]:
    """The flags every task's job carries, whoever writes its script (the launcher through
    submitit, `render`): requeued by Slurm or not, every run's log appended to the same file,
    the stop signal ahead of the time limit. A flag without a value maps to None."""
    return {requeue_flag(recovery): None, "open-mode": "append", "signal": signal_flag(recovery, to_batch_script)}


def env_lines(env: EnvConf) -> list[str]:
    """The lines a job's batch script runs before the job's Python (env.*): each variable
    exported (its value one shell word), then the setup lines as the user wrote them —
    the one place a shell line of the user's is allowed. submitit's `setup` for the
    launcher's jobs, the template's for `slurmagent render`."""
    exports = [f"export {name}={shlex.quote(str(value))}" for name, value in env.vars.items()]
    return [*exports, *env.setup]
