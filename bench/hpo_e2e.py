"""End to end on the test cluster: a 40-trial search of digits_mlp with at most 6 trials at
once, one trial's job requeued by Slurm mid-run and the launcher killed once mid-study
(`slurmagent watch` finishes it); then every trial is accounted for, the epochs trained
twice are counted, and the best configuration is run again as a plain job and compared.

    SLURM_CONF=/var/tmp/slurmagent-cluster/etc/slurm.conf .venv/bin/python bench/hpo_e2e.py \
        [--trials 40] [--parallel 6] [--max-epochs 9] [--out bench/results/hpo_e2e.json]

Needs the test cluster (`python3 tests/cluster/slurm-cluster up`). Nothing here is timed
against a target; the wall time is reported for the record.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def state(sweep: Path) -> dict[str, Any]:
    try:
        return json.loads((sweep / "sweep.json").read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return {"tasks": []}


def squeue_state(job: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True)
    return out.stdout.strip()


def epochs(sweep: Path, index: int) -> list[int]:
    try:
        lines = (sweep / str(index) / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return []
    return [int(r["epoch"]) for r in map(json.loads, lines) if "epoch" in r]


def max_concurrent(job_ids: list[str]) -> int:
    """The most of these jobs running at one time, from sacct's start and end times."""
    if not job_ids:
        return 0
    out = subprocess.run(
        ["sacct", "-n", "-P", "-X", "-j", ",".join(job_ids), "-o", "JobID,Start,End"],
        capture_output=True,
        text=True,
    ).stdout
    events: list[tuple[float, int]] = []
    for line in out.splitlines():
        _, start, end = line.split("|")
        if start in ("Unknown", "None", "") or end in ("Unknown", "None", ""):
            continue
        t0 = time.mktime(time.strptime(start, "%Y-%m-%dT%H:%M:%S"))
        t1 = time.mktime(time.strptime(end, "%Y-%m-%dT%H:%M:%S"))
        events += [(t0, 1), (t1, -1)]
    running = peak = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):  # an end before a start at the same second
        running += delta
        peak = max(peak, running)
    return peak


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--parallel", type=int, default=6)
    ap.add_argument("--max-epochs", type=int, default=9)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "hpo_e2e.json")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hpo-e2e-", dir="/var/tmp"))
    sweep = work / "sweep"
    search = [
        "+experiment=digits_mlp",
        "cluster=slurm",
        "hydra/sweeper=slurmagent_hpo",
        "hydra.launcher.poll_interval_s=1",
        "hydra.launcher.max_poll_interval_s=2",
        "-m",
        "optim.lr=tag(log,interval(1e-4,1))",
        "model.width=choice(32,64,128,256)",
        "hpo.objective=val_error",
        f"hpo.budget.trials={args.trials}",
        f"hpo.max_parallel={args.parallel}",
        f"hpo.fidelity.max={args.max_epochs}",
        "train.step_delay_s=0.02",  # an epoch lasts ~0.5 s more: a requeue lands mid-run
        f"hydra.sweep.dir={sweep}",
    ]
    t0 = time.monotonic()
    launcher = subprocess.Popen(
        [PY, "-m", "slurmagent", *search],
        cwd=work,
        stdout=open(work / "launcher.out", "w"),  # noqa: SIM115 - the child owns it
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    # 1. requeue a running trial's job (what Slurm does to a preempted job with PreemptMode=REQUEUE)
    requeued = ""
    deadline = time.monotonic() + 600
    while not requeued and time.monotonic() < deadline:
        for t in state(sweep)["tasks"]:
            if t["index"] >= 3 and t["attempts"] and squeue_state(t["attempts"][-1]["job_id"]) == "RUNNING":
                time.sleep(1.0)
                job = t["attempts"][-1]["job_id"]
                if subprocess.run(["scontrol", "requeue", job], capture_output=True).returncode == 0:
                    requeued = f"trial {t['index']} (job {job})"
                break
        time.sleep(0.3)
    # 2. kill the launcher once a third of the trials exist
    while len(state(sweep)["tasks"]) < args.trials // 3 and time.monotonic() < deadline:
        time.sleep(0.5)
    os.killpg(launcher.pid, signal.SIGKILL)
    launcher.wait()
    killed_at = len(state(sweep)["tasks"])
    time.sleep(2)
    watch = subprocess.run(
        [PY, "-m", "slurmagent", "watch", str(sweep), "--interval", "1", "--timeout", "3600"],
        capture_output=True,
        text=True,
    )
    wall = time.monotonic() - t0
    trials = json.loads((sweep / "hpo" / "trials.json").read_text())
    best = json.loads((sweep / "hpo" / "best.json").read_text())
    tasks = {t["index"]: t for t in state(sweep)["tasks"]}
    states: dict[str, int] = {}
    for row in trials["trials"]:
        states[row["state"]] = states.get(row["state"], 0) + 1
    failed_without_cause = [r["trial"] for r in trials["trials"] if r["state"] == "failed" and not r["reason"]]
    redone, trained, from_scratch = 0, 0, []
    for row in trials["trials"]:
        seen = epochs(sweep, row["trial"])
        trained += len(seen)
        redone += len(seen) - len(set(seen))
        if seen.count(1) > 1:
            from_scratch.append(row["trial"])
    job_ids = sorted({a["job_id"] for t in tasks.values() for a in t["attempts"]})
    # 3. the best configuration, run again as one plain job (same seed), to the same epochs
    rerun_dir = work / "rerun"
    cmd = shlex.split(best["reproduce"])[3:]  # after "python -m slurmagent"
    assert "cluster=slurm" in cmd and cmd[-1] == "-m", cmd  # a one-task sweep on the cluster
    cmd = [c for c in cmd if not c.startswith("train.epochs=")] + [f"train.epochs={best['epochs']}"]
    rerun = subprocess.run(
        [PY, "-m", "slurmagent", *cmd, f"hydra.sweep.dir={rerun_dir}"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    again = [
        json.loads(line) for line in (rerun_dir / "0" / "metrics.jsonl").read_text().splitlines() if '"epoch"' in line
    ]
    rerun_value = next(r["val_error"] for r in reversed(again) if int(r["epoch"]) == best["epochs"])
    result = {
        "trials": len(trials["trials"]),
        "states": states,
        "failed_without_cause": failed_without_cause,
        "epochs_asked": trials["spent_epochs"],
        "epoch_lines": trained,
        "epochs_redone": redone,
        "trials_begun_twice_from_scratch": from_scratch,
        "jobs": len(job_ids),
        "max_concurrent_jobs": max_concurrent(job_ids),
        "requeued": requeued,
        "launcher_killed_after_trials": killed_at,
        "watch_exit": watch.returncode,
        "wall_s": round(wall, 1),
        "best": {k: best[k] for k in ("trial", "params", "epochs", "value")},
        "rerun_exit": rerun.returncode,
        "rerun_value": rerun_value,
        "rerun_identical": rerun_value == best["value"],
        "sweep": str(sweep),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    ok = (
        watch.returncode == 0
        and not failed_without_cause
        and not from_scratch
        and result["rerun_identical"]
        and result["max_concurrent_jobs"] <= args.parallel
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
