"""gpu_health_check and xid_scan.

Readings come from NVML (nvidia-ml-py's `pynvml`) into a `GpuReadings` record per GPU;
the rules are pure functions over that record and the `GpuThresholds` (Hydra/OmegaConf
YAML, conf/skills/gpu_health.yaml), so they are tested on recorded readings of healthy and
broken GPUs. Without NVML (a CPU machine) the result is UNKNOWN with NVML's own error: no
invented numbers. Xids are scanned from kernel log text (dmesg, /dev/kmsg records) and
classified as critical (hardware/driver) or application (the job's code faulted).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from functools import partial
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from slurmagent.config import parse_conf
from slurmagent.errors import ConfigError, choices
from slurmagent.skills._base import SkillResult, Status, TypedSkill, worst

SEVERITIES = {"ok": Status.OK, "warning": Status.WARNING, "critical": Status.CRITICAL}

# NVML clock event reason bits (nvmlClocksEventReason*)
CLOCK_REASON_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
AMPERE_ARCH = 7  # NVML_DEVICE_ARCH_AMPERE: row remapping replaces page retirement from here on


@dataclass(frozen=True)
class GpuThresholds:
    """Site thresholds; see conf/skills/gpu_health.yaml for what each one means."""

    site_max_temp_c: float = 85.0
    temp_margin_c: float = 5.0
    idle_memory_used_mib: float = 1024.0
    leftover_processes: str = "critical"
    power_over_limit_pct: float = 5.0
    fan_warn_percent: float = 95.0
    ecc_uncorrected_critical: int = 1
    pcie_gen_below_max: str = "ignore"
    pcie_width_below_max: str = "warning"
    nvlink_inactive: str = "critical"
    nvlink_errors_warn: int = 100
    clock_event_reasons: dict[str, str] = field(default_factory=dict)
    xid_critical: list[int] = field(default_factory=list)
    xid_application: list[int] = field(default_factory=list)


def _severity(value: str, key: str) -> Status:
    if value == "ignore":
        return Status.OK
    if value not in SEVERITIES:
        raise ConfigError(f"gpu_health.{key}={value!r} is not one of {choices([*SEVERITIES, 'ignore'])}")
    return SEVERITIES[value]


def load_thresholds(path: Path | None = None, overrides: Iterable[str] = ()) -> GpuThresholds:
    """Thresholds from the packaged YAML (or `path`), with `key=value` overrides (Hydra
    dotlist syntax). Unknown keys, wrong types and bad severities are a ConfigError."""
    from omegaconf import OmegaConf

    if path is None:
        text = resources.files("slurmagent.conf").joinpath("skills/gpu_health.yaml").read_text()
    else:
        text = Path(path).read_text()
    cfg = OmegaConf.merge(OmegaConf.create(text), OmegaConf.from_dotlist(list(overrides)))
    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    th = parse_conf(GpuThresholds, {str(k): v for k, v in data.items()}, "gpu_health")
    for key in ("leftover_processes", "pcie_gen_below_max", "pcie_width_below_max", "nvlink_inactive"):
        _severity(getattr(th, key), key)
    for name, sev in th.clock_event_reasons.items():
        if name not in CLOCK_REASON_BITS:
            raise ConfigError(f"gpu_health.clock_event_reasons.{name} is unknown; valid: {choices(CLOCK_REASON_BITS)}")
        _severity(sev, f"clock_event_reasons.{name}")
    return th


# -- readings ---------------------------------------------------------------------------
@dataclass(frozen=True)
class NvLinkReading:
    link: int
    active: bool
    errors: dict[str, int] = field(default_factory=dict)  # replay, recovery, crc_flit, crc_data


@dataclass(frozen=True)
class GpuReadings:
    """One GPU as NVML reported it. None = not supported on this GPU (e.g. no fan)."""

    index: int
    name: str = ""
    uuid: str = ""
    pci_bus_id: str = ""
    architecture: int | None = None  # NVML_DEVICE_ARCH_* (7 = Ampere)
    temperature_c: float | None = None
    temp_slowdown_c: float | None = None
    temp_shutdown_c: float | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    process_pids: list[int] = field(default_factory=list)
    power_w: float | None = None
    power_limit_w: float | None = None
    fan_percent: float | None = None
    ecc_volatile_uncorrected: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    clock_event_reasons: int | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    nvlinks: list[NvLinkReading] = field(default_factory=list)
    read_errors: dict[str, str] = field(default_factory=dict)  # reading → NVML error text

    @staticmethod
    def from_json(d: dict[str, Any]) -> GpuReadings:
        d = dict(d)
        d["nvlinks"] = [NvLinkReading(**n) for n in d.get("nvlinks", [])]
        known = {f.name for f in dataclasses.fields(GpuReadings)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"GPU readings have unknown key {unknown[0]!r}; valid: {choices(known)}")
        return GpuReadings(**d)


def load_readings(path: Path) -> list[GpuReadings]:
    """Recorded readings: a JSON list of GpuReadings (or {"gpus": [...]})."""
    raw = json.loads(Path(path).read_text())
    items = raw["gpus"] if isinstance(raw, dict) else raw
    return [GpuReadings.from_json(g) for g in items]


@dataclass(frozen=True)
class Finding:
    gpu: int | None
    status: Status
    code: str  # short stable identifier: temperature, ecc_uncorrected, xid_79…
    message: str


# -- rules: pure functions of (readings, thresholds) → findings -------------------------------
Rule = Callable[[GpuReadings, GpuThresholds, bool], list[Finding]]


def rule_temperature(g: GpuReadings, th: GpuThresholds, idle: bool) -> list[Finding]:
    del idle
    t = g.temperature_c
    if t is None:
        return []
    if g.temp_shutdown_c is not None and t >= g.temp_shutdown_c:
        return [Finding(g.index, Status.CRITICAL, "temperature", f"{t:.0f}C at its shutdown threshold")]
    if g.temp_slowdown_c is not None and t >= g.temp_slowdown_c:
        return [
            Finding(g.index, Status.CRITICAL, "temperature", f"{t:.0f}C at/above its slowdown {g.temp_slowdown_c:.0f}C")
        ]
    if t >= th.site_max_temp_c:
        return [
            Finding(g.index, Status.WARNING, "temperature", f"{t:.0f}C above the site limit {th.site_max_temp_c:.0f}C")
        ]
    if g.temp_slowdown_c is not None and t >= g.temp_slowdown_c - th.temp_margin_c:
        return [Finding(g.index, Status.WARNING, "temperature", f"{t:.0f}C within {th.temp_margin_c:.0f}C of slowdown")]
    return []


def rule_memory(g: GpuReadings, th: GpuThresholds, idle: bool) -> list[Finding]:
    if not idle:
        return []
    out: list[Finding] = []
    if g.process_pids:
        sev = _severity(th.leftover_processes, "leftover_processes")
        if sev != Status.OK:
            pids = ", ".join(str(p) for p in g.process_pids)
            out.append(
                Finding(g.index, sev, "leftover_processes", f"processes {pids} still on a GPU that should be idle")
            )
    if g.memory_used_mib is not None and g.memory_used_mib > th.idle_memory_used_mib:
        out.append(
            Finding(
                g.index,
                Status.WARNING,
                "leftover_memory",
                f"{g.memory_used_mib:.0f} MiB in use on a GPU that should be idle "
                f"(limit {th.idle_memory_used_mib:.0f})",
            )
        )
    return out


def rule_power(g: GpuReadings, th: GpuThresholds, idle: bool) -> list[Finding]:
    del idle
    if g.power_w is None or not g.power_limit_w:
        return []
    if g.power_w > g.power_limit_w * (1 + th.power_over_limit_pct / 100):
        return [
            Finding(g.index, Status.WARNING, "power", f"draws {g.power_w:.0f} W over its {g.power_limit_w:.0f} W limit")
        ]
    return []


def rule_fan(g: GpuReadings, th: GpuThresholds, idle: bool) -> list[Finding]:
    del idle
    if g.fan_percent is not None and g.fan_percent >= th.fan_warn_percent:
        return [Finding(g.index, Status.WARNING, "fan", f"fan at {g.fan_percent:.0f}%")]
    return []


def rule_ecc(g: GpuReadings, th: GpuThresholds, idle: bool) -> list[Finding]:
    del idle
    out: list[Finding] = []
    n = g.ecc_volatile_uncorrected
    if n is not None and n >= th.ecc_uncorrected_critical:
        out.append(Finding(g.index, Status.CRITICAL, "ecc_uncorrected", f"{n} volatile uncorrected ECC error(s)"))
    ampere = g.architecture is not None and g.architecture >= AMPERE_ARCH
    if not ampere and g.retired_pages_pending:
        out.append(Finding(g.index, Status.CRITICAL, "retired_pages_pending", "retired pages pending: reset the GPU"))
    if g.remapped_rows_failure:
        out.append(Finding(g.index, Status.CRITICAL, "remapped_rows_failure", "row remapping failed: replace the GPU"))
    elif g.remapped_rows_pending:
        out.append(Finding(g.index, Status.CRITICAL, "remapped_rows_pending", "remapped rows pending: reset the GPU"))
    return out


def rule_clocks(g: GpuReadings, th: GpuThresholds, idle: bool) -> list[Finding]:
    del idle
    if not g.clock_event_reasons:
        return []
    out: list[Finding] = []
    for name, bit in CLOCK_REASON_BITS.items():
        if g.clock_event_reasons & bit:
            sev = _severity(th.clock_event_reasons.get(name, "warning"), f"clock_event_reasons.{name}")
            if sev != Status.OK:
                out.append(Finding(g.index, sev, f"clocks_{name}", f"clocks held back: {name.replace('_', ' ')}"))
    return out


def rule_pcie(g: GpuReadings, th: GpuThresholds, idle: bool) -> list[Finding]:
    del idle
    out: list[Finding] = []
    if g.pcie_width is not None and g.pcie_width_max and g.pcie_width < g.pcie_width_max:
        sev = _severity(th.pcie_width_below_max, "pcie_width_below_max")
        if sev != Status.OK:
            out.append(Finding(g.index, sev, "pcie_width", f"PCIe link x{g.pcie_width} below its x{g.pcie_width_max}"))
    if g.pcie_gen is not None and g.pcie_gen_max and g.pcie_gen < g.pcie_gen_max:
        sev = _severity(th.pcie_gen_below_max, "pcie_gen_below_max")
        if sev != Status.OK:
            out.append(Finding(g.index, sev, "pcie_gen", f"PCIe gen {g.pcie_gen} below its gen {g.pcie_gen_max}"))
    return out


def rule_nvlink(g: GpuReadings, th: GpuThresholds, idle: bool) -> list[Finding]:
    del idle
    out: list[Finding] = []
    for link in g.nvlinks:
        if not link.active:
            sev = _severity(th.nvlink_inactive, "nvlink_inactive")
            if sev != Status.OK:
                out.append(Finding(g.index, sev, "nvlink_inactive", f"NVLink {link.link} is down"))
        total = sum(link.errors.values())
        if total >= th.nvlink_errors_warn:
            detail = ", ".join(f"{k} {v}" for k, v in sorted(link.errors.items()) if v)
            out.append(Finding(g.index, Status.WARNING, "nvlink_errors", f"NVLink {link.link} errors: {detail}"))
    return out


RULES: tuple[Rule, ...] = (
    rule_temperature,
    rule_memory,
    rule_power,
    rule_fan,
    rule_ecc,
    rule_clocks,
    rule_pcie,
    rule_nvlink,
)


def evaluate(gpus: list[GpuReadings], th: GpuThresholds, expect_idle: bool = False) -> list[Finding]:
    return [f for g in gpus for rule in RULES for f in rule(g, th, expect_idle)]


# -- Xids ------------------------------------------------------------------------------------
XID_RE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F:.]+)\): (\d+),?\s*(.*)")


@dataclass(frozen=True)
class XidEvent:
    pci: str  # "0000:3b:00"
    xid: int
    text: str  # the rest of the line
    line: int  # 1-based line number in the scanned text


def parse_xids(text: str) -> list[XidEvent]:
    out: list[XidEvent] = []
    for n, line in enumerate(text.splitlines(), 1):
        m = XID_RE.search(line)
        if m:
            out.append(XidEvent(m.group(1).lower(), int(m.group(2)), m.group(3).strip(), n))
    return out


def _pci_match(event_pci: str, bus_ids: Iterable[str]) -> bool:
    """Kernel logs print 0000:3b:00, NVML 00000000:3B:00.0: compare bus:device."""
    tail = ":".join(event_pci.split(".")[0].split(":")[-2:])
    return any(":".join(b.lower().split(".")[0].split(":")[-2:]) == tail for b in bus_ids)


def classify_xids(events: list[XidEvent], th: GpuThresholds, bus_ids: list[str] | None = None) -> list[Finding]:
    """Critical Xids → CRITICAL, application Xids → OK (recorded), others → WARNING. With
    `bus_ids`, only the events of those GPUs count."""
    out: list[Finding] = []
    for ev in events:
        if bus_ids is not None and not _pci_match(ev.pci, bus_ids):
            continue
        if ev.xid in th.xid_critical:
            sev = Status.CRITICAL
        elif ev.xid in th.xid_application:
            sev = Status.OK
        else:
            sev = Status.WARNING
        kind = "critical" if sev == Status.CRITICAL else "application" if sev == Status.OK else "unclassified"
        out.append(Finding(None, sev, f"xid_{ev.xid}", f"{kind} Xid {ev.xid} on PCI {ev.pci}: {ev.text}"))
    return out


def read_kmsg(since_seq: int = -1, path: str = "/dev/kmsg") -> tuple[str, int]:
    """Kernel log records after sequence `since_seq`, as text, and the last sequence seen.
    Reads /dev/kmsg without blocking (root in a prolog); OSError when it is unreadable."""
    lines: list[str] = []
    last = since_seq
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        while True:
            try:
                rec = os.read(fd, 8192)
            except BlockingIOError:
                break
            except BrokenPipeError:  # a record was overwritten while reading: go on
                continue
            if not rec:
                break
            head, _, msg = rec.decode(errors="replace").partition(";")
            try:
                seq = int(head.split(",")[1])
            except (IndexError, ValueError):
                continue
            if seq > since_seq:
                lines.append(msg.split("\n", 1)[0])
                last = max(last, seq)
    finally:
        os.close(fd)
    return "\n".join(lines), last


# -- NVML ------------------------------------------------------------------------------------
T = TypeVar("T")


def read_nvml(indices: list[int] | None = None) -> list[GpuReadings]:
    """Read every (or the given) GPU through NVML. Raises RuntimeError naming NVML's error
    when the library or driver is missing."""
    try:
        import pynvml as nv
    except ImportError as exc:
        raise RuntimeError(f"nvidia-ml-py is not installed ({exc})") from None
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        raise RuntimeError(f"NVML unavailable: {exc}") from None
    try:
        count = nv.nvmlDeviceGetCount()
        out: list[GpuReadings] = []
        for i in indices if indices is not None else range(count):
            if not 0 <= i < count:
                raise RuntimeError(f"GPU index {i} does not exist; this node has {count} GPU(s)")
            out.append(_read_one(nv, i))
        return out
    finally:
        nv.nvmlShutdown()


def _read_one(nv: Any, i: int) -> GpuReadings:
    h = nv.nvmlDeviceGetHandleByIndex(i)
    errors: dict[str, str] = {}

    def get(key: str, fn: Callable[[], T]) -> T | None:
        try:
            return fn()
        except nv.NVMLError_NotSupported:
            return None
        except nv.NVMLError as exc:
            errors[key] = str(exc)
            return None

    def text(v: Any) -> str:
        return v.decode() if isinstance(v, bytes) else str(v)

    mem = get("memory", lambda: nv.nvmlDeviceGetMemoryInfo(h))
    procs = get("processes", lambda: nv.nvmlDeviceGetComputeRunningProcesses(h)) or []
    remap = get("remapped_rows", lambda: nv.nvmlDeviceGetRemappedRows(h))
    reasons_fn = (
        getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
    )
    power = get("power", lambda: nv.nvmlDeviceGetPowerUsage(h))
    limit = get("power_limit", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h))
    links: list[NvLinkReading] = []
    for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            state = nv.nvmlDeviceGetNvLinkState(h, link)
        except nv.NVMLError:
            break  # no (more) NVLinks on this GPU
        counters = {
            "replay": getattr(nv, "NVML_NVLINK_ERROR_DL_REPLAY", 0),
            "recovery": getattr(nv, "NVML_NVLINK_ERROR_DL_RECOVERY", 1),
            "crc_flit": getattr(nv, "NVML_NVLINK_ERROR_DL_CRC_FLIT", 2),
            "crc_data": getattr(nv, "NVML_NVLINK_ERROR_DL_CRC_DATA", 3),
        }
        errs: dict[str, int] = {}
        for k, c in counters.items():
            value: Any = get(f"nvlink{link}_{k}", partial(nv.nvmlDeviceGetNvLinkErrorCounter, h, link, c))
            errs[k] = int(value or 0)
        links.append(NvLinkReading(link, bool(state), errs))
    return GpuReadings(
        index=i,
        name=text(get("name", lambda: nv.nvmlDeviceGetName(h)) or ""),
        uuid=text(get("uuid", lambda: nv.nvmlDeviceGetUUID(h)) or ""),
        pci_bus_id=text(getattr(get("pci", lambda: nv.nvmlDeviceGetPciInfo(h)), "busId", "")),
        architecture=get("architecture", lambda: int(nv.nvmlDeviceGetArchitecture(h))),
        temperature_c=get("temperature", lambda: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))),
        temp_slowdown_c=get(
            "temp_slowdown",
            lambda: float(nv.nvmlDeviceGetTemperatureThreshold(h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)),
        ),
        temp_shutdown_c=get(
            "temp_shutdown",
            lambda: float(nv.nvmlDeviceGetTemperatureThreshold(h, nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)),
        ),
        memory_used_mib=mem.used / 2**20 if mem is not None else None,
        memory_total_mib=mem.total / 2**20 if mem is not None else None,
        process_pids=[int(p.pid) for p in procs],
        power_w=power / 1000 if power is not None else None,
        power_limit_w=limit / 1000 if limit is not None else None,
        fan_percent=get("fan", lambda: float(nv.nvmlDeviceGetFanSpeed(h))),
        ecc_volatile_uncorrected=get(
            "ecc",
            lambda: int(nv.nvmlDeviceGetTotalEccErrors(h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)),
        ),
        retired_pages_pending=get("retired_pages", lambda: bool(nv.nvmlDeviceGetRetiredPagesPendingStatus(h))),
        remapped_rows_pending=bool(remap[2]) if remap is not None else None,
        remapped_rows_failure=bool(remap[3]) if remap is not None else None,
        clock_event_reasons=get("clock_event_reasons", lambda: int(reasons_fn(h))),
        pcie_gen=get("pcie_gen", lambda: int(nv.nvmlDeviceGetCurrPcieLinkGeneration(h))),
        pcie_gen_max=get("pcie_gen_max", lambda: int(nv.nvmlDeviceGetMaxPcieLinkGeneration(h))),
        pcie_width=get("pcie_width", lambda: int(nv.nvmlDeviceGetCurrPcieLinkWidth(h))),
        pcie_width_max=get("pcie_width_max", lambda: int(nv.nvmlDeviceGetMaxPcieLinkWidth(h))),
        nvlinks=links,
        read_errors=errors,
    )


def gpus_from_env(env: dict[str, str] | os._Environ[str] | None = None) -> list[int] | None:
    """The job's GPUs: SLURM_JOB_GPUS in a prolog, else CUDA_VISIBLE_DEVICES; None = all."""
    env = os.environ if env is None else env
    for key in ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES"):
        raw = env.get(key, "").strip()
        if raw and all(p.strip().isdigit() for p in raw.split(",")):
            return [int(p) for p in raw.split(",")]
    return None


