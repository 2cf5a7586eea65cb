"""A submission that never orphans jobs, on the real test cluster (which enforces
association limits: AccountingStorageEnforce=associations,limits): a per-user MaxSubmitJobs
set with sacctmgr, and slurmctld stopped between two arrays of one sweep."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_SCRIPT = ROOT / "tests" / "cluster" / "slurm-cluster"
QUICK = (
    "+experiment=synthetic",
    "cluster=slurm",
    "synthetic.step_time_s=0.02",
    "hydra.launcher.poll_interval_s=0.5",
    "hydra.launcher.max_poll_interval_s=2",
)


def cli(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurmagent", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env=env or dict(os.environ),
    )


def user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def set_submit_limit(limit: int) -> None:
    """sacctmgr's MaxSubmitJobs on this user's association (-1: none)."""
    subprocess.run(
        ["sacctmgr", "-i", "modify", "user", user(), "set", f"MaxSubmitJobs={limit}"],
        check=True,
        capture_output=True,
        text=True,
    )


def queued() -> int:
    out = subprocess.run(["squeue", "-h", "-r", "-u", user(), "-o", "%i"], capture_output=True, text=True).stdout
    return len(out.split())


def test_a_sweep_three_times_the_submit_limit_completes_within_it(slurm_conf: str, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    seen: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.25):
            seen.append(queued())

    set_submit_limit(3)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        proc = cli([*QUICK, "-m", "synthetic.steps=2,3,4,5,6,7,8,9,10", f"hydra.sweep.dir={sweep}"], tmp_path)
    finally:
        done.set()
        sampler.join()
        set_submit_limit(-1)
    assert proc.returncode == 0, proc.stderr
    # what fits beside the user's jobs already queued (3 when there are none), the rest wait
    first = re.search(r"(\d+) task\(s\) submitted to slurm", proc.stderr)
    assert first is not None and int(first[1]) <= 3, proc.stderr
    assert f"{9 - int(first[1])} task(s) wait: Slurm's submit limit (3 jobs per user) is reached" in proc.stderr
    state = json.loads((sweep / "sweep.json").read_text())
    assert [t["state"] for t in state["tasks"]] == ["COMPLETED"] * 9
    assert seen and max(seen) <= 3, seen
    assert len(state["array_ids"]) >= 3 and all(i["state"] == "submitted" for i in state["submissions"])


SHIM = """#!{python}
# sbatch for this test: the second call first stops slurmctld (back after {down_s} s)
import pathlib, subprocess, sys, time, os
count = pathlib.Path({count!r})
n = int(count.read_text()) + 1 if count.exists() else 1
count.write_text(str(n))
if n == 2:
    with open({log!r}, "a") as log:
        subprocess.Popen([{python!r}, {cluster!r}, "restart-ctld", "{down_s}"], stdout=log, stderr=log,
                         start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True).stdout
        if "DOWN" in ping:
            break
        time.sleep(0.1)
os.execv({sbatch!r}, ["sbatch", *sys.argv[1:]])
"""


def test_slurmctld_down_between_two_arrays_loses_no_task(slurm_conf: str, tmp_path: Path) -> None:
    real = shutil.which("sbatch")
    assert real is not None
    shims = tmp_path / "bin"
    shims.mkdir()
    count, log = tmp_path / "sbatch-calls", tmp_path / "restart.log"
    shim = shims / "sbatch"
    shim.write_text(
        SHIM.format(
            python=sys.executable, down_s=8, count=str(count), log=str(log), cluster=str(CLUSTER_SCRIPT), sbatch=real
        )
    )
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}"}
    sweep = tmp_path / "sweep"
    proc = cli(
        [*QUICK, "-m", "synthetic.steps=2,3,4,5", "hydra.launcher.max_array_size=2", f"hydra.sweep.dir={sweep}"],
        tmp_path,
        env,
    )
    assert proc.returncode == 0, proc.stderr + log.read_text()
    assert "slurmctld restarted after 8s down" in log.read_text()
    assert int(count.read_text()) >= 3  # the second array's sbatch failed while slurmctld was down, then again
    state = json.loads((sweep / "sweep.json").read_text())
    assert [t["state"] for t in state["tasks"]] == ["COMPLETED"] * 4
    assert len(state["array_ids"]) == 2 and [i["state"] for i in state["submissions"]] == ["submitted"] * 2
    assert "4 task(s) submitted to slurm as 2 array(s)" in proc.stderr
