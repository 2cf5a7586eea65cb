"""Taking a sweep's code snapshot (`code.snapshot`; the jobs' side: primitives/code.py).

What is copied: in a git work tree, its tracked files and its untracked files that are not
ignored (`git ls-files --cached --others --exclude-standard`), from the work tree's top, so
that the launcher's directory keeps its place in the project; elsewhere, the launcher's
directory (hidden folders and `__pycache__` left out). Hydra's output folders (`multirun/`,
`outputs/` at the top) and the sweep's own directory are never copied. Over `code.max_mb` the
launch is refused before anything is written. Only git is asked (argv, no shell).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from slurmagent.config import CodeConf
from slurmagent.errors import ConfigError
from slurmagent.files import atomic_write
from slurmagent.primitives.backends import Backend
from slurmagent.primitives.code import CODE_DIR, SNAPSHOT_FILE, CodeSnapshot, files_dir, snapshot_json

HYDRA_OUTPUTS = ("multirun", "outputs")  # Hydra's default output folders: results, not code
SKIPPED_DIRS = ("__pycache__",)


@dataclass(frozen=True)
class SnapshotPlan:
    """What a snapshot will copy: checked (size) before anything is written."""

    root: Path
    subdir: str
    files: list[str]  # relative to root
    bytes: int
    commit: str | None
    dirty: bool


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def _walk(root: Path) -> Iterator[str]:
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS)
        for name in sorted(files):
            yield os.path.relpath(os.path.join(folder, name), root)


def plan_snapshot(cwd: Path, sweep_dir: Path, conf: CodeConf) -> SnapshotPlan:
    """The files of the project the launcher runs in, and their size; ConfigError over the cap."""
    cwd = cwd.resolve()
    top = _git(cwd, "rev-parse", "--show-toplevel")
    root = Path(top.strip()).resolve() if top else cwd
    listed = _git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard") if top else None
    names = [n for n in listed.split("\0") if n] if listed is not None else list(_walk(root))
    sweep = sweep_dir.resolve()
    outputs = [root / d for d in HYDRA_OUTPUTS]
    files: list[str] = []
    size = 0
    for name in dict.fromkeys(names):  # tracked and untracked can both list a file once modified
        path = root / name
        if any(part in SKIPPED_DIRS for part in Path(name).parts):
            continue
        if path.is_symlink() or not path.is_file():  # a tracked file deleted in the work tree, a link
            continue
        if path.is_relative_to(sweep) or any(path.is_relative_to(o) for o in outputs):
            continue
        files.append(name)
        size += path.stat().st_size
        if size > conf.max_mb * 1e6:  # stop at once: a home directory is not walked to its end
            biggest = sorted(files, key=lambda n: (root / n).stat().st_size, reverse=True)[:3]
            raise ConfigError(
                f"code.snapshot: {root} holds more than {conf.max_mb:g} MB (code.max_mb) in {len(files)}+ files "
                f"(largest so far: {', '.join(biggest)}); leave data and environments out (.gitignore), raise "
                "code.max_mb, or set code.snapshot=off to run the working tree as it is then; nothing was submitted"
            )
    commit = (_git(root, "rev-parse", "HEAD") or "").strip() or None if top else None
    dirty = bool((_git(root, "status", "--porcelain") or "").strip()) if top else False
    subdir = "" if cwd == root else str(cwd.relative_to(root))
    return SnapshotPlan(root, subdir, files, size, commit, dirty)


def write_snapshot(plan: SnapshotPlan, sweep_dir: Path) -> CodeSnapshot:
    """Copy the planned files into the sweep (into a fresh folder, renamed into place when
    complete: a launcher killed mid-copy leaves no half snapshot for a job to import)."""
    t0 = time.perf_counter()
    final = sweep_dir / CODE_DIR
    staging = final.with_name(final.name + f".partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    dest = staging / files_dir(sweep_dir).name
    made: set[Path] = set()
    copied, size = 0, 0
    for name in plan.files:
        target = dest / name
        if target.parent not in made:
            target.parent.mkdir(parents=True, exist_ok=True)
            made.add(target.parent)
        try:
            shutil.copy2(plan.root / name, target)
        except FileNotFoundError:  # gone since it was listed (a log rotated, an editor's temporary file)
            continue
        copied, size = copied + 1, size + target.stat().st_size
    snapshot = CodeSnapshot(
        root=str(plan.root),
        subdir=plan.subdir,
        commit=plan.commit,
        dirty=plan.dirty,
        files=copied,
        bytes=size,
        seconds=round(time.perf_counter() - t0, 3),
    )
    (dest / plan.subdir).mkdir(parents=True, exist_ok=True)  # the launcher's directory, even when it held no file
    atomic_write(staging / SNAPSHOT_FILE, snapshot_json(snapshot))
    staging.rename(final)
    return snapshot


def wanted(conf: CodeConf, backend: Backend) -> bool:
    return conf.snapshot == "on" or (conf.snapshot == "auto" and backend.snapshot_by_default)
