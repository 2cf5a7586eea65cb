"""This host's processes, read from /proc (Linux): whether a pid is alive, what it runs, and
whether a command runs at all. The supervisor uses them to tell a dead process from a slow
one (a killed launcher's sbatch) and a pid from a reused one."""

from __future__ import annotations

import os
from pathlib import Path


def pid_alive(pid: int | str) -> bool:
    """A live process (not a zombie) has this pid."""
    try:
        stat = Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, ValueError):
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def cmdline(pid: int | str) -> list[bytes]:
    """The process's argv ([] when it is gone or unreadable)."""
    try:
        raw = Path(f"/proc/{int(pid)}/cmdline").read_bytes()
    except (OSError, ValueError):
        return []
    return raw.split(b"\0")


def command_running(name: str) -> bool | None:
    """Whether one of this user's processes runs `name` (argv[0], or argv[1] for a script
    run by its interpreter, by base name); None when /proc cannot tell."""
    try:
        pids = [p.name for p in Path("/proc").iterdir() if p.name.isdigit()]
    except OSError:
        return None
    uid, want = os.getuid(), name.encode()
    for pid in pids:
        try:
            if Path(f"/proc/{pid}").stat().st_uid != uid:
                continue
        except OSError:
            continue
        if any(os.path.basename(arg) == want for arg in cmdline(pid)[:2]):
            return True
    return False
