"""auto_resume: the newest valid checkpoint in a directory tree, across formats.

Newest means the highest step (or epoch) recorded in the checkpoint itself or in its
manifest, never the file time. Each candidate is verified (manifest checksum, a loadable
header, complete shards); a truncated or corrupt newest one is skipped for the previous.

Formats: slurmagent's own (manifest.json + sha256), PyTorch .pt/.pth, Lightning .ckpt
(incl. hpc_ckpt_N), safetensors, TensorFlow (`checkpoint` index + .index/.data-*), Keras
.h5 and .keras, Orbax step directories, flax .msgpack, Hugging Face `checkpoint-N` directories
(their `trainer_state.json`), and a JSON file with a `step` (or `epoch`) field — the checkpoint
a plain script in any language can write (docs/trainers.md).
"""

from __future__ import annotations

import json
import logging
import pickle
import re
import struct
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from slurmagent.skills._base import SkillResult, Status, TypedSkill

log = logging.getLogger(__name__)

STEP_KEYS = ("global_step", "step", "iteration", "iterations", "train_step", "steps")
EPOCH_KEYS = ("epoch", "epochs")
NUMBER_IN_NAME = re.compile(r"(\d+)(?!.*\d)")


class Invalid(Exception):
    """A candidate checkpoint failed verification; the message says how."""


@dataclass(frozen=True)
class Candidate:
    path: str  # the file or directory to resume from
    format: str
    step: int | None  # from the content or manifest
    epoch: int | None = None
    source: str = "content"  # where the step came from: content | manifest | name
    valid: bool = True
    problem: str = ""  # why it is invalid

    @property
    def order(self) -> tuple[int, int]:
        return (self.step if self.step is not None else -1, self.epoch if self.epoch is not None else -1)


def _int(v: Any) -> int | None:
    try:
        if hasattr(v, "item"):
            v = v.item()
        return int(v) if v is not None and not isinstance(v, bool) else None
    except (TypeError, ValueError):
        return None


def step_epoch(d: Any) -> tuple[int | None, int | None]:
    """step/epoch from a checkpoint's top-level mapping (or its `metadata`/`state`)."""
    if not isinstance(d, dict):
        return None, None
    step = next((_int(d[k]) for k in STEP_KEYS if k in d and _int(d[k]) is not None), None)
    epoch = next((_int(d[k]) for k in EPOCH_KEYS if k in d and _int(d[k]) is not None), None)
    for nested in ("metadata", "meta", "state", "trainer", "loops"):
        if step is None and isinstance(d.get(nested), dict):
            step, e = step_epoch(d[nested])
            epoch = epoch if epoch is not None else e
    return step, epoch


def _name_number(path: Path) -> int | None:
    m = NUMBER_IN_NAME.search(path.name.split(".")[0])
    return int(m.group(1)) if m else None


# -- one reader per format: (path) → Candidate, raising Invalid -----------------------------------
def read_torch(path: Path) -> Candidate:
    import torch

    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as zf:
                bad = zf.testzip()  # CRC of every member: catches flipped bytes, not only truncation
        except (zipfile.BadZipFile, OSError) as exc:
            raise Invalid(f"not a complete torch zip archive: {exc}") from None
        if bad is not None:
            raise Invalid(f"member {bad} fails its CRC")
    elif path.stat().st_size < 8:
        raise Invalid("truncated")
    mmap = zipfile.is_zipfile(path)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError:
        # intact, but holds objects beyond tensors (Lightning's hyper-parameters): the user's own
        # checkpoint, which resuming unpickles anyway
        try:
            obj = torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)
        except Exception as exc:
            raise Invalid(f"torch.load fails: {type(exc).__name__}: {str(exc)[:200]}") from None
    except Exception as exc:
        raise Invalid(f"torch.load fails: {type(exc).__name__}: {str(exc)[:200]}") from None
    step, epoch = step_epoch(obj)
    fmt = (
        "lightning"
        if path.suffix == ".ckpt" or (isinstance(obj, dict) and "pytorch-lightning_version" in obj)
        else "torch"
    )
    if step is None and epoch is None:
        return Candidate(str(path), fmt, _name_number(path), source="name")
    return Candidate(str(path), fmt, step, epoch)


