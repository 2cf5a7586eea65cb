"""A small Slurm stand-in for fast tests: `FakeSlurm` answers the seam's commands (sbatch,
squeue, sacct, scontrol, scancel, sinfo) like a five-node cluster and really runs the jobs
it schedules, as local processes (the submitted batch script under bash, its `srun` step
in place), so the launcher, the supervisor, the job's stop path and recovery can be driven
end to end in seconds, without slurmctld.

Two ways in, one cluster:
- in process: `SlurmCLI(runner=fake)` (a `FakeSlurm` is a seam runner; `fake.calls` keeps
  every argv it answered);
- from other processes (submitit on the node, the job's own `scontrol requeue`):
  `fake.env()` puts shims for those commands and `srun` first on PATH, each running
  this file's `main(CMD ARGS)` (imported from its folder by path: the job's directory need
  not be the checkout) against the same state directory.

The state is `<root>/state.json`, changed under a lock. A test drives what a real cluster
would do to a job: `preempt` (SIGCONT + SIGTERM and the `--signal` user signal to its step,
SIGKILL after KillWait, then PENDING again with one more restart, like PreemptMode=REQUEUE),
`warn` (the time-limit user signal), `fail` (an OOM kill or a node failure).

It is a stand-in for logic, not a scheduler: one node per job, CPUs counted as slots, no
limits enforced (a test injects the fault it wants), no accounting beyond its own records.
The real cluster (tests/cluster/slurm-cluster) proves the same paths against Slurm itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from slurmagent.slurm.cluster import DEFAULT_MAX_ARRAY_SIZE
from slurmagent.syntax import (
    expand_array_id,
    parse_gres,
    parse_time_limit,
    seconds_to_slurm_time,
    slurm_time_to_seconds,
)

__all__ = ["FAKE_COMMANDS", "FakeNode", "FakeSlurm", "default_nodes"]

SELF = str(Path(__file__).resolve())  # this file (it is not in the package)
# The shims and job wrappers run ENTRY, which imports this file as a module from its folder
# rather than running it as a script: a module's bytecode is cached, a script is compiled again
# by every one of the hundreds of command processes of a test run.
ENTRY = (
    f"import sys; sys.path.insert(0, {str(Path(SELF).parent)!r}); "
    "from fake_slurm import main; sys.exit(main(sys.argv[1:]))"
)
ENV_ROOT = "SLURMAGENT_FAKE_SLURM"  # the state directory, for the command shims
FAKE_COMMANDS = ("sbatch", "squeue", "sacct", "scontrol", "scancel", "sinfo", "srun", "sacctmgr")
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL")
_WRAPPERS: list[subprocess.Popen[bytes]] = []  # wrappers this process started
MIN_JOB_AGE_S = 300.0  # squeue still shows an ended job this long (Slurm's MinJobAge)


class _StateLock:
    """An exclusive lock on the state file (flock), reentrant within a process. Not filelock:
    every Slurm command here is a new process, and importing filelock (asyncio among it) was a
    fifth of what each one cost."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd: int | None = None
        self._depth = 0

    def __enter__(self) -> None:
        if self._depth == 0:
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._fd = fd
        self._depth += 1

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0 and self._fd is not None:
            os.close(self._fd)  # releases the flock
            self._fd = None


@dataclass(frozen=True)
class FakeNode:
    name: str
    cpus: int = 4
    mem_mb: int = 3000
    gres: str = "(null)"  # e.g. gpu:t4:2
    features: str = "(null)"
    partitions: tuple[str, ...] = ("low", "high")


def default_nodes() -> list[FakeNode]:
    """The test cluster's layout (tests/cluster/slurm-cluster): two GPU types, two CPU nodes."""
    gpu = ("low", "high", "gpu")
    return [
        FakeNode("a100-1", 4, 4000, "gpu:a100:2", "a100,gpu", gpu),
        FakeNode("t4-1", 4, 3000, "gpu:t4:2", "t4,gpu", gpu),
        FakeNode("t4-2", 4, 3000, "gpu:t4:2", "t4,gpu", gpu),
        FakeNode("cpu-1", 4, 3000, "(null)", "cpu"),
        FakeNode("cpu-2", 4, 3000, "(null)", "cpu"),
    ]


DEFAULT_PARTITIONS = {"low": ("02:00:00", True), "high": ("01:00:00", False), "gpu": ("04:00:00", False)}


