"""Slurm's commands for a job whose Python runs in a container: a relay over a Unix socket.

An image seldom holds Slurm's client, and never munge's socket, so `scontrol requeue` at a
stop, the `squeue` that tells a time limit from a preemption and the `scontrol update` that
moves a job off a bad node cannot run inside it. The job's host side (job/host.py) serves
this relay on a socket in a directory the container binds; inside, the seam (`SlurmCLI`)
finds the socket in `$SLURMAGENT_SLURM_RELAY` and sends each command's argv through it. The
host runs it as argv (no shell), only for a name the seam allows, and answers exit code,
stdout and stderr: every verb, the gate and the audit log work unchanged in the container.

One request per connection, one JSON line each way:
`{"argv": [...], "timeout": s}` → `{"returncode": n, "stdout": "…", "stderr": "…"}`, or
`{"missing": true}` (no such command on the host) or `{"timeout": true}`.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import socketserver
import subprocess
import threading
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from slurmagent.errors import SlurmUnavailableError

RELAY_ENV = "SLURMAGENT_SLURM_RELAY"
MAX_REQUEST = 1 << 20  # bytes: an argv is short; anything longer is not a request
SUN_PATH_MAX = 107  # the kernel's limit on a Unix socket's path (108 bytes with its NUL)

Run = Callable[[list[str], float], "subprocess.CompletedProcess[str]"]


@contextmanager
def _address(path: Path) -> Iterator[str]:
    """A name for `path` the kernel takes: the path itself, or for a long one (a sweep deep in
    a project) the same file reached through an open descriptor of its folder."""
    if len(os.fsencode(path)) <= SUN_PATH_MAX:
        yield str(path)
        return
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


def _read_line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n") and len(data) < MAX_REQUEST:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def answer(request: bytes, run: Run, allowed: Collection[str]) -> dict[str, Any]:
    """What the host answers to one request (pure but for `run`)."""
    try:
        body = json.loads(request)
        argv, limit = body["argv"], float(body.get("timeout", 60.0))
    except (ValueError, KeyError, TypeError):
        return {"returncode": -1, "stdout": "", "stderr": "slurmagent relay: not a request"}
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        return {"returncode": -1, "stdout": "", "stderr": "slurmagent relay: argv must be a list of strings"}
    if argv[0] not in allowed:
        return {"returncode": -1, "stdout": "", "stderr": f"slurmagent relay: {argv[0]!r} is not a Slurm command"}
    try:
        proc = run(argv, limit)
    except FileNotFoundError:
        return {"missing": True}
    except subprocess.TimeoutExpired:
        return {"timeout": True}
    return {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}


class RelayServer:
    """The host's end: serves `answer` on a socket at `path` in a thread of its own, until
    closed (the socket file is removed)."""

    def __init__(self, path: Path, run: Run, allowed: Collection[str]) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)  # a stale one from a run that was killed

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                reply = answer(_read_line(self.request), run, allowed)
                self.request.sendall(json.dumps(reply).encode() + b"\n")

        self._server = socketserver.ThreadingUnixStreamServer(str(path), Handler, bind_and_activate=False)
        self._server.daemon_threads = True
        with _address(path) as address:
            self._server.socket.bind(address)
        os.chmod(path, 0o600)  # the job's user only
        self._server.socket.listen(16)
        # shutdown() waits for the loop's next look at it: a tenth of a second at a job's end
        serve = functools.partial(self._server.serve_forever, poll_interval=0.1)
        self._thread = threading.Thread(target=serve, name="slurm-relay", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self.path.unlink(missing_ok=True)


def relay_runner(path: str) -> Run:
    """The container's end: a seam runner that sends each command to the host at `path`."""

    def run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        request = json.dumps({"argv": argv, "timeout": timeout}).encode() + b"\n"
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn, _address(Path(path)) as address:
                conn.settimeout(timeout + 10.0)
                conn.connect(address)
                conn.sendall(request)
                reply = json.loads(_read_line(conn))
        except (OSError, ValueError) as exc:
            raise SlurmUnavailableError(
                f"{argv[0]}: the job's host side does not answer on {path} ({exc}); Slurm's commands cannot run in "
                "this container without it"
            ) from None
        if reply.get("missing"):
            raise FileNotFoundError(argv[0])
        if reply.get("timeout"):
            raise subprocess.TimeoutExpired(argv, timeout)
        return subprocess.CompletedProcess(argv, int(reply["returncode"]), reply["stdout"], reply["stderr"])

    return run


def runner_from_env(env: dict[str, str] | None = None) -> Run | None:
    """The relay runner when this process runs in a container with a relay, else None."""
    path = (os.environ if env is None else env).get(RELAY_ENV)
    return relay_runner(path) if path else None
