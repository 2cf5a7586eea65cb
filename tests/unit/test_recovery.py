"""Diagnosis on recorded logs, the recovery plan's rules, and the action gate's audit trail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurmagent.config import JobSpec, job_spec
from slurmagent.records import Action, Evidence
from slurmagent.recovery import Resubmit, Stop, diagnose, plan
from slurmagent.safety.audit import AuditLog
from slurmagent.safety.gate import Gate
from slurmagent.slurm.cluster import parse_cluster
from slurmagent.slurm.seam import parse_scontrol_config

LOGS = Path(__file__).resolve().parent.parent / "data" / "logs"


def logs(name: str) -> dict[str, str]:
    return {name: (LOGS / name).read_text()}


@pytest.mark.parametrize(
    ("state", "name", "cause", "retryable", "line"),
    [
        ("FAILED", "gpu_oom.err", "gpu_oom", True, 4),
        ("OUT_OF_MEMORY", "host_oom.err", "host_oom", True, 2),
        ("TIMEOUT", "time_limit.err", "time_limit", True, 1),
        ("PREEMPTED", "preempted.err", "preempted", True, 1),
        ("FAILED", "cuda_illegal.err", "cuda_illegal_address", True, 4),
        ("FAILED", "ecc.err", "ecc_error", True, 1),
        ("FAILED", "nccl_timeout.err", "nccl_timeout", True, 1),
        ("FAILED", "xid.log", "xid", True, 1),
        ("FAILED", "missing_module.err", "missing_module", False, 5),
        ("FAILED", "missing_path.err", "missing_path", False, 4),
        ("FAILED", "controller_down.err", "controller_unreachable", True, 1),
    ],
)
def test_diagnosis_names_cause_and_evidence_line(state: str, name: str, cause: str, retryable: bool, line: int) -> None:
    d = diagnose(state, logs(name))
    assert (d.cause, d.retryable) == (cause, retryable)
    ev = [e for e in d.evidence if e.source == name]
    assert ev and ev[0].line == line


def test_diagnosis_sentences_name_the_specifics() -> None:
    assert "'/data/train/labels.csv'" in diagnose("FAILED", logs("missing_path.err")).summary
    assert "transformers_that_is_missing" in diagnose("FAILED", logs("missing_module.err")).summary
    assert "2.00 GiB" in diagnose("FAILED", logs("gpu_oom.err")).summary
    crash = diagnose("FAILED", {"err": "Traceback (most recent call last):\n  x\nValueError: bad shape (3, 4)\n"})
    assert crash.cause == "crash" and not crash.retryable and "ValueError: bad shape" in crash.summary
    assert crash.evidence == [Evidence("err", 3, "ValueError: bad shape (3, 4)")]


SINFO = "cpu-1|low|4|3000|(null)|cpu|idle\ncpu-2|low|4|3000|(null)|cpu|idle\na100-1|gpu|4|4000|gpu:a100:2|a100|idle\n"
CLUSTER = parse_cluster(SINFO, "low|2:00:00|low*\ngpu|4:00:00|gpu\n", parse_scontrol_config("MaxArraySize = 1001"))


def spec(**resources: object) -> JobSpec:
    return job_spec({"task": {"target": "a:b"}, "resources": resources, "recovery": {"max_attempts": 3}})


def test_controller_down_resubmits_unchanged() -> None:
    d = diagnose("FAILED", logs("controller_down.err"))
    step = plan(spec(mem="1G"), 1, d, "cpu-1", CLUSTER)
    assert isinstance(step, Resubmit) and step.resources == spec(mem="1G").resources and step.changes == {}


def test_host_oom_grows_memory_up_to_the_largest_node() -> None:
    d = diagnose("OUT_OF_MEMORY", logs("host_oom.err"))
    step = plan(spec(mem="1G"), 1, d, "cpu-1", CLUSTER)
    assert isinstance(step, Resubmit) and step.resources.mem == "1536M" and step.changes == {"mem": ("1G", "1536M")}
    capped = plan(spec(mem="2500M"), 1, d, "cpu-1", CLUSTER)
    assert isinstance(capped, Resubmit) and capped.resources.mem == "3000M"
    at_cap = plan(spec(mem="3000M"), 1, d, "cpu-1", CLUSTER)
    assert isinstance(at_cap, Stop) and "the most a node of partition 'low' has" in at_cap.reason


def test_time_limit_extends_within_partition_then_stops() -> None:
    d = diagnose("TIMEOUT", {})
    step = plan(spec(time="00:45:00"), 1, d, "cpu-1", CLUSTER)
    assert isinstance(step, Resubmit) and step.resources.time == "01:30:00"
    step = plan(spec(time="01:30:00"), 1, d, "cpu-1", CLUSTER)
    assert isinstance(step, Resubmit) and step.resources.time == "02:00:00"
    assert isinstance(plan(spec(time="02:00:00"), 1, d, "cpu-1", CLUSTER), Stop)


def test_node_failure_excludes_node_and_gpu_errors_only_on_repeat() -> None:
    step = plan(spec(), 1, diagnose("NODE_FAIL", {}), "cpu-1", CLUSTER)
    assert isinstance(step, Resubmit) and step.resources.exclude == "cpu-1"
    nccl = diagnose("FAILED", logs("nccl_timeout.err"))
    once = plan(spec(), 1, nccl, "cpu-2", CLUSTER, suspect_nodes={})
    assert isinstance(once, Resubmit) and once.resources.exclude is None
    twice = plan(spec(exclude="cpu-1"), 2, nccl, "cpu-2", CLUSTER, suspect_nodes={"cpu-2": 1})
    assert isinstance(twice, Resubmit) and twice.resources.exclude == "cpu-1,cpu-2"


def test_bounds_and_non_retryable_causes_stop() -> None:
    d = diagnose("NODE_FAIL", {})
    stop = plan(spec(), 3, d, "cpu-1", CLUSTER)
    assert isinstance(stop, Stop) and "gave up after 3 attempt(s) (recovery.max_attempts=3)" in stop.reason
    missing = plan(spec(), 1, diagnose("FAILED", logs("missing_path.err")), "cpu-1", CLUSTER)
    assert isinstance(missing, Stop) and "Not retried" in missing.reason and "/data/train/labels.csv" in missing.reason


def test_a_fix_command_for_every_cause_whose_fix_is_a_command() -> None:
    """Diagnosis.fix_command (recovery/plan.fix_command): the task launched again with what
    recovery would change, every resource it changed so far kept; pip for a missing module;
    none where the fix is not a command. Its overrides read back through Hydra's own parser."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from slurmagent.recovery.plan import fix_command

    task = ["+experiment=digits", "optim.lr=0.1", "resources.mem=1G"]
    oom = fix_command(diagnose("OUT_OF_MEMORY", logs("host_oom.err")), spec(mem="1G"), task, "cpu-1", CLUSTER, "py")
    assert oom == "py -m slurmagent +experiment=digits optim.lr=0.1 resources.mem=1536M -m"
    # a task recovery had moved off two nodes and given more time, then gave up on: both kept
    moved = spec(mem="2G", exclude="a100-1,cpu-2", time="01:00:00")
    timeout = fix_command(diagnose("TIMEOUT", {}), moved, task, "cpu-1", CLUSTER, "py")
    assert timeout is not None
    argv = timeout.split(" ")
    assert argv[:5] == ["py", "-m", "slurmagent", "+experiment=digits", "optim.lr=0.1"] and argv[-1] == "-m"
    assert "resources.mem=1G" not in argv and "resources.mem=2G" in argv and "resources.time=02:00:00" in argv
    parsed = OverridesParser.create().parse_overrides([a.strip("'") for a in argv[3:-1] if "exclude" not in a])
    assert {o.key_or_group: o.value() for o in parsed}["resources.time"] == "02:00:00"
    (exclude,) = [a for a in argv if "exclude" in a]  # quoted for Hydra (a comma sweeps under -m) and the shell
    assert exclude == "'resources.exclude=\"a100-1,cpu-2\"'"
    (o,) = OverridesParser.create().parse_overrides([exclude.strip("'")])
    assert o.value() == "a100-1,cpu-2" and not o.is_sweep_override()
    node = fix_command(diagnose("NODE_FAIL", {}), spec(), [], "cpu-1", CLUSTER, "py")
    assert node == "py -m slurmagent resources.exclude=cpu-1 -m"
    missing = diagnose("FAILED", logs("missing_module.err"))
    assert fix_command(missing, spec(), task, "cpu-1", CLUSTER, "/venv/bin/python") == (
        "/venv/bin/python -m pip install transformers_that_is_missing"
    )
    for not_a_command in ("missing_path.err", "cuda_illegal.err"):  # a bad path; a retry unchanged
        assert fix_command(diagnose("FAILED", logs(not_a_command)), spec(), task, "cpu-1", CLUSTER, "py") is None
    at_cap = fix_command(diagnose("OUT_OF_MEMORY", {}), spec(mem="3000M"), task, "cpu-1", CLUSTER, "py")
    assert at_cap is None  # no node has more memory: no command fixes it


