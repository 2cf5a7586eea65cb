"""The plain-script protocol (slurmagent/job/command.py), in this process: a real child program
told to stop saves and exits with the requeue code, the next run is handed its checkpoint,
its metrics become the task's progress, and its project files are found from the task's
directory. The fake- and real-Slurm tests run the README's own examples through a requeue."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from slurmagent.errors import TaskFailedError
from slurmagent.job.command import MetricsTail, resolve_argv, run_command
from slurmagent.primitives.env import REQUEUE_EXIT_CODE, TaskFile
from slurmagent.runtime.context import context_from_env
from slurmagent.runtime.loop import StopForRequeue
from slurmagent.skills.auto_resume import newest_checkpoint
from tests.conftest import readme_example

# Waits for a signal (or counts to 1000), saves a JSON checkpoint, asks to be run again; a run
# handed a checkpoint writes what it was handed and which signals it saw as its result.
PROGRAM = """
import json, os, signal, sys, time
env = os.environ
got = []
signal.signal(signal.SIGUSR2, lambda n, _f: got.append(n))
resume = env.get("SLURMAGENT_RESUME_FROM")
out = env["SLURMAGENT_OUTPUT_DIR"]
if resume:
    json.dump({"resumed": resume, "step": json.load(open(resume))["step"]}, open(os.path.join(out, "result.json"), "w"))
    sys.exit(0)
metrics = open(env["SLURMAGENT_METRICS"], "a", buffering=1)
for step in range(1, 1000):
    metrics.write(json.dumps({"step": step, "loss": 1.0 / step}) + "\\n")
    if step == 3:
        open(os.path.join(out, "ready"), "w").close()
    if got:
        json.dump({"step": step}, open(os.path.join(env["SLURMAGENT_CHECKPOINT_DIR"], f"s{step}.json"), "w"))
        sys.exit(int(env["SLURMAGENT_REQUEUE_EXIT"]))
    time.sleep(0.02)
