"""Hostile input never reaches a shell and never escapes its directory.

Hypothesis feeds strings with shell metacharacters, newlines and `../` through config
parsing (job specs, sbatch flags, the safety policy), `slurmagent render` and the
submission path (submitit's sbatch script, built from our flags; and one real sweep on the
local backend), and checks that nothing outside the test's directory changed. A static
test fails if `shell=True`, `os.system` or another shell entry point appears in the package.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hydra.errors import HydraException
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from omegaconf.errors import OmegaConfBaseException

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
    assert [name for name, text in texts.items() if "shell=True" in text or "os.system" in text] == []
