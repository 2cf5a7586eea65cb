"""Where the safety files live.

Per user: `$SLURMAGENT_STATE_DIR`, else `$XDG_STATE_HOME/slurmagent`, else
`~/.local/state/slurmagent` — the user's own audit log and the pause-everything switch.
Per sweep: `audit.jsonl`, `PAUSED`, `approvals/` and `history.jsonl` in the sweep directory.
"""

from __future__ import annotations

import getpass
import os
import pwd
from pathlib import Path

SWEEP_AUDIT = "audit.jsonl"
SWEEP_HISTORY = "history.jsonl"
PAUSE_FILE = "PAUSED"
APPROVALS_DIR = "approvals"


def state_dir() -> Path:
    if os.environ.get("SLURMAGENT_STATE_DIR"):
        return Path(os.environ["SLURMAGENT_STATE_DIR"])
    if os.environ.get("XDG_STATE_HOME"):
        return Path(os.environ["XDG_STATE_HOME"]) / "slurmagent"
    return Path(pwd.getpwuid(os.getuid()).pw_dir) / ".local" / "state" / "slurmagent"


def user_audit_path() -> Path:
    return state_dir() / "audit.jsonl"


def approvals_dir(sweep_dir: Path) -> Path:
    """A site may point every user at one shared spool with $SLURMAGENT_APPROVALS_DIR."""
    env = os.environ.get("SLURMAGENT_APPROVALS_DIR")
    return Path(env) if env else sweep_dir / APPROVALS_DIR


def current_user() -> str:
    """The calling user as the system knows it (its uid), not as $USER claims."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a uid without a passwd entry (some containers)
        return getpass.getuser()