sys.exit(9)
"""


def context(tmp_path: Path):  # type: ignore[no-untyped-def]
    return context_from_env({"SLURMAGENT_BACKEND": "local"}, output_dir=tmp_path / "task")


def signal_when(path: Path, signum: int) -> threading.Thread:
    """Send this process `signum` (as Slurm signals a job) once `path` exists."""

    def send() -> None:
        deadline = time.monotonic() + 30
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        signal.pthread_kill(threading.main_thread().ident or 0, signum)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def test_a_program_told_to_stop_saves_asks_to_run_again_and_is_handed_its_checkpoint(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    ctx = context(tmp_path)
    signal_when(ctx.output_dir / "ready", signal.SIGUSR2)
    with pytest.raises(StopForRequeue) as stop:
        run_command([sys.executable, str(script)], ctx)
    saved = sorted(ctx.checkpoint_dir.glob("s*.json"))
    assert len(saved) == 1
    step = json.loads(saved[0].read_text())["step"]
    assert stop.value.signum == signal.SIGUSR2 and stop.value.signals == (signal.SIGUSR2,)
    assert stop.value.step == step and step >= 3  # the step of the checkpoint it wrote
    progress = json.loads((ctx.output_dir / TaskFile.PROGRESS).read_text())
    assert progress["step"] == step and progress["metrics"] == {"loss": 1.0 / step}, progress
    # the next run: handed the newest valid checkpoint
    assert run_command([sys.executable, str(script)], ctx) == {"resumed": str(saved[0]), "step": step}


def test_another_exit_code_is_a_failure_with_the_code_and_stderr(tmp_path: Path) -> None:
    script = tmp_path / "fail.py"
    script.write_text("import sys\nprint('no data in /scratch/x', file=sys.stderr)\nsys.exit(3)\n")
    with pytest.raises(TaskFailedError, match=r"exited with code 3(.|\n)*no data in /scratch/x"):
        run_command([sys.executable, str(script)], context(tmp_path))


def test_the_requeue_code_is_sysexits_tempfail() -> None:
    assert REQUEUE_EXIT_CODE == 75  # documented in README.md and docs/trainers.md


def test_the_newest_checkpoint_is_read_from_its_content_in_any_known_format(tmp_path: Path) -> None:
    assert newest_checkpoint(tmp_path / "absent") is None
    (tmp_path / "step9.json").write_text(json.dumps({"step": 4}))  # the content wins over the name
    (tmp_path / "step5.json").write_text(json.dumps({"step": 5}))
    (tmp_path / "step7.json").write_text('{"step": 7')  # cut short: skipped for the previous
    (tmp_path / "config.json").write_text(json.dumps({"lr": 0.1}))  # JSON that is no checkpoint
    assert newest_checkpoint(tmp_path) == (str(tmp_path / "step5.json"), 5)
    hf = tmp_path / "checkpoint-12"  # a Hugging Face Trainer checkpoint: its directory
    hf.mkdir()
    (hf / "trainer_state.json").write_text(json.dumps({"global_step": 12, "epoch": 1.0}))
    assert newest_checkpoint(tmp_path) == (str(hf), 12)


def test_progress_comes_from_whole_lines_of_this_run_only(tmp_path: Path) -> None:
    metrics = tmp_path / TaskFile.METRICS
    metrics.write_text(json.dumps({"step": 50, "loss": 9.0}) + "\n")  # an earlier run's
    tail = MetricsTail(metrics, attempt=2)
    with open(metrics, "a") as fh:
        fh.write(json.dumps({"step": 51, "loss": 0.5}) + "\n" + '{"step": 52, "lo')
    tail.progress(force=True)
    body = json.loads((tmp_path / TaskFile.PROGRESS).read_text())
    assert (body["step"], body["start_step"], body["metrics"], body["attempt"]) == (51, 51, {"loss": 0.5}, 2)
    with open(metrics, "a") as fh:
        fh.write('ss": 0.25}\n')  # the line completed
    tail.progress(force=True)
    assert json.loads((tmp_path / TaskFile.PROGRESS).read_text())["metrics"] == {"loss": 0.25}


def test_relative_words_naming_project_files_are_taken_from_the_code_root(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "cfg.json").write_text("{}")
    argv = ["python", "train.py", "data/cfg.json", "--epochs", "3", "/abs/x.py", "data"]
    assert resolve_argv(argv, tmp_path) == [
        "python",
        str(tmp_path / "train.py"),
        str(tmp_path / "data" / "cfg.json"),
        "--epochs",
        "3",
        "/abs/x.py",
        "data",  # a directory: left as it is
    ]


def test_the_readme_shell_example_follows_the_protocol(tmp_path: Path) -> None:
    """The README's train.sh under sh: stopped, it saves a JSON checkpoint the next run resumes."""
    script = tmp_path / "train.sh"
    script.write_text(readme_example("# train.sh"))
    ctx = context(tmp_path)
    metrics = ctx.output_dir / TaskFile.METRICS
    ctx.output_dir.mkdir(parents=True)
    ctx.checkpoint_dir.mkdir(parents=True)

    def lines() -> list[dict[str, int]]:
        return [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []

    waiter = threading.Thread(target=lambda: [time.sleep(0.05) for _ in range(400) if len(lines()) < 2], daemon=True)
    waiter.start()
    threading.Thread(
        target=lambda: (waiter.join(), signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)),
        daemon=True,
    ).start()
    with pytest.raises(StopForRequeue) as stop:
        run_command(["sh", str(script), "4"], ctx)
    stopped_at = stop.value.step
    assert stopped_at >= 2 and stop.value.signals == (signal.SIGTERM,)
    assert run_command(["sh", str(script), "4"], ctx) is None
    assert lines() == [{"step": n, "square": n * n} for n in range(1, 5)]  # each step once, in order


def test_sh_is_here() -> None:
    assert subprocess.run(["sh", "-c", "exit 0"]).returncode == 0
