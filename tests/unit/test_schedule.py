"""Resource scheduling's pure parts on recorded inputs: the catalogue, fingerprints, the
history store fed with real sacct output of the test cluster, the predictor, placement on
recorded cluster states, budgets, per-partition caps. (The cluster tests are in
tests/slurm/test_schedule_slurm.py.)"""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
import sys
from pathlib import Path

import pytest
from test_slurm_parse import SINFO_NODES as RECORDED_NODES
from test_slurm_parse import SINFO_PARTS

from slurmagent.config import (
    BudgetConf,
    ResourcesConf,
    SchedulingConf,
    budget_conf,
    default_site,
    job_spec,
    site_conf,
    spec_dict,
    validate_resources,
)
from slurmagent.errors import BudgetExceeded, ConfigError
from slurmagent.render import compose
from slurmagent.schedule.budget import Usage, check_prediction, reached, usage_of
from slurmagent.schedule.history import HistoryRow, HistoryStore, fingerprint, row_from_usage
from slurmagent.schedule.place import candidates, choose, proportional_cpus, proportional_mem_mb, with_waits
from slurmagent.schedule.plan import plan_spec
from slurmagent.schedule.predict import predict
from slurmagent.slurm.cluster import parse_cluster
from slurmagent.slurm.sbatch import sbatch_flags
from slurmagent.slurm.seam import PendingJob, SlurmCLI, parse_pending, parse_test_only, parse_usage
from slurmagent.syntax import slurm_time_to_seconds

# the test cluster's sinfo (tests/unit/test_slurm_parse.py), with t4-2 drained
SINFO_NODES = RECORDED_NODES.replace("gpu:t4:2|t4,gpu|mixed", "gpu:t4:2|t4,gpu|drained")
CLUSTER = parse_cluster(SINFO_NODES, SINFO_PARTS, {})

# `sacct -n -P --duplicates -o USAGE_FIELDS` of the test cluster: an array of two tasks on a
# t4, and a task that was requeued once (REQUEUED run, then the completed one)
SACCT = """\
1736_0|slurmagent|low|00:00:05|01:00:00||1500M|00:00.525|COMPLETED|t4-1|billing=2,cpu=2,gres/gpu=1,mem=1500M,node=1|2026-12-01T18:06:35|
1736_0.batch|batch||00:00:05||1124K||00:00.010|COMPLETED|t4-1|cpu=2,gres/gpu=1,mem=1500M,node=1|2026-12-01T18:06:35|
1736_0.0|python||00:00:05||824K||00:00.514|COMPLETED|t4-1|cpu=2,gres/gpu=1,mem=1500M,node=1|2026-12-01T18:06:35|
1736_1|slurmagent|low|00:00:05|01:00:00||1500M|00:00.530|COMPLETED|t4-1|billing=2,cpu=2,gres/gpu=1,mem=1500M,node=1|2026-12-01T18:06:35|
1073_3|digits_mlp|low|00:00:02|00:10:00||1G|00:03.287|REQUEUED|cpu-1|billing=1,cpu=1,mem=1G,node=1|2026-12-01T16:19:44|
1073_3.batch|batch||00:00:03||3428K||00:00.002|CANCELLED|cpu-1|cpu=1,mem=1G,node=1|2026-12-01T16:19:45|
1073_3.0|python||00:00:14||318124K||00:03.284|COMPLETED|cpu-1|cpu=1,mem=1G,node=1|2026-12-01T16:19:56|
1073_3|digits_mlp|low|00:00:12|00:10:00||1G|00:03.345|COMPLETED|cpu-1|billing=1,cpu=1,mem=1G,node=1|2026-12-01T16:19:54|
"""


def row(
    elapsed: float, gpu_type: str = "a100", state: str = "COMPLETED", rss: float = 1000.0, at: float = 0
) -> HistoryRow:
    return HistoryRow(
        "fp", f"k{elapsed}{at}", "exp", "low", gpu_type, 1, elapsed, 3600, rss, 2000, 1.0, state, "n", 1, 0.0, at
    )


# -- the catalogue ---------------------------------------------------------------------------
def test_catalogue_has_memory_throughput_and_price_and_a_site_overrides_it() -> None:
    site = default_site()
    assert site.gpu("a100") is not None and site.gpu("t4") is not None
    assert site.gpu("a100").throughput > site.gpu("t4").throughput > 0  # type: ignore[union-attr]
    assert site.gpu("a100").price_per_hour > site.gpu("t4").price_per_hour > 0  # type: ignore[union-attr]
    cfg = compose(["site.gpus.a100.memory_gib=40", "site.gpus.t4.price_per_hour=1.5"])
    over = site_conf(spec_dict(cfg, ("site",))["site"])
    assert over.memory_gib("a100") == 40 and over.gpu("t4").price_per_hour == 1.5  # type: ignore[union-attr]
    assert over.memory_gib("h100") == site.memory_gib("h100")  # the rest stays
    own = site_conf({"gpus": {"mi300": {"memory_gib": 192}}})  # a site's own site/NAME.yaml
    assert own.memory_gib("mi300") == 192 and own.gpu("mi300").throughput == 1.0  # type: ignore[union-attr]


def test_catalogue_and_site_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"site.gpus.t4: need memory_gib > 0, throughput > 0"):
        site_conf({"gpus": {"t4": {"memory_gib": 16, "throughput": 0}}})
    with pytest.raises(ConfigError, match=r"site.priorities.asap: not a priority; valid: background, normal, urgent"):
        site_conf({"priorities": {"asap": {"partition": "high"}}})
    with pytest.raises(
        ConfigError, match=r"unknown key site.scheduling.inflate.*did you mean site.scheduling.inflation"
    ):
        site_conf({"scheduling": {"inflate": 2}})
    with pytest.raises(ConfigError, match=r"resources.priority='asap' is not one of background, normal, urgent"):
        validate_resources(ResourcesConf(priority="asap"))
    with pytest.raises(ConfigError, match=r"budget.gpu_hours=-1.0 must be 0"):
        budget_conf({"gpu_hours": -1.0})


def test_auto_values_cannot_be_rendered_without_planning() -> None:
    res = ResourcesConf(gpus=1, gpu_type="auto", time="auto", mem="auto")
    validate_resources(res)  # auto is a valid value
    with pytest.raises(ConfigError, match=r"resources.gpu_type=auto is decided when the job is launched or planned"):
        sbatch_flags(res)
    assert sbatch_flags(ResourcesConf(time="00:20:00", time_min="00:05:00"))["time-min"] == "00:05:00"


