"""The safety commands: audit, approvals, approve, reject, pause, resume, replay (the gate's
records and decisions, as people read and make them)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from slurmagent.cli.args import check_path, console, shown_path
from slurmagent.cli.exits import EXIT_FAILED, EXIT_OK
from slurmagent.commands import slurmagent_command
from slurmagent.errors import ApprovalError, AuditError, PolicyError

WHERE = "a sweep directory, or an audit log file (a sweep's audit.jsonl, or your own one)"


# -- audit ----------------------------------------------------------------------------------
def audit_path(given: Path) -> tuple[Path, str]:
    """The audit log a command means — a sweep directory's `audit.jsonl`, or the file given —
    and what is wrong with it: "" (it is there), "none" (a sweep directory where nothing was
    recorded yet) or "deleted" (the head file survives the log). A file named that does not
    exist is an AuditError (bad input)."""
    from slurmagent.safety.paths import SWEEP_AUDIT

    is_dir = given.is_dir()
    if is_dir:
        check_path(given, "dir", "audit log's directory", AuditError)
    path = given / SWEEP_AUDIT if is_dir else given
    if path.exists():
        return check_path(path, "file", "audit log", AuditError), ""
    if path.with_name(path.name + ".head").exists():
        return path, "deleted"
    if not is_dir:  # a file named that is not there: a typo, not an empty history
        if os.path.lexists(given):  # there, but it cannot be read: a symlink loop, a folder that is a file…
            check_path(given, "any", "audit log", AuditError)
        raise AuditError(f"{shown_path(given)}: no such audit log (give a sweep directory or its audit.jsonl)")
    return path, "none"


def audit_args(a: argparse.ArgumentParser) -> None:
    asub = a.add_subparsers(dest="audit_cmd", required=True)
    av = asub.add_parser("verify", help="check the hash chain; names an edited/deleted/reordered/truncated record")
    av.add_argument("path", type=Path, help=WHERE)
    ash = asub.add_parser("show", help="print the records as a table")
    ash.add_argument("path", type=Path, help=WHERE)
    ash.add_argument("--job", default=None, help="only this job id (or target)")
    ash.add_argument("--action", default=None, help="only this action kind (resubmit, cancel, …)")
    ash.add_argument("--decision", default=None, help="only this decision (allow, deny, needs_approval, held, …)")
    ash.add_argument("--since", default=None, help="only records since: 30m, 2h, 1d, an ISO time or a unix time")
    ash.add_argument("--json", action="store_true")


def audit(args: argparse.Namespace) -> int:
    from slurmagent.safety.audit import AuditLog, audit_table, filter_records, parse_since, verify

    path, missing = audit_path(args.path)
    if missing == "none":
        print(f"{path}: no automated action has been recorded there yet (no audit log)")
        return EXIT_OK
    if missing == "deleted":
        print(f"{path}: deleted: the log is gone but its head file {path.name}.head is still there")
        return EXIT_FAILED
    if args.audit_cmd == "verify":
        problems = verify(path)
        count = len(AuditLog(path).records()) if not problems else None
        if not problems:
            print(f"{path}: {count} record(s), hash chain intact")
            return EXIT_OK
        for p in problems:
            print(f"{path}: {p.kind}: {p.message}")
        return EXIT_FAILED
    try:
        records = AuditLog(path).records()
    except FileNotFoundError:
        raise AuditError(f"{path}: no such audit log") from None
    except ValueError as exc:
        check = slurmagent_command("audit", "verify", path)
        raise AuditError(f"{path} has a record that is not JSON ({exc}); run `{check}`") from None
    since = parse_since(args.since) if args.since else None
    rows = filter_records(records, args.job, args.action, args.decision, since)
    if args.json:
        for r in rows:
            print(json.dumps(r, default=str))
    else:
        # the summary on its own line: a table title would wrap a long path mid-sentence
        print(f"{path}: {len(rows)} of {len(records)} record(s)")
        console().print(audit_table(rows, "audit"))
    return EXIT_OK


# -- approvals ------------------------------------------------------------------------------
def _store(sweep: Path | None) -> Any:
    from slurmagent.safety.approvals import ApprovalStore
    from slurmagent.safety.paths import APPROVALS_DIR, approvals_dir

    if sweep is not None:
        return ApprovalStore(approvals_dir(check_path(sweep, "dir", "--sweep", ApprovalError)))
    if os.environ.get("SLURMAGENT_APPROVALS_DIR"):
        return ApprovalStore(os.environ["SLURMAGENT_APPROVALS_DIR"])
    if (Path.cwd() / APPROVALS_DIR).is_dir():
        return ApprovalStore(Path.cwd() / APPROVALS_DIR)
    raise ApprovalError(
        "where are the approvals? pass --sweep SWEEP_DIR, set SLURMAGENT_APPROVALS_DIR, or run in the sweep directory"
    )


def approvals_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--sweep", type=Path, default=None, help="a sweep directory: its approvals")
    ap.add_argument("--all", action="store_true", help="also decided, executed and expired ones")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--run", action="store_true", help="run approved actions that have not run yet (as the owner)")


def approvals(args: argparse.Namespace) -> int:
    from rich.table import Table
    from rich.text import Text

    store = _store(args.sweep)
    if args.run:
        return _run_approved(store)
    statuses = [s for s in store.statuses() if args.all or s.state in ("pending", "approved")]
    if args.json:
        for s in statuses:
            print(json.dumps({"id": s.request.id, "state": s.state, "approvers": s.approvers, **s.request.__dict__}))
        return EXIT_OK
    table = Table(title=Text(f"approvals in {store.dir}: {len(statuses)}"))
    for col in ("id", "state", "action", "target", "rule", "approvals", "requester", "expires", "reason"):
        table.add_column(col)
    for s in statuses:
        r = s.request
        cells = (
            r.id,
            s.state,
            str(r.action.get("kind")),
            str(r.action.get("target")),
            r.rule,
            f"{len(s.approvers)}/{r.approvals}" + (f" ({', '.join(s.approvers)})" if s.approvers else ""),
            r.requester,
            datetime.fromtimestamp(r.expires_at).strftime("%Y-%m-%d %H:%M"),
            str(r.action.get("reason", "")),
        )
        table.add_row(*(Text(c) for c in cells))
    console().print(table)
    return EXIT_OK


def _approved_gate(store: Any, request: Any) -> Any:
    from slurmagent.safety.audit import AuditLog
    from slurmagent.safety.executors import standalone_executors
    from slurmagent.safety.gate import Gate

    sweep = Path(request.sweep_dir)
    gate = Gate(AuditLog(request.audit), standalone_executors(sweep), sweep_dir=sweep, job=request.job)
    gate.approvals = store
    return gate


def _report(out: Any) -> int:
    if out.held:
        print(f"held: {out.decision.rule}; it runs after `{slurmagent_command('resume')}`")
    elif out.executed:
        print(f"executed: {json.dumps(out.result, default=str)}")
    elif out.result.get("error"):
        print(f"failed: {out.result['error']}")
        return EXIT_FAILED
    elif out.result.get("waiting"):
        print(
            f"approved, not run here: {out.result['waiting']}; the sweep's owner runs it with "
            "`slurmagent approvals --sweep DIR --run`"
        )
    else:
        print("approved; the sweep's supervisor runs it on its next poll")
    return EXIT_OK


def _run_approved(store: Any) -> int:
    """Run every approved action that has not run yet and needs no supervisor."""
    code = EXIT_OK
    ready = [s for s in store.statuses() if s.state == "approved"]
    for st in ready:
        print(f"{st.request.id}: {st.request.action.get('kind')} {st.request.action.get('target')}: ", end="")
        code = max(code, _report(_approved_gate(store, st.request).run_approved(st.request.id)))
    if not ready:
        print("no approved action waits to run")
    return code


def _sweep_audit(path: str) -> Any:
    from slurmagent.safety.audit import AuditLog
    from slurmagent.safety.gate import SHARED_AUDIT_MODE

    return AuditLog(path, mode=SHARED_AUDIT_MODE) if path else None


def _record_vote(status: Any, verdict: str, note: str, sweep_log: Any) -> None:
    """The vote in the sweep's audit log (when this user may write it) and the user's own."""
    from slurmagent.safety.audit import AuditLog
    from slurmagent.safety.paths import user_audit_path

    r = status.request
    record = {
        "type": "approval",
        "sweep": r.sweep_dir,
        "job": r.job or r.action.get("target"),
        "action": r.action.get("kind"),
        "target": r.action.get("target"),
        "decision": verdict,
        "rule": r.rule,
        "approval_id": r.id,
        "reason": note,
        "state_after": status.state,
        "approvers": status.approvers,
    }
    for log in (sweep_log, AuditLog(user_audit_path())):
        if log is None:
            continue
        try:
            log.append(record)
        except AuditError as exc:
            print(
                f"slurmagent: note: {exc}; the vote itself is recorded in {status.request.id}'s files", file=sys.stderr
            )


def approve_args(v: argparse.ArgumentParser) -> None:
    v.add_argument("id")
    v.add_argument("--sweep", type=Path, default=None, help="a sweep directory: its approvals")
    v.add_argument("--note", default=None, help="why (recorded in the audit log)")


reject_args = approve_args


def approve(args: argparse.Namespace) -> int:
    return _vote(args, "approve")


def reject(args: argparse.Namespace) -> int:
    return _vote(args, "reject")


def _vote(args: argparse.Namespace, verdict: str) -> int:
    store = _store(args.sweep)
    request = store.get(args.id)
    sweep_log = _sweep_audit(request.audit)
    # under the sweep log's lock: the vote's record lands before the outcome of the run it enables
    with sweep_log.lock if sweep_log is not None and sweep_log.writable() else contextlib.nullcontext():
        status = store.vote(args.id, verdict, args.note or "")
        _record_vote(status, verdict, args.note or "", sweep_log)
    r = status.request
    print(f"{verdict}d {r.id} ({r.action.get('kind')} {r.action.get('target')}): now {status.state}")
    if status.state != "approved":
        if status.state == "pending":
            print(
                f"waiting for {r.approvals - len(status.approvers)} more approval(s) "
                f"from user(s) other than {r.requester}"
            )
        return EXIT_OK
    return _report(_approved_gate(store, r).run_approved(r.id))


# -- kill switch ----------------------------------------------------------------------------
def resume_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--sweep", type=Path, default=None, help="only this sweep")
    g.add_argument("--all", action="store_true", help="every sweep of this user (the default)")


def pause_args(p: argparse.ArgumentParser) -> None:
    resume_args(p)
    p.add_argument("--reason", default=None)


def _switched(args: argparse.Namespace) -> str:
    if args.sweep is not None:
        check_path(args.sweep, "dir", "--sweep")
    return f"sweep {args.sweep}" if args.sweep is not None else "every sweep of this user"


def pause(args: argparse.Namespace) -> int:
    from slurmagent.safety import switch

    what = _switched(args)
    path = switch.pause(args.sweep, args.reason or "")
    lift = slurmagent_command("resume", *(["--sweep", args.sweep] if args.sweep is not None else []))
    print(f"paused automated actions of {what} ({path}); running jobs keep running; `{lift}` lifts it")
    return EXIT_OK


def resume(args: argparse.Namespace) -> int:
    from slurmagent.safety import switch

    what = _switched(args)
    removed = switch.resume(args.sweep)
    print(f"resumed {what} ({removed})" if removed else f"{what} was not paused")
    return EXIT_OK


# -- replay ---------------------------------------------------------------------------------
def replay_args(rp: argparse.ArgumentParser) -> None:
    rp.add_argument("history", type=Path, help="a sweep's history.jsonl (or the sweep directory)")
    rp.add_argument(
        "--policy", type=Path, default=None, help="a name in conf/policy or a YAML path (default: the sweep's)"
    )
    rp.add_argument("--json", action="store_true")
    rp.add_argument("--fail-on-change", action="store_true", help="exit 1 when a decision changes")


def replay(args: argparse.Namespace) -> int:
    from slurmagent.safety.paths import SWEEP_HISTORY
    from slurmagent.safety.policy import load_policy, resolve_policy
    from slurmagent.safety.replay import history_path, load_history, replay, replay_diff, replay_table

    check_path(args.history, "any", "history")
    if args.history.is_dir() and (args.history / SWEEP_HISTORY).exists():
        check_path(args.history / SWEEP_HISTORY, "file", "history")
    if args.policy is not None and (args.policy.suffix in (".yaml", ".yml") or os.path.lexists(args.policy)):
        check_path(args.policy, "file", "--policy", PolicyError)  # a policy file (else a name in conf/policy)
    entries = load_history(args.history)
    sweep = history_path(args.history).parent
    policy = load_policy(args.policy) if args.policy else resolve_policy(sweep)
    rows = replay(entries, policy)
    if args.json:
        for r in rows:
            print(
                json.dumps(
                    {
                        "line": r.n,
                        "task": r.index,
                        "action": r.action.to_json(),
                        "changed": r.changed,
                        "recorded": r.recorded.__dict__ if r.recorded else None,
                        "replayed": r.replayed.__dict__,
                    }
                )
            )
    else:
        console().print(replay_table(rows, policy.name))
        diff = replay_diff(rows)
        print("\n".join(diff) if diff else f"no decision changes under policy {policy.name}")
    changed = sum(r.changed for r in rows)
    print(f"{changed} of {len(rows)} decision(s) change under policy {policy.name}; nothing was executed")
    return EXIT_FAILED if (changed and args.fail_on_change) else EXIT_OK
