"""`slurmagent dashboard`: a sweep's report served live on loopback, as a user runs it — a sweep
on the local backend from a directory outside the checkout, the dashboard started beside it,
the page opened in a real headless Chromium twice: the running task's progress has moved."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import browser_dom

pytestmark = pytest.mark.browser


def test_the_dashboard_shows_a_running_tasks_progress_changing(home: Path, tmp_path: Path) -> None:
    launch = [sys.executable, "-m", "slurmagent", "-m", "cluster=local", "synthetic.steps=120"]
    launch += ["synthetic.step_time_s=0.25"]
    log = tmp_path / "launcher.log"
    with open(log, "w") as out:
        launcher = subprocess.Popen(launch, cwd=home, stdout=out, stderr=subprocess.STDOUT, text=True)
    dashboard = None
    try:
        deadline = time.monotonic() + 120
        while not (sweeps := [p for p in home.glob("multirun/*/*") if (p / "0" / "progress.json").is_file()]):
            assert time.monotonic() < deadline, "the sweep did not start"
            time.sleep(0.3)
        (sweep,) = sweeps
        argv = [sys.executable, "-m", "slurmagent", "dashboard", str(sweep), "--port", "0", "--every", "2"]
        dashboard = subprocess.Popen(argv, cwd=home, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert dashboard.stdout is not None
        first = dashboard.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", first)
        assert url, first
        tunnel = dashboard.stdout.readline()
        assert re.search(r"ssh -N -L (\d+):127\.0\.0\.1:\1 \S+@\S+", tunnel), tunnel

        def task_row() -> str:
            dom = browser_dom(url.group(0), tmp_path, budget_ms=None)  # the first load: it reloads itself
            row = re.search(r'<tr id="task-0">(.*?)</tr>', dom)
            assert row, dom[-2000:]
            return row.group(1)

        before = task_row()
        time.sleep(3)
        after = task_row()
        step = [int(re.search(r"step (\d+)/120", r).group(1)) for r in (before, after)]  # type: ignore[union-attr]
        assert "RUNNING" in before and step[1] > step[0], (before, after)
        with urllib.request.urlopen(url.group(0) + "sweep.json") as answer:
            pytest.fail(f"the dashboard served a file other than the report's: {answer.status}")
    except urllib.error.HTTPError as refused:
        assert refused.code == 404
    finally:
        if dashboard is not None:
            dashboard.terminate()  # by its pid: the process this test started
            dashboard.wait(timeout=30)
            assert dashboard.stdout is not None
            dashboard.stdout.close()
        launcher.wait(timeout=180)
    assert launcher.returncode == 0, log.read_text()