# -- fingerprints and the history store --------------------------------------------------------
def test_fingerprint_keeps_what_changes_the_work_only() -> None:
    ignore = SchedulingConf().ignore_in_fingerprint
    base = fingerprint("digits_mlp", ["+experiment=digits_mlp", "model.width=64"], ignore)
    same = ["+experiment=digits_mlp", "model.width=64", "optim.lr=0.3", "seed=7", "resources.time=auto"]
    assert fingerprint("digits_mlp", [*same, "resources.gpu_type=a100", "hpo.trial=3"], ignore) == base
    assert fingerprint("digits_mlp", ["+experiment=digits_mlp", "model.width=128"], ignore) != base
    assert fingerprint("digits_mlp", ["+experiment=digits_mlp", "model.width=64", "resources.gpus=2"], ignore) != base
    assert fingerprint("other", ["+experiment=digits_mlp", "model.width=64"], ignore) != base


def test_history_store_ingests_real_sacct_output(tmp_path: Path) -> None:
    usage = parse_usage(SACCT)
    assert [u.job_id for u in usage] == ["1736_0", "1736_1", "1073_3", "1073_3"]
    assert usage[0].gpus == 1 and usage[0].elapsed_s == 5 and usage[0].timelimit_s == 3600
    assert usage[0].req_mem_mb == 1500 and usage[0].max_rss_mb == pytest.approx(1124 / 1024)
    assert usage[2].state == "REQUEUED" and usage[2].max_rss_mb == pytest.approx(318124 / 1024)
    requeued = row_from_usage("fpA", "sweep#3", "digits_mlp", "", [u for u in usage if u.job_id == "1073_3"])
    assert requeued is not None and requeued.runs == 2 and requeued.elapsed_s == 14  # both runs' work
    assert requeued.state == "COMPLETED" and requeued.max_rss_mb == pytest.approx(318124 / 1024)
    assert row_from_usage("fpA", "x", "e", "", [usage[2]]) is None  # not ended yet
    store = HistoryStore(tmp_path / "h.sqlite")
    first = row_from_usage("fpB", "sweep#0", "slurmagent", "t4", [usage[0]])
    assert first is not None
    store.add([requeued, first])
    store.add([requeued])  # an ingest run twice replaces its row
    assert [r.task_key for r in store.recent("fpA")] == ["sweep#3"]
    assert store.recent("fpB")[0].gpu_type == "t4" and store.known(["sweep#0", "nope"]) == {"sweep#0"}
    assert HistoryStore(tmp_path / "h.sqlite").recent("fpA")[0] == requeued  # persisted


