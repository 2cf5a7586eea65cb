"""`slurmagent skill …`: list the skills, or run one with its own arguments; the exit code
is the result's Nagios status (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN), and 2 for bad input
(an unknown skill, a bad argument), as every slurmagent command."""

from __future__ import annotations

import argparse
import json
import sys

from slurmagent.cli.exits import EXIT_BAD_INPUT
from slurmagent.errors import SkillError
from slurmagent.skills._base import SkillResult, Status
from slurmagent.skills.registry import all_skills, get_skill, load_plugins, run_skill

BAD_INPUT = EXIT_BAD_INPUT  # an unknown skill or a bad argument (Nagios' CRITICAL is 2 too)


FINDINGS_LINES = 60  # the human output shows this much of the findings; --json has all


def _print_result(result: SkillResult, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result.to_json(), indent=1, default=str))
        return
    print(f"{result.skill} {result.status.name}" + (f" - {result.reasons[0]}" if result.reasons else ""))
    for reason in result.reasons[1:]:
        print(f"  {reason}")
    if result.findings:
        import yaml

        text = yaml.safe_dump(json.loads(json.dumps(result.findings, default=str)), sort_keys=False).splitlines()
        print("findings:")
        for line in text[:FINDINGS_LINES]:
            print(f"  {line}")
        if len(text) > FINDINGS_LINES:
            print(f"  … {len(text) - FINDINGS_LINES} more line(s): --json prints them all")


def skill_args(sk: argparse.ArgumentParser) -> None:
    sk.add_argument("--list", action="store_true", help="list the registered skills")
    sk.add_argument("--json", action="store_true", help="print the result as JSON")
    sk.add_argument("name", nargs="?", help="the skill to run")
    sk.add_argument("args", nargs=argparse.REMAINDER, help="the skill's own arguments (see NAME --help)")


def skill(args: argparse.Namespace) -> int:
    """Exit codes are Nagios': 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN; a bad skill name or argument is 2.
    `slurmagent skill NAME --help` lists the skill's own arguments."""
    list_, as_json, name, rest = args.list, args.json, args.name, list(args.args)
    if "--json" in rest:  # `skill NAME ARGS --json`: the flag after the skill's own arguments
        rest = [a for a in rest if a != "--json"]
        as_json = True
    if list_ or name is None:
        skills = all_skills()
        skipped = load_plugins()[1]
        if as_json:
            print(json.dumps({"skills": {n: c.description for n, c in skills.items()}, "skipped_plugins": skipped}))
        else:
            for n, c in skills.items():
                print(f"{n:<24} {c.description}")
            for ep, why in skipped.items():
                print(f"(skipped plugin {ep}: {why})", file=sys.stderr)
        return int(Status.OK) if list_ else BAD_INPUT
    try:
        cls = get_skill(name)
    except SkillError as exc:
        print(f"slurmagent: error: {exc}", file=sys.stderr)
        return BAD_INPUT
    parser = argparse.ArgumentParser(prog=f"slurmagent skill {name}", description=cls.description)
    cls.add_arguments(parser)
    try:
        ns = parser.parse_args(rest)
    except SystemExit as exc:  # --help (0) or a bad argument (argparse's 2: bad input)
        return 0 if exc.code == 0 else BAD_INPUT
    result = run_skill(name, **cls.inputs_from_args(ns))
    _print_result(result, as_json)
    return result.exit_code
