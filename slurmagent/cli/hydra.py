"""A run or a sweep: everything that is not a subcommand goes to Hydra (`+experiment=x -m a=1,2`,
`--help`, `--info plugins`), with slurmagent's own `--detach` and flags anywhere among the
overrides."""

from __future__ import annotations

import os
import sys

from slurmagent.cli.exits import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, run_exit, say

DETACH_FLAGS = ("--detach", "-d")  # = hydra.launcher.detach=true: submit, leave it to a supervisor, return
_FLAGS_WITH_VALUE = {
    "--cfg",
    "-c",
    "--package",
    "-p",
    "--config-path",
    "-cp",
    "--config-name",
    "-cn",
    "--config-dir",
    "-cd",
    "--experimental-rerun",
    "--info",
    "-i",
    "--shell-completion",
    "-sc",
}
_INFO_CHOICES = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")


def bare_word(arg: str) -> bool:
    """A word that is neither a flag nor a Hydra override (key=value, +key=…, ~key): a command."""
    return not arg.startswith(("-", "+", "~")) and "=" not in arg


def hoist_flags(argv: list[str]) -> list[str]:
    """Hydra's argparse stops at a flag between overrides (`+experiment=x -m a=1,2`): the flags
    first, keeping their values, so that both orders work as users expect."""
    flags: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("-") and "=" not in a:
            flags.append(a)
            takes = a in _FLAGS_WITH_VALUE and a not in ("--info", "-i", "--shell-completion", "-sc")
            optional = a in ("--info", "-i")
            has_next = i + 1 < len(argv) and not argv[i + 1].startswith("-")
            if has_next and (takes or (optional and argv[i + 1] in _INFO_CHOICES)):
                flags.append(argv[i + 1])
                i += 1
        else:
            rest.append(a)
        i += 1
    return [*flags, *rest]


def run_hydra(argv: list[str]) -> int:
    import hydra

    from slurmagent.job.task import run_task

    # let exceptions reach us, so bad input ends in one clear line instead of a traceback
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    if any(a in DETACH_FLAGS for a in argv) and not {"-m", "--multirun"} & set(argv):
        say("--detach applies to sweeps: add -m (a one-task sweep is fine)")
        return EXIT_BAD_INPUT
    if any(a in DETACH_FLAGS for a in argv):  # slurmagent's own flag: the launcher option, spelt short
        argv = [*(a for a in argv if a not in DETACH_FLAGS), "hydra.launcher.detach=true"]
    sys.argv = [sys.argv[0] if sys.argv else "slurmagent", *hoist_flags(argv)]
    main = hydra.main(version_base="1.3", config_path="pkg://slurmagent.conf", config_name="config")(run_task)
    try:
        main()
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else EXIT_FAILED
    except Exception as exc:
        code = run_exit(exc)
        if code is None:
            raise
        return code
    return EXIT_OK
