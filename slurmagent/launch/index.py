"""Where a user's sweeps are: `slurmagent sweeps`, and what status, watch, logs, results and
report take when no sweep directory is given (the newest).

Two sources, each sweep once: the sweeps under `./multirun` (Hydra's default sweep directory,
`multirun/YYYY-MM-DD/HH-MM-SS`), and the user's index — one JSON line per sweep in the state
directory (`sweeps.jsonl`, next to the user's audit log), appended by the launcher when it
creates a sweep, so that sweeps launched from elsewhere (another directory, a
`hydra.sweep.dir` of one's own) are found too. A sweep deleted since is skipped.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from slurmagent.errors import SweepStateError
from slurmagent.files import atomic_write
from slurmagent.safety.paths import state_dir
from slurmagent.supervise.state import STATE_FILE, SweepStore

INDEX_FILE = "sweeps.jsonl"
INDEX_KEEP = 1000  # past this many lines the index keeps its newest entries whose sweeps still exist
HYDRA_SWEEPS = "multirun"  # conf/config.yaml: hydra.sweep.dir=multirun/${now:%Y-%m-%d}/${now:%H-%M-%S}


def index_path() -> Path:
    return state_dir() / INDEX_FILE


def record_sweep(sweep_dir: Path) -> None:
    """Add a new sweep to the user's index. Never fails the launch: a state directory that
    cannot be written only costs the entry (the sweep is still found under ./multirun)."""
    line = json.dumps({"dir": str(Path(sweep_dir).absolute()), "at": time.time()}) + "\n"
    try:
        path = index_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:  # one short line: appended whole
            fh.write(line)
            size = fh.tell()
        if size > INDEX_KEEP * 2 * len(line):  # grown well past the cap: keep the newest that exist
            _compact(path)
    except OSError:
        pass


def _compact(path: Path) -> None:
    """Rewrite the index with its newest INDEX_KEEP entries whose sweeps still exist (atomically:
    a reader sees the old file or the new one; an append racing the rewrite may be lost, which
    costs only that entry)."""
    kept = [(d, at) for d, at in _indexed() if (d / STATE_FILE).is_file()][-INDEX_KEEP:]
    body = "".join(json.dumps({"dir": str(d), "at": at}) + "\n" for d, at in kept)
    atomic_write(path, body.encode())


@dataclass(frozen=True)
class SweepEntry:
    """One sweep found, with what its sweep.json says."""

    path: Path  # absolute
    launched_at: float  # unix time: the index's, or the multirun folder's name, or sweep.json's
    counts: dict[str, int] = field(default_factory=dict)  # state → tasks
    problem: str = ""  # why sweep.json could not be read ("" = it was)

    def describe_counts(self) -> str:
        if self.problem:
            return f"unreadable: {self.problem}"
        if not self.counts:
            return "no task yet"
        ordered = sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))
        return ", ".join(f"{n} {state}" for state, n in ordered)


def _indexed() -> Iterator[tuple[Path, float]]:
    try:
        lines = index_path().read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return
    for line in lines:
        try:
            entry = json.loads(line)
            yield Path(str(entry["dir"])), float(entry["at"])
        except (ValueError, KeyError, TypeError):  # a torn or foreign line: skipped
            continue


def _multirun(cwd: Path) -> Iterator[tuple[Path, float]]:
    root = cwd / HYDRA_SWEEPS
    for state in [*root.glob(f"*/{STATE_FILE}"), *root.glob(f"*/*/{STATE_FILE}")]:
        sweep = state.parent
        try:
            at = dt.datetime.strptime(f"{sweep.parent.name} {sweep.name}", "%Y-%m-%d %H-%M-%S").timestamp()
        except ValueError:  # a sweep directory of another shape: when its state was last written
            try:
                at = state.stat().st_mtime
            except OSError:
                continue
        yield sweep.absolute(), at


def find_sweeps(cwd: Path | None = None, limit: int = 20) -> list[SweepEntry]:
    """The newest `limit` sweeps of ./multirun and of the user's index, newest first."""
    cwd = Path.cwd() if cwd is None else cwd
    launched: dict[str, tuple[Path, float]] = {}
    for path, at in [*_multirun(cwd), *_indexed()]:
        key = os.path.realpath(path)
        if key not in launched or at > launched[key][1]:
            launched[key] = (path, at)
    out: list[SweepEntry] = []
    for path, at in sorted(launched.values(), key=lambda item: item[1], reverse=True):
        if len(out) >= limit:
            break
        if not (path / STATE_FILE).is_file():  # deleted (or moved) since it was launched
            continue
        try:
            counts = SweepStore(path).load().counts()
            out.append(SweepEntry(path, at, counts))
        except (SweepStateError, OSError, TypeError, KeyError) as exc:
            out.append(SweepEntry(path, at, problem=str(exc).splitlines()[0] if str(exc) else type(exc).__name__))
    return out


def shown(path: Path, cwd: Path | None = None) -> str:
    """A sweep's path as a person types it: relative to the working directory when inside it."""
    cwd = Path.cwd() if cwd is None else cwd
    try:
        return str(path.relative_to(cwd.absolute()))
    except ValueError:
        return str(path)
