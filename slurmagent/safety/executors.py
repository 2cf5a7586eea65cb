"""Executors that need nothing but the action itself, so an approval can run them from
any process: each is a verb of the Slurm seam (slurm/seam.py), or a removal confined to the
sweep directory. An executor returns what it did (a dict for the audit log's outcome); it
changes no record of the caller's: the caller applies the outcome after the gate returns."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slurmagent.errors import SlurmAgentError
from slurmagent.records import Action
from slurmagent.slurm.seam import SlurmCLI

Executor = Callable[[Action], dict[str, Any]]


def delete_inside(root: Path, target: str) -> dict[str, Any]:
    """Remove `target` only when it resolves inside `root` (no `..`, no symlink out)."""
    base = root.resolve()
    path = (base / target).resolve() if not Path(target).is_absolute() else Path(target).resolve()
    if path == base or not path.is_relative_to(base):
        raise SlurmAgentError(f"refusing to delete {target!r}: it is not inside {base}")
    if not path.exists():
        raise SlurmAgentError(f"nothing to delete: {path} does not exist")
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
    return {"deleted": str(path)}


def standalone_executors(sweep_dir: Path, slurm: SlurmCLI | None = None) -> dict[str, Executor]:
    cli = slurm or SlurmCLI()

    def cancel(a: Action) -> dict[str, Any]:
        cli.cancel([a.target])
        return {"cancelled": a.target}

    def requeue(a: Action) -> dict[str, Any]:
        cli.requeue(a.target)
        return {"requeued": a.target}

    def exclude_node(a: Action) -> dict[str, Any]:
        # a pending (e.g. just requeued) job: its next run avoids the node(s) in params["exclude"];
        # params["nodelist"], when given, replaces its required nodes (a job pinned to an excluded node)
        excluded = str(a.params["exclude"])
        nodelist = a.params.get("nodelist")
        cli.exclude(a.target, excluded, None if nodelist is None else str(nodelist or ""))
        return {"excluded": excluded, "job": a.target}

    def drain(a: Action) -> dict[str, Any]:
        cli.drain(a.target, a.reason)
        return {"drained": a.target}

    return {
        "cancel": cancel,
        "requeue": requeue,
        "exclude_node": exclude_node,
        "drain_node": drain,
        "delete_checkpoint": lambda a: delete_inside(sweep_dir, a.target),
    }
