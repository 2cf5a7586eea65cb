"""A sweep's code snapshot, as the jobs and `status` read it (the launcher takes it:
launch/snapshot.py). At submission the project's files are copied into
`SWEEP/.slurmagent/code/`; every run of every task — the first, a requeue, a resubmission, a
search's promotion — imports the user's modules from that copy, so editing the working tree
after submitting changes nothing a queued or requeued job runs (and an exact resume resumes
the same code)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

CODE_DIR = Path(".slurmagent") / "code"  # under the sweep directory
SNAPSHOT_FILE = "snapshot.json"  # in CODE_DIR: what was copied (the files under CODE_DIR / "files")


@dataclass(frozen=True)
class CodeSnapshot:
    root: str  # the project directory copied: the git work tree's top, else the launcher's directory
    subdir: str  # the launcher's directory relative to root ("" for root itself): the jobs import from there
    commit: str | None  # HEAD of the work tree (None: not a git repository)
    dirty: bool  # uncommitted changes (or untracked files) were copied too
    files: int
    bytes: int
    seconds: float  # how long the copy took

    def describe(self) -> str:
        at = f" at {self.commit[:12]}{' + uncommitted changes' if self.dirty else ''}" if self.commit else ""
        return f"code: a snapshot of {self.root}{at} ({self.files} files, {self.bytes / 1e6:.1f} MB)"


def files_dir(sweep_dir: str | Path) -> Path:
    return Path(sweep_dir) / CODE_DIR / "files"


def read_snapshot(sweep_dir: str | Path) -> CodeSnapshot | None:
    path = Path(sweep_dir) / CODE_DIR / SNAPSHOT_FILE
    try:
        return CodeSnapshot(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def snapshot_json(snapshot: CodeSnapshot) -> bytes:
    return json.dumps(asdict(snapshot), indent=1).encode()


def snapshot_root(sweep_dir: str | Path, snapshot: CodeSnapshot) -> Path:
    """The sweep's copy of the launcher's directory."""
    return files_dir(sweep_dir) / snapshot.subdir


def import_from_snapshot(sweep_dir: str | Path) -> Path | None:
    """In a job: the sweep's copy of the launcher's directory first on sys.path (before the
    directory the job runs in), when the sweep has a snapshot. Where it imports from."""
    snapshot = read_snapshot(sweep_dir)
    if snapshot is None:
        return None
    where = snapshot_root(sweep_dir, snapshot)
    sys.path.insert(0, str(where))
    return where
