"""`slurmagent …` and `python -m slurmagent …`: a first word that is a command (cli/registry.py)
runs it; anything else goes to Hydra (cli/hydra.py). Returns an exit code (cli/exits.py)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from slurmagent.cli.exits import EXIT_BAD_INPUT, EXIT_OK, command_exit, say
from slurmagent.cli.hydra import bare_word, run_hydra
from slurmagent.cli.registry import build_parser, help_page, names, unknown_command

HELP_WORDS = ("-h", "--help", "help")


def path_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Every path-typed argument of every subcommand."""
    found: list[argparse.Action] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += path_actions(sub)
        elif action.type is Path:
            found.append(action)
    return found


def run_command(args: list[str]) -> int:
    """A subcommand: only its own module is loaded and parsed."""
    parser, handlers = build_parser([args[0]])
    ns = parser.parse_args(args)
    for action in path_actions(parser):
        # argparse drops a value of `--`: `--config-dir=--` arrives as [] instead of a path
        if isinstance(getattr(ns, action.dest, None), list) and action.nargs is None:
            flag = action.option_strings[0] if action.option_strings else action.dest
            say(f"{flag} needs a path (got '--')")
            return EXIT_BAD_INPUT
    try:
        return handlers[ns.cmd](ns)
    except Exception as exc:
        code = command_exit(exc)
        if code is None:
            raise
        return code


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] and args[0] in HELP_WORDS:
        if args[1:] == ["config"]:
            return run_hydra(["--help"])  # Hydra's page for this app: config groups and defaults
        if args[1:2] and args[1] in names():
            return main([args[1], "--help"])
        print(help_page())
        return EXIT_OK
    if args[:1] and args[0] in names():
        return run_command(args)
    if args[:1] and bare_word(args[0]):
        print(unknown_command(args[0]), file=sys.stderr)
        return EXIT_BAD_INPUT
    return run_hydra(args)