def test_a_store_written_before_gpu_peaks_were_kept_gains_the_column(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:  # the first schema (slurmagent before GPU memory peaks)
        db.execute(
            "CREATE TABLE runs (fingerprint TEXT NOT NULL, task_key TEXT PRIMARY KEY, experiment TEXT, "
            "partition TEXT, gpu_type TEXT, gpus INTEGER, elapsed_s REAL, timelimit_s REAL, max_rss_mb REAL, "
            "req_mem_mb REAL, total_cpu_s REAL, state TEXT, nodes TEXT, runs INTEGER, steps_per_s REAL, ended_at REAL)"
        )
        db.execute("INSERT INTO runs VALUES ('fp', 'old#0', 'e', 'low', 't4', 1, 60, 600, 900, 1000, 5, "
                   "'COMPLETED', 't4-1', 1, 2.0, 1)")  # fmt: skip
    store = HistoryStore(path)
    old = store.recent("fp")[0]
    assert old.task_key == "old#0" and old.elapsed_s == 60 and old.gpu_mem_peak_mb == 0  # kept: "not reported"
    store.add([dataclasses.replace(row(70, at=2), fingerprint="fp", gpu_mem_peak_mb=5000.0)])
    assert [r.gpu_mem_peak_mb for r in HistoryStore(path).recent("fp")] == [5000.0, 0.0]


# -- the predictor ------------------------------------------------------------------------------
def test_predictor_means_the_recent_runs_and_inflates() -> None:
    site = default_site()
    pred = predict([row(600, at=3), row(400, at=2), row(10_000, at=1)], site)  # newest first; only 2 count
    assert pred.reference_s == 500 and pred.runs == 2
    assert pred.seconds_on(1.0, 1.2) == 600  # 500 × 1.2 = 600 s
    assert pred.seconds_on(site.gpu("t4").throughput, 1.2) == 4020  # type: ignore[union-attr]  # 4000 s, whole minutes
    assert "mean of the last 2 run(s)" in pred.basis


def test_predictor_corrects_an_overrun_and_normalises_gpu_types() -> None:
    site = default_site()
    over = predict([row(300, state="TIMEOUT", at=2), row(300, at=1)], site)
    assert over.reference_s == 450 and "overran" in over.basis  # the limit-hitting run counts doubled
    t4 = site.gpu("t4").throughput  # type: ignore[union-attr]
    mixed = predict([row(1000, gpu_type="t4", at=2), row(1000 * t4, gpu_type="a100", at=1)], site)
    assert mixed.reference_s == pytest.approx(1000 * t4)  # both are the same work in A100-seconds
    assert predict([], site).reference_s is None and predict([row(5, state="FAILED")], site).reference_s is None


def test_predictor_memory_from_max_rss_and_oom() -> None:
    site = default_site()
    assert predict([row(60, rss=1000, at=2), row(60, rss=1500, at=1)], site).mem_mb == 1856  # 1500 × 1.2 in 64 MB steps
    assert predict([row(60, rss=10)], site).mem_mb == 512  # floor: MaxRSS is sampled
    oom = predict([row(60, state="OUT_OF_MEMORY", rss=1900)], site)
    assert oom.mem_mb == 4032  # it needed more than its 2000 MB: twice that, in 64 MB steps
    assert predict([row(60, rss=0)], site).mem_mb is None


def test_predictor_gpu_memory_from_the_measured_peaks() -> None:
    site = default_site()
    rows = [dataclasses.replace(row(60, at=2), gpu_mem_peak_mb=20480.0), row(60, at=1)]  # 20 GiB, not reported
    pred = predict(rows, site)
    assert pred.gpu_mem_gib == pytest.approx(24.0)  # 20 GiB × 1.2
    assert (
        pred.gpu_basis == "peak 20.00 GiB measured, × 1.2 = 24.00 GiB" and "GPU" not in pred.basis
    )  # not in the time's
    assert predict([row(60)], site).gpu_mem_gib is None  # none measured: the config's estimate stands


# -- placement ----------------------------------------------------------------------------------
def test_placement_picks_the_smallest_gpu_that_fits_and_avoids_drained_nodes() -> None:
    site = default_site()
    res = ResourcesConf(gpus=1, gpu_type="auto", time="auto", mem="auto")
    cands = candidates(res, 3.0, 600.0, 3600, site, CLUSTER)
    assert {(c.partition, c.gpu_type) for c in cands} == {("low", "a100"), ("low", "t4"), ("low", "any")}
    t4 = next(c for c in cands if c.gpu_type == "t4")
    assert t4.nodes == ("t4-1",)  # t4-2 is drained
    assert t4.run_s == 4020 and t4.predicted_s == 4000  # --time in whole minutes; the prediction itself
    assert t4.cost == pytest.approx(4000 / 3600 * 0.35) and t4.gpu_hours == pytest.approx(4000 / 3600)  # budget.BASIS
    both_free = with_waits(cands, {("low", "a100"): (0.0, ""), ("low", "t4"): (0.0, "")}, {}, site)
    chosen, why = choose(both_free)
    assert chosen.gpu_type == "a100" and "earliest predicted finish" in why  # a t4 runs 6.7× longer
    a100_busy = with_waits(cands, {("low", "a100"): (7200.0, ""), ("low", "t4"): (0.0, "")}, {}, site)
    assert choose(a100_busy)[0].gpu_type == "t4"  # waiting two hours for the a100 finishes later
    # one request for either type: Slurm would start it now on a t4; as soon as the t4 alone, and more flexible
    waits = {("low", "a100"): (7200.0, ""), ("low", "t4"): (0.0, ""), ("low", "any"): (0.0, "")}
    either, why = choose(with_waits(cands, waits, {"low": "t4"}, site))
    assert either.gpu_type == "any" and either.run_s == 4020 and either.expected_run_s == 4000
    assert "Slurm starts it on whichever of a100/t4 frees first; --time covers the slowest (4020s)" in why
    assert choose(with_waits(cands, {**waits, ("low", "a100"): (0.0, "")}, {"low": "t4"}, site))[0].gpu_type == "a100"
    no_history = candidates(res, 3.0, None, 1800, site, CLUSTER)
    assert (
        choose(with_waits(no_history, {("low", "a100"): (0.0, ""), ("low", "t4"): (0.0, "")}, {}, site))[0].gpu_type
        == "t4"
    )


def test_placement_refuses_when_nothing_fits_and_says_why() -> None:
    site = default_site()
    res = ResourcesConf(gpus=1, gpu_type="auto")
    big = candidates(res, 30.0, 600.0, 3600, site, CLUSTER)
    assert [c.gpu_type for c in big if c.fits] == ["a100"]
    with pytest.raises(ConfigError, match=r"no GPU type fits this job .*t4 on low: 16 GiB < 200.00 GiB needed"):
        choose(candidates(res, 200.0, 600.0, 3600, site, CLUSTER))
    urgent = dataclasses.replace(res, priority="urgent")
    mapped = site_conf({"priorities": {"urgent": {"partition": "high"}}})
    assert {c.partition for c in candidates(urgent, 1.0, 60.0, 60, mapped, CLUSTER)} == {"high"}


def test_cpus_and_memory_in_proportion_to_gpus() -> None:
    nodes = [CLUSTER.nodes["t4-1"]]
    assert proportional_cpus(ResourcesConf(gpus=1), nodes, "t4") == 2  # 4 CPUs / 2 GPUs
    assert proportional_cpus(ResourcesConf(gpus=2), nodes, "t4") == 4
    assert proportional_mem_mb(ResourcesConf(gpus=1), nodes, "t4") == 1500
    assert proportional_mem_mb(ResourcesConf(cpus_per_task=2), [CLUSTER.nodes["cpu-1"]], None) == 1500


class RecordedSlurm(SlurmCLI):
    """Answers `sbatch --test-only` from a table (a recorded cluster state), and the queue's
    waiting jobs from recorded `squeue` lines (none by default); nothing else."""

    def __init__(self, starts: dict[str, tuple[str, str]], squeue: str = "") -> None:
        super().__init__(runner=lambda argv, timeout: (_ for _ in ()).throw(AssertionError(argv)))
        self.starts, self.squeue = starts, squeue  # gres → Slurm's start time
        self.asked: list[dict[str, str]] = []

    def pending(self) -> list[PendingJob]:
        return parse_pending(self.squeue)

    def test_only(self, flags: dict[str, str]):  # type: ignore[no-untyped-def]
        self.asked.append(flags)
        start, node = self.starts[flags.get("gres", "")]
        return parse_test_only(f"sbatch: Job 9 to start at {start} using 1 processors on nodes {node} in partition low")


def test_plan_resolves_every_auto_value_and_records_why(tmp_path: Path) -> None:
    import datetime as dt

    now = dt.datetime(2026, 12, 1, 12, 0, 0).timestamp()
    spec = job_spec(
        {"resources": {"gpus": 1, "gpu_type": "auto", "time": "auto", "mem": "auto"}, "task": {"target": "m:f"}}
    )
    store = HistoryStore(tmp_path / "h.sqlite")
    fp = fingerprint("exp", ["model.width=64"], SchedulingConf().ignore_in_fingerprint)
    store.add([dataclasses.replace(row(120, "a100", rss=700, at=1), fingerprint=fp)])
    slurm = RecordedSlurm(
        {
            "gpu:a100:1": ("2026-12-01T12:30:00", "a100-1"),
            "gpu:t4:1": ("2026-12-01T12:00:00", "t4-1"),
            "gpu:1": ("2026-12-01T12:00:00", "t4-1"),  # either type: Slurm would start it on the t4 now
        }
    )
    fp = fingerprint("exp", ["model.width=64", "optim.lr=0.1"], SchedulingConf().ignore_in_fingerprint)
    plan = plan_spec(
        spec, fp, site=default_site(), history=store, cluster=CLUSTER, slurm=slurm, need_gib=2.0, now=now,
    )  # fmt: skip
    res = plan.resources
    # the a100 would start in 30 min and run 2 min; a t4 starts now and runs 120 / 0.15 s = 13 min (16 with
    # the inflation): a request for either type finishes first, and may start sooner on an a100 freed later.
    # Its --time: 16 min + 150 s for the stop warning (60 s signal delay + 60 s Slurm's resolution + a 30-s
    # save) = 19 min
    assert res.gpu_type is None and res.partition == "low" and res.time == "00:19:00" and res.mem == "896M"
    assert sbatch_flags(res)["gres"] == "gpu:1" and res.time_min == "00:05:00" and res.cpus_per_task == 2
    assert {d["key"] for d in plan.decisions} >= {"resources.gpu_type", "resources.time", "resources.mem"}
    assert len(slurm.asked) == 3 and all("time-min" not in f for f in slurm.asked)
    assert plan.run_s == pytest.approx(960) and plan.usage(default_site()).gpu_hours == pytest.approx(960 / 3600)
    assert plan.usage(default_site()).cost == pytest.approx(960 / 3600 * 0.35)  # priced where it may land: a t4


def test_plan_sizes_gpu_memory_from_the_peak_measured_on_this_work(tmp_path: Path) -> None:
    spec = job_spec({"resources": {"gpus": 1, "gpu_type": "auto", "time": "auto"}, "task": {"target": "m:f"}})
    store = HistoryStore(tmp_path / "h.sqlite")
    store.add([dataclasses.replace(row(120, "a100", at=1), fingerprint="fp", gpu_mem_peak_mb=20480.0)])
    slurm = RecordedSlurm(
        {"gpu:a100:1": ("2026-12-01T12:30:00", "a100-1"), "gpu:t4:1": ("2026-12-01T12:00:00", "t4-1")}
    )
    # the config's estimate (2 GiB) would fit a t4, free now; the runs of this work held 20 GiB
    plan = plan_spec(spec, "fp", site=default_site(), history=store, cluster=CLUSTER, slurm=slurm, need_gib=2.0)
    t4 = next(c for c in plan.candidates if c.gpu_type == "t4")
    assert not t4.fits and t4.fit_note == "16 GiB < 24.00 GiB needed"
    assert plan.resources.gpu_type == "a100" and [f["gres"] for f in slurm.asked] == ["gpu:a100:1"]
    assert "peak 20.00 GiB measured" in plan.prediction.gpu_basis


def test_the_history_row_carries_the_runtimes_gpu_peak(tmp_path: Path, own_state_dir: Path) -> None:
    from slurmagent.supervise.state import Attempt, SweepState, TaskRecord
    from slurmagent.supervise.usage import UsageTracker

    class RecordedSacct(SlurmCLI):
        def usage(self, job_ids):  # type: ignore[no-untyped-def]
            return [u for u in parse_usage(SACCT) if u.job_id in {"1736_0", "1736_1"}]

        def node_gpu_types(self):  # type: ignore[no-untyped-def]
            return {"t4-1": "t4"}  # the sweep asked for any type: the row gets the type of the node it ran on

    tasks = [TaskRecord(i, [f"x={i}"], [Attempt(f"1736_{i}", 0.0)], state="COMPLETED") for i in (0, 1)]
    state = SweepState(str(tmp_path), "slurm", str(tmp_path / ".submitit"), 0.0, tasks, array_ids=["1736"])
    state.job_name = "slurmagent"
    for i, peak in ((0, 3072.5), (1, None)):  # task 1 ran on a CPU (or an older runtime): no peak reported
        (tmp_path / str(i)).mkdir()
        body = {"step": 40, "total_steps": 40, "steps_per_s": 8.0} | ({"gpu_mem_peak_mb": peak} if peak else {})
        (tmp_path / str(i) / "progress.json").write_text(json.dumps(body))
    assert UsageTracker(RecordedSacct(runner=lambda argv, timeout: "")).poll(state, ended=0)
    store = HistoryStore(own_state_dir / "history.sqlite")
    ignore = SchedulingConf().ignore_in_fingerprint
    rows = {i: store.recent(fingerprint("slurmagent", [f"x={i}"], ignore))[0] for i in (0, 1)}
    assert rows[0].gpu_mem_peak_mb == 3072.5 and rows[0].steps_per_s == 8.0 and rows[0].elapsed_s == 5
    assert rows[0].gpu_type == "t4"
    assert rows[1].gpu_mem_peak_mb == 0.0 and state.schedule["ingested"] == [0, 1]


def test_the_runtime_reports_the_allocators_gpu_peak(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On CPU nothing is reported; with CUDA in use, the most any device's allocator held.
    No GPU here: torch.cuda's counters are stand-ins (a fake GPU); the gpu-marked test reads real ones."""
    import torch

    from slurmagent.config import CheckpointConf
    from slurmagent.runtime import StepLoop, context_from_env
    from slurmagent.runtime.loop import gpu_memory_peak_mb
    from slurmagent.runtime.torch_state import TorchState

    model = torch.nn.Linear(2, 1)
    loop = StepLoop(
        context_from_env({}, output_dir=tmp_path), TorchState(model, torch.optim.SGD(model.parameters(), lr=0.1)), 3,
        CheckpointConf(every_steps=0), install_signal_handlers=False,
    )  # fmt: skip
    for _ in loop:
        loop.report(loss=1.0)
    assert gpu_memory_peak_mb() is None and "gpu_mem_peak_mb" not in json.loads(
        (tmp_path / "progress.json").read_text()
    )
    reserved = {0: 1536 * 2**20, 1: 3072 * 2**20}  # the fake GPU: two devices' allocator peaks
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d: reserved[d])
    loop._progress(force=True)
    assert json.loads((tmp_path / "progress.json").read_text())["gpu_mem_peak_mb"] == 3072.0
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)  # CUDA never used by this job: not touched
    assert gpu_memory_peak_mb() is None


