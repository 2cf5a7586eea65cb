"""auto_resume on real checkpoint files: PyTorch and Lightning-layout .ckpt (torch.save),
safetensors (safetensors), Keras-style HDF5 (h5py), flax-style .msgpack (msgpack) and
slurmagent's own. Synthesised, because TensorFlow, Keras and JAX/Orbax are too large to
install here: the TF `checkpoint` index with .index (a LevelDB table footer) / .data
shards, the .keras zip layout and Orbax step directories — each in the on-disk layout
those libraries write."""

from __future__ import annotations

import json
import os
import struct
import zipfile
from pathlib import Path

import h5py
import msgpack
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from slurmagent.primitives.checkpoint import CheckpointManager
from slurmagent.skills import Status
from slurmagent.skills.auto_resume import LEVELDB_MAGIC, AutoResume, newest_valid, scan


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def flip_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 16] = bytes(b ^ 0xFF for b in data[mid : mid + 16])
    path.write_bytes(bytes(data))


def make_old_mtime_newest(older: Path, *newer: Path) -> None:
    """File times that lie: the lowest step gets the newest mtime."""
    for i, p in enumerate(newer):
        os.utime(p, (1_000_000 + i, 1_000_000 + i))
    os.utime(older, (2_000_000_000, 2_000_000_000))


def resume(root: Path) -> dict:  # type: ignore[type-arg]
    res = AutoResume().run(directory=root)
    return {"status": res.status, **res.findings, "reasons": res.reasons}


def test_torch_newest_by_step_not_mtime_and_truncated_newest_falls_back(tmp_path: Path) -> None:
    model = torch.nn.Linear(8, 4)
    for step in (100, 300, 500):
        torch.save({"step": step, "model": model.state_dict()}, tmp_path / f"ckpt_{step}.pt")
    torch.save({"global_step": 50, "model": model.state_dict()}, tmp_path / "zzz_latest.pth")
    make_old_mtime_newest(tmp_path / "ckpt_100.pt", tmp_path / "ckpt_300.pt", tmp_path / "ckpt_500.pt")
    assert resume(tmp_path)["resume_from"]["step"] == 500
    truncate(tmp_path / "ckpt_500.pt")
    r = resume(tmp_path)
    assert r["status"] == Status.WARNING and r["resume_from"]["path"].endswith("ckpt_300.pt")
    assert r["skipped"][0]["path"].endswith("ckpt_500.pt") and "zip" in r["skipped"][0]["problem"]


def test_lightning_ckpt_and_hpc_ckpt_with_a_corrupt_newest(tmp_path: Path) -> None:
    model = torch.nn.Linear(8, 4)

    def lightning(path: Path, epoch: int, step: int) -> None:  # Lightning's checkpoint layout
        torch.save(
            {
                "epoch": epoch,
                "global_step": step,
                "pytorch-lightning_version": "2.4.0",
                "state_dict": model.state_dict(),
                "optimizer_states": [],
                "hyper_parameters": {"lr": 1e-3},
            },
            path,
        )

    lightning(tmp_path / "epoch=1-step=200.ckpt", 1, 200)
    lightning(tmp_path / "hpc_ckpt_1.ckpt", 2, 300)
    lightning(tmp_path / "hpc_ckpt_2.ckpt", 3, 400)
    assert resume(tmp_path)["resume_from"] == {
        "path": str(tmp_path / "hpc_ckpt_2.ckpt"),
        "format": "lightning",
        "step": 400,
        "epoch": 3,
        "source": "content",
        "valid": True,
        "problem": "",
    }
    flip_middle(tmp_path / "hpc_ckpt_2.ckpt")  # same size, bytes changed: only a CRC finds it
    r = resume(tmp_path)
    assert r["resume_from"]["step"] == 300 and "CRC" in r["skipped"][0]["problem"]


def test_safetensors_step_from_metadata_and_truncation(tmp_path: Path) -> None:
    t = {"w": torch.randn(16, 16)}
    save_file(t, str(tmp_path / "model-a.safetensors"), metadata={"step": "700"})
    save_file(t, str(tmp_path / "model-b.safetensors"), metadata={"step": "900"})
    assert resume(tmp_path)["resume_from"]["step"] == 900
    truncate(tmp_path / "model-b.safetensors", 0.9)
    r = resume(tmp_path)
    assert r["resume_from"]["step"] == 700 and "truncated" in r["skipped"][0]["problem"]


def test_keras_h5_iterations_and_keras_zip(tmp_path: Path) -> None:
    for name, it in (("weights.05.h5", 500), ("weights.09.h5", 900)):
        with h5py.File(tmp_path / name, "w") as f:
            f.attrs["keras_version"] = "2.15.0"
            f.create_dataset("model_weights/dense/kernel", data=np.ones((8, 4), dtype="f4"))
            f.create_dataset("optimizer_weights/iterations", data=np.int64(it))
    assert resume(tmp_path)["resume_from"]["step"] == 900
    truncate(tmp_path / "weights.09.h5")
    r = resume(tmp_path)
    assert r["resume_from"]["step"] == 500 and r["skipped"][0]["format"] in ("h5", "keras_h5")
    keras = tmp_path / "keras"
    keras.mkdir()
    for epoch in (3, 4):
        with zipfile.ZipFile(keras / f"model_epoch_{epoch}.keras", "w") as zf:
            zf.writestr("metadata.json", json.dumps({"keras_version": "3.6.0", "date_saved": "2026-11-30@10:00:00"}))
            zf.writestr("config.json", json.dumps({"class_name": "Sequential"}))
            zf.writestr("model.weights.h5", (tmp_path / "weights.05.h5").read_bytes())
    r = resume(keras)
    assert (
        r["resume_from"]["format"] == "keras" and r["resume_from"]["step"] == 4 and r["resume_from"]["source"] == "name"
    )


