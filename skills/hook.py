"""Health checks in Slurm's hooks: what sbatch_templates/hooks/slurmagent-hook runs as root.

    python -I -m slurmagent.skills.hook prolog|epilog|healthcheck --config /etc/slurmagent/hooks.json
    python -I -m slurmagent.skills.hook timeout MODE --config …   (the check ran past timeout_s)

It runs the health skills for the job's GPUs (SLURM_JOB_GPUS), records the result under
the state directory, and on CRITICAL drains the node with a reason that starts with
`slurmagent:`. Exit codes follow Slurm: a failing Prolog (1) drains the node and requeues
the job; the Epilog also fails on CRITICAL; HealthCheckProgram's code is ignored by Slurm,
so it drains on CRITICAL and, with `clear_when_ok`, resumes a node whose drain reason is
ours once every check passes. It never touches a reason that is not ours.

Safe as root: no input from users (only Slurm's own environment and the root-owned config
and files it names; anything group/world-writable or not root-owned is refused), argv only,
bounded time (the hook script kills this module after timeout_s).
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurmagent.errors import ConfigError, SlurmAgentError, choices
from slurmagent.skills._base import SkillResult, Status, worst
from slurmagent.slurm.seam import SlurmCLI

REASON_PREFIX = "slurmagent:"
MODES = ("prolog", "epilog", "healthcheck")


@dataclass(frozen=True)
class HookConfig:
    """hooks.json, written by the administrator (root-owned, not group/world-writable)."""

    python: str = sys.executable  # interpreter with slurmagent installed (read by the hook script)
    timeout_s: float = 60.0  # the whole check; past it the node is drained (a hung NVML is a sick GPU)
    state_dir: str = "/var/lib/slurmagent/hooks"  # records: <state_dir>/<node>/<mode>-<job>.json
    slurm_conf: str | None = None  # SLURM_CONF for scontrol/sinfo when slurmd's environment lacks it
    thresholds: str | None = None  # gpu_health YAML; None = the packaged conf/skills/gpu_health.yaml
    readings: dict[str, str] = field(default_factory=dict)  # node → recorded readings file instead of NVML
    scan_kernel_log: bool = True  # scan /dev/kmsg for Xids (new records only)
    clear_when_ok: bool = True  # healthcheck: resume a node drained by us once all checks are OK


def _safe_root_file(path: Path) -> None:
    """Refuse a file (or its directory) that someone other than root could have written."""
    for p in (path, path.parent):
        st = p.stat()
        if st.st_uid != 0 and os.geteuid() == 0:
            raise ConfigError(f"{p} is owned by uid {st.st_uid}, not root: refusing to trust it")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not (p.is_dir() and st.st_mode & stat.S_ISVTX):
            raise ConfigError(f"{p} is writable by group or others: refusing to trust it")


def load_hook_config(path: Path) -> HookConfig:
    from slurmagent.config import parse_conf

    _safe_root_file(path)
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise ConfigError(f"{path} is not JSON: {exc}") from None
    conf = parse_conf(HookConfig, data, "hooks")
    for f in [*conf.readings.values(), *([conf.thresholds] if conf.thresholds else [])]:
        _safe_root_file(Path(f))
    return conf


def drain_reason(result: SkillResult) -> str:
    """`slurmagent: <first reason>`: only text from our own readings, no quotes, bounded."""
    text = "; ".join(result.reasons[:2]) or f"{result.skill} {result.status.name}"
    clean = "".join(c if c.isprintable() and c not in "\"'`" else " " for c in text)
    return f"{REASON_PREFIX} {clean}"[:200]


def run_checks(conf: HookConfig, mode: str, node: str, env: dict[str, str]) -> tuple[SkillResult, int | None]:
    """The health skills for this node's job GPUs, combined into one result."""
    from slurmagent.skills.gpu_health import (
        GpuHealthCheck,
        classify_xids,
        gpus_from_env,
        load_thresholds,
        parse_xids,
        read_kmsg,
        result_from_findings,
    )

    gpus = gpus_from_env(env) if mode != "healthcheck" else None
    inputs: dict[str, Any] = {"gpus": gpus, "expect_idle": mode in ("prolog", "epilog")}
    if conf.thresholds:
        inputs["config"] = Path(conf.thresholds)
    if node in conf.readings:
        inputs["readings_file"] = Path(conf.readings[node])
    parts = [GpuHealthCheck().run(**inputs)]
    last_seq: int | None = None
    if conf.scan_kernel_log:
        seq_file = Path(conf.state_dir) / node / "kmsg_seq"
        since = int(seq_file.read_text()) if seq_file.exists() else -1
        try:
            text, last_seq = read_kmsg(since)
            th = load_thresholds(Path(conf.thresholds) if conf.thresholds else None)
            parts.append(result_from_findings("xid_scan", classify_xids(parse_xids(text), th), {"since_seq": since}))
        except OSError as exc:
            parts.append(SkillResult("xid_scan", Status.UNKNOWN, [f"kernel log unreadable: {exc}"]))
    status = worst(p.status for p in parts)
    reasons = [r for p in parts if p.status == status for r in p.reasons] or [r for p in parts for r in p.reasons]
    combined = SkillResult(
        "slurmagent_hook",
        status,
        reasons,
        {
            "mode": mode,
            "node": node,
            "job_id": env.get("SLURM_JOB_ID"),
            "gpus": gpus,
            "checks": [p.to_json() for p in parts],
        },
    )
    return combined, last_seq


