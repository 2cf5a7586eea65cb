"""The runtime's signal path on the real cluster: USR2 (the time-limit warning) → checkpoint
at the next step boundary → `scontrol requeue` of the array task → resume, same result. (At
the time limit's warning with seconds of work left the run finishes instead:
tests/slurm/test_default_paths_slurm.py.)"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
from fault_cases import sweep_argv

from tests.conftest import audit_records, chain_digest

pytestmark = pytest.mark.slurm

STEPS = 120


def test_usr2_checkpoints_requeues_and_resumes(slurm_conf: str, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    launcher = subprocess.Popen(
        sweep_argv(
            sweep,
            "+experiment=synthetic",
            f"synthetic.steps={STEPS}",
            "synthetic.step_time_s=0.1",
            "checkpoint.every_steps=1000",
        ),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: set[str] = set()  # every state the sweep showed the task in, while it ran
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.2):
            with contextlib.suppress(OSError, ValueError, IndexError):
                seen.add(json.loads((sweep / "sweep.json").read_text())["tasks"][0]["state"])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        deadline = time.monotonic() + 60
        job_id = None
        while time.monotonic() < deadline:
            attempts = (
                json.loads((sweep / "sweep.json").read_text())["tasks"][0]["attempts"]
                if (sweep / "sweep.json").exists()
                else []
            )
            if attempts:
                job_id = attempts[0]["job_id"]
                log = sweep / ".submitit" / f"{job_id}_0_log.out"
                if log.exists() and "Starting with" in log.read_text():
                    break
            time.sleep(0.3)
        assert job_id is not None
        time.sleep(3)  # some steps run
        subprocess.run(["scancel", "--signal=USR2", job_id], check=True)
        _, err = launcher.communicate(timeout=240)
    finally:
        launcher.kill()
        stop.set()
        sampler.join()
    assert launcher.returncode == 0, err
    assert seen <= {"WAITING", "PENDING", "RUNNING", "REQUEUED", "COMPLETED"}, seen  # never shown as failed
    task = json.loads((sweep / "sweep.json").read_text())["tasks"][0]
    result = task["result"]
    assert result["digest"] == chain_digest(STEPS)  # same as a run that never stopped
    assert result["attempt"] == 2 and 0 < result["resumed_from"] < STEPS
    # only the steps after the signal checkpoint ran in the second attempt: nothing redone
    assert result["steps_run_here"] == STEPS - result["resumed_from"]
    deadline = time.monotonic() + 30  # the result file comes before slurmdbd records the job's end
    while True:
        history = subprocess.run(
            ["sacct", "-X", "-n", "-P", "--duplicates", "-j", job_id, "-o", "State"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        if history[-1:] != ["RUNNING"] or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert history[-1] == "COMPLETED" and "REQUEUED" in history, history
    # the job's own requeue went through the action gate: decision and outcome, with evidence
    records = audit_records(sweep / "audit.jsonl")
    assert [(r["type"], r["action"]) for r in records] == [("decision", "requeue"), ("outcome", "requeue")]
    assert records[0]["decision"] == "allow" and records[1]["ok"]
    assert records[0]["context"]["source"] == "runtime" and records[0]["context"]["cause"] == "signal"
    texts = [e["text"] for e in records[0]["evidence"]]
    assert any("State=RUNNING" in t for t in texts) and any("SIGUSR2" in t for t in texts), texts