def test_msgpack_flax_style(tmp_path: Path) -> None:
    for step in (10, 20):
        state = {"step": step, "params": {"dense": {"kernel": np.ones(4, "f4").tobytes()}}}
        (tmp_path / f"checkpoint_{step}.msgpack").write_bytes(msgpack.packb(state))
    assert resume(tmp_path)["resume_from"]["step"] == 20
    truncate(tmp_path / "checkpoint_20.msgpack", 0.7)
    assert resume(tmp_path)["resume_from"]["step"] == 10


def _tf_checkpoint(d: Path, n: int, shards: int = 1) -> None:
    (d / f"ckpt-{n}.index").write_bytes(b"\x00" * 64 + b"\x00" * 40 + LEVELDB_MAGIC)
    for i in range(shards):
        (d / f"ckpt-{n}.data-{i:05d}-of-{shards:05d}").write_bytes(b"\x01" * 128)


def test_tensorflow_index_and_data_shards(tmp_path: Path) -> None:
    for n in (3, 4, 5):
        _tf_checkpoint(tmp_path, n, shards=2)
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "ckpt-5"\nall_model_checkpoint_paths: "ckpt-5"\n')
    assert resume(tmp_path)["resume_from"] == {
        "path": str(tmp_path / "ckpt-5"),
        "format": "tensorflow",
        "step": 5,
        "epoch": None,
        "source": "manifest",
        "valid": True,
        "problem": "",
    }
    (tmp_path / "ckpt-5.data-00001-of-00002").unlink()  # a shard lost
    truncate(tmp_path / "ckpt-4.index")  # an index cut short
    r = resume(tmp_path)
    assert r["resume_from"]["step"] == 3
    assert [s["problem"] for s in r["skipped"]] == [
        "1 of 2 data shards present (or empty)",
        "ckpt-4.index is truncated (no table footer)",
    ]


def test_orbax_step_dirs_skip_unfinalized_and_broken(tmp_path: Path) -> None:
    for step in (1000, 2000):
        d = tmp_path / str(step)
        (d / "default").mkdir(parents=True)
        (d / "_CHECKPOINT_METADATA").write_text(json.dumps({"init_timestamp_nsecs": 1, "commit_timestamp_nsecs": 2}))
        (d / "default" / "_METADATA").write_text(json.dumps({"tree_metadata": {}}))
    (tmp_path / "3000.orbax-checkpoint-tmp-1733000000").mkdir()
    (tmp_path / "2000" / "default" / "_METADATA").write_text("{trunc")
    r = resume(tmp_path)
    assert r["resume_from"]["path"] == str(tmp_path / "1000") and r["resume_from"]["format"] == "orbax"
    assert [(s["step"], s["problem"][:13]) for s in r["skipped"]] == [(3000, "not finalized"), (2000, "item default:")]


def test_slurmagent_manifest_checksum_and_a_mixed_tree(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path / "run" / "checkpoints", keep_last=3)
    for step in (10, 20, 30):
        mgr.save(step, {"state": {"x": step}})
    flip_middle(mgr.dir / "step_0000000030.ckpt")
    torch.save({"step": 25}, tmp_path / "export.pt")
    r = resume(tmp_path)
    assert r["resume_from"]["path"].endswith("export.pt")  # 25: newer than the valid slurmagent 20
    assert r["skipped"][0]["format"] == "slurmagent" and r["skipped"][0]["problem"] == "sha256 mismatch"


def test_empty_tree_starts_fresh_and_all_broken_is_critical(tmp_path: Path) -> None:
    assert resume(tmp_path)["status"] == Status.OK and resume(tmp_path)["resume_from"] is None
    (tmp_path / "a.pt").write_bytes(b"PK\x03\x04garbage")
    r = resume(tmp_path)
    assert r["status"] == Status.CRITICAL and r["reasons"][0] == "no valid checkpoint"
    assert newest_valid(scan(tmp_path))[0] is None


def test_bad_directory_is_unknown(tmp_path: Path) -> None:
    res = AutoResume().run(directory=tmp_path / "missing")
    assert res.status == Status.UNKNOWN and "is not a directory" in res.reasons[0]


@pytest.mark.parametrize("keep", [0.0, 0.01])
def test_tiny_truncations_never_raise(tmp_path: Path, keep: float) -> None:
    torch.save({"step": 1}, tmp_path / "a.pt")
    save_file({"w": torch.zeros(2)}, str(tmp_path / "b.safetensors"))
    (tmp_path / "c.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 100)
    for p in list(tmp_path.iterdir()):
        truncate(p, keep)
    r = resume(tmp_path)
    assert r["status"] == Status.CRITICAL and len(r["skipped"]) == 3
    _ = struct  # the formats' headers are written by their libraries above