def result_from_findings(name: str, findings: list[Finding], extra: dict[str, Any]) -> SkillResult:
    status = worst(f.status for f in findings)
    reasons = [
        f"GPU {f.gpu}: {f.message}" if f.gpu is not None else f.message for f in findings if f.status != Status.OK
    ]
    return SkillResult(name, status, reasons, {"findings": [_finding_json(f) for f in findings], **extra})


def _finding_json(f: Finding) -> dict[str, Any]:
    return {"gpu": f.gpu, "status": f.status.name, "code": f.code, "message": f.message}


# -- the skills ------------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuHealthInput:
    gpus: list[int] | None = field(default=None, metadata={"help": "GPU indices (default: the job's, else all)"})
    readings_file: Path | None = field(
        default=None, metadata={"help": "recorded readings (JSON) to check instead of reading NVML"}
    )
    config: Path | None = field(default=None, metadata={"help": "thresholds YAML (default: the packaged one)"})
    set: list[str] | None = field(default=None, metadata={"help": "threshold overrides key=value"})
    expect_idle: bool = field(default=False, metadata={"help": "the GPUs should be idle (prolog/epilog)"})
    kernel_log: Path | None = field(default=None, metadata={"help": "kernel log text to scan for Xids"})


class GpuHealthCheck(TypedSkill[GpuHealthInput]):
    name = "gpu_health_check"
    description = (
        "NVML health of the job's GPUs: temperature, memory, power, fan, ECC, remaps, clocks, PCIe, NVLink, Xids"
    )
    Input = GpuHealthInput

    def check(self, inp: GpuHealthInput) -> SkillResult:
        try:
            th = load_thresholds(inp.config, inp.set or ())
        except (ConfigError, OSError) as exc:
            return self.unknown(f"thresholds: {exc}")
        gpus_wanted = inp.gpus if inp.gpus is not None else gpus_from_env()
        try:
            if inp.readings_file is not None:
                readings = load_readings(inp.readings_file)
                if gpus_wanted is not None:
                    readings = [g for g in readings if g.index in gpus_wanted]
                source = f"recorded readings {inp.readings_file}"
            else:
                readings = read_nvml(gpus_wanted)
                source = "NVML"
        except (RuntimeError, OSError, ValueError, KeyError, TypeError) as exc:
            return self.unknown(f"no GPU readings: {exc}", source="NVML" if inp.readings_file is None else "file")
        findings = evaluate(readings, th, inp.expect_idle)
        extra: dict[str, Any] = {"source": source, "gpus": [asdict(g) for g in readings]}
        if inp.kernel_log is not None:
            try:
                text = inp.kernel_log.read_text(errors="replace")
            except OSError as exc:
                return self.unknown(f"kernel log unreadable: {exc}")
            findings += classify_xids(parse_xids(text), th, [g.pci_bus_id for g in readings if g.pci_bus_id] or None)
        for g in readings:
            for key, err in g.read_errors.items():
                findings.append(Finding(g.index, Status.UNKNOWN, f"read_{key}", f"could not read {key}: {err}"))
        return result_from_findings(self.name, findings, extra)


@dataclass(frozen=True)
class XidInput:
    log_file: Path | None = field(default=None, metadata={"help": "kernel log text (dmesg output); default /dev/kmsg"})
    config: Path | None = field(default=None, metadata={"help": "thresholds YAML with the Xid lists"})
    since_seq: int = field(default=-1, metadata={"help": "/dev/kmsg: only records after this sequence number"})


class XidScan(TypedSkill[XidInput]):
    name = "xid_scan"
    description = "NVIDIA Xid errors in the kernel log, classified critical (hardware/driver) vs application"
    Input = XidInput
    positional = ("log_file",)

    def check(self, inp: XidInput) -> SkillResult:
        try:
            th = load_thresholds(inp.config)
        except (ConfigError, OSError) as exc:
            return self.unknown(f"thresholds: {exc}")
        last = inp.since_seq
        try:
            if inp.log_file is not None:
                text = inp.log_file.read_text(errors="replace")
            else:
                text, last = read_kmsg(inp.since_seq)
        except OSError as exc:
            return self.unknown(f"kernel log unreadable: {exc}")
        events = parse_xids(text)
        findings = classify_xids(events, th)
        return result_from_findings(self.name, findings, {"events": [asdict(e) for e in events], "last_seq": last})
