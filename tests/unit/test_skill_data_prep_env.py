"""data_prep against a real local HTTP server and file:// URLs (checksums, safe extraction,
one download under concurrent tasks), and env_check on this node and on recorded facts."""

from __future__ import annotations

import hashlib
import io
import sys
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from slurmagent.skills import Status
from slurmagent.skills.data_prep import DataPrep
from slurmagent.skills.env_check import EnvCheck, EnvFacts, assess, gather


def make_tar(path: Path, files: dict[str, bytes], links: dict[str, str] | None = None) -> str:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tf.addfile(info)
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[tuple[str, Path, list[str]]]:
    """A real HTTP server on localhost serving `www/`, counting GET requests."""
    www = tmp_path / "www"
    www.mkdir()
    hits: list[str] = []

    class Handler(SimpleHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            super().do_GET()

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(www)))
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", www, hits
    httpd.shutdown()
    httpd.server_close()


def test_http_download_verified_extracted_indexed_once_under_concurrency(
    server: tuple[str, Path, list[str]], tmp_path: Path
) -> None:
    url, www, hits = server
    sha = make_tar(www / "digits.tar.gz", {"digits/train/0.txt": b"zero", "digits/val/1.txt": b"one!"})
    cache = tmp_path / "cache"
    results: list = []  # type: ignore[type-arg]

    def task() -> None:
        results.append(DataPrep().run(source=f"{url}/digits.tar.gz", cache=cache, sha256=sha))

    threads = [threading.Thread(target=task) for _ in range(4)]  # four array tasks on one node
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert hits == ["/digits.tar.gz"]  # downloaded once; the others waited on the lock and reused it
    assert [r.status for r in results] == [Status.OK] * 4
    assert sorted(r.findings["downloaded"] for r in results) == [False, False, False, True]
    root = Path(results[0].findings["path"])
    assert (root / "digits" / "val" / "1.txt").read_bytes() == b"one!" and results[0].findings["files"] == 2
    assert (root.with_name(root.name + ".index.json")).read_text().count('"bytes": 4') == 2


def test_file_url_md5_zip_and_checksum_mismatch(tmp_path: Path) -> None:
    z = tmp_path / "d.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("a/b.txt", "hello")
    md5 = hashlib.md5(z.read_bytes()).hexdigest()
    ok = DataPrep().run(source=z.as_uri(), cache=tmp_path / "c", md5=md5)
    assert ok.status == Status.OK and (Path(ok.findings["path"]) / "a" / "b.txt").read_text() == "hello"
    again = DataPrep().run(source=z.as_uri(), cache=tmp_path / "c", md5=md5)
    assert again.status == Status.OK and again.findings["downloaded"] is False
    bad = DataPrep().run(source=str(z), cache=tmp_path / "c2", sha256="0" * 64)
    assert bad.status == Status.CRITICAL and f"expected {'0' * 64}" in bad.reasons[0]
    assert not Path(bad.findings["file"]).exists() and not list((tmp_path / "c2").glob("*.d"))
    unverified = DataPrep().run(source=str(z), cache=tmp_path / "c3")
    assert unverified.status == Status.WARNING and "unverified" in unverified.reasons[0]


@pytest.mark.parametrize(
    ("files", "links", "expected"),
    [
        ({"../evil.txt": b"x"}, None, "would be written outside the target"),
        ({"/etc/evil.txt": b"x"}, None, "would be written outside the target"),
        ({"ok.txt": b"x"}, {"link": "../../outside"}, "points outside the target"),
        ({"ok.txt": b"x"}, {"passwd": "/etc/passwd"}, "points outside the target"),
    ],
)
def test_unsafe_tar_is_refused_and_nothing_lands(
    tmp_path: Path, files: dict[str, bytes], links: dict[str, str] | None, expected: str
) -> None:
    arc = tmp_path / "in" / "evil.tar.gz"
    arc.parent.mkdir()
    sha = make_tar(arc, files, links)
    cache = tmp_path / "cache" / "deep"
    res = DataPrep().run(source=str(arc), cache=cache, sha256=sha)
    assert res.status == Status.CRITICAL and expected in res.reasons[0] and "nothing extracted" in res.reasons[0]
    assert not (tmp_path / "cache" / "evil.txt").exists() and not list(cache.glob("*.d*"))


def test_unsafe_zip_is_refused(tmp_path: Path) -> None:
    z = tmp_path / "evil.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("../../escape.txt", "x")
    res = DataPrep().run(source=str(z), cache=tmp_path / "c", sha256=hashlib.sha256(z.read_bytes()).hexdigest())
    assert res.status == Status.CRITICAL and "outside the target" in res.reasons[0]
    assert not (tmp_path / "escape.txt").exists()


GPU_NODE = EnvFacts(
    python="3.11.7",
    torch="2.4.0+cu124",
    cuda_runtime="12.4",
    cuda_available=True,
    device_count=2,
    nccl="2.20.5",
    driver_cuda="12.4",
    cuda_visible_devices="0,1",
    slurm_job_gpus="0,1",
)


def test_healthy_gpu_node_facts_have_no_findings() -> None:
    assert assess(GPU_NODE) == []


@pytest.mark.parametrize(
    ("change", "status", "text"),
    [
        ({"driver_cuda": "11.4"}, Status.CRITICAL, "driver supports CUDA 11.4, torch needs CUDA 12.4"),
        ({"driver_cuda": "12.2"}, Status.WARNING, "minor-version compatibility only"),
        (
            {"cuda_runtime": None, "torch": "2.4.0+cpu"},
            Status.CRITICAL,
            "CPU-only build but Slurm gave this job GPUs 0,1",
        ),
        ({"cuda_visible_devices": "0"}, Status.CRITICAL, "CUDA_VISIBLE_DEVICES=0 shows 1 GPU(s), Slurm allocated 2"),
        ({"device_count": 1}, Status.CRITICAL, "torch sees 1 GPU(s), Slurm allocated 2"),
        ({"nccl": None}, Status.WARNING, "NCCL is not available"),
        (
            {"driver_cuda": None, "driver_error": "Driver Not Loaded"},
            Status.CRITICAL,
            "no NVIDIA driver answers (Driver Not Loaded)",
        ),
        (
            {"missing_libs": {"/x/libtorch_cuda.so": ["libcudnn.so.9"]}},
            Status.CRITICAL,
            "needs missing shared libraries: libcudnn.so.9",
        ),
        ({"python": "3.9.18"}, Status.CRITICAL, "Python 3.9.18 is older than 3.11"),
    ],
)
def test_each_broken_fact_gives_one_finding_with_a_fix(change: dict, status: Status, text: str) -> None:  # type: ignore[type-arg]
    (finding,) = assess(replace(GPU_NODE, **change))
    assert finding.status == status and text in finding.what and finding.fix


def test_this_node_real_facts() -> None:
    facts = gather(env={})
    assert facts.python == ".".join(map(str, sys.version_info[:3])) and facts.torch == torch.__version__
    assert facts.cuda_runtime == torch.version.cuda and facts.missing_libs == {}
    assert EnvCheck().run().status == (Status.OK if facts.cuda_runtime is None else EnvCheck().run().status)
    if facts.cuda_runtime is None:  # this CPU machine: a job that was given GPUs cannot use them
        (f,) = assess(gather(env={"SLURM_JOB_GPUS": "0"}))
        assert f.status == Status.CRITICAL and "CPU-only build" in f.what
