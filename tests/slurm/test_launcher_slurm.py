"""The main job end to end on the real test cluster: sweeps as job arrays, results back,
bad specs refused before submission. (A killed launcher re-attached with `watch` is a row
of the fault table, tests/slurm/fault_cases.py.)"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from fault_cases import slurmagent_cli

pytestmark = pytest.mark.slurm


def cli(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return slurmagent_cli(args, cwd, timeout)


def job_count() -> int:
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-a", "-S", "now-1days", "-o", "JobIDRaw"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return len(out.split())


def status(sweep: Path, cwd: Path) -> dict:  # type: ignore[type-arg]
    proc = cli(["status", str(sweep), "--json"], cwd)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def test_digits_sweep_of_six_runs_as_one_array(slurm_conf: str, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc = cli(
        [
            "+experiment=digits_mlp",
            "-m",
            "optim.lr=1e-3,3e-3,1e-2",
            "model.width=64,128",
            f"hydra.sweep.dir={sweep}",
            "hydra.launcher.poll_interval_s=1",
            "hydra.launcher.max_poll_interval_s=3",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "6 task(s) submitted to slurm as 1 array(s)" in proc.stderr
    data = status(sweep, tmp_path)
    assert data["backend"] == "slurm" and data["counts"] == {"COMPLETED": 6}
    accs = [t["result"]["val_acc"] for t in data["tasks"]]
    assert all(0.8 < a <= 1.0 for a in accs), accs
    assert len({t["job_id"].split("_")[0] for t in data["tasks"]}) == 1
    assert "val_acc" in proc.stderr  # the final table shows each task's accuracy


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("resources.partition=nope", "resources.partition='nope' does not exist; valid partitions: gpu, high, low"),
        ("resources.gpu_type=h100", "resources.gpu_type='h100' is on no node of partition 'gpu'"),
    ],
)
def test_bad_spec_is_refused_before_anything_is_submitted(
    slurm_conf: str, tmp_path: Path, override: str, message: str
) -> None:
    sweep = tmp_path / "sweep"
    before = job_count()
    extra = ["resources.partition=gpu", "resources.gpus=1"] if "gpu_type" in override else []
    proc = cli(["-m", "synthetic.steps=1,2", *extra, override, f"hydra.sweep.dir={sweep}"], tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr and "nothing was submitted" in proc.stderr
    assert job_count() == before
    assert not (sweep / "sweep.json").exists()


def test_sweep_splits_into_fewest_arrays_and_throttles(slurm_conf: str, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc = cli(
        [
            "-m",
            "synthetic.steps=1,2,3,4,5",
            "hydra.launcher.max_array_size=2",
            "hydra.launcher.array_parallelism=1",
            f"hydra.sweep.dir={sweep}",
            "hydra.launcher.poll_interval_s=1",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    data = status(sweep, tmp_path)
    arrays = {t["job_id"].split("_")[0] for t in data["tasks"]}
    assert len(arrays) == 3  # 5 tasks at most 2 per array: 3 submissions
    texts = [p.read_text() for p in sorted((sweep / ".submitit").glob("*submission.sh"))]
    assert len(texts) == 3
    # two throttled arrays of 2; submitit sends the last chunk of one task as a plain job
    assert sum("--array=0-1%1" in t for t in texts) == 2
    assert all("--requeue" in t and "--open-mode=append" in t and "--signal=USR2@60" in t for t in texts)
    assert sorted(t["result"]["steps"] for t in data["tasks"]) == [1, 2, 3, 4, 5]
