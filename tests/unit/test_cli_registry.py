"""The command line's one list (slurmagent/cli/registry.py): `--help`, did-you-mean and each
command's own `--help` come from it, and a command is one module plus one line there."""

from __future__ import annotations

import argparse
import subprocess
import sys
import types

import pytest

from slurmagent.cli import main, registry
from slurmagent.cli.exits import EXIT_BAD_INPUT, EXIT_OK


def test_the_help_page_lists_every_registered_command_with_its_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == EXIT_OK
    out = capsys.readouterr().out
    for command in registry.COMMANDS:
        assert f"  {command.name:<10} {command.summary}" in out


@pytest.mark.parametrize("command", registry.COMMANDS, ids=lambda c: c.name)
def test_each_commands_help_is_built_from_the_registry(
    command: registry.Command, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as ended:
        main([command.name, "--help"])
    assert ended.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: slurmagent {command.name}")
    assert f"{command.summary}." in " ".join(out.split())  # argparse may wrap it
    run, _ = command.load()
    assert callable(run)


def test_a_misspelt_command_gets_did_you_mean(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["staus"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "unknown command 'staus'; did you mean status?" in err
    assert all(name in err for name in registry.names())


def test_a_command_is_one_module_and_one_registry_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = types.ModuleType("slurmagent.cli.greet")

    def greet_args(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("who")

    def greet(args: argparse.Namespace) -> int:
        """Says hello to WHO."""
        print(f"hello, {args.who}")
        return EXIT_OK

    module.greet_args, module.greet = greet_args, greet  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "slurmagent.cli.greet", module)
    monkeypatch.setattr(registry, "COMMANDS", (*registry.COMMANDS, registry.Command("greet", "greet", "say hello")))
    assert main(["greet", "world"]) == EXIT_OK
    assert capsys.readouterr().out == "hello, world\n"
    assert main(["--help"]) == EXIT_OK
    assert "  greet      say hello" in capsys.readouterr().out
    assert main(["gret", "x"]) == EXIT_BAD_INPUT
    assert "did you mean greet?" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["greet", "--help"])
    assert "say hello.\n\nSays hello to WHO." in capsys.readouterr().out


def test_a_command_loads_only_its_own_module() -> None:
    """`slurmagent version` imports no other command's module (lazy, as pip's commands_dict)."""
    code = (
        "import sys; from slurmagent.cli import main; main(['version']); "
        "print(sorted(m for m in sys.modules if m.startswith('slurmagent.cli.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = out.splitlines()[-1]
    assert "slurmagent.cli.version" in loaded
    for other in ("safety", "plan", "sweeps", "doctor", "skill"):
        assert f"slurmagent.cli.{other}'" not in loaded
