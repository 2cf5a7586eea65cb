"""gpu_health_check and xid_scan on recorded readings (tests/data/gpu_health): the rules are
pure functions of a readings record and the thresholds. This machine has no NVIDIA GPU:
NVML gives UNKNOWN with its own error; the `gpu`-marked tests read a real GPU and skip here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurmagent.errors import ConfigError
from slurmagent.skills import Status
from slurmagent.skills.gpu_health import (
    GpuHealthCheck,
    GpuReadings,
    XidScan,
    classify_xids,
    evaluate,
    gpus_from_env,
    load_readings,
    load_thresholds,
    parse_xids,
    read_kmsg,
    read_nvml,
)
from slurmagent.skills.hook import REASON_PREFIX, HookConfig, drain_reason, hook_main
from slurmagent.slurm.seam import SlurmCLI
from tests.fake.fake_slurm import FakeSlurm

DATA = Path(__file__).resolve().parents[1] / "data" / "gpu_health"


def codes(findings: list, status: Status | None = None) -> set[tuple[int | None, str]]:  # type: ignore[type-arg]
    return {(f.gpu, f.code) for f in findings if status is None or f.status == status}


def test_healthy_idle_node_is_ok_benign_clock_and_pcie_gen_ignored() -> None:
    readings = load_readings(DATA / "healthy.json")
    assert [g.name for g in readings][:1] == ["NVIDIA A100-SXM4-80GB"]
    assert evaluate(readings, load_thresholds(), expect_idle=True) == []
    res = GpuHealthCheck().run(readings_file=DATA / "healthy.json", expect_idle=True)
    assert res.status == Status.OK and res.reasons == [] and len(res.findings["gpus"]) == 3


def test_broken_node_findings_per_gpu() -> None:
    found = evaluate(load_readings(DATA / "broken.json"), load_thresholds(), expect_idle=True)
    assert codes(found, Status.CRITICAL) == {
        (0, "ecc_uncorrected"),
        (0, "remapped_rows_failure"),
        (0, "clocks_hw_slowdown"),
        (0, "clocks_hw_thermal_slowdown"),
        (1, "temperature"),
        (1, "nvlink_inactive"),
        (2, "retired_pages_pending"),
        (2, "leftover_processes"),
    }
    assert codes(found, Status.WARNING) == {
        (1, "clocks_sw_thermal_slowdown"),
        (1, "nvlink_errors"),
        (2, "leftover_memory"),
        (2, "pcie_width"),
    }


def test_leftover_processes_only_count_when_the_gpu_should_be_idle() -> None:
    broken = load_readings(DATA / "broken.json")
    assert (2, "leftover_processes") not in codes(evaluate(broken, load_thresholds(), expect_idle=False))


def test_warning_node_and_gpu_selection() -> None:
    res = GpuHealthCheck().run(readings_file=DATA / "warning.json")
    assert res.status == Status.WARNING
    assert {r.split(": ", 1)[1] for r in res.reasons} == {
        "83C within 5C of slowdown",
        "fan at 97%",
        "PCIe link x8 below its x16",
    }
    # only the job's GPUs are judged: GPU 2 of the broken node alone
    only2 = GpuHealthCheck().run(readings_file=DATA / "broken.json", gpus=[2], set=["leftover_processes=ok"])
    assert only2.status == Status.CRITICAL and all(r.startswith("GPU 2:") for r in only2.reasons)


def test_pre_ampere_page_retirement_vs_ampere_row_remapping() -> None:
    th = load_thresholds()
    volta = GpuReadings(index=0, architecture=5, retired_pages_pending=True)
    ampere = GpuReadings(index=0, architecture=7, retired_pages_pending=True, remapped_rows_pending=True)
    assert codes(evaluate([volta], th)) == {(0, "retired_pages_pending")}
    assert codes(evaluate([ampere], th)) == {(0, "remapped_rows_pending")}


def test_thresholds_are_config_overrides_change_the_verdict() -> None:
    hot = GpuHealthCheck().run(readings_file=DATA / "healthy.json", set=["site_max_temp_c=30"])
    assert hot.status == Status.WARNING and "above the site limit 30C" in hot.reasons[0]
    pcie = GpuHealthCheck().run(readings_file=DATA / "healthy.json", set=["pcie_gen_below_max=warning"])
    assert pcie.status == Status.WARNING and "PCIe gen 1 below its gen 4" in pcie.reasons[0]


def test_bad_thresholds_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"unknown key gpu_health\.site_max_temp; valid keys"):
        load_thresholds(overrides=["site_max_temp=80"])
    with pytest.raises(ConfigError, match=r"gpu_health.nvlink_inactive='loud' is not one of critical, ignore, ok"):
        load_thresholds(overrides=["nvlink_inactive=loud"])
    res = GpuHealthCheck().run(readings_file=DATA / "healthy.json", set=["fan_warn_percent=hot"])
    assert res.status == Status.UNKNOWN and "gpu_health.fan_warn_percent='hot' has the wrong type" in res.reasons[0]


def test_no_nvml_here_is_unknown_with_the_reason() -> None:
    try:
        read_nvml()
    except RuntimeError:
        pass
    else:
        pytest.skip("this machine has NVML: the gpu-marked tests cover it")
    res = GpuHealthCheck().run()
    assert res.status == Status.UNKNOWN and res.reasons[0].startswith("no GPU readings: NVML")
    assert "gpus" not in res.findings  # no invented numbers


def test_xids_classified_critical_application_and_unclassified() -> None:
    th = load_thresholds()
    events = parse_xids((DATA / "dmesg_xid.txt").read_text())
    assert [(e.xid, e.pci, e.line) for e in events] == [
        (13, "0000:07:00", 4),
        (43, "0000:07:00", 5),
        (63, "0000:17:00", 6),
        (79, "0000:17:00", 7),
    ]
    found = classify_xids(events, th)
    assert [f.status for f in found] == [Status.OK, Status.OK, Status.WARNING, Status.CRITICAL]
    assert "fallen off the bus" in found[-1].message
    # only the job's GPUs: NVML's bus id format 00000000:07:00.0 matches the kernel's 0000:07:00
    assert [f.code for f in classify_xids(events, th, ["00000000:07:00.0"])] == ["xid_13", "xid_43"]
    app = XidScan().run(log_file=DATA / "dmesg_app_only.txt")
    assert app.status == Status.OK and len(app.findings["events"]) == 2
    assert XidScan().run(log_file=DATA / "dmesg_xid.txt").status == Status.CRITICAL


def test_health_check_scans_xids_of_its_gpus() -> None:
    res = GpuHealthCheck().run(readings_file=DATA / "healthy.json", gpus=[1], kernel_log=DATA / "dmesg_xid.txt")
    assert res.status == Status.CRITICAL and res.reasons[-1].startswith("critical Xid 79 on PCI 0000:17:00")
    res0 = GpuHealthCheck().run(readings_file=DATA / "healthy.json", gpus=[0], kernel_log=DATA / "dmesg_xid.txt")
    assert res0.status == Status.OK  # GPU 0 only saw application Xids


def test_kmsg_reader_on_the_real_kernel_log() -> None:
    try:
        text, last = read_kmsg()
    except OSError as exc:
        pytest.skip(f"/dev/kmsg unreadable here: {exc}")
    assert last >= 0 and text
    again, last2 = read_kmsg(last)
    assert last2 >= last and len(again) < len(text)


def test_gpus_from_env() -> None:
    assert gpus_from_env({"SLURM_JOB_GPUS": "0,2"}) == [0, 2]
    assert gpus_from_env({"CUDA_VISIBLE_DEVICES": "1"}) == [1]
    assert gpus_from_env({"CUDA_VISIBLE_DEVICES": "GPU-5c1f"}) is None
    assert gpus_from_env({}) is None


def _conf(tmp_path: Path, readings: Path) -> HookConfig:
    return HookConfig(state_dir=str(tmp_path), readings={"t4-1": str(readings)}, scan_kernel_log=False)


def node(fake: FakeSlurm, name: str) -> dict[str, str]:
    return dict(json.loads((fake.root / "state.json").read_text())["nodes"][name])


def test_hook_prolog_drains_on_critical_and_fails(tmp_path: Path) -> None:
    """Against the fake Slurm (the real drain and requeue: tests/slurm/test_prolog_slurm.py)."""
    fake = FakeSlurm(tmp_path / "fake")
    env = {"SLURMD_NODENAME": "t4-1", "SLURM_JOB_ID": "77", "SLURM_JOB_GPUS": "0"}
    assert hook_main("prolog", _conf(tmp_path, DATA / "broken.json"), env, SlurmCLI(fake)) == 1
    ((cmd, update, name, state, reason),) = fake.calls
    assert (cmd, update, name, state) == ("scontrol", "update", "NodeName=t4-1", "State=DRAIN")
    assert reason.startswith(f"Reason={REASON_PREFIX} GPU 0: 3 volatile uncorrected ECC")
    assert node(fake, "t4-1")["state"] == "drained" and node(fake, "t4-1")["reason"].startswith(REASON_PREFIX)
    saved = json.loads((tmp_path / "t4-1" / "prolog-77.json").read_text())
    assert saved["status"] == "CRITICAL" and saved["findings"]["gpus"] == [0]


def test_healthcheck_clears_only_our_own_drain_reason(tmp_path: Path) -> None:
    fake = FakeSlurm(tmp_path / "fake")
    slurm = SlurmCLI(fake)
    conf = _conf(tmp_path, DATA / "healthy.json")
    slurm.drain("t4-1", "slurmagent: GPU 0: 3 volatile uncorrected ECC error(s)")
    assert hook_main("healthcheck", conf, {"SLURMD_NODENAME": "t4-1"}, slurm) == 0
    assert fake.calls[-1] == ["scontrol", "update", "NodeName=t4-1", "State=RESUME"]
    assert node(fake, "t4-1")["state"] == "idle"
    slurm.drain("t4-1", "disk replacement, ticket 4711")
    fake.calls.clear()
    assert hook_main("healthcheck", conf, {"SLURMD_NODENAME": "t4-1"}, slurm) == 0
    assert [c[0] for c in fake.calls] == ["sinfo"]  # looked, did not touch it
    assert (node(fake, "t4-1")["state"], node(fake, "t4-1")["reason"]) == ("drained", "disk replacement, ticket 4711")


def test_drain_reason_is_bounded_and_quote_free() -> None:
    from slurmagent.skills import SkillResult

    r = drain_reason(SkillResult("x", Status.CRITICAL, ["a 'quoted' \"thing\"\n" + "y" * 500]))
    assert r.startswith("slurmagent: a  quoted   thing ") and len(r) == 200 and "'" not in r


@pytest.mark.gpu
def test_real_nvml_reads_every_gpu() -> None:
    try:
        readings = read_nvml()
    except RuntimeError as exc:
        pytest.skip(f"no NVIDIA GPU here: {exc}")
    assert readings and all(g.temperature_c is not None and g.memory_total_mib for g in readings)
    res = GpuHealthCheck().run()
    assert res.status != Status.UNKNOWN or all(f["code"].startswith("read_") for f in res.findings["findings"])
    assert res.findings["source"] == "NVML" and len(res.findings["gpus"]) == len(readings)


HOOK = Path(__file__).resolve().parents[2] / "sbatch_templates" / "hooks" / "slurmagent-hook"


def _install_hook(tmp_path: Path, conf: dict) -> Path:  # type: ignore[type-arg]
    import shutil

    hooks = tmp_path / "hooks"
    hooks.mkdir(parents=True)
    for d in (tmp_path, hooks):
        d.chmod(0o755)
    shutil.copy2(HOOK, hooks / "slurmagent-hook")
    (hooks / "slurmagent-prolog").symlink_to("slurmagent-hook")
    (hooks / "hooks.json").write_text(json.dumps(conf))
    (hooks / "hooks.json").chmod(0o644)
    return hooks


def test_hook_script_refuses_a_config_others_can_write(tmp_path: Path) -> None:
    """The stdlib hook as slurmd runs it: a group/world-writable hooks.json is not trusted
    (exit 0, nothing run), so no user can point root at their own interpreter; a trusted one
    runs the check in its interpreter with only Slurm's variables, and records the result."""
    import subprocess
    import sys

    hooks = _install_hook(tmp_path, {"python": "/bin/false-bad-interpreter", "timeout_s": 5})
    (hooks / "hooks.json").chmod(0o666)
    proc = subprocess.run([str(hooks / "slurmagent-prolog")], capture_output=True, text=True, timeout=60, env={})
    assert proc.returncode == 0 and "must be root-owned and not group/world-writable" in proc.stderr
    # recorded readings of a healthy GPU stand in for NVML; PYTHONPATH is not passed on (-I)
    state = tmp_path / "state"
    hooks2 = _install_hook(
        tmp_path / "b",
        {
            "python": sys.executable,
            "timeout_s": 60,
            "state_dir": str(state),
            "readings": {"n1": str(DATA / "healthy.json")},
            "scan_kernel_log": False,
        },
    )
    env = {"SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "9", "SLURM_JOB_GPUS": "1", "PYTHONPATH": "/nonexistent"}
    ok = subprocess.run([str(hooks2 / "slurmagent-prolog")], capture_output=True, text=True, timeout=120, env=env)
    assert ok.returncode == 0, ok.stderr
    record = json.loads((state / "n1" / "prolog-9.json").read_text())
    assert record["status"] == "OK" and record["findings"]["gpus"] == [1] and record["action"] == "none"
