"""The fault-injection table on the real test cluster, one test per row of
tests/slurm/fault_cases.py (bench/fault_table.py prints the same rows as a table).

Every fault is real: a high-priority job preempts, the kernel's cgroup OOM killer kills, a
node's slurmd is stopped and its job processes killed, slurmctld is restarted, the launcher
is SIGKILLed, a checkpoint file is truncated, a tmpfs fills up, a file is missing, a
program raises. The rows run at the same time (each its own sweep, the node-wide faults on
nodes of their own; the slurmctld restart first, on its own), once per module: a test
selected with -k runs only its own row.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_cases import CASES, CLUSTER_SCRIPT, CaseResult, FaultCase, run_table, table

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def results(
    slurm_conf: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[dict[str, CaseResult]]:
    selected = {
        item.callspec.params["case"].name
        for item in request.session.items
        if item.module is request.module and hasattr(item, "callspec")
    }
    cases = [c for c in CASES if c.name in selected]
    out = run_table(cases, Path(tmp_path_factory.mktemp("faults")))
    print("\n" + table(out))  # shown with -s, and in the captured output of a failure
    yield {r.name: r for r in out}
    # leave the cluster as found for the modules after this one: every node back and idle
    subprocess.run([sys.executable, str(CLUSTER_SCRIPT), "up"], capture_output=True, timeout=300, check=True)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fault_row(case: FaultCase, results: dict[str, CaseResult]) -> None:
    res = results[case.name]
    assert not res.problems, f"{case.fault}:\n" + "\n".join(res.problems) + f"\nnotes: {res.notes}"
    assert [t["state"] for t in res.tasks] == [case.expect.state] * len(res.tasks)
    if case.expect.recoverable:
        assert res.bit_identical is True
