"""The skill interface: registry (built-ins + entry-point plugins, broken ones skipped),
the contract every registered skill meets, and `slurmagent skill` with Nagios exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slurmagent.cli import main
from slurmagent.skills import BaseSkill, SkillResult, Status, worst
from slurmagent.skills.registry import BUILTIN, all_skills, get_skill, load_plugins, run_skill

PLUGIN_MODULE = """
from slurmagent.skills import BaseSkill, SkillResult, Status

class DiskSkill(BaseSkill):
    name = "site_disk"
    description = "a site's own check, registered through the entry point"

    def run(self, **inputs):
        return SkillResult(self.name, Status.WARNING, ["scratch 91% full"], {"used_pct": 91})

class NotASkill:
    pass
"""


@pytest.fixture()
def plugin_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A real installed distribution (dist-info with entry_points.txt) on sys.path: one good
    plugin, one whose module does not import, one that is not a skill."""
    (tmp_path / "site_checks.py").write_text(PLUGIN_MODULE)
    dist = tmp_path / "site_checks-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: site-checks\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[slurmagent.skills]\n"
        "site_disk = site_checks:DiskSkill\n"
        "broken = site_checks_missing:Skill\n"
        "wrong = site_checks:NotASkill\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_worst_ranks_critical_over_warning_over_unknown() -> None:
    assert worst([Status.OK, Status.UNKNOWN]) == Status.UNKNOWN
    assert worst([Status.UNKNOWN, Status.WARNING]) == Status.WARNING
    assert worst([Status.WARNING, Status.CRITICAL, Status.UNKNOWN]) == Status.CRITICAL
    assert worst([]) == Status.OK


def test_plugins_are_registered_and_broken_ones_skipped(plugin_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    found, skipped = load_plugins()
    assert list(found) == ["site_disk"]
    assert "ModuleNotFoundError" in skipped["broken"] and "not a BaseSkill" in skipped["wrong"]
    assert "skill plugin broken" in caplog.text
    assert set(all_skills()) == {*BUILTIN, "site_disk"}
    res = run_skill("site_disk")
    assert res.status == Status.WARNING and res.findings == {"used_pct": 91}


def test_cli_lists_plugins_and_exits_with_their_status(plugin_path: Path) -> None:
    env = {"PYTHONPATH": str(plugin_path), "PATH": "/usr/bin:/bin"}
    listing = subprocess.run(
        [sys.executable, "-m", "slurmagent", "skill", "--list"], capture_output=True, text=True, env=env, timeout=120
    )
    assert listing.returncode == 0, listing.stderr
    names = [ln.split()[0] for ln in listing.stdout.splitlines()]
    assert names == [*BUILTIN, "site_disk"]
    assert "skipped plugin broken" in listing.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "slurmagent", "skill", "site_disk", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 1 and json.loads(proc.stdout)["reasons"] == ["scratch 91% full"]


def test_unknown_skill_is_bad_input_naming_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["skill", "no_such_skill"]) == 2  # bad input, as every slurmagent command
    err = capsys.readouterr().err
    assert "unknown skill 'no_such_skill'" in err and "gpu_health_check" in err


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_contract(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Every registered skill: named and described; `run()` never raises and returns a
    SkillResult of its own name, JSON-serialisable, with reasons when not OK; an unknown
    input is UNKNOWN naming it; the CLI prints that JSON and exits with its status; a bad
    command-line argument is bad input (2)."""
    cls = get_skill(name)
    assert issubclass(cls, BaseSkill) and cls.name == name and cls.description.strip()
    res = run_skill(name)
    assert isinstance(res, SkillResult) and res.skill == name and isinstance(res.status, Status)
    assert res.status == Status.OK or res.reasons
    json.dumps(res.to_json(), default=str)
    bad = run_skill(name, no_such_input=1)
    assert bad.status == Status.UNKNOWN and "no_such_input" in bad.reasons[0]
    code = main(["skill", name, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["skill"] == name and code == Status[out["status"]].value
    assert main(["skill", name, "--no-such-flag"]) == 2


def test_human_output_shows_the_findings(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["skill", "env_check"])
    out = capsys.readouterr().out
    assert out.startswith("env_check ") and "findings:" in out and "python: 3." in out and "torch:" in out
    assert code in (0, 1, 2, 3)