# -- budgets ------------------------------------------------------------------------------------
def test_budget_refuses_a_prediction_over_it_with_both_numbers() -> None:
    site = default_site()
    predicted = usage_of(4, 3600, "a100", site)  # 4 GPU-h
    with pytest.raises(
        BudgetExceeded, match=r"predicted use \(4.000 GPU-h, cost 14.68\).*4.000 GPU-h > budget.gpu_hours=3"
    ):
        check_prediction(BudgetConf(gpu_hours=3), predicted)
    with pytest.raises(BudgetExceeded, match=r"cost 14.68 > budget.cost=10"):
        check_prediction(BudgetConf(cost=10), predicted)
    with pytest.raises(BudgetExceeded, match=r"this month you used 97.000 GPU-h"):
        check_prediction(BudgetConf(user_month_gpu_hours=100), predicted, month_spent=97)
    check_prediction(BudgetConf(gpu_hours=5, cost=20, user_month_gpu_hours=100), predicted, month_spent=1)
    assert reached(BudgetConf(gpu_hours=1), Usage(1.0, 0)) and not reached(BudgetConf(gpu_hours=1), Usage(0.9, 0))
    assert not reached(BudgetConf(), Usage(100, 100))


@pytest.mark.gpu
def test_the_runtime_reads_a_real_cuda_allocators_peak() -> None:
    import torch

    from slurmagent.runtime.loop import gpu_memory_peak_mb

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here (a CPU torch build, or no GPU)")
    block = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    peak = gpu_memory_peak_mb()
    del block
    assert peak is not None and peak >= 256


# -- issue 25: auto on real workloads ----------------------------------------------------------
OOM_LOG = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 14.00 GiB (emulated GPU: none here)"


