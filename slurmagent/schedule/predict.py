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

from slurmagent.config import SchedulingConf, SiteConf
from slurmagent.schedule.history import HistoryRow

MIN_TIME_S = 60  # Slurm's --time is in minutes
MIN_MEM_MB = 512  # MaxRSS is sampled (JobAcctGatherFrequency): a short run may show too little
MEM_STEP_MB = 64


@dataclass(frozen=True)
class Prediction:
    reference_s: float | None  # run time on a throughput-1.0 GPU (A100-seconds); None = no history
    mem_mb: int | None  # memory per node to ask; None = no history
    runs: int  # history rows it is based on
    basis: str  # how, in words, with the numbers
    gpu_mem_gib: float | None = None  # GPU memory one device needs, from measured peaks; None = none measured

    def expected_on(self, throughput: float, inflation: float = 1.0) -> float | None:
        """The predicted run time on a GPU of `throughput`, seconds (what a budget counts)."""
        if self.reference_s is None:
            return None
        return self.reference_s / max(throughput, 1e-9) * inflation

    def seconds_on(self, throughput: float, inflation: float = 1.0) -> int | None:
        """The --time to ask on a GPU of `throughput` (rounded up to whole minutes)."""
        return limit_seconds(self.reference_s, throughput, inflation)


def limit_seconds(reference_s: float | None, throughput: float, inflation: float = 1.0) -> int | None:
    """The --time for `reference_s` A100-seconds of work on a GPU of `throughput`, in whole
    minutes (Slurm's unit); None without a prediction."""
    if reference_s is None:
        return None
    raw = reference_s / max(throughput, 1e-9) * inflation
    return max(MIN_TIME_S, math.ceil(raw / 60 - 1e-9) * 60)


def reference_seconds(row: HistoryRow, site: SiteConf) -> float:
    gpu = site.gpu(row.gpu_type)
    return row.elapsed_s * (gpu.throughput if gpu is not None else 1.0)


def predict(rows: Sequence[HistoryRow], site: SiteConf, conf: SchedulingConf | None = None) -> Prediction:
    """Rows newest first (HistoryStore.recent). Failed runs (FAILED, OOM) say nothing about
    run time; an OOM'd run still says memory was short (its MaxRSS is a lower bound)."""
    conf = conf or site.scheduling
    timed = [r for r in rows if r.state in ("COMPLETED", "TIMEOUT")][: conf.recent]
    gpu_gib, gpu_basis = _gpu_mem(rows, conf)
    if not timed:
        return Prediction(None, _mem(rows, conf), 0, "no finished run of this work in the history" + gpu_basis, gpu_gib)
    values = [reference_seconds(r, site) * (2.0 if r.hit_limit else 1.0) for r in timed]
    mean = sum(values) / len(values)
    overran = sum(r.hit_limit for r in timed)
    shown = ", ".join(
        f"{r.elapsed_s:.0f}s on {r.gpu_type or 'cpu'}{' (hit its limit: ×2)' if r.hit_limit else ''}" for r in timed
    )
    basis = f"mean of the last {len(timed)} run(s) ({shown}) = {mean:.0f} A100-s, × {conf.inflation} inflation"
    if overran:
        basis += f"; {overran} overran"
    return Prediction(mean, _mem(rows, conf), len(timed), basis + gpu_basis, gpu_gib)


def _gpu_mem(rows: Sequence[HistoryRow], conf: SchedulingConf) -> tuple[float | None, str]:
    """The GPU memory one device needs: the largest peak the runtime measured in the recent
    runs (what torch's allocator held), inflated like host memory. An OOM'd run's peak is only
    a lower bound, but it is still a bound."""
    peak_mb = max((r.gpu_mem_peak_mb for r in rows[: max(conf.recent, 5)]), default=0.0)
    if peak_mb <= 0:
        return None, ""
    need = peak_mb * conf.inflation / 1024
    return need, f"; GPU memory: peak {peak_mb / 1024:.2f} GiB measured, × {conf.inflation} = {need:.2f} GiB"


def _mem(rows: Sequence[HistoryRow], conf: SchedulingConf) -> int | None:
    measured = [r.max_rss_mb for r in rows[: max(conf.recent, 5)] if r.max_rss_mb > 0]
    if not measured:
        return None
    peak = max(measured) * conf.inflation
    if any(r.state == "OUT_OF_MEMORY" for r in rows[: conf.recent]):
        peak = max(peak, max(r.req_mem_mb for r in rows[: conf.recent]) * 2)  # it needed more than it had
    return max(MIN_MEM_MB, math.ceil(peak / MEM_STEP_MB) * MEM_STEP_MB)


def relative_error(predicted_s: float, actual_s: float) -> float:
    """(predicted − actual) / actual: positive = over-estimate."""
    return (predicted_s - actual_s) / actual_s if actual_s > 0 else 0.0
