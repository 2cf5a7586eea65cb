"""Paths and sweeps named on the command line, checked before anything reads or writes them:
a clear one-line error naming the path and what is wrong (cli/exits.py says it)."""

from __future__ import annotations

import argparse
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

from slurmagent.cli.exits import os_why
from slurmagent.errors import SlurmAgentError, SweepStateError

SWEEP_HELP = "a sweep directory (the multirun/<date>/<time> folder the launcher printed)"
NEWEST_HELP = f"{SWEEP_HELP}; default: the newest sweep (slurmagent sweeps lists them)"
CONFIG_DIR_HELP = "a directory of your own configs, searched as with Hydra's --config-dir (e.g. conf)"


def shown_path(path: Path) -> str:
    """A path for a one-line message: as typed, or quoted when it holds a line break or another
    character a terminal would not show as itself."""
    text = str(path)
    return text if text.isprintable() else repr(text)


def check_path(path: Path, want: str, what: str, error: type[SlurmAgentError] = SlurmAgentError) -> Path:
    """`path`, given on the command line as `what` ("--sweep", "sweep directory"), checked
    before anything is read or written: it exists and can be read, and is a directory
    (`want`="dir"), a file ("file") or either ("any"); else `error`, one line naming it."""
    name = shown_path(path)
    try:
        st = path.stat()
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte
        why = os_why(exc) if isinstance(exc, OSError) else str(exc)
        raise error(f"{what} {name}: {why}") from None
    is_dir = stat.S_ISDIR(st.st_mode)
    if want == "dir" and not is_dir:
        raise error(f"{what} {name} is a file, not a directory")
    if want == "file" and is_dir:
        raise error(f"{what} {name} is a directory, not a file")
    try:
        if is_dir:
            with os.scandir(path):
                pass
        else:
            with open(path, "rb"):
                pass
    except OSError as exc:
        raise error(f"{what} {name}: {os_why(exc)}") from None
    return path


def check_output_dir(path: Path, what: str, error: type[SlurmAgentError] = SlurmAgentError) -> Path:
    """A directory a command writes into (created when missing), checked before anything is
    written: not a file, no symlink loop, and writable (it, or the folder it would be made in)."""
    name, probe = shown_path(path), path
    while True:
        try:
            st = probe.stat()
        except FileNotFoundError:
            if probe.parent == probe:
                break
            probe = probe.parent
            continue
        except (OSError, ValueError) as exc:
            why = os_why(exc) if isinstance(exc, OSError) else str(exc)
            raise error(f"{what} {name}: {why}") from None
        if not stat.S_ISDIR(st.st_mode):
            where = name if probe == path else f"{name}: {shown_path(probe)}"
            raise error(f"{what} {where} is a file, not a directory")
        if not os.access(probe, os.W_OK | os.X_OK):
            raise error(f"{what} {name}: permission denied" + ("" if probe == path else f" (in {shown_path(probe)})"))
        break
    return path


JOB_ID = re.compile(r"\d+(_\d+)?")  # a Slurm job (123), array task (123_4) or array (123): doctor's other target


def sweep_dir_arg(path: Path) -> Path:
    """A sweep directory named on the command line, checked before anything reads or writes
    it: a SweepStateError naming it (missing, a file, a symlink loop, unreadable, no sweep.json)."""
    from slurmagent.supervise.state import STATE_FILE

    if not os.path.lexists(path):
        raise SweepStateError(
            f"{shown_path(path)} is not a slurmagent sweep directory: no such directory, so no {STATE_FILE} "
            "(slurmagent sweeps lists yours)"
        )
    check_path(path, "dir", "sweep directory", SweepStateError)
    state = path / STATE_FILE
    try:
        state.stat()
    except FileNotFoundError:
        raise SweepStateError(
            f"{shown_path(path)} is not a slurmagent sweep directory: no {STATE_FILE} in it "
            "(slurmagent sweeps lists yours)"
        ) from None
    except OSError:
        pass  # check_path names what is wrong
    check_path(state, "file", "sweep state", SweepStateError)
    return path


def newest_sweep(command: str) -> Path:
    """The newest sweep (the first line of `slurmagent sweeps`), said on stderr."""
    from slurmagent.launch.index import find_sweeps, index_path, shown

    found = find_sweeps(limit=1)
    if not found:
        raise SweepStateError(
            f"no sweep directory given, and no sweep under ./multirun nor in your index ({index_path()}); "
            f"give one: slurmagent {command} DIR"
        )
    print(f"slurmagent: {command}: the newest sweep, {shown(found[0].path)}", file=sys.stderr)
    return found[0].path


def sweep_of(args: argparse.Namespace) -> Path:
    """args.sweep_dir checked, or the newest sweep when none was given; set on args too."""
    args.sweep_dir = newest_sweep(args.cmd) if args.sweep_dir is None else sweep_dir_arg(args.sweep_dir)
    return args.sweep_dir  # type: ignore[no-any-return]


def console() -> Any:
    """A rich console for tables: the terminal's width, or 200 columns into a pipe or file."""
    from rich.console import Console

    return Console(width=200) if not sys.stdout.isatty() else Console()
