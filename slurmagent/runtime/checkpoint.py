"""Atomic checkpoints with a manifest (step, time, checksum) and keep-last-K pruning.

A checkpoint is one file `step_<N>.ckpt` plus an entry in `manifest.json`. Both are
written to a temporary file, fsync'ed, renamed into place, and the directory fsync'ed, so
a crash at any moment leaves either the old or the new checkpoint, never half of one.
`restore()` takes the newest entry whose checksum verifies and falls back to older ones.

`save_background()` blocks the caller only for a snapshot of the state (tensors cloned to
CPU memory); serialising, writing, fsync and the manifest update run in a thread. At most
one write is in flight: the next save (or `wait()`) joins it first and raises its error,
if it had one, as a CheckpointError. The file is byte for byte what `save()` writes for
the same snapshot.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import logging
import os
import pickle
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
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


def atomic_write(path: Path, data: bytes | memoryview) -> None:
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


def _dumps(obj: Any) -> bytes | memoryview:
    """torch.save when torch is in use (state with tensors), else plain pickle: a job that
    never imported torch does not pay ~200 MB of memory for importing it here."""
    if "torch" not in sys.modules:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getbuffer()  # no second copy of a possibly multi-GB buffer


def _offload(obj: Any, memo: dict[int, Any], torch: Any) -> None:
    """Pre-fill deepcopy's memo with CPU copies of the accelerator tensors found in nested
    dicts, lists and tuples (where state dicts keep them)."""
    if isinstance(obj, torch.Tensor):
        if obj.device.type != "cpu" and id(obj) not in memo:
            cpu = obj.detach().to("cpu")
            memo[id(obj)] = torch.nn.Parameter(cpu, obj.requires_grad) if isinstance(obj, torch.nn.Parameter) else cpu
    elif isinstance(obj, dict):
        for value in obj.values():
            _offload(value, memo, torch)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            _offload(value, memo, torch)


def snapshot(state: Any) -> Any:
    """A copy of `state` that later in-place updates cannot reach: a deep copy, with
    tensors cloned (torch's deepcopy keeps shared storage shared, Parameters, and a state
    dict's `_metadata`) and accelerator tensors copied to CPU memory."""
    memo: dict[int, Any] = {}
    torch = sys.modules.get("torch")
    if torch is not None:
        _offload(state, memo, torch)
    return copy.deepcopy(state, memo)


@dataclass
class _Write:
    """A background write in flight."""

    step: int
    thread: threading.Thread | None = None
    entry: CheckpointEntry | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


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
        self.last_save_s: float = 0.0  # duration of the last completed save, start to durable file
        self.last_blocked_s: float = 0.0  # how long the last save call blocked its caller
        self._pending: _Write | None = None

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
        """Write a checkpoint now; returns once it is durable. Finishes (and raises the error
        of) any background write first."""
        t0 = time.perf_counter()
        self.wait()
        entry = self._write(step, state)
        self.last_save_s = self.last_blocked_s = time.perf_counter() - t0
        return entry

    def save_background(self, step: int, state: Any) -> None:
        """Snapshot `state` and write it in a background thread. Blocks for the previous
        background write (raising its error, if any) and for the snapshot only."""
        t0 = time.perf_counter()
        self.wait()
        snap = snapshot(state)
        pending = _Write(step)
        pending.thread = threading.Thread(
            target=self._write_in_background, args=(pending, snap, t0), name=f"checkpoint-{step}"
        )
        pending.thread.start()
        self._pending = pending
        self.last_blocked_s = time.perf_counter() - t0

    def _write_in_background(self, pending: _Write, snap: Any, t0: float) -> None:
        try:
            pending.entry = self._write(pending.step, snap)
            self.last_save_s = time.perf_counter() - t0
        except BaseException as exc:  # handed to the caller by wait()
            pending.error = exc
        finally:
            pending.done.set()

    @property
    def writing(self) -> bool:
        """A background write is in flight."""
        return self._pending is not None and not self._pending.done.is_set()

    def wait(self, raise_errors: bool = True) -> CheckpointEntry | None:
        """Join the background write in flight, if any; its entry, or None when there was
        none. A failed write raises CheckpointError (or, with raise_errors=False, is logged:
        for a caller already unwinding from another error)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        assert pending.thread is not None
        pending.thread.join()
        if pending.error is None:
            return pending.entry
        err = pending.error
        what = f"background checkpoint at step {pending.step} failed: {err}"
        if not raise_errors:
            log.error("%s", what)
            return None
        if isinstance(err, CheckpointError):
            raise err
        raise CheckpointError(f"{what}; older checkpoints are intact") from err

    def _write(self, step: int, state: Any) -> CheckpointEntry:
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
        entries = [e for e in self.entries() if e.step != step] + [entry]
        entries.sort(key=lambda e: e.step)
        keep, drop = entries[-self.keep_last :], entries[: -self.keep_last]
        self._write_manifest(keep)
        for old in drop:
            if old.file not in {k.file for k in keep}:
                (self.dir / old.file).unlink(missing_ok=True)
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
