"""Bring your own trainer, one preemption each (issue 21): the README's plain script, Lightning and
Hugging Face Trainer examples under slurmagent, beside Lightning's own `auto_requeue` run as a
Lightning user runs it on Slurm (sbatch --requeue --signal=USR1@90, `srun python own_lit.py`).
See bench/README.md for the definitions and how to rerun.

    export SLURM_CONF=...   # tests/cluster/slurm-cluster up prints it
    .venv/bin/python bench/trainer_preemption.py [--reps 2] [--node cpu-1]

For each repetition and each variant, one after the other on the same node of partition `low`:
an uninterrupted reference run, then a run preempted once — when its attempt has done
`--at` (40 %) of its training steps, an exclusive 1-second job in partition `high` on its node
(PreemptMode=REQUEUE: Slurm sends SIGTERM, SIGCONT and the job's --signal, requeues the job,
SIGKILLs it KillWait later). Each training step's end is recorded with its attempt (a wrapper
module around the example's training step; the plain script's metrics.jsonl lines, timed as they
appear); `sacct --duplicates` gives each run instance's Start/End (whole seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT))

from preempt_goodput import Instance, instances, sh, slurm_time  # noqa: E402

from tests.conftest import readme_example, readme_named  # noqa: E402

VARIANTS = ("plain script", "Lightning + slurmagent", "HF Trainer + slurmagent", "Lightning auto_requeue")
STEPS_PER_EPOCH = 64  # the README's Lightning and HF examples: 1024 samples, batches of 16

# the README's lit.py / hf_train.py, each training step slowed by a sleep and recorded in a timeline
TIMELINE = """
import json, os, time

_TIMELINE = {path!r}
_out = []


def record(step: int) -> None:
    if not _out:
        _out.append(open(_TIMELINE, "a", buffering=1))
    attempt = int(os.environ.get("SLURM_RESTART_COUNT", 0))
    _out[0].write(json.dumps({{"step": step, "t": time.time(), "attempt": attempt}}) + "\\n")
"""

SLOW_LIT = """
import lit

_step = lit.Regression.training_step


def training_step(self, batch, batch_idx):
    time.sleep({pause})
    loss = _step(self, batch, batch_idx)
    record(self.global_step + 1)
    return loss


lit.Regression.training_step = training_step
train = lit.train
"""

SLOW_HF = """
import hf_train
import transformers

_step = transformers.Trainer.training_step


def training_step(self, *args, **kwargs):
    time.sleep({pause})
    loss = _step(self, *args, **kwargs)
    record(self.state.global_step + 1)
    return loss


transformers.Trainer.training_step = training_step
train = hf_train.train
"""

# Lightning's own requeue: lit.py's module and data, a Trainer without slurmagent's callback. Run
# under srun in an sbatch job, Lightning's SLURMEnvironment has auto_requeue=True: USR1 saves
# hpc_ckpt_N.ckpt in default_root_dir and calls `scontrol requeue`; fit(ckpt_path=None) resumes from it.
OWN_LIT = """
import hashlib
import json
import sys

import pytorch_lightning as pl
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

import slow  # noqa: F401  - the sleep and the timeline around lit.Regression.training_step
from lit import Regression

epochs, root, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
pl.seed_everything(0)
x = torch.randn(1280, 8, generator=torch.Generator().manual_seed(0))
data = torch.utils.data.TensorDataset(x, x.mean(1, keepdim=True))
fit, val = torch.utils.data.random_split(data, [1024, 256], generator=torch.Generator().manual_seed(0))
trainer = pl.Trainer(
    max_epochs=epochs, default_root_dir=root, logger=False, enable_checkpointing=False, enable_progress_bar=False
)
model = Regression(0.01)
env = trainer._accelerator_connector.cluster_environment
print(f"cluster environment {type(env).__name__}, auto_requeue={getattr(env, 'auto_requeue', None)}", flush=True)
trainer.fit(model, StatefulDataLoader(fit, batch_size=16, shuffle=True), StatefulDataLoader(val, batch_size=256))
weights = torch.cat([p.detach().flatten() for p in model.parameters()]).numpy().tobytes()
with open(out, "w") as fh:
    json.dump(
        {
            "val_loss": float(trainer.callback_metrics["val_loss"]),
            "digest": hashlib.sha256(weights).hexdigest(),
            "global_step": trainer.global_step,
        },
        fh,
    )
