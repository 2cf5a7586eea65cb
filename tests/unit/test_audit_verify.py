"""`slurmagent audit verify` names each kind of tampering; `audit show` filters a table."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from slurmagent.cli import main
from slurmagent.safety.audit import AuditLog, record_hash


@pytest.fixture()
def log(tmp_path: Path) -> Path:
    audit = AuditLog(tmp_path / "audit.jsonl")
    for i in range(6):
        kind = ("resubmit", "cancel")[i % 2]
        audit.append(
            {
                "type": "decision",
                "job": f"10_{i}",
                "action": kind,
                "decision": ("allow", "deny")[i % 2],
                "reason": f"r{i}",
            }
        )
    return audit.path


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines(keepends=True)


def edit_reason(path: Path) -> None:
    ls = lines(path)
    rec = json.loads(ls[2])
    rec["reason"] = "nothing to see"
    ls[2] = json.dumps(rec) + "\n"
    path.write_text("".join(ls))


def edit_and_rehash(path: Path) -> None:
    ls = lines(path)
    rec = json.loads(ls[2])
    rec["decision"] = "deny"
    rec["hash"] = record_hash(rec)
    ls[2] = json.dumps(rec) + "\n"
    path.write_text("".join(ls))


def delete_third(path: Path) -> None:
    ls = lines(path)
    del ls[2]
    path.write_text("".join(ls))


def swap_third_fourth(path: Path) -> None:
    ls = lines(path)
    ls[2], ls[3] = ls[3], ls[2]
    path.write_text("".join(ls))


def drop_last_two(path: Path) -> None:
    path.write_text("".join(lines(path)[:-2]))


def delete_first(path: Path) -> None:
    path.write_text("".join(lines(path)[1:]))


def forge_at_end(path: Path) -> None:
    last = json.loads(lines(path)[-1])
    fake = {**last, "seq": last["seq"] + 1, "job": "10_9", "reason": "forged", "prev": last["hash"]}
    fake["hash"] = record_hash(fake)
    path.write_text(path.read_text() + json.dumps(fake) + "\n")


def cut_mid_record(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 40])


@pytest.mark.parametrize(
    ("tamper", "expected"),
    [
        (edit_reason, "edited: record seq 3 (line 3) was edited"),
        (edit_and_rehash, "edited: record seq 3 was rewritten (its hash recomputed): record seq 4 (line 4)"),
        (delete_third, "deleted: seq 3 deleted: record seq 4 (line 3) follows seq 2 directly"),
        (swap_third_fourth, "reordered: record seq 3 (line 4) is out of order: it comes after seq 4"),
        (drop_last_two, "truncated: truncated: seq 5..6 missing at the end (the log ends at seq 4)"),
        (cut_mid_record, "truncated: line 6: cut off in the middle"),
        (delete_first, "deleted: seq 1 deleted: record seq 2 (line 1) is the first record"),
        (forge_at_end, "edited: seq 7 added at the end by something other than slurmagent (the head says seq 6)"),
    ],
)
def test_verify_names_the_tampered_record(
    log: Path, tamper: Callable[[Path], None], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", "verify", str(log)]) == 0
    assert "6 record(s), hash chain intact" in capsys.readouterr().out
    tamper(log)
    assert main(["audit", "verify", str(log)]) == 1
    out = capsys.readouterr().out
    assert expected in out, out
    kinds = {ln.split(": ")[1] for ln in out.splitlines()}
    assert kinds == {expected.split(":")[0]}, out  # named as what it is, and nothing else


def test_appending_after_tampering_is_refused_cleanly_and_missing_log_is_bad_input(
    log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cut_mid_record(log)
    with pytest.raises(Exception, match="last record is not valid JSON"):
        AuditLog(log).append({"type": "decision"})
    assert main(["audit", "verify", str(log.parent / "nope.jsonl")]) == 2
    assert "no such audit log" in capsys.readouterr().err


def test_show_filters_by_job_action_decision_and_time(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "show", str(log), "--action", "cancel", "--json"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["job"] for r in rows] == ["10_1", "10_3", "10_5"]
    assert main(["audit", "show", str(log), "--job", "10_2", "--decision", "allow", "--json"]) == 0
    assert [json.loads(x)["seq"] for x in capsys.readouterr().out.splitlines()] == [3]
    assert main(["audit", "show", str(log), "--since", "1h", "--decision", "deny"]) == 0
    table = capsys.readouterr().out
    assert "3 of 6 record(s)" in table and "10_5" in table and "10_4" not in table
    assert main(["audit", "show", str(log), "--since", "2999-01-01T00:00", "--json"]) == 0
    assert capsys.readouterr().out == ""
    assert main(["audit", "show", str(log), "--since", "yesterday"]) == 2
    assert "--since 'yesterday' is not a time" in capsys.readouterr().err
