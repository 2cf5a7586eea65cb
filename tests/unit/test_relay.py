"""The relay that runs Slurm's commands for a job in a container (slurm/relay.py) and the
job's host side that serves it (job/host.py): real sockets and processes; the cluster test
is tests/slurm/test_container_slurm.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurmagent.errors import SlurmCommandError, SlurmUnavailableError
from slurmagent.job.host import Child, is_podman, with_cidfile
from slurmagent.slurm.relay import RELAY_ENV, SUN_PATH_MAX, RelayServer, answer, relay_runner
from slurmagent.slurm.seam import ALLOWED_COMMANDS, SlurmCLI


def recorded(calls: list[list[str]]):  # type: ignore[no-untyped-def]
    def run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        if argv[0] == "sacct":
            raise FileNotFoundError(argv[0])
        if argv[0] == "sinfo":
            raise subprocess.TimeoutExpired(argv, timeout)
        return subprocess.CompletedProcess(argv, 3 if argv[1] == "bad" else 0, f"out {argv[1]}\n", "err\n")

    return run


@pytest.mark.parametrize("depth", [1, 12])  # a short socket path, and one past the kernel's 107 bytes
def test_commands_cross_the_socket_with_exit_code_and_output(tmp_path: Path, depth: int) -> None:
    folder = tmp_path.joinpath(*["a-long-folder-name"] * depth)
    calls: list[list[str]] = []
    server = RelayServer(folder / "relay.sock", recorded(calls), ALLOWED_COMMANDS)
    try:
        assert (len(os.fsencode(server.path)) > SUN_PATH_MAX) == (depth > 1)
        slurm = SlurmCLI(runner=relay_runner(str(server.path)))
        assert slurm.run(["squeue", "ok"]) == "out ok\n"
        with pytest.raises(SlurmCommandError, match="err"):
            slurm.run(["scontrol", "bad"])
        with pytest.raises(SlurmUnavailableError, match="sacct not found"):
            slurm.run(["sacct", "x"])
        with pytest.raises(SlurmCommandError, match="timed out"):
            slurm.run(["sinfo", "x"], timeout=1)
        assert calls == [["squeue", "ok"], ["scontrol", "bad"], ["sacct", "x"], ["sinfo", "x"]]
        assert oct(server.path.stat().st_mode & 0o777) == "0o600"
    finally:
        server.close()
    assert not server.path.exists()
    with pytest.raises(SlurmUnavailableError, match="host side does not answer"):
        SlurmCLI(runner=relay_runner(str(server.path))).run(["squeue"])


def test_the_host_runs_only_slurms_commands_and_only_as_argv() -> None:
    calls: list[list[str]] = []
    run = recorded(calls)
    assert "not a Slurm command" in answer(b'{"argv": ["rm", "-rf", "/"]}\n', run, ALLOWED_COMMANDS)["stderr"]
    assert "not a request" in answer(b"squeue; rm -rf /\n", run, ALLOWED_COMMANDS)["stderr"]
    assert "list of strings" in answer(b'{"argv": "squeue -h"}\n', run, ALLOWED_COMMANDS)["stderr"]
    assert calls == []


def test_the_seam_takes_the_relay_from_the_jobs_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    server = RelayServer(tmp_path / "s.sock", recorded(calls), ALLOWED_COMMANDS)
    try:
        monkeypatch.setenv(RELAY_ENV, str(server.path))
        assert SlurmCLI().run(["scontrol", "requeue"]) == "out requeue\n" and calls == [["scontrol", "requeue"]]
    finally:
        server.close()


CHILD = """
import os, sys
from slurmagent.slurm.seam import SlurmCLI
os.environ["PATH"] = "/nonexistent"  # Slurm's client is not here: only the host can run it
print(SlurmCLI().run(["sinfo", "--version"]).strip())
sys.exit(int(sys.argv[1]))
"""


def host(tmp_path: Path, *command: str) -> subprocess.Popen[str]:
    shims = tmp_path / "bin"
    shims.mkdir(exist_ok=True)
    sinfo = shims / "sinfo"
    sinfo.write_text("#!/bin/sh\necho host-sinfo\n")  # a stand-in for Slurm's client on the host
    sinfo.chmod(0o755)
    env = {**os.environ, "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": "77"}
    argv = [sys.executable, "-u", "-m", "slurmagent.job.host", "--relay", str(tmp_path), "--", *command]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_host_side_serves_its_child_and_ends_as_it_ended(tmp_path: Path) -> None:
    proc = host(tmp_path, sys.executable, "-c", CHILD, "3")
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out.strip()) == (3, "host-sinfo"), err
    assert list((tmp_path / ".slurm-relay").iterdir()) == []  # the socket is gone with it
    killed = host(tmp_path, sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    killed.communicate(timeout=60)
    assert killed.returncode == -signal.SIGKILL  # srun sees the child's own end ("task 0: Killed")


RECORDER = """
import pathlib, signal, sys, time
log = pathlib.Path(sys.argv[1])
def record(signum, frame):
    with log.open("a") as f:
        f.write(signal.Signals(signum).name + "\\n")
    if signum == signal.SIGTERM and sys.argv[2] == "exit":
        sys.exit(0)
