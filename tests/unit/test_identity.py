"""Who asks is the process's real uid, never $USER: every decision that depends on the user
(policy rules such as `user_in`, approvals, the audit log, submit limits) takes one identity."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from slurmagent.safety.paths import current_user

REAL = pwd.getpwuid(os.getuid()).pw_name


def test_current_user_ignores_what_the_environment_claims(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("USER", "alice")
    monkeypatch.setenv("LOGNAME", "alice")
    assert current_user() == REAL != "alice"


def _launch(tmp_path: Path, allowed: str) -> subprocess.CompletedProcess[str]:
    policy = tmp_path / f"policy-{allowed}.yaml"
    policy.write_text(
        "name: test\nrules:\n"
        f"  - {{name: urgent-users, action: priority_urgent, decision: allow, when: {{user_in: [{allowed}]}}}}\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    env.update(USER="alice", LOGNAME="alice", SLURMAGENT_POLICY=str(policy), SLURMAGENT_STATE_DIR=str(tmp_path / "st"))
    sweep = tmp_path / f"sweep-{allowed}"
    return subprocess.run(
        [sys.executable, "-m", "slurmagent", "+experiment=synthetic", "cluster=local", "-m", "synthetic.steps=2",
         "synthetic.step_time_s=0", "resources.priority=urgent", f"hydra.sweep.dir={sweep}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_a_policy_rule_on_the_user_is_not_passed_by_setting_USER(tmp_path: Path) -> None:
    """Was: `USER=alice python -m slurmagent …` passed a rule `user_in: [alice]`."""
    claimed = _launch(tmp_path, "alice")
    assert claimed.returncode == 2, claimed.stderr
    assert f"resources.priority=urgent is not allowed for user {REAL!r}" in claimed.stderr, claimed.stderr
    assert "nothing was submitted" in claimed.stderr and not (tmp_path / "sweep-alice").exists()
    real = _launch(tmp_path, REAL)  # the same rule naming the real user: allowed, and it runs
    assert real.returncode == 0, real.stderr
