"""The default-path set: run as a user runs, on the real cluster. From a fresh directory that is
not the checkout, no `hydra.sweep.dir` (Hydra's `multirun/${now:…}`), no `checkpoint.dir`, no
`cluster=` (the default `auto` finds Slurm), the README's commands and the user's own module:
(a) a grid task preempted with `scontrol requeue`, (b) a search trial requeued mid-rung, (c) a
detached sweep whose task is requeued, (d) a task that crashes and one whose process is killed
with SIGKILL, (e) the README's `auto` sweep, `slurmagent plan`, and the sweep again. Each ends as
a user expects: resumed bit-identically, the user's exception named in `status` and `doctor
SWEEP`, or the second sweep sized from the first's runs as `plan` said it would be; (f) a
task given the time limit's warning with seconds of work left finishes instead of requeueing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fault_cases import wait_for

from slurmagent.syntax import mem_to_mb, seconds_to_slurm_time
from tests.conftest import audit_records, chain_digest, jobs_from

pytestmark = pytest.mark.slurm

POLL = ("hydra.launcher.poll_interval_s=1", "hydra.launcher.max_poll_interval_s=2")


def user_env() -> dict[str, str]:
    return dict(os.environ)  # SLURM_CONF points at the test cluster: cluster=auto finds Slurm


def start(home: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "slurmagent", *args],
        cwd=home,
        env=user_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def cli(
    home: Path, *args: str, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurmagent", *args],
        cwd=home,
        env=env or user_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def the_sweep(home: Path) -> Path:
    """The sweep Hydra's default sweep dir made under `home`."""

    def found() -> Path | None:
        sweeps = [p for p in home.glob("multirun/*/*") if (p / "sweep.json").is_file()]
        return sweeps[0] if len(sweeps) == 1 else None

    return wait_for(found, "the sweep under multirun/", 120)  # type: ignore[no-any-return]


def state(sweep: Path) -> dict[str, Any]:
    try:
        return json.loads((sweep / "sweep.json").read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return {"tasks": []}


def running_job(sweep: Path, task: int, min_lines: int = 3) -> str:
    """The job of `task` once it runs and has reported `min_lines` metrics lines."""

    def ready() -> str | None:
        tasks = state(sweep)["tasks"]
        if len(tasks) <= task or not tasks[task]["attempts"]:
            return None
        metrics = sweep / str(task) / "metrics.jsonl"
        lines = len(metrics.read_text().splitlines()) if metrics.exists() else 0
        return str(tasks[task]["attempts"][-1]["job_id"]) if lines >= min_lines else None

    return wait_for(ready, f"task {task} running", 180)  # type: ignore[no-any-return]


def requeue(job: str) -> None:
    subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True, text=True, timeout=60)


