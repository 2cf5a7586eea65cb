"""Submission that never orphans a job (supervise/submission.py, slurm/seam.py's submit):
the logic on the fake Slurm, with a stand-in Submitter that sbatches a plain script (the
launcher's SubmititSubmitter builds submitit arrays; tests/fake and tests/slurm run that)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmagent.config import JobSpec, job_spec
from slurmagent.errors import SubmissionRefused
from slurmagent.slurm.seam import LIMITS_TTL_S, SlurmCLI, refusal_kind
from slurmagent.supervise.state import SweepState, TaskRecord
from slurmagent.supervise.submission import (
    REFUSED,
    WAITING,
    open_intent,
    reconcile,
    submit_waiting,
    waiting_groups,
)
from tests.fake.fake_slurm import FakeSlurm

LIMIT = (
    "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user's "
    "size and/or time limits)"
)
JOB_COUNT = "sbatch: error: Batch job submission failed: Resource temporarily unavailable"
DOWN = "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)"
SOCKET = "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation"
BAD = "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified"


@pytest.mark.parametrize(
    ("stderr", "kind"),
    [(LIMIT, "limit"), (JOB_COUNT, "limit"), (DOWN, "transient"), (SOCKET, "transient"), (BAD, "permanent")],
)
def test_refusals_are_sorted_by_what_waiting_can_change(stderr: str, kind: str) -> None:
    assert refusal_kind(stderr) == kind


class ScriptSubmitter:
    """Sends tasks as one sbatch array of `sleep` jobs carrying the marker as --comment."""

    def __init__(self, slurm: SlurmCLI, folder: Path) -> None:
        self.slurm, self.folder, self.calls = slurm, folder, 0

    def __call__(
        self, state: SweepState, tasks: list[TaskRecord], spec: JobSpec, attempt: int, comment: str
    ) -> list[str]:
        self.calls += 1
        script = self.folder / f"job{self.calls}.sh"
        array = f"#SBATCH --array=0-{len(tasks) - 1}\n" if len(tasks) > 1 else ""
        script.write_text(
            f"#!/bin/bash\n#SBATCH --partition=low\n#SBATCH --comment={comment}\n{array}"
            f"#SBATCH --output={self.folder}/%j.out\nsrun sleep 30\n"
        )
        own = self.slurm.submit(script)
        return [own] if len(tasks) == 1 else [f"{own}_{k}" for k in range(len(tasks))]


def sweep(tmp_path: Path, n: int) -> SweepState:
    state = SweepState(str(tmp_path), "slurm", str(tmp_path / ".submitit"), time.time(), [])
    spec_id = state.add_spec(dataclasses.asdict(job_spec({"task": {"target": "a:b"}})))
    state.tasks = [TaskRecord(i, [f"x={i}"], state=WAITING, spec_id=spec_id) for i in range(n)]
    return state


@pytest.fixture()
def fake(tmp_path: Path) -> Iterator[FakeSlurm]:
    slurm = FakeSlurm(tmp_path / "fake")
    yield slurm
    for job_id, job in slurm.jobs().items():  # nothing outlives the test
        if job["state"] in ("RUNNING", "PENDING"):
            slurm.command(["scancel", job_id], str(tmp_path))


def test_a_submit_limit_admits_what_fits_and_the_rest_waits(tmp_path: Path, fake: FakeSlurm) -> None:
    fake.set_submit_limit(5)
    slurm = SlurmCLI(runner=fake)
    state, writes = sweep(tmp_path, 12), []
    submit = ScriptSubmitter(slurm, tmp_path)
    report = submit_waiting(state, lambda: writes.append(1), submit, slurm, max_array=3, user="me")
    assert report.limit == 5 and report.submitted == 5 and report.waiting == 7
    assert [len(t.attempts) for t in state.tasks] == [1] * 5 + [0] * 7  # arrays of 3 + 2: exactly the room
    assert "submit limit (5 jobs per user) is reached" in state.held_back
    assert not fake.limit_refusals() and fake.max_queued() == 5
    # every submission was written before its sbatch and after it
    assert len(writes) == 2 * submit.calls and all(i["state"] == "submitted" for i in state.submissions)
    # two jobs end: two more go in; nothing else is tried while the limit holds
    for job in sorted(fake.jobs())[:2]:
        fake.command(["scancel", job], str(tmp_path))
    report = submit_waiting(state, lambda: None, submit, slurm, max_array=3, user="me")
    assert report.submitted == 2 and report.waiting == 5 and not fake.limit_refusals()


def test_a_limit_refusal_without_a_known_limit_holds_the_rest_back(tmp_path: Path, fake: FakeSlurm) -> None:
    """The cluster's MaxJobCount (no per-user limit in accounting): the first array goes in;
    the second is refused, then again as a smaller array; it and everything after it wait."""
    slurm = SlurmCLI(runner=fake)
    state = sweep(tmp_path, 9)
    real_submit = ScriptSubmitter(slurm, tmp_path)

    def second_refused(st: SweepState, tasks: list[TaskRecord], spec: JobSpec, attempt: int, comment: str) -> list[str]:
        if real_submit.calls >= 1:  # the controller holds as many jobs as it may from now on
            fake.refuse_sbatch(JOB_COUNT.removeprefix("sbatch: error: "))
        return real_submit(st, tasks, spec, attempt, comment)

    report = submit_waiting(state, lambda: None, second_refused, slurm, max_array=3, user="me")
    assert report.submitted == 3 and report.waiting == 6 and not report.refused
    assert (
        real_submit.calls == 3
    )  # 3 tasks; refused: 3, then 1    assert "Resource temporarily unavailable" in report.held_back
    assert [t.state for t in state.tasks] == ["PENDING"] * 3 + [WAITING] * 6
    assert not [i for i in state.submissions if i["state"] == "submitting"]  # the refused intent is gone


def test_a_transient_refusal_is_retried_with_back_off(tmp_path: Path, fake: FakeSlurm) -> None:
    slept: list[float] = []
    slurm = SlurmCLI(runner=fake, sleep=slept.append)
    fake.refuse_sbatch(SOCKET.removeprefix("sbatch: error: "), DOWN.removeprefix("sbatch: error: "))
    state = sweep(tmp_path, 2)
    report = submit_waiting(state, lambda: None, ScriptSubmitter(slurm, tmp_path), slurm, max_array=10, user="me")
    assert report.submitted == 2 and slept == [1.0, 2.0]


def test_a_permanent_refusal_marks_its_tasks_refused_and_the_others_go_on(tmp_path: Path, fake: FakeSlurm) -> None:
    slurm = SlurmCLI(runner=fake)
    state = sweep(tmp_path, 4)
    other = state.add_spec(dataclasses.asdict(job_spec({"task": {"target": "a:b"}, "resources": {"mem": "2G"}})))
    for t in state.tasks[2:]:
        t.spec_id = other
    fake.refuse_sbatch(BAD.removeprefix("sbatch: error: "))
    report = submit_waiting(state, lambda: None, ScriptSubmitter(slurm, tmp_path), slurm, max_array=10, user="me")
    assert report.refused.endswith("Invalid account or account/partition combination specified")
    assert report.refused_tasks == 2 and report.submitted == 2
    assert [t.state for t in state.tasks] == [REFUSED, REFUSED, "PENDING", "PENDING"]
    assert state.tasks[0].done and "Invalid account" in state.tasks[0].error


def test_a_killed_launchers_submission_is_found_by_its_marker(tmp_path: Path, fake: FakeSlurm) -> None:
    """The launcher wrote its intent, sbatch accepted the array, the launcher died before
    writing the job id: the next poll finds the job by its --comment and records it; an
    intent whose job never reached Slurm is dropped and its tasks are submitted again."""
    slurm = SlurmCLI(runner=fake)
    state = sweep(tmp_path, 5)
    lost = open_intent(state, state.tasks[:3], 1)
    never = open_intent(state, state.tasks[3:], 1)
    spec = job_spec(state.specs[state.tasks[0].spec_id])
    ScriptSubmitter(slurm, tmp_path)(state, state.tasks[:3], spec, 1, str(lost["marker"]))
    assert waiting_groups(state) == []  # in flight: not submitted twice
    assert reconcile(state, slurm, "me") == 0  # too recent: its sbatch may still be running
    for intent in state.submissions:
        intent["at"] -= 120
    assert reconcile(state, slurm, "me") == 3
    own = lost["job_id"]
    assert [t.job_id for t in state.tasks[:3]] == [f"{own}_0", f"{own}_1", f"{own}_2"]
    assert never not in state.submissions and [t.state for t in state.tasks[3:]] == [WAITING, WAITING]
    report = submit_waiting(state, lambda: None, ScriptSubmitter(slurm, tmp_path), slurm, max_array=10, user="me")
    assert report.submitted == 2 and all(t.job_id for t in state.tasks)
    assert len({j["array"] or j_id for j_id, j in fake.jobs().items()}) == 2  # two arrays, no duplicate


def test_a_dead_submitter_on_this_host_is_reconciled_at_once(
    tmp_path: Path, fake: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher that opened the intent ran here and is gone, and no sbatch runs here: nothing
    can be in flight, so the next poll need not wait RECONCILE_AFTER_S. Alive, or an sbatch
    still running (orphaned by the killed launcher), or another host: it waits."""
    import subprocess
    import sys

    from slurmagent.primitives import procs
    from slurmagent.supervise import submission

    slurm = SlurmCLI(runner=fake)
    state = sweep(tmp_path, 2)
    intent = open_intent(state, state.tasks, 1)
    assert intent["pid"] == os.getpid() and reconcile(state, slurm, "me") == 0 and intent in state.submissions
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    intent["pid"] = dead.pid  # the launcher was killed before its sbatch
    sbatch = tmp_path / "bin" / "sbatch"
    sbatch.parent.mkdir()
    sbatch.write_text("import time\ntime.sleep(60)\n")
    orphan = subprocess.Popen([sys.executable, str(sbatch)])  # an sbatch still running: it may yet submit
    try:
        # the child's /proc/PID/cmdline can read empty for a moment after Popen returns (vfork + exec)
        deadline = time.monotonic() + 10
        while procs.cmdline(orphan.pid)[1:2] != [str(sbatch).encode()] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert reconcile(state, slurm, "me") == 0 and intent in state.submissions
    finally:
        orphan.kill()
        orphan.wait()
    elsewhere = {**intent, "host": "login-2"}
    state.submissions = [elsewhere]
    assert reconcile(state, slurm, "me") == 0 and elsewhere in state.submissions  # another host: cannot tell

    assert procs.command_running(f"sbatch-{os.getpid()}") is False
    # no sbatch here (another test running beside this one may run one: its scan is replaced)
    monkeypatch.setattr(submission, "command_running", lambda name: False)
    state.submissions = [intent]
    assert reconcile(state, slurm, "me") == 0 and not state.submissions  # nothing in flight: dropped now
    assert [t.state for t in state.tasks] == [WAITING, WAITING]  # submitted by the next submit_waiting


