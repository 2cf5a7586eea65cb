"""The action gate with its policy (conf/policy/*.yaml), the kill switch and approvals,
in one process: real files, real audit logs."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from slurmagent.errors import ApprovalError, PolicyError
from slurmagent.records import Action, Evidence
from slurmagent.safety.audit import AuditLog, verify
from slurmagent.safety.gate import Gate
from slurmagent.safety.policy import load_policy, policy_names, resolve_policy
from slurmagent.safety.switch import pause, paused, resume

# the per-user audit log, the user-wide kill switch and the policy: inside the test directory
pytestmark = pytest.mark.usefixtures("own_state_dir")


def act(kind: str, **context: Any) -> Action:
    return Action(kind, "7_0", f"test {kind}", context=context)


@pytest.mark.parametrize(
    ("kind", "context", "verdict", "approvals", "rule"),
    [
        ("resubmit", {"attempt": 1}, "allow", 0, "default:resubmit-within-bounds"),
        ("resubmit", {"attempt": 12}, "needs_approval", 1, "default:resubmit-runaway"),
        ("requeue", {}, "allow", 0, "default:requeue"),
        ("cancel", {"run_time_s": 49 * 3600}, "needs_approval", 2, "default:cancel-long-running"),
        ("cancel", {"run_time_s": 3600, "qos": "high"}, "needs_approval", 2, "default:cancel-high-priority"),
        ("cancel", {"run_time_s": 3600, "qos": "normal"}, "deny", 0, "default:default-deny"),
        ("drain_node", {"source": "health_check:CRITICAL"}, "allow", 0, "default:drain-critical-health"),
        ("drain_node", {"source": "health_check:WARNING"}, "needs_approval", 1, "default:drain-node"),
        ("delete_checkpoint", {}, "needs_approval", 1, "default:delete-checkpoint"),
    ],
)
def test_default_policy_maps_kind_and_context(
    kind: str, context: dict[str, Any], verdict: str, approvals: int, rule: str
) -> None:
    d = load_policy("default").decide(act(kind, **context))
    assert (d.verdict, d.approvals) == (verdict, approvals)
    assert d.rule.startswith(rule)


def test_strict_policy_is_stricter_and_policies_load_from_paths(tmp_path: Path) -> None:
    assert {"default", "strict"} <= set(policy_names())
    strict = load_policy("strict")
    more_mem = Action("resubmit", "7_0", "oom", params={"mem": ["1G", "2G"]}, context={"attempt": 1})
    assert strict.decide(more_mem).verdict == "needs_approval"
    assert load_policy("default").decide(more_mem).verdict == "allow"
    custom = tmp_path / "mine.yaml"
    custom.write_text("name: mine\nrules:\n  - {name: only-requeue, action: requeue, decision: allow}\n")
    mine = load_policy(custom, ["approval_ttl_s=60"])
    assert mine.approval_ttl_s == 60 and mine.decide(act("requeue")).rule == "mine:only-requeue"
    assert mine.decide(act("resubmit")).verdict == "deny"  # anything not listed is denied


@pytest.mark.parametrize(
    ("yaml", "message"),
    [
        ("name: x\nrules:\n  - {name: a, action: reboot, decision: allow}\n", "action='reboot' is not one of"),
        ("name: x\nrules:\n  - {name: a, action: cancel, decision: maybe}\n", "decision='maybe' is not one of allow"),
        ("name: x\nrules:\n  - {name: a, action: cancel, decision: needs_approval}\n", "at least 1 approval"),
        ("name: x\nrules:\n  - {name: a, action: cancel, decision: allow, when: {qos: hi}}\n", "unknown key"),
        ("name: x\nrulez: []\n", "unknown key policy.rulez"),
    ],
)
def test_bad_policy_is_refused_naming_the_key(tmp_path: Path, yaml: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml)
    with pytest.raises(PolicyError, match=message):
        load_policy(path)
    with pytest.raises(PolicyError, match="valid names: default, strict"):
        load_policy("nonexistent")


def test_sweep_policy_file_and_environment_choose_the_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_policy(tmp_path).name == "default"
    monkeypatch.setenv("SLURMAGENT_POLICY", "strict")
    assert resolve_policy(tmp_path).name == "strict"
    # the Hydra config group: `+policy=strict` on the command line, kept in multirun.yaml
    from omegaconf import OmegaConf

    from slurmagent.render import compose

    monkeypatch.setenv("SLURMAGENT_POLICY", "default")
    cfg = compose(["+experiment=synthetic", "+policy=strict", "policy.approval_ttl_s=60"])
    assert cfg.policy.name == "strict"
    OmegaConf.save(cfg, tmp_path / "multirun.yaml")
    chosen = resolve_policy(tmp_path)
    assert chosen.name == "strict" and chosen.approval_ttl_s == 60
    (tmp_path / "policy.yaml").write_text("name: pinned\nrules: []\n")
    assert resolve_policy(tmp_path).name == "pinned"


def test_gate_records_rule_evidence_and_user_copy(tmp_path: Path, own_state_dir: Path) -> None:
    sweep = tmp_path / "sweep"
    calls: list[Action] = []
    gate = Gate(AuditLog(sweep / "audit.jsonl"), {"resubmit": lambda a: calls.append(a) or {"job_id": "8"}})
    ev = [Evidence("7_0_log.err", 3, "Detected 1 oom-kill event(s)")]
    out = gate.request(Action("resubmit", "7_0", "oom", {"mem": ["1G", "2G"]}, ev, {"state": "OOM"}, {"attempt": 1}))
    assert out.executed and out.result == {"job_id": "8"} and len(calls) == 1
    denied = gate.request(act("cancel", run_time_s=10))
    assert not denied.executed and denied.decision.verdict == "deny" and "default-deny" in denied.decision.rule
    recs = AuditLog(sweep / "audit.jsonl").records()
    assert [(r["type"], r["decision"]) for r in recs] == [
        ("decision", "allow"),
        ("outcome", "allow"),
        ("decision", "deny"),
    ]
    assert recs[0]["rule"] == "default:resubmit-within-bounds" and recs[0]["evidence"][0]["line"] == 3
    assert recs[1]["metrics_after"] == {"job_id": "8"} and recs[1]["metrics_before"] == {"state": "OOM"}
    assert [r["seq"] for r in recs] == [1, 2, 3] and verify(sweep / "audit.jsonl") == []
    mine = AuditLog(own_state_dir / "audit.jsonl").records()  # the per-user log has the same records
    assert [(r["action"], r["decision"], r["sweep"]) for r in mine] == [
        (r["action"], r["decision"], str(sweep)) for r in recs
    ]


def test_kill_switch_holds_every_action_until_resume(tmp_path: Path, own_state_dir: Path) -> None:
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    ran: list[str] = []
    gate = Gate(AuditLog(sweep / "audit.jsonl"), {"requeue": lambda a: ran.append(a.target) or {}})
    pause(sweep, "maintenance")
    held = gate.request(act("requeue"))
    assert held.held and not held.executed and ran == [] and held.decision.verdict == "held"
    assert "maintenance" in held.decision.rule
    assert resume(sweep) is not None and paused(sweep) is None
    pause(None)  # the user-wide switch holds every sweep, this one too
    assert gate.request(act("requeue")).held and ran == []
    resume(None)
    assert gate.request(act("requeue")).executed and ran == ["7_0"]
    decisions = [r["decision"] for r in AuditLog(sweep / "audit.jsonl").records() if r["type"] == "decision"]
    assert decisions == ["held", "held", "allow"]
    assert resume(None) is None  # nothing left to lift


def test_needs_approval_files_a_request_the_requester_cannot_approve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep = tmp_path / "sweep"
    monkeypatch.chdir(tmp_path)
    ran: list[str] = []
    gate = Gate(
        AuditLog(Path("sweep") / "audit.jsonl"),  # relative: the request must still name it absolutely
        {"delete_checkpoint": lambda a: ran.append(a.target) or {}},
        policy=load_policy("default", ["approval_ttl_s=0.3"]),
    )
    out = gate.request(act("delete_checkpoint"))
    assert out.approval_id and not out.executed and ran == []
    st = gate.approvals.status(out.approval_id)
    assert st.state == "pending" and st.request.approvals == 1
    assert (sweep / "approvals").stat().st_mode & 0o1777 == 0o1777  # sticky and shared, like /tmp
    with pytest.raises(ApprovalError, match="cannot approve it"):
        gate.approvals.vote(out.approval_id, "approve")
    assert gate.run_approved(out.approval_id).executed is False and ran == []
    time.sleep(0.4)
    assert gate.approvals.status(out.approval_id).state == "expired"
    with pytest.raises(ApprovalError, match="is expired"):
        gate.approvals.vote(out.approval_id, "reject")
    with pytest.raises(ApprovalError, match="known ids"):
        gate.approvals.status("deadbeef")
    rec = AuditLog(sweep / "audit.jsonl").records()[0]
    assert rec["decision"] == "needs_approval" and rec["approval_id"] == out.approval_id
    request = json.loads((sweep / "approvals" / f"{out.approval_id}.json").read_text())
    assert request["approvals"] == 1 and request["audit"] == str(sweep / "audit.jsonl")


def test_a_gate_built_in_a_job_honours_its_sweeps_switch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the runtime does before `scontrol requeue`: a Gate from the job's context, its
    audit path in the sweep directory it reads from SLURMAGENT_SWEEP_DIR."""
    from slurmagent.runtime.context import context_from_env

    sweep = tmp_path / "sweep"
    sweep.mkdir()
    monkeypatch.setenv("SLURMAGENT_SWEEP_DIR", str(sweep))
    ctx = context_from_env(output_dir=sweep / "0", checkpoint_dir=sweep / "0" / "checkpoints")
    assert ctx.sweep_dir == sweep
    requeued: list[str] = []
    gate = Gate(
        AuditLog(ctx.sweep_dir / "audit.jsonl"), {"requeue": lambda a: requeued.append(a.target) or {}}, job="5_1"
    )
    action = Action("requeue", "5_1", "signal checkpoint at step 40", context={"attempt": 2, "source": "runtime"})
    pause(sweep)
    assert gate.request(action).held and requeued == []
    resume(sweep)
    assert gate.request(action).executed and requeued == ["5_1"]
    recs = AuditLog(sweep / "audit.jsonl").records()
    assert [(r["job"], r["decision"]) for r in recs] == [("5_1", "held"), ("5_1", "allow"), ("5_1", "allow")]
