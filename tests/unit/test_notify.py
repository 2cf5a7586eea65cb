"""Notifications (notify.*): each event of a sweep told once per channel, through a real HTTP
receiver and a real SMTP server on loopback; an outage retried with back-off; a successor (a
supervisor after its requeue) sending nothing twice; the webhook's URL, given through the
environment, in no file of the sweep. The cluster test (tests/slurm/test_notify_slurm.py)
requeues the supervisor job itself."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from slurmagent.commands import slurmagent_command
from slurmagent.config.notify import NotifyConf, notify_conf
from slurmagent.errors import ConfigError
from slurmagent.notify.message import Event
from slurmagent.notify.outbox import GIVEN_UP, LEDGER, SENDING, Outbox, read_ledger
from slurmagent.safety.approvals import ApprovalStore
from slurmagent.slurm.seam import SlurmCLI
from slurmagent.supervise.notices import Notices
from slurmagent.supervise.recover import Recoverer
from tests.conftest import WebhookReceiver, files_holding
from tests.unit.test_safety_recovery import oom_state

HOOK_ENV = "SLURMAGENT_TEST_HOOK"


def event(n: int, kind: str = "sweep_finished") -> Event:
    return Event(
        f"{kind}/{n}", kind, "/sweeps/x", f"event {n}", [f"line {n}", "$ slurmagent status /sweeps/x"], {"n": n}
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"webhook": {"url": "https://hooks.example/T/B/x"}}, "never written in a config.*url_env=NAME"),
        ({"email": {"to": ["a@b.c"], "password": "pw"}}, "password_env=NAME"),
        ({"events": ["task_failed", "task_done"]}, "'task_done' is not an event; valid events: approval_needed"),
        ({"webhook": {"url_env": "A B"}}, "not an environment variable's name"),
        ({"webhook": {"url_env": "X", "format": "xml"}}, "notify.webhook.format='xml' is not one of json, slack"),
        ({"email": {"to": ["not-an-address"]}}, "'not-an-address' is not an e-mail address"),
        ({"email": {"to": ["a@b.c"], "via": "pigeon"}}, "notify.email.via='pigeon' is not one of sendmail, smtp"),
        ({"webhook": {"url_env": "X", "retries": 3}}, "unknown key notify.webhook.retries"),
    ],
)
def test_bad_notify_settings_name_the_key_and_the_choices(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        notify_conf(raw)


def test_a_webhook_secret_is_checked_at_submission_and_never_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(HOOK_ENV, raising=False)
    conf = {"webhook": {"url_env": HOOK_ENV}}
    assert notify_conf(conf).channels == ["webhook"]  # the supervisor reads the variable when it sends
    with pytest.raises(ConfigError, match=f"\\${HOOK_ENV} is not set"):
        notify_conf(conf, check_secrets=True)
    monkeypatch.setenv(HOOK_ENV, "ftp://secret-host/x")
    with pytest.raises(ConfigError, match="is not an http\\(s\\) URL") as caught:
        notify_conf(conf, check_secrets=True)
    assert "secret-host" not in str(caught.value)
    (tmp_path / "hook").write_text("https://hooks.example/T/B/x\n")
    assert notify_conf({"webhook": {"url_file": str(tmp_path / "hook")}}, check_secrets=True).webhook.on


def test_each_event_is_sent_once_an_outage_is_retried_and_the_url_is_never_written(
    tmp_path: Path, webhook: WebhookReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(HOOK_ENV, webhook.url)
    clock = Clock()
    conf = notify_conf({"webhook": {"url_env": HOOK_ENV, "format": "json"}, "max_tries": 3})
    box = Outbox(tmp_path, conf, clock=clock)
    assert box.offer([event(1), event(2)]) == 2
    assert box.send_due() == 2
    assert [p["json"]["id"] for p in webhook.posts] == ["sweep_finished/1", "sweep_finished/2"]
    assert webhook.posts[0]["headers"]["Idempotency-Key"] == "sweep_finished/1"
    assert webhook.posts[0]["json"]["n"] == 1 and "$ slurmagent status /sweeps/x" in webhook.posts[0]["json"]["text"]
    # offered again (the next poll derives the same events): nothing is sent twice
    assert box.offer([event(1), event(2)]) == 0 and box.send_due() == 0 and len(webhook.posts) == 2

    webhook.stop()  # the receiver goes away: connections refused
    box.offer([event(3)])
    assert box.send_due() == 0
    (left,) = box.unsent()
    assert (left.event, left.state, left.tries) == ("sweep_finished/3", "pending", 1)
    assert "Connection refused" in left.error
    assert box.send_due() == 0 and box.unsent()[0].tries == 1  # not due again yet: 2 s of back-off
    webhook.start()
    clock.now += 2.0
    assert box.send_due() == 1 and [p["json"]["id"] for p in webhook.posts][-1] == "sweep_finished/3"

    webhook.status = 503  # up, but failing: given up after max_tries, and said so
    box.offer([event(4)])
    for _ in range(3):
        box.send_due()
        clock.now += 300
    (left,) = box.unsent()
    assert (left.state, left.tries) == (GIVEN_UP, 3) and "HTTP 503" in left.error
    assert files_holding(tmp_path, webhook.url) == [] and files_holding(tmp_path, "s3cr3t") == []


def test_a_successor_resends_only_a_message_caught_mid_send_with_the_same_id(
    tmp_path: Path, webhook: WebhookReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A supervisor killed between marking a message `sending` and `sent` (a requeue in the
    middle of a POST): its successor sends that one again — with the same Idempotency-Key — and
    nothing else."""
    monkeypatch.setenv(HOOK_ENV, webhook.url)
    conf = notify_conf({"webhook": {"url_env": HOOK_ENV}})
    first = Outbox(tmp_path, conf)
    first.offer([event(1), event(2)])
    first.send_due()
    ledger = read_ledger(tmp_path)
    ledger["sweep_finished/2"]["channels"]["webhook"]["state"] = SENDING  # as a kill mid-send leaves it
    (tmp_path / LEDGER).write_text(json.dumps(ledger))
    successor = Outbox(tmp_path, conf)
    successor.offer([event(1), event(2)])
    assert successor.send_due() == 1
    assert [p["headers"]["Idempotency-Key"] for p in webhook.posts] == [
        "sweep_finished/1",
        "sweep_finished/2",
        "sweep_finished/2",
    ]
    assert webhook.posts[-1]["json"] == {"text": "*event 2*\nline 2\n`slurmagent status /sweeps/x`"}  # Slack's form


