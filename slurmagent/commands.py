"""Command lines printed for a person to paste: one owner, so that each runs as printed.

A printed command must work in the shell of the person who ran slurmagent, from any directory:
it names the entry point they can run (`slurmagent` when that console script on PATH is this
installation's, else this interpreter's `-m slurmagent`), quotes every argument for the shell
(sweep directories with spaces), and carries the config flags the run was composed with
(`--config-dir`, `--config-name`, `--config-path`), the directories made absolute.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["config_flags", "module_argv", "python_for_paste", "rerun_prefix", "slurmagent_argv", "slurmagent_command"]

# Hydra's flags that choose the configs; a command that runs the same job again needs them
_CONFIG_FLAGS = {"--config-dir": "--config-dir", "-cd": "--config-dir", "--config-name": "--config-name",
                 "-cn": "--config-name", "--config-path": "--config-path", "-cp": "--config-path"}  # fmt: skip


def _same_file(found: str | None, wanted: str) -> bool:
    """`found` (from PATH) is `wanted` itself: the same path, not merely the same interpreter a
    virtualenv's `python` links to (another venv's packages would be missing)."""
    return found is not None and Path(found).absolute() == Path(wanted).absolute()


def python_for_paste() -> str:
    """The interpreter running now, as a person types it: `python` (or `python3`) when that is
    the one on PATH, else its full path."""
    for name in ("python", "python3"):
        if _same_file(shutil.which(name), sys.executable):
            return name
    return sys.executable


def slurmagent_argv() -> list[str]:
    """How a person runs slurmagent here: `slurmagent` when the console script on PATH sits
    beside the running interpreter (this installation), else `PYTHON -m slurmagent`."""
    script = shutil.which("slurmagent")
    if script is not None and Path(script).absolute().parent == Path(sys.executable).absolute().parent:
        return ["slurmagent"]
    return module_argv(python_for_paste())


def module_argv(python: str) -> list[str]:
    """`PYTHON -m slurmagent`: slurmagent run by a given interpreter (a job's, a fix's)."""
    return [python, "-m", "slurmagent"]


def slurmagent_command(*args: str | os.PathLike[str]) -> str:
    """`slurmagent ARGS…` as a shell line that runs as printed."""
    return shlex.join([*slurmagent_argv(), *(str(a) for a in args)])


def config_flags(argv: Sequence[str], cwd: Path | None = None) -> list[str]:
    """The config-choosing flags of a command line (`--config-dir conf`, `-cn x`, `--config-dir=conf`),
    spelt long, with `--config-dir` made absolute (it is relative to the directory it was typed in;
    `--config-path` stays as given: Hydra reads it relative to the application's file)."""
    base = cwd or Path.cwd()
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        flag, eq, value = arg.partition("=")
        if flag in _CONFIG_FLAGS:
            if not eq:
                if i + 1 >= len(argv):
                    break
                value = argv[i + 1]
                i += 1
            long = _CONFIG_FLAGS[flag]
            if long == "--config-dir":
                value = str((base / value).absolute()) if not Path(value).is_absolute() else value
            out += [long, value]
        i += 1
    return out


def rerun_prefix(own_app: bool, argv: Sequence[str] | None = None) -> list[str]:
    """The start of a command line that runs the same application with the same configs:
    slurmagent's own entry, or `PYTHON /abs/path/app.py` for a user's own Hydra app."""
    argv = list(sys.argv if argv is None else argv)
    head = slurmagent_argv() if own_app else [python_for_paste(), str(Path(argv[0]).absolute())]
    return [*head, *config_flags(argv[1:])]