"""

SBATCH = """#!/bin/bash
#SBATCH --job-name={name}
#SBATCH --partition=low
#SBATCH --nodelist={node}
#SBATCH --time=15
#SBATCH --cpus-per-task=1
#SBATCH --mem=1G
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --signal=USR1@90
#SBATCH --output={log}
cd {home}
srun {python} own_lit.py {epochs} {home}/lightning_root {home}/result.json
"""


@dataclass
class Run:
    """One run of one variant: its project directory, its job, what it recorded."""

    variant: str
    role: str  # "reference" | "preempted"
    rep: int
    home: Path
    total_steps: int
    job_ids: list[str] = field(default_factory=list)
    preempt_sent: float | None = None
    preempt_at_steps: int | None = None
    steps_seen: list[tuple[int, float]] = field(default_factory=list)  # (step, when seen): the plain script
    launcher_rc: int | None = None
    launcher_err: str = ""
    timed_out: bool = False
    result: dict[str, Any] | None = None


def python_on_path(env: dict[str, str]) -> dict[str, str]:
    """The virtualenv activated: `python` in a task.command is this interpreter."""
    return dict(env, PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")


def write_project(run: Run, args: argparse.Namespace) -> list[str]:
    """The README's files of the variant in run.home; the argv that runs it."""
    home = run.home
    home.mkdir(parents=True)
    timeline = TIMELINE.format(path=str(home / "timeline.jsonl"))
    common = [
        "resources.partition=low",
        f"+resources.extra.nodelist={args.node}",
        f"hydra.sweep.dir={home / 'sweep'}",
        "hydra.launcher.poll_interval_s=1",
        "hydra.launcher.max_poll_interval_s=2",
    ]
    if run.variant == "plain script":
        (home / "train.py").write_text(readme_example("# train.py"))
        command = f"task.command=[python,train.py,{args.plain_steps},{args.plain_pause}]"
        return [sys.executable, "-m", "slurmagent", "-m", "task.target=null", command, *common]
    lit = run.variant.startswith("Lightning")
    files = ("lit.py", "conf/experiment/lit.yaml") if lit else ("hf_train.py", "conf/experiment/hf.yaml")
    for name in files:
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text(readme_named(name)[1])
    slow = SLOW_LIT.format(pause=args.lit_pause) if lit else SLOW_HF.format(pause=args.hf_pause)
    (home / "slow.py").write_text(timeline + slow)
    if run.variant == "Lightning auto_requeue":
        (home / "own_lit.py").write_text(OWN_LIT)
        script = SBATCH.format(
            name=f"own-lit-{run.role}-{run.rep}",
            node=args.node,
            log=home / "slurm-%j.out",
            home=home,
            python=sys.executable,
            epochs=args.epochs,
        )
        (home / "job.sbatch").write_text(script)
        return ["sbatch", "--parsable", str(home / "job.sbatch")]
    experiment = "+experiment=lit" if lit else "+experiment=hf"
    lr = "lr=0.01" if lit else "lr=0.001"
    return [
        sys.executable,
        "-m",
        "slurmagent",
        "--config-dir",
        "conf",
        experiment,
        "-m",
        lr,
        f"epochs={args.epochs}",
        "task.target=slow:train",
        *common,
    ]


def sweep_task(run: Run) -> dict[str, Any] | None:
    found = sorted((run.home / "sweep").glob("**/sweep.json"))
    if not found:
        return None
    tasks = json.loads(found[0].read_text()).get("tasks") or []
    return tasks[0] if tasks else None


def steps_done(run: Run) -> int:
    """Training steps recorded so far (all attempts)."""
    if run.variant == "plain script":
        return len(run.steps_seen)
    path = run.home / "timeline.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


