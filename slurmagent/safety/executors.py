"""Executors that need nothing but the action itself, so an approval can run them from
any process: each is an argument vector of an allowed Slurm command (through
slurm/seam.py), or a removal confined to the sweep directory."""

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
        argv = ["scontrol", "update", f"JobId={a.target}", f"ExcNodeList={excluded}"]
        if "nodelist" in a.params:
            argv.append(f"ReqNodeList={a.params['nodelist'] or ''}")
        cli.run(argv)
        return {"excluded": excluded, "job": a.target}

    def drain(a: Action) -> dict[str, Any]:
        cli.run(["scontrol", "update", f"NodeName={a.target}", "State=DRAIN", f"Reason={a.reason[:200]}"])
        return {"drained": a.target}

    return {
        "cancel": cancel,
        "requeue": requeue,
        "exclude_node": exclude_node,
        "drain_node": drain,
        "delete_checkpoint": lambda a: delete_inside(sweep_dir, a.target),
    }