def read_safetensors(path: Path) -> Candidate:
    size = path.stat().st_size
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            raise Invalid("truncated before the header length")
        (n,) = struct.unpack("<Q", raw)
        if n > min(size, 100 * 2**20):
            raise Invalid(f"header length {n} exceeds the file")
        try:
            header = json.loads(fh.read(n))
        except ValueError as exc:
            raise Invalid(f"header is not JSON: {exc}") from None
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if size != 8 + n + end:
        raise Invalid(f"size {size} bytes, header says {8 + n + end}: truncated or padded")
    step, epoch = step_epoch(header.get("__metadata__") or {})
    if step is None and epoch is None:
        return Candidate(str(path), "safetensors", _name_number(path), source="name")
    return Candidate(str(path), "safetensors", step, epoch)


HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def read_h5(path: Path) -> Candidate:
    with open(path, "rb") as fh:
        if fh.read(8) != HDF5_SIGNATURE:
            raise Invalid("no HDF5 signature")
    try:
        import h5py
    except ImportError:
        return Candidate(str(path), "keras_h5", _name_number(path), source="name")
    try:
        with h5py.File(path, "r") as f:
            step, epoch = step_epoch({k: v for k, v in f.attrs.items()})
            it = f.get("optimizer_weights/iterations") or f.get("optimizer_weights/optimizer/iterations")
            if step is None and it is not None:
                step = _int(it[()])
            f.visititems(lambda _n, obj: obj[()] if isinstance(obj, h5py.Dataset) else None)  # every dataset reads
    except Exception as exc:
        raise Invalid(f"HDF5 does not read: {type(exc).__name__}: {str(exc)[:200]}") from None
    if step is None and epoch is None:
        return Candidate(str(path), "keras_h5", _name_number(path), source="name")
    return Candidate(str(path), "keras_h5", step, epoch)


def read_keras(path: Path) -> Candidate:
    """Keras 3 `.keras`: a zip of config.json, metadata.json and model.weights.h5."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
            missing = {"config.json", "metadata.json"} - names
            if missing:
                raise Invalid(f"missing {', '.join(sorted(missing))}")
            bad = zf.testzip()
            if bad is not None:
                raise Invalid(f"member {bad} fails its CRC")
            meta = json.loads(zf.read("metadata.json"))
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise Invalid(f"not a complete .keras archive: {exc}") from None
    step, epoch = step_epoch(meta)
    if step is None and epoch is None:
        return Candidate(str(path), "keras", _name_number(path), source="name")
    return Candidate(str(path), "keras", step, epoch)


def read_msgpack(path: Path) -> Candidate:
    try:
        import msgpack
    except ImportError:
        return Candidate(str(path), "msgpack", _name_number(path), source="name")
    try:
        obj = msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=False)
    except Exception as exc:
        raise Invalid(f"msgpack does not decode: {type(exc).__name__}: {exc}") from None
    step, epoch = step_epoch(obj)
    if step is None and epoch is None:
        return Candidate(str(path), "msgpack", _name_number(path), source="name")
    return Candidate(str(path), "msgpack", step, epoch)


LEVELDB_MAGIC = struct.pack("<Q", 0xDB4775248B80FB57)  # TF's .index is a LevelDB table


def read_tf(prefix: Path) -> Candidate:
    """A TF checkpoint `ckpt-N`: `ckpt-N.index` (table footer magic) and every data shard."""
    index = prefix.with_name(prefix.name + ".index")
    try:
        data = index.read_bytes()
    except OSError as exc:
        raise Invalid(f"index unreadable: {exc}") from None
    if len(data) < 48 or data[-8:] != LEVELDB_MAGIC:
        raise Invalid(f"{index.name} is truncated (no table footer)")
    shards = sorted(prefix.parent.glob(prefix.name + ".data-*-of-*"))
    if not shards:
        raise Invalid("no .data shard")
    total = int(shards[0].name.rsplit("-of-", 1)[1])
    if len(shards) != total or any(s.stat().st_size == 0 for s in shards):
        raise Invalid(f"{len(shards)} of {total} data shards present (or empty)")
    step = _name_number(prefix)
    return Candidate(str(prefix), "tensorflow", step, source="manifest")


def read_orbax(step_dir: Path) -> Candidate:
    """An Orbax step directory: finalized (no tmp suffix), _CHECKPOINT_METADATA parses,
    each item's _METADATA parses."""
    meta_file = step_dir / "_CHECKPOINT_METADATA"
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, ValueError) as exc:
        raise Invalid(f"_CHECKPOINT_METADATA: {exc}") from None
    items = [d for d in step_dir.iterdir() if d.is_dir()]
    if not items:
        raise Invalid("no checkpoint items")
    for item in items:
        try:
            json.loads((item / "_METADATA").read_text())
        except (OSError, ValueError) as exc:
            raise Invalid(f"item {item.name}: _METADATA: {exc}") from None
    step = _int(meta.get("step")) if isinstance(meta, dict) and "step" in meta else int(step_dir.name)
    return Candidate(str(step_dir), "orbax", step, source="manifest")