@dataclass
class _Job:
    id: str  # "123" or "123_4"
    raw: int  # its own number (SLURM_JOB_ID)
    array: str | None  # the array's id, for an array task
    task: int | None  # the array index
    name: str
    script: str
    cwd: str
    partition: str
    output: str
    error: str
    cpus: int = 1
    gres: str = ""
    time_s: int | None = None
    begin: float = 0.0
    exclude: str = ""
    nodelist: str = ""
    user_signal: tuple[str, int] | None = None  # (name, seconds before the limit); B: dropped
    requeue: bool = False
    throttle: int = 0  # the array's %N: at most N of its tasks running at once (0 = no limit)
    comment: str = ""  # --comment
    state: str = "PENDING"
    reason: str = "None"
    exit_code: str = "0:0"
    node: str = ""
    restarts: int = 0
    runs: list[tuple[str, str]] = field(default_factory=list)  # earlier runs: (state, node)
    started: float | None = None
    ended: float | None = None
    run: int = 0  # runs started so far; a run's processes belong to "<id>#<run>"
    requeued_at: float = 0.0  # when Slurm last requeued it (accounting shows the new run only later)
    warned: bool = False  # the time-limit user signal was sent


def _expand_pattern(pattern: str, job: _Job, step_task: int = 0) -> str:
    out = pattern.replace("%A", job.array or str(job.raw)).replace("%a", str(job.task if job.task is not None else 0))
    out = out.replace("%j", str(job.raw)).replace("%t", str(step_task)).replace("%x", job.name)
    return out.replace("%N", job.node or "node").replace("%%", "%")


