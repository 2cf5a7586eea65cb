"""The one seam to Slurm: every sbatch/squeue/sacct/scontrol/scancel/sinfo call of
slurmagent is a named verb of `SlurmCLI` (`statuses`, `job_state`, `submit`, `requeue`,
`exclude`, `drain`, `resume`, `cancel`, …) that builds an argument vector (never a shell)
and runs it through one runner. Tests inject a runner: `tests/fake/fake_slurm.py:FakeSlurm`
answers like a small cluster, in memory.

Parsing lives in pure functions (`parse_*`) so it is tested on recorded output.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from slurmagent.errors import ConfigError, SlurmCommandError, SlurmUnavailableError, SubmissionRefused
from slurmagent.slurm.relay import runner_from_env
from slurmagent.syntax import expand_array_id

ALLOWED_COMMANDS = frozenset({"sbatch", "squeue", "sacct", "scontrol", "scancel", "sinfo", "sacctmgr"})
# a transient sbatch refusal is retried after each of these waits (seconds), then given up
SUBMIT_RETRY_S = (1.0, 2.0, 4.0, 8.0, 16.0)
# a user's submit limit (sacctmgr) is asked again after this long: an administrator's change shows within it
LIMITS_TTL_S = 300.0
# what sbatch says, by kind of refusal (22.05's messages; matched case-insensitively)
TRANSIENT_REFUSALS = (
    "socket timed out",
    "unable to contact slurm controller",
    "temporarily unable to accept",
    "communication connection failure",
    "zero bytes were transmitted",
    "connection refused",
)
LIMIT_REFUSALS = (
    "job submit limit",
    "maxsubmitjobs",
    "maxsubmitjob",
    "submit job limit",
    "resource temporarily unavailable",  # the cluster's MaxJobCount, or the array's own limits
)


def refusal_kind(stderr: str) -> str:
    """transient | limit | permanent, from sbatch's message."""
    text = stderr.lower()
    if any(m in text for m in LIMIT_REFUSALS):
        return "limit"
    if any(m in text for m in TRANSIENT_REFUSALS):
        return "transient"
    return "permanent"


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


@dataclass(frozen=True)
class JobState:
    """The controller's view of a job now (squeue)."""

    state: str  # RUNNING, PENDING, COMPLETING…
    reason: str  # why it waits or ended ("None" while running)
    time_left: str  # Slurm time syntax, or UNLIMITED / NOT_SET / INVALID


# PREEMPTED ends a job only where preemption cancels (PreemptMode=CANCEL); where it requeues,
# accounting may show it for a moment before the requeued run: the supervisor asks the
# controller before it believes a PREEMPTED job has ended (supervise/supervisor.py)
TERMINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
)


