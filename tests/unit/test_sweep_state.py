"""The sweep's state on disk (supervise/state.py): sweep.json, a snapshot laid out one task per
line, and sweep.journal, the changes since, appended and fsync'ed under the lock, committed
as a whole or not at all, compacted into a new snapshot now and then. A change costs what it
changes, not the sweep's size; a crash at any byte loses only what was not committed; a
reader without the lock always sees one committed state."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slurmagent.supervise import state as state_mod
from slurmagent.supervise.state import (
    JOURNAL_FILE,
    STATE_FILE,
    Attempt,
    SweepState,
    SweepStore,
    TaskRecord,
    task_json,
)
from slurmagent.supervise.submission import WAITING, close_intent, open_intent

ROOT = Path(__file__).resolve().parents[2]


def new_sweep(path: Path, n: int, done: int = 0) -> SweepStore:
    tasks = [
        TaskRecord(i, [f"x={i}", "model=big", "optim.lr=0.1"], state="COMPLETED" if i < done else WAITING)
        for i in range(n)
    ]
    store = SweepStore(path)
    store.create(SweepState(str(path), "slurm", str(path / ".submitit"), 1.0, tasks))
    return store


def as_plain(state: SweepState) -> dict[str, object]:
    return state.to_json()


@pytest.fixture()
def journaled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every sweep is written as a large one is (a small one's sweep.json is rewritten whole)."""
    monkeypatch.setattr(state_mod, "COMPACT_BELOW", 0)


def test_a_small_sweep_is_one_json_document_after_every_write(tmp_path: Path) -> None:
    store = new_sweep(tmp_path, 5)
    with store.edit() as state:
        state.tasks[2].state, state.tasks[2].result = "COMPLETED", {"loss": 0.5}
    assert not (tmp_path / JOURNAL_FILE).exists()
    raw = json.loads((tmp_path / STATE_FILE).read_text())  # what any JSON reader sees: the whole state
    assert raw["tasks"][2]["state"] == "COMPLETED" and raw["tasks"][2]["result"] == {"loss": 0.5}
    assert raw["backend"] == "slurm" and len(raw["tasks"]) == 5
    assert as_plain(SweepStore(tmp_path).load()) == as_plain(store.view())


def test_a_change_to_a_large_sweep_is_appended_not_rewritten(tmp_path: Path, journaled: None) -> None:
    store = new_sweep(tmp_path, 3000)
    snapshot = (tmp_path / STATE_FILE).read_bytes()
    with store.edit() as state:
        state.tasks[1234].state = "COMPLETED"
        state.held_back = "a reason"
    assert (tmp_path / STATE_FILE).read_bytes() == snapshot  # not rewritten
    lines = (tmp_path / JOURNAL_FILE).read_text().splitlines()
    assert [next(iter(json.loads(line))) for line in lines] == ["snapshot", "set", "task", "commit"]
    assert len((tmp_path / JOURNAL_FILE).read_bytes()) < 1000  # the change, not the sweep
    again = SweepStore(tmp_path).load()
    assert again.tasks[1234].state == "COMPLETED" and again.held_back == "a reason"
    assert as_plain(again) == as_plain(store.view())
    with store.edit():  # nothing changed: nothing written
        pass
    assert len((tmp_path / JOURNAL_FILE).read_text().splitlines()) == 4


def test_an_arrays_intent_is_on_disk_before_the_edit_ends_and_costs_the_array_only(
    tmp_path: Path, journaled: None
) -> None:
    store = new_sweep(tmp_path, 20_000)
    with store.edit() as state:
        part = state.tasks[5000:6000]
        intent = open_intent(state, part, 1)
        state.tasks[0].error = "not part of the submission: written when the edit ends"
        before = (tmp_path / JOURNAL_FILE).stat().st_size if (tmp_path / JOURNAL_FILE).exists() else 0
        store.write(state)  # before the sbatch
        seen = SweepStore(tmp_path).load()  # what a launcher killed now leaves
        assert [i["marker"] for i in seen.submissions] == [intent["marker"]] and seen.submissions[0]["state"] == (
            "submitting"
        )
        assert seen.tasks[0].error == ""
        close_intent(state, part, [f"77_{k}" for k in range(len(part))], intent)
        store.write(state)  # after it
        grown = (tmp_path / JOURNAL_FILE).stat().st_size - before
        seen = SweepStore(tmp_path).load()
        assert [t.job_id for t in seen.tasks[5000:6000]] == [f"77_{k}" for k in range(1000)]
        assert seen.submissions[0]["state"] == "submitted" and seen.array_ids == ["77"]
    # the array's records: its intent and its 1,000 tasks, whatever the sweep's size (20,000 here)
    assert grown < 1000 * 400
    assert SweepStore(tmp_path).load().tasks[0].error.startswith("not part")


