"""pyslurm is an optional extra (`pip install slurmagent[pyslurm]`): it must match the
installed Slurm's major version. PyPI only has pyslurm 25.11 and the test machine runs
Slurm 22.05, so here this test skips; on a Slurm 25.11 site it checks the match."""

from __future__ import annotations

import shutil
import subprocess

import pytest


def test_pyslurm_matches_installed_slurm() -> None:
    pyslurm = pytest.importorskip(
        "pyslurm", reason="pyslurm not installed: PyPI has only 25.11, which cannot load against Slurm 22.05 here"
    )
    sinfo = shutil.which("sinfo")
    if sinfo is None:
        pytest.skip("no Slurm client installed to compare pyslurm's version with")
    slurm_version = subprocess.run([sinfo, "--version"], capture_output=True, text=True, check=True).stdout.split()[-1]
    assert pyslurm.__version__.split(".")[:2] == slurm_version.split(".")[:2]