@pytest.mark.parametrize("tasks", [1, 3])
def test_jobs_whose_launcher_died_right_after_sbatch_put_their_own_pickles_in_place(
    tmp_path: Path, fake: FakeSlurm, monkeypatch: pytest.MonkeyPatch, tasks: int
) -> None:
    """sbatch answered, then the launcher was killed before it moved the tasks' pickles to the
    job id's names (what `reconcile` then finds): each job (a lone one, an array's tasks) finds
    its staged pickle by the submission's name and its array index, puts it in place and runs
    its own task — before, submitit in the job waited 60 s for the pickle and failed."""
    import cloudpickle

    from slurmagent.launch import backend

    monkeypatch.setattr(backend, "place_pickle", lambda *_a, **_k: None)  # the launcher is gone here
    executor = backend.SeamSlurmExecutor(tmp_path / "jobs", SlurmCLI(runner=fake), max_num_timeout=1)
    executor.update_parameters(partition="low", time=5)
    jobs = executor.map_array(abs, [-2 * i for i in range(tasks)])  # what the job can unpickle
    assert not any(job.paths.submitted_pickle.exists() for job in jobs)
    deadline = time.monotonic() + 45  # less than submitit's 60-s wait: a job that waits for it fails this
    while not all(job.paths.result_pickle.exists() for job in jobs):
        assert time.monotonic() < deadline, [job.paths.stderr.read_text() for job in jobs if job.paths.stderr.exists()]
        fake.tick()
        time.sleep(0.2)
    assert [cloudpickle.loads(job.paths.result_pickle.read_bytes()) for job in jobs] == [
        ("success", 2 * i) for i in range(tasks)
    ]
    assert not list((tmp_path / "jobs").glob(".staged_*"))  # every staged pickle was claimed


