"""Failure diagnosis: Slurm's state plus the job's logs → one structured verdict.

Rules are data (`RULES`): a pattern over log lines, the cause it names, whether a retry
can help, and what to do. `diagnose` is pure: it takes the state and the log texts, so it
is tested on logs recorded from real failing jobs.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from slurmagent.records import Evidence


@dataclass(frozen=True)
class Diagnosis:
    cause: str  # a short cause id: host_oom, gpu_oom, time_limit, preempted, node_failure, …
    summary: str  # one sentence: what went wrong and what to do
    retryable: bool  # can the same task succeed if run again (possibly with new resources)?
    suggestion: str  # what to change
    evidence: list[Evidence] = field(default_factory=list)  # the lines that show it
    fix_command: str | None = None  # a safe command that applies the fix, where one exists

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Rule:
    cause: str
    pattern: re.Pattern[str]
    retryable: bool
    summary: str  # may use {match} (the matched text) and {g1} (first group)
    suggestion: str


def _r(cause: str, pattern: str, retryable: bool, summary: str, suggestion: str) -> Rule:
    return Rule(cause, re.compile(pattern), retryable, summary, suggestion)


DISK_FULL_SUGGESTION = (
    "free space or raise the quota (checkpoint.dir, the output directory), or lower checkpoint.keep_last; "
    "resubmitted, the task resumes from its newest intact checkpoint"
)

# Ordered: the first rule that matches anywhere wins, so specific causes come first.
RULES: tuple[Rule, ...] = (
    _r(
        "gpu_oom",
        r"(torch\.)?(cuda\.)?OutOfMemoryError: CUDA out of memory\. Tried to allocate ([\d.]+ \w+)",
        True,
        "The GPU ran out of memory (tried to allocate {g3}).",
        "halve the micro-batch with gradient accumulation, or move to a GPU type with more memory",
    ),
    _r(
        "gpu_oom",
        r"CUDA out of memory at micro-batch (\d+) after (\d+) halving",
        True,
        "The GPU ran out of memory even at micro-batch {g1}, after {g2} halving(s) in process.",
        "move to a GPU type with more memory, or a smaller model",
    ),
    _r(
        "host_oom",
        r"Detected (\d+) oom-kill event\(s\)|oom_kill event|oom-kill event",
        True,
        "The job used more host memory than its --mem and the kernel's cgroup OOM killer ended it.",
        "resubmit with more memory (resources.mem), or lower the data loader's workers/prefetch",
    ),
    _r(
        "gpu_suspect",
        r"slurmagent: suspect GPU( on node [\w.-]+)?",
        True,
        "A CUDA error persisted over the step's retries while the same batch passes on the CPU: the GPU{g1} is "
        "suspect.",
        "resubmit excluding the node and report the GPU to the admins",
    ),
    _r(
        "batch_failed",
        r"slurmagent: batch of step (\d+) fails on the CPU too",
        False,
        "The batch of step {g1} fails on the GPU and on the CPU: a code or data problem, not the hardware.",
        "inspect that batch (its indices come from the data order at that step) and the code of the step",
    ),
    _r(
        "time_limit",
        r"slurmagent: time limit reached (\d+) times",
        True,
        "The job reached its time limit {g1} times (the bound on time-limit requeues).",
        "resubmit with a longer time limit (resources.time) within the partition's limit",
    ),
    _r(
        "time_limit",
        r"slurmagent: time limit near \(([^)]*) left\) and the requeue was not done \(([^\n]*)\); checkpoint",
        True,
        "The job stopped at its time limit's warning ({g1} left) and could not requeue itself ({g2}).",
        "resubmit with a longer time limit (resources.time); it resumes from the stop checkpoint",
    ),
    _r(
        "requeue_failed",
        r"slurmagent: stopped by signal (\d+) [^\n]*and the requeue was not done \(([^\n]*)\); checkpoint",
        True,
        "The job stopped on signal {g1} with a checkpoint and could not requeue itself ({g2}).",
        "resubmit: it resumes from the stop checkpoint",
    ),
    _r(
        "early_stop_signal",
        r"srun: error: \S+: task \d+: User defined signal [12]",
        True,
        "The job was killed by Slurm's stop signal before its runtime took the signal over (a time-limit warning or "
        "a preemption that came while the job was starting).",
        "resubmit; if the time limit is short, give the job more time (resources.time)",
    ),
    _r(
        "time_limit",
        r"CANCELLED AT \S+ DUE TO TIME LIMIT",
        True,
        "The job reached its time limit.",
        "checkpoint more often and requeue, or ask for more time (resources.time) within the partition's limit",
    ),
    _r(
        "preempted",
        r"CANCELLED AT \S+ DUE TO PREEMPTION",
        True,
        "A higher-priority job preempted this one.",
        "requeue: it resumes from its newest checkpoint",
    ),
    _r(
        "node_failure",
        r"CANCELLED AT \S+ DUE TO NODE FAILURE|DUE TO NODE FAIL",
        True,
        "The node the job ran on failed.",
        "resubmit excluding that node",
    ),
    _r(
        "controller_unreachable",
        r"Unable to contact slurm controller|Slurm controller not responding",
        True,
        "Slurm's controller could not be reached while the job was starting its step ({match}): the cluster's "
        "fault, not the job's.",
        "resubmit once the controller answers (scontrol ping); the task resumes from its newest checkpoint",
    ),
    _r(
        "killed",
        r"srun: error: \S+: task \d+: (Killed)$|was killed by (SIGKILL)\b",
        True,
        "The training process was killed by SIGKILL (signal 9) with no Python traceback: something outside it ended "
        "it (a kernel or cgroup OOM killer, a node agent, an operator's kill -9), not an error in its code.",
        "resumed from its newest checkpoint (bounded by recovery.max_attempts); if it repeats, look at the node's "
        "kernel log (dmesg) and the job's memory use (sacct -j JOB -o MaxRSS)",
    ),
    _r(
        "ecc_error",
        r"uncorrectable ECC error encountered",
        True,
        "The GPU reported an uncorrectable ECC error.",
        "resubmit excluding this node and report the GPU to the admins",
    ),
    _r(
        "cuda_illegal_address",
        r"CUDA error: an illegal memory access was encountered",
        True,
        "A CUDA kernel made an illegal memory access.",
        "retry the step; if it repeats on the CPU it is a code bug, else suspect the GPU",
    ),
    _r(
        "cuda_device_assert",
        r"device-side assert triggered",
        False,
        "A device-side assert fired: usually an index out of range (e.g. a label ≥ number of classes).",
        "run the failing batch on the CPU (CUDA_LAUNCH_BLOCKING=1) to see the exact assertion",
    ),
    _r(
        "xid",
        r"NVRM: Xid \(([^)]*)\): (\d+)",
        True,
        "The NVIDIA driver logged Xid {g2}.",
        "check the node's GPU health; exclude the node if it repeats",
    ),
    _r(
        "nccl_timeout",
        r"Watchdog caught collective operation timeout",
        True,
        "A NCCL collective timed out (a rank hung or the network failed).",
        "retry once; if the same node fails twice, exclude it",
    ),
    _r(
        "nccl_error",
        r"NCCL error in:",
        True,
        "NCCL reported an error.",
        "retry once; if the same node fails twice, exclude it",
    ),
    _r(
        "disk_full",
        r"could not write checkpoint (?:manifest )?(\S+): \[Errno \d+\] (No space left on device|Disk quota exceeded)",
        False,
        "Checkpoint {g1} could not be written: {g2}. The checkpoints before it are intact.",
        DISK_FULL_SUGGESTION,
    ),
    _r(
        "disk_full",
        r"No space left on device|Disk quota exceeded",
        False,
        "A file system the job writes to is full ({match}).",
        DISK_FULL_SUGGESTION,
    ),
    _r(
        "missing_module",
        r"ModuleNotFoundError: No module named '([^']+)'",
        False,
        "Python module '{g1}' is not installed in the job's environment.",
        "install it in the environment the job uses (the same python as the launcher), then resubmit",
    ),
    _r(
        "missing_path",
        r"FileNotFoundError: \[Errno 2\] No such file or directory: '([^']+)'",
        False,
        "The path '{g1}' does not exist on the compute node.",
        "fix the path in the config, or make the data available on a file system the nodes share",
    ),
    _r(
        "missing_path",
        r"No such file or directory",
        False,
        "A file or directory the job needs does not exist: {match}.",
        "fix the path in the config, or make the data available on a file system the nodes share",
    ),
    _r(
        "hydra_config",
        r"(ConfigCompositionException|Could not override '[^']+'|Key '[^']+' is not in struct|"
        r"MissingMandatoryValue|InterpolationResolutionError)",
        False,
        "The Hydra config does not compose: {match}.",
        "fix the override or the config file named in the message",
    ),
    _r(
        "nan_loss",
        r"(loss|Loss)[^\n]*\b(nan|NaN|inf)\b|non-finite loss",
        False,
        "The loss became NaN or infinite.",
        "lower the learning rate, enable gradient clipping, check the inputs",
    ),
)

STATE_CAUSES: dict[str, tuple[str, bool, str, str]] = {
    "OUT_OF_MEMORY": (
        "host_oom",
        True,
        "Slurm ended the job OUT_OF_MEMORY: it exceeded its --mem.",
        "resubmit with more memory (resources.mem)",
    ),
    "TIMEOUT": (
        "time_limit",
        True,
        "Slurm ended the job at its time limit.",
        "requeue from the newest checkpoint, or ask for more time (resources.time)",
    ),
    "NODE_FAIL": ("node_failure", True, "The node the job ran on failed (NODE_FAIL).", "resubmit excluding that node"),
    "PREEMPTED": ("preempted", True, "A higher-priority job preempted this one.", "requeue from the newest checkpoint"),
    "BOOT_FAIL": ("node_failure", True, "The node failed to boot for the job.", "resubmit excluding that node"),
}


def _format(text: str, m: re.Match[str]) -> str:
    groups = {f"g{i}": (g or "") for i, g in enumerate(m.groups(), start=1)}
    return text.format(match=m.group(0).strip(), **groups)


def _scan(rule: Rule, logs: Mapping[str, str], limit: int) -> tuple[re.Match[str] | None, list[Evidence]]:
    first: re.Match[str] | None = None
    evidence: list[Evidence] = []
    for source, text in logs.items():
        for lineno, line in enumerate(text.splitlines(), start=1):
            m = rule.pattern.search(line)
            if m:
                first = first or m
                if len(evidence) < limit:
                    evidence.append(Evidence(source, lineno, line.strip()[:300]))
    return first, evidence


def diagnose(state: str | None, logs: Mapping[str, str], max_evidence: int = 3) -> Diagnosis:
    """Slurm state + log texts (source name → content) → the most specific diagnosis.

    A state Slurm itself decided (OUT_OF_MEMORY, TIMEOUT, NODE_FAIL, PREEMPTED) is the
    cause, with the log lines that show it as evidence; otherwise the first matching rule;
    otherwise a crash named by the last error line."""
    if state in STATE_CAUSES:
        cause, retry, summary, suggestion = STATE_CAUSES[state]
        evidence = [Evidence("slurm", 0, f"State={state}")]
        for rule in RULES:
            if rule.cause == cause:
                evidence += _scan(rule, logs, max_evidence)[1]
        return Diagnosis(cause, summary, retry, suggestion, evidence[: max_evidence + 1])
    for rule in RULES:
        first, evidence = _scan(rule, logs, max_evidence)
        if first is not None:
            return Diagnosis(rule.cause, _format(rule.summary, first), rule.retryable, rule.suggestion, evidence)
    if state in (None, "COMPLETED"):
        return Diagnosis("unknown", "No failure found in the logs.", False, "nothing to do", [])
    raised = python_error(logs)
    if raised is not None:
        where = f" at {raised.where}" if raised.where else ""
        return Diagnosis(
            "crash",
            f"The task raised {raised.evidence.text}{where}.",
            False,
            "fix the error shown and resubmit; it is not retried automatically",
            [raised.evidence],
        )
    died = _signal_death(logs)
    if died is not None:
        name, line = died
        return Diagnosis(
            "crash",
            f"The task's process died of {name} ({line.text}) without a Python traceback.",
            False,
            "a native crash (a C/CUDA extension, a data loader worker): rerun with PYTHONFAULTHANDLER=1 to see where",
            [line],
        )
    last = _last_error_line(logs)
    return Diagnosis(
        "crash",
        f"The task failed ({state}) with: {last.text if last else 'no error message in its logs'}.",
        False,
        "fix the error shown and resubmit; it is not retried automatically",
        [last] if last else [],
    )


# -- a Python exception, named as the user wrote it ---------------------------------------------
TRACEBACK_HEAD = "Traceback (most recent call last):"
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (.+)$')
_CARETS = re.compile(r"^\s*[\^~]+\s*$")  # Python 3.11's markers under a frame's code
_PACKAGE = str(Path(__file__).resolve().parents[1])  # slurmagent's own code: not where a user's error is
_LIBRARY = ("/site-packages/", "/dist-packages/", "/lib/python3")


@dataclass(frozen=True)
class RaisedError:
    evidence: Evidence  # the exception line ("RuntimeError: boom at step 5") and where it was read
    where: str | None  # the innermost frame of the user's code ("mytrain.py:11 in train"), when one is shown


def _user_frame(path: str) -> bool:
    resolved = str(Path(path))
    if any(part in resolved for part in _LIBRARY):
        return False
    return not resolved.startswith(_PACKAGE) or "/examples/" in resolved


def python_error(logs: Mapping[str, str]) -> RaisedError | None:
    """The exception of the last Python traceback in the logs (the line Python prints after its
    frames), and the innermost frame of the user's code in it; None when no log has a traceback."""
    found: RaisedError | None = None
    for source, text in logs.items():
        lines = text.splitlines()
        i = 0
        while i < len(lines):
            if lines[i].strip() != TRACEBACK_HEAD:
                i += 1
                continue
            indent = len(lines[i]) - len(lines[i].lstrip())
            frames: list[tuple[str, str, str]] = []
            i += 1
            while i < len(lines) and (len(lines[i]) - len(lines[i].lstrip()) > indent or not lines[i].strip()):
                m = _FRAME.match(lines[i])
                if m:
                    frames.append((m.group(1), m.group(2), m.group(3)))
                i += 1
            if i < len(lines):
                user = [f for f in frames if _user_frame(f[0])] or frames
                where = f"{Path(user[-1][0]).name}:{user[-1][1]} in {user[-1][2]}" if user else None
                found = RaisedError(Evidence(source, i + 1, lines[i].strip()[:300]), where)
    return found