class FakeSlurm:
    """A file-backed fake Slurm; see the module docstring."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        nodes: list[FakeNode] | None = None,
        kill_wait_s: float = 2.0,
        max_array_size: int = DEFAULT_MAX_ARRAY_SIZE,
        python: str = sys.executable,
        requeue_delay_s: float = 0.5,
        accounting_lag_s: float = 0.0,
        record_lag_s: float = 0.0,
        max_submit_jobs: int | None = None,
    ) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.bin = self.root / "bin"
        self.calls: list[list[str]] = []
        self._lock = _StateLock(self.root / "state.lock")
        self._state_path = self.root / "state.json"
        self.python = python
        if not self._state_path.exists():
            node_list = nodes or default_nodes()
            self._save(
                {
                    "next_id": 1000,
                    "config": {
                        "KillWait": f"{kill_wait_s:g} sec",
                        "MaxArraySize": str(max_array_size),
                        "MinJobAge": f"{int(MIN_JOB_AGE_S)} sec",
                        "ClusterName": "fake",
                    },
                    "partitions": {
                        name: {"max_time": limit, "default": default, "nodes": []}
                        for name, (limit, default) in DEFAULT_PARTITIONS.items()
                    },
                    "nodes": {n.name: {**asdict(n), "state": "idle", "reason": ""} for n in node_list},
                    "jobs": {},
                    "requeue_delay_s": requeue_delay_s,  # a requeued job waits this long (BeginTime)
                    # sacct shows a requeued job's new run only this long after the requeue (slurmdbd lags)
                    "accounting_lag_s": accounting_lag_s,
                    # … and every run's start and end this long late (a short job: not at all until then)
                    "record_lag_s": record_lag_s,
                    "controller_up": True,
                    "max_submit_jobs": max_submit_jobs,  # the user's MaxSubmitJobs (sacctmgr); None = none
                    "refuse_sbatch": [],  # messages the next sbatch calls fail with, one each
                    "refuse_sbatch_after": 0,  # … once this many more sbatch calls were answered
                    "dying": {},  # "<job>#<run>" → when its processes get SIGKILL
                }
            )
            with self._edit() as st:
                for n in node_list:
                    for p in n.partitions:
                        st["partitions"].setdefault(p, {"max_time": "infinite", "default": False, "nodes": []})
                        st["partitions"][p]["nodes"].append(n.name)
        self._write_shims()

    # -- state -------------------------------------------------------------------------
    def _load(self) -> dict[str, Any]:
        return json.loads(self._state_path.read_text())  # type: ignore[no-any-return]

    def _save(self, st: dict[str, Any]) -> None:
        tmp = self._state_path.with_name(f".state.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(st, indent=1))
        os.replace(tmp, self._state_path)

    @contextlib.contextmanager
    def _edit(self) -> Iterator[dict[str, Any]]:
        with self._lock:
            st = self._load()
            yield st
            self._save(st)

    @staticmethod
    def _job(st: dict[str, Any], job_id: str) -> _Job:
        return _Job(**{**st["jobs"][job_id], "runs": [tuple(r) for r in st["jobs"][job_id]["runs"]]})

    @staticmethod
    def _put(st: dict[str, Any], job: _Job) -> None:
        st["jobs"][job.id] = asdict(job)

    def _write_shims(self) -> None:
        self.bin.mkdir(exist_ok=True)
        for cmd in FAKE_COMMANDS:
            path = self.bin / cmd
            text = (
                f"#!/bin/sh\n{ENV_ROOT}={shlex.quote(str(self.root))} exec {shlex.quote(self.python)} "
                f'-c {shlex.quote(ENTRY)} {cmd} "$@"\n'
            )
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
                path.chmod(0o755)

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment whose Slurm commands are this fake's shims."""
        env = dict(os.environ if base is None else base)
        env.pop("SLURM_CONF", None)
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env[ENV_ROOT] = str(self.root)
        return env

    # -- the seam's runner ---------------------------------------------------------------
    def __call__(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        del timeout
        self.calls.append(list(argv))
        code, out, err = self.command(list(argv), os.getcwd())
        return subprocess.CompletedProcess(argv, code, out, err)

    def command(self, argv: list[str], cwd: str) -> tuple[int, str, str]:
        """Answer one Slurm command: (exit code, stdout, stderr)."""
        cmd, args = argv[0], argv[1:]
        handler = {
            "sacctmgr": self._sacctmgr,
            "sbatch": self._sbatch,
            "squeue": self._squeue,
            "sacct": self._sacct,
            "scontrol": self._scontrol,
            "scancel": self._scancel,
            "sinfo": self._sinfo,
        }.get(cmd)
        if handler is None:
            return 1, "", f"{cmd}: not a command of the fake Slurm\n"
        with open(self.root / "calls.jsonl", "a") as log:  # every command, from every process
            log.write(json.dumps({"time": time.time(), "argv": argv, "pid": os.getpid()}) + "\n")
        with self._lock:
            up = self._load().get("controller_up", True)
        if not up:
            return 1, "", f"{cmd}: error: Unable to contact slurm controller (connect failure)\n"
        self.tick()
        try:
            return handler(args, cwd)
        except _Refused as exc:
            return 1, "", f"{cmd}: error: {exc}\n"

    # -- scheduling ----------------------------------------------------------------------
    def tick(self) -> None:
        """Start what can start, signal and end what is due (every command calls this)."""
        with self._edit() as st:
            now = time.time()
            busy: dict[str, int] = {}
            running: dict[str, int] = {}  # per array
            for raw in st["jobs"].values():
                if raw["state"] == "RUNNING":
                    busy[raw["node"]] = busy.get(raw["node"], 0) + raw["cpus"]
                    if raw["array"]:
                        running[raw["array"]] = running.get(raw["array"], 0) + 1
            dying = {key.split("#")[0] for key in st["dying"]}
            for job_id in sorted(st["jobs"], key=lambda j: st["jobs"][j]["raw"]):
                job = self._job(st, job_id)
                if job.state == "RUNNING":
                    self._time_limit(st, job, now)
                elif job.state == "PENDING" and now >= job.begin and job_id not in dying:
                    if job.throttle and job.array and running.get(job.array, 0) >= job.throttle:
                        job.reason = "JobArrayTaskLimit"
                        self._put(st, job)
                        continue
                    node = self._place(st, job, busy)
                    if node is None:
                        job.reason = "Resources"
                    else:
                        busy[node] = busy.get(node, 0) + job.cpus
                        if job.array:
                            running[job.array] = running.get(job.array, 0) + 1
                        self._start(job, node)
                self._put(st, job)

    def _place(self, st: dict[str, Any], job: _Job, busy: dict[str, int]) -> str | None:
        part = st["partitions"].get(job.partition, {"nodes": []})
        excluded = set(filter(None, job.exclude.split(",")))
        wanted = set(filter(None, job.nodelist.split(",")))
        for name in part["nodes"]:
            node = st["nodes"][name]
            if name in excluded or (wanted and name not in wanted) or node["state"] in ("drained", "down"):
                continue
            if job.gres and not _gres_fits(job.gres, node["gres"]):
                continue
            if busy.get(name, 0) + job.cpus <= node["cpus"]:
                return str(name)
        return None

    def _start(self, job: _Job, node: str) -> None:
        job.state, job.reason, job.node, job.run = "RUNNING", "None", node, job.run + 1
        job.started, job.ended, job.warned = time.time(), None, False
        _WRAPPERS[:] = [w for w in _WRAPPERS if w.poll() is None]  # reap the ended ones
        wrapper = subprocess.Popen(
            [self.python, "-c", ENTRY, "_run", str(self.root), job.id, str(job.run)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=self.env(),
        )
        _WRAPPERS.append(wrapper)  # kept until it ends: the fake outlives no wrapper it started

    def _time_limit(self, st: dict[str, Any], job: _Job, now: float) -> None:
        if job.time_s is None or job.started is None:
            return
        if job.user_signal and not job.warned and now >= job.started + job.time_s - job.user_signal[1]:
            job.warned = True
            self._signal_steps(job, [job.user_signal[0]])
        if now >= job.started + job.time_s:
            self._finish(st, job, "TIMEOUT", "0:15", ["TERM"], self._kill_wait(st))

    def _finish(
        self, st: dict[str, Any], job: _Job, state: str, exit_code: str, signals: list[str], kill_after: float
    ) -> None:
        """End the current run now, as Slurm records it at once: its processes get `signals`
        and SIGKILL `kill_after` seconds later (the wrapper enforces it). A requeued job
        (REQUEUED, PREEMPTED, or NODE_FAIL of a --requeue job) is PENDING again at once, but
        starts only when the old run's processes are gone."""
        self._signal_steps(job, signals)
        st["dying"][f"{job.id}#{job.run}"] = time.time() + kill_after
        if state in ("REQUEUED", "PREEMPTED") or (state == "NODE_FAIL" and job.requeue):
            job.runs.append((state, job.node))
            job.requeued_at = time.time()
            job.state, job.reason, job.restarts, job.node = "PENDING", "BeginTime", job.restarts + 1, ""
            job.begin = time.time() + float(st.get("requeue_delay_s", 0.5))
        else:  # PREEMPTED_FINAL: PreemptMode=CANCEL, the job ends as PREEMPTED
            job.state, job.exit_code, job.ended = state.removesuffix("_FINAL"), exit_code, time.time()

    @staticmethod
    def _kill_wait(st: dict[str, Any]) -> float:
        return float(st["config"].get("KillWait", "2 sec").split()[0])

    def _steps(self, job: _Job) -> list[int]:
        folder = self.root / "steps" / job.id
        pids = []
        for f in folder.glob("*") if folder.is_dir() else []:
            with contextlib.suppress(ValueError):
                pids.append(int(f.name))
        return pids

    def _signal_steps(self, job: _Job, names: list[str]) -> None:
        for pid in self._steps(job):
            for name in names:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, getattr(signal, f"SIG{name}"))

    # -- test controls -----------------------------------------------------------------
    def set_controller(self, up: bool) -> None:
        """Stop (or restart) answering: every command fails as when slurmctld is down."""
        with self._edit() as st:
            st["controller_up"] = up

    def preempt(self, job_id: str, requeue: bool = True) -> None:
        """Preemption: SIGCONT + SIGTERM (and the job's --signal) to its step, SIGKILL after
        KillWait; with PreemptMode=REQUEUE (`requeue`) PENDING again with one more restart,
        with PreemptMode=CANCEL ended as PREEMPTED."""
        self._end(job_id, "PREEMPTED" if requeue else "PREEMPTED_FINAL", "0:15", ["CONT", "TERM"], user_signal=True)

    def warn(self, job_id: str) -> None:
        """Slurm's time-limit warning now: the job's --signal to its step."""
        with self._edit() as st:
            job = self._job(st, job_id)
            if job.user_signal:
                self._signal_steps(job, [job.user_signal[0]])

    def fail(self, job_id: str, state: str = "OUT_OF_MEMORY", stderr: str = "") -> None:
        """End a running job at once as `state` (OUT_OF_MEMORY, NODE_FAIL, FAILED…), its
        processes SIGKILLed, with a line in its stderr as Slurm writes one. A NODE_FAIL of a
        --requeue job is requeued."""
        lines = {
            "OUT_OF_MEMORY": "slurmstepd: error: Detected 1 oom-kill event(s) in StepId={raw}.batch. Some of your "
            "processes may have been killed by the cgroup out-of-memory handler.",
        }
        with self._edit() as st:
            job = self._job(st, job_id)
            if job.state != "RUNNING":
                raise RuntimeError(f"fake Slurm: job {job_id} is {job.state}: only a running job can fail")
            text = stderr or lines.get(state, "").format(raw=job.raw)
            if text:
                with open(_expand_pattern(job.error, job), "a") as fh:
                    fh.write(text + "\n")
            self._finish(st, job, state, "0:9", ["KILL"], 0.0)
            self._put(st, job)

    def _end(self, spec: str, state: str, exit_code: str, names: list[str], user_signal: bool = False) -> None:
        with self._edit() as st:
            for jid in self._ids(st, spec):
                job = self._job(st, jid)
                if job.state == "PENDING" and state == "CANCELLED":
                    job.state, job.ended = "CANCELLED", time.time()
                elif job.state == "RUNNING":
                    extra = [job.user_signal[0]] if user_signal and job.user_signal else []
                    self._finish(st, job, state, exit_code, names + extra, self._kill_wait(st))
                self._put(st, job)

    def job(self, job_id: str) -> dict[str, Any]:
        """A job's record (state, node, restarts, runs, …), for assertions."""
        return dict(self._load()["jobs"][job_id])

    def logged_calls(self) -> list[list[str]]:
        """Every command the fake answered, from any process, oldest first."""
        path = self.root / "calls.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return [list(json.loads(line)["argv"]) for line in lines]

    def limit_refusals(self) -> list[dict[str, Any]]:
        """The sbatch calls refused for the submit limit (MaxSubmitJobs), oldest first."""
        path = self.root / "refusals.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def max_queued(self) -> int:
        """The most jobs (array tasks each) pending or running at once, as sbatch admitted them."""
        return int(self._load().get("max_queued", 0))

    def jobs(self) -> dict[str, dict[str, Any]]:
        return dict(self._load()["jobs"])

    def wait(self, job_id: str, states: tuple[str, ...] = ("RUNNING",), timeout: float = 60.0) -> dict[str, Any]:
        """Wait until a job is in one of `states` (and, for RUNNING, its step has started)."""
        deadline = time.monotonic() + timeout
        while True:
            self.tick()
            job = self.job(job_id)
            ready = job["state"] in states and (job["state"] != "RUNNING" or self._steps(self._job_of(job)))
            if ready:
                return job
            if time.monotonic() > deadline:
                raise TimeoutError(f"fake Slurm: job {job_id} is {job['state']}, not {states}, after {timeout:.0f}s")
            time.sleep(0.05)

    @staticmethod
    def _job_of(raw: dict[str, Any]) -> _Job:
        return _Job(**{**raw, "runs": [tuple(r) for r in raw["runs"]]})

    # -- commands ----------------------------------------------------------------------
    def _ids(self, st: dict[str, Any], spec: str) -> list[str]:
        out: list[str] = []
        for part in spec.split(","):
            for jid in expand_array_id(part.strip()):
                if jid in st["jobs"]:
                    out.append(jid)
                else:
                    out.extend(j for j, r in st["jobs"].items() if r["array"] == jid)
        return out

    def refuse_sbatch(self, *messages: str, after: int = 0) -> None:
        """The next sbatch calls fail, one with each message (as sbatch prints them); with
        `after`, only once that many more sbatch calls have been answered as usual."""
        with self._edit() as st:
            st["refuse_sbatch"].extend(messages)
            st["refuse_sbatch_after"] = after

    def set_submit_limit(self, jobs: int | None) -> None:
        """The user's MaxSubmitJobs, as `sacctmgr modify user … set MaxSubmitJobs=N` sets it."""
        with self._edit() as st:
            st["max_submit_jobs"] = jobs

    def _sacctmgr(self, args: list[str], cwd: str) -> tuple[int, str, str]:
        with self._lock:
            limit = self._load().get("max_submit_jobs")
        if "assoc" in args:  # MaxSubmitJobs|DefaultQOS
            return 0, f"{'' if limit is None else limit}|\n", ""
        return 0, "\n", ""  # qos: no per-user limit

    def _sbatch(self, args: list[str], cwd: str) -> tuple[int, str, str]:
        parsable = "--parsable" in args
        with self._edit() as st:
            refusals, after = st["refuse_sbatch"], st["refuse_sbatch_after"]
            if refusals and after:
                st["refuse_sbatch_after"], refusal = after - 1, None
            else:
                refusal = refusals.pop(0) if refusals else None
        if refusal:
            return 1, "", f"sbatch: error: {refusal}\n"
        paths = [a for a in args if not a.startswith("-")]
        if not paths:
            raise _Refused("no batch script given")
        script = Path(cwd, paths[-1])
        opts = _sbatch_options(script.read_text())
        with self._edit() as st:
            part = opts.get("partition") or next(p for p, v in st["partitions"].items() if v["default"])
            if part not in st["partitions"]:
                raise _Refused("Batch job submission failed: Invalid partition name specified")
            limit = parse_time_limit(st["partitions"][part]["max_time"])
            time_s = slurm_time_to_seconds(opts["time"]) if "time" in opts else limit
            if limit is not None and time_s is not None and time_s > limit:
                raise _Refused(
                    "Batch job submission failed: Requested time limit is invalid (missing or exceeds some limit)"
                )
            indices = _array_indices(opts.get("array"))
            limit = st.get("max_submit_jobs")
            queued = sum(1 for j in st["jobs"].values() if j["state"] in ("PENDING", "RUNNING"))
            if limit is not None and queued + len(indices or [0]) > limit:
                message = (
                    "Batch job submission failed: Job violates accounting/QOS policy "
                    "(job submit limit, user's size and/or time limits)"
                )
                with open(self.root / "refusals.jsonl", "a") as log:
                    log.write(json.dumps({"time": time.time(), "queued": queued, "message": message}) + "\n")
                raise _Refused(message)
            st["max_queued"] = max(int(st.get("max_queued", 0)), queued + len(indices or [0]))
            base = st["next_id"]
            st["next_id"] = base + 1 + len(indices or [])
            begin = _begin(opts.get("begin"))
            sig = _user_signal(opts.get("signal"))
            common: dict[str, Any] = {
                "name": opts.get("job-name", script.name),
                "script": str(script),
                "cwd": cwd,
                "partition": part,
                "cpus": int(opts.get("cpus-per-task", "1")) * int(opts.get("ntasks-per-node", "1")),
                "gres": opts.get("gres", ""),
                "time_s": time_s,
                "begin": begin,
                "exclude": opts.get("exclude", ""),
                "nodelist": opts.get("nodelist", ""),
                "user_signal": sig,
                "requeue": "requeue" in opts,
                "comment": opts.get("comment", ""),
                "throttle": int(opts["array"].split("%")[1]) if "%" in opts.get("array", "") else 0,
            }
            default_out = str(Path(cwd, "slurm-%A_%a.out" if indices is not None else "slurm-%j.out"))
            output = opts.get("output", default_out)
            error = opts.get("error", output)
            if indices is None:
                self._put(st, _Job(str(base), base, None, None, output=output, error=error, **common))
            else:
                for k, i in enumerate(indices):
                    job = _Job(f"{base}_{i}", base + 1 + k, str(base), i, output=output, error=error, **common)
                    self._put(st, job)
        self.tick()
        return 0, f"{base}\n" if parsable else f"Submitted batch job {base}\n", ""

    def _squeue(self, args: list[str], cwd: str) -> tuple[int, str, str]:
        fmt = _opt(args, "-o", "--format") or "%i %T"
        wanted = _opt(args, "-j", "--jobs")
        now = time.time()
        with self._lock:
            st = self._load()
        jobs = [self._job(st, j) for j in (self._ids(st, wanted) if wanted else st["jobs"])]
        visible = [j for j in jobs if j.state not in ENDED or (j.ended or now) > now - MIN_JOB_AGE_S]
        if wanted and not visible:
            return 1, "", "slurm_load_jobs error: Invalid job id specified\n"
        if not wanted:
            visible = [j for j in visible if j.state not in ENDED]
        lines = [_format(fmt, self._squeue_fields(j, now)) for j in visible]
        return 0, "".join(f"{line}\n" for line in lines), ""

    @staticmethod
    def _squeue_fields(job: _Job, now: float) -> dict[str, str]:
        left = "INVALID"
        if job.time_s is not None:
            used = (now - job.started) if job.state == "RUNNING" and job.started else 0.0
            left = seconds_to_slurm_time(max(0, int(job.time_s - used)))
        state = job.state
        return {
            "i": job.id,
            "F": job.array or job.id,
            "T": state,
            "r": job.reason,
            "L": left,
            "j": job.name,
            "N": job.node,
            "P": job.partition,
            "k": job.comment,
            "b": f"gres:{job.gres}" if job.gres else "N/A",
            "D": "1",
            "l": seconds_to_slurm_time(job.time_s) if job.time_s is not None else "UNLIMITED",
        }

    def _sacct(self, args: list[str], cwd: str) -> tuple[int, str, str]:
        wanted = _opt(args, "-j", "--jobs") or ""
        fields = (_opt(args, "-o", "--format") or "JobID,State,ExitCode,Reason,NodeList").split(",")
        sep = "|" if "--parsable2" in args or "-P" in args else " "
        with self._lock:
            st = self._load()
        rows: list[str] = []
        for jid in self._ids(st, wanted):
            job = self._job(st, jid)
            runs = [*job.runs, (job.state, job.node)]
            if job.runs and time.time() < job.requeued_at + float(st.get("accounting_lag_s", 0.0)):
                runs = runs[:-1]  # accounting has the ended run, not yet the requeued one
            lag, now = float(st.get("record_lag_s", 0.0)), time.time()
            if lag and job.started and now < job.started + lag and not job.runs:
                continue  # accounting has not recorded its start yet
            if lag and job.state in ENDED and job.ended and now < job.ended + lag:
                runs = [*runs[:-1], ("RUNNING", job.node)]  # … nor its end
            if "--duplicates" not in args and "-D" not in args:
                runs = runs[-1:]
            for state, node in runs:
                values = {
                    "JobID": job.id,
                    "State": state,
                    "ExitCode": job.exit_code if state == job.state else "0:0" if state == "RUNNING" else "0:15",
                    "Reason": job.reason,
                    "NodeList": node or "None assigned",
                }
                rows.append(sep.join(values.get(f, "") for f in fields))
        return 0, "".join(f"{r}\n" for r in rows), ""

    def _scontrol(self, args: list[str], cwd: str) -> tuple[int, str, str]:
        if args[:2] == ["show", "config"]:
            with self._lock:
                config = self._load()["config"]
            return 0, "".join(f"{k:<20} = {v}\n" for k, v in config.items()), ""
        if args[:2] == ["show", "job"]:
            job_id = next(a for a in args[2:] if not a.startswith("-"))
            with self._lock:
                st = self._load()
            if job_id not in st["jobs"]:
                return 1, "", "slurm_load_jobs error: Invalid job id specified\n"
            j = self._job(st, job_id)
            fields = {
                "JobId": str(j.raw),
                "ArrayJobId": j.array or "",
                "ArrayTaskId": "" if j.task is None else str(j.task),
                "JobName": j.name,
                "JobState": j.state,
                "Reason": j.reason,
                "Restarts": str(j.restarts),
                "Partition": j.partition,
                "NodeList": j.node or "(null)",
                "ReqNodeList": j.nodelist or "(null)",
                "ExcNodeList": j.exclude or "(null)",
                "StdOut": _expand_pattern(j.output, j),
                "StdErr": _expand_pattern(j.error, j),
            }
            return 0, " ".join(f"{k}={v}" for k, v in fields.items() if v != "") + "\n", ""
        if args[:1] == ["requeue"]:
            for spec in args[1:]:
                self._end(spec, "REQUEUED", "0:15", ["CONT", "TERM"])
            return 0, "", ""
        if args[:1] == ["update"]:
            kv = dict(a.split("=", 1) for a in args[1:] if "=" in a)
            if "JobId" in kv:
                return self._update_job(kv)
            if "NodeName" in kv:
                return self._update_node(kv)
        raise _Refused(f"the fake Slurm does not know `scontrol {' '.join(args)}`")

    def _update_job(self, kv: dict[str, str]) -> tuple[int, str, str]:
        with self._edit() as st:
            ids = self._ids(st, kv["JobId"])
            if not ids:
                return 1, "", "slurm_update error: Invalid job id specified\n"
            for jid in ids:
                job = self._job(st, jid)
                if job.state != "PENDING":
                    return 1, "", "slurm_update error: Job is no longer pending execution\n"
                job.exclude = kv.get("ExcNodeList", job.exclude)
                job.nodelist = kv.get("ReqNodeList", job.nodelist)
                self._put(st, job)
        return 0, "", ""

    def _update_node(self, kv: dict[str, str]) -> tuple[int, str, str]:
        with self._edit() as st:
            node = st["nodes"].get(kv["NodeName"])
            if node is None:
                return 1, "", f"slurm_update error: Invalid node name specified {kv['NodeName']}\n"
            new = kv.get("State", "").upper()
            if new == "DRAIN":
                node["state"], node["reason"] = "drained", kv.get("Reason", "")
            elif new == "RESUME":
                node["state"], node["reason"] = "idle", ""
        return 0, "", ""

    def _scancel(self, args: list[str], cwd: str) -> tuple[int, str, str]:
        for spec in (a for a in args if not a.startswith("-")):
            self._end(spec, "CANCELLED", "0:15", ["CONT", "TERM"])
        return 0, "", ""

    def _sinfo(self, args: list[str], cwd: str) -> tuple[int, str, str]:
        fmt = _opt(args, "-o", "--format") or "%P %T"
        only = _opt(args, "-n", "--nodes")
        with self._lock:
            st = self._load()
        lines = []
        for pname, part in st["partitions"].items():
            shown = f"{pname}*" if part["default"] else pname
            if "-N" in args or "--Node" in args:
                for name in part["nodes"]:
                    if only and name != only:
                        continue
                    n = st["nodes"][name]
                    fields = {
                        "N": name,
                        "R": pname,
                        "P": shown,
                        "c": str(n["cpus"]),
                        "m": str(n["mem_mb"]),
                        "G": n["gres"],
                        "f": n["features"],
                        "T": n["state"],
                        "E": n["reason"] or "none",
                    }
                    lines.append(_format(fmt, fields))
            else:
                lines.append(_format(fmt, {"P": shown, "R": pname, "l": part["max_time"], "T": "up"}))
        if only:  # node-oriented with a node filter: one line per node, like sinfo -N -n
            lines = lines[:1]
        return 0, "".join(f"{line}\n" for line in lines), ""

    # -- the job's own processes -----------------------------------------------------
    def run_job(self, job_id: str, run: int) -> int:
        """The wrapper (`main(["_run", ROOT, JOB, RUN])` in a process of its own): run the batch
        script like slurmstepd, SIGKILL it when its run is ended, record a natural end."""
        key = f"{job_id}#{run}"
        with self._lock:
            job = self._job(self._load(), job_id)
        env = self.env()
        env.update(
            {
                "SLURM_JOB_ID": str(job.raw),
                "SLURM_JOBID": str(job.raw),
                "SLURM_JOB_NAME": job.name,
                "SLURM_JOB_PARTITION": job.partition,
                "SLURM_JOB_NODELIST": job.node,
                "SLURM_NODELIST": job.node,
                "SLURMD_NODENAME": job.node,
                "SLURM_NNODES": "1",
                "SLURM_JOB_NUM_NODES": "1",
                "SLURM_NTASKS": "1",
                "SLURM_CPUS_PER_TASK": str(job.cpus),
                "SLURM_SUBMIT_DIR": job.cwd,
                "SLURM_RESTART_COUNT": str(job.restarts),
            }
        )
        if job.array is not None:
            env.update({"SLURM_ARRAY_JOB_ID": job.array, "SLURM_ARRAY_TASK_ID": str(job.task)})
        out_path, err_path = _expand_pattern(job.output, job), _expand_pattern(job.error, job)
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
        same = err_path == out_path
        with open(out_path, "ab") as out, open(os.devnull if same else err_path, "ab") as err:
            proc = subprocess.Popen(
                ["bash", job.script],
                cwd=job.cwd,
                env=env,
                stdout=out,
                stderr=out if same else err,
                start_new_session=True,
            )
        while proc.poll() is None:
            time.sleep(0.05)
            with self._lock:
                kill_at = self._load()["dying"].get(key)
            if kill_at is not None and time.time() >= kill_at:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
            elif job.time_s is not None:
                self.tick()  # the time limit's warning and end
        code = proc.returncode
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # leftovers of the job (like slurmstepd's cgroup)
        with self._edit() as st:
            for f in (self.root / "steps" / job_id).glob("*"):
                f.unlink(missing_ok=True)
            st["dying"].pop(key, None)
            j = self._job(st, job_id)
            if j.run == run and j.state == "RUNNING":  # ended by itself, not by the fake
                j.state = "COMPLETED" if code == 0 else "FAILED"
                j.exit_code = f"{code}:0" if code >= 0 else f"0:{-code}"
                j.ended = time.time()
                self._put(st, j)
        self.tick()
        return 0


class _Refused(Exception):
    """A command the fake refuses, as Slurm would: its message goes to stderr, exit 1."""


def _opt(args: list[str], short: str, long: str) -> str | None:
    for i, a in enumerate(args):
        if a in (short, long) and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(f"{long}="):
            return a.split("=", 1)[1]
    return None


def _gres_fits(wanted: str, have: str) -> bool:
    need, offer = parse_gres(wanted), parse_gres(have)
    return all((offer.get(t, 0) if t else sum(offer.values())) >= n for t, n in need.items())


def _format(fmt: str, fields: dict[str, str]) -> str:
    return re.sub(r"%(\w)", lambda m: fields.get(m.group(1), ""), fmt)


def _sbatch_options(text: str) -> dict[str, str]:
    opts: dict[str, str] = {}
    for line in text.splitlines():
        if not line.startswith("#SBATCH"):
            continue
        for word in shlex.split(line[len("#SBATCH") :]):
            if word.startswith("--"):
                key, _, value = word[2:].partition("=")
                opts[key] = value.strip('"')
    return opts


def _array_indices(spec: str | None) -> list[int] | None:
    if not spec:
        return None
    return [int(i.split("_")[1]) for i in expand_array_id(f"0_[{spec}]")]


def _begin(spec: str | None) -> float:
    if not spec:
        return 0.0
    m = re.fullmatch(r"now\+(\d+)(\w*)", spec)
    if not m:
        return 0.0
    unit = {"": 1, "seconds": 1, "minutes": 60, "hours": 3600}.get(m.group(2), 1)
    return time.time() + int(m.group(1)) * unit


def _user_signal(spec: str | None) -> tuple[str, int] | None:
    if not spec:
        return None
    name, _, when = spec.removeprefix("B:").partition("@")
    return (name.removeprefix("SIG"), int(when or 60))


def _srun(root: Path, args: list[str]) -> int:
    """The `srun` shim: the step runs in place (exec), its pid recorded so the fake can
    signal it, its output where --output/--error say."""
    i, out, err = 0, None, None
    while i < len(args) and args[i].startswith("-"):
        a = args[i]
        if a in ("--output", "-o", "--error", "-e") and i + 1 < len(args):
            if a in ("--output", "-o"):
                out = args[i + 1]
            else:
                err = args[i + 1]
            i += 2
            continue
        i += 1
    command = args[i:]
    job_id = os.environ.get("SLURM_JOB_ID", "0")
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    key = f"{array}_{task}" if array and task else job_id
    steps = root / "steps" / key
    steps.mkdir(parents=True, exist_ok=True)
    (steps / str(os.getpid())).touch()
    pattern_job = _Job(key, int(job_id), array, int(task) if task else None, "", "", "", "", "", "")
    os.environ.update({"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_STEP_ID": "0"})
    for fd, path in ((1, out), (2, err)):
        if path:
            target = _expand_pattern(path, pattern_job)
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            fh = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(fh, fd)
            os.close(fh)
    os.execvp(command[0], command)
    return 127  # not reached


def main(argv: list[str]) -> int:
    if argv and argv[0] == "_run":
        return FakeSlurm(argv[1]).run_job(argv[2], int(argv[3]))
    root = os.environ.get(ENV_ROOT)
    if not root:
        print(f"{argv[0] if argv else 'fake'}: {ENV_ROOT} is not set", file=sys.stderr)
        return 1
    if argv[0] == "srun":
        return _srun(Path(root), argv[1:])
    code, out, err = FakeSlurm(root).command(argv, os.getcwd())
    sys.stdout.write(out)
    sys.stderr.write(err)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
