"""File primitives every layer may use: atomic writes (temp file, fsync, rename, directory
fsync), so a crash at any moment leaves either the old or the new file, never half of one."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["atomic_file", "atomic_write", "fsync_dir", "json_rows"]


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A file to write `path` through: a temp file in the same directory, fsync'ed and
    renamed into place when the block ends; removed if the block raises."""
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically: temp file in the same directory, fsync, rename."""
    with atomic_file(path) as fh:
        fh.write(data)


def json_rows(lines: Iterable[str | bytes]) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSON-lines file's lines (metrics.jsonl, adapt.jsonl), in order; a
    line cut short by a kill (the rest of the file still counts) or one that is not an object
    is skipped."""
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            yield row
