"""Background checkpoint writes: snapshot isolation, byte-identical files, one write in
flight, errors surfaced, and the loop's stop/final saves never racing a background write.

Real torch models, real files. Where a test needs a write to be slow (so that a race
would show), it wraps the real serialiser with a short wait; the bytes are unchanged."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from slurmagent.config import CheckpointConf
from slurmagent.errors import CheckpointError
from slurmagent.primitives import checkpoint as ckpt_mod
from slurmagent.primitives.checkpoint import snapshot
from slurmagent.runtime import CheckpointManager, StepLoop, StopForRequeue, context_from_env
from slurmagent.runtime.torch_state import TorchState


def tied_model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 16), torch.nn.Linear(16, 50))
    model[2].weight = model[0].weight  # tied weights: one storage under two keys
    return model


def trained_state() -> tuple[torch.nn.Module, torch.optim.Optimizer, TorchState]:
    model = tied_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    state = TorchState(model, opt)
    train_step(model, opt)
    return model, opt, state


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    x = torch.randint(0, 50, (8,))
    loss = torch.nn.functional.cross_entropy(model(x), x)
    opt.zero_grad()
    loss.backward()
    opt.step()  # updates parameters and Adam's moments in place


class GatedDumps:
    """The real serialiser; its first `gated` calls wait for `gate` (so the test controls
    when a background write runs), every call waits `delay_s`; counts concurrent writers."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, gated: int = 1, delay_s: float = 0.0) -> None:
        self.real = ckpt_mod._dump
        self.gate = threading.Event()
        self.gated = gated
        self.calls = 0
        self.delay_s = delay_s
        self.active = 0
        self.max_active = 0
        self.lock = threading.Lock()
        monkeypatch.setattr(ckpt_mod, "_dump", self)

    def __call__(self, obj: Any, out: Any) -> None:
        with self.lock:
            self.calls += 1
            gated = self.calls <= self.gated
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            if gated:
                assert self.gate.wait(30), "test gate never opened"
            time.sleep(self.delay_s)
            self.real(obj, out)
        finally:
            with self.lock:
                self.active -= 1


def test_background_file_is_byte_identical_and_isolated_from_later_updates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, opt, state = trained_state()
    before = snapshot(state.state_dict())  # what the state is at the save
    sync = CheckpointManager(tmp_path / "sync")
    sync_entry = sync.save(1, state.state_dict())  # the synchronous save of the same state

    gated = GatedDumps(monkeypatch)
    bg = CheckpointManager(tmp_path / "bg")
    bg.save_background(1, state.state_dict())
    assert bg.writing
    train_step(model, opt)  # in-place updates while the write has not started
    gated.gate.set()
    entry = bg.wait()

    assert entry is not None and not bg.writing
    got = (tmp_path / "bg" / entry.file).read_bytes()
    assert got == (tmp_path / "sync" / sync_entry.file).read_bytes()
    assert entry.sha256 == sync_entry.sha256
    found = bg.latest()
    assert found is not None
    saved = found[1]
    for key, value in before["model"].items():
        assert torch.equal(saved["model"][key], value), key
    assert not torch.equal(saved["model"]["1.weight"], model.state_dict()["1.weight"])  # the update did not leak
    moments = saved["optimizer"]["state"][0]["exp_avg"]
    assert torch.equal(moments, before["optimizer"]["state"][0]["exp_avg"])
    # shared storage and the state dict's metadata survive the snapshot
    assert saved["model"]["0.weight"].data_ptr() == saved["model"]["2.weight"].data_ptr()
    assert hasattr(saved["model"], "_metadata")
    assert bg.last_save_s >= bg.last_blocked_s > 0


def test_snapshot_copies_plain_python_state() -> None:
    state = {"counts": [1, 2], "rng": (3, [4])}
    snap = snapshot(state)
    state["counts"].append(5)
    state["rng"][1].append(6)
    assert snap == {"counts": [1, 2], "rng": (3, [4])}


def test_at_most_one_write_in_flight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gated = GatedDumps(monkeypatch, gated=0, delay_s=0.05)  # slow writes, so overlapping ones would show
    m = CheckpointManager(tmp_path, keep_last=2)
    for step in range(1, 6):
        m.save_background(step, {"w": torch.full((4,), float(step))})
    m.wait()
    assert gated.max_active == 1
    assert [e.step for e in m.entries()] == [4, 5]
    found = m.latest()
    assert found is not None and torch.equal(found[1]["w"], torch.full((4,), 5.0))


def test_background_error_is_raised_on_next_save_and_on_wait(tmp_path: Path) -> None:
    m = CheckpointManager(tmp_path)
    m.save(1, {"v": 1})
    # a directory where the new checkpoint file must go: the rename into place fails
    (tmp_path / "step_0000000002.ckpt").mkdir()
    (tmp_path / "step_0000000002.ckpt" / "x").write_text("x")
    m.save_background(2, {"v": 2})
    with pytest.raises(CheckpointError, match=r"step_0000000002.ckpt.*older checkpoints are intact"):
        m.save_background(3, {"v": 3})  # the previous write's error, not a new write
    assert [e.step for e in m.entries()] == [1]
    m.save_background(4, {"v": 4})  # the error was reported once; saving goes on
    assert m.wait() is not None
    m.save_background(2, {"v": 2})
    with pytest.raises(CheckpointError):
        m.wait()
    found = m.latest()
    assert found is not None and found[1] == {"v": 4}