def test_a_recovery_waiting_for_approval_then_rejected_tells_the_approvers_then_the_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, webhook: WebhookReceiver
) -> None:
    monkeypatch.setenv("SLURMAGENT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("SLURMAGENT_POLICY", raising=False)
    monkeypatch.setenv(HOOK_ENV, webhook.url)
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "policy.yaml").write_text(
        "name: test\napproval_ttl_s: 600\napprovers: [alice, bob@example.org]\nrules:\n"
        "  - {name: more-memory, action: resubmit, decision: needs_approval, approvals: 1}\n"
    )
    state, task = oom_state(sweep)
    rec = Recoverer(sweep, SlurmCLI())
    rec.handle(state, task)
    approval = rec.held()["0"]["approval_id"]
    notices = Notices(sweep, notify_conf({"webhook": {"url_env": HOOK_ENV}}))
    held = {int(k) for k in rec.held()}
    (asked,) = notices.events(state, held)  # the task waits for approval: not given up
    assert asked.id == f"approval_needed/{approval}" and asked.to == ["alice", "bob@example.org"]
    approve = slurmagent_command("approve", approval, "--sweep", sweep)
    assert f"$ {approve}" in asked.lines
    assert any(line.startswith("why: ") and "mem" in line for line in asked.lines)
    notices.poll(state, held)
    notices.poll(state, held)  # the next poll: the same approval, not told twice
    (post,) = webhook.posts
    assert post["json"]["text"].startswith("for alice, bob@example.org: *approval needed: resubmit 4242")
    assert f"`{approve}`" in post["json"]["text"]

    ApprovalStore(sweep / "approvals").vote(approval, "reject")
    rec.retry_held(state)
    successor = Notices(sweep, notify_conf({"webhook": {"url_env": HOOK_ENV}}))  # e.g. after a requeue
    successor.poll(state, {int(k) for k in rec.held()})
    assert len(webhook.posts) == 2
    given_up = webhook.posts[1]["json"]["text"]
    assert given_up.startswith("*task 0 failed and was given up after 1 attempt(s) (host_oom)*")
    assert "cause: host_oom: " in given_up and "slurmagent doctor" in given_up


