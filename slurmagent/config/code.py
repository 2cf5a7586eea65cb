"""The `code` group: whether a sweep runs a snapshot of the project's files (launch/snapshot.py)."""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from slurmagent.config.parse import parse_conf
from slurmagent.errors import ConfigError, choices

SnapshotChoice = Literal["auto", "on", "off"]
SNAPSHOT_CHOICES: tuple[str, ...] = typing.get_args(SnapshotChoice)


@dataclass(frozen=True)
class CodeConf:
    """At submission, copy the project's files into the sweep and run every job from the copy:
    the git work tree's tracked and untracked-but-not-ignored files (else the launcher's
    directory), without Hydra's output folders. `auto`: on for Slurm, off for the local backend."""

    snapshot: str = "auto"  # auto | on | off
    max_mb: float = 200.0  # refuse a bigger snapshot (data or environments that .gitignore should leave out)


def code_conf(raw: Mapping[str, Any] | None) -> CodeConf:
    conf = parse_conf(CodeConf, raw, "code")
    if conf.snapshot not in SNAPSHOT_CHOICES:
        raise ConfigError(f"code.snapshot={conf.snapshot!r} is not one of {choices(SNAPSHOT_CHOICES)}")
    if not conf.max_mb > 0:
        raise ConfigError(f"code.max_mb={conf.max_mb} must be positive")
    return conf
