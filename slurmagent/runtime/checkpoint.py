"""Atomic checkpoints with a manifest (step, time, checksum) and keep-last-K pruning.

A checkpoint is one file `step_<N>.ckpt` plus an entry in `manifest.json`. Both are
written to a temporary file, fsync'ed, renamed into place, and the directory fsync'ed, so
a crash at any moment leaves either the old or the new checkpoint, never half of one.
`restore()` takes the newest entry whose checksum verifies and falls back to older ones.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import pickle
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from slurmagent.errors import CheckpointError

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class CheckpointEntry:
    step: int  # training step the checkpoint was taken after
    file: str  # file name inside the checkpoint directory
    time: float  # unix time of the save
    sha256: str  # checksum of the file's bytes
    bytes: int  # file size


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically: temp file in the same directory, fsync, rename."""
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _dumps(obj: Any) -> bytes:
    """torch.save when torch is in use (state with tensors), else plain pickle: a job that
    never imported torch does not pay ~200 MB of memory for importing it here."""
    if "torch" not in sys.modules:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _loads(data: bytes) -> Any:
    if data[:2] == b"PK":  # torch.save's zip format
        import torch

        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
    return pickle.loads(data)  # our own checkpoint files


class CheckpointManager:
    """Saves and restores checkpoints in one directory."""

    def __init__(
        self, directory: str | os.PathLike[str], keep_last: int = 3, clock: Callable[[], float] = time.time
    ) -> None:
        self.dir = Path(directory)
        self.keep_last = keep_last
        self._clock = clock
        self.last_save_s: float = 0.0  # duration of the last save, measured

    # -- manifest -------------------------------------------------------------
    def entries(self) -> list[CheckpointEntry]:
        """Manifest entries, oldest first. A missing or unreadable manifest gives []."""
        path = self.dir / MANIFEST
        try:
            raw = json.loads(path.read_text())
            return sorted((CheckpointEntry(**e) for e in raw["checkpoints"]), key=lambda e: e.step)
        except FileNotFoundError:
            return []
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("checkpoint manifest %s is unreadable (%s); ignoring it", path, exc)
            return []

    def _write_manifest(self, entries: list[CheckpointEntry]) -> None:
        body = {"version": 1, "checkpoints": [asdict(e) for e in sorted(entries, key=lambda e: e.step)]}
        atomic_write(self.dir / MANIFEST, json.dumps(body, indent=1).encode())

    # -- save / restore ---------------------------------------------------------
    def save(self, step: int, state: Any) -> CheckpointEntry:
        t0 = time.perf_counter()
        self.dir.mkdir(parents=True, exist_ok=True)
        data = _dumps(state)
        name = f"step_{step:010d}.ckpt"
        try:
            atomic_write(self.dir / name, data)
        except OSError as exc:
            raise CheckpointError(
                f"could not write checkpoint {self.dir / name}: {exc}; older checkpoints are intact"
            ) from exc
        entry = CheckpointEntry(
            step=step, file=name, time=self._clock(), sha256=hashlib.sha256(data).hexdigest(), bytes=len(data)
        )
        before = self.entries()
        entries = [e for e in before if e.step != step] + [entry]
        entries.sort(key=lambda e: e.step)
        keep, drop = entries[-self.keep_last :], entries[: -self.keep_last]
        try:
            self._write_manifest(keep)
        except OSError as exc:  # e.g. the disk filled up between the two writes
            if name not in {e.file for e in before}:
                (self.dir / name).unlink(missing_ok=True)  # not in the manifest: no use, only space
            raise CheckpointError(
                f"could not write checkpoint manifest {self.dir / MANIFEST}: {exc}; older checkpoints are intact"
            ) from exc
        for old in drop:
            if old.file not in {k.file for k in keep}:
                (self.dir / old.file).unlink(missing_ok=True)
        self.last_save_s = time.perf_counter() - t0
        return entry

    def verify(self, entry: CheckpointEntry) -> bytes | None:
        """The checkpoint's bytes if its checksum matches, else None."""
        try:
            data = (self.dir / entry.file).read_bytes()
        except OSError:
            return None
        if hashlib.sha256(data).hexdigest() != entry.sha256:
            return None
        return data

    def latest(self) -> tuple[CheckpointEntry, Any] | None:
        """Newest checkpoint that verifies and loads, with its state; None if there is none."""
        for entry in reversed(self.entries()):
            data = self.verify(entry)
            if data is None:
                log.warning("checkpoint %s fails its checksum; falling back to an older one", self.dir / entry.file)
                continue
            try:
                return entry, _loads(data)
            except Exception as exc:
                log.warning("checkpoint %s does not load (%s); falling back to an older one", entry.file, exc)
        return None