def test_an_any_type_job_out_of_gpu_memory_moves_to_a_type_with_more_memory_than_it_ran_on() -> None:
    """A job asking for any GPU type (no gpu_type: what `auto` asks for plain scripts) that ran
    out of GPU memory on a t4 is resubmitted on the a100, not given up; it also stops with the
    reason when its only bigger GPUs are excluded."""
    from slurmagent.recovery.diagnose import diagnose
    from slurmagent.recovery.plan import Resubmit, Stop, plan

    full = parse_cluster(RECORDED_NODES, SINFO_PARTS, {})  # t4-1, t4-2 and a100-1 usable
    diag = diagnose("FAILED", {"err": OOM_LOG})
    spec = job_spec({"task": {"target": "a:b"}, "resources": {"gpus": 1, "mem": "1G"}})
    step = plan(spec, 1, diag, "t4-2", full, site=default_site())
    assert isinstance(step, Resubmit), step
    assert step.changes == {"gpu_type": (None, "a100")} and step.resources.gpu_type == "a100"
    assert step.reason == "GPU OOM on t4 (any type asked; it ran on t4-2): resubmit on a100"
    excluded = dataclasses.replace(spec, resources=dataclasses.replace(spec.resources, exclude="a100-1"))
    stop = plan(excluded, 1, diag, "t4-2", full, site=default_site())
    assert isinstance(stop, Stop) and "no GPU type with more memory than t4 (16 GiB)" in stop.reason
    assert "outside resources.exclude=a100-1" in stop.reason


def test_the_history_keeps_a_gpu_oom_and_plan_then_leaves_out_the_types_too_small(
    tmp_path: Path, own_state_dir: Path
) -> None:
    """The task above completed on the a100 after its OOM on a t4; it recorded no GPU peak (a
    plain script). Its history row says it needs more than a t4's 16 GiB, and the next plan of
    the same work does not offer the t4 (was: "need unknown → every type here fits")."""
    from slurmagent.supervise.state import Attempt, SweepState, TaskRecord
    from slurmagent.supervise.usage import UsageTracker

    sacct = (
        "1800|slurmagent|low|00:00:09|00:10:00||1G|00:00.5|FAILED|t4-2|billing=1,cpu=1,gres/gpu=1,mem=1G,node=1|x|\n"
        "1801|slurmagent|low|00:00:40|00:10:00||1G|00:00.5|COMPLETED|a100-1|billing=1,cpu=1,gres/gpu=1,mem=1G,node=1|x|\n"
    )

    class RecordedSacct(SlurmCLI):
        def usage(self, job_ids):  # type: ignore[no-untyped-def]
            return parse_usage(sacct)

        def node_gpu_types(self):  # type: ignore[no-untyped-def]
            return {"t4-1": "t4", "t4-2": "t4", "a100-1": "a100"}

    task = TaskRecord(0, ["x=1"], [Attempt("1800", 0.0, nodes="t4-2"), Attempt("1801", 1.0, nodes="a100-1")])
    task.state, task.diagnosis = "COMPLETED", {"cause": "gpu_oom"}
    state = SweepState(str(tmp_path), "slurm", str(tmp_path), 0.0, [task], array_ids=["1800", "1801"])
    state.job_name = "slurmagent"
    assert UsageTracker(RecordedSacct(runner=lambda argv, timeout: "")).poll(state, ended=1)
    fp = fingerprint("slurmagent", ["x=1"], SchedulingConf().ignore_in_fingerprint)
    store = HistoryStore(own_state_dir / "history.sqlite")
    (hist,) = store.recent(fp)
    assert hist.gpu_oom_gib == 16 and hist.gpu_mem_peak_mb == 0 and hist.gpu_type == "a100"  # where it completed
    spec = job_spec({"resources": {"gpus": 1, "gpu_type": "auto", "time": "auto"}, "task": {"target": "m:f"}})
    slurm = RecordedSlurm(
        {"gpu:a100:1": ("2026-12-01T12:00:00", "a100-1"), "gpu:t4:1": ("2026-12-01T12:00:00", "t4-1")}
    )
    chosen = plan_spec(spec, fp, site=default_site(), history=store, cluster=CLUSTER, slurm=slurm)
    t4 = next(c for c in chosen.candidates if c.gpu_type == "t4")
    assert not t4.fits and t4.fit_note == "16 GiB < 16.00 GiB needed" and chosen.resources.gpu_type == "a100"
    assert "ran out of memory on a 16 GiB GPU" in chosen.prediction.gpu_basis


# what sacct says of a short job killed at 512M and 768M before it completed at 1152M: MaxRSS is a
# sample (JobAcctGatherFrequency, 30 s), and these runs lasted seconds — a few MB whatever they held
SHORT_OOM = """\
1900|short|low|00:00:04|00:10:00||512M|00:00.5|OUT_OF_MEMORY|cpu-1|billing=1,cpu=1,mem=512M,node=1|x|
1900.batch|batch||00:00:04||2900K||00:00.1|OUT_OF_MEMORY|cpu-1|cpu=1,mem=512M,node=1|x|
1901|short|low|00:00:05|00:10:00||768M|00:00.5|OUT_OF_MEMORY|cpu-1|billing=1,cpu=1,mem=768M,node=1|x|
1901.batch|batch||00:00:05||3100K||00:00.1|OUT_OF_MEMORY|cpu-1|cpu=1,mem=768M,node=1|x|
1902|short|low|00:00:06|00:10:00||1152M|00:00.5|COMPLETED|cpu-1|billing=1,cpu=1,mem=1152M,node=1|x|
1902.batch|batch||00:00:06||3000K||00:00.1|COMPLETED|cpu-1|cpu=1,mem=1152M,node=1|x|
"""


def test_memory_history_after_an_oom_ended_short_run_is_at_least_the_limit_it_died_at() -> None:
    site = default_site()
    runs = parse_usage(SHORT_OOM)
    died = row_from_usage("fp", "s#0", "short", "", runs[:1])  # a task that ended killed at 512M
    assert died is not None and died.state == "OUT_OF_MEMORY" and died.max_rss_mb < 5
    assert died.oom_mem_mb == 512 and died.mem_need_mb >= 512  # was: 2.8 MB
    assert predict([died], site).mem_mb == 1024  # it needed more than it had: twice its limit
    done = row_from_usage("fp", "s#1", "short", "", runs)  # killed at 512M and 768M, then completed at 1152M
    assert done is not None and done.state == "COMPLETED" and done.oom_mem_mb == 768 and done.mem_need_mb >= 768
    pred = predict([done], site)
    assert pred.mem_mb is not None and pred.mem_mb >= 1152  # what it completed under (was: 512M, the floor)
    assert "1152 MB it completed under after an OOM" in pred.mem_basis
    # later runs too short to be sampled (3 MB each) do not lower it
    short = [
        dataclasses.replace(row(5, "", rss=3.0, at=10 + i), fingerprint="fp", task_key=f"s#{i + 2}", req_mem_mb=1152)
        for i in range(8)
    ]
    assert predict([*reversed(short), dataclasses.replace(done, ended_at=1.0)], site).mem_mb == pred.mem_mb
    # a long run's MaxRSS is a real sample, and the runtime's own peak is exact: both count
    measured = dataclasses.replace(row(300, "", rss=3.0, at=50), host_mem_peak_mb=900.0)
    assert predict([measured], site).mem_mb == 1088  # 900 × 1.2 in 64 MB steps
    assert "the runtime's own peak" in predict([measured], site).mem_basis