HF_STATE = "trainer_state.json"  # a Hugging Face Trainer checkpoint-N directory's record of its step


def read_json(path: Path) -> Candidate | None:
    """A JSON checkpoint: a top-level object with a step (or epoch); a Hugging Face
    `trainer_state.json` stands for its directory. None: JSON that is not a checkpoint."""
    try:
        obj = json.loads(path.read_text())
    except ValueError as exc:
        raise Invalid(f"not complete JSON: {exc}") from None
    step, epoch = step_epoch(obj)
    if step is None and epoch is None:
        return None
    if path.name == HF_STATE:
        return Candidate(str(path.parent), "huggingface", step, epoch)
    return Candidate(str(path), "json", step, epoch)


def slurmagent_candidates(directory: Path) -> Iterator[Candidate]:
    """slurmagent's own checkpoints: step and sha256 from manifest.json."""
    from slurmagent.primitives.checkpoint import CheckpointManager

    mgr = CheckpointManager(directory)
    for e in mgr.entries():
        ok = mgr.verify(e) is not None
        yield Candidate(
            str(directory / e.file),
            "slurmagent",
            e.step,
            source="manifest",
            valid=ok,
            problem="" if ok else "sha256 mismatch",
        )


SUFFIX_READERS: dict[str, Callable[[Path], Candidate | None]] = {
    ".json": read_json,
    ".pt": read_torch,
    ".pth": read_torch,
    ".ckpt": read_torch,
    ".bin": read_torch,
    ".safetensors": read_safetensors,
    ".h5": read_h5,
    ".hdf5": read_h5,
    ".keras": read_keras,
    ".msgpack": read_msgpack,
}


def _checked(reader: Callable[[Path], Candidate | None], path: Path, fmt: str) -> list[Candidate]:
    """[the reader's candidate], or [an invalid one saying why it did not read]; [] when the
    file is not a checkpoint."""
    try:
        found = reader(path)
    except Invalid as exc:
        return [Candidate(str(path), fmt, _name_number(path), source="name", valid=False, problem=str(exc))]
    except OSError as exc:
        return [Candidate(str(path), fmt, None, valid=False, problem=str(exc))]
    return [found] if found is not None else []