for s in (signal.SIGUSR2, signal.SIGTERM, signal.SIGCONT):
    signal.signal(s, record)
log.with_suffix(".started").touch()
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    time.sleep(0.05)
"""


def wait_for(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.exists(), path


def test_the_host_side_hands_slurms_signals_to_its_child_and_outlives_them(tmp_path: Path) -> None:
    """Slurm signals a step's tasks only (proctrack/cgroup): the host side. It passes each one
    on to the runtime, and ends when that ends, as it ended."""
    log = tmp_path / "signals.log"
    proc = host(tmp_path, sys.executable, "-c", RECORDER, str(log), "exit")
    wait_for(log.with_suffix(".started"))
    proc.send_signal(signal.SIGUSR2)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert log.read_text().split() == ["SIGUSR2", "SIGTERM"]


def test_a_signal_before_the_child_started_reaches_it_once_it_has() -> None:
    child = Child(["sleep", "60"], dict(os.environ), None)
    child.handle(signal.SIGUSR2, None)  # before start: kept, then sent
    child.start()
    assert child.proc is not None
    assert child.proc.wait(timeout=60) == -signal.SIGUSR2  # sleep's default action for it


STAND_IN_PODMAN = """#!/bin/sh
# A stand-in for podman (named as such): `run --cidfile=F CMD…` runs CMD in the background,
# writes its pid as the container id and waits; `kill --signal=KILL ID` kills that pid — as
# podman kills a container that Slurm's SIGKILL does not reach (its own cgroup).
if [ "$1" = run ]; then
    cidfile="${2#--cidfile=}"; shift 2
    "$@" & echo $! > "$cidfile"
    trap '' TERM USR2
    wait $!
    exit $?
fi
if [ "$1" = kill ]; then echo "$3" >> "$(dirname "$0")/kills"; kill -9 "$3"; fi
"""


def test_a_podman_container_that_outlives_sigterm_is_killed_before_killwait_ends(tmp_path: Path) -> None:
    """The host side kills a podman container KILL_MARGIN_S before Slurm's SIGKILL would have
    come (KillWait from `scontrol show config`: 3 s here), if it is still running by then."""
    shims = tmp_path / "bin"
    shims.mkdir()
    for name, text in (("podman", STAND_IN_PODMAN), ("scontrol", "#!/bin/sh\necho 'KillWait = 3 sec'\n")):
        (shims / name).write_text(text)
        (shims / name).chmod(0o755)
    log = tmp_path / "signals.log"
    proc = host(tmp_path, str(shims / "podman"), "run", sys.executable, "-c", RECORDER, str(log), "stay")
    wait_for(log.with_suffix(".started"))
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)  # the stand-in runtime ignores it, so it is not passed on
    _, err = proc.communicate(timeout=60)
    took = time.monotonic() - sent
    assert (shims / "kills").read_text().strip(), err  # the container was killed by its id
    assert proc.returncode != 0 and took < 30, (proc.returncode, took, err)
    assert list((tmp_path / ".slurm-relay").iterdir()) == []  # socket and cidfile gone


def test_the_podman_command_is_told_where_to_write_its_container_id(tmp_path: Path) -> None:
    assert is_podman(["/usr/bin/podman", "run", "img"]) and not is_podman(["apptainer", "exec", "img"])
    assert with_cidfile(["podman", "run", "--rm", "img"], tmp_path / "c") == [
        "podman", "run", f"--cidfile={tmp_path / 'c'}", "--rm", "img"
    ]  # fmt: skip


def test_a_runtime_missing_on_the_node_is_named(tmp_path: Path) -> None:
    proc = host(tmp_path, "podman-not-installed-here", "run")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "podman-not-installed-here is not installed on" in err