def test_the_ingest_takes_the_runtimes_host_peak_over_a_sampled_maxrss(tmp_path: Path, own_state_dir: Path) -> None:
    from slurmagent.supervise.state import Attempt, SweepState, TaskRecord
    from slurmagent.supervise.usage import UsageTracker

    class RecordedSacct(SlurmCLI):
        def usage(self, job_ids):  # type: ignore[no-untyped-def]
            return [u for u in parse_usage(SHORT_OOM) if u.job_id == "1902"]

    task = TaskRecord(0, ["y=1"], [Attempt("1902", 0.0, nodes="cpu-1")], state="COMPLETED")
    state = SweepState(str(tmp_path), "slurm", str(tmp_path), 0.0, [task], array_ids=["1902"])
    state.job_name = "short"
    (tmp_path / "0").mkdir()
    progress = {"step": 5, "host_mem_peak_mb": 930.5, "checkpoint_s": 2.5, "steps_per_s": "bad"}
    (tmp_path / "0" / "progress.json").write_text(json.dumps(progress))
    assert UsageTracker(RecordedSacct(runner=lambda argv, timeout: "")).poll(state, ended=1)
    (hist,) = HistoryStore(own_state_dir / "history.sqlite").recent(
        fingerprint("short", ["y=1"], SchedulingConf().ignore_in_fingerprint)
    )
    assert hist.max_rss_mb < 5 and hist.host_mem_peak_mb == 930.5 and hist.mem_need_mb == 930.5
    assert hist.checkpoint_s == 2.5 and hist.steps_per_s == 0.0  # what is not a number is not reported
    assert predict([hist], default_site()).mem_mb == 1152  # 930.5 × 1.2, in 64 MB steps


def test_the_runtime_records_its_own_and_a_commands_host_memory_peak(tmp_path: Path) -> None:
    """ru_maxrss is the kernel's high-water mark: a child that held 150 MB for a moment and
    exited is seen whole (sacct's sample every 30 s would have missed it)."""
    import torch

    from slurmagent.config import CheckpointConf
    from slurmagent.job.task import run_command
    from slurmagent.runtime import StepLoop, context_from_env
    from slurmagent.runtime.torch_state import TorchState

    model = torch.nn.Linear(2, 1)
    state = TorchState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    loop = StepLoop(
        context_from_env({}, output_dir=tmp_path / "loop"), state, 3, CheckpointConf(every_steps=1),
        install_signal_handlers=False,
    )  # fmt: skip
    for _ in loop:
        loop.report(loss=1.0)
    body = json.loads((tmp_path / "loop" / "progress.json").read_text())
    assert body["host_mem_peak_mb"] > 10 and body["checkpoint_s"] > 0  # the interpreter and torch, at least
    ctx = context_from_env({}, output_dir=tmp_path / "cmd")
    hold = "import time; b = bytearray(150 * 2**20); b[::4096] = b'x' * len(b[::4096]); time.sleep(0.1)"
    run_command([sys.executable, "-c", hold], ctx)
    peak = json.loads((tmp_path / "cmd" / "progress.json").read_text())["host_mem_peak_mb"]
    assert peak >= 150, peak