def test_gate_records_decision_and_outcome_with_hash_chain(tmp_path: Path) -> None:
    audit = AuditLog(tmp_path / "audit.jsonl")
    calls: list[Action] = []

    def resubmit(action: Action) -> dict[str, object]:
        calls.append(action)
        return {"job_id": "99"}

    gate = Gate(audit, {"resubmit": resubmit})
    ev = [Evidence("7_0_0_log.err", 2, "Detected 1 oom-kill event(s)")]
    out = gate.request(Action("resubmit", "7_0", "host OOM", {"mem": "1536M"}, ev, {"mem": "1G"}))
    assert out.executed and out.result == {"job_id": "99"} and len(calls) == 1
    denied = gate.request(Action("cancel", "7_1", "test"))
    assert not denied.executed and denied.decision.verdict == "deny"
    recs = audit.records()
    assert [r["type"] for r in recs] == ["decision", "outcome", "decision"]
    assert recs[0]["evidence"][0]["line"] == 2 and recs[1]["metrics_after"] == {"job_id": "99"}
    assert recs[1]["prev"] == recs[0]["hash"] and recs[2]["prev"] == recs[1]["hash"]
    with pytest.raises(Exception, match="unknown action kind 'reboot'"):
        Action("reboot", "cpu-1", "x")
    assert json.loads((tmp_path / "audit.jsonl").read_text().splitlines()[0])["user"]