class PlainTail:
    """The plain script's metrics.jsonl, each new step line timed as it appears (polled every 0.1 s)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.offset = 0

    def poll(self) -> None:
        found = sorted((self.run.home / "sweep").glob("*/metrics.jsonl"))
        if not found:
            return
        with open(found[0], "rb") as fh:
            fh.seek(self.offset)
            chunk = fh.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        now = time.time()
        for line in complete.decode().splitlines():
            rec = json.loads(line)
            if "step" in rec and "loss" in rec:
                self.run.steps_seen.append((int(rec["step"]), now))


def preempt(node: str, name: str) -> None:
    argv = ["sbatch", "-p", "high", "-w", node, "--exclusive", "--time=2", "-o", "/dev/null", f"--job-name={name}"]
    sh([*argv, "--wrap", "sleep 1"])


def queued(job_ids: list[str]) -> dict[str, str]:
    if not job_ids:
        return {}
    out = subprocess.run(["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i|%T"], capture_output=True, text=True)
    states = {}
    for line in out.stdout.splitlines():
        jid, _, state = line.partition("|")
        states[jid] = state
    return states


def execute(run: Run, args: argparse.Namespace) -> None:
    """Run one variant once, preempting it once when run.role is "preempted"; fills in run."""
    argv = write_project(run, args)
    env = python_on_path(dict(os.environ, SLURMAGENT_STATE_DIR=str(run.home.parent / "state")))
    k = max(1, round(args.at * run.total_steps))
    proc: subprocess.Popen[str] | None = None
    if argv[0] == "sbatch":
        run.job_ids = [sh(argv).strip().split(";")[0]]
    else:
        proc = subprocess.Popen(argv, cwd=run.home, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tail = PlainTail(run) if run.variant == "plain script" else None
    deadline = time.monotonic() + args.timeout
    next_squeue = 0.0
    gone_since: float | None = None
    while True:
        if tail is not None:
            tail.poll()
        if proc is not None:
            task = sweep_task(run)
            for attempt in (task or {}).get("attempts") or []:
                if attempt["job_id"] and attempt["job_id"] not in run.job_ids:
                    run.job_ids.append(attempt["job_id"])
        if run.role == "preempted" and run.preempt_sent is None and steps_done(run) >= k:
            preempt(args.node, f"preempt-{run.home.name}")
            run.preempt_sent, run.preempt_at_steps = time.time(), steps_done(run)
            print(f"  preempted {run.job_ids} after {run.preempt_at_steps} steps", flush=True)
        if proc is not None:
            if proc.poll() is not None:
                break
        elif time.monotonic() >= next_squeue:
            next_squeue = time.monotonic() + 1.0
            if queued(run.job_ids):
                gone_since = None
            else:
                gone_since = gone_since or time.monotonic()
                if time.monotonic() - gone_since > 3:  # out of the queue (not a requeue's passing gap)
                    break
        if time.monotonic() > deadline:
            run.timed_out = True
            print(f"  timed out after {args.timeout:.0f} s: cancelling {run.job_ids}", flush=True)
            for job in run.job_ids:
                subprocess.run(["scancel", job], capture_output=True)
            if proc is not None:
                proc.terminate()
            break
        time.sleep(0.1)
    if proc is not None:
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        run.launcher_rc, run.launcher_err = proc.returncode, err[-3000:]
        if tail is not None:
            tail.poll()
        task = sweep_task(run) or {}
        run.result = task.get("result")
        for attempt in task.get("attempts") or []:
            if attempt["job_id"] and attempt["job_id"] not in run.job_ids:
                run.job_ids.append(attempt["job_id"])
    else:
        result = run.home / "result.json"
        run.result = json.loads(result.read_text()) if result.exists() else None


def timeline(run: Run, inst: list[Instance]) -> list[tuple[int, int, float]]:
    """(attempt, step, time) per training step recorded, in the order written."""
    if run.variant != "plain script":
        path = run.home / "timeline.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        return [(int(r["attempt"]), int(r["step"]), float(r["t"])) for r in rows]

    def attempt_of(t: float) -> int:  # the instance it was seen in (seen up to 0.1 s late)
        started = [k for k, i in enumerate(inst) if i.start - 1 <= t]
        return started[-1] if started else 0

    return [(attempt_of(t), step, t) for step, t in run.steps_seen]


def redone(rows: list[tuple[int, int, float]]) -> int:
    """Steps of an attempt that an earlier attempt had already run."""
    best: dict[int, int] = {}
    for attempt, step, _ in rows:
        best[attempt] = max(best.get(attempt, 0), step)
    count = 0
    for attempt, step, _ in rows:
        before = [m for a, m in best.items() if a < attempt]
        if before and step <= max(before):
            count += 1
    return count


def lightning_log(run: Run) -> dict[str, int]:
    """What Lightning's own requeue said in the job's log (the Lightning auto_requeue variant)."""
    text = "\n".join(p.read_text(errors="replace") for p in sorted(run.home.glob("slurm-*.out")))
    lines = {
        "auto_requeue_on": "auto_requeue=True",
        "usr1_handled": "Handling auto-requeue signal",
        "requeue_called": "requeing job",
        "requeued_by_lightning": "Requeued SLURM job",
        "requeue_failed": "failed with error code",
        "sigterm_received": "Received SIGTERM",
        "sigterm_bypassed": "Bypassing SIGTERM",
        "restored_hpc": "Restored all states from the checkpoint",
        "preemption_cancelled_step": "DUE TO PREEMPTION",
    }
    return {key: text.count(needle) for key, needle in lines.items()}


def hpc_checkpoints(run: Run) -> dict[str, int]:
    """Lightning's own hpc checkpoints of the run: file name -> the global step it holds."""
    import torch

    return {
        p.name: int(torch.load(p, map_location="cpu", weights_only=False)["global_step"])
        for p in sorted((run.home / "lightning_root").glob("hpc_ckpt_*.ckpt"))
    }


