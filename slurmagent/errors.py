"""The one errors module: every error slurmagent raises derives from SlurmAgentError.

Subclasses mix in the builtin they refine, so callers can catch either
(`except ValueError` still catches a ConfigError).  Messages name the offending key or
value and, where there is a closed set, the valid choices.
"""

from __future__ import annotations

import re
from collections.abc import Iterable


class SlurmAgentError(Exception):
    """Root of all slurmagent errors."""


class ConfigError(SlurmAgentError, ValueError):
    """A job spec, resource request or option is invalid. Nothing was submitted."""


class SlurmCommandError(SlurmAgentError, RuntimeError):
    """A Slurm command (sbatch, squeue, sacct, scontrol, scancel) failed."""

    def __init__(self, argv: list[str], returncode: int, stderr: str) -> None:
        self.argv = argv
        self.returncode = returncode
        self.stderr = stderr
        super().__init__(f"{' '.join(argv)} exited {returncode}: {stderr.strip()}")


class SubmissionRefused(SlurmCommandError):
    """sbatch refused a job. `kind`: "limit" (a submit limit or the cluster's job count: it
    fits later, as earlier jobs end), "transient" (the controller did not answer, after
    retries) or "permanent" (the request itself is refused: fix it)."""

    def __init__(self, argv: list[str], returncode: int, stderr: str, kind: str) -> None:
        super().__init__(argv, returncode, stderr)
        self.kind = kind


class SweepRefusedError(SlurmAgentError, RuntimeError):
    """Slurm refused part of a sweep for good (the command exits 2, like bad input)."""


class SlurmUnavailableError(SlurmAgentError, RuntimeError):
    """Slurm's commands are missing or its controller does not answer."""


class CheckpointError(SlurmAgentError, RuntimeError):
    """A checkpoint could not be written or no valid checkpoint could be read."""


class SweepStateError(SlurmAgentError, RuntimeError):
    """The sweep directory is missing, unreadable or not a slurmagent sweep."""


class TaskFailedError(SlurmAgentError, RuntimeError):
    """A task ended without a result; the message names its final state and reason."""


class BudgetExceeded(ConfigError):
    """A sweep's predicted use exceeds its budget: refused before anything is submitted."""


class PolicyError(ConfigError):
    """A safety policy (conf/policy/*.yaml) is invalid or cannot be found."""


class AuditError(SlurmAgentError, RuntimeError):
    """An audit log is missing, unreadable or cannot be written."""


class ApprovalError(SlurmAgentError, ValueError):
    """An approval cannot be given: unknown id, own action, second vote, expired or decided."""


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` fit to be written down: a URI's user:password@ taken out, and each of `secrets`
    (a webhook's URL, a password) replaced by ***."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return re.sub(r"(//)[^/@\s]+@", r"\1***@", text)


def brief(exc: BaseException, secrets: Iterable[str] = ()) -> str:
    """An error of a remote service in a few words, redacted: the system's reason when one is in
    it (a client's retries wrap `[Errno 111] Connection refused` in lines of their own), else its
    first 200 characters."""
    text = redact(str(exc), secrets)
    reason = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    return redact(f"{type(exc).__name__}: {reason.group(1).strip() if reason else text[:200]}", secrets)


def choices(values: Iterable[object]) -> str:
    """Format a set of valid values for an error message: `a, b, c`."""
    return ", ".join(sorted(str(v) for v in values)) or "(none)"


class SkillError(SlurmAgentError, ValueError):
    """A skill name or a skill's input is invalid (unknown skill, bad argument)."""
