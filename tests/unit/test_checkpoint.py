from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from slurmagent.config import CheckpointConf
from slurmagent.runtime import CheckpointManager, StepLoop, StopForRequeue, context_from_env


def test_save_restore_keep_last_and_manifest(tmp_path: Path) -> None:
    m = CheckpointManager(tmp_path, keep_last=2)
    for step in (10, 20, 30):
        m.save(step, {"step": step})
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert [e["step"] for e in manifest["checkpoints"]] == [20, 30]
    assert sorted(p.name for p in tmp_path.glob("*.ckpt")) == ["step_0000000020.ckpt", "step_0000000030.ckpt"]
    found = m.latest()
    assert found is not None and found[0].step == 30 and found[1] == {"step": 30}
    assert not list(tmp_path.glob(".*tmp*"))


def test_truncated_newest_falls_back_to_previous(tmp_path: Path) -> None:
    m = CheckpointManager(tmp_path, keep_last=3)
    m.save(1, {"v": 1})
    m.save(2, {"v": 2})
    newest = tmp_path / "step_0000000002.ckpt"
    newest.write_bytes(newest.read_bytes()[:10])
    found = m.latest()
    assert found is not None and found[1] == {"v": 1}


def test_unreadable_manifest_means_fresh_start(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("{not json")
    assert CheckpointManager(tmp_path).latest() is None


class Counter:
    def __init__(self) -> None:
        self.value = 0

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = state["value"]


def test_loop_checkpoints_every_n_and_resumes(tmp_path: Path) -> None:
    ctx = context_from_env({}, output_dir=tmp_path)
    first = Counter()
    loop = StepLoop(ctx, first, total_steps=10, conf=CheckpointConf(every_steps=3), install_signal_handlers=False)
    for step in loop:
        first.value += step
        if step == 7:
            break  # a crash after step 7 ran: the newest checkpoint is after step 6
    second = Counter()
    loop2 = StepLoop(ctx, second, total_steps=10, conf=CheckpointConf(every_steps=3), install_signal_handlers=False)
    for step in loop2:
        second.value += step
    assert loop2.restored_from == 6
    assert second.value == sum(range(10))


def test_signal_sets_flag_and_checkpoint_happens_at_step_boundary(tmp_path: Path) -> None:
    """The handler is called directly: no real signal, no real time."""
    ctx = context_from_env({}, output_dir=tmp_path)
    c = Counter()
    loop = StepLoop(ctx, c, total_steps=100, conf=CheckpointConf(every_steps=0), install_signal_handlers=False)
    with pytest.raises(StopForRequeue) as stop:
        for step in loop:
            c.value += 1
            if step == 4:
                loop.flag.handler(signal.SIGUSR2, None)
                assert not list(tmp_path.glob("checkpoints/*.ckpt"))  # nothing saved inside the handler
    assert stop.value.step == 5 and stop.value.signum == signal.SIGUSR2
    found = loop.manager.latest()
    assert found is not None and found[0].step == 5 and found[1]["state"] == {"value": 5}


def test_sigcont_alone_does_not_stop(tmp_path: Path) -> None:
    ctx = context_from_env({}, output_dir=tmp_path)
    loop = StepLoop(ctx, Counter(), total_steps=3, install_signal_handlers=False)
    for step in loop:
        if step == 0:
            loop.flag.handler(signal.SIGCONT, None)
    assert loop.step == 3


def test_context_from_slurm_environment(tmp_path: Path) -> None:
    env = {
        "SLURM_JOB_ID": "42",
        "SLURM_ARRAY_JOB_ID": "40",
        "SLURM_ARRAY_TASK_ID": "2",
        "SLURM_RESTART_COUNT": "3",
        "SLURMAGENT_ATTEMPT": "1",
        "SLURMAGENT_TASK_INDEX": "2",
        "SLURM_PROCID": "1",
        "SLURM_NTASKS": "4",
    }
    ctx = context_from_env(env, output_dir=tmp_path)
    assert ctx.slurm_requeue_id == "40_2" and ctx.attempt == 4 and ctx.restart_count == 3
    assert ctx.rank == 1 and ctx.world_size == 4 and ctx.backend == "slurm"
    assert ctx.checkpoint_dir == tmp_path / "checkpoints"


def test_keep_last_deletes_old_checkpoints_through_the_gate_and_the_kill_switch_keeps_them(tmp_path: Path) -> None:
    """checkpoint.keep_last's deletions are delete_checkpoint actions of the job's gate: allowed
    by the shipped policy's prune-keep-last rule and audited; paused, the file stays, listed."""
    from dataclasses import replace

    from slurmagent.job.stop import LoopApprover
    from slurmagent.safety.audit import AuditLog
    from slurmagent.safety.switch import pause

    sweep = tmp_path / "sweep"
    ctx = replace(context_from_env({}, output_dir=sweep / "0"), sweep_dir=sweep)
    ctx = replace(ctx, approve=LoopApprover(ctx))
    conf = CheckpointConf(every_steps=1, keep_last=2)
    loop = StepLoop(ctx, Counter(), total_steps=4, conf=conf, install_signal_handlers=False)
    for _ in loop:
        pass
    steps = [e.step for e in loop.manager.entries()]
    assert len(steps) == 2 and all((loop.manager.dir / e.file).exists() for e in loop.manager.entries())
    audit = AuditLog(sweep / "audit.jsonl").records()
    decisions = [r for r in audit if r["type"] == "decision"]
    deleted = [r for r in audit if r["type"] == "outcome" and r["ok"]]
    assert decisions and {(r["action"], r["decision"], r["rule"]) for r in decisions} == {
        ("delete_checkpoint", "allow", "default:prune-keep-last")
    }
    assert decisions[0]["context"]["source"] == "checkpoint:keep_last"
    assert len(deleted) == len(decisions)  # each one ran inside the gate
    files_before = sorted(p.name for p in loop.manager.dir.glob("*.ckpt"))
    assert len(files_before) == 2  # the others are gone

    pause(sweep, "keep everything")
    more = StepLoop(ctx, Counter(), total_steps=7, conf=conf, install_signal_handlers=False)
    for _ in more:
        pass
    entries = more.manager.entries()
    assert len(entries) > 2  # none let go while paused: each still listed …
    assert all((more.manager.dir / e.file).exists() for e in entries)  # … and on disk
    held = [r for r in AuditLog(sweep / "audit.jsonl").records() if r.get("decision") == "held"]
    assert held and all(r["action"] == "delete_checkpoint" for r in held)
    assert len(held) == len(entries) - 2  # asked once per file, not at every save


def test_ctrl_c_while_attached_takes_effect_at_the_next_sleep_or_at_a_second_ctrl_c() -> None:
    """primitives/signals.InterruptAtSleep: a SIGINT in the middle of work is held until the
    next sleep (never raised inside the work); during a sleep, or a second one, it raises."""
    import os
    import time

    from slurmagent.primitives.signals import InterruptAtSleep

    with InterruptAtSleep() as ctrl_c:
        os.kill(os.getpid(), signal.SIGINT)  # mid-poll: held
        done = sum(range(1000))  # the work goes on to its end
        assert done == 499500 and ctrl_c.pending
        with pytest.raises(KeyboardInterrupt):
            ctrl_c.sleep(5)  # the next sleep raises before sleeping
        assert not ctrl_c.pending
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C before the sleep: at once
            time.sleep(1)
        import threading

        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            ctrl_c.sleep(60)  # during a sleep: it is cut short
        assert time.monotonic() - t0 < 30
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the previous handler is back
