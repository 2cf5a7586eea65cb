"""Every subcommand, in one list: `COMMANDS` drives `slurmagent --help`, each command's parser,
did-you-mean and dispatch.

Adding a command is one module and one line here. The module, `slurmagent.cli.<module>`, has
for a command NAME (a `-` in it spelt `_`):

    def NAME_args(parser: argparse.ArgumentParser) -> None   # its arguments (optional)
    def NAME(args: argparse.Namespace) -> int                # runs it; returns an exit code
                                                             # (cli/exits.py); its docstring is
                                                             # the long part of `NAME --help`

Only the module of the command that runs is imported (`slurmagent status` loads no safety or
planning code); `--help` reads the one-line summaries from here.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    name: str
    module: str  # slurmagent.cli.<module>
    summary: str  # one line: `slurmagent --help` and the head of `NAME --help`

    @property
    def attr(self) -> str:
        return self.name.replace("-", "_")

    def load(self) -> tuple[Callable[[argparse.Namespace], int], Callable[[argparse.ArgumentParser], None] | None]:
        module = importlib.import_module(f"slurmagent.cli.{self.module}")
        return getattr(module, self.attr), getattr(module, f"{self.attr}_args", None)


COMMANDS: tuple[Command, ...] = (
    Command("sweeps", "sweeps", "list your recent sweeps, newest first: the tasks' states and the sweep directory"),
    Command("status", "sweeps", "print a sweep's table: every task's state, runs, result or reason"),
    Command("watch", "sweeps", "re-attach to a sweep: supervise it to the end and collect its results"),
    Command("logs", "logs", "show where a sweep's logs are, or print one task's logs (every attempt), or follow them"),
    Command("results", "results", "one row per task: its varying overrides, state, runs and result values"),
    Command(
        "report",
        "results",
        "write an HTML report: a plot of every reported metric over steps (PNGs beside it) and the results",
    ),
    Command(
        "dashboard",
        "dashboard",
        "serve a sweep's report on 127.0.0.1, live: every task's progress now, plots rewritten as it runs",
    ),
    Command(
        "track",
        "track",
        "send a sweep's metrics its trackers (TensorBoard, MLflow) have not taken yet, to each task's own run",
    ),
    Command("cancel", "sweeps", "cancel a sweep's unfinished tasks (and its detached supervisor)"),
    Command(
        "supervise",
        "sweeps",
        "what a detached sweep's supervisor runs (a Slurm job or a process): supervise it to the end",
    ),
    Command("render", "render", "write a standalone sbatch script (and its config) for a login node"),
    Command(
        "plan",
        "plan",
        "show what a job would ask Slurm for, and why: GPU type, partition, time, memory, start, cost",
    ),
    Command("version", "version", "print the version"),
    Command("doctor", "doctor", "say why a job or a sweep's tasks failed, and what to do"),
    Command("skill", "skill", "run a skill (health, validation, resume, data): NAME [args], or --list"),
    Command("audit", "safety", "verify or show the audit log of automated actions"),
    Command("approvals", "safety", "list pending approvals"),
    Command("approve", "safety", "approve a pending action as the calling user"),
    Command("reject", "safety", "reject a pending action as the calling user"),
    Command("pause", "safety", "stop automated actions (kill switch)"),
    Command("resume", "safety", "lift the kill switch"),
    Command("replay", "safety", "run a policy over a recorded history, executing nothing"),
)


def names() -> tuple[str, ...]:
    """Every command's name, in the order of COMMANDS (read at each call: a test may add one)."""
    return tuple(c.name for c in COMMANDS)


SUBCOMMANDS = names()


def _add(sub: argparse._SubParsersAction, command: Command) -> Callable[[argparse.Namespace], int]:  # type: ignore[type-arg]
    run, add_args = command.load()
    doc = inspect.getdoc(run) or ""
    parser = sub.add_parser(
        command.name,
        help=command.summary,
        description=f"{command.summary}.\n\n{doc}".rstrip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if add_args is not None:
        add_args(parser)
    return run


def build_parser(
    names: Sequence[str] | None = None,
) -> tuple[argparse.ArgumentParser, dict[str, Callable[[argparse.Namespace], int]]]:
    """A parser of `names` (default: every command) and each one's handler."""
    p = argparse.ArgumentParser(prog="slurmagent", description="slurmagent subcommands (anything else goes to Hydra)")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    handlers = {c.name: _add(sub, c) for c in COMMANDS if names is None or c.name in names}
    return p, handlers


def help_page() -> str:
    """`slurmagent --help`: how to run and sweep, and every subcommand in one line each."""
    return "\n".join(
        [
            "usage: slurmagent [OVERRIDE ...] [-m]     a run, or a sweep with -m (Hydra overrides: key=value)",
            "       slurmagent COMMAND [ARGS]          one of the commands below",
            "",
            "Run and sweep:",
            "  slurmagent +experiment=digits_mlp                          one run (cluster=local runs it here)",
            "  slurmagent +experiment=digits_mlp -m optim.lr=1e-3,1e-2     a sweep: one Slurm job array",
            "  slurmagent +experiment=digits_mlp -m optim.lr=1e-3 --detach  submit, leave it to a supervisor, return",
            "  slurmagent --cfg job +experiment=digits_mlp                print the composed config",
            "  slurmagent help config                                     the config groups and their defaults",
            "  slurmagent --hydra-help                                    Hydra's own flags",
            "",
            "Commands (slurmagent COMMAND --help for each one's options):",
            *(f"  {c.name:<10} {c.summary}" for c in COMMANDS),
            "",
            "Exit codes: 0 ok, 1 a task or command failed, 2 bad input (then nothing was submitted).",
        ]
    )


def unknown_command(word: str) -> str:
    close = difflib.get_close_matches(word, [*names(), "help"], n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}? " if close else ""
    return (
        f"slurmagent: error: unknown command {word!r}; {hint}commands: {', '.join(names())} "
        "(a Hydra override looks like key=value; slurmagent --help lists both)"
    )