def finish(proc: subprocess.Popen[str], timeout: float = 420) -> tuple[int, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return proc.returncode, out + err


def test_a_preempted_grid_task_resumes_bit_identically(home: Path, tmp_path: Path) -> None:
    """(a) The README's digits sweep; task 0 requeued mid-run. Was: the requeued run failed on
    `${now:…}` (UnsupportedInterpolationType) — every cluster test passed hydra.sweep.dir."""
    args = ("+experiment=digits_mlp", "-m", "optim.lr=1e-3,1e-2", "train.step_delay_s=0.05", *POLL)
    launcher = start(home, *args)
    sweep = the_sweep(home)
    requeue(running_job(sweep, 0, min_lines=60))
    code, out = finish(launcher)
    assert code == 0, out
    tasks = state(sweep)["tasks"]
    assert all(t["state"] == "COMPLETED" for t in tasks), tasks
    resumed = tasks[0]["result"]
    assert tasks[0]["attempts"][0]["restarts"] >= 1 and resumed["resumed_from"], tasks[0]
    # the same task uninterrupted, on this machine: the same weights, bit for bit
    ref_home = tmp_path / "reference"
    ref_home.mkdir()
    ref = cli(ref_home, "+experiment=digits_mlp", "-m", "optim.lr=1e-3", "cluster=local", *POLL)
    assert ref.returncode == 0, ref.stderr
    (reference,) = state(the_sweep(ref_home))["tasks"]
    assert resumed["state_hash"] == reference["result"]["state_hash"], (resumed, reference["result"])
    assert resumed["val_acc"] == reference["result"]["val_acc"]


def test_a_search_trial_requeued_mid_rung_resumes_exactly(home: Path) -> None:
    """(b) A search under the default sweep dir and the default rungs (a full training of 27
    epochs, the lowest rung a tenth of it); its first trial's job requeued mid-rung."""
    launcher = start(
        home,
        "+experiment=synthetic",
        "hydra/sweeper=slurmagent_hpo",
        "-m",
        "synthetic.x=interval(0,1)",
        "hpo.fidelity.key=synthetic.epochs",
        "synthetic.steps_per_epoch=3",
        "synthetic.step_time_s=0.3",
        "hpo.budget.trials=3",
        "hpo.max_parallel=3",
        *POLL,
    )
    sweep = the_sweep(home)
    job = running_job(sweep, 0, min_lines=2)  # inside the first rung (2 epochs: 6 steps of 0.3 s)
    requeue(job)
    code, out = finish(launcher)
    assert code == 0, out
    body = json.loads((sweep / "hpo" / "trials.json").read_text())
    assert body["rungs"] == [2, 6, 18, 27], body["rungs"]  # hpo.fidelity.min unset: a tenth of 27, rounded down
    trials = body["trials"]
    (task0,) = [t for t in state(sweep)["tasks"] if t["index"] == 0]
    assert task0["attempts"][0]["restarts"] >= 1, task0  # really requeued, and not counted as a new attempt
    for trial in trials:
        lines = (sweep / str(trial["trial"]) / "metrics.jsonl").read_text().splitlines()
        epochs = [int(r["epoch"]) for r in map(json.loads, lines) if "epoch" in r]
        assert epochs == list(range(1, trial["epochs"] + 1)), (trial, epochs)  # each epoch once
    result = task0["result"]
    assert result["digest"] == chain_digest(result["epoch"] * 3), result  # every step exactly once


def test_a_detached_sweeps_requeued_task_resumes_and_the_sweep_finishes(home: Path) -> None:
    """(c) `--detach` with the default supervisor (a Slurm job); a task requeued mid-run."""
    out = cli(home, "+experiment=synthetic", "-m", "synthetic.steps=60,40", "synthetic.step_time_s=0.2",
              "checkpoint.every_steps=10", "--detach")  # fmt: skip
    assert out.returncode == 0, out.stderr
    sweep = the_sweep(home)
    requeue(running_job(sweep, 0, min_lines=5))
    wait_for(lambda: state(sweep).get("finished_at"), "the detached supervisor to finish the sweep", 300, 1)
    tasks = state(sweep)["tasks"]
    assert [t["state"] for t in tasks] == ["COMPLETED", "COMPLETED"], tasks
    assert tasks[0]["attempts"][0]["restarts"] >= 1 and tasks[0]["result"]["resumed_from"], tasks[0]
    assert [t["result"]["digest"] for t in tasks] == [chain_digest(60), chain_digest(40)]


CRASHING = """
from slurmagent.runtime import StepLoop, current


class State:
    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def train(cfg):
    loop = StepLoop(current(), State(), total_steps=20)
    for step in loop:
        if step == 5:
            raise RuntimeError("boom at step 5")
        loop.report(loss=1.0 / (step + 1))
"""


def test_a_crash_is_named_in_the_users_words(home: Path) -> None:
    """(d) The user's own module raises: `status`, `doctor SWEEP` and the launcher name the
    RuntimeError (was: "srun: error: …: Exited with exit code 1 … fix the error shown")."""
    (home / "mytrain.py").write_text(CRASHING)
    run = cli(home, "-m", "task.target=mytrain:train", *POLL)
    assert run.returncode == 1, run.stderr
    sweep = the_sweep(home)
    assert "RuntimeError: boom at step 5" in run.stderr and "^^^^" not in run.stderr, run.stderr
    assert run.stderr.count('raise RuntimeError("boom at step 5")') == 1, run.stderr  # the traceback once
    status = cli(home, "status", str(sweep), "--json")
    (task,) = json.loads(status.stdout)["tasks"]
    line = CRASHING.splitlines().index('            raise RuntimeError("boom at step 5")') + 1
    assert (
        task["diagnosis"]["summary"] == f"The task raised RuntimeError: boom at step 5 at mytrain.py:{line} in train."
    )
    table = cli(home, "status", str(sweep)).stdout
    assert "RuntimeError: boom at step 5" in table and "Exited with exit code" not in table, table
    doctor = cli(home, "doctor", str(sweep))
    assert doctor.returncode == 1 and "The task raised RuntimeError: boom at step 5" in doctor.stdout, doctor.stdout


def training_pid(sweep: Path) -> int:
    """The task's Python process (the one srun started), found by the sweep's folder in its argv."""
    folder = str(sweep / ".submitit")

    def find() -> int | None:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            words = [a.decode(errors="replace") for a in argv]
            if "slurmagent.job.boot" in words and folder in words and "python" in Path(words[0]).name:
                return int(proc.name)
        return None

    return wait_for(find, "the training process", 60)  # type: ignore[no-any-return]


def test_a_training_process_killed_by_sigkill_is_resumed(home: Path) -> None:
    """(d′) kill -9 of the training process: not the user's crash. It is resubmitted through the
    gate, resumes from its checkpoint and ends bit-identical (was: "crash … Not retried")."""
    launcher = start(home, "+experiment=synthetic", "-m", "synthetic.steps=80", "synthetic.step_time_s=0.2",
                     "checkpoint.every_steps=5", *POLL)  # fmt: skip
    sweep = the_sweep(home)
    running_job(sweep, 0, min_lines=12)
    os.kill(training_pid(sweep), signal.SIGKILL)
    code, out = finish(launcher)
    assert code == 0, out
    (task,) = state(sweep)["tasks"]
    assert task["state"] == "COMPLETED" and len(task["attempts"]) == 2, task
    assert task["diagnosis"]["cause"] == "killed", task["diagnosis"]
    assert task["result"]["digest"] == chain_digest(80) and task["result"]["resumed_from"] >= 10, task["result"]
    audit = [json.loads(x) for x in (sweep / "audit.jsonl").read_text().splitlines()]
    assert ("outcome", "resubmit", "allow") in [(r["type"], r["action"], r["decision"]) for r in audit], audit


AUTO = ("resources.gpus=1", "resources.gpu_type=auto", "resources.time=auto", "resources.mem=auto")
README_AUTO_SWEEP = ("+experiment=digits_mlp", "-m", "optim.lr=1e-3,1e-2", *AUTO, "budget.gpu_hours=4")


def sweeps(home: Path) -> set[Path]:
    return {p for p in home.glob("multirun/*/*") if (p / "sweep.json").is_file()}


def decided(sweep: Path) -> dict[str, tuple[str, str]]:
    """The `auto` decisions recorded in the sweep: key → (value, why)."""
    return {d["key"]: (d["value"], d["why"]) for p in state(sweep)["schedule"]["plans"] for d in p["decisions"]}


def test_the_readmes_auto_sweep_is_sized_from_its_own_history_as_plan_says(home: Path) -> None:
    """(e) "Right-sized requests" as the README writes it: the sweep, `slurmagent plan` (the
    console script), the sweep again. The first has no history: the site's fallback time. Its two
    runs reach the history from sacct; `plan` predicts from them and submits nothing; the second
    sweep is submitted as `plan` said. The state dir is the user's default resolution
    (`$XDG_STATE_HOME/slurmagent`, not the suite's SLURMAGENT_STATE_DIR), in `home`, so the
    history holds these runs only."""
    env = {k: v for k, v in user_env().items() if k != "SLURMAGENT_STATE_DIR"}
    env["XDG_STATE_HOME"] = str(home / ".local" / "state")
    first = cli(home, *README_AUTO_SWEEP, env=env)
    assert first.returncode == 0, first.stderr
    (first_sweep,) = sweeps(home)
    assert all(t["state"] == "COMPLETED" for t in state(first_sweep)["tasks"]), state(first_sweep)["tasks"]
    value, why = decided(first_sweep)["resources.time"]
    assert value == "01:00:00" and why.startswith("no history: site.scheduling.fallback_time=01:00:00"), why

    readme_plan = [str(Path(sys.executable).with_name("slurmagent")), "plan", "+experiment=digits_mlp", *AUTO]

    def planned() -> dict[str, Any] | None:
        out = subprocess.run([*readme_plan, "--json"], cwd=home, env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        body: dict[str, Any] = json.loads(out.stdout)
        return body if body["history_runs"] == 2 else None  # both runs fed from sacct

    before = jobs_from(home)
    plan = wait_for(planned, "both runs of the first sweep in the history", 60, 1)
    shown = subprocess.run(readme_plan, cwd=home, env=env, capture_output=True, text=True, timeout=120)
    assert jobs_from(home) == before  # nothing submitted
    assert "mean of the last 2 run(s)" in plan["prediction"], plan["prediction"]
    limit = plan["resources"]["time"]
    assert limit < "01:00:00" and plan["sbatch"]["time"] == limit, plan["sbatch"]  # from history, not the fallback
    assert plan["sbatch"]["mem"] == plan["resources"]["mem"] != "1G"  # the experiment's 1G replaced
    assert shown.returncode == 0 and "nothing submitted" in shown.stdout, shown.stderr
    assert f"resources.time={limit}: predicted: mean of the last 2 run(s)" in shown.stdout, shown.stdout

    second = cli(home, *README_AUTO_SWEEP, env=env)
    assert second.returncode == 0, second.stderr
    (second_sweep,) = sweeps(home) - {first_sweep}
    tasks = state(second_sweep)["tasks"]
    assert [t["state"] for t in tasks] == ["COMPLETED", "COMPLETED"], tasks
    now = decided(second_sweep)
    # plan's --time for the type the sweep chose (the cluster may have moved between the two)
    by_type = {c["gpu_type"]: seconds_to_slurm_time(c["run_s"]) for c in plan["candidates"]}
    limit = by_type[now["resources.gpu_type"][0]]
    assert now["resources.time"][0] == limit and now["resources.mem"][0] == plan["resources"]["mem"], now
    assert "mean of the last 2 run(s)" in now["resources.time"][1], now
    out = subprocess.run(["scontrol", "show", "job", "-o", tasks[0]["attempts"][0]["job_id"]],
                         capture_output=True, text=True).stdout  # fmt: skip
    job = dict(f.split("=", 1) for f in out.split() if "=" in f)
    assert job["TimeLimit"] == limit and mem_to_mb(job["MinMemoryNode"]) == mem_to_mb(plan["resources"]["mem"]), job
    status = cli(home, "status", str(second_sweep), env=env)
    assert "of budget 4 GPU-h" in status.stdout.replace("\n", " "), status.stdout


def test_the_time_limits_warning_with_seconds_of_work_left_lets_the_run_finish(home: Path) -> None:
    """A 2-minute limit, 15 s of work, Slurm's default warning 60 s ahead (sent here at step 75,
    with ~105 s left; Slurm's own would come 30-60 s in, after the end): Slurm says the job runs
    with less than the warning's lead + 60 s left, the rest fits, the run finishes: one run, no
    requeue. Was: requeued for its last seconds, back to the queue."""
    steps = 150
    run = ("+experiment=synthetic", "-m", f"synthetic.steps={steps}", "synthetic.step_time_s=0.1")
    proc = start(home, *run, "resources.time=00:02:00", *POLL)
    sweep = the_sweep(home)
    job = running_job(sweep, 0, min_lines=steps // 2)
    subprocess.run(["scancel", "--signal=USR2", job], capture_output=True, timeout=60)
    code, out = finish(proc)
    assert code == 0, out
    (task,) = state(sweep)["tasks"]
    assert task["state"] == "COMPLETED" and len(task["attempts"]) == 1, task
    assert task["attempts"][0]["restarts"] == 0, task  # never requeued
    assert task["result"]["digest"] == chain_digest(steps) and task["result"]["steps_run_here"] == steps
    logs = cli(home, "logs", str(sweep), "0", "--tail", "0").stdout
    assert "finishing instead of requeueing (recovery.finish_before_limit)" in logs, logs[-3000:]
    # the audit has the default keep_last pruning of old checkpoints, and no requeue
    actions = {r["action"] for r in audit_records(sweep / "audit.jsonl")} if (sweep / "audit.jsonl").exists() else set()
    assert "requeue" not in actions, actions
