"""Exit codes, and which error ends in which: the one mapping every command and every run uses.

0 ok, 1 a task or command failed, 2 bad input (nothing was submitted, written or cancelled);
an error is one line on stderr naming the key, value or path and what would be valid.
"""

from __future__ import annotations

import errno
import sys

from slurmagent.errors import ConfigError, SlurmAgentError, SlurmUnavailableError, SubmissionRefused, SweepRefusedError

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
# a run's errors that mean the request itself was refused (bad input, Slurm said no to it): exit 2;
# any other error of a run is a task that failed: exit 1, with its lines (a traceback) kept
REFUSED = (ConfigError, SlurmUnavailableError, SubmissionRefused, SweepRefusedError)

_WHY = {
    errno.ENOENT: "no such file or directory",
    errno.ELOOP: "a loop of symbolic links",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENOTDIR: "a part of it is a file, not a directory",
    errno.ENAMETOOLONG: "the name is too long",
}


def os_why(exc: OSError) -> str:
    """What is wrong with a path, in words (an OSError's errno)."""
    return _WHY.get(exc.errno or 0, exc.strerror or type(exc).__name__)


def one_line(text: object) -> str:
    """An error message as one line: Hydra's own span several (a hint; a heading ending in ':'
    and its indented items, which become `heading: a, b, c`)."""
    out, items = "", False
    for raw in str(text).splitlines():
        part = raw.strip()
        if not part:
            continue
        if out.endswith(":") or (items and raw[:1].isspace()):
            out += (", " if items else " ") + part
            items = raw[:1].isspace()
        else:
            out, items = f"{out}; {part}" if out else part, False
    return out


def own_cause(exc: BaseException) -> SlurmAgentError | None:
    """Our own error inside one Hydra wrapped (a launcher or sweeper refusing its options
    while Hydra instantiates it: "Error in call to target …")."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, SlurmAgentError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _from_config(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] in ("hydra", "omegaconf")


def say(message: object) -> None:
    print(f"slurmagent: error: {message}", file=sys.stderr)


def command_exit(exc: Exception) -> int | None:
    """A subcommand's error, said in one line, and its exit code; None: not ours, let it raise.
    Every slurmagent error of a command is bad input (it checks before it acts)."""
    if isinstance(exc, SlurmAgentError):
        say(one_line(exc))
        return EXIT_BAD_INPUT
    if _from_config(exc):  # a config that does not compose
        from slurmagent.config import config_error

        say(one_line(own_cause(exc) or config_error(exc) or exc))
        return EXIT_BAD_INPUT
    if isinstance(exc, OSError):  # a file the command needed, past the checks of its arguments
        where = f"{exc.filename}: " if exc.filename else ""
        say(f"{where}{os_why(exc)}")
        return EXIT_FAILED
    return None


def run_exit(exc: Exception) -> int | None:
    """A run's or sweep's error (through Hydra), said, and its exit code; None: let it raise."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if not isinstance(exc, (SlurmAgentError, HydraException, OmegaConfBaseException)):
        return None
    own = own_cause(exc)
    if own is None:
        from slurmagent.config import config_error

        say(one_line(config_error(exc) or exc))
        return EXIT_BAD_INPUT
    refused = isinstance(own, REFUSED)
    say(one_line(own) if refused else own)  # a failed task's error keeps its lines (its traceback)
    return EXIT_BAD_INPUT if refused else EXIT_FAILED