def step_spans(job_id: str) -> list[tuple[float, float]]:
    """(Start, End) of the job's steps (batch, srun steps) in every run instance: Slurm ends a preempted
    job's record when it preempts it, while its steps (the training process saving and exiting) can
    run on a few seconds, the node still theirs."""
    out = sh(["sacct", "-n", "-P", "--duplicates", "-j", job_id, "-o", "JobID,Start,End"])
    spans = []
    for line in out.splitlines():
        jid, start, end = line.split("|")
        if "." in jid and start not in ("Unknown", "None") and end not in ("Unknown", "None"):
            spans.append((slurm_time(start), slurm_time(end)))
    return spans


def held_until(inst: list[Instance], spans: list[tuple[float, float]]) -> list[float]:
    """Per run instance: when its last step ended (its own End when that is later)."""
    ends = [i.end for i in inst]
    for start, end in spans:
        mine = [k for k, i in enumerate(inst) if i.start <= start]
        if mine:
            ends[mine[-1]] = max(ends[mine[-1]], end)
    return ends


def analyse(run: Run) -> dict[str, Any]:
    inst: list[Instance] = []
    spans: list[tuple[float, float]] = []
    for job in run.job_ids:
        inst += instances(job)
        spans += step_spans(job)
    inst.sort(key=lambda i: i.start)
    held = held_until(inst, spans)
    rows = timeline(run, inst)
    steps = [step for _, step, _ in rows]
    out: dict[str, Any] = {
        "variant": run.variant,
        "role": run.role,
        "rep": run.rep,
        "job_ids": run.job_ids,
        "instances": [asdict(i) for i in inst],
        "preemptions": max(len(inst) - 1, 0),  # run instances after the first: preemptions that took effect
        "allocated_s": sum(i.end - i.start for i in inst),  # the job's records: Start to End
        "held_s": sum(end - i.start for i, end in zip(inst, held, strict=True)),  # to its steps' end
        "steps_ended": held,
        "steps_recorded": len(steps),
        "distinct_steps": len(set(steps)),
        "missing_count": len(set(range(1, run.total_steps + 1)) - set(steps)),  # steps never run
        "missing_steps": sorted(set(range(1, run.total_steps + 1)) - set(steps))[:20],
        "steps_redone": redone(rows),
        "launcher_rc": run.launcher_rc,
        "launcher_err_tail": run.launcher_err[-1500:] if run.launcher_rc else "",
        "timed_out": run.timed_out,
        "result": run.result,
        "preempt_sent": run.preempt_sent,
        "preempt_at_steps": run.preempt_at_steps,
        "first_step_s": rows[0][2] - inst[0].start if rows and inst else None,
    }
    if run.variant == "Lightning auto_requeue":
        out["lightning_log"] = lightning_log(run)
        out["hpc_checkpoints"] = hpc_checkpoints(run)
    if run.preempt_sent is not None and len(inst) >= 2:
        first, second = inst[0], inst[1]
        before = [r for r in rows if r[2] <= first.end + 1 and r[0] == rows[0][0]]
        after = [r for r in rows if r[0] != rows[0][0]]
        out.update(
            stop_s=first.end - run.preempt_sent,  # preemption submitted -> the instance ended (sacct, whole s)
            stop_steps_s=held[0] - run.preempt_sent,  # preemption submitted -> its last step ended
            queue_s=second.start - first.end,  # requeued -> running again: excluded from the lost time
            restart_s=after[0][2] - second.start if after else None,  # new instance -> first step done
            steps_after_preemption_sent=sum(1 for r in before if r[2] > run.preempt_sent),
            stopped_after_step=max((r[1] for r in before), default=None),
            resumed_at_step=after[0][1] if after else None,
        )
    return out


