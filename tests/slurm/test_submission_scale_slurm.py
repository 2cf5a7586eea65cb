"""30,000 tasks on the real test cluster, the launcher killed mid-submission: right after the
sbatch of its 6th array, before it could record the job id. The sweep's state names every
job it had recorded; `status --refresh` (one poll, as the sweep's next supervisor makes)
finds the lost array by its marker and submits the rest. Jobs are held (--begin=now+1h):
nothing runs, everything is cancelled at the end."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from slurmagent.supervise.state import SweepStore

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TASKS = 30_000
SHIM = """#!{python}
# sbatch for this test: the {at}th call submits, then kills the launcher before it reads the job id
import os, pathlib, signal, subprocess, sys
count = pathlib.Path({count!r})
n = int(count.read_text()) + 1 if count.exists() else 1
count.write_text(str(n))
proc = subprocess.run([{sbatch!r}, *sys.argv[1:]], capture_output=True, text=True)
if n == {at}:
    pathlib.Path({lost!r}).write_text(proc.stdout)
    os.kill(os.getppid(), signal.SIGKILL)
sys.stdout.write(proc.stdout)
sys.stderr.write(proc.stderr)
sys.exit(proc.returncode)
"""


def user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def queue() -> dict[str, tuple[int, str]]:
    """This user's jobs: array (or job) id → (tasks queued, comment)."""
    out = subprocess.run(
        ["squeue", "-h", "-r", "-u", user(), "-o", "%F|%k"], capture_output=True, text=True, check=True
    ).stdout
    jobs: dict[str, tuple[int, str]] = {}
    for line in out.splitlines():
        own, _, comment = line.partition("|")
        jobs[own] = (jobs.get(own, (0, ""))[0] + 1, comment)
    return jobs


def test_a_launcher_killed_after_an_sbatch_of_a_30000_task_sweep_orphans_nothing(
    slurm_conf: str, tmp_path: Path
) -> None:
    real = subprocess.run(["which", "sbatch"], capture_output=True, text=True, check=True).stdout.strip()
    shims = tmp_path / "bin"
    shims.mkdir()
    count, lost_out = tmp_path / "sbatch-calls", tmp_path / "lost-sbatch-output"
    shim = shims / "sbatch"
    shim.write_text(SHIM.format(python=sys.executable, at=6, count=str(count), lost=str(lost_out), sbatch=real))
    shim.chmod(0o755)
    sweep = tmp_path / "sweep"
    before = set(queue())
    argv = [
        sys.executable,
        "-m",
        "slurmagent",
        "-m",
        f"+bench.i=range(0,{TASKS})",
        "synthetic.steps=1",
        "resources.partition=low",
        "resources.mem=1G",
        "resources.time=00:30:00",
        "+resources.extra.begin=now+3600",
        "cluster=slurm",
        f"hydra.sweep.dir={sweep}",
    ]
    env = {**os.environ, "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}"}
    try:
        proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
        lost_id = lost_out.read_text().strip().split(";")[0]
        left = SweepStore(sweep).load()
        (lost,) = [i for i in left.submissions if i["state"] == "submitting"]
        assert lost_id not in left.array_ids and len(left.array_ids) == 5
        assert not any(left.tasks[i].attempts for i in lost["tasks"])
        assert queue()[lost_id][1] == lost["marker"]  # in Slurm, known only by its marker

        refresh = subprocess.run(
            [sys.executable, "-m", "slurmagent", "status", str(sweep), "--refresh"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert refresh.returncode == 0, refresh.stderr[-3000:]
        state = SweepStore(sweep).load()
        mine = {own: n for own, (n, _) in queue().items() if own not in before}
        assert set(mine) == set(state.array_ids) and lost_id in mine  # every array the sweep's, none twice
        assert sum(mine.values()) == TASKS and len(mine) == -(-TASKS // 1001)
        assert all(len(t.attempts) == 1 for t in state.tasks)
        assert len({t.job_id for t in state.tasks}) == TASKS
        assert [i["state"] for i in state.submissions] == ["submitted"] * len(mine)
    finally:
        ours = sorted(set(queue()) - before)
        if ours:
            subprocess.run(["scancel", *ours], capture_output=True, text=True, check=False)
