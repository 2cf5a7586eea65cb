"""The health Prolog/Epilog on the real test cluster: a GPU check forced CRITICAL on one
emulated node drains it with our reason; Slurm requeues the job onto a healthy node, where
it completes; the Epilog records the post-job state there.

The emulated nodes have no NVIDIA GPU (this machine has none), so the administrator's
hooks.json points node t4-1 at recorded readings of a broken GPU (tests/data/gpu_health/
broken.json, GPU 0: uncorrected ECC errors and a failed row remap) in place of NVML; every
other node reads NVML, finds none, and reports UNKNOWN, which does not drain. Everything
else is real: slurmd runs our hook as root, scontrol drains, Slurm requeues.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CLUSTER_SCRIPT, IN_CI

pytestmark = pytest.mark.slurm

BAD_NODE = "t4-1"
HOOKS = Path(__file__).resolve().parents[2] / "sbatch_templates" / "hooks"
DATA = Path(__file__).resolve().parents[1] / "data" / "gpu_health"


def slurm(*argv: str) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True, check=True, timeout=30).stdout


def node_state(node: str) -> tuple[str, str]:
    state, _, reason = slurm("sinfo", "-h", "-N", "-n", node, "-o", "%T|%E").splitlines()[0].partition("|")
    return state.strip(), reason.strip()


def occupy_other_t4(tmp_path: Path, seconds: int = 6) -> None:
    """Keep t4-2's GPUs busy for a few seconds, so the job under test starts on t4-1; the
    requeue holds it back longer than that (cred_expire), so t4-2 is free again by then."""
    blocker = tmp_path / "blocker.py"
    blocker.write_text(f"#!/usr/bin/python3\nimport time\ntime.sleep({seconds})\n")
    blocker.chmod(0o755)
    slurm("sbatch", "-p", "gpu", "-w", "t4-2", "--gres=gpu:t4:2", "-o", "/dev/null", str(blocker))


@pytest.fixture()
def hooks_installed(slurm_conf: str, tmp_path: Path) -> Iterator[Path]:
    """The hooks as an administrator installs them: root-owned copies with hooks.json beside."""
    if os.geteuid() != 0:  # CI runs as root (tests/run): there, not being root is a broken set-up
        if IN_CI:
            pytest.fail("the prolog tests install hooks as root, and CI=true runs as another user")
        pytest.skip("slurmd runs hooks as root; the test installs them as root")
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    shutil.copy2(HOOKS / "slurmagent-hook", hooks / "slurmagent-hook")
    for mode in ("prolog", "epilog"):
        (hooks / f"slurmagent-{mode}").symlink_to("slurmagent-hook")
    broken_gpu = json.loads((DATA / "broken.json").read_text())["gpus"][0]
    readings = tmp_path / "t4-1-readings.json"
    readings.write_text(json.dumps([dict(broken_gpu, index=i) for i in range(2)]))  # both of t4-1's GPUs
    state = tmp_path / "state"
    conf = {
        "python": sys.executable,
        "timeout_s": 45,
        "state_dir": str(state),
        "slurm_conf": slurm_conf,
        "readings": {BAD_NODE: str(readings)},
    }
    (hooks / "hooks.json").write_text(json.dumps(conf))
    for p in (tmp_path, hooks):
        p.chmod(0o755)
    subprocess.run(
        [
            sys.executable,
            str(CLUSTER_SCRIPT),
            "prolog",
            str(hooks / "slurmagent-prolog"),
            str(hooks / "slurmagent-epilog"),
        ],
        check=True,
        timeout=60,
    )
    try:
        yield state
    finally:
        subprocess.run([sys.executable, str(CLUSTER_SCRIPT), "prolog", "none"], check=False, timeout=60)
        _, reason = node_state(BAD_NODE)
        if reason.startswith("slurmagent:"):
            subprocess.run(["scontrol", "update", f"nodename={BAD_NODE}", "state=resume"], check=False, timeout=30)


def runs_until_done(job: str, timeout: float = 120) -> list[list[str]]:
    """[state, node list] of each run of `job` (sacct --duplicates), once the last one ended."""
    deadline = time.monotonic() + timeout
    rows: list[list[str]] = []
    while time.monotonic() < deadline:
        acct = slurm("sacct", "-n", "-X", "-D", "--parsable2", "-j", job, "-o", "State,NodeList")
        rows = [ln.split("|") for ln in acct.splitlines() if ln]
        if rows and rows[-1][0] in ("COMPLETED", "FAILED", "CANCELLED"):
            break
        time.sleep(1)
    return rows


def test_critical_prolog_drains_node_and_job_completes_elsewhere(hooks_installed: Path, tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text("#!/usr/bin/python3\nimport os\nprint('ran on', os.environ['SLURMD_NODENAME'])\n")
    script.chmod(0o755)
    occupy_other_t4(tmp_path)
    out = slurm(
        "sbatch",
        "--parsable",
        "-p",
        "gpu",
        "--gres=gpu:t4:1",
        "-J",
        "prolog-test",
        "-o",
        str(tmp_path / "job.out"),
        str(script),
    )
    job = out.strip().split(";")[0]
    rows = runs_until_done(job)
    # first run: allocated the bad node, Prolog failed, Slurm requeued; last run: completed elsewhere
    assert rows[0] == ["REQUEUED", BAD_NODE], rows
    assert rows[-1][0] == "COMPLETED" and rows[-1][1] != BAD_NODE, rows
    good = rows[-1][1]
    assert (tmp_path / "job.out").read_text().strip() == f"ran on {good}"
    state, reason = node_state(BAD_NODE)
    assert "drain" in state and reason.startswith("slurmagent: GPU 0: 3 volatile uncorrected ECC error(s)"), (
        state,
        reason,
    )
    prolog = json.loads((hooks_installed / BAD_NODE / f"prolog-{job}.json").read_text())
    assert prolog["status"] == "CRITICAL" and prolog["action"].startswith("drained: slurmagent:")
    assert prolog["findings"]["gpus"] == [0]  # SLURM_JOB_GPUS: the job's one GPU
    # the Epilog on the healthy node recorded the post-job state: no NVML here → UNKNOWN, not drained
    record = hooks_installed / good / f"epilog-{job}.json"
    deadline = time.monotonic() + 60
    while not record.exists() and time.monotonic() < deadline:  # the Epilog runs after the job ends
        time.sleep(0.5)
    epilog = json.loads(record.read_text())
    assert epilog["findings"]["mode"] == "epilog" and epilog["findings"]["job_id"] == job
    assert epilog["status"] == "UNKNOWN" and epilog["action"] == "none"
    assert any("NVML" in r for r in epilog["reasons"]), epilog["reasons"]
    assert node_state(good)[0].startswith(("idle", "mixed", "completing"))


JOB = """#!{python}
# A step loop with the runtime health check. No NVIDIA GPU here: recorded readings stand in
# for NVML -- a broken GPU on t4-1, a healthy one elsewhere.
import json, os, sys, time
from pathlib import Path
from slurmagent.config import CheckpointConf
from slurmagent.runtime import StepLoop, context_from_env
from slurmagent.config import HealthConf
from slurmagent.runtime.health import HealthMonitor
from slurmagent.runtime.loop import StopForRequeue
from slurmagent.job.stop import handle_stop

