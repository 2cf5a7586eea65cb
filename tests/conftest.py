"""Shared fixtures: the real test cluster, the test PostgreSQL, hostile paths, the project root.

`slurm` tests need the private Slurm cluster that tests/cluster/slurm-cluster starts.
Outside CI they skip with one line when it cannot come up; under CI=true a skipped
`slurm` test fails the run, so a green CI means they really ran against Slurm.
`postgres` tests (the HPO study storage) need the private PostgreSQL that tests/pg-server
starts, the same way.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

ROOT = Path(__file__).resolve().parent.parent
CLUSTER_SCRIPT = ROOT / "tests" / "cluster" / "slurm-cluster"
PG_SCRIPT = ROOT / "tests" / "pg-server"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
# the per-user state every test run writes (the user's audit log, the sweep index, the job
# history) goes into a directory of this run, never into the real ~/.local/state/slurmagent
os.environ.setdefault("SLURMAGENT_STATE_DIR", tempfile.mkdtemp(prefix="slurmagent-tests-state-"))

# Hydra's plugin scan (the first Plugins.instance() of a process) executes its core plugin modules
# again, so a class that subclassed Hydra's BasicSweeper before it — slurmagent's sweeper, imported
# by an in-process `plan` — no longer passes BasicSweeper.__init__'s super(BasicSweeper, self). A
# command-line process scans first (Hydra's main does); tests that run several commands in one
# process scan here, first, as it does.
from hydra.core.plugins import Plugins  # noqa: E402

from slurmagent.primitives.env import REQUEUE_EXIT_CODE  # noqa: E402

Plugins.instance()


def chain_digest(steps: int) -> str:
    """What the synthetic task (and the tests' own step loops) ends with after `steps` steps run
    exactly once each, in order: the digest an uninterrupted run gives."""
    d = hashlib.sha256(b"start").hexdigest()
    for step in range(steps):
        d = hashlib.sha256(f"{d}:{step}".encode()).hexdigest()
    return d


def readme_example(first_line: str) -> str:
    """The README's code block that begins with `first_line` (its plain-script examples), as written."""
    text = (ROOT / "README.md").read_text()
    found = [b for b in re.findall(r"^```[^\n`]*\n(.*?)^```", text, flags=re.S | re.M) if b.startswith(first_line)]
    assert len(found) == 1, f"README.md has {len(found)} code blocks starting {first_line!r}"
    return found[0]


def readme_named(name: str) -> tuple[str, str]:
    """A README block whose info string names it: ```python mytrain.py → (python, text), as written."""
    found = re.findall(rf"```(\w+) {re.escape(name)}\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    assert len(found) == 1, f"README needs exactly one block named {name}"
    return found[0]  # type: ignore[no-any-return]


def venv_on_path(base: dict[str, str]) -> dict[str, str]:
    """A user's shell with this virtualenv activated: `python` on PATH is the one with torch (a
    `task.command=[python,…]` runs what PATH finds, as it would for them)."""
    return dict(base, PATH=f"{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', '')}")


def run_uninterrupted(program: Path, work: Path, *args: str) -> dict[str, Any]:
    """A plain-script program's result.json when run once, start to end, by hand: the protocol's
    variables pointing at fresh directories, no signal, no slurmagent."""
    out, ckpt = work / "out", work / "ckpt"
    out.mkdir(parents=True)
    ckpt.mkdir()
    env = dict(
        os.environ,
        SLURMAGENT_OUTPUT_DIR=str(out),
        SLURMAGENT_CHECKPOINT_DIR=str(ckpt),
        SLURMAGENT_METRICS=str(out / "metrics.jsonl"),
        SLURMAGENT_REQUEUE_EXIT=str(REQUEUE_EXIT_CODE),
    )
    subprocess.run([sys.executable, str(program), *args], env=env, check=True, timeout=300)
    return json.loads((out / "result.json").read_text())  # type: ignore[no-any-return]


def jobs_from(home: Path) -> set[str]:
    """The jobs submitted from `home` (their working directory under it) that the queue or
    accounting knows: one submitted since would be new here, whatever else the cluster runs."""
    queued = subprocess.run(["squeue", "-h", "-o", "%F|%Z"], capture_output=True, text=True).stdout
    known = subprocess.run(["sacct", "-n", "-X", "-P", "-a", "-S", "now-1days", "-o", "JobIDRaw,WorkDir"],
                           capture_output=True, text=True).stdout  # fmt: skip
    rows = (line.split("|", 1) for line in (queued + known).splitlines() if "|" in line)
    return {job for job, where in rows if Path(where) == home or home in Path(where).parents}


def audit_records(path: Path, retention: bool = False) -> list[dict[str, Any]]:
    """The records of an audit log (none when it does not exist). A run's checkpoint.keep_last
    deletions are gate actions too (tests/unit/test_checkpoint.py); a test of other actions
    leaves them out (retention=False), so what it counts does not depend on how often the
    run checkpointed."""
    recs = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return [r for r in recs if retention or r.get("action") != "delete_checkpoint"]


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """`<run>/name`, filled by `build` once per test run: a module fixture whose tests xdist
    spreads over both workers would otherwise be built twice, at once (twice the time, and a
    race where the build shares a directory, as setuptools' does in the source tree). The first
    worker builds under a lock; the others wait and take what it built."""
    base = tmp_path_factory.getbasetemp()
    run = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # every worker's run directory
    out, done = run / name, run / f"{name}.built"
    with FileLock(str(run / f"{name}.lock")):
        if not done.is_file():
            shutil.rmtree(out, ignore_errors=True)  # what a failed build left
            out.mkdir()
            build(out)
            done.touch()
    return out


@pytest.fixture(scope="session")
def project_root() -> Path:
    return ROOT


@pytest.fixture()
def home(tmp_path: Path, project_root: Path) -> Path:
    """A user's own directory, outside the checkout: where the tests that take a user's path run."""
    home = tmp_path / "home"
    home.mkdir()
    assert project_root not in home.parents
    return home


@pytest.fixture(scope="session")
def slurm_conf() -> Iterator[str]:
    """Bring the test cluster up (or find it up) and point Slurm commands at it."""
    proc = subprocess.run([sys.executable, str(CLUSTER_SCRIPT), "up"], capture_output=True, text=True, timeout=300)
    conf = next((ln.split("=", 1)[1] for ln in proc.stdout.splitlines() if ln.startswith("SLURM_CONF=")), None)
    if proc.returncode != 0 or conf is None:
        reason = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        if IN_CI:
            pytest.fail(f"test cluster did not come up under CI: {reason}")
        pytest.skip(f"no test cluster: {reason}")
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    yield conf
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The test PostgreSQL's URL (a SQLAlchemy URL whose role may create databases):
    $SLURMAGENT_TEST_PG (tests/run exports it), else from `tests/pg-server up` (which starts
    the server when needed). This database is shared by every test and worker: a test that
    writes should take `postgres_db`, its own database, instead."""
    url = os.environ.get("SLURMAGENT_TEST_PG")
    if not url:
        proc = subprocess.run([sys.executable, str(PG_SCRIPT), "up"], capture_output=True, text=True, timeout=600)
        prefix = "SLURMAGENT_TEST_PG="
        url = next((ln[len(prefix) :] for ln in proc.stdout.splitlines() if ln.startswith(prefix)), None)
        if proc.returncode != 0 or url is None:
            reason = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            if IN_CI:
                pytest.fail(f"test PostgreSQL did not come up under CI: {reason}")
            pytest.skip(f"no test PostgreSQL: {reason}")
    # the driver the URL names (postgresql+psycopg2://…; a bare postgresql:// means psycopg2)
    driver = url.split("://", 1)[0].partition("+")[2] or "psycopg2"
    if importlib.util.find_spec(driver) is None:
        reason = f"the PostgreSQL driver {driver} is not installed (pip install -e '.[dev]')"
        if IN_CI:
            pytest.fail(f"{reason} under CI")
        pytest.skip(reason)
    return url


@pytest.fixture()
def postgres_db(postgres_url: str) -> Iterator[str]:
    """A fresh, empty database on the test PostgreSQL for this test alone; yields its URL.
    Created by the tests' role (it owns it), dropped after the test even while connections
    are left open (DROP DATABASE … WITH (FORCE) ends them, e.g. an Optuna storage's pool).
    A killed run leaves its `slurmagent_t_*` databases behind; they harm nothing."""
    import sqlalchemy  # optuna's dependency; imported here to keep other tests' start quick

    name = f"slurmagent_t_{uuid.uuid4().hex[:16]}"
    admin = sqlalchemy.create_engine(postgres_url, isolation_level="AUTOCOMMIT", poolclass=sqlalchemy.NullPool)
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        try:
            yield sqlalchemy.make_url(postgres_url).set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        admin.dispose()


@pytest.fixture(autouse=True)
def _only_slurm_tests_see_the_cluster(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test not marked `slurm` runs as on a laptop: it never submits to the shared test
    cluster, where its jobs would change the cluster tests' accounting and nodes."""
    if request.node.get_closest_marker("slurm") is None:
        monkeypatch.delenv("SLURM_CONF", raising=False)


@pytest.fixture()
def own_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The per-user state (audit log, kill switch, history) inside the test directory, and no
    policy or approvals directory from the environment; yields the state directory."""
    state = tmp_path / "state"
    monkeypatch.setenv("SLURMAGENT_STATE_DIR", str(state))
    monkeypatch.delenv("SLURMAGENT_POLICY", raising=False)
    monkeypatch.delenv("SLURMAGENT_APPROVALS_DIR", raising=False)
    return state


@pytest.fixture()
def no_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hide the test cluster: Slurm commands then find no config and fail, as on a laptop."""
    monkeypatch.delenv("SLURM_CONF", raising=False)


@pytest.fixture()
def task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A task directory as a job's environment names it, for a trainer run here with no job wrapper
    around it (the trainer integrations' unit tests): no Slurm or slurmagent variable from this
    shell; the stop signals' default handlers put back afterwards."""
    out = tmp_path / "task"
    for var in list(os.environ):
        if var.startswith(("SLURM", "SLURMAGENT_")):
            monkeypatch.delenv(var)
    monkeypatch.setenv("SLURMAGENT_OUTPUT_DIR", str(out))
    monkeypatch.setenv("PL_DISABLE_FORK", "1")
    yield out
    for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGCONT):
        signal.signal(sig, signal.SIG_DFL)


def wandb_offline_runs(task_dir: Path) -> list[tuple[str, dict[str, str], list[tuple[int, dict[str, Any]]]]]:
    """What W&B wrote offline under a task's directory, read back from its run files (the
    `.wandb` transaction log: W&B's 7-byte header, then 32 KiB blocks of records, each a
    protobuf `Record`): per run directory, oldest first, (run id, config, [(step, values)])."""
    import struct
    import time

    from wandb.proto import wandb_internal_pb2 as pb

    def records(path: Path) -> Iterator[bytes]:
        data, pos, block, part = path.read_bytes(), 7, 32768, b""
        assert len(data) < 7 or data[:4] == b":W&B", path
        while pos + 7 <= len(data):
            left = block - pos % block
            _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7]) if left >= 7 else (0, 0, 0)
            if left < 7 or (kind == 0 and length == 0):  # a block's padding
                pos += left
                continue
            if pos + 7 + length > len(data):  # a record still being written
                return
            chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
            if kind == 1:  # a whole record
                yield chunk
            elif kind in (2, 3):  # its first or a middle part
                part += chunk
            elif kind == 4:  # its last part
                yield part + chunk
                part = b""

    def read() -> tuple[list[tuple[str, dict[str, str], list[tuple[int, dict[str, Any]]]]], bool]:
        runs, ended = [], True
        for log in sorted(task_dir.glob("wandb/offline-run-*/run-*.wandb")):
            run_id, config, history, kind = "", {}, [], None
            for raw in records(log):
                rec = pb.Record()
                rec.ParseFromString(raw)
                kind = rec.WhichOneof("record_type")
                if kind == "run":
                    run_id = rec.run.run_id
                    update = rec.run.config.update
                    items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in update}
                    config = {k: v for k, v in items.items() if k != "_wandb"}
                elif kind == "history":
                    items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item}
                    values = {k: v for k, v in items.items() if not k.startswith("_")}
                    history.append((rec.history.step.num, values))
            runs.append((run_id, config, history))
            ended &= kind == "exit"
        return runs, ended

    # W&B's service (its own process) writes a run's log in buffers: read until every log ends with its
    # exit record (once, on a loaded machine, a log read right after `finish()` returned had no run record)
    deadline = time.monotonic() + 30
    runs, ended = read()
    while not ended and time.monotonic() < deadline:
        time.sleep(0.2)
        runs, ended = read()
    return runs


