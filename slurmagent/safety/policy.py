"""Safety policy: Hydra config in conf/policy/*.yaml that maps an action kind and its
context to allow / needs_approval (with how many approvals) / deny.

Rules are tried in order; the first whose `action` and `when` match decides, and its name
is recorded with the decision. Anything no rule matches is denied. `when` conditions read
the action's context (attempt, run_time_s, qos, source, cause) and its parameters; a
condition on a context value the action does not carry does not match.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Protocol, cast

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from slurmagent.config import parse_conf
from slurmagent.errors import ConfigError, PolicyError, choices
from slurmagent.records import ACTION_KINDS, VERDICTS, Action, Decision, Verdict

DEFAULT_POLICY = "default"


class Policy(Protocol):
    def decide(self, action: Action) -> Decision: ...


@dataclass(frozen=True)
class When:
    """Conditions on the action's context; all given ones must hold."""

    attempt_min: int | None = None  # the task's attempt number (1 = first run)
    attempt_max: int | None = None
    run_time_min_s: float | None = None  # how long the job has run
    run_time_max_s: float | None = None
    qos_in: list[str] | None = None  # the job's QoS
    source_in: list[str] | None = None  # who asked: e.g. health_check:CRITICAL, recovery, runtime
    cause_in: list[str] | None = None  # the diagnosis cause: host_oom, time_limit, node_failure…
    params_any: list[str] | None = None  # the action changes one of these parameters (mem, time, exclude…)
    user_in: list[str] | None = None  # the user who asks (the launcher's, the supervisor's)

    def matches(self, ctx: dict[str, Any], params: dict[str, Any]) -> bool:
        bounds = (
            ("attempt", self.attempt_min, self.attempt_max),
            ("run_time_s", self.run_time_min_s, self.run_time_max_s),
        )
        for key, lo, hi in bounds:
            if lo is None and hi is None:
                continue
            raw = ctx.get(key)
            if not isinstance(raw, (int, float)) or isinstance(raw, bool):
                return False  # a bound on something the action does not report does not hold
            if (lo is not None and raw < lo) or (hi is not None and raw > hi):
                return False
        for allowed, key in (
            (self.qos_in, "qos"),
            (self.source_in, "source"),
            (self.cause_in, "cause"),
            (self.user_in, "user"),
        ):
            if allowed is not None and str(ctx.get(key)) not in allowed:
                return False
        return self.params_any is None or any(k in params for k in self.params_any)


@dataclass(frozen=True)
class Rule:
    name: str
    action: str  # an action kind, or "*" for any
    decision: Verdict  # allow | needs_approval | deny
    approvals: int = 0  # distinct approvers (not the requester) when decision is needs_approval
    when: When = field(default_factory=When)


@dataclass(frozen=True)
class _RuleConf:
    name: str
    action: str
    decision: str
    approvals: int = 0
    when: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _PolicyConf:
    name: str
    rules: list[dict[str, Any]]
    approval_ttl_s: float = 86400.0
    shared: bool = True
    approvers: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RulePolicy:
    name: str
    rules: tuple[Rule, ...]
    approval_ttl_s: float = 86400.0  # a pending approval expires after this long
    shared: bool = True  # approvals dir and audit log writable by other users (sticky, like /tmp)
    source: str = ""  # where it was loaded from
    # who is told that an approval is needed (notify.*): user names, or e-mail addresses (which
    # also get the e-mail when notify.email is on); telling is all it does — who may vote is the rules'
    approvers: tuple[str, ...] = ()

    def decide(self, action: Action) -> Decision:
        ctx = {**action.metrics_before, **action.context}
        for rule in self.rules:
            if rule.action not in ("*", action.kind) or not rule.when.matches(ctx, action.params):
                continue
            return Decision(rule.decision, f"{self.name}:{rule.name}", rule.approvals)
        return Decision("deny", f"{self.name}:default-deny (no rule allows {action.kind} here)")