def test_email_goes_through_a_real_smtp_server_to_the_list_and_the_approvers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiosmtpd.controller import Controller
    from aiosmtpd.handlers import Sink

    got: list[Any] = []

    class Keep(Sink):
        async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
            got.append(envelope)
            return "250 OK"

    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    smtp = Controller(Keep(), hostname="127.0.0.1", port=port)
    smtp.start()
    try:
        conf = notify_conf(
            {"email": {"to": ["team@example.org"], "via": "smtp", "smtp_host": "127.0.0.1", "smtp_port": port}}
        )
        box = Outbox(tmp_path, conf)
        ask = Event("approval_needed/abc", "approval_needed", "/s", "approval needed", ["$ slurmagent approve abc"])
        box.offer([event(1), Event(**{**ask.to_json(), "to": ["alice", "bob@example.org"]})])
        assert box.send_due() == 2
    finally:
        smtp.stop()
    assert [sorted(e.rcpt_tos) for e in got] == [["team@example.org"], ["bob@example.org", "team@example.org"]]
    body = got[1].content.decode()
    assert "Subject: [slurmagent] approval needed" in body and "X-Slurmagent-Event: approval_needed/abc" in body
    assert "$ slurmagent approve abc" in body


def test_notifications_off_by_default_and_only_the_chosen_events(tmp_path: Path, webhook: WebhookReceiver) -> None:
    assert NotifyConf().channels == []
    assert Notices.open(tmp_path, {}) is None
    conf = notify_conf({"webhook": {"url_file": str(tmp_path / "hook")}, "events": ["task_given_up"]})
    (tmp_path / "hook").write_text(webhook.url)
    box = Outbox(tmp_path, conf)
    assert box.offer([event(1), event(2, "task_given_up")]) == 1 and box.send_due() == 1
    assert [p["json"]["text"] for p in webhook.posts] == ["*event 2*\nline 2\n`slurmagent status /sweeps/x`"]


USER_TRAIN = """\
def run(cfg):
    if cfg.lr > 1:
        raise FloatingPointError(f"the loss is nan at step 3 (lr={cfg.lr})")
    return {"val_error": cfg.lr / 10}
"""


