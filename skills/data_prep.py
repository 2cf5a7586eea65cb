"""data_prep: fetch a dataset once per node (or shared cache), verify it, extract it safely.

Sources: a path, file:// or http(s):// URL. The cache entry is guarded by a `filelock`
lock, so concurrent array tasks download once and the others reuse it. The checksum
(sha256 or md5) is verified before anything is extracted. Extraction refuses absolute
paths, `..`, links pointing outside the target and device files, and is marked complete
only at the end (an interrupted extraction is redone). An index (files, sizes) is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tarfile
import time
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from slurmagent.skills._base import SkillResult, Status, TypedSkill


class UnsafeArchive(ValueError):
    """An archive member would land outside the target or is not a plain file/dir."""


def file_digest(path: Path, algo: str) -> str:
    h = hashlib.new(algo)
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _safe_name(name: str) -> PurePosixPath:
    p = PurePosixPath(name.replace("\\", "/"))
    if p.is_absolute() or ".." in p.parts or (p.parts and ":" in p.parts[0]):
        raise UnsafeArchive(f"member {name!r} would be written outside the target")
    return p


def check_tar(tf: tarfile.TarFile) -> list[tarfile.TarInfo]:
    members = tf.getmembers()
    for m in members:
        p = _safe_name(m.name)
        if m.issym() or m.islnk():
            target = PurePosixPath(m.linkname)
            resolved = target if m.islnk() else p.parent / target
            if target.is_absolute() or ".." in PurePosixPath(os.path.normpath(str(resolved))).parts:
                raise UnsafeArchive(f"link {m.name!r} -> {m.linkname!r} points outside the target")
        elif not (m.isfile() or m.isdir()):
            raise UnsafeArchive(f"member {m.name!r} is a device, fifo or other special file")
    return members


def check_zip(zf: zipfile.ZipFile) -> None:
    for info in zf.infolist():
        _safe_name(info.filename)
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode):
            raise UnsafeArchive(f"member {info.filename!r} is a symlink; zip links are refused")


def extract(archive: Path, dest: Path) -> int:
    """Extract into `dest` (fresh); returns the number of members. UnsafeArchive on any
    member that could escape; nothing is left behind then."""
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                check_zip(zf)
                zf.extractall(tmp)
                n = len(zf.infolist())
        else:
            with tarfile.open(archive) as tf:
                members = check_tar(tf)
                tf.extractall(tmp, members=members, filter="data")
                n = len(members)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return n


def is_archive(path: Path) -> bool:
    return zipfile.is_zipfile(path) or (path.is_file() and tarfile.is_tarfile(path))


def fetch(source: str, target: Path, timeout: float = 60.0) -> None:
    """Copy or download `source` to `target` atomically (temp file, rename)."""
    parsed = urllib.parse.urlparse(source)
    tmp = target.with_name(f".{target.name}.download.{os.getpid()}")
    try:
        if parsed.scheme in ("http", "https"):
            with urllib.request.urlopen(source, timeout=timeout) as resp, open(tmp, "wb") as out:
                shutil.copyfileobj(resp, out, 1 << 20)
        elif parsed.scheme in ("file", ""):
            src = Path(urllib.parse.unquote(parsed.path)) if parsed.scheme == "file" else Path(source)
            shutil.copyfile(src, tmp)
        else:
            raise ValueError(f"source scheme {parsed.scheme!r} is not one of file, http, https")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def build_index(root: Path) -> dict[str, Any]:
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != ".slurmagent-complete")
    return {
        "files": [{"path": str(p.relative_to(root)), "bytes": p.stat().st_size} for p in files],
        "count": len(files),
    }


@dataclass(frozen=True)
class DataPrepInput:
    source: str | None = field(default=None, metadata={"help": "path, file:// or http(s):// URL"})
    cache: Path | None = field(default=None, metadata={"help": "cache directory (default ~/.cache/slurmagent/data)"})
    sha256: str | None = field(default=None, metadata={"help": "expected sha256 of the downloaded file"})
    md5: str | None = field(default=None, metadata={"help": "expected MD5 (when no sha256 is published)"})
    extract: bool = field(default=True, metadata={"help": "extract tar/zip archives"})
    lock_timeout_s: float = field(default=3600.0, metadata={"help": "how long to wait for another task's download"})


class DataPrep(TypedSkill[DataPrepInput]):
    name = "data_prep"
    description = (
        "fetch (path, file://, http(s)) once under a file lock, verify sha256/MD5, extract tar/zip safely, index"
    )
    Input = DataPrepInput
    positional = ("source",)

    def check(self, inp: DataPrepInput) -> SkillResult:
        from filelock import FileLock, Timeout

        if not inp.source:
            return self.unknown("no source given")
        cache = inp.cache or Path.home() / ".cache" / "slurmagent" / "data"
        name = Path(urllib.parse.urlparse(inp.source).path).name or "download"
        key = hashlib.sha256(inp.source.encode()).hexdigest()[:12]
        entry = cache / f"{key}-{name}"
        cache.mkdir(parents=True, exist_ok=True)
        algo, expected = ("sha256", inp.sha256) if inp.sha256 else ("md5", inp.md5) if inp.md5 else ("sha256", None)
        findings: dict[str, Any] = {"file": str(entry), "downloaded": False}
        t0 = time.monotonic()
        try:
            with FileLock(str(entry) + ".lock", timeout=inp.lock_timeout_s):
                digest = file_digest(entry, algo) if entry.exists() else None
                if digest is None or (expected and digest != expected.lower()):
                    fetch(inp.source, entry)
                    findings["downloaded"] = True
                    digest = file_digest(entry, algo)
                findings[algo] = digest
                if expected and digest != expected.lower():
                    entry.unlink(missing_ok=True)
                    return SkillResult(
                        self.name,
                        Status.CRITICAL,
                        [f"{algo} of {inp.source} is {digest}, expected {expected.lower()}: removed"],
                        findings,
                    )
                root = entry
                if inp.extract and is_archive(entry):
                    root = entry.with_name(entry.name + ".d")
                    done = root / ".slurmagent-complete"
                    if not (done.exists() and done.read_text() == digest):
                        findings["members"] = extract(entry, root)
                        done.write_text(digest)
                    index = build_index(root)
                    (root.with_name(root.name + ".index.json")).write_text(json.dumps(index))
                    findings["files"] = index["count"]
                findings["path"] = str(root)
        except Timeout:
            return self.unknown(f"another task holds {entry}.lock for more than {inp.lock_timeout_s:.0f}s")
        except UnsafeArchive as exc:
            return SkillResult(
                self.name, Status.CRITICAL, [f"unsafe archive {inp.source}: {exc}; nothing extracted"], findings
            )
        except (OSError, ValueError, tarfile.TarError, zipfile.BadZipFile) as exc:
            return SkillResult(
                self.name, Status.CRITICAL, [f"cannot fetch {inp.source}: {type(exc).__name__}: {exc}"], findings
            )
        findings["seconds"] = round(time.monotonic() - t0, 3)
        reasons = [] if expected else [f"no checksum given: {inp.source} is unverified ({algo} {digest})"]
        return SkillResult(self.name, Status.WARNING if reasons else Status.OK, reasons, findings)
