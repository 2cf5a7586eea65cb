"""Hostile input never reaches a shell and never escapes its directory.

Hypothesis feeds strings with shell metacharacters, newlines and `../` through config
parsing (job specs, sbatch flags, the safety policy), `slurmagent render` and the
submission path (submitit's sbatch script, built from our flags; and one real sweep on the
local backend), and checks that nothing outside the test's directory changed. A static
test fails if `shell=True`, `os.system` or another shell entry point appears in the package.
Every path argument of every command (found from the parsers), given a file, a missing or
unreadable path or a symlink loop, refuses it in one line (exit 2) and writes nothing.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest
from hydra.errors import HydraException
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from omegaconf.errors import OmegaConfBaseException

from slurmagent import cli
from slurmagent.cli.args import JOB_ID
from slurmagent.cli.registry import build_parser
from slurmagent.config import LauncherConf, job_spec
from slurmagent.errors import ConfigError, PolicyError, SlurmAgentError
from slurmagent.launch.backend import slurm_parameters
from slurmagent.render import render
from slurmagent.safety.executors import delete_inside
from slurmagent.safety.policy import parse_policy
from slurmagent.slurm.sbatch import safe_job_name, sbatch_flags

ROOT = Path(__file__).resolve().parents[2]
MARK = "PWNED"
FIXED = [
    f"$(touch {MARK})",
    f"`touch {MARK}`",
    f"a; touch {MARK}",
    f"x\ntouch {MARK}",
    f"x\r\n#SBATCH --wrap=touch {MARK}",
    f"../../../../{MARK}",
    f"../{MARK}/../../x",
    f"/tmp/{MARK}",
    f"'; touch {MARK}; echo '",
    f'"; touch {MARK}; echo "',
    f"| tee {MARK}",
    f"&& touch {MARK} &",
    "${oc.env:HOME}",
    "%j %x %A",
    "-o /tmp/x",
]
HOSTILE = st.one_of(
    st.sampled_from(FIXED),
    st.text(alphabet=st.sampled_from(list("ab ;|&$`'\"\\\n\r*?~<>(){}!#./%-=:,")), min_size=1, max_size=20),
    st.builds(lambda a, b: a + b, st.sampled_from(FIXED), st.text(max_size=8)),
)
REFUSED = (ConfigError, HydraException, OmegaConfBaseException)
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
RENDERS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def tree(root: Path, skip: Path | None = None) -> dict[str, tuple[int, float]]:
    out: dict[str, tuple[int, float]] = {}
    for dirpath, dirs, files in os.walk(root):
        if skip is not None and Path(dirpath) == skip:
            dirs[:] = []
            continue
        for name in files + dirs:
            p = Path(dirpath) / name
            if p == skip:
                continue
            try:
                st_ = p.lstat()
            except FileNotFoundError:
                continue
            out[str(p)] = (st_.st_size, st_.st_mtime)
    return out


def marked(root: Path, depth: int) -> list[Path]:
    """Files whose name carries the payloads' marker, `depth` levels below `root`."""
    found: list[Path] = []
    base = len(root.parts)
    for dirpath, dirs, files in os.walk(root):
        if len(Path(dirpath).parts) - base >= depth:
            dirs[:] = []
        found += [Path(dirpath) / n for n in files + dirs if n.startswith(MARK)]
    return found