@pytest.mark.parametrize("predicted_s", [10.0, 60.0, 600.0])
def test_an_auto_limit_covers_the_prediction_the_stop_warnings_lead_and_a_checkpoint(
    tmp_path: Path, predicted_s: float
) -> None:
    """A checkpointed job's --time: its prediction, + recovery.signal_delay_s, + the 60 s by
    which Slurm may send the warning early (sbatch(1)), + a checkpoint save (measured: 20 s);
    --time-min leaves it a minute of work before the warning, and is not asked when that is the
    whole --time (it said "backfill may start it in a shorter hole" of a 3-minute job's 3 minutes)."""
    from slurmagent.schedule.predict import SIGNAL_RESOLUTION_S

    store = HistoryStore(tmp_path / "h.sqlite")
    elapsed = predicted_s / 1.2  # the prediction is the mean × 1.2 inflation
    store.add([dataclasses.replace(row(elapsed, "a100", at=1), checkpoint_s=20.0)])
    for delay in (60, 90):
        spec = job_spec(
            {
                "resources": {"gpus": 1, "gpu_type": "a100", "time": "auto"},
                "checkpoint": {"every_steps": 50},
                "recovery": {"signal_delay_s": delay},
                "task": {"target": "m:f"},
            }
        )
        slurm = RecordedSlurm({"gpu:a100:1": ("2026-12-01T12:00:00", "a100-1")})
        plan = plan_spec(spec, "fp", site=default_site(), history=store, cluster=CLUSTER, slurm=slurm)
        limit = slurm_time_to_seconds(plan.resources.time)
        assert plan.chosen is not None and plan.chosen.predicted_s == pytest.approx(predicted_s)
        assert limit >= predicted_s + delay + SIGNAL_RESOLUTION_S + 20, (predicted_s, delay, plan.resources.time)
        assert limit - (predicted_s + delay + SIGNAL_RESOLUTION_S + 20) < 60  # whole minutes, no more
        floor = math.ceil((delay + SIGNAL_RESOLUTION_S + 20 + 60) / 60) * 60  # the lead and a minute of work
        if limit <= floor:
            assert plan.resources.time_min is None and "time-min" not in sbatch_flags(plan.resources), plan.resources
            assert "resources.time_min" not in {d["key"] for d in plan.decisions}
        else:
            assert floor <= slurm_time_to_seconds(str(plan.resources.time_min)) < limit, plan.resources
        why = next(d["why"] for d in plan.decisions if d["key"] == "resources.time")
        assert f"recovery.signal_delay_s={delay}" in why and "20s checkpoint (measured)" in why
    plain = job_spec({"resources": {"gpus": 1, "gpu_type": "a100", "time": "auto"}, "checkpoint": {"every_steps": 0},
                      "task": {"target": "m:f"}})  # fmt: skip
    slurm = RecordedSlurm({"gpu:a100:1": ("2026-12-01T12:00:00", "a100-1")})
    bare = plan_spec(plain, "fp", site=default_site(), history=store, cluster=CLUSTER, slurm=slurm)
    assert slurm_time_to_seconds(bare.resources.time) == max(60, -(-int(predicted_s) // 60) * 60)  # no checkpoint


def test_a_tie_in_start_and_finish_goes_to_the_any_type_request() -> None:
    """On an idle cluster Slurm answers the a100 probe and the any-type probe a second apart,
    both on a100-1: the same finish, give or take Slurm's clock. docs/scheduling.md: ties go to
    the any-type request (it may start sooner elsewhere later)."""
    import datetime as dt

    now = dt.datetime(2026, 12, 1, 12, 0, 0).timestamp()
    spec = job_spec({"resources": {"gpus": 1, "gpu_type": "auto", "time": "auto"}, "task": {"target": "m:f"}})
    slurm = RecordedSlurm(
        {
            "gpu:a100:1": ("2026-12-01T12:00:00", "a100-1"),
            "gpu:t4:1": ("2026-12-01T12:00:00", "t4-1"),
            "gpu:1": ("2026-12-01T12:00:01", "a100-1"),  # asked a second later
        }
    )
    plan = plan_spec(spec, "fp", site=default_site(), history=None, cluster=CLUSTER, slurm=slurm, now=now)
    assert plan.chosen is not None and plan.chosen.gpu_type == "any" and plan.resources.gpu_type is None
    why = next(d["why"] for d in plan.decisions if d["key"] == "resources.gpu_type")
    assert "finishes 1s apart: a tie (within 180s), which goes to the any-type request" in why, why  # 5 % of 1 h
    site = default_site()
    cands = candidates(ResourcesConf(gpus=1, gpu_type="auto"), 3.0, 600.0, 3600, site, CLUSTER)
    # the a100 alone finishes 120 s sooner than the any-type request landing on a t4: no tie
    waits = {("low", "a100"): (0.0, ""), ("low", "t4"): (0.0, ""), ("low", "any"): (0.0, "")}
    assert choose(with_waits(cands, waits, {"low": "t4"}, site))[0].gpu_type == "a100"
    far = {("low", "a100"): (0.0, ""), ("low", "t4"): (0.0, ""), ("low", "any"): (25.0, "")}
    assert choose(with_waits(cands, far, {"low": "a100"}, site))[0].gpu_type == "any"  # 25 s on 600: within 5 %
    farther = {**far, ("low", "any"): (40.0, "")}
    assert choose(with_waits(cands, farther, {"low": "a100"}, site))[0].gpu_type == "a100"  # 40 s: not a tie


# the queue a moment into the burst of bench/schedule_trace.py --seed 4 (squeue -o PENDING_FORMAT):
# a 2-GPU job typed a100 and two 1-GPU ones, all waiting for a100-1
QUEUED_FOR_A100 = """\
gpu|PENDING|Resources|gres:gpu:a100:2|1|4:00
gpu|PENDING|Priority|gres:gpu:a100:1|1|4:00
gpu|PENDING|Priority|gres:gpu:a100:1|1|7:00
gpu|PENDING|Dependency|gres:gpu:t4:2|1|1:00:00
"""


def test_jobs_already_queued_for_a_type_push_its_start_back_so_a_burst_does_not_pile_onto_it(
    tmp_path: Path,
) -> None:
    """`sbatch --test-only` answers from the running jobs alone. In the held-out burst (seed 4)
    three 2-GPU jobs each saw the a100s free first and asked for them: they ran one after
    another on a100-1 while both t4 nodes stood idle (makespan 572 s against 436 s as their
    users had asked). The jobs already waiting for a type now count: their GPU-seconds over its
    GPUs (here (480 + 240 + 420) / 2 = 570 s; the held job does not count)."""
    import datetime as dt

    now = dt.datetime(2026, 12, 1, 12, 0, 0).timestamp()
    cluster = parse_cluster(RECORDED_NODES, SINFO_PARTS, {})  # both t4 nodes up
    site = default_site()
    spec = job_spec({"resources": {"gpus": 2, "gpu_type": "auto", "partition": "gpu"}, "task": {"target": "m:f"}})
    store = HistoryStore(tmp_path / "h.sqlite")
    store.add([dataclasses.replace(row(87, "a100", at=1), gpus=2)])
    starts = {
        "gpu:a100:2": ("2026-12-01T12:02:50", "a100-1"),  # when its two running jobs' limits end
        "gpu:t4:2": ("2026-12-01T12:02:00", "t4-1"),
        "gpu:2": ("2026-12-01T12:02:00", "t4-1"),
    }
    alone = plan_spec(spec, "fp", site=site, history=store, cluster=cluster, slurm=RecordedSlurm(starts), now=now)
    assert alone.chosen is not None and alone.chosen.gpu_type == "a100"  # 170 + 87 s against 120 + 580 s on a t4
    queued = RecordedSlurm(starts, QUEUED_FOR_A100)
    plan = plan_spec(spec, "fp", site=site, history=store, cluster=cluster, slurm=queued, now=now)
    assert plan.chosen is not None and plan.chosen.gpu_type == "any", plan.decisions
    a100 = next(c for c in plan.candidates if c.gpu_type == "a100")
    assert (
        a100.wait_s == pytest.approx(170 + 570)
        and "570s for the 3 job(s) queued ahead for its a100 GPUs" in a100.start_note
    )
    t4 = next(c for c in plan.candidates if c.gpu_type == "t4")
    assert t4.wait_s == pytest.approx(120), t4.start_note  # none waits for a t4 (the held job does not count)
    # a type Slurm would start the job on now keeps its answer: the queue is waiting for more than is free
    free_now = {**starts, "gpu:a100:2": ("2026-12-01T12:00:05", "a100-1")}
    now_plan = plan_spec(spec, "fp", site=site, history=store, cluster=cluster,
                         slurm=RecordedSlurm(free_now, QUEUED_FOR_A100), now=now)  # fmt: skip
    assert now_plan.chosen is not None and now_plan.chosen.gpu_type == "a100" and now_plan.chosen.wait_s == 5


def test_finishes_are_compared_on_expected_run_times_not_on_the_inflated_ones() -> None:
    """The inflation (1.2) sizes --time and the budget; a finish is the start plus the run time
    to expect. Inflated, a t4's run (6.7× an a100's here) is pushed back by 1.13× the a100's
    run more than the a100's is: for a job of 600 A100-seconds that waits 3700 s for an a100
    or starts at once on a t4, the t4 finishes first (4000 s against 4300 s), while the inflated
    figures (4800 against 4420) would send it to wait for the a100."""
    site = default_site()
    cands = candidates(ResourcesConf(gpus=1, gpu_type="auto"), 3.0, 600.0, 3600, site, CLUSTER, inflation=1.2)
    waits = {("low", "a100"): (3700.0, ""), ("low", "t4"): (0.0, ""), ("low", "any"): (0.0, "")}
    placed = {c.gpu_type: c for c in with_waits(cands, waits, {"low": "t4"}, site)}
    assert placed["any"].finish_s == pytest.approx(4000) and placed["a100"].finish_s == pytest.approx(4300)
    assert placed["any"].predicted_s == pytest.approx(4800)  # the budget still counts the inflated run
    best, why = choose(list(placed.values()))
    assert best.gpu_type == "any", why
    assert "starts in 0s on t4, runs 4000s" in why, why


def test_every_gpu_hour_and_cost_comes_from_one_function_on_one_basis() -> None:
    """`budget.usage_of` is the only code that prices GPU time; `plan`'s rows, its summary and
    the launcher's budget check (Plan.usage) are the same figures on the predicted run time of
    the type a job would run on (an any-type request: where Slurm would start it, not the
    a100's price)."""
    import ast

    from slurmagent.schedule.budget import BASIS

    root = Path(__file__).resolve().parents[2] / "slurmagent"
    pricing = []
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef):
                uses = [n for n in ast.walk(fn) if isinstance(n, ast.Attribute) and n.attr == "price_per_hour"]
                if uses and path.relative_to(root).as_posix() != "config/site.py":  # it validates the catalogue
                    pricing.append(f"{path.relative_to(root)}:{fn.name}")
    assert pricing == ["schedule/budget.py:usage_of"]
    assert "predicted run time" in BASIS
    site = default_site()
    store_rows = [dataclasses.replace(row(100, "a100", at=1), fingerprint="fp")]

    class History:
        def recent(self, fp: str, limit: int = 20) -> list[HistoryRow]:
            return store_rows

    spec = job_spec({"resources": {"gpus": 2, "gpu_type": "auto", "time": "auto"}, "task": {"target": "m:f"}})
    slurm = RecordedSlurm(
        {
            "gpu:a100:2": ("2026-12-01T13:00:00", "a100-1"),
            "gpu:t4:2": ("2026-12-01T12:00:00", "t4-1"),
            "gpu:2": ("2026-12-01T12:00:00", "t4-1"),
        }
    )
    import datetime as dt

    now = dt.datetime(2026, 12, 1, 12, 0, 0).timestamp()
    plan = plan_spec(spec, "fp", site=site, history=History(), cluster=CLUSTER, slurm=slurm, now=now)  # type: ignore[arg-type]
    for c in plan.candidates:
        use = usage_of(c.gpus, c.predicted_s, c.priced_as, site)
        assert (c.gpu_hours, c.cost) == (use.gpu_hours, use.cost), c
    chosen = plan.chosen
    assert chosen is not None and chosen.gpu_type == "any" and chosen.priced_as == "t4"  # where Slurm starts it
    t4_s = 100 / site.gpu("t4").throughput * 1.2  # type: ignore[union-attr]
    assert chosen.predicted_s == pytest.approx(t4_s) and chosen.cost == pytest.approx(2 * t4_s / 3600 * 0.35)
    assert plan.usage(site) == Usage(chosen.gpu_hours, chosen.cost)  # the summary and the budget: the row's figures


def test_status_spend_prices_an_any_type_job_at_the_type_it_ran_on(tmp_path: Path) -> None:
    """An `auto` sweep that ran on a100-1 with an untyped request spent a100 time (was: cost 0.00)."""
    from slurmagent.supervise.state import Attempt, SweepState, TaskRecord
    from slurmagent.supervise.usage import UsageTracker

    sacct = "2000|x|low|00:30:00|01:00:00||1G|00:00.5|RUNNING|a100-1|billing=1,cpu=1,gres/gpu=1,mem=1G,node=1|x|\n"

    class RecordedSacct(SlurmCLI):
        def usage(self, job_ids):  # type: ignore[no-untyped-def]
            return parse_usage(sacct)

        def node_gpu_types(self):  # type: ignore[no-untyped-def]
            return {"a100-1": "a100", "t4-1": "t4"}

    task = TaskRecord(0, ["x=1"], [Attempt("2000", 0.0)], state="RUNNING", spec_id="s")
    state = SweepState(str(tmp_path), "slurm", str(tmp_path), 0.0, [task], array_ids=["2000"])
    state.specs = {"s": {"resources": {"gpus": 1, "gpu_type": None}}}
    state.schedule = {"budget": {"gpu_hours": 100.0}}
    assert UsageTracker(RecordedSacct(runner=lambda argv, timeout: "")).poll(state, ended=0)
    assert state.schedule["spent"] == dataclasses.asdict(usage_of(1, 1800, "a100", default_site()))
    assert state.schedule["spent"]["cost"] == pytest.approx(0.5 * 3.67)
    from slurmagent.supervise.views import schedule_note

    shown = schedule_note(state)  # status: the same figures, in the one format, its basis named
    assert "spent 0.500 GPU-h, cost 1.83 (GPUs × elapsed (sacct) × the price/h of the type each run ran on)" in shown


def test_an_untyped_gpu_request_with_an_auto_limit_is_planned_as_the_any_type_request() -> None:
    """`resources.gpus=1 resources.time=auto` without a type (was: StopIteration)."""
    spec = job_spec({"resources": {"gpus": 1, "time": "auto"}, "task": {"target": "m:f"}})
    slurm = RecordedSlurm({"gpu:1": ("2026-12-01T12:00:00", "t4-1")})
    plan = plan_spec(spec, "fp", site=default_site(), history=None, cluster=CLUSTER, slurm=slurm)
    assert plan.chosen is not None and plan.chosen.gpu_type == "any" and plan.resources.gpu_type is None
    assert plan.resources.time == "01:00:00" and [f["gres"] for f in slurm.asked] == ["gpu:1"]


def test_plans_table_keeps_the_time_reason_to_time_and_says_when_the_need_is_not_known(tmp_path: Path) -> None:
    spec = job_spec({"resources": {"gpus": 1, "gpu_type": "auto", "time": "auto"}, "task": {"target": "m:f"}})
    store = HistoryStore(tmp_path / "h.sqlite")
    store.add([dataclasses.replace(row(120, "a100", at=1), fingerprint="fp", gpu_mem_peak_mb=2048.0)])
    slurm = RecordedSlurm(
        {"gpu:a100:1": ("2026-12-01T12:00:00", "a100-1"), "gpu:t4:1": ("2026-12-01T12:00:00", "t4-1"),
         "gpu:1": ("2026-12-01T12:00:00", "a100-1")}
    )  # fmt: skip
    plan = plan_spec(spec, "fp", site=default_site(), history=store, cluster=CLUSTER, slurm=slurm)
    why = {d["key"]: d["why"] for d in plan.decisions}
    assert "GPU memory" not in why["resources.time"] and "peak" not in why["resources.time"]
    assert "peak 2.00 GiB measured" in plan.prediction.gpu_basis
    unknown = plan_spec(spec, "other", site=default_site(), history=store, cluster=CLUSTER, slurm=slurm)
    notes = {c.gpu_type: c.fit_note for c in unknown.candidates}
    assert notes == {
        "a100": "80 GiB, need not known",
        "t4": "16 GiB, need not known",
        "any": "16–80 GiB, need not known",
    }
