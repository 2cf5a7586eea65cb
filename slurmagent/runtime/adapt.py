"""The step loop's in-loop controller (`Controller`: gradient explosion, plateau), asked at
every step boundary, each intervention an action through the gate. (A GPU out-of-memory error
inside a step is the MicroBatcher's: runtime/microbatch.py.)

    adapt = Controller(adapt_conf(cfg.get("adapt")), model, optimizer, scheduler)
    loop = StepLoop(ctx, state, total_steps, adapt=adapt)
    for step in loop:
        ...; loss.backward()
        grad_norm = loop.observe(loss=loss)   # the norm of the model's gradients (or pass grad_norm=…)
        optimizer.step(); scheduler.step()
        loop.report(loss=loss.item())         # a report holding adapt.plateau.metric is an evaluation

Two reactions, each configured in the `adapt` group (`AdaptConf`, config/adapt.py; off by default):

- **Gradient explosion.** Every observed step's gradient norm is compared with its running
  level, an EMA of the norms of normal steps (the first `warmup` norms only build it).
  `patience` steps in a row above `factor` × that level, or any non-finite norm or loss,
  ask for `decay_lr`: restore the last good state and multiply every param group's lr by
  `gamma` (and the scheduler's base lrs, so that the schedule goes on lower).
  *The last good state* is an in-memory snapshot of the model's and the optimiser's state
  dicts (CPU copies), taken every `snapshot_every` steps after a normal step — never after
  a suspect one — and at the start. It is part of the controller's state, so it is in every
  checkpoint and a resumed run restores exactly the same one (it doubles the model's share of
  a checkpoint). Only model and optimiser go back: the step, the data position, the RNG and
  the scheduler's position go on, so the steps since the snapshot are lost progress, not
  redone. The optimiser's hyperparameters (lr…) are the current ones, decayed.
- **Plateau.** Each `loop.report()` that holds `metric` is an evaluation; `patience`
  evaluations without an improvement (by more than `min_delta`, in `mode` min or max) ask
  for `restart_schedule`, a warm restart; then `cooldown` evaluations do not count.
  What a restart does, by scheduler:
  `CosineAnnealingLR` — back to epoch 0 at its base lrs, and with `anneal_to_end` its T_max
  becomes the steps left to the end of the run (it assumes one scheduler step per loop
  step), so the new cosine still ends at eta_min with the run; a scheduler with a closed
  form (StepLR, MultiStepLR, ExponentialLR, LinearLR, ConstantLR, PolynomialLR) — back to
  epoch 0, its lrs as at epoch 0; no scheduler (a constant lr) — the lr back to its base (the
  optimiser's first lr, times the decays so far), and when it is there already nothing is
  asked (recorded as skipped); any other scheduler (LambdaLR, OneCycleLR, SequentialLR, …) is
  refused when the controller is built, with the plateau reaction on.

Every intervention is an action through the gate: the job layer hands the loop
`ctx.approve` (runtime/context.py), which asks the sweep's policy and kill switch and
records the decision in the audit log; the change itself is run by the gate, as the
action's executor, only when allowed. Outside a slurmagent job (`ctx.approve` is None) the
controller acts on its own and says so ("decision": "local"). A denied, held or
approval-needing action is not taken (the loop cannot wait). Each kind is asked at most
`max_interventions` / `max_restarts` times in a run (granted or not); then the controller
stops intervening and says so, once. After a refusal it asks again only after another
`patience` steps.

Everything it asked, and the answer, is a line of `<output dir>/adapt.jsonl` (rank 0):
step, kind, trigger, reason, decision, rule, applied, evidence, params, result. The
controller's whole state (running level, counters, metric history, snapshot, records) is
in the checkpoint payload (`"adapt"`), so a run preempted and resumed ends as one that was
not; on resume the lines after the checkpoint's step (from work that was lost) are dropped.

In a multi-rank job feed every rank the same values (after DDP's all-reduce the gradient
norm is the same on every rank; report all-reduced metrics): rank 0's proposal is the one
asked for, and every rank applies the answer.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from slurmagent.config import AdaptConf
from slurmagent.errors import ConfigError, SlurmAgentError
from slurmagent.files import atomic_write
from slurmagent.primitives.checkpoint import snapshot
from slurmagent.runtime.context import Approval, Approver

__all__ = ["Controller", "Proposal", "grad_norm"]

log = logging.getLogger(__name__)


# -- the in-loop controller --------------------------------------------------------------
STATE_VERSION = 1
RECENT = 20  # gradient norms kept for evidence (at least `patience`)


@dataclass(frozen=True)
class Proposal:
    """An intervention the controller wants, before the gate has answered."""

    step: int  # the step boundary (steps done)
    kind: str  # an action kind: decay_lr | restart_schedule
    trigger: str  # gradient_explosion | nonfinite | plateau
    reason: str  # one sentence for the audit log and adapt.jsonl
    evidence: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)


def grad_norm(model: torch.nn.Module) -> float:
    """The 2-norm of all of the model's gradients together (0.0 when it has none)."""
    grads = [p.grad.detach() for p in model.parameters() if p.grad is not None]
    if not grads:
        return 0.0
    norms = torch.stack([torch.linalg.vector_norm(g, 2.0).to(torch.float64) for g in grads])
    return float(torch.linalg.vector_norm(norms, 2.0).item())