out = Path(sys.argv[1])
node = os.environ["SLURMD_NODENAME"]
readings = "{data}/broken.json" if node == "{bad}" else "{data}/healthy.json"
ctx = context_from_env(output_dir=out)
state = {{"n": 0}}

class S:
    def state_dict(self): return dict(state)
    def load_state_dict(self, s): state.update(s)

health = HealthMonitor(ctx, HealthConf(1.0, inputs={{"readings_file": readings, "gpus": [0]}}))
loop = StepLoop(ctx, S(), 30, CheckpointConf(every_steps=1000), health=health)
try:
    for step in loop:
        state["n"] += 1
        time.sleep(0.1)
except StopForRequeue as stop:
    handle_stop(ctx, stop)
    raise
(out / "done.json").write_text(json.dumps({{"node": node, "n": state["n"], "resumed_from": loop.restored_from}}))
"""


def test_runtime_health_critical_checkpoints_and_requeues_onto_another_node(slurm_conf: str, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(JOB.format(python=sys.executable, data=DATA, bad=BAD_NODE))
    script.chmod(0o755)
    out = tmp_path / "out"
    occupy_other_t4(tmp_path)
    job = (
        slurm(
            "sbatch",
            "--parsable",
            "-p",
            "gpu",
            "--gres=gpu:t4:1",  # lands on t4-1 (t4-2 busy); -w would pin it there for good
            "--requeue",
            "-o",
            str(tmp_path / "job-%j.out"),
            str(script),
            str(out),
        )
        .strip()
        .split(";")[0]
    )
    rows = runs_until_done(job)
    assert rows[0] == ["REQUEUED", BAD_NODE] and rows[-1][0] == "COMPLETED" and rows[-1][1] != BAD_NODE, rows
    stop = json.loads((out / "health_stop.json").read_text())
    assert stop["node"] == BAD_NODE and stop["status"] == "CRITICAL" and stop["requeued"] is True
    assert stop["excluded"] == BAD_NODE
    done = json.loads((out / "done.json").read_text())
    # resumed from the health checkpoint on the other node, and finished the 30 steps there
    assert done["node"] == rows[-1][1] and done["resumed_from"] == stop["step"] > 0 and done["n"] == 30
    assert BAD_NODE in slurm("scontrol", "show", "job", "-o", job)  # ExcNodeList kept
