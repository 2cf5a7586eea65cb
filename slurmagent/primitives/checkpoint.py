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
import functools
import hashlib
import io
import json
import logging
import os
import pickle
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, BinaryIO, cast

from slurmagent.errors import CheckpointError
from slurmagent.files import atomic_file, atomic_write

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class CheckpointEntry:
    step: int  # training step the checkpoint was taken after
    file: str  # file name inside the checkpoint directory
    time: float  # unix time of the save
    sha256: str  # checksum of the file's bytes
    bytes: int  # file size


class _HashingWriter:
    """File-like `write` that checksums and counts what passes through to `fh`."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh = fh
        self.sha256 = hashlib.sha256()
        self.bytes = 0

    def write(self, data: bytes) -> int:
        self.sha256.update(data)  # hashlib and the file write release the GIL on large buffers
        n = self.fh.write(data)
        self.bytes += n
        return n

    def flush(self) -> None:
        self.fh.flush()


def _dump(obj: Any, out: _HashingWriter) -> None:
    """torch.save when torch is in use (state with tensors), else plain pickle: a job that
    never imported torch does not pay ~200 MB of memory for importing it here. Streams to
    the file: no in-memory copy of a possibly multi-GB checkpoint."""
    if "torch" not in sys.modules:
        pickle.dump(obj, out, protocol=pickle.HIGHEST_PROTOCOL)
        return
    import torch

    torch.save(obj, cast(IO[bytes], out))  # torch only calls write() and flush()


class Staging:
    """CPU storages a snapshot copies tensors into, reused by the next snapshot once the
    write that read them is done: copying into memory already faulted in is several times
    faster than into fresh memory (bench/README.md). Holds one state's size of memory."""

    def __init__(self) -> None:
        self._free: dict[int, list[Any]] = {}
        self._used: list[Any] = []

    def begin(self) -> None:
        """Start a snapshot: the previous one's storages become free for reuse."""
        self._free = {}
        for storage in self._used:
            self._free.setdefault(storage.nbytes(), []).append(storage)
        self._used = []

    def take(self, nbytes: int, torch: Any) -> Any:
        pool = self._free.get(nbytes)
        storage = pool.pop() if pool else torch.UntypedStorage(nbytes)
        self._used.append(storage)
        return storage

    def end(self) -> None:
        self._free = {}  # storages the state no longer needs are released

    def warm(self, sizes: list[int], torch: Any) -> None:
        """Have storages of these sizes ready for the next snapshot, every page touched;
        ones already held are kept."""
        self.begin()
        for nbytes in sizes:
            pool = self._free.get(nbytes)
            if pool:
                self._used.append(pool.pop())
            else:
                self.take(nbytes, torch).fill_(0)
        self.end()


def _tensors(obj: Any, torch: Any) -> Iterator[Any]:
    """The tensors in nested dicts, lists and tuples (where state dicts keep them)."""
    if isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value, torch)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value, torch)
    elif isinstance(obj, torch.Tensor):
        yield obj


def _plain_cpu(t: Any, torch: Any) -> bool:
    """A dense CPU tensor with nothing but its storage view to copy (state dict entries)."""
    return (
        type(t) is torch.Tensor
        and t.device.type == "cpu"
        and t.layout == torch.strided
        and not (t.requires_grad or t.is_quantized or t.is_conj() or t.is_neg() or t.__dict__)
    )


def _prefill(state: Any, memo: dict[int, Any], torch: Any, staging: Staging | None) -> None:
    """Put CPU copies of the state's tensors into deepcopy's memo. Plain CPU tensors become
    views on copies of their storages, so tensors that shared a storage still share one;
    tensors on an accelerator are copied to CPU; other tensor kinds are left to torch's
    deepcopy."""
    copies: dict[int, Any] = {}
    for obj in _tensors(state, torch):
        if id(obj) in memo:
            continue
        if obj.device.type != "cpu":
            cpu = obj.detach().to("cpu")
            memo[id(obj)] = torch.nn.Parameter(cpu, obj.requires_grad) if isinstance(obj, torch.nn.Parameter) else cpu
        elif _plain_cpu(obj, torch):
            src = obj.untyped_storage()
            dst = copies.get(src.data_ptr())
            if dst is None:
                dst = staging.take(src.nbytes(), torch) if staging else torch.UntypedStorage(src.nbytes())
                dst.copy_(src)
                copies[src.data_ptr()] = dst
            memo[id(obj)] = torch.empty(0, dtype=obj.dtype).set_(dst, obj.storage_offset(), obj.size(), obj.stride())


def snapshot(state: Any, staging: Staging | None = None) -> Any:
    """A copy of `state` that later in-place updates cannot reach: a deep copy (a state
    dict's `_metadata` included), with tensors copied to CPU memory, shared storages kept
    shared. Saving it gives the same bytes as saving `state` (for CPU tensors)."""
    memo: dict[int, Any] = {}
    torch = sys.modules.get("torch")
    if staging is not None:
        staging.begin()
    try:
        if torch is not None:
            _prefill(state, memo, torch, staging)
        return copy.deepcopy(state, memo)
    finally:
        if staging is not None:
            staging.end()


@dataclass
class _Write:
    """A background write in flight."""

    step: int
    what: str  # for error messages
    thread: threading.Thread | None = None
    entry: CheckpointEntry | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