def test_a_pickle_the_job_placed_first_is_left_as_it_is(tmp_path: Path) -> None:
    from slurmagent.job.boot import claim_staged_pickle
    from slurmagent.primitives.submitit_layout import place_pickle, staged_pickle

    staged = staged_pickle(tmp_path, "abc", 2)
    staged.write_bytes(b"payload")
    env = {"SLURM_JOB_ID": "12", "SLURM_ARRAY_JOB_ID": "10", "SLURM_ARRAY_TASK_ID": "2"}
    placed = claim_staged_pickle(str(tmp_path), "abc", env)
    assert placed == tmp_path / "10_2_submitted.pkl" and placed.read_bytes() == b"payload" and not staged.exists()
    place_pickle(staged, placed)  # the launcher, second: nothing to do, no error
    assert claim_staged_pickle(str(tmp_path), "abc", env) is None  # a requeued run: already in place
    with pytest.raises(FileNotFoundError):
        place_pickle(staged_pickle(tmp_path, "abc", 3), tmp_path / "10_3_submitted.pkl")  # lost: said, not hidden


def test_a_refusal_is_an_error_of_its_kind(tmp_path: Path, fake: FakeSlurm) -> None:
    slurm = SlurmCLI(runner=fake, sleep=lambda _s: None)
    fake.set_controller(False)
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --partition=low\nsrun true\n")
    with pytest.raises(SubmissionRefused) as err:
        slurm.submit(script)
    assert err.value.kind == "transient" and len([c for c in fake.calls if c[0] == "sbatch"]) == 6


