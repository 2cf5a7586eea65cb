"""A sweep's code snapshot (`code.snapshot`; issue 20): what is copied (a git work tree's tracked
and untracked-but-not-ignored files; elsewhere the launcher's directory), what never is
(ignored files, Hydra's output folders, the sweep itself), a cap refused before anything is
written, and a local sweep with the snapshot on importing the user's module from the copy.
The real cluster proves a requeued task runs the code as submitted (tests/slurm/test_env_slurm.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slurmagent.config import CodeConf, code_conf
from slurmagent.errors import ConfigError
from slurmagent.launch.snapshot import plan_snapshot, wanted, write_snapshot
from slurmagent.primitives.backends import LocalBackend, SlurmBackend
from slurmagent.primitives.code import files_dir, read_snapshot


def git(root: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
        check=True,
        capture_output=True,
    )


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    if shutil.which("git") is None:
        pytest.fail("git is needed (tests/run installs it, as the clone that runs the tests had it)")
    root = tmp_path / "project"
    (root / "src").mkdir(parents=True)
    (root / "src" / "train.py").write_text("X = 1\n")
    (root / "README.md").write_text("hello\n")
    (root / ".gitignore").write_text("data/\n*.ckpt\n")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "first")
    (root / "src" / "new.py").write_text("Y = 2\n")  # untracked, not ignored: copied
    (root / "data").mkdir()
    (root / "data" / "big.bin").write_bytes(b"x" * 1000)  # ignored: left out
    (root / "model.ckpt").write_bytes(b"x")
    (root / "multirun" / "old").mkdir(parents=True)
    (root / "multirun" / "old" / "result.txt").write_text("an earlier sweep's output\n")
    return root


def test_a_git_work_tree_is_copied_as_git_sees_it(project: Path) -> None:
    sweep = project / "multirun" / "now"
    plan = plan_snapshot(project / "src", sweep, CodeConf())
    assert plan.root == project.resolve() and plan.subdir == "src"
    assert sorted(plan.files) == [".gitignore", "README.md", "src/new.py", "src/train.py"]
    assert plan.commit is not None and len(plan.commit) == 40 and plan.dirty
    snap = write_snapshot(plan, sweep)
    assert read_snapshot(sweep) == snap and snap.files == 4
    assert (files_dir(sweep) / "src" / "train.py").read_text() == "X = 1\n"
    assert "+ uncommitted changes" in snap.describe()


def test_outside_a_repository_the_directory_is_copied_without_hidden_folders(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").write_text("")
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "__pycache__" / "m.pyc").write_text("")
    (tmp_path / "outputs" / "x").mkdir(parents=True)
    (tmp_path / "outputs" / "x" / "log").write_text("")
    sweep = tmp_path / "sweeps" / "s1"
    (sweep / "0").mkdir(parents=True)
    (sweep / "0" / "metrics.jsonl").write_text("")
    plan = plan_snapshot(tmp_path, sweep, CodeConf())
    assert plan.files == ["pkg/m.py"] and plan.commit is None and not plan.dirty


def test_a_snapshot_over_the_cap_is_refused_naming_the_key_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"x" * 3_000_000)
    sweep = tmp_path / "sweep"
    with pytest.raises(ConfigError) as err:
        plan_snapshot(tmp_path, sweep, CodeConf(max_mb=1))
    text = str(err.value)
    assert "more than 1 MB (code.max_mb)" in text and "weights.bin" in text and "nothing was submitted" in text
    assert not sweep.exists()


def test_bad_code_settings_are_refused() -> None:
    with pytest.raises(ConfigError) as err:
        code_conf({"snapshot": "always"})
    assert "code.snapshot='always' is not one of auto, off, on" in str(err.value)
    with pytest.raises(ConfigError) as err:
        code_conf({"max_mb": 0})
    assert "code.max_mb=0" in str(err.value)
    slurm, local = SlurmBackend(), LocalBackend()
    assert wanted(CodeConf(), slurm) and not wanted(CodeConf(), local) and wanted(CodeConf("on"), local)


def test_a_local_sweep_with_the_snapshot_on_imports_the_users_module_from_the_copy(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text("def run(cfg):\n    return {'file': __file__}\n")
    sweep = tmp_path / "sweep"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurmagent",
            "cluster=local",
            "task.target=mine:run",
            "code.snapshot=on",
            f"hydra.sweep.dir={sweep}",
            "-m",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr
    assert f"code: a snapshot of {tmp_path.resolve()} (1 files" in out.stderr, out.stderr
    status = subprocess.run(
        [sys.executable, "-m", "slurmagent", "status", str(sweep), "--json"], capture_output=True, text=True
    )
    body = json.loads(status.stdout)
    assert body["code"]["files"] == 1
    (task,) = body["tasks"]
    assert task["result"]["file"] == str(files_dir(sweep) / "mine.py")