def _loads(data: bytes) -> Any:
    if data[:2] == b"PK":  # torch.save's zip format
        import torch

        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
    return pickle.loads(data)  # our own checkpoint files


# lets an old checkpoint go (checkpoint.keep_last): called with its entry and a function that
# deletes its file, it runs that function (or not) and says whether the file is gone
Pruner = Callable[[CheckpointEntry, Callable[[], None]], bool]


class CheckpointManager:
    """Saves and restores checkpoints in one directory."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        keep_last: int = 3,
        clock: Callable[[], float] = time.time,
        prune: Pruner | None = None,
    ) -> None:
        self.dir = Path(directory)
        self.keep_last = keep_last
        # who lets an old checkpoint go (keep_last): the job's gate (runtime/loop.py hands it over);
        # None: deleted here (a manager used outside a job, e.g. by a skill)
        self._prune = prune
        self._kept: set[str] = set()  # files the pruner did not let go: kept, still in the manifest
        self._clock = clock
        self.last_save_s: float = 0.0  # duration of the last completed save, start to durable file
        self.last_blocked_s: float = 0.0  # how long the last save call blocked its caller
        self.last_wait_s: float = 0.0  # of which waiting for the previous background write to finish
        self._pending: _Write | None = None
        self._staging = Staging()  # snapshot memory, reused from one background save to the next

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
        self.last_wait_s = time.perf_counter() - t0
        entry = self._write(step, state)
        self.last_save_s = self.last_blocked_s = time.perf_counter() - t0
        return entry

    def save_background(self, step: int, state: Any) -> None:
        """Snapshot `state` and write it in a background thread. Blocks for the previous
        background write (raising its error, if any) and for the snapshot only."""
        t0 = time.perf_counter()
        self.wait()
        self.last_wait_s = time.perf_counter() - t0
        snap = snapshot(state, self._staging)
        pending = _Write(step, f"background checkpoint at step {step}")

        def write() -> None:
            pending.entry = self._write(step, snap)
            self.last_save_s = time.perf_counter() - t0

        self._start(pending, write)
        self.last_blocked_s = time.perf_counter() - t0

    def _start(self, pending: _Write, work: Callable[[], None]) -> None:
        """Run `work` in a thread as the one background job in flight; an exception is
        kept for `wait()` to raise."""

        def run() -> None:
            try:
                work()
            except BaseException as exc:
                pending.error = exc
            finally:
                pending.done.set()

        pending.thread = threading.Thread(target=run, name=f"checkpoint-{pending.step}")
        pending.thread.start()
        self._pending = pending

    def prepare(self, state: Any) -> None:
        """Allocate and touch the snapshot memory for `state` in a background thread, so
        that the first background save copies into memory already faulted in (3-5x faster
        than into fresh pages). For training code to call once it has restored its state."""
        torch = sys.modules.get("torch")
        if torch is None:
            return
        self.wait()
        sizes: dict[int, int] = {}
        for t in _tensors(state, torch):
            if _plain_cpu(t, torch):
                sizes[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        self._start(_Write(-1, "allocating snapshot memory"), lambda: self._staging.warm(list(sizes.values()), torch))

    @property
    def writing(self) -> bool:
        """A background checkpoint write is in flight."""
        return self._pending is not None and self._pending.step >= 0 and not self._pending.done.is_set()

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
        what = f"{pending.what} failed: {err}"
        if not raise_errors:
            log.error("%s", what)
            return None
        if isinstance(err, CheckpointError):
            raise err
        raise CheckpointError(f"{what}; older checkpoints are intact") from err

    def _write(self, step: int, state: Any) -> CheckpointEntry:
        self.dir.mkdir(parents=True, exist_ok=True)
        name = f"step_{step:010d}.ckpt"
        try:
            with atomic_file(self.dir / name) as fh:
                out = _HashingWriter(fh)
                _dump(state, out)
        except OSError as exc:
            raise CheckpointError(
                f"could not write checkpoint {self.dir / name}: {exc}; older checkpoints are intact"
            ) from exc
        entry = CheckpointEntry(
            step=step, file=name, time=self._clock(), sha256=out.sha256.hexdigest(), bytes=out.bytes
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
        kept = self._let_go([old for old in drop if old.file not in {k.file for k in keep}])
        if kept:  # a checkpoint the gate did not let go stays a checkpoint: listed, restorable
            try:
                self._write_manifest(keep + kept)
            except OSError as exc:
                log.warning("checkpoint manifest %s: could not list the kept %s again: %s", self.dir, kept, exc)
        return entry

    def _let_go(self, old: list[CheckpointEntry]) -> list[CheckpointEntry]:
        """Delete checkpoints older than the newest keep_last, each as the pruner allows;
        returns those kept. A file the pruner kept once is not asked about again by this manager."""
        kept: list[CheckpointEntry] = []
        for entry in old:
            path = self.dir / entry.file
            if entry.file in self._kept:
                kept.append(entry)
            elif self._prune is None:
                path.unlink(missing_ok=True)
            elif not self._prune(entry, functools.partial(path.unlink, missing_ok=True)):
                self._kept.add(entry.file)
                kept.append(entry)
        return kept

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