def clean_traceback(text: str) -> list[str]:
    """A traceback's lines without Python 3.11's `^^^^` markers."""
    return [line for line in text.splitlines() if not _CARETS.match(line)]


def outside_tracebacks(text: str) -> list[str]:
    """The lines of a log that are not part of a Python traceback (its head, frames and exception)."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == TRACEBACK_HEAD:
            indent = len(lines[i]) - len(lines[i].lstrip())
            i += 1
            while i < len(lines) and (len(lines[i]) - len(lines[i].lstrip()) > indent or not lines[i].strip()):
                i += 1
            i += 1  # the exception line
            continue
        out.append(lines[i])
        i += 1
    return out


# srun's words for a task that died of a signal (strsignal), and the signal
_SIGNAL_WORDS = {
    "Segmentation fault": signal.SIGSEGV,
    "Aborted": signal.SIGABRT,
    "Bus error": signal.SIGBUS,
    "Floating point exception": signal.SIGFPE,
    "Illegal instruction": signal.SIGILL,
    "Terminated": signal.SIGTERM,
}
_SIGNAL_LINE = re.compile(r"srun: error: \S+: task \d+: (" + "|".join(map(re.escape, _SIGNAL_WORDS)) + r")")


def _signal_death(logs: Mapping[str, str]) -> tuple[str, Evidence] | None:
    for source, text in logs.items():
        for lineno, line in enumerate(text.splitlines(), start=1):
            m = _SIGNAL_LINE.search(line)
            if m:
                sig = _SIGNAL_WORDS[m.group(1)]
                return f"{sig.name} (signal {int(sig)})", Evidence(source, lineno, line.strip()[:300])
    return None


_ERROR_LINE = re.compile(r"\b[\w.]*(Error|Exception): |\berror: |\bFATAL\b|\bfatal: ")


_SLURM_LINE = re.compile(r"^(srun|slurmstepd(-\S+)?|sbatch|salloc): ")


def _last_error_line(logs: Mapping[str, str]) -> Evidence | None:
    """The last error line of the task's own output; Slurm's lines about it (srun: error: …
    Exited with exit code 1) only when the task said nothing."""
    found: Evidence | None = None
    slurm: Evidence | None = None
    for source, text in logs.items():
        for lineno, line in enumerate(text.splitlines(), start=1):
            if _ERROR_LINE.search(line) and not line.strip().startswith("Traceback"):
                if _SLURM_LINE.match(line.strip()):
                    slurm = Evidence(source, lineno, line.strip()[:300])
                else:
                    found = Evidence(source, lineno, line.strip()[:300])
    return found or slurm