class Weights:
    def __init__(self) -> None:
        self.w = torch.zeros(1000)

    def state_dict(self) -> dict[str, Any]:
        return {"w": self.w}  # the live tensor, as model/optimizer state dicts give

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.w = state["w"].clone()


def test_stop_save_waits_for_background_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gated = GatedDumps(monkeypatch)  # the first (periodic) write waits for the gate
    ctx = context_from_env({}, output_dir=tmp_path)
    s = Weights()
    loop = StepLoop(ctx, s, total_steps=100, conf=CheckpointConf(every_steps=2), install_signal_handlers=False)
    opener = threading.Timer(0.2, gated.gate.set)  # lets the periodic write go on while the stop save waits
    with pytest.raises(StopForRequeue) as stop:
        for step in loop:
            s.w.add_(1)  # in place
            if step == 2:
                assert loop.manager.writing  # the periodic save after step 2 is in flight
                loop.flag.handler(signal.SIGTERM, None)
                opener.start()
    # when the job may be requeued, nothing is being written and the stop checkpoint is the newest
    assert stop.value.step == 3 and not loop.manager.writing
    assert [e.step for e in loop.manager.entries()] == [2, 3]
    assert not list((tmp_path / "checkpoints").glob(".*tmp*"))
    found = loop.manager.latest()
    assert found is not None and found[0].step == 3 and torch.equal(found[1]["state"]["w"], torch.full((1000,), 3.0))
    assert loop.last_save_seconds > 0


def test_periodic_saves_are_background_final_save_is_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gated = GatedDumps(monkeypatch)
    ctx = context_from_env({}, output_dir=tmp_path)
    s = Weights()
    loop = StepLoop(ctx, s, total_steps=4, conf=CheckpointConf(every_steps=2), install_signal_handlers=False)
    for step in loop:
        s.w.add_(1)
        if step == 2:
            assert loop.manager.writing  # the loop went on while the step-2 save waits at the gate
            gated.gate.set()
    assert not loop.manager.writing
    assert [e.step for e in loop.manager.entries()] == [2, 4]
    found = loop.manager.entries()[0]
    data = loop.manager.verify(found)
    assert data is not None and torch.equal(ckpt_mod._loads(data)["state"]["w"], torch.full((1000,), 2.0))


def test_synchronous_periodic_saves_when_switched_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    GatedDumps(monkeypatch, gated=0)
    ctx = context_from_env({}, output_dir=tmp_path)
    loop = StepLoop(ctx, Weights(), total_steps=4, conf=CheckpointConf(every_steps=2), install_signal_handlers=False)
    loop.background_saves = False
    for step in loop:
        if step == 2:
            assert not loop.manager.writing and [e.step for e in loop.manager.entries()] == [2]


def test_snapshot_memory_is_reused_only_after_its_write(tmp_path: Path) -> None:
    m = CheckpointManager(tmp_path)
    w = torch.zeros(10_000)
    state = {"w": w, "view": w[5:], "step": 0}
    ptrs = []
    for step in (1, 2, 3):
        w.fill_(step)
        state["step"] = step
        m.save_background(step, state)
        ptrs.append(sorted(s.data_ptr() for s in m._staging._used))
    m.wait()
    assert len(ptrs[0]) == 1  # the view shares the copy of its storage
    assert ptrs[0] == ptrs[1] == ptrs[2]  # the same snapshot memory, reused
    for entry in m.entries():  # every file holds its own step's values
        data = m.verify(entry)
        assert data is not None
        saved = ckpt_mod._loads(data)
        assert saved["step"] == entry.step and torch.equal(saved["w"], torch.full((10_000,), float(entry.step)))
        assert saved["view"].data_ptr() == saved["w"].data_ptr() + 5 * 4


def test_prepared_snapshot_memory_is_what_the_first_snapshot_uses(tmp_path: Path) -> None:
    m = CheckpointManager(tmp_path)
    state = {"a": torch.arange(1000.0), "b": torch.ones(10, 10)}
    m.prepare(state)
    assert m.wait() is None  # the allocation ran in the background, without error
    prepared = sorted(s.data_ptr() for s in m._staging._used)
    m.save_background(1, state)
    assert sorted(s.data_ptr() for s in m._staging._used) == prepared
    entry = m.wait()
    assert entry is not None
    found = m.latest()
    assert found is not None and torch.equal(found[1]["a"], torch.arange(1000.0))


def test_prepare_twice_keeps_one_set_of_snapshot_memory(tmp_path: Path) -> None:
    m = CheckpointManager(tmp_path)
    state = {"a": torch.zeros(1000), "b": torch.zeros(10)}
    m.prepare(state)
    m.wait()
    first = sorted(s.data_ptr() for s in m._staging._used)
    m.prepare(state)
    m.wait()
    assert sorted(s.data_ptr() for s in m._staging._used) == first