class SlurmCLI:
    """Runs Slurm commands. `calls` counts them by command, for benchmarks and tests."""

    def __init__(
        self,
        runner: Runner | None = None,
        timeout: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # in a container, the job's host side runs the commands (slurm/relay.py)
        self._runner = runner or runner_from_env() or _default_runner
        self._timeout = timeout
        self._sleep = sleep
        self._config: dict[str, str] | None = None
        self._clock = clock
        self._limits: dict[tuple[str, str], tuple[float, int | None]] = {}  # (user, qos) → (asked at, limit)
        self.calls: dict[str, int] = {}

    def run(self, argv: Sequence[str], check: bool = True, timeout: float | None = None) -> str:
        """Run one Slurm command (argv, no shell) and return its stdout. Only the verbs below
        call this; other modules ask for a verb."""
        argv = [str(a) for a in argv]
        proc = self._call(argv, timeout)
        if check and proc.returncode != 0:
            raise SlurmCommandError(argv, proc.returncode, proc.stderr or proc.stdout)
        return proc.stdout

    def _call(self, argv: Sequence[str], timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        """Run one Slurm command and return all of it (a verb that reads stderr, whatever the exit code)."""
        argv = [str(a) for a in argv]
        if argv[0] not in ALLOWED_COMMANDS:
            raise SlurmCommandError(argv, -1, f"{argv[0]!r} is not a Slurm command slurmagent may run")
        self.calls[argv[0]] = self.calls.get(argv[0], 0) + 1
        limit = self._timeout if timeout is None else timeout
        try:
            proc = self._runner(argv, limit)
        except FileNotFoundError:
            raise SlurmUnavailableError(f"{argv[0]} not found on PATH: this machine has no Slurm client") from None
        except subprocess.TimeoutExpired:
            raise SlurmCommandError(argv, -1, f"timed out after {limit:.0f}s") from None
        return proc

    # -- availability ---------------------------------------------------------------
    def available(self) -> bool:
        """True when Slurm's commands exist and the controller answers."""
        if self._runner is _default_runner:
            conf = os.environ.get("SLURM_CONF")
            if conf and not os.path.exists(conf):
                return False  # Slurm's commands would retry a missing config file for 60 s
        try:
            self.run(["sinfo", "-h", "-o", "%P"], timeout=min(self._timeout, 15.0))
        except (SlurmCommandError, SlurmUnavailableError):
            return False
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

    def job_state(self, job_id: str) -> JobState | None:
        """The controller's view of one job now (squeue): state, reason, time left; None
        when the controller no longer knows the job (it ended a while ago). Raises
        SlurmCommandError when the controller does not answer."""
        try:
            out = self.run(["squeue", "-h", "-j", job_id, "-o", "%T|%r|%L"])
        except SlurmCommandError as exc:
            if "Invalid job id" in exc.stderr:
                return None
            raise
        line = out.strip().splitlines()[0] if out.strip() else ""
        if not line:
            return None
        state, reason, left = [*line.split("|"), "", ""][:3]
        return JobState(state.strip(), reason.strip(), left.strip())

    def job_states(self, job_ids: Iterable[str]) -> dict[str, JobState]:
        """The controller's view of many jobs in one squeue call; the jobs it no longer knows
        (ended a while ago) are absent."""
        ids = sorted(set(job_ids))
        if not ids:
            return {}
        try:
            out = self.run(["squeue", "-h", "-j", ",".join(ids), "-o", "%i|%T|%r|%L"])
        except SlurmCommandError as exc:
            if "Invalid job id" in exc.stderr:
                return {}
            raise
        states: dict[str, JobState] = {}
        for line in out.splitlines():
            job, state, reason, left = [*line.split("|"), "", "", ""][:4]
            if job.strip():
                states[job.strip()] = JobState(state.strip(), reason.strip(), left.strip())
        return states

    def job_fields(self, job_id: str) -> dict[str, str]:
        """`scontrol show job -o`: the job's fields (StdOut, StdErr, ExcNodeList, …); {} when unknown."""
        out = self.run(["scontrol", "show", "job", "-o", job_id], check=False)
        return parse_scontrol_fields(out)

    def config(self) -> dict[str, str]:
        """`scontrol show config`, read once per seam."""
        if self._config is None:
            self._config = parse_scontrol_config(self.run(["scontrol", "show", "config"]))
        return self._config

    def kill_wait_s(self) -> float:
        """Seconds from SIGTERM to SIGKILL when Slurm ends a job (KillWait; Slurm's default 30)."""
        try:
            return float(self.config().get("KillWait", "30 sec").split()[0])
        except ValueError:
            return 30.0

    def node_state(self, node: str) -> tuple[str, str]:
        """(state, reason) of one node (sinfo); ("", "") when Slurm does not list it."""
        out = self.run(["sinfo", "-h", "-N", "-n", node, "-o", "%T|%E"], check=False).strip().splitlines()
        state, _, reason = (out[0] if out else "|").partition("|")
        return state.strip(), reason.strip()

    # -- actions (the gate's executors and the job's own requeue call these) ----------
    def submit(self, script: str | os.PathLike[str]) -> str:
        """sbatch a script file; the new job id ("123", or "123" for an array: tasks are 123_N).
        A refusal is a SubmissionRefused of its kind (`refusal_kind`); a transient one is
        retried first, with back-off (SUBMIT_RETRY_S)."""
        argv = ["sbatch", "--parsable", os.fspath(script)]
        for wait in (*SUBMIT_RETRY_S, None):
            try:
                out = self.run(argv)
            except SlurmCommandError as exc:
                kind = refusal_kind(exc.stderr)
                if kind == "transient" and wait is not None:
                    self._sleep(wait)
                    continue
                if kind == "limit":
                    self._limits.clear()  # the limit read may be stale: ask accounting again next time
                raise SubmissionRefused(exc.argv, exc.returncode, exc.stderr, kind) from None
            job_id = out.strip().splitlines()[-1].split(";")[0] if out.strip() else ""
            if not job_id.isdigit():
                raise SlurmCommandError(argv, 0, f"no job id in output {out!r}")
            return job_id
        raise AssertionError("unreachable")

    def submit_limit(self, user: str, qos: str = "") -> int | None:
        """The most jobs `user` may have queued and running (array tasks count one each): the
        smaller of the user's association's MaxSubmitJobs and the MaxSubmitJobsPerUser of the
        QOS its jobs run in (`qos`, else the association's default, else "normal"); None when
        neither is set or accounting does not answer. Asked of accounting at most once per
        LIMITS_TTL_S per (user, QOS): a search submits trial by trial, and every submission
        asking slurmdbd twice would load it for a value an administrator rarely changes."""
        key = (user, qos)
        asked = self._limits.get(key)
        if asked is not None and self._clock() - asked[0] < LIMITS_TTL_S:
            return asked[1]
        limit = self._ask_submit_limit(user, qos)
        self._limits[key] = (self._clock(), limit)
        return limit

    def _ask_submit_limit(self, user: str, qos: str) -> int | None:
        try:
            assoc = self.run(
                ["sacctmgr", "-n", "-P", "show", "assoc", "where", f"user={user}", "format=MaxSubmitJobs,DefaultQOS"]
            )
            rows = [line.split("|") for line in assoc.splitlines() if line.strip()]
            qos = qos or next((r[1] for r in rows if len(r) > 1 and r[1]), "") or "normal"
            per_qos = self.run(
                ["sacctmgr", "-n", "-P", "show", "qos", "where", f"name={qos}", "format=MaxSubmitJobsPerUser"]
            )
        except (SlurmCommandError, SlurmUnavailableError):
            return None
        values = [r[0] for r in rows] + per_qos.split()
        limits = [int(v) for v in values if v.strip().isdigit()]
        return min(limits) if limits else None

    def queued_jobs(self, user: str) -> int:
        """How many jobs of `user` the controller holds now, pending or running (array tasks each)."""
        return len(self.run(["squeue", "-h", "-r", "-u", user, "-o", "%i"]).split())

    def default_partition(self) -> str | None:
        """The partition a job without --partition runs in (sinfo marks it with *)."""
        for name in self.run(["sinfo", "-h", "-o", "%P"]).split():
            if name.endswith("*"):
                return name[:-1]
        return None

    def node_gpu_types(self) -> dict[str, str]:
        """Each node's GPU type (its first typed gpu GRES); nodes without GPUs are left out."""
        from slurmagent.syntax import parse_gres

        out: dict[str, str] = {}
        for line in self.run(["sinfo", "-h", "-N", "-o", "%N|%G"]).splitlines():
            node, _, gres = line.partition("|")
            typed = [t for t in parse_gres(gres.strip()) if t]
            if typed:
                out[node.strip()] = typed[0]
        return out

    def jobs_by_partition(self, user: str) -> dict[str, int]:
        """`user`'s jobs the controller holds now (pending or running, array tasks each), by partition."""
        out: dict[str, int] = {}
        for part in self.run(["squeue", "-h", "-r", "-u", user, "-o", "%P"]).split():
            out[part] = out.get(part, 0) + 1
        return out

    def usage(self, job_ids: Iterable[str]) -> list[JobUsage]:
        """What finished (and running) jobs used, from accounting: one row per run of each job."""
        ids = sorted({j for j in job_ids if j})
        if not ids:
            return []
        return parse_usage(self.run(["sacct", "-n", "-P", "--duplicates", "-j", ",".join(ids), "-o", USAGE_FIELDS]))

    def user_usage_since(self, user: str, start: str) -> list[JobUsage]:
        """Every job of `user` that ran since `start` (Slurm time, e.g. 2026-12-01T00:00:00)."""
        out = self.run(["sacct", "-n", "-P", "--duplicates", "-u", user, "-S", start, "-o", USAGE_FIELDS])
        return parse_usage(out)

    def test_only(self, flags: dict[str, str]) -> TestOnly:
        """When Slurm's scheduler would start a job with these sbatch long options now
        (`sbatch --test-only`: nothing is submitted)."""
        proc = self._call(["sbatch", "--test-only", *(f"--{k}={v}" for k, v in flags.items()), "--wrap=true"])
        return parse_test_only(proc.stderr + proc.stdout)  # its answer is on stderr, a refusal's too

    def pending(self) -> list[PendingJob]:
        """The GPU jobs waiting in the queue for resources or priority, every user's (array
        tasks each): what `sbatch --test-only` leaves out, as it answers from the running jobs."""
        return parse_pending(self.run(["squeue", "-h", "-r", "-t", "PD", "-o", PENDING_FORMAT]))

    def jobs_with_comment(self, comment: str, user: str) -> list[str]:
        """The ids of `user`'s jobs (arrays: their own ids) whose --comment is `comment`."""
        out = self.run(["squeue", "-h", "-u", user, "-o", "%F|%k"])
        return sorted({job for job, _, c in (line.partition("|") for line in out.splitlines()) if c == comment})

    def cancel(self, job_ids: Iterable[str]) -> None:
        ids = sorted(set(job_ids))
        if ids:
            self.run(["scancel", *ids])

    def requeue(self, job_id: str) -> None:
        """Requeue a job (array task: ARRAYJOBID_TASKID); it keeps its id and resources."""
        self.run(["scontrol", "requeue", job_id])

    def exclude(self, job_id: str, nodes: str, nodelist: str | None = None) -> None:
        """A pending job's next run avoids `nodes` (ExcNodeList); `nodelist`, when given,
        replaces the nodes it requires (ReqNodeList; "" clears a pin to an excluded node)."""
        argv = ["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={nodes}"]
        if nodelist is not None:
            argv.append(f"ReqNodeList={nodelist}")
        self.run(argv)

    def drain(self, node: str, reason: str) -> None:
        """Drain a node: running jobs finish, no new ones start. The reason is bounded to 200 characters."""
        self.run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason[:200]}"])

    def resume(self, node: str) -> None:
        """Return a drained node to service."""
        self.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])


