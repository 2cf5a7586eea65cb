"""The kill switch: a file that `Gate.request` checks before every action.

`<sweep>/PAUSED` holds one sweep; `<state dir>/PAUSED` (see paths.py) holds every sweep of
the user. While either exists, no requeue, resubmission, node exclusion or cancellation
runs: the gate records the action as held and the supervisor retries it after resume.
Running jobs are untouched and still checkpoint on their signals.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from slurmagent.files import atomic_write
from slurmagent.safety.paths import PAUSE_FILE, current_user, state_dir


def switch_path(sweep_dir: Path | None) -> Path:
    return (sweep_dir if sweep_dir is not None else state_dir()) / PAUSE_FILE


def pause(sweep_dir: Path | None, reason: str = "") -> Path:
    """Pause one sweep (sweep_dir) or everything of this user (None)."""
    path = switch_path(sweep_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"user": current_user(), "time": time.time(), "reason": reason}
    atomic_write(path, (json.dumps(body) + "\n").encode())
    return path


def resume(sweep_dir: Path | None) -> Path | None:
    """Lift the switch; the path removed, or None when it was not set."""
    path = switch_path(sweep_dir)
    try:
        path.unlink()
    except FileNotFoundError:
        return None
    return path


def paused(sweep_dir: Path | None) -> Path | None:
    """The switch file in force for this sweep (its own, then the user-wide one), or None."""
    for path in ([switch_path(sweep_dir)] if sweep_dir is not None else []) + [switch_path(None)]:
        if path.exists():
            return path
    return None


def describe(path: Path) -> str:
    try:
        info = json.loads(path.read_text())
        return f"paused by {info.get('user', '?')} ({path})" + (f": {info['reason']}" if info.get("reason") else "")
    except (OSError, ValueError):
        return f"paused ({path})"
