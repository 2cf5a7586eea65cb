"""Shared fixtures: the real test cluster, hostile paths, the project root.

`slurm` tests need the private Slurm cluster that tests/cluster/slurm-cluster starts.
Outside CI they skip with one line when it cannot come up; under CI=true a skipped
`slurm` test fails the run, so a green CI means they really ran against Slurm.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CLUSTER_SCRIPT = ROOT / "tests" / "cluster" / "slurm-cluster"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def project_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def slurm_conf() -> Iterator[str]:
    """Bring the test cluster up (or find it up) and point Slurm commands at it."""
    proc = subprocess.run([sys.executable, str(CLUSTER_SCRIPT), "up"], capture_output=True, text=True, timeout=300)
    conf = next((ln.split("=", 1)[1] for ln in proc.stdout.splitlines() if ln.startswith("SLURM_CONF=")), None)
    if proc.returncode != 0 or conf is None:
        reason = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        if IN_CI:
            pytest.fail(f"test cluster did not come up under CI: {reason}")
        pytest.skip(f"no test cluster: {reason}")
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    yield conf
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old


@pytest.fixture(autouse=True)
def _only_slurm_tests_see_the_cluster(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test not marked `slurm` runs as on a laptop: it never submits to the shared test
    cluster, where its jobs would change the cluster tests' accounting and nodes."""
    if request.node.get_closest_marker("slurm") is None:
        monkeypatch.delenv("SLURM_CONF", raising=False)


@pytest.fixture()
def no_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hide the test cluster: Slurm commands then find no config and fail, as on a laptop."""
    monkeypatch.delenv("SLURM_CONF", raising=False)


@pytest.fixture()
def weird_tmp_path(tmp_path: Path) -> Path:
    """A directory whose name is hostile to shells: spaces, quotes, $(…), backticks, ;."""
    weird = tmp_path / "we ird'\"$(touch PWNED)`id`;x"
    weird.mkdir()
    return weird


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """Under CI=true a skipped `slurm` test is a failure: the cluster must really be there."""
    del call
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    needs = [m for m in ("slurm", "browser") if item.get_closest_marker(m) is not None]
    if IN_CI and report.skipped and needs:
        report.outcome = "failed"
        report.longrepr = f"{needs[0]} test skipped under CI=true, which is not allowed: {report.longrepr}"