USAGE_FIELDS = "JobID,JobName,Partition,Elapsed,Timelimit,MaxRSS,ReqMem,TotalCPU,State,NodeList,AllocTRES,End,Comment"


@dataclass(frozen=True)
class JobUsage:
    """One run of a job as accounting saw it (steps folded in: MaxRSS is their largest)."""

    job_id: str
    name: str
    partition: str
    elapsed_s: int
    timelimit_s: int | None
    max_rss_mb: float  # 0 when not measured (no step ended yet)
    req_mem_mb: int
    total_cpu_s: float
    state: str
    nodes: str
    gpus: int  # allocated GPUs (AllocTRES gres/gpu), all nodes together
    end: str
    comment: str = ""

    @property
    def gpu_seconds(self) -> float:
        return self.gpus * self.elapsed_s


PENDING_FORMAT = "%P|%T|%r|%b|%D|%l"  # partitions, state, reason, GRES per node, nodes, time limit
# queued ahead (None: not yet looked at by the scheduler); not held, not waiting on a dependency or a begin time
WAITING_REASONS = frozenset({"Resources", "Priority", "None"})


@dataclass(frozen=True)
class PendingJob:
    """A GPU job waiting in the queue (`squeue -t PD`)."""

    partitions: tuple[str, ...]  # the ones it may start in
    gpu_type: str | None  # None: any type
    gpus: int  # all its nodes
    limit_s: int  # its --time


