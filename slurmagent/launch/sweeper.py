"""Hydra's basic sweeper, without composing every job of a big sweep twice.

Hydra's BasicSweeper checks a batch by composing the config of every job in it (about
0.1 s each: 2 minutes for 1,000 jobs) before the launcher sees it. This sweeper composes
one representative per distinct set of override keys and per distinct value of any
override that can change the job spec or pick a config group; overrides that only set
plain values are checked when the job composes on its node (a failure there fails that
task, with the error, like any other).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

from slurmagent.config import SPEC_GROUPS
from slurmagent.errors import ConfigError

SPEC_ROOTS = (*SPEC_GROUPS, "hydra")  # overrides under these can change a job spec


def spec_relevant(override: str) -> bool:
    """Can this override change the job spec? Group selections and spec keys can."""
    key = override.split("=", 1)[0].lstrip("+~")
    if "." not in key:
        return True  # a config group choice (model=big, +experiment=x) or a top-level value
    return key.split(".", 1)[0] in SPEC_ROOTS


def representatives(batch: Sequence[Sequence[str]]) -> list[Sequence[str]]:
    """The fewest jobs that still cover every key set and every spec-relevant value."""
    seen_keys: set[tuple[str, ...]] = set()
    seen_values: set[str] = set()
    reps: list[Sequence[str]] = []
    for overrides in batch:
        keys = tuple(sorted(o.split("=", 1)[0] for o in overrides))
        relevant = [o for o in overrides if spec_relevant(o)]
        if keys not in seen_keys or any(o not in seen_values for o in relevant):
            reps.append(overrides)
            seen_keys.add(keys)
            seen_values.update(relevant)
    return reps


class RepresentativeSweeper(BasicSweeper):
    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None) -> None:
        if max_batch_size is not None and max_batch_size < 1:
            raise ConfigError(f"hydra.sweeper.max_batch_size={max_batch_size} must be at least 1 (or null: one batch)")
        super().__init__(max_batch_size, params)

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        super().validate_batch_is_legal(representatives(batch))

    def sweep(self, arguments: list[str]) -> Any:
        """Hydra's sweep, except that a sweep refused before anything was submitted leaves
        nothing behind (Hydra writes multirun.yaml into the sweep directory first)."""
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).absolute() if self.config is not None else None
        new = [d for d in (sweep_dir, *sweep_dir.parents) if not d.exists()] if sweep_dir else []
        try:
            return super().sweep(arguments)
        except Exception:
            if sweep_dir is not None and not (sweep_dir / "sweep.json").exists():  # nothing was submitted
                (sweep_dir / "multirun.yaml").unlink(missing_ok=True)
                for folder in new:  # the folders this sweep created (multirun/<date>/<time>), when empty
                    with contextlib.suppress(OSError):
                        folder.rmdir()
            raise
