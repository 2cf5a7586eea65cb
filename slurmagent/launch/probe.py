"""The pre-flight probe (`probe`; issue 20): before a sweep's first submission into an
environment it has not checked in the last day, one short job there — the sweep's partition,
GPUs and constraints, its `env.vars` and `env.setup` lines, its interpreter — gathers the facts
env_check assesses (skills/env_facts.py, run as text by the job's own interpreter, which may
lack everything, slurmagent included), and the launcher refuses the sweep with the finding and
its fix when one is CRITICAL: one probe job fails, not N array tasks the same way.

`probe=auto` (the default) probes a sweep that sets its own environment (`env.python` or
`env.setup`): the launcher's own interpreter is known to work; `on` probes every Slurm sweep;
`recheck` probes even when a recent check passed; `off` never. A probe still waiting in the
queue after PROBE_WAIT_S is cancelled and the launch goes on unchecked, saying so. Passed
checks are cached per environment (`probe_key`) in the user's state directory for a day.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from slurmagent.config import JobSpec
from slurmagent.errors import ConfigError, SlurmAgentError, choices
from slurmagent.files import atomic_write
from slurmagent.safety.paths import state_dir
from slurmagent.skills._base import Status
from slurmagent.skills.env_check import EnvFinding, assess
from slurmagent.skills.env_facts import EnvFacts
from slurmagent.slurm.container import DEFAULT_PYTHON, step_words, wrap
from slurmagent.slurm.sbatch import env_lines, safe_directive_value, safe_job_name, sbatch_flags
from slurmagent.slurm.seam import TERMINAL_STATES, SlurmCLI

PROBE_CHOICES = ("auto", "on", "recheck", "off")
PROBE_TTL_S = 24 * 3600  # a passed check holds this long
PROBE_WAIT_S = 300.0  # the longest the launcher waits for its probe to start and end
PROBE_TIME = "00:05:00"  # the probe job's time limit
FACTS_MARK = "SLURMAGENT_FACTS "  # the line of the probe's output that holds the facts


@dataclass(frozen=True)
class ProbeOutcome:
    key: str
    findings: list[EnvFinding] = field(default_factory=list)
    job_id: str | None = None
    cached: bool = False
    seconds: float = 0.0
    note: str = ""  # why it was not checked (the probe did not start in time, Slurm refused it)

    def describe(self) -> str:
        if self.note:
            return f"warning: the environment was not checked: {self.note}"
        if self.cached:
            return "environment checked within the last day (probe=recheck checks it again)"
        return f"environment checked by probe job {self.job_id} in {self.seconds:.1f} s"

    @property
    def critical(self) -> list[EnvFinding]:
        return [f for f in self.findings if f.status == Status.CRITICAL]


def probe_mode(value: object) -> str:
    if value not in PROBE_CHOICES:
        raise ConfigError(f"probe={value!r} is not one of {choices(PROBE_CHOICES)}; nothing was submitted")
    return str(value)


def wanted(mode: str, spec: JobSpec) -> bool:
    probe_mode(mode)
    if mode == "off":
        return False
    return mode in ("on", "recheck") or bool(spec.env.python or spec.env.setup or spec.env.container.image)


def probe_key(spec: JobSpec, python: str) -> str:
    """What makes an environment: where the job lands (partition, GPUs, constraints) and what
    runs before and as its Python."""
    res = spec.resources
    where = {k: getattr(res, k) for k in ("partition", "gpus", "gpu_type", "constraint", "account", "qos")}
    image = dataclasses.asdict(spec.env.container)
    body = json.dumps({"where": where, "lines": env_lines(spec.env), "python": python, "image": image}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def probe_script(spec: JobSpec, python: str, output: Path, name: str) -> str:
    """The probe job's batch script: the sweep's placement for five minutes, one task, its
    env lines, then the facts gatherer's text run by the job's interpreter."""
    if not safe_directive_value(str(output)):
        raise ConfigError(f"the probe's log path {str(output)!r} cannot stand in an #SBATCH line")
    res = dataclasses.replace(spec.resources, nodes=1, tasks_per_node=1, time=PROBE_TIME)
    flags = {"job-name": safe_job_name(f"{name}-probe"), "output": str(output), **sbatch_flags(res)}
    source = resources.files("slurmagent.skills").joinpath("env_facts.py").read_text()
    # in the sweep's image when it has one: the probe sees the interpreter its jobs will run
    wrapped = wrap(spec.env, [str(output.parent)], os.getcwd(), spec.resources.gpus)
    return "\n".join(
        [
            "#!/bin/bash",
            *(f"#SBATCH --{k}={v}" for k, v in flags.items()),
            "# slurmagent's pre-flight probe: the sweep's environment, then the facts env_check assesses",
            *env_lines(spec.env),
            "exec " + shlex.join(step_words(wrapped, [python, "-c", source])),
            "",
        ]
    )


def findings_of(output: str) -> list[EnvFinding]:
    """The probe's log → env_check's findings, and slurmagent's own: the interpreter must run
    (the facts line is there) and import slurmagent."""
    line = next((ln for ln in reversed(output.splitlines()) if ln.startswith(FACTS_MARK)), None)
    if line is None:
        tail = " | ".join(ln.strip() for ln in output.strip().splitlines()[-3:]) or "no output"
        return [
            EnvFinding(
                Status.CRITICAL,
                f"the job's interpreter did not run ({tail})",
                "check env.python (an interpreter on the compute nodes) and env.setup",
            )
        ]
    facts = EnvFacts(**json.loads(line[len(FACTS_MARK) :]))
    found = assess(facts)
    if facts.slurmagent is False:
        found.append(
            EnvFinding(
                Status.CRITICAL,
                f"slurmagent does not import in {facts.executable or 'the job interpreter'}",
                "pip install slurmagent into the jobs' environment (env.python), or leave env.python unset",
            )
        )
    return found


def run_probe(
    spec: JobSpec,
    python: str,
    slurm: SlurmCLI,
    name: str,
    folder: Path,
    wait_s: float = PROBE_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
) -> ProbeOutcome:
    key = probe_key(spec, python)
    folder.mkdir(parents=True, exist_ok=True)
    output = folder / f"{key}-%j.out"
    script = folder / f"{key}.sbatch"
    script.write_text(probe_script(spec, python, output, name))
    t0 = time.monotonic()
    job = slurm.submit(script)
    log = folder / f"{key}-{job}.out"
    try:
        while True:
            try:
                seen = slurm.job_state(job)
            except SlurmAgentError:
                seen = None  # the controller did not answer: look at the log
            if seen is None or seen.state in TERMINAL_STATES:
                break
            if time.monotonic() - t0 > wait_s:
                slurm.cancel([job])
                why = f"the probe job {job} did not end within {wait_s:.0f} s ({seen.state}: {seen.reason})"
                return ProbeOutcome(key, job_id=job, seconds=time.monotonic() - t0, note=why)
            sleep(0.5)
    except KeyboardInterrupt:  # Ctrl-C while it waits: the probe does not stay queued
        slurm.cancel([job])
        raise
    text = log.read_text(errors="replace") if log.exists() else ""
    return ProbeOutcome(key, findings_of(text), job_id=job, seconds=time.monotonic() - t0)


def _cache_path(key: str) -> Path:
    return state_dir() / "probes" / f"{key}.json"


def cached(key: str, now: float | None = None) -> bool:
    try:
        body = json.loads(_cache_path(key).read_text())
    except (OSError, ValueError):
        return False
    return (time.time() if now is None else now) - float(body.get("at", 0)) < PROBE_TTL_S


def interpreter_of(spec: JobSpec, launcher_python: str) -> str:
    """The interpreter a spec's jobs start: env.python, else the image's own (in a container),
    else the launcher's."""
    return spec.env.python or (DEFAULT_PYTHON if spec.env.container.image else launcher_python)


