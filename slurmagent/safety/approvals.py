"""Pending approvals: one folder (the sweep's `approvals/`, or `$SLURMAGENT_APPROVALS_DIR`)
that the requester and the approvers share.

Every file in it belongs to whoever wrote it: the request (`ID.json`, by the requester),
one vote per user (`ID.vote.USER`, created exclusively by that user — a vote whose file
is not owned by the user it names is ignored), the claim (`ID.claim`: exactly one process
runs the action) and the result (`ID.done`). The folder is sticky and world-writable
(like /tmp) when the policy shares approvals, so nobody can remove another's files.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from slurmagent.errors import ApprovalError, choices
from slurmagent.records import Action, ApprovalState, Decision
from slurmagent.safety.paths import current_user

SHARED_DIR_MODE = 0o1777


@dataclass(frozen=True)
class Request:
    id: str
    action: dict[str, Any]  # Action.to_json()
    rule: str  # the policy rule that asked for approval
    approvals: int  # distinct approvers needed (the requester does not count)
    requester: str
    created: float
    expires_at: float
    job: str = ""
    sweep_dir: str = ""  # where the action belongs (and where a checkpoint may be deleted)
    audit: str = ""  # the sweep's audit log


@dataclass(frozen=True)
class Vote:
    user: str
    verdict: str  # approve | reject
    time: float
    note: str = ""


@dataclass(frozen=True)
class Status:
    request: Request
    state: ApprovalState  # one of records.APPROVAL_STATES
    approvers: list[str] = field(default_factory=list)
    rejecters: list[str] = field(default_factory=list)
    result: dict[str, Any] = field(default_factory=dict)  # ID.done: ok, result, by, time


def _write_exclusive(path: Path, body: dict[str, Any], mode: int = 0o644) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(body, default=str) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return True


class ApprovalStore:
    def __init__(self, folder: str | os.PathLike[str], shared: bool = True) -> None:
        self.dir = Path(folder)
        self.shared = shared

    def ensure(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.shared and self.dir.stat().st_uid == os.getuid():
            os.chmod(self.dir, SHARED_DIR_MODE)

    # -- requests ------------------------------------------------------------------------
    def create(
        self, action: Action, decision: Decision, ttl_s: float, job: str, sweep_dir: Path, audit: Path
    ) -> Request:
        self.ensure()
        now = time.time()
        while True:
            req = Request(
                id=secrets.token_hex(4),
                action=action.to_json(),
                rule=decision.rule,
                approvals=decision.approvals,
                requester=current_user(),
                created=now,
                expires_at=now + ttl_s,
                job=job,
                sweep_dir=str(sweep_dir),
                audit=str(audit),
            )
            if _write_exclusive(self.dir / f"{req.id}.json", asdict(req)):
                return req

    def ids(self) -> list[str]:
        if not self.dir.is_dir():
            return []
        return sorted(p.name[:-5] for p in self.dir.glob("*.json"))

    def get(self, approval_id: str) -> Request:
        if not approval_id.isalnum():
            raise ApprovalError(f"approval id {approval_id!r} is not an id; pending ones: {choices(self.ids())}")
        path = self.dir / f"{approval_id}.json"
        try:
            return Request(**json.loads(path.read_text()))
        except FileNotFoundError:
            raise ApprovalError(
                f"no approval {approval_id!r} in {self.dir}; known ids: {choices(self.ids())}"
            ) from None
        except (ValueError, TypeError) as exc:
            raise ApprovalError(f"{path} is not a valid approval request: {exc}") from None

    # -- votes ---------------------------------------------------------------------------
    def votes(self, approval_id: str) -> list[Vote]:
        """Valid votes only: the file must belong to the user it names."""
        out: list[Vote] = []
        for path in sorted(self.dir.glob(f"{approval_id}.vote.*")):
            user = path.name.split(".vote.", 1)[1]
            try:
                owner_uid = pwd.getpwnam(user).pw_uid
                raw = json.loads(path.read_text())
            except (KeyError, OSError, ValueError):
                continue
            if path.stat().st_uid != owner_uid or raw.get("user") != user:
                continue  # forged: written by someone else
            out.append(Vote(user, str(raw.get("verdict")), float(raw.get("time", 0)), str(raw.get("note", ""))))
        return out

    def status(self, approval_id: str, now: float | None = None) -> Status:
        req = self.get(approval_id)
        now = time.time() if now is None else now
        votes = self.votes(approval_id)
        approvers = sorted({v.user for v in votes if v.verdict == "approve" and v.user != req.requester})
        rejecters = sorted({v.user for v in votes if v.verdict == "reject"})
        done_path = self.dir / f"{approval_id}.done"
        if done_path.exists():
            try:
                result = json.loads(done_path.read_text())
            except ValueError:
                result = {"ok": False, "error": "unreadable result"}
            return Status(req, "executed" if result.get("ok") else "failed", approvers, rejecters, result)
        state: ApprovalState
        if rejecters:
            state = "rejected"
        elif len(approvers) >= req.approvals:
            state = "approved"
        elif now > req.expires_at:
            state = "expired"
        else:
            state = "pending"
        return Status(req, state, approvers, rejecters)

    def vote(self, approval_id: str, verdict: str, note: str = "") -> Status:
        if verdict not in ("approve", "reject"):
            raise ApprovalError(f"verdict {verdict!r} is not one of approve, reject")
        st = self.status(approval_id)
        user = current_user()
        if st.state != "pending":
            raise ApprovalError(f"approval {approval_id} is {st.state}; only pending actions take votes")
        if verdict == "approve" and user == st.request.requester:
            raise ApprovalError(
                f"{user} requested approval {approval_id} and cannot approve it; it needs "
                f"{st.request.approvals} other user(s)"
            )
        body = {"user": user, "verdict": verdict, "time": time.time(), "note": note}
        if not _write_exclusive(self.dir / f"{approval_id}.vote.{user}", body):
            raise ApprovalError(f"{user} has already voted on approval {approval_id}")
        return self.status(approval_id)

    # -- execution -----------------------------------------------------------------------
    def claim(self, approval_id: str) -> bool:
        """True for exactly one caller: the one that runs the approved action."""
        return _write_exclusive(self.dir / f"{approval_id}.claim", {"by": current_user(), "time": time.time()})

    def finish(self, approval_id: str, ok: bool, result: dict[str, Any]) -> None:
        _write_exclusive(
            self.dir / f"{approval_id}.done", {"ok": ok, "result": result, "by": current_user(), "time": time.time()}
        )

    def statuses(self, now: float | None = None) -> list[Status]:
        return [self.status(i, now) for i in self.ids()]
