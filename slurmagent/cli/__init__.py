"""The command line: one entry (`entry.main`), one list of commands (`registry.COMMANDS`), one
mapping of errors to exit codes (`exits`); a module per command or family of commands.

    entry.py     route: a command, `--help`, or a run/sweep through Hydra (hydra.py)
    registry.py  every command: its module and one-line summary
    exits.py     exit codes and which error ends in which
    args.py      paths and sweeps named on the command line, checked before use
    sweeps.py, logs.py, results.py, doctor.py, plan.py, render.py, skill.py, safety.py, version.py
"""

from slurmagent.cli.entry import main
from slurmagent.cli.registry import SUBCOMMANDS

__all__ = ["SUBCOMMANDS", "main"]
