"""Resource scheduling's pure parts on recorded inputs: the catalogue, fingerprints, the
history store fed with real sacct output of the test cluster, the predictor, placement on
recorded cluster states, budgets, per-partition caps. (The cluster tests are in
tests/slurm/test_schedule_slurm.py.)"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
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
from slurmagent.slurm.seam import SlurmCLI, parse_test_only, parse_usage

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
    assert "GPU memory: peak 20.00 GiB measured, × 1.2 = 24.00 GiB" in pred.basis
    assert predict([row(60)], site).gpu_mem_gib is None  # none measured: the config's estimate stands


# -- placement ----------------------------------------------------------------------------------
def test_placement_picks_the_smallest_gpu_that_fits_and_avoids_drained_nodes() -> None:
    site = default_site()
    res = ResourcesConf(gpus=1, gpu_type="auto", time="auto", mem="auto")
    cands = candidates(res, 3.0, 600.0, 3600, site, CLUSTER)
    assert {(c.partition, c.gpu_type) for c in cands} == {("low", "a100"), ("low", "t4"), ("low", "any")}
    t4 = next(c for c in cands if c.gpu_type == "t4")
    assert t4.nodes == ("t4-1",)  # t4-2 is drained
    assert t4.run_s == 4020 and t4.cost == pytest.approx(4020 / 3600 * 0.35)  # 4000 s in whole minutes
    both_free = with_waits(cands, {("low", "a100"): (0.0, ""), ("low", "t4"): (0.0, "")})
    chosen, why = choose(both_free)
    assert chosen.gpu_type == "a100" and "earliest predicted finish" in why  # a t4 runs 6.7× longer
    a100_busy = with_waits(cands, {("low", "a100"): (7200.0, ""), ("low", "t4"): (0.0, "")})
    assert choose(a100_busy)[0].gpu_type == "t4"  # waiting two hours for the a100 finishes later
    # one request for either type: Slurm would start it now on a t4; as soon as the t4 alone, and more flexible
    waits = {("low", "a100"): (7200.0, ""), ("low", "t4"): (0.0, ""), ("low", "any"): (0.0, "")}
    either, why = choose(with_waits(cands, waits, {"low": "t4"}))
    assert either.gpu_type == "any" and either.run_s == 4020 and either.expected_run_s == 4020
    assert "Slurm starts it on whichever of a100/t4 frees first; --time covers the slowest (4020s)" in why
    assert choose(with_waits(cands, {**waits, ("low", "a100"): (0.0, "")}, {"low": "t4"}))[0].gpu_type == "a100"
    no_history = candidates(res, 3.0, None, 1800, site, CLUSTER)
    assert choose(with_waits(no_history, {("low", "a100"): (0.0, ""), ("low", "t4"): (0.0, "")}))[0].gpu_type == "t4"


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
    """Answers `sbatch --test-only` from a table (a recorded cluster state); nothing else."""

    def __init__(self, starts: dict[str, tuple[str, str]]) -> None:
        super().__init__(runner=lambda argv, timeout: (_ for _ in ()).throw(AssertionError(argv)))
        self.starts, self.asked = starts, []  # gres → Slurm's start time
        self.asked: list[dict[str, str]] = []

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
    # the a100 would start in 30 min and run 3 min; a t4 starts now and runs 120 × 1.2 / 0.15 s = 16 min: a
    # request for either type finishes as early, and may start sooner on an a100 freed later
    assert res.gpu_type is None and res.partition == "low" and res.time == "00:16:00" and res.mem == "896M"
    assert sbatch_flags(res)["gres"] == "gpu:1" and res.time_min == "00:04:00" and res.cpus_per_task == 2
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
    assert "peak 20.00 GiB measured" in plan.prediction.basis


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
