"""The host side of a job whose Python runs in an apptainer or podman container: what srun
starts in place of the runtime's own command —

    python -u -m slurmagent.job.host --relay FOLDER -- RUNTIME ARGV… PYTHON -u -m slurmagent.job.boot …

It serves Slurm's commands to the job inside (slurm/relay.py; the socket in FOLDER, which the
container binds), runs the container as its child, and ends as the child ended. The job
inside then requeues itself at a stop exactly as it does outside a container: the same
`job/stop.py`, the same gate and audit log; only the argv crosses the socket.

Signals. Slurm's proctrack/cgroup sends a signal other than SIGKILL to a step's *tasks* only
(the processes slurmstepd started: this one), never to their children — seen on the test
cluster: `scancel --signal=USR2` and a preemption's SIGTERM reached neither the runtime nor the
job inside. So this process hands each one to the runtime (podman's `--sig-proxy` and
apptainer's starter pass it on to the job inside), one that came before the container started
as soon as it has. And podman runs a container in a cgroup of its own, outside the step's:
Slurm's SIGKILL at the end of KillWait does not reach it, and a job that outlived it would
write checkpoints beside its requeued run. So after a SIGTERM this process kills the container
itself (`podman kill`, by the id podman wrote to `--cidfile`) two seconds before KillWait ends,
if it still runs. A child killed by a signal ends this process by the same signal, so srun and
the diagnosis see what they would without the host side.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from types import FrameType

from slurmagent.job.boot import HELD, hold_stop_signals, release_stop_signals

RELAY_FOLDER = ".slurm-relay"  # in the folder the container binds: one socket per host process
FORWARDED = (*HELD, signal.SIGCONT, signal.SIGINT, signal.SIGHUP)
KILL_MARGIN_S = 2.0  # the container is killed this long before Slurm's SIGKILL


def socket_path(folder: str, env: dict[str, str]) -> Path:
    """This process's socket: one per node and process (every rank of a step has its own)."""
    job = env.get("SLURM_JOB_ID", "nojob")
    return Path(folder) / RELAY_FOLDER / f"{job}.{socket.gethostname()}.{os.getpid()}.sock"


def parse_args(args: list[str]) -> tuple[str, list[str]]:
    """(relay folder, the container's command) from `--relay FOLDER -- COMMAND…`."""
    if len(args) < 4 or args[0] != "--relay" or args[2] != "--":
        raise SystemExit("usage: python -m slurmagent.job.host --relay FOLDER -- COMMAND…")
    return args[1], args[3:]


def is_podman(command: list[str]) -> bool:
    return Path(command[0]).name == "podman" and command[1:2] == ["run"]


def with_cidfile(command: list[str], cidfile: Path) -> list[str]:
    """`podman run …` told to write its container's id to `cidfile`."""
    return [command[0], "run", f"--cidfile={cidfile}", *command[2:]]


class Child:
    """The runtime's process, the signals handed to it, and (podman: `cidfile` set) the kill of
    its container before Slurm's SIGKILL."""

    def __init__(self, command: list[str], env: dict[str, str], cidfile: Path | None) -> None:
        self.command, self.env, self.cidfile = command, env, cidfile
        self.proc: subprocess.Popen[bytes] | None = None
        self.early: list[int] = []
        self.armed = False
        self.guard: threading.Timer | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.command, env=self.env)
        for signum in self.early:
            self.proc.send_signal(signum)

    def handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.proc is None:
            self.early.append(signum)
            return
        self.proc.send_signal(signum)
        if signum == signal.SIGTERM and self.cidfile is not None and not self.armed:
            self.armed = True
            threading.Thread(target=self._arm, daemon=True).start()  # Slurm is asked: not in the handler

    def _arm(self) -> None:
        from slurmagent.errors import SlurmAgentError
        from slurmagent.slurm.seam import SlurmCLI

        try:
            wait = SlurmCLI(timeout=5).kill_wait_s()
        except SlurmAgentError:
            wait = 30.0  # Slurm's default
        self.guard = threading.Timer(max(wait - KILL_MARGIN_S, 0.5), self.kill_container)
        self.guard.daemon = True
        self.guard.start()

    def kill_container(self) -> None:
        if self.proc is None or self.proc.poll() is not None or self.cidfile is None:
            return
        try:
            cid = self.cidfile.read_text().strip()
        except OSError:
            return
        if cid:
            subprocess.run([self.command[0], "kill", "--signal=KILL", cid], capture_output=True, timeout=30)


def main() -> None:
    hold_stop_signals()
    from slurmagent.slurm.relay import RELAY_ENV, RelayServer
    from slurmagent.slurm.seam import ALLOWED_COMMANDS, _default_runner

    folder, command = parse_args(sys.argv[1:])
    relay = RelayServer(socket_path(folder, dict(os.environ)), _default_runner, ALLOWED_COMMANDS)
    cidfile = relay.path.with_suffix(".cid") if is_podman(command) else None
    env = {**os.environ, RELAY_ENV: str(relay.path)}
    child = Child(with_cidfile(command, cidfile) if cidfile else command, env, cidfile)
    for signum in FORWARDED:
        signal.signal(signum, child.handle)
    try:
        release_stop_signals()
        try:
            child.start()
        except FileNotFoundError:
            sys.exit(f"slurmagent: {command[0]} is not installed on {socket.gethostname()} (env.container.runtime)")
        assert child.proc is not None
        code = child.proc.wait()
    finally:
        if child.guard is not None:
            child.guard.cancel()
        relay.close()
        if cidfile is not None:
            cidfile.unlink(missing_ok=True)
    if code < 0:  # killed by a signal: end the same way
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # the two no process can catch
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
