"""Run time and memory of a job from the history of the same work (pure).

The method is the one that works for backfilling (Tsafrir, Etsion & Feitelson, "Backfilling
using system-generated predictions rather than user runtime estimates", IEEE TPDS 18(6),
2007): predict the mean of the most recent runs (`site.scheduling.recent`, 2 by default), and
correct on an overrun — a run that hit its limit only says the work takes longer, so its
elapsed time counts doubled. A mild multiplicative inflation (`inflation`, 1.2) is added, as
an under-estimate costs more than an over-estimate (a requeue at the limit, though for a
checkpointed job a clean one). Without history the caller's fallback stands.

Run times are kept in A100-seconds (elapsed × the GPU type's throughput) so that a run on
one type predicts another: predicted = reference / throughput.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from slurmagent.config import SchedulingConf, SiteConf
from slurmagent.schedule.history import HistoryRow

MIN_TIME_S = 60  # Slurm's --time is in minutes
MIN_MEM_MB = 512  # no history row says less than this is enough
MEM_STEP_MB = 64
# sbatch(1), --signal: "Due to the resolution of event handling by Slurm, the signal may be sent
# up to 60 seconds earlier than specified"
SIGNAL_RESOLUTION_S = 60
CHECKPOINT_FALLBACK_S = 30.0  # a checkpoint save's time when the runtime measured none for this work
MEASURED_WINDOW = 5  # memory: the largest need of this many recent rows (and of as many measured ones)


@dataclass(frozen=True)
class Prediction:
    reference_s: float | None  # run time on a throughput-1.0 GPU (A100-seconds); None = no history
    mem_mb: int | None  # memory per node to ask; None = no history
    runs: int  # history rows it is based on
    basis: str  # how the run time was predicted, in words, with the numbers
    gpu_mem_gib: float | None = None  # GPU memory one device needs, from measured peaks and GPU OOMs; None = unknown
    mem_basis: str = ""  # how the host memory was sized ("" = no history)
    gpu_basis: str = ""  # how the GPU memory need was found ("" = none known)
    checkpoint_s: float | None = None  # the longest checkpoint save the runtime measured on this work; None = none

    def expected_on(self, throughput: float, inflation: float = 1.0) -> float | None:
        """The predicted run time on a GPU of `throughput`, seconds (what a budget counts)."""
        if self.reference_s is None:
            return None
        return self.reference_s / max(throughput, 1e-9) * inflation

    def seconds_on(self, throughput: float, inflation: float = 1.0, lead_s: float = 0.0) -> int | None:
        """The --time to ask on a GPU of `throughput` (rounded up to whole minutes), with
        `lead_s` for the stop warning (`stop_lead_s`)."""
        return limit_seconds(self.reference_s, throughput, inflation, lead_s)


def stop_lead_s(signal_delay_s: float, checkpoint_s: float | None) -> float:
    """What a checkpointed job's --time must hold beyond its run time so that it ends before
    Slurm's stop warning: the warning's lead (`recovery.signal_delay_s`), the 60 s by which
    Slurm may send it early, and one checkpoint save (measured on this work, else
    `CHECKPOINT_FALLBACK_S`)."""
    return signal_delay_s + SIGNAL_RESOLUTION_S + (checkpoint_s if checkpoint_s else CHECKPOINT_FALLBACK_S)


def limit_seconds(
    reference_s: float | None, throughput: float, inflation: float = 1.0, lead_s: float = 0.0
) -> int | None:
    """The --time for `reference_s` A100-seconds of work on a GPU of `throughput`, × `inflation`,
    plus `lead_s`, in whole minutes (Slurm's unit); None without a prediction."""
    if reference_s is None:
        return None
    raw = reference_s / max(throughput, 1e-9) * inflation + lead_s
    return max(MIN_TIME_S, math.ceil(raw / 60 - 1e-9) * 60)


def reference_seconds(row: HistoryRow, site: SiteConf) -> float:
    gpu = site.gpu(row.gpu_type)
    return row.elapsed_s * (gpu.throughput if gpu is not None else 1.0)


def predict(rows: Sequence[HistoryRow], site: SiteConf, conf: SchedulingConf | None = None) -> Prediction:
    """Rows newest first (HistoryStore.recent). Failed runs (FAILED, OOM) say nothing about
    run time; an OOM'd run still says memory was short (it died at its limit: a lower bound)."""
    conf = conf or site.scheduling
    timed = [r for r in rows if r.state in ("COMPLETED", "TIMEOUT")][: conf.recent]
    gpu_gib, gpu_basis = _gpu_mem(rows, conf)
    mem_mb, mem_basis = _mem(rows, conf)
    saves = [r.checkpoint_s for r in rows[:MEASURED_WINDOW] if r.checkpoint_s > 0]
    extra: dict[str, Any] = {
        "gpu_mem_gib": gpu_gib,
        "mem_basis": mem_basis,
        "gpu_basis": gpu_basis,
        "checkpoint_s": max(saves) if saves else None,
    }
    if not timed:
        return Prediction(None, mem_mb, 0, "no finished run of this work in the history", **extra)
    values = [reference_seconds(r, site) * (2.0 if r.hit_limit else 1.0) for r in timed]
    mean = sum(values) / len(values)
    overran = sum(r.hit_limit for r in timed)
    shown = ", ".join(
        f"{r.elapsed_s:.0f}s on {r.gpu_type or 'cpu'}{' (hit its limit: ×2)' if r.hit_limit else ''}" for r in timed
    )
    basis = f"mean of the last {len(timed)} run(s) ({shown}) = {mean:.0f} A100-s, × {conf.inflation} inflation"
    if overran:
        basis += f"; {overran} overran"
    return Prediction(mean, mem_mb, len(timed), basis, **extra)


def _gpu_mem(rows: Sequence[HistoryRow], conf: SchedulingConf) -> tuple[float | None, str]:
    """The GPU memory one device needs: the largest peak the runtime measured in the recent
    runs (what torch's allocator held), inflated like host memory; and more than any GPU type
    this work ran out of memory on (a job that records no peak — a plain script — still says
    that much)."""
    peak_mb = max((r.gpu_mem_peak_mb for r in rows[: max(conf.recent, MEASURED_WINDOW)]), default=0.0)
    too_small = max((r.gpu_oom_gib for r in rows), default=0.0)
    notes, need = [], 0.0
    if peak_mb > 0:
        need = peak_mb * conf.inflation / 1024
        notes.append(f"peak {peak_mb / 1024:.2f} GiB measured, × {conf.inflation} = {need:.2f} GiB")
    if too_small > 0:
        notes.append(f"ran out of memory on a {too_small:g} GiB GPU: needs more")
        need = max(need, too_small)
    if not notes:
        return None, ""
    return need, "; ".join(notes)


def _mem(rows: Sequence[HistoryRow], conf: SchedulingConf) -> tuple[int | None, str]:
    """Memory per node: the largest need (`HistoryRow.mem_need_mb`) of the recent runs and of
    the recent measured ones, × inflation — a run too short for Slurm to sample (a few MB of
    MaxRSS) never hides a measured or OOM-killed one; a recent run that ended killed for
    memory: twice its limit; a run that completed after an OOM without a measured peak: at
    least the limit it completed under."""
    window = max(conf.recent, MEASURED_WINDOW)
    measured = [r for r in rows if r.mem_measured][:window]
    seen = list({id(r): r for r in (*rows[:window], *measured)}.values())
    top = max(seen, key=lambda r: r.mem_need_mb, default=None)
    if top is None or top.mem_need_mb <= 0:
        return None, ""
    need = top.mem_need_mb
    source = (
        "the limit an OOM-killed run died at"
        if need == top.oom_mem_mb
        else ("the runtime's own peak" if need == top.host_mem_peak_mb else "MaxRSS")
    )
    mem = need * conf.inflation
    why = f"largest need of recent runs: {need:.0f} MB ({source}) × {conf.inflation}"
    oomed = [r for r in rows[: conf.recent] if r.state == "OUT_OF_MEMORY"]
    if oomed:
        killed = max(r.oom_mem_mb or r.req_mem_mb for r in oomed)
        if 2 * killed > mem:
            mem, why = 2 * killed, f"the last run was killed at {killed:.0f} MB (OOM): twice that"
    enough = [r.req_mem_mb for r in seen if r.state == "COMPLETED" and r.oom_mem_mb > 0 and r.host_mem_peak_mb <= 0]
    if enough and max(enough) > mem:
        mem = max(enough)
        why += f"; at least the {mem:.0f} MB it completed under after an OOM (its peak was not measured)"
    return max(MIN_MEM_MB, math.ceil(mem / MEM_STEP_MB) * MEM_STEP_MB), why