def test_a_crash_mid_append_loses_only_that_append(tmp_path: Path, journaled: None) -> None:
    store = new_sweep(tmp_path, 2000)
    with store.edit() as state:
        state.tasks[1].state = "RUNNING"
    journal = tmp_path / JOURNAL_FILE
    good = journal.read_bytes()
    # an append cut short: records without their commit, the last one torn
    t2 = {**task_json(store.view().tasks[2]), "state": "FAILED"}
    t3 = {**task_json(store.view().tasks[3]), "state": "FAILED"}
    torn = (json.dumps({"task": t2}) + "\n" + json.dumps({"task": t3}))[:-17].encode()
    journal.write_bytes(good + torn)
    for reader in (SweepStore(tmp_path).load(), SweepStore(tmp_path).view()):
        assert [t.state for t in reader.tasks[:4]] == [WAITING, "RUNNING", WAITING, WAITING]
    scan = SweepStore(tmp_path).scan()
    assert scan.counts() == {"RUNNING": 1, WAITING: 1999}
    # a whole line, even, but no commit: the same
    journal.write_bytes(good + (json.dumps({"task": t2}) + "\n").encode())
    assert SweepStore(tmp_path).load().tasks[2].state == WAITING
    # the next writer cuts the uncommitted tail off and appends after the last commit
    writer = SweepStore(tmp_path)
    with writer.edit() as state:
        state.tasks[4].state = "COMPLETED"
    assert journal.read_bytes().startswith(good) and b'"FAILED"' not in journal.read_bytes()
    again = SweepStore(tmp_path).load()
    assert [t.state for t in again.tasks[:5]] == [WAITING, "RUNNING", WAITING, WAITING, "COMPLETED"]


