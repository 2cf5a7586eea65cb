"""The one seam to Slurm: every sbatch/squeue/sacct/scontrol/scancel call of slurmagent
goes through `SlurmCLI.run`, as an argument vector (never a shell).

Parsing lives in pure functions (`parse_*`) so it is tested on recorded output.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from slurmagent.errors import SlurmCommandError, SlurmUnavailableError
from slurmagent.slurm.syntax import expand_array_id

ALLOWED_COMMANDS = frozenset({"sbatch", "squeue", "sacct", "scontrol", "scancel", "sinfo"})

Runner = Callable[[list[str], float], "subprocess.CompletedProcess[str]"]


def _default_runner(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


@dataclass(frozen=True)
class TaskStatus:
    """The state of one job or array task as Slurm accounting reports it."""

    job_id: str  # "123" or "123_4" for an array task
    state: str  # COMPLETED, FAILED, OUT_OF_MEMORY, TIMEOUT, NODE_FAIL, PREEMPTED, RUNNING, PENDING…
    exit_code: str  # "0:0" (code:signal)
    reason: str  # scheduler reason or "None"
    nodes: str  # node list
    restarts: int  # requeue count as far as known (0 when not reported)
    earlier: tuple[tuple[str, str], ...] = ()  # (state, nodes) of each earlier run, oldest first


TERMINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "DEADLINE"}
)


class SlurmCLI:
    """Runs Slurm commands. `calls` counts them by command, for benchmarks and tests."""

    def __init__(self, runner: Runner | None = None, timeout: float = 60.0) -> None:
        self._runner = runner or _default_runner
        self._timeout = timeout
        self.calls: dict[str, int] = {}

    def run(self, argv: Sequence[str], check: bool = True) -> str:
        argv = [str(a) for a in argv]
        if argv[0] not in ALLOWED_COMMANDS:
            raise SlurmCommandError(argv, -1, f"{argv[0]!r} is not a Slurm command slurmagent may run")
        self.calls[argv[0]] = self.calls.get(argv[0], 0) + 1
        try:
            proc = self._runner(argv, self._timeout)
        except FileNotFoundError:
            raise SlurmUnavailableError(f"{argv[0]} not found on PATH: this machine has no Slurm client") from None
        except subprocess.TimeoutExpired:
            raise SlurmCommandError(argv, -1, f"timed out after {self._timeout:.0f}s") from None
        if check and proc.returncode != 0:
            raise SlurmCommandError(argv, proc.returncode, proc.stderr or proc.stdout)
        return proc.stdout

    # -- availability ---------------------------------------------------------------
    def available(self) -> bool:
        """True when Slurm's commands exist and the controller answers."""
        if shutil.which("sinfo") is None:
            return False
        conf = os.environ.get("SLURM_CONF")
        if conf and not os.path.exists(conf):
            return False  # Slurm's commands would retry a missing config file for 60 s
        probe = SlurmCLI(self._runner, timeout=min(self._timeout, 15.0))
        try:
            probe.run(["sinfo", "-h", "-o", "%P"])
        except (SlurmCommandError, SlurmUnavailableError):
            return False
        finally:
            self.calls["sinfo"] = self.calls.get("sinfo", 0) + 1
        return True

    # -- queries --------------------------------------------------------------------
    def statuses(self, job_ids: Iterable[str]) -> dict[str, TaskStatus]:
        """One sacct call for many jobs (array ids expand to their tasks)."""
        ids = sorted(set(job_ids))
        if not ids:
            return {}
        out = self.run(
            [
                "sacct",
                "-n",
                "--parsable2",
                "--duplicates",
                "-j",
                ",".join(ids),
                "-o",
                "JobID,State,ExitCode,Reason,NodeList",
            ]
        )
        return parse_sacct(out)

    def cancel(self, job_ids: Iterable[str]) -> None:
        ids = sorted(set(job_ids))
        if ids:
            self.run(["scancel", *ids])

    def requeue(self, job_id: str) -> None:
        self.run(["scontrol", "requeue", job_id])


def parse_scontrol_config(text: str) -> dict[str, str]:
    """`scontrol show config` → {key: value}."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if " = " in line:
            key, _, value = line.partition(" = ")
            out[key.strip()] = value.strip()
    return out


# a failed allocation whose step the kernel OOM-killed is reported as OUT_OF_MEMORY
STEP_CAUSES = ("OUT_OF_MEMORY",)


def parse_sacct(text: str) -> dict[str, TaskStatus]:
    """`sacct -n --parsable2 --duplicates -o JobID,State,ExitCode,Reason,NodeList`.

    With --duplicates a requeued job has one allocation row per run; the last one is the
    current one, and each earlier one counts as a restart (its state and nodes are kept in
    `earlier`: a run that ended NODE_FAIL before Slurm requeued the job shows there). Step rows (`123_4.0`,
    `123_4.batch`) refine a FAILED allocation: a step that was OOM-killed makes it
    OUT_OF_MEMORY. Pending array ranges (`123_[4-9]`) are expanded; the state word is the
    first token (`CANCELLED by 0` → CANCELLED).
    """
    result: dict[str, TaskStatus] = {}
    step_causes: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 5:
            continue
        job_id, state, exit_code, reason, nodes = (p.strip() for p in parts[:5])
        word = state.split()[0] if state else "UNKNOWN"
        if "." in job_id:
            if word in STEP_CAUSES:
                step_causes[job_id.split(".", 1)[0]] = word
            continue
        for jid in expand_array_id(job_id):
            prev = result.get(jid)
            restarts = prev.restarts + 1 if prev is not None else 0
            earlier = (*prev.earlier, (prev.state, prev.nodes)) if prev is not None else ()
            result[jid] = TaskStatus(jid, word, exit_code, reason, nodes, restarts, earlier)
            step_causes.pop(jid, None)  # causes seen so far belong to an earlier run
    for jid, cause in step_causes.items():
        st = result.get(jid)
        if st is not None and st.state == "FAILED":
            result[jid] = dataclasses.replace(st, state=cause)
    return result
