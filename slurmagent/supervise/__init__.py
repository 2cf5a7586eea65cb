"""Supervision from the login node: sweep state on disk and the batched poll loop.

The names below are imported when first used: `slurmagent status` reads the state without
importing the supervisor (and, through it, recovery and the safety gate)."""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "Attempt": "state",
    "SweepState": "state",
    "SweepStore": "state",
    "TaskRecord": "state",
    "Supervisor": "supervisor",
    "sweep_table": "views",
}

__all__ = ["Attempt", "Supervisor", "SweepState", "SweepStore", "TaskRecord", "sweep_table"]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"slurmagent.supervise.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