def test_the_journal_is_compacted_when_it_outgrows_the_snapshot(
    tmp_path: Path, journaled: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = new_sweep(tmp_path, 1000)
    size = (tmp_path / STATE_FILE).stat().st_size
    rewrites = 0
    for k in range(40):  # 25 tasks per edit: the journal passes the snapshot's size after about 40
        with store.edit() as state:
            for t in state.tasks[k * 25 : (k + 1) * 25]:
                t.state, t.result = "COMPLETED", {"k": k}
        if not (tmp_path / JOURNAL_FILE).exists():
            rewrites += 1
        assert (tmp_path / JOURNAL_FILE).stat().st_size <= size if (tmp_path / JOURNAL_FILE).exists() else True
    assert rewrites >= 1  # compacted: sweep.json holds it all, the journal starts again
    final = SweepStore(tmp_path).load()
    assert all(t.state == "COMPLETED" and t.result == {"k": t.index // 25} for t in final.tasks)
    assert final.finished_at is not None  # the sweep ended: one document again
    assert not (tmp_path / JOURNAL_FILE).exists()
    assert json.loads((tmp_path / STATE_FILE).read_text())["tasks"][999]["result"] == {"k": 39}


def test_a_journal_left_behind_by_a_crash_during_compaction_is_ignored(tmp_path: Path, journaled: None) -> None:
    """Compaction renames the new sweep.json into place, then removes the journal it absorbed;
    killed in between, that journal stays: it names the old snapshot, so it is ignored."""
    store = new_sweep(tmp_path, 500)
    with store.edit() as state:
        state.tasks[7].state = "FAILED"
    stale = (tmp_path / JOURNAL_FILE).read_bytes()
    store.compact()
    assert not (tmp_path / JOURNAL_FILE).exists()
    with store.edit() as state:  # a change after the compaction, in a new journal
        state.tasks[8].state = "RUNNING"
    store.compact()
    (tmp_path / JOURNAL_FILE).write_bytes(stale)  # as if the process died before removing it
    again = SweepStore(tmp_path).load()
    assert again.tasks[7].state == "FAILED" and again.tasks[8].state == "RUNNING"
    assert SweepStore(tmp_path).scan().counts() == {"FAILED": 1, "RUNNING": 1, WAITING: 498}
    with SweepStore(tmp_path).edit() as state:  # the next append replaces it
        state.tasks[9].state = "RUNNING"
    assert not (tmp_path / JOURNAL_FILE).read_bytes().startswith(stale[:30])
    assert [t.state for t in SweepStore(tmp_path).load().tasks[7:10]] == ["FAILED", "RUNNING", "RUNNING"]


def test_a_state_written_by_the_previous_version_is_read_and_converted(tmp_path: Path) -> None:
    state = SweepState(str(tmp_path), "local", str(tmp_path / ".submitit"), 1.0, [])
    state.tasks = [TaskRecord(i, [f"x={i}"], [Attempt(str(100 + i), 2.0)], "RUNNING") for i in range(3)]
    (tmp_path / STATE_FILE).write_text(json.dumps(state.to_json(), indent=1))  # one indented document
    store = SweepStore(tmp_path)
    assert as_plain(store.load()) == as_plain(state)
    assert store.scan().counts() == {"RUNNING": 3} and [t.index for t in store.scan().page(2)] == [0, 1]
    with store.edit() as edited:
        edited.tasks[0].state = "COMPLETED"
    assert (tmp_path / STATE_FILE).read_text().startswith('{"format":2,')
    assert SweepStore(tmp_path).load().tasks[0].state == "COMPLETED"


def test_status_reads_the_counts_and_first_rows_without_the_records(tmp_path: Path, journaled: None) -> None:
    store = new_sweep(tmp_path, 3000, done=1500)
    with store.edit() as state:
        state.tasks[1600].state = "RUNNING"
        state.tasks[10].state, state.tasks[10].error = "FAILED", "FAILED: boom"
        state.tasks.append(TaskRecord(3000, ["x=3000", "model=big", "optim.lr=0.1"], state=WAITING))
        state.held_back = "a submit limit"
    full = SweepStore(tmp_path).load()
    scan = SweepStore(tmp_path).scan()
    assert scan.counts() == full.counts() and scan.total == 3001 and scan.state.held_back == "a submit limit"
    shown = sorted(full.tasks, key=lambda t: (t.state == "COMPLETED", t.index))[:40]
    assert [task_json(t) for t in scan.page(40)] == [task_json(t) for t in shown]
    assert scan.page(40)[0].index == 10 and scan.page(40)[0].error == "FAILED: boom"
    assert [task_json(t) for t in scan.tasks()] == [task_json(t) for t in full.tasks]
    assert sorted(scan.common_overrides()) == ["model=big", "optim.lr=0.1"]


def test_status_and_status_json_of_a_journaled_sweep(
    tmp_path: Path, journaled: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from slurmagent.cli import main

    store = new_sweep(tmp_path, 300, done=100)
    with store.edit() as state:
        state.tasks[150].state = "RUNNING"
        state.tasks[150].attempts.append(Attempt("9_150", 3.0, "RUNNING", nodes="cpu-1"))
    assert main(["status", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["counts"] == {"COMPLETED": 100, "RUNNING": 1, WAITING: 199} and not data["done"]
    assert len(data["tasks"]) == 300 and data["tasks"][150]["job_id"] == "9_150"
    assert data["tasks"][150]["attempts"][0]["nodes"] == "cpu-1" and data["tasks"][150]["runs"] == 1
    assert main(["status", str(tmp_path), "--rows", "3"]) == 0
    out = capsys.readouterr().out
    assert "100 COMPLETED, 1 RUNNING, 199 WAITING (of 300)" in out and "297 more rows" in out
    assert "x=100" in out and "model=big" not in out  # the overrides every task shares are not repeated


def test_an_edit_that_raises_writes_nothing_and_is_read_again(tmp_path: Path, journaled: None) -> None:
    store = new_sweep(tmp_path, 400)
    with pytest.raises(RuntimeError), store.edit() as state:
        state.tasks[0].state = "COMPLETED"
        raise RuntimeError("boom")
    assert store.view().tasks[0].state == WAITING and SweepStore(tmp_path).load().tasks[0].state == WAITING


def test_a_follower_reads_only_what_was_appended_and_survives_compactions(tmp_path: Path, journaled: None) -> None:
    writer, follower = new_sweep(tmp_path, 2000), SweepStore(tmp_path)
    first = follower.view()
    for k in range(5):
        with writer.edit() as state:
            state.tasks[k].state = "RUNNING"
        assert follower.view() is first and first.tasks[k].state == "RUNNING"  # the same object, brought up to date
    writer.compact()
    with writer.edit() as state:
        state.tasks[5].state = "RUNNING"
    assert [t.state for t in follower.view().tasks[:7]] == ["RUNNING"] * 6 + [WAITING]
    # the follower takes the lead: it edits from what it read, and the writer sees that
    with follower.edit() as state:
        state.tasks[6].state = "RUNNING"
    assert writer.view().tasks[6].state == "RUNNING"
    assert as_plain(SweepStore(tmp_path).load()) == as_plain(writer.view())


WRITER = """
import sys, time
sys.path.insert(0, {root!r})
from slurmagent.supervise import state as state_mod
from slurmagent.supervise.state import SweepStore
state_mod.COMPACT_BELOW = 0
state_mod.JOURNAL_RATIO = 0.05  # compacted every few edits: readers meet both
store = SweepStore({sweep!r})
for k in range({edits}):
    with store.edit() as state:
        for j in range(k % 7 + 1):  # changes of different sizes, each edit one commit
            t = state.tasks[(k * 7 + j) % len(state.tasks)]
            t.state, t.result = "COMPLETED", k
        state.held_back = str(k)
print("done", flush=True)
"""


def test_a_reader_while_a_writer_writes_always_sees_one_committed_edit(tmp_path: Path) -> None:
    """A writer in another process edits as fast as it can, appending and compacting; readers
    without the lock (a fresh load, a follower's view, status's scan) each see the state after
    one whole edit: the edit number in the header and every task's result agree."""
    n, edits = 600, 300
    new_sweep(tmp_path, n)
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER.format(root=str(ROOT), sweep=str(tmp_path), edits=edits)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def expected(k: int) -> dict[int, int]:
        out: dict[int, int] = {}
        for e in range(k + 1):
            for j in range(e % 7 + 1):
                out[(e * 7 + j) % n] = e
        return out

    follower = SweepStore(tmp_path)
    reads, seen = 0, set()
    try:
        while writer.poll() is None or reads < 3:
            for state in (SweepStore(tmp_path).load(), follower.view()):
                k = int(state.held_back or -1)
                want = expected(k)
                assert {t.index: t.result for t in state.tasks if t.result is not None} == want, k
                assert all((t.state == "COMPLETED") == (t.index in want) for t in state.tasks)
                reads += 1
                seen.add(k)
            scan = SweepStore(tmp_path).scan()
            k = int(scan.state.held_back or -1)
            assert scan.counts().get("COMPLETED", 0) == len(expected(k)) and scan.total == n
            if writer.poll() is not None:
                break
    finally:
        out, err = writer.communicate(timeout=120)
    assert writer.returncode == 0 and "done" in out, err
    final = SweepStore(tmp_path).load()
    assert final.held_back == str(edits - 1) and reads > 3
    assert len(seen) > 2, seen  # the readers met the writer mid-way, not only before and after


def test_results_that_are_not_json_are_stored_as_text(tmp_path: Path, journaled: None) -> None:
    store = new_sweep(tmp_path, 10)
    with store.edit() as state:
        state.tasks[0].state, state.tasks[0].result = "COMPLETED", {1, 2}
    assert SweepStore(tmp_path).load().tasks[0].result == "{1, 2}"


def test_the_launchers_state_is_not_read_again_after_creating_it(tmp_path: Path, journaled: None) -> None:
    """The launcher creates the sweep and edits it at once: the state it holds is the one it
    edits (a 100,000-task sweep is not parsed back), unless someone else changed it between."""
    store = new_sweep(tmp_path, 100)
    held = store.view()
    with store.edit() as state:
        assert state is held
    with SweepStore(tmp_path).edit() as other:  # another process
        other.tasks[3].state = "CANCELLED"
    with store.edit() as state:  # what it appended is read, nothing more
        assert state is held and state.tasks[3].state == "CANCELLED"
    SweepStore(tmp_path).compact()  # another process rewrote sweep.json: read again
    with store.edit() as state:
        assert state is not held and state.tasks[3].state == "CANCELLED"