def test_a_controller_down_past_the_retries_leaves_the_tasks_waiting(tmp_path: Path, fake: FakeSlurm) -> None:
    slurm = SlurmCLI(runner=fake, sleep=lambda _s: None)
    fake.set_controller(False)
    state = sweep(tmp_path, 3)
    report = submit_waiting(state, lambda: None, ScriptSubmitter(slurm, tmp_path), slurm, max_array=10, user="me")
    assert report.submitted == 0 and report.waiting == 3 and not report.refused
    assert "Slurm did not answer" in state.held_back and [t.state for t in state.tasks] == [WAITING] * 3
    fake.set_controller(True)  # back: the supervisor's next try submits them
    report = submit_waiting(state, lambda: None, ScriptSubmitter(slurm, tmp_path), slurm, max_array=10, user="me")
    assert report.submitted == 3 and not state.held_back


# -- 30,000 tasks: a launcher killed between an array's intent and its sbatch, or right after ------------
class ArraySlurm:
    """A seam runner keeping each array whole, shared by processes through a JSON file: sbatch,
    the squeue listings submission reads, sacctmgr (no limit), sinfo. (The fake Slurm keeps
    every array task as a job, rewriting its state per command: right for tens of tasks, not
    for 30,000.)"""

    def __init__(self, path: Path) -> None:
        self.path = path

    def arrays(self) -> list[dict[str, object]]:
        return json.loads(self.path.read_text())["arrays"] if self.path.exists() else []

    def __call__(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        out, arrays = "", self.arrays()
        if argv[0] == "sbatch":
            text = Path(argv[-1]).read_text()
            size = re.search(r"--array=0-(\d+)", text)
            comment = re.search(r"--comment=(\S+)", text)
            own = str(100 + len(arrays))
            arrays.append({"id": own, "n": int(size[1]) + 1 if size else 1, "comment": comment[1] if comment else ""})
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"arrays": arrays}))
            os.replace(tmp, self.path)
            out = f"{own}\n"
        elif argv[0] == "squeue" and "%F|%k" in argv:
            out = "".join(f"{a['id']}|{a['comment']}\n" for a in arrays)
        elif argv[0] == "squeue":  # -r: one line per array task
            field = "low" if "%P" in argv else None
            out = "".join(f"{field or a['id']}\n" for a in arrays for _ in range(int(str(a["n"]))))
        elif argv[0] == "sinfo":
            out = "low*\n"
        return subprocess.CompletedProcess(argv, 0, out, "")


