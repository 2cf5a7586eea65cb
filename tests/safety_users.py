"""Real local users for the approval tests: `sa-alice` and `sa-bob`, created with useradd
(root is needed, as in CI) and removed afterwards; `run_as` runs the slurmagent CLI as one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from filelock import FileLock

USERS = ("sa-alice", "sa-bob")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@contextmanager
def local_users() -> Iterator[tuple[str, str]]:
    if os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("runuser") is None:
        if IN_CI:
            pytest.fail("approval tests need root with useradd and runuser under CI")
        pytest.skip("needs root, useradd and runuser to create real users")
    # one test at a time owns the users: under xdist a unit and a cluster test may both want them
    with FileLock(os.path.join(tempfile.gettempdir(), "slurmagent-test-users.lock"), timeout=600):
        for user in USERS:
            subprocess.run(["userdel", "-r", user], capture_output=True, check=False)  # left over by a killed run
            subprocess.run(["useradd", "-m", "-s", "/bin/sh", user], check=True, capture_output=True)
        try:
            yield USERS
        finally:
            for user in USERS:
                subprocess.run(["userdel", "-r", user], capture_output=True, check=False)


@contextmanager
def shared_dir() -> Iterator[Path]:
    """A directory other users can reach (pytest's tmp_path is private to root)."""
    top = Path(tempfile.mkdtemp(prefix="sa-approvals-"))
    top.chmod(0o755)
    try:
        yield top
    finally:
        shutil.rmtree(top)


# runs `python -m slurmagent ARGS` for an interpreter outside this virtualenv: the venv's
# site-packages are added as site directories, so their .pth files (the editable install's
# import hook, which maps conf/ and skills/ into slurmagent) take effect, as in the venv
_BOOT = (
    "import runpy, site, sys\n"
    "n = sys.argv.index('--')\n"
    "[site.addsitedir(p) for p in sys.argv[1:n]]\n"
    "sys.argv = ['slurmagent', *sys.argv[n + 1:]]\n"
    "runpy.run_module('slurmagent', run_name='__main__', alter_sys=True)\n"
)


def slurmagent_argv(user: str) -> list[str]:
    """`python -m slurmagent` for `user`: this interpreter when `user` may run it; else the
    system's python of the same version with this environment's packages (a pyenv under
    /root is private)."""
    real = os.path.realpath(sys.executable)
    if subprocess.run(["runuser", "-u", user, "--", "test", "-x", real], check=False).returncode == 0:
        return [sys.executable, "-m", "slurmagent"]
    system = shutil.which(f"python{sys.version_info.major}.{sys.version_info.minor}", path="/usr/local/bin:/usr/bin")
    if system is None:
        why = f"no python {sys.version_info.major}.{sys.version_info.minor} that {user} may run"
        if IN_CI:
            pytest.fail(f"approval tests need it under CI: {why}")
        pytest.skip(why)
    sites = [p for p in sys.path if p.endswith("site-packages")]
    return [system, "-c", _BOOT, *sites, "--"]


def run_as(user: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m slurmagent ARGS` as `user` (with none of this process's slurmagent and
    python settings), or as this process (None, with its environment)."""
    keep = ("XDG_", "PYTHON", "SLURMAGENT_") if user is None else ()
    env = {
        k: v for k, v in os.environ.items() if k.startswith(keep) or not k.startswith(("SLURMAGENT_", "XDG_", "PYTHON"))
    }
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    prefix = ["runuser", "-u", user, "--", *slurmagent_argv(user)] if user else [sys.executable, "-m", "slurmagent"]
    argv = [*prefix, *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd="/", timeout=120)