def parse_policy(raw: Any, source: str) -> RulePolicy:
    if not isinstance(raw, dict):
        raise PolicyError(f"policy {source}: expected a mapping with name and rules")
    try:
        conf = parse_conf(_PolicyConf, raw, "policy")
        rules: list[Rule] = []
        for i, r in enumerate(conf.rules):
            where = f"policy.rules[{i}]"
            if not isinstance(r, dict):
                raise PolicyError(f"{where} must be a mapping with name, action and decision")
            rc = parse_conf(_RuleConf, r, where)
            if rc.action != "*" and rc.action not in ACTION_KINDS:
                raise PolicyError(f"{where}.action={rc.action!r} is not one of {choices([*ACTION_KINDS, '*'])}")
            if rc.decision not in VERDICTS:
                raise PolicyError(f"{where}.decision={rc.decision!r} is not one of {choices(VERDICTS)}")
            if rc.decision == "needs_approval" and rc.approvals < 1:
                raise PolicyError(f"{where}.approvals={rc.approvals}: needs_approval needs at least 1 approval")
            if rc.decision != "needs_approval" and rc.approvals:
                raise PolicyError(f"{where}.approvals={rc.approvals} is only meaningful with needs_approval")
            rules.append(
                Rule(
                    rc.name,
                    rc.action,
                    cast(Verdict, rc.decision),
                    rc.approvals,
                    parse_conf(When, rc.when, f"{where}.when"),
                )
            )
    except PolicyError:
        raise
    except ConfigError as exc:
        raise PolicyError(f"policy {source}: {exc}") from None
    if conf.approval_ttl_s <= 0:
        raise PolicyError(f"policy.approval_ttl_s={conf.approval_ttl_s} must be positive")
    return RulePolicy(conf.name, tuple(rules), float(conf.approval_ttl_s), conf.shared, source, tuple(conf.approvers))


def policy_names() -> list[str]:
    folder = resources.files("slurmagent.conf").joinpath("policy")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_policy(ref: str | Path | None = None, overrides: list[str] | None = None) -> RulePolicy:
    """A policy by name (conf/policy/NAME.yaml) or by path to a YAML file, with optional
    `key=value` overrides (e.g. approval_ttl_s=600)."""
    ref = ref or DEFAULT_POLICY
    path = Path(ref)
    try:
        if path.suffix in (".yaml", ".yml") or path.exists():
            if not path.is_file():
                raise PolicyError(f"policy file {str(path)!r} does not exist")
            cfg = OmegaConf.load(path)
            source = str(path)
        else:
            name = str(ref)
            if name not in policy_names():
                raise PolicyError(f"policy {name!r} is not in conf/policy; valid names: {choices(policy_names())}")
            text = resources.files("slurmagent.conf").joinpath("policy", f"{name}.yaml").read_text()
            cfg = OmegaConf.create(text)
            source = f"conf/policy/{name}.yaml"
        if overrides:
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
        raw = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as exc:
        raise PolicyError(f"policy {ref}: {exc}") from None
    return parse_policy(raw, source)


SWEEP_POLICY_FILE = "policy.yaml"


def resolve_policy(sweep_dir: Path | None) -> RulePolicy:
    """The policy in force for a sweep: its own `policy.yaml`; else the `policy` group it
    was launched with (`python -m slurmagent +policy=strict -m …`, kept by Hydra in the
    sweep's multirun.yaml); else $SLURMAGENT_POLICY (a name in conf/policy or a YAML path);
    else the default policy."""
    import os

    if sweep_dir is not None:
        if (sweep_dir / SWEEP_POLICY_FILE).is_file():
            return load_policy(sweep_dir / SWEEP_POLICY_FILE)
        multirun = sweep_dir / "multirun.yaml"
        if multirun.is_file():
            try:
                cfg = OmegaConf.load(multirun)
                raw = OmegaConf.to_container(cfg.policy, resolve=True) if "policy" in cfg else None
            except OmegaConfBaseException as exc:
                raise PolicyError(f"policy in {multirun}: {exc}") from None
            if raw is not None:
                return parse_policy(raw, f"{multirun}:policy")
    return load_policy(os.environ.get("SLURMAGENT_POLICY") or DEFAULT_POLICY)