@dataclass(frozen=True)
class TestOnly:
    """`sbatch --test-only`'s answer: when the job would start, where; or why it cannot."""

    start: str  # Slurm's timestamp (2026-12-01T18:02:56); "" when refused
    nodes: str
    partition: str
    error: str = ""


def _rss_mb(text: str) -> float:
    t = text.strip()
    if not t:
        return 0.0
    units = {"K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0**2}
    if t[-1].upper() in units:
        return float(t[:-1]) * units[t[-1].upper()]
    return float(t) / 2**20  # bytes


def _cpu_seconds(text: str) -> float:
    """sacct's TotalCPU: [D-][HH:]MM:SS[.mmm]."""
    t = text.strip()
    if not t:
        return 0.0
    days, _, rest = t.rpartition("-")
    parts = [float(p) for p in rest.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0.0)
    return (int(days) if days else 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def parse_usage(text: str) -> list[JobUsage]:
    """`sacct -n -P --duplicates -o USAGE_FIELDS` → one JobUsage per run of each job; step
    rows (`123.batch`, `123.0`) give the run their largest MaxRSS."""
    from slurmagent.syntax import mem_to_mb, parse_time_limit, slurm_time_to_seconds

    runs: list[JobUsage] = []
    for line in text.splitlines():
        f = line.split("|")
        if len(f) < 12:
            continue
        job_id, name, part, elapsed, limit, rss, req, cpu, state, nodes, tres, end = (x.strip() for x in f[:12])
        comment = f[12].strip() if len(f) > 12 else ""
        if "." in job_id:
            if runs and runs[-1].job_id == job_id.split(".", 1)[0] and rss:
                last = runs[-1]
                runs[-1] = dataclasses.replace(last, max_rss_mb=max(last.max_rss_mb, _rss_mb(rss)))
            continue
        gpus = 0
        for item in tres.split(","):
            key, _, value = item.partition("=")
            if key == "gres/gpu" and value.isdigit():
                gpus = int(value)
        try:
            req_mb = mem_to_mb(req.rstrip("nc")) if req else 0
        except ConfigError:  # an odd ReqMem is not worth failing a whole ingest
            req_mb = 0
        runs.append(
            JobUsage(
                job_id=job_id,
                name=name,
                partition=part,
                elapsed_s=slurm_time_to_seconds(elapsed) if elapsed else 0,
                timelimit_s=parse_time_limit(limit),
                max_rss_mb=_rss_mb(rss),
                req_mem_mb=req_mb,
                total_cpu_s=_cpu_seconds(cpu),
                state=state.split()[0] if state else "UNKNOWN",
                nodes=node_list(nodes),
                gpus=gpus,
                end=end,
                comment=comment,
            )
        )
    return runs


def parse_test_only(text: str) -> TestOnly:
    """`sbatch: Job 1729 to start at 2026-12-01T18:02:56 using 1 processors on nodes a100-1 in
    partition gpu` → TestOnly; anything else is the reason it would not run."""
    import re

    m = re.search(r"to start at (\S+) using .* on nodes (\S+) in partition (\S+)", text)
    if m:
        return TestOnly(m.group(1), m.group(2), m.group(3))
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return TestOnly("", "", "", lines[-1] if lines else "no answer")


def parse_pending(text: str) -> list[PendingJob]:
    """`squeue -o PENDING_FORMAT` lines → the GPU jobs pending for resources or priority with a
    time limit (`gpu|PENDING|Resources|gres:gpu:a100:2|1|4:00`); CPU jobs, held jobs, jobs
    waiting on a dependency or a begin time, and jobs without a limit are left out, and so are
    jobs that asked with `--gpus` instead of `--gres` (squeue's %b shows them as N/A)."""
    import re

    from slurmagent.syntax import parse_gres, slurm_time_to_seconds

    out: list[PendingJob] = []
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 6:
            continue
        parts, state, reason, gres, nodes, limit = (f.strip() for f in fields)
        if state != "PENDING" or reason not in WAITING_REASONS or not limit[:1].isdigit() or not nodes.isdigit():
            continue
        per_node = parse_gres(re.sub(r"\bgres[:/]", "", gres))  # 22.05 writes gres:gpu:…, later versions gres/gpu:…
        for gpu_type, count in per_node.items():
            out.append(
                PendingJob(tuple(parts.split(",")), gpu_type or None, count * int(nodes), slurm_time_to_seconds(limit))
            )
    return out


def parse_scontrol_fields(text: str) -> dict[str, str]:
    """One `scontrol show … -o` line → {key: value} (values hold no spaces in -o output,
    except the last field's, which is kept whole)."""
    out: dict[str, str] = {}
    for field_ in text.split():
        key, sep, value = field_.partition("=")
        if sep:
            out[key] = value
    return out


def parse_scontrol_config(text: str) -> dict[str, str]:
    """`scontrol show config` → {key: value}."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if " = " in line:
            key, _, value = line.partition(" = ")
            out[key.strip()] = value.strip()
    return out


# what sacct and scontrol print in a node-list field for a job that has no nodes (yet)
NO_NODES = ("None assigned", "(null)", "None")


def node_list(text: str) -> str:
    """A node-list field as the seam's callers see it: "" for a job with no nodes."""
    return "" if text in NO_NODES else text


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
            result[jid] = TaskStatus(jid, word, exit_code, reason, node_list(nodes), restarts, earlier)
            step_causes.pop(jid, None)  # causes seen so far belong to an earlier run
    for jid, cause in step_causes.items():
        st = result.get(jid)
        if st is not None and st.state == "FAILED":
            result[jid] = dataclasses.replace(st, state=cause)
    return result