class KilledSubmitter(ScriptSubmitter):
    """The launcher's submitter, killed (SIGKILL, nothing cleaned up) at its `at`-th array:
    before the sbatch (`when="before"`) or after it, before the job id is recorded."""

    def __init__(self, slurm: SlurmCLI, folder: Path, at: int, when: str) -> None:
        super().__init__(slurm, folder)
        self.at, self.when = at, when

    def __call__(
        self, state: SweepState, tasks: list[TaskRecord], spec: JobSpec, attempt: int, comment: str
    ) -> list[str]:
        if self.calls + 1 == self.at and self.when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        ids = super().__call__(state, tasks, spec, attempt, comment)
        if self.calls == self.at:
            os.kill(os.getpid(), signal.SIGKILL)
        return ids


LAUNCHER = """
import sys
from pathlib import Path
sys.path.insert(0, {root!r})
from slurmagent.slurm.seam import SlurmCLI
from slurmagent.supervise.state import SweepStore
from slurmagent.supervise.submission import submit_waiting
from tests.unit.test_submission import ArraySlurm, KilledSubmitter
slurm = SlurmCLI(runner=ArraySlurm(Path({slurm!r})))
store = SweepStore({sweep!r})
with store.edit() as state:
    submit_waiting(state, lambda: store.write(state), KilledSubmitter(slurm, Path({sweep!r}), 8, {when!r}), slurm,
                   max_array=1001, user="me")
"""


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_launcher_killed_at_an_array_of_30000_tasks_orphans_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """30,000 tasks, arrays of 1,001: the launcher is killed at its 8th array, before its sbatch
    or after it (the array is in Slurm, its job id nowhere). What it left on disk names every
    job it submitted; the next supervisor finds the lost array by its marker (or, never
    submitted, submits its tasks) and submits the rest: 30 arrays, each task in exactly one."""
    from slurmagent.supervise import submission
    from slurmagent.supervise.state import SweepStore

    n, root = 30_000, Path(__file__).resolve().parents[2]
    store = SweepStore(tmp_path)
    store.create(sweep(tmp_path, n))
    fake = ArraySlurm(tmp_path / "slurm.json")
    script = LAUNCHER.format(root=str(root), slurm=str(fake.path), sweep=str(tmp_path), when=when)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    left = SweepStore(tmp_path).load()
    submitted = fake.arrays()
    assert len(submitted) == (7 if when == "before" else 8)
    (lost,) = [i for i in left.submissions if i["state"] == "submitting"]
    assert len(lost["tasks"]) == 1001 and not any(left.tasks[i].attempts for i in lost["tasks"])
    recorded = {i["job_id"] for i in left.submissions if i["state"] == "submitted"}
    assert recorded == {a["id"] for a in submitted[:7]} == set(left.array_ids)  # each one before the kill
    assert sum(bool(t.attempts) for t in left.tasks) == 7 * 1001
    if when == "after":  # the 8th is in Slurm, known only by its marker
        assert submitted[7]["comment"] == lost["marker"]

    # the next supervisor (watch, or the detached one); the dead launcher ran here and no sbatch
    # runs here (another test's may: the scan is replaced), so it does not wait to reconcile
    monkeypatch.setattr(submission, "command_running", lambda name: False)
    slurm = SlurmCLI(runner=fake)
    nxt = SweepStore(tmp_path)
    with nxt.edit() as state:
        report = submit_waiting(state, lambda: nxt.write(state), ScriptSubmitter(slurm, tmp_path), slurm, 1001, "me")
    assert report.waiting == 0 and not report.refused
    final = SweepStore(tmp_path).load()
    arrays = fake.arrays()
    assert len(arrays) == 30 == len({a["comment"] for a in arrays})  # ⌈30000/1001⌉, none twice
    assert set(final.array_ids) == {a["id"] for a in arrays}  # every array in Slurm is the sweep's
    assert all(len(t.attempts) == 1 and t.state == "PENDING" for t in final.tasks)
    by_array: dict[str, list[int]] = {}
    for t in final.tasks:
        own, _, k = str(t.job_id).partition("_")
        by_array.setdefault(own, []).append(int(k))
    assert {own: len(ks) for own, ks in by_array.items()} == {str(a["id"]): a["n"] for a in arrays}
    assert all(sorted(ks) == list(range(len(ks))) for ks in by_array.values())
    assert [i["state"] for i in final.submissions] == ["submitted"] * 30