def scan(root: Path) -> list[Candidate]:
    """Every checkpoint under `root`, valid or not (unsorted)."""
    found: list[Candidate] = []
    managed: set[str] = set()
    for manifest in root.rglob("manifest.json"):
        cands = list(slurmagent_candidates(manifest.parent))
        found += cands
        managed.update(c.path for c in cands)
    tf_prefixes: set[Path] = set()
    for path in sorted(root.rglob("*")):
        if path.is_dir():
            if path.name.isdigit() and (path / "_CHECKPOINT_METADATA").exists():
                found += _checked(read_orbax, path, "orbax")
            elif path.name.split(".")[0].isdigit() and ".orbax-checkpoint-tmp" in path.name:
                found.append(
                    Candidate(
                        str(path),
                        "orbax",
                        int(path.name.split(".")[0]),
                        source="name",
                        valid=False,
                        problem="not finalized",
                    )
                )
            continue
        if str(path) in managed or path.name.startswith(".") or path.name == "manifest.json":
            continue
        if path.suffix == ".index" or ".data-" in path.name:
            tf_prefixes.add(path.with_name(path.name.split(".index")[0].split(".data-")[0]))
            continue
        reader = SUFFIX_READERS.get(path.suffix)
        if reader is not None:
            found += _checked(reader, path, path.suffix.lstrip("."))
    for prefix in sorted(tf_prefixes):
        found += _checked(read_tf, prefix, "tensorflow")
    return found


def newest_valid(candidates: list[Candidate]) -> tuple[Candidate | None, list[Candidate]]:
    """(the newest valid checkpoint, every invalid one). An invalid checkpoint's step is
    unknown (its content does not read): it is listed by the number in its name."""
    valid = [c for c in candidates if c.valid]
    invalid = sorted((c for c in candidates if not c.valid), key=lambda c: c.order, reverse=True)
    return (max(valid, key=lambda c: c.order) if valid else None), invalid


def newest_checkpoint(directory: Path, accept: Callable[[Path], bool] | None = None) -> tuple[str, int | None] | None:
    """(path, step) of the newest valid checkpoint under `directory`, any format this skill knows
    (only those `accept` takes, when given: a trainer that reads one format falls back to an older
    checkpoint of it, not to nothing); None when there is none (or the directory does not exist).
    What a plain script is handed as `$SLURMAGENT_RESUME_FROM` (job/command.py) and what a trainer
    integration resumes from."""
    if not directory.is_dir():
        return None
    try:
        found = scan(directory)
        best, skipped = newest_valid([c for c in found if accept is None or accept(Path(c.path))])
    except ImportError as exc:  # a format's library missing here (torch for .pt): say so, resume from nothing
        log.warning("cannot read the checkpoints under %s: %s; the program starts without RESUME_FROM", directory, exc)
        return None
    for bad in skipped:
        log.warning("checkpoint %s skipped: %s", bad.path, bad.problem)
    return (best.path, best.step if best.step is not None else best.epoch) if best is not None else None


@dataclass(frozen=True)
class ResumeInput:
    directory: Path | None = field(default=None, metadata={"help": "directory tree to search"})


class AutoResume(TypedSkill[ResumeInput]):
    name = "auto_resume"
    description = (
        "newest valid checkpoint (by recorded step) across PyTorch, Lightning, safetensors, TF/Keras, Orbax, msgpack"
    )
    Input = ResumeInput
    positional = ("directory",)

    def check(self, inp: ResumeInput) -> SkillResult:
        if inp.directory is None:
            return self.unknown("no directory given")
        if not inp.directory.is_dir():
            return self.unknown(f"{inp.directory} is not a directory")
        cands = scan(inp.directory)
        best, skipped = newest_valid(cands)
        findings: dict[str, Any] = {
            "resume_from": asdict(best) if best else None,
            "skipped": [asdict(c) for c in skipped],
            "candidates": len(cands),
        }
        reasons = [f"checkpoint {c.path} is invalid, skipped: {c.problem}" for c in skipped]
        if best is None:
            if not cands:
                return SkillResult(self.name, Status.OK, [], findings)  # nothing to resume: start fresh
            return SkillResult(self.name, Status.CRITICAL, ["no valid checkpoint", *reasons], findings)
        return SkillResult(self.name, Status.WARNING if skipped else Status.OK, reasons, findings)
