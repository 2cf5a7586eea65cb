"""Where the safety files live.

Per user: `$SLURMAGENT_STATE_DIR`, else `$XDG_STATE_HOME/slurmagent`, else
`~/.local/state/slurmagent` — the user's own audit log and the pause-everything switch.
Per sweep: `audit.jsonl`, `PAUSED`, `approvals/` and `history.jsonl` in the sweep directory.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path

SWEEP_AUDIT = "audit.jsonl"  # the audit log's name: a sweep's, and the user's own in the state dir
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
    return state_dir() / SWEEP_AUDIT


def approvals_dir(sweep_dir: Path) -> Path:
    """A site may point every user at one shared spool with $SLURMAGENT_APPROVALS_DIR."""
    env = os.environ.get("SLURMAGENT_APPROVALS_DIR")
    return Path(env) if env else sweep_dir / APPROVALS_DIR


def current_user() -> str:
    """Who asks, as the system knows it: the name of the process's real uid, never what $USER
    or $LOGNAME claim (anyone can set those). The one identity every decision that depends on
    the user takes (policy rules, approvals, audit records, submit limits, budgets)."""
    uid = os.getuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid without a passwd entry (some containers): the number, as Slurm shows it
        return str(uid)