@pytest.fixture()
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Runs the test inside tmp_path; afterwards nothing outside it may have changed."""
    box = tmp_path / "box"
    box.mkdir()
    monkeypatch.chdir(box)
    watched = tmp_path.parent  # this session's other test directories
    before = tree(watched, skip=tmp_path)
    before_root = tree(ROOT / "conf")
    home = Path.home()
    outside = [Path("/tmp"), ROOT, home, Path("/")]
    before_marked = {p for r in outside for p in marked(r, 1)}
    yield box
    assert tree(watched, skip=tmp_path) == before
    assert tree(ROOT / "conf") == before_root
    assert {p for r in outside for p in marked(r, 1)} == before_marked
    assert not marked(tmp_path, 12) or all(p.is_relative_to(box) for p in marked(tmp_path, 12))


def hydra_quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@FAST
@given(value=HOSTILE)
@example(value="gpu\n")  # found by this test: `$` in a regex also matches before a final newline
def test_config_refuses_or_keeps_hostile_values_whole(sandbox: Path, value: str) -> None:
    for key in ("partition", "qos", "account", "constraint", "exclude", "mem", "time", "gpu_type"):
        raw = {"resources": {key: value}, "task": {"command": ["python3", value]}}
        if key == "gpu_type":
            raw["resources"]["gpus"] = 1
        try:
            spec = job_spec(raw)
            flags = sbatch_flags(spec.resources)
        except ConfigError as exc:
            assert key in str(exc) or "resources" in str(exc), exc
            continue
        assert spec.task.command == ["python3", value]  # an argv element, never split or interpreted
        for flag, v in flags.items():
            assert "\n" not in v and "\r" not in v, (flag, v)  # one #SBATCH line holds one value
        # the submission path: submitit's sbatch script built from our flags, checked by bash
        params = slurm_parameters(spec, LauncherConf(), 1, safe_job_name(value))
        from submitit.slurm.slurm import _make_sbatch_string

        script = _make_sbatch_string(command="python3 -m submitit", folder=str(sandbox), **params)
        directives = [ln for ln in script.splitlines() if ln.startswith("#SBATCH")]
        assert all(ln.count("#SBATCH") == 1 for ln in directives)
        subprocess.run(["bash", "-n"], input=script, text=True, check=True)


@FAST
@given(value=HOSTILE)
def test_policy_files_refuse_hostile_names(sandbox: Path, value: str) -> None:
    assume(value != "*")  # "*" is the rule for any action
    raw = {"name": value, "rules": [{"name": value, "action": value, "decision": "allow"}]}
    with pytest.raises(PolicyError, match="is not one of"):
        parse_policy(raw, "test")


@FAST
@given(value=HOSTILE)
def test_checkpoint_deletion_never_leaves_the_sweep(sandbox: Path, value: str) -> None:
    sweep = sandbox / "sweep"
    (sweep / "ckpt").mkdir(parents=True, exist_ok=True)
    outside = sandbox / "outside.txt"
    outside.write_text("keep")
    try:
        result = delete_inside(sweep, value)
    except (SlurmAgentError, ValueError, OSError):
        result = {}
    if result:
        assert Path(result["deleted"]).is_relative_to(sweep.resolve())
    assert outside.read_text() == "keep" and sweep.is_dir()


@RENDERS
@given(value=HOSTILE)
def test_render_quotes_hostile_values_and_writes_only_its_directory(sandbox: Path, value: str) -> None:
    out = sandbox / "render"
    q = hydra_quote(value)
    overrides = [f"+name={q}", "task.target=null", f"task.command=[python3,{q}]"]
    try:
        rendered = render(overrides, out)
    except REFUSED:
        return
    assert rendered.script.parent == out.absolute() and rendered.config.parent == out.absolute()
    text = rendered.script.read_text()
    subprocess.run(["bash", "-n", str(rendered.script)], check=True)
    # run the script's shell part with exec replaced: the value arrives as one argument
    body = text.replace("exec ", "printf '%s\\0' ")
    env = dict(os.environ, SLURM_JOB_ID="1")
    proc = subprocess.run(["bash", "-c", body], cwd=sandbox, env=env, capture_output=True, check=True)
    args = proc.stdout.split(b"\0")
    assert args[0].endswith(b"python3") and len(args) == 3  # python3, the value, and the trailing empty piece
    assert not list(sandbox.rglob(f"{MARK}*"))


def test_a_sweep_with_hostile_values_runs_them_as_arguments_on_the_local_backend(
    sandbox: Path, weird_tmp_path: Path
) -> None:
    """The whole submission path once: Hydra → launcher → submitit (local) → the command."""
    sweep = weird_tmp_path / "sweep"
    code = "import sys, json; json.dump(sys.argv[1:], open('result.json', 'w'))"
    values = [f"$(touch {MARK})", f"a;touch {MARK}", f"../../{MARK}"]
    argv = ",".join(hydra_quote(v) for v in values)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurmagent",
            "cluster=local",
            "task.target=null",
            f"task.command=[python3,-c,{hydra_quote(code)},{argv}]",
            f"hydra.sweep.dir={hydra_quote(str(sweep))}",
            "hydra.launcher.poll_interval_s=0.5",
            "-m",
        ],
        cwd=sandbox,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    state = json.loads((sweep / "sweep.json").read_text())
    assert state["tasks"][0]["result"] == values
    assert not list(weird_tmp_path.rglob(f"{MARK}*")) and not list(sandbox.rglob(f"{MARK}*"))


# -- no shell anywhere in the package --------------------------------------------------------
SHELL_CALLS = {("os", "system"), ("os", "popen"), ("subprocess", "getoutput"), ("subprocess", "getstatusoutput")}
SPAWNERS = {"run", "Popen", "call", "check_call", "check_output"}


def shell_uses(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and (f.value.id, f.attr) in SHELL_CALLS:
            found.append(f"{f.value.id}.{f.attr} at line {node.lineno}")
        for kw in node.keywords:
            if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                found.append(f"shell={ast.unparse(kw.value)} at line {node.lineno}")
    return found


def test_shell_detector_catches_what_it_must() -> None:
    assert shell_uses("import os\nos.system('ls')") == ["os.system at line 2"]
    assert shell_uses("subprocess.run('ls', shell=True)") == ["shell=True at line 1"]
    assert shell_uses("subprocess.Popen(x, shell=flag)") == ["shell=flag at line 1"]
    assert shell_uses("subprocess.run(['ls'], shell=False)") == []


def test_no_shell_in_the_package() -> None:
    files = [p for d in ("slurmagent", "hydra_plugins") for p in (ROOT / d).rglob("*.py")]
    assert len(files) > 20
    found = {str(p.relative_to(ROOT)): uses for p in files if (uses := shell_uses(p.read_text()))}
    assert found == {}
    # and the words themselves, which a call through getattr or a string would still need
    texts = {str(p.relative_to(ROOT)): p.read_text() for p in files}
    # (`shell=True` as its own word)
    words = re.compile(r"(?<![\w.])shell\s*=\s*True|\bos\.system\b")
    assert [name for name, text in texts.items() if words.search(text)] == []


# -- every path argument of every command ------------------------------------------------------
# Found, not listed: each subcommand's positional or option with type=Path (the registry's parser, the
# safety commands included). Given a regular file, a missing path, a symlink loop, a directory
# or file it may not read, or a missing path with a hostile name, a command says so in one
# line on stderr and exits 2, writing nothing — or accepts it because it is valid: a missing
# output directory is made (render -o, report -o); a file is an audit log to verify.


def path_arguments() -> list[tuple[tuple[str, ...], argparse.Action]]:
    parser, _ = build_parser()
    found: list[tuple[tuple[str, ...], argparse.Action]] = []

    def walk(p: argparse.ArgumentParser, words: tuple[str, ...]) -> None:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, (*words, name))
            elif action.type is Path:
                found.append((words, action))

    walk(parser, ())
    return found


PATH_ARGS = path_arguments()
OUTPUTS = {"output"}  # directories a command writes into (made when missing)
FILES_ARE_INPUT = {("audit", "verify")}  # a file is what it checks: a non-log file gets a verdict (exit 1)


def arg_id(item: tuple[tuple[str, ...], argparse.Action]) -> str:
    words, action = item
    return " ".join([*words, action.option_strings[-1] if action.option_strings else action.dest])


def argv_for(words: tuple[str, ...], action: argparse.Action, bad: str, sweep: Path) -> list[str]:
    """The command with `bad` for `action`; every other required argument valid (a sweep)."""
    parser, _ = build_parser()
    sub: argparse.ArgumentParser = parser
    for word in words:
        sub = next(a for a in sub._actions if isinstance(a, argparse._SubParsersAction)).choices[word]
    argv = list(words)
    for other in sub._actions:
        if other.option_strings or isinstance(other, argparse._SubParsersAction):
            continue
        if other.dest == action.dest:
            argv += ["--", bad] if bad.startswith("-") else [bad]  # a name like an option, as a shell user writes it
        elif other.type is Path:
            argv.append(str(sweep))
        elif other.nargs is None:
            argv.append("x")  # an approval id
    if action.option_strings:
        argv.append(f"{action.option_strings[0]}={bad}")
    return argv


@pytest.fixture()
def paths_box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A valid sweep (sweep.json, an empty history) and the bad paths, in the working directory."""
    from slurmagent.supervise.state import SweepState, SweepStore, TaskRecord

    box = tmp_path / "box"
    box.mkdir()
    monkeypatch.chdir(box)
    monkeypatch.setenv("SLURMAGENT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("SLURMAGENT_APPROVALS_DIR", raising=False)
    monkeypatch.setattr(sys, "argv", ["slurmagent"])
    sweep = box / "sweep"
    SweepStore(sweep).create(SweepState(str(sweep), "local", str(sweep / ".submitit"), 1.0, [TaskRecord(0, ["x=1"])]))
    (sweep / "history.jsonl").write_text("")
    (box / "file").write_text("not what it should be\n")
    (box / "loop").symlink_to("loop")
    for name, kind in (("locked-dir", "dir"), ("locked-file", "file")):
        if kind == "dir":  # readable, it would be a sweep
            (box / name).mkdir()
            (box / name / "sweep.json").write_text((sweep / "sweep.json").read_text())
        else:
            (box / name).write_text((sweep / "sweep.json").read_text())
        (box / name).chmod(0)
    yield box
    for name in ("locked-dir", "locked-file"):
        (box / name).chmod(0o700)


def run_cli(argv: list[str]) -> dict[str, object]:
    out, err = io.StringIO(), io.StringIO()
    code: object
    tb = ""
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exc:
            code = exc.code
        except BaseException:
            code, tb = None, traceback.format_exc()
    return {"code": code, "out": out.getvalue(), "err": err.getvalue(), "tb": tb}


def snapshot(root: Path) -> dict[str, tuple[int, float]]:
    return tree(root.parent)


def check_refused(argv: list[str], got: dict[str, object], bad: str) -> None:
    err = str(got["err"]).strip()
    assert not got["tb"], f"{argv}: {got['tb']}"
    assert got["code"] == 2, f"{argv}: exit {got['code']}; {err or got['out']}"
    assert len(err.splitlines()) == 1 and err.startswith("slurmagent: error:"), f"{argv}: {err!r}"
    named = {bad, repr(bad), str(Path(bad)), repr(str(Path(bad)))}  # as given, or as a path normalises it
    assert any(n in err for n in named), f"{argv}: the message does not name {bad!r}: {err}"


VARIANTS = ("file", "missing", "loop")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("item", PATH_ARGS, ids=arg_id)
def test_every_path_argument_refuses_a_bad_path_in_one_line(
    paths_box: Path, item: tuple[tuple[str, ...], argparse.Action], variant: str
) -> None:
    words, action = item
    argv = argv_for(words, action, variant, paths_box / "sweep")
    before = snapshot(paths_box)
    got = run_cli(argv)
    if variant == "missing" and action.dest in OUTPUTS:  # made: that is what the command is for
        assert got["code"] == 0 and (paths_box / "missing").is_dir(), got
        return
    if variant == "file" and words in FILES_ARE_INPUT:
        assert not got["tb"] and got["code"] in (1, 2) and len(str(got["err"]).splitlines()) <= 1, got
    else:
        check_refused(argv, got, variant)
    assert snapshot(paths_box) == before, f"{argv} wrote something"


@FAST
@given(name=HOSTILE)
def test_a_missing_path_with_a_hostile_name_is_one_line_for_every_path_argument(paths_box: Path, name: str) -> None:
    assume("\x00" not in name and not any(0xD800 <= ord(c) <= 0xDFFF for c in name))  # no argv holds these
    assume(not (paths_box / name).exists() and not os.path.lexists(paths_box / name) and name.strip("./"))
    before = snapshot(paths_box)
    for words, action in PATH_ARGS:
        if action.dest in OUTPUTS:
            continue  # a missing output directory is made: test_render's hostile tests cover those
        if words == ("doctor",) and JOB_ID.fullmatch(name):
            continue  # a job id
        argv = argv_for(words, action, name, paths_box / "sweep")
        got = run_cli(argv)
        policy_name = "/" not in name and not name.endswith((".yaml", ".yml"))
        if words == ("replay",) and action.dest == "policy" and policy_name:
            said = str(got["err"])  # a name; `--` is no name argparse passes on
            assert not got["tb"] and got["code"] == 2 and ("not in conf/policy" in said or "needs a path" in said), got
            continue
        check_refused(argv, got, name)
    assert snapshot(paths_box) == before


# Root reads whatever the file modes say: a child gives up that power for good (its capability
# bounding set loses CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH; the exec then drops them), and runs
# the commands; exit 77 when this root may not drop them (no CAP_SETPCAP).
WITHOUT_DAC = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
for cap in (1, 2):
    if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
        print(f"cannot drop capability {cap}: {os.strerror(ctypes.get_errno())}")
        sys.exit(77)
os.execv(sys.executable, [sys.executable, "-c", sys.argv[1]])
"""
DRIVER = """
import json, sys
from tests.unit.test_hostile import run_cli
print(json.dumps([run_cli(argv) for argv in json.load(sys.stdin)]))
"""


@pytest.mark.parametrize("variant", ["locked-dir", "locked-file"])
def test_every_path_argument_refuses_what_it_may_not_read(paths_box: Path, variant: str) -> None:
    """Unreadable paths (mode 000). Tests run as root here, whom file modes do not stop: the
    commands then run in a child process without root's power to override them (its capability
    bounding set drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH), so the refusal is real."""
    cases = [(words, action, argv_for(words, action, variant, paths_box / "sweep")) for words, action in PATH_ARGS]
    before = snapshot(paths_box)
    if os.geteuid() == 0:
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        proc = subprocess.run(
            [sys.executable, "-c", WITHOUT_DAC, DRIVER],
            input=json.dumps([argv for *_, argv in cases]),
            capture_output=True,
            text=True,
            cwd=paths_box,
            env={**os.environ, "PYTHONPATH": path},
            timeout=300,
        )
        if proc.returncode == 77:
            pytest.skip(f"root that cannot give up reading every file ({proc.stdout.strip()}): no unreadable path")
        assert proc.returncode == 0, proc.stderr[-3000:]
        results = json.loads(proc.stdout.splitlines()[-1])
    else:
        results = [run_cli(argv) for *_, argv in cases]
    for (*_, argv), got in zip(cases, results, strict=True):
        check_refused(argv, got, variant)  # a log it cannot read gets no verdict either
    assert snapshot(paths_box) == before