def test_a_local_sweep_tells_the_webhook_once_per_event_and_writes_its_url_nowhere(
    home: Path, webhook: WebhookReceiver
) -> None:
    """The user's path: their own module, run from their directory with default paths, the
    webhook's URL in their environment. One task fails for good: one message with its cause;
    the sweep ends: one message with the counts, the best result and the report."""
    (home / "mytrain.py").write_text(USER_TRAIN)
    env = {**__import__("os").environ, HOOK_ENV: webhook.url}
    argv = [sys.executable, "-m", "slurmagent", "-m", "cluster=local", "task.target=mytrain:run", "+lr=0.1,5.0"]
    argv += [f"notify.webhook.url_env={HOOK_ENV}"]
    ran = subprocess.run(argv, cwd=home, env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode != 0 and "the loss is nan" in ran.stderr  # the sweep failed: one task did
    (sweep,) = [p for p in home.glob("multirun/*/*") if (p / "sweep.json").is_file()]
    kinds = [p["json"]["text"].split("*")[1] for p in webhook.posts]
    assert kinds == [
        "task 1 failed and was given up after 1 attempt(s) (nan_loss)",
        "sweep finished: 1 of 2 task(s) completed",
    ], kinds
    failed, finished = (p["json"]["text"] for p in webhook.posts)
    assert "FloatingPointError: the loss is nan at step 3 (lr=5.0)" in failed
    assert f"report: {sweep / 'report' / 'index.html'}" in finished and (sweep / "report" / "index.html").exists()
    assert "best: task 0, val_error=0.01" in finished, finished
    assert files_holding(sweep, webhook.url) == [] and files_holding(home, "s3cr3t") == []
    status = subprocess.run([sys.executable, "-m", "slurmagent", "status", str(sweep), "--json"], cwd=home,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert json.loads(status.stdout)["messages_unsent"] == [], status.stdout


def test_a_resubmitted_failure_and_a_spent_budget_are_each_one_event(tmp_path: Path) -> None:
    """From the recovery's own record (history.jsonl) and the budget's mark in the sweep state:
    a failure the gate let resubmit says what changes; the budget says how many tasks never started;
    a successor reading everything again derives the same ids."""
    from slurmagent.supervise.state import Attempt, SweepState, TaskRecord

    state = SweepState(str(tmp_path), "slurm", str(tmp_path / ".submitit"), time.time(), [])
    state.tasks = [
        TaskRecord(0, ["x=1"], [Attempt("7_0", 0, "OUT_OF_MEMORY"), Attempt("9_0", 0, "RUNNING")], "RUNNING"),
        TaskRecord(1, ["x=2"], [], "CANCELLED", error="CANCELLED: not started, the sweep's budget is reached (cost)"),
    ]
    state.schedule["stopped"] = "cost 2.10 of 2.00 spent"
    resubmitted = {
        "index": 0, "job_id": "7_0", "attempt": 1, "plan": "resubmit", "plan_reason": "host OOM: --mem ×1.5",
        "diagnosis": {"cause": "host_oom", "summary": "The job ran out of host memory.",
                      "evidence": [{"source": "/x/7_0_log.err", "line": 3, "text": "oom-kill event"}]},
        "action": {"params": {"mem": ["1G", "1536M"]}}, "decision": {"verdict": "allow"},
    }  # fmt: skip
    denied = {**resubmitted, "index": 1, "decision": {"verdict": "deny"}}
    (tmp_path / "history.jsonl").write_text(json.dumps(resubmitted) + "\n" + json.dumps(denied) + "\n")
    conf = notify_conf({"webhook": {"url_env": HOOK_ENV}})
    first = Notices(tmp_path, conf).events(state, set())
    assert [e.id for e in first] == ["task_failed/0/1", "budget_reached"]
    failed, budget = first
    assert failed.lines[:3] == [
        "cause: host_oom: The job ran out of host memory.",
        "seen: oom-kill event (7_0_log.err:3)",
        "next: resubmitted as attempt 2 with mem 1G → 1536M",
    ]
    assert budget.title == "the sweep's budget is reached: 1 task(s) not started"
    assert [e.id for e in Notices(tmp_path, conf).events(state, set())] == [e.id for e in first]


def test_a_sweep_end_nobody_asked_to_hear_writes_no_report(tmp_path: Path) -> None:
    from slurmagent.supervise.state import Attempt, SweepState, TaskRecord

    state = SweepState(str(tmp_path), "local", str(tmp_path / ".submitit"), time.time(), [], finished_at=time.time())
    state.tasks = [TaskRecord(0, ["x=1"], [Attempt("1", 0, "COMPLETED")], "COMPLETED")]
    conf = notify_conf({"webhook": {"url_env": HOOK_ENV}, "events": ["task_given_up"]})
    assert Notices(tmp_path, conf).events(state, set()) == []
    assert not (tmp_path / "report").exists()  # the report is written for the message only


def test_a_poll_builds_no_message_for_what_the_ledger_holds_nor_for_kinds_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep of 10,000 given-up tasks: the first poll builds their 10,000 messages, the next
    builds none (each id is in the ledger), and with `task_given_up` left out of notify.events
    none is ever built, nor the approvals folder read for `approval_needed` left out."""
    from slurmagent.supervise import notices as module
    from slurmagent.supervise.state import Attempt, SweepState, TaskRecord

    state = SweepState(str(tmp_path), "slurm", str(tmp_path / ".submitit"), time.time(), [])
    state.tasks = [
        TaskRecord(i, [f"x={i}"], [Attempt(f"7_{i}", 0, "FAILED")], "FAILED", error="boom") for i in range(10_000)
    ]
    built: list[int] = []
    real = module.task_given_up
    monkeypatch.setattr(module, "task_given_up", lambda s, t: built.append(t.index) or real(s, t))
    monkeypatch.setenv(HOOK_ENV, "http://127.0.0.1:9/hook")  # nothing is sent here: offered only
    notices = Notices(tmp_path, notify_conf({"webhook": {"url_env": HOOK_ENV}}))
    assert notices.outbox.offer(notices.events(state, set())) == 10_000 and len(built) == 10_000
    assert notices.events(state, set()) == [] and len(built) == 10_000
    read: list[Path] = []
    monkeypatch.setattr(module, "approvals_needed", lambda sweep: read.append(sweep) or [])
    only = Notices(tmp_path / "other", notify_conf({"webhook": {"url_env": HOOK_ENV}, "events": ["budget_reached"]}))
    assert only.events(state, set()) == [] and len(built) == 10_000 and read == []
    # a poll with nothing new neither locks nor reads the ledger (10,000 entries by now)
    monkeypatch.setattr(notices.outbox, "read", lambda: pytest.fail("the ledger was read with nothing to offer"))
    assert notices.outbox.offer([]) == 0