def summarise(reference: dict[str, Any], preempted: dict[str, Any], same: bool) -> dict[str, Any]:
    n = preempted["preemptions"]
    ok = not preempted["timed_out"] and preempted["result"] is not None
    return {
        "variant": preempted["variant"],
        "rep": preempted["rep"],
        "preemptions": n,
        "steps_redone": preempted["steps_redone"],
        "steps_missing": preempted["missing_count"],
        "lost_s_per_preemption": (preempted["allocated_s"] - reference["allocated_s"]) / n if n else None,
        "lost_steps_end_s_per_preemption": (preempted["held_s"] - reference["held_s"]) / n if n else None,
        "stop_s": preempted.get("stop_s"),
        "stop_steps_s": preempted.get("stop_steps_s"),
        "restart_s": preempted.get("restart_s"),
        "queue_s": preempted.get("queue_s"),
        "reference_allocated_s": reference["allocated_s"],
        "preempted_allocated_s": preempted["allocated_s"],
        "steps_after_preemption_sent": preempted.get("steps_after_preemption_sent"),
        "stopped_after_step": preempted.get("stopped_after_step"),
        "resumed_at_step": preempted.get("resumed_at_step"),
        "completed": ok,
        "result_equals_reference": same,
    }


def same_result(variant: str, ref: dict[str, Any] | None, pre: dict[str, Any] | None) -> bool:
    if ref is None or pre is None:
        return False
    if variant == "plain script":
        return bool(ref.get("weight") == pre.get("weight") and ref.get("bias") == pre.get("bias"))
    return bool(ref.get("digest") and ref.get("digest") == pre.get("digest"))


def fmt(value: Any, spec: str = ".1f") -> str:
    return "—" if value is None else format(value, spec)