def remember(out: ProbeOutcome) -> None:
    """A check that ran and found nothing CRITICAL, kept for a day."""
    if not out.note and not out.critical and not out.cached:
        atomic_write(_cache_path(out.key), json.dumps({"at": time.time(), "job": out.job_id}).encode())


def check_environments(
    specs: Sequence[JobSpec], mode: str, python: str, slurm: SlurmCLI, name: str
) -> list[ProbeOutcome]:
    """Probe each distinct environment of the sweep that wants it (`wanted`), unless a check
    passed within a day (`recheck`: even then). ConfigError naming each CRITICAL finding and
    its fix: nothing is submitted."""
    outcomes: list[ProbeOutcome] = []
    done: set[str] = set()
    for spec in specs:
        if not wanted(mode, spec):
            continue
        interpreter = interpreter_of(spec, python)
        key = probe_key(spec, interpreter)
        if key in done:
            continue
        done.add(key)
        if mode != "recheck" and cached(key):
            outcomes.append(ProbeOutcome(key, cached=True))
            continue
        out = run_probe(spec, interpreter, slurm, name, state_dir() / "probes")
        outcomes.append(out)
        if out.critical:
            where = spec.resources.partition or "the default partition"
            found = "; ".join(f"{f.what} (fix: {f.fix})" for f in out.critical)
            raise ConfigError(
                f"the environment probe (Slurm job {out.job_id}, {where}, python {interpreter}) found: {found}; "
                "nothing was submitted (probe=off skips the check)"
            )
        remember(out)
    return outcomes