class MlflowServer:
    """A real MLflow tracking server (`mlflow server`, from the [dev] extra) on loopback, its
    store a SQLite file: stopped and started again on the same port and store, as an outage is.
    Ended by its process group (its own: the server and the uvicorn workers it starts)."""

    def __init__(self, root: Path) -> None:
        import socket

        self.root = root
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        import time
        import urllib.request

        self.root.mkdir(parents=True, exist_ok=True)
        argv = [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(self.port)]
        argv += ["--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}", "--workers", "1"]
        argv += ["--default-artifact-root", str(self.root / "artifacts")]
        with open(self.root / "server.log", "ab") as log:  # the server writes its own copy of the descriptor
            self.proc = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True, cwd=self.root)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"mlflow server did not answer in 90 s: {(self.root / 'server.log').read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self.proc = None


@pytest.fixture()
def mlflow_server(tmp_path: Path) -> Iterator[MlflowServer]:
    server = MlflowServer(tmp_path / "mlflow-server")
    server.start()
    yield server
    server.stop()


class WebhookReceiver:
    """A real HTTP server on loopback that records every POST (its path, headers and JSON body);
    `status` is what it answers (503: a receiver that is up but failing), `stop`/`start` take
    its port away and back (an outage: connections refused)."""

    def __init__(self) -> None:
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/hooks/T0123/B0456/s3cr3t-{uuid.uuid4().hex}"
        self.posts: list[dict[str, Any]] = []
        self.status = 200
        self.server: Any = None

    def start(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if receiver.status == 200:
                    receiver.posts.append({"path": self.path, "headers": dict(self.headers), "json": json.loads(body)})
                self.send_response(receiver.status)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def texts(self) -> list[str]:
        return [str(p["json"].get("text", "")) for p in self.posts]


@pytest.fixture()
def webhook() -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver()
    receiver.start()
    yield receiver
    receiver.stop()


def files_holding(root: Path, secret: str) -> list[str]:
    """Every file under `root` whose bytes hold `secret` (a test's grep for a leaked secret)."""
    return [str(p) for p in root.rglob("*") if p.is_file() and not p.is_symlink() and secret.encode() in p.read_bytes()]


def browser_dom(page: Path | str, work: Path, budget_ms: int | None = 10000) -> str:
    """The page (a file, or a URL) as a real headless Chromium leaves it after loading: with
    `budget_ms`, its scripts and timers run that long in virtual time (a page that reloads
    itself would be loaded again: pass None to take the first load). Skips where there is no
    Chromium; fails under CI (tests/run installs Debian's)."""
    import shutil

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        if IN_CI:  # tests/run installs it: its absence under CI is a broken set-up, not a reason to skip
            pytest.fail("no Chromium under CI=true (tests/run installs Debian's chromium)")
        pytest.skip("no Chromium here (tests/run installs Debian's chromium)")
    argv = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
    argv += ["--disable-component-update", "--disable-sync", "--no-first-run"]
    argv += [f"--user-data-dir={work / 'chromium-profile'}"]
    argv += [f"--virtual-time-budget={budget_ms}"] if budget_ms is not None else []
    url = page.absolute().as_uri() if isinstance(page, Path) else page
    return subprocess.run([*argv, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout


@pytest.fixture()
def weird_tmp_path(tmp_path: Path) -> Path:
    """A directory whose name is hostile to shells: spaces, quotes, $(…), backticks, ;."""
    weird = tmp_path / "we ird'\"$(touch PWNED)`id`;x"
    weird.mkdir()
    return weird


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """Under CI=true a skipped `slurm` (or `browser`, `postgres`) test is a failure: the
    cluster (the browser, the database) must really be there."""
    del call
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    needs = [m for m in ("slurm", "browser", "postgres") if item.get_closest_marker(m) is not None]
    if IN_CI and report.skipped and needs:
        report.outcome = "failed"
        report.longrepr = f"{needs[0]} test skipped under CI=true, which is not allowed: {report.longrepr}"


def pytest_configure(config: pytest.Config) -> None:
    """Bytecode, kept from one run to the next. Where PYTHONDONTWRITEBYTECODE is set (it is on
    this project's development machine) no process writes a .pyc, so each test run paid again:
    - every launcher, job and command a test starts compiled the ~130 modules of the checkout it
      imports (an editable install leaves them uncompiled): 0.1 s of CPU per launcher or job;
    - pytest rewrote the asserts of every test module in each worker: 3 s of CPU per worker, a
      fifth of collecting the suite (measured: 13.2 s uncached, 10.3 s cached).
    So the test processes write theirs (pytest keeps its rewritten modules in __pycache__ under
    its own name), and the first process of a run compiles the checkout for the processes the
    tests start, which inherit the variable. The folders are git-ignored."""
    sys.dont_write_bytecode = False
    if hasattr(config, "workerinput"):  # xdist's workers find the checkout compiled
        return
    import compileall

    for folder in ("slurmagent", "hydra_plugins", "tests"):
        compileall.compile_dir(str(ROOT / folder), quiet=1, workers=1)