def table(summaries: list[dict[str, Any]]) -> str:
    head = (
        "| rep | variant | preemptions | steps redone | steps never run | lost / preemption (s) "
        "| lost, to the steps' end (s) | stop (s) | stop, to the steps' end (s) | restart (s) | queue wait (s) "
        "| uninterrupted (s) | result = uninterrupted |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    )
    lines = [head]
    for s in summaries:
        result = "yes" if s["result_equals_reference"] else ("no" if s["completed"] else "no (did not complete)")
        lines.append(
            f"| {s['rep']} | {s['variant']} | {s['preemptions']} | {s['steps_redone']} | {s['steps_missing']} | "
            f"{fmt(s['lost_s_per_preemption'])} | {fmt(s['lost_steps_end_s_per_preemption'])} | "
            f"{fmt(s['stop_s'])} | {fmt(s['stop_steps_s'])} | {fmt(s['restart_s'])} | "
            f"{fmt(s['queue_s'], '.0f')} | {fmt(s['reference_allocated_s'], '.0f')} | {result} |"
        )
    return "\n".join(lines)


def medians(summaries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for variant in VARIANTS:
        mine = [s for s in summaries if s["variant"] == variant]
        if not mine:
            continue
        per: dict[str, Any] = {}
        keys = ("steps_redone", "lost_s_per_preemption", "lost_steps_end_s_per_preemption", "stop_s", "stop_steps_s")
        for key in (*keys, "restart_s", "queue_s"):
            values = [s[key] for s in mine if s[key] is not None]
            per[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)} if values else None
        per["result_equals_reference"] = [s["result_equals_reference"] for s in mine]
        out[variant] = per
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--node", default="cpu-1", help="the node every run is pinned to")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of: " + ", ".join(VARIANTS))
    ap.add_argument("--plain-steps", type=int, default=400)
    ap.add_argument("--plain-pause", type=float, default=0.1, help="the plain script's seconds per step")
    ap.add_argument("--epochs", type=int, default=8, help="Lightning and HF epochs (64 steps each)")
    ap.add_argument("--lit-pause", type=float, default=0.05, help="sleep added to each Lightning training step")
    ap.add_argument("--hf-pause", type=float, default=0.05, help="sleep added to each HF training step")
    ap.add_argument("--at", type=float, default=0.4, help="preempt when the attempt has done this share of steps")
    ap.add_argument("--timeout", type=float, default=400.0, help="per run, seconds")
    ap.add_argument("--work", type=Path, default=None, help="work directory (default: a new one in /var/tmp)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--out", type=Path, default=BENCH / "results" / "trainer_preemption.json")
    args = ap.parse_args()
    if not os.environ.get("SLURM_CONF"):
        sys.exit("set SLURM_CONF to the test cluster's slurm.conf (tests/cluster/slurm-cluster up prints it)")
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        sys.exit(f"unknown variants {sorted(unknown)}; known: {VARIANTS}")

    work = args.work or Path(tempfile.mkdtemp(prefix="trainer_preemption.", dir="/var/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work dir {work}", flush=True)
    t0 = time.time()
    load_before = os.getloadavg()
    runs: list[dict[str, Any]] = []
    summaries: list[dict[str, Any]] = []

    def total(variant: str) -> int:
        return int(args.plain_steps) if variant == "plain script" else int(args.epochs) * STEPS_PER_EPOCH

    for rep in range(1, args.reps + 1):
        for variant in variants:
            done: dict[str, dict[str, Any]] = {}
            for role in ("reference", "preempted"):
                slug = variant.split()[0].lower() + ("-own" if "auto_requeue" in variant else "")
                run = Run(variant, role, rep, work / f"rep{rep}-{slug}-{role}", total(variant))
                started = time.time()
                print(f"rep {rep} {variant} {role} ...", flush=True)
                execute(run, args)
                time.sleep(2)  # accounting catches up with the job's end
                done[role] = analyse(run)
                done[role]["run_wall_s"] = time.time() - started
                runs.append(done[role])
                print(
                    f"  {time.time() - started:.0f} s, instances {len(done[role]['instances'])}, "
                    f"redone {done[role]['steps_redone']}, result {'yes' if run.result else 'NONE'}",
                    flush=True,
                )
            same = same_result(variant, done["reference"]["result"], done["preempted"]["result"])
            summaries.append(summarise(done["reference"], done["preempted"], same))
    wall = time.time() - t0
    lit_digests = {
        r["variant"]: r["result"].get("digest")
        for r in runs
        if r["role"] == "reference" and r["result"] and r["variant"].startswith("Lightning")
    }
    report = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t0)),
        "args": {k: str(v) for k, v in vars(args).items()},
        "wall_s": wall,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "lightning_references_agree": len(set(lit_digests.values())) == 1 if len(lit_digests) == 2 else None,
        "summary": summaries,
        "medians": medians(summaries),
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(table(summaries))
    print(f"whole run {wall:.0f} s; wrote {args.out}")
    if not args.keep and args.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