def _float(value: float | torch.Tensor) -> float:
    return float(value.detach().item()) if isinstance(value, torch.Tensor) else float(value)


def _num(x: float | None) -> float | str | None:
    """A number for JSON: non-finite ones as text ("nan", "inf")."""
    if x is None:
        return None
    return float(x) if math.isfinite(x) else str(x)


def _record_step(line: str) -> float:
    """The step of a line of adapt.jsonl; infinite for a line that is not one (cut short by a crash)."""
    try:
        return float(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return math.inf


def _lrs(optimizer: torch.optim.Optimizer) -> list[float]:
    return [_float(g["lr"]) for g in optimizer.param_groups]


def _set_lr(group: dict[str, Any], key: str, value: float) -> None:
    if isinstance(group.get(key), torch.Tensor):
        group[key].fill_(value)  # a tensor lr (capturable or fused optimisers) stays the same tensor
    else:
        group[key] = value


def _restartable(scheduler: Any) -> bool:
    return isinstance(scheduler, torch.optim.lr_scheduler.CosineAnnealingLR) or hasattr(
        scheduler, "_get_closed_form_lr"
    )


class Controller:
    """The in-loop controller; give it to `StepLoop(..., adapt=…)`. See the module docstring."""

    def __init__(
        self,
        conf: AdaptConf,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any | None = None,
    ) -> None:
        self.conf = conf
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        if self.active and conf.plateau.enabled and scheduler is not None and not _restartable(scheduler):
            raise ConfigError(
                f"adapt.plateau: a warm restart supports CosineAnnealingLR, the schedulers with a closed form "
                f"(StepLR, MultiStepLR, ExponentialLR, LinearLR, ConstantLR, PolynomialLR) and a constant lr "
                f"(no scheduler), not {type(scheduler).__name__}; set adapt.plateau.enabled=false to use it"
            )
        self.total_steps = 0  # the run's schedule length (bind)
        self._path: Path | None = None  # adapt.jsonl, on the writing rank only
        self._attempt = 1
        self.pending: Proposal | None = None  # what propose() found at this boundary
        # -- gradient explosion --
        self.level: float | None = None  # EMA of normal steps' gradient norms
        self.seen = 0  # normal norms observed (warmup)
        self.streak = 0  # suspect steps in a row
        self.nonfinite = False  # a non-finite norm or loss since the last boundary
        self.last_normal = True  # the last observed step was normal (a snapshot may follow)
        self.hold = 0  # boundaries to wait before asking again after a refusal
        self.norms: deque[float] = deque(maxlen=max(RECENT, conf.explosion.patience))
        self.last_loss: float | None = None
        self.explosion_asked = 0
        self.explosion_granted = 0
        self.snap: dict[str, Any] | None = None  # the last good state: model + optimizer (CPU copies)
        self.snap_step: int | None = None
        # -- plateau --
        self.best: float | None = None
        self.bad = 0  # evaluations without improvement
        self.cooldown = 0
        self.evaluations = 0
        self.metric_history: deque[tuple[int, float]] = deque(maxlen=max(RECENT, conf.plateau.patience + 1))
        self.plateau_asked = 0
        self.plateau_granted = 0
        # -- both --
        self.base_lrs = [_float(g.get("initial_lr", g["lr"])) for g in optimizer.param_groups]  # constant lr's base
        self.capped: list[str] = []  # kinds whose cap was reached (said once)
        self.records: list[dict[str, Any]] = []  # every line of adapt.jsonl this run's history holds

    @property
    def active(self) -> bool:
        c = self.conf
        return c.enabled and (c.explosion.enabled or c.plateau.enabled)

    # -- set up by the loop --------------------------------------------------------------
    def bind(self, path: Path | None, total_steps: int, attempt: int = 1) -> None:
        """Where records go (None: a rank that does not write), the run's length, the attempt."""
        self._path = path
        self.total_steps = total_steps
        self._attempt = attempt

    def resumed(self, step: int) -> None:
        """After the loop restored (or did not find) a checkpoint at `step`: drop the records
        of lost work from adapt.jsonl and take the first snapshot when there is none."""
        if self._path is not None and self._path.exists():
            lines = self._path.read_text().splitlines()
            kept = [line for line in lines if _record_step(line) <= step]
            if len(kept) != len(lines):
                atomic_write(self._path, "".join(line + "\n" for line in kept).encode())
        if self.snap is None and self._snapshots:
            self._take_snapshot(step)

    # -- inputs from the training code ---------------------------------------------------
    def observe(self, step: int, grad_norm_: float | torch.Tensor | None, loss: float | torch.Tensor | None) -> float:
        """One step's gradient norm (computed from the model when not given) and loss."""
        del step
        norm = grad_norm(self.model) if grad_norm_ is None else _float(grad_norm_)
        if not self.conf.explosion.enabled:
            return norm
        e = self.conf.explosion
        value = None if loss is None else _float(loss)
        self.last_loss = value
        self.norms.append(norm)
        if not math.isfinite(norm) or (value is not None and not math.isfinite(value)):
            self.nonfinite, self.last_normal = True, False
            self.streak += 1
        elif self.level is not None and self.seen >= e.warmup and norm > e.factor * self.level:
            self.streak += 1
            self.last_normal = False
        else:
            self.streak, self.last_normal = 0, True
            self.level = norm if self.level is None else e.ema * self.level + (1 - e.ema) * norm
            self.seen += 1
        return norm

    def evaluate(self, step: int, metrics: Mapping[str, float]) -> None:
        """A report: an evaluation when it holds the plateau's metric."""
        p = self.conf.plateau
        if not p.enabled or p.metric not in metrics:
            return
        value = float(metrics[p.metric])
        self.evaluations += 1
        self.metric_history.append((step + 1, value))
        better = math.isfinite(value) and (
            self.best is None
            or (value < self.best - p.min_delta if p.mode == "min" else value > self.best + p.min_delta)
        )
        if better:
            self.best, self.bad = value, 0
        else:
            self.bad += 1
        if self.cooldown > 0:
            self.cooldown -= 1
            self.bad = 0

    # -- at a step boundary --------------------------------------------------------------
    def propose(self, done: int) -> Proposal | None:
        """What to ask for after `done` steps (also kept in `pending`); None: nothing."""
        self.pending = None
        if self.hold > 0:
            self.hold -= 1
        e, p = self.conf.explosion, self.conf.plateau
        if e.enabled and self.hold == 0 and (self.nonfinite or self.streak >= e.patience):
            if self.explosion_asked >= e.max_interventions:
                self._cap("decay_lr", done, e.max_interventions, "adapt.explosion.max_interventions")
                self.streak, self.nonfinite = 0, False
            else:
                self.pending = self._explosion(done)
                return self.pending
        if p.enabled and self.bad >= p.patience and self.total_steps and done >= self.total_steps:
            pass  # the schedule's end: no step follows a restart (a search trial's rung is not the end)
        elif p.enabled and self.bad >= p.patience:
            if self.plateau_asked >= p.max_restarts:
                self._cap("restart_schedule", done, p.max_restarts, "adapt.plateau.max_restarts")
                self.bad = 0
            elif not self._restart_changes_anything():
                self.plateau_asked += 1
                self.bad, self.cooldown = 0, p.cooldown
                why = (
                    f"{p.metric} has not improved for {p.patience} evaluations, but the lr is constant at its base: "
                    "nothing to restart"
                )
                self._record(
                    {
                        "step": done,
                        "kind": "restart_schedule",
                        "trigger": "plateau",
                        "reason": why,
                        "decision": "skipped",
                        "rule": "",
                        "applied": False,
                        "evidence": self._plateau_evidence(done),
                        "params": {},
                        "result": {},
                    }
                )
            else:
                self.pending = self._plateau(done)
        return self.pending

    def request(self, proposal: Proposal, approve: Approver | None) -> Approval:
        """Ask the gate (approve) for `proposal`; the gate runs the change when it allows it.
        Without a gate, apply it here."""
        if approve is None:
            return Approval(True, "local", "no gate here (outside a slurmagent job)", self.apply(proposal))
        try:
            return approve(
                proposal.kind, proposal.reason, proposal.evidence, proposal.params, lambda: self.apply(proposal)
            )
        except (SlurmAgentError, OSError) as exc:  # e.g. an audit log that cannot be written: nothing ran
            log.warning("adapt: could not ask the gate for %s: %s", proposal.kind, exc)
            return Approval(False, "error", str(exc), {"error": str(exc)})

    def apply(self, proposal: Proposal) -> dict[str, Any]:
        """Make the change (the gate's executor for the action). Returns what it did."""
        if proposal.kind == "decay_lr":
            return self._decay(bool(proposal.params.get("restore")))
        if proposal.kind == "restart_schedule":
            return self._restart(proposal.step)
        raise SlurmAgentError(f"adapt: no change for action kind {proposal.kind!r}")

    def settle(self, proposal: Proposal | None, approval: Approval | None) -> None:
        """After the gate answered (every rank): count, record, reset the triggers."""
        self.pending = None
        if proposal is None or approval is None:  # another rank wanted it, rank 0 did not
            self.streak, self.nonfinite, self.bad = 0, False, 0
            return
        if proposal.kind == "decay_lr":
            self.explosion_asked += 1
            self.explosion_granted += approval.granted
            self.streak, self.nonfinite = 0, False
            self.hold = 0 if approval.granted else self.conf.explosion.patience
            self.last_normal = False  # the next snapshot only after a normal step
        else:
            self.plateau_asked += 1
            self.plateau_granted += approval.granted
            self.bad = 0
            if approval.granted:
                self.cooldown = self.conf.plateau.cooldown
        (log.warning if approval.granted else log.error)(
            "adapt at step %d: %s %s (%s%s)",
            proposal.step,
            proposal.kind,
            "done" if approval.granted else "not done",
            approval.decision,
            f": {approval.rule}" if approval.rule else "",
        )
        self._record(
            {
                "step": proposal.step,
                "kind": proposal.kind,
                "trigger": proposal.trigger,
                "reason": proposal.reason,
                "decision": approval.decision,
                "rule": approval.rule,
                "applied": approval.granted,
                "evidence": proposal.evidence,
                "params": proposal.params,
                "result": approval.result,
            }
        )

    def after_step(self, done: int) -> None:
        """A snapshot of the last good state, every `snapshot_every` steps after a normal one."""
        if (
            self._snapshots
            and done % self.conf.explosion.snapshot_every == 0
            and self.last_normal
            and self.streak == 0
            and not self.nonfinite
        ):
            self._take_snapshot(done)

    # -- the checkpoint ------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "level": self.level,
            "seen": self.seen,
            "streak": self.streak,
            "nonfinite": self.nonfinite,
            "last_normal": self.last_normal,
            "hold": self.hold,
            "norms": list(self.norms),
            "last_loss": self.last_loss,
            "explosion_asked": self.explosion_asked,
            "explosion_granted": self.explosion_granted,
            "snapshot": self.snap,
            "snapshot_step": self.snap_step,
            "best": self.best,
            "bad": self.bad,
            "cooldown": self.cooldown,
            "evaluations": self.evaluations,
            "metric_history": [list(x) for x in self.metric_history],
            "plateau_asked": self.plateau_asked,
            "plateau_granted": self.plateau_granted,
            "base_lrs": list(self.base_lrs),
            "capped": list(self.capped),
            "records": list(self.records),
        }

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        if not state:
            return  # a checkpoint from before the controller was on: start its state fresh
        if state.get("version") != STATE_VERSION:
            raise SlurmAgentError(f"adapt: checkpoint state version {state.get('version')!r}, expected {STATE_VERSION}")
        self.level, self.seen, self.streak = state["level"], state["seen"], state["streak"]
        self.nonfinite, self.last_normal, self.hold = state["nonfinite"], state["last_normal"], state["hold"]
        self.norms.clear()
        self.norms.extend(state["norms"])
        self.last_loss = state["last_loss"]
        self.explosion_asked, self.explosion_granted = state["explosion_asked"], state["explosion_granted"]
        self.snap, self.snap_step = state["snapshot"], state["snapshot_step"]
        self.best, self.bad, self.cooldown = state["best"], state["bad"], state["cooldown"]
        self.evaluations = state["evaluations"]
        self.metric_history.clear()
        self.metric_history.extend((int(s), float(v)) for s, v in state["metric_history"])
        self.plateau_asked, self.plateau_granted = state["plateau_asked"], state["plateau_granted"]
        self.base_lrs = [float(x) for x in state["base_lrs"]]
        self.capped = list(state["capped"])
        self.records = list(state["records"])

    def summary(self) -> dict[str, Any]:
        """For views: interventions asked and done per kind, the latest record."""
        return {
            "decay_lr": {"asked": self.explosion_asked, "done": self.explosion_granted},
            "restart_schedule": {"asked": self.plateau_asked, "done": self.plateau_granted},
            "capped": list(self.capped),
            "last": self.records[-1] if self.records else None,
        }

    # -- inside ---------------------------------------------------------------------------
    @property
    def _snapshots(self) -> bool:
        return self.active and self.conf.explosion.enabled and self.conf.explosion.restore

    def _take_snapshot(self, step: int) -> None:
        self.snap = snapshot({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()})
        self.snap_step = step

    def _explosion(self, done: int) -> Proposal:
        e = self.conf.explosion
        norms = list(self.norms)[-max(e.patience, self.streak, 1) :]
        level = self.level
        if self.nonfinite:
            trigger = "nonfinite"
            last = norms[-1] if norms else float("nan")
            what = f"a non-finite gradient norm or loss (norm {last:.3g}, loss {self.last_loss})"
        else:
            trigger = "gradient_explosion"
            what = (
                f"gradient norm above {e.factor:g}× its running level ({level or 0.0:.3g}) "
                f"for {self.streak} steps in a row"
            )
        restore = e.restore and self.snap is not None
        back = f"restore the state of step {self.snap_step} and " if restore else ""
        reason = (
            f"{what}: {back}decay the learning rate ×{e.gamma:g} "
            f"(request {self.explosion_asked + 1} of {e.max_interventions})"
        )
        evidence = {
            "step": done,
            "trigger": trigger,
            "grad_norms": [_num(x) for x in norms],
            "running_level": _num(level),
            "factor": e.factor,
            "streak": self.streak,
            "loss": _num(self.last_loss),
        }
        params: dict[str, Any] = {
            "gamma": e.gamma,
            "restore": restore,
            "snapshot_step": self.snap_step if restore else None,
            "lr": [_num(x) for x in _lrs(self.optimizer)],
        }
        return Proposal(done, "decay_lr", trigger, reason, evidence, params)

    def _plateau_evidence(self, done: int) -> dict[str, Any]:
        p = self.conf.plateau
        history = list(self.metric_history)[-(p.patience + 1) :]
        return {
            "step": done,
            "trigger": "plateau",
            "metric": p.metric,
            "mode": p.mode,
            "best": _num(self.best),
            "evaluations_without_improvement": self.bad,
            "history": [[s, _num(v)] for s, v in history],
        }

    def _plateau(self, done: int) -> Proposal:
        p = self.conf.plateau
        name = type(self.scheduler).__name__ if self.scheduler is not None else "constant lr"
        reason = (
            f"{p.metric} has not improved for {self.bad} evaluations (best {self.best}): warm restart of the "
            f"learning-rate schedule ({name}; request {self.plateau_asked + 1} of {p.max_restarts})"
        )
        params: dict[str, Any] = {"scheduler": name, "lr": [_num(x) for x in _lrs(self.optimizer)]}
        if isinstance(self.scheduler, torch.optim.lr_scheduler.CosineAnnealingLR) and p.anneal_to_end:
            params["T_max"] = max(1, self.total_steps - done)
        return Proposal(done, "restart_schedule", "plateau", reason, self._plateau_evidence(done), params)

    def _restart_changes_anything(self) -> bool:
        if self.scheduler is not None:
            return True
        return any(not math.isclose(a, b) for a, b in zip(_lrs(self.optimizer), self.base_lrs, strict=True))

    def _decay(self, restore: bool) -> dict[str, Any]:
        gamma = self.conf.explosion.gamma
        before = _lrs(self.optimizer)
        restored = None
        if restore and self.snap is not None:
            hyper = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
            self.model.load_state_dict(self.snap["model"])
            # a copy: load_state_dict keeps tensors it need not cast, so the snapshot would change with the optimizer
            self.optimizer.load_state_dict(snapshot(self.snap["optimizer"]))
            for group, saved in zip(self.optimizer.param_groups, hyper, strict=True):
                group.update(saved)  # today's hyperparameters, not the snapshot's
            restored = self.snap_step
        for group, lr in zip(self.optimizer.param_groups, before, strict=True):
            _set_lr(group, "lr", lr * gamma)
            if "initial_lr" in group:
                _set_lr(group, "initial_lr", _float(group["initial_lr"]) * gamma)
        self.base_lrs = [b * gamma for b in self.base_lrs]
        if self.scheduler is not None:
            self.scheduler.base_lrs = [_float(b) * gamma for b in self.scheduler.base_lrs]
            self.scheduler._last_lr = _lrs(self.optimizer)
        return {"lr_before": before, "lr_after": _lrs(self.optimizer), "restored_step": restored}

    def _restart(self, done: int) -> dict[str, Any]:
        before = _lrs(self.optimizer)
        sched = self.scheduler
        out: dict[str, Any] = {}
        if sched is None:
            lrs = list(self.base_lrs)
        elif isinstance(sched, torch.optim.lr_scheduler.CosineAnnealingLR):
            sched.last_epoch = 0
            if self.conf.plateau.anneal_to_end:
                sched.T_max = max(1, self.total_steps - done)
            out["T_max"] = sched.T_max
            lrs = [_float(b) for b in sched.base_lrs]
        else:
            sched.last_epoch = 0
            lrs = [_float(x) for x in sched._get_closed_form_lr()]
        for group, lr in zip(self.optimizer.param_groups, lrs, strict=True):
            _set_lr(group, "lr", lr)
        if sched is not None:
            sched._last_lr = _lrs(self.optimizer)
            out["last_epoch"] = sched.last_epoch
        return {"lr_before": before, "lr_after": _lrs(self.optimizer), **out}

    def _cap(self, kind: str, done: int, cap: int, key: str) -> None:
        if kind in self.capped:
            return
        self.capped.append(kind)
        why = f"{kind} asked {cap} times ({key}={cap}): no more interventions of this kind in this run"
        log.error("adapt at step %d: %s", done, why)
        self._record(
            {
                "step": done,
                "kind": kind,
                "trigger": "cap",
                "reason": why,
                "decision": "capped",
                "rule": key,
                "applied": False,
                "evidence": {},
                "params": {},
                "result": {},
            }
        )

    def _record(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        if self._path is None:
            return
        line = {**record, "attempt": self._attempt, "time": round(time.time(), 3)}
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            with open(self._path, "a") as fh:
                fh.write(json.dumps(line, default=str) + "\n")
        except OSError as exc:
            log.warning("adapt: could not write %s: %s", self._path, exc)