def test_the_supervisor_job_carries_the_stop_flags_of_every_job(tmp_path: Path) -> None:
    """The detached supervisor's script gets --requeue, --open-mode and --signal from the one
    place that writes them for every job (slurm/sbatch.stop_flags), with its own signal."""
    from slurmagent.config import LauncherConf
    from slurmagent.supervise.detach import TIME_LIMIT_WARNING_S, supervisor_script
    from slurmagent.supervise.state import SweepState

    state = SweepState(str(tmp_path), "slurm", str(tmp_path / ".submitit"), 0.0, [])
    lines = supervisor_script(state, LauncherConf(), None, tmp_path).splitlines()
    assert "#SBATCH --requeue" in lines
    assert "#SBATCH --open-mode=append" in lines
    assert f"#SBATCH --signal=B:USR1@{TIME_LIMIT_WARNING_S}" in lines


def test_the_submit_limit_is_asked_of_accounting_once_per_ttl_and_again_after_a_limit_refusal(
    tmp_path: Path, fake: FakeSlurm
) -> None:
    """A search submits trial by trial: each submission must not ask slurmdbd (sacctmgr, two
    queries) again for a limit an administrator rarely changes; a change shows within the TTL,
    and at once after sbatch refuses a submission for a limit."""
    now = [0.0]
    fake.set_submit_limit(5)
    slurm = SlurmCLI(runner=fake, clock=lambda: now[0])
    assert slurm.submit_limit("me") == 5 and slurm.calls["sacctmgr"] == 2
    fake.set_submit_limit(3)
    assert slurm.submit_limit("me") == 5 and slurm.calls["sacctmgr"] == 2  # within the TTL: not asked
    now[0] = LIMITS_TTL_S
    assert slurm.submit_limit("me") == 3 and slurm.calls["sacctmgr"] == 4  # after it: asked again
    fake.set_submit_limit(7)
    fake.refuse_sbatch(LIMIT.removeprefix("sbatch: error: "))
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    with pytest.raises(SubmissionRefused):
        slurm.submit(script)
    assert slurm.submit_limit("me") == 7 and slurm.calls["sacctmgr"] == 6  # the refusal dropped what was read