def record(conf: HookConfig, node: str, mode: str, job: str | None, result: SkillResult, action: str) -> Path:
    from slurmagent.files import atomic_write

    folder = Path(conf.state_dir) / node
    folder.mkdir(parents=True, exist_ok=True, mode=0o755)
    path = folder / f"{mode}-{job or int(time.time())}.json"
    atomic_write(path, json.dumps({**result.to_json(), "time": time.time(), "action": action}, indent=1).encode())
    return path


def hook_main(mode: str, conf: HookConfig, env: dict[str, str], slurm: SlurmCLI | None = None) -> int:
    if mode not in MODES:
        raise ConfigError(f"hook mode {mode!r} is not one of {choices(MODES)}")
    node = env.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]
    slurm = slurm or SlurmCLI(timeout=20)
    result, last_seq = run_checks(conf, mode, node, env)
    action = "none"
    if result.status == Status.CRITICAL:
        reason = drain_reason(result)
        slurm.drain(node, reason)
        action = f"drained: {reason}"
    elif mode == "healthcheck" and result.status == Status.OK and conf.clear_when_ok:
        state, reason = slurm.node_state(node)
        if "drain" in state.lower() and reason.startswith(REASON_PREFIX):
            slurm.resume(node)
            action = f"resumed (was: {reason})"
    record(conf, node, mode, env.get("SLURM_JOB_ID"), result, action)
    if last_seq is not None:
        (Path(conf.state_dir) / node / "kmsg_seq").write_text(str(last_seq))
    if result.status == Status.CRITICAL and mode in ("prolog", "epilog"):
        return 1  # Slurm: a failing Prolog drains the node and requeues the job
    return 0


def timeout_main(mode: str, conf: HookConfig, env: dict[str, str]) -> int:
    """The check itself hung past timeout_s (NVML stuck on a GPU that fell off the bus)."""
    node = env.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]
    result = SkillResult("slurmagent_hook", Status.CRITICAL, [f"health check timed out after {conf.timeout_s:.0f}s"])
    reason = drain_reason(result)
    SlurmCLI(timeout=20).drain(node, reason)
    record(conf, node, mode, env.get("SLURM_JOB_ID"), result, f"drained: {reason}")
    return 1 if mode in ("prolog", "epilog") else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="slurmagent.skills.hook")
    p.add_argument("mode", choices=(*MODES, "timeout"))
    p.add_argument("timed_out_mode", nargs="?", choices=MODES)
    p.add_argument("--config", type=Path, required=True)
    args = p.parse_args(argv)
    env = dict(os.environ)
    try:
        conf = load_hook_config(args.config)
        if conf.slurm_conf:
            os.environ["SLURM_CONF"] = conf.slurm_conf
        if args.mode == "timeout":
            return timeout_main(args.timed_out_mode or "prolog", conf, env)
        return hook_main(args.mode, conf, env)
    except (SlurmAgentError, OSError) as exc:
        # a broken installation must not drain every node of the cluster: report, pass
        print(f"slurmagent hook {args.mode}: {exc}", file=sys.stderr)
        return 0


if __name__ == "__main__":
    sys.exit(main())
