"""NVIDIA GPUs through ``nvidia-smi -q -x`` (the driver's full report as XML: memory,
processes, ECC, retired pages and remapped rows, temperatures, power, clock-event
reasons) and ``nvidia-smi --query-gpu=pci.bus_id,compute_cap`` (the arch, which the XML
does not carry). Element names changed across driver branches (``clocks_throttle_reasons``
became ``clocks_event_reasons``, ``power_readings`` became ``gpu_power_readings``, pages
are retired before Ampere and rows remapped from it): each is read under every name it
has had. The XML is the driver's own tool's output on this box, parsed with the standard
library."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET  # the local driver tool's output
from collections.abc import Callable

from servegate.gpu.health import Finding, Gpu, Process, Runner, Severity, Snapshot, ToolFailed

TOOL = "nvidia-smi"
#: the clock-event reasons that are a fault (a power cap under load and an idle GPU's
#: low clocks are not)
FAULTS = {
    "hw_slowdown": "hardware slowdown",
    "hw_thermal_slowdown": "hardware thermal slowdown",
    "hw_power_brake_slowdown": "power brake (external power)",
    "sw_thermal_slowdown": "software thermal slowdown",
}


def read(snap: Snapshot, run: Runner, timeout: float) -> None:
    parse(snap, run(["nvidia-smi", "-q", "-x"], timeout))
    try:
        caps = run(
            ["nvidia-smi", "--query-gpu=pci.bus_id,compute_cap", "--format=csv,noheader"], timeout
        )
    except ToolFailed:
        caps = ""
    archs = {}
    for line in caps.splitlines():
        bus, _, cap = (p.strip() for p in line.partition(","))
        if re.fullmatch(r"\d+\.\d+", cap):
            archs[_bus(bus)] = "sm_" + cap.replace(".", "")
    for gpu in snap.gpus:
        gpu.arch = archs.get(_bus(gpu.bus), "")


def _bus(bus: str) -> str:
    """A PCI bus id in one form (nvidia-smi writes 00000000:19:00.0 in one place and
    0000:19:00.0 in another)."""
    return bus.lower().split(":", 1)[-1] if bus.count(":") == 2 else bus.lower()


def _text(node: ET.Element | None, *path: str) -> str:
    for p in path:
        found = node.find(p) if node is not None else None
        if found is not None and found.text and found.text.strip():
            return found.text.strip()
    return ""


def _number(text: str) -> float | None:
    """The number a value starts with ("81559 MiB", "30 C"); None for "N/A", "[N/A]",
    "[Not Supported]" and anything beyond what a counter can hold."""
    m = re.match(r"^\s*(-?\d{1,15}(?:\.\d+)?)(?!\d)", text)
    value = float(m[1]) if m else None
    return value if value is not None and math.isfinite(value) else None


def parse(snap: Snapshot, text: str) -> None:
    """``nvidia-smi -q -x`` into ``snap`` (ToolFailed when it is not that report)."""
    try:
        root = ET.fromstring(text)  # the local driver tool's output
    except ET.ParseError as exc:
        raise ToolFailed(f"nvidia-smi -q -x is not XML ({exc})") from None
    if root.tag != "nvidia_smi_log":
        raise ToolFailed(f"nvidia-smi -q -x wrote <{root.tag}>, not <nvidia_smi_log>")
    snap.driver = _text(root, "driver_version")
    snap.runtime = _text(root, "cuda_version")
    gpus = root.findall("gpu")
    attached = _number(_text(root, "attached_gpus"))
    if not gpus and attached is None:
        raise ToolFailed("nvidia-smi -q -x names no GPU and no count of them")
    if attached is not None and int(attached) != len(gpus):
        snap.findings.append(
            Finding(
                "count",
                "fail",
                f"nvidia-smi says {int(attached)} GPU(s) are attached but reports {len(gpus)}",
                "a GPU the driver lost: reset it or reboot",
            )
        )
    for index, g in enumerate(gpus):
        snap.gpus.append(_gpu(index, g))


def _gpu(index: int, g: ET.Element) -> Gpu:
    gpu = Gpu(
        index=index,
        name=_text(g, "product_name"),
        bus=_text(g, "pci/pci_bus_id") or str(g.get("id", "")),
    )
    memory = g.find("fb_memory_usage")
    gpu.memory_total_mib = _number(_text(memory, "total"))
    gpu.memory_used_mib = _number(_text(memory, "used"))
    for p in g.findall("processes/process_info"):
        gpu.processes.append(
            Process(
                pid=int(_number(_text(p, "pid")) or 0),
                name=_text(p, "process_name"),
                memory_mib=_number(_text(p, "used_memory")) or 0.0,
            )
        )
    gpu.temperature_c = _number(_text(g, "temperature/gpu_temp"))
    gpu.temperature_limit_c = _number(_text(g, "temperature/gpu_temp_slow_threshold"))
    power = g.find("gpu_power_readings")
    if power is None:
        power = g.find("power_readings")
    gpu.power_w = _number(_text(power, "power_draw", "instant_power_draw"))
    gpu.power_limit_w = _number(_text(power, "current_power_limit", "power_limit"))
    reasons = g.find("clocks_event_reasons")
    if reasons is None:
        reasons = g.find("clocks_throttle_reasons")
    for child in list(reasons) if reasons is not None else []:
        key = re.sub(r"^clocks_(event|throttle)_reason_", "", child.tag)
        if key in FAULTS and (child.text or "").strip() == "Active":
            gpu.throttle.append(FAULTS[key])
    volatile = g.find("ecc_errors/volatile")
    counts = [
        _number(e.text or "")
        for e in (volatile.iter() if volatile is not None else [])
        if ("uncorrectable" in e.tag or e.tag == "double_bit") and len(e) == 0
    ]
    doubles = volatile.find("double_bit/total") if volatile is not None else None
    if doubles is not None:
        counts.append(_number(doubles.text or ""))
    known = [int(c) for c in counts if c is not None]
    if any(c < 0 for c in known):
        raise ToolFailed(f"nvidia-smi reports a negative ECC count on GPU {index}")
    gpu.ecc_uncorrectable = sum(known) if known else None
    pending = 0
    seen = False
    for tag in (
        "retired_pages/pending_blacklist",
        "retired_pages/pending_retirement",
        "remapped_rows/remapped_row_pending",
        "remapped_rows/pending",
    ):
        value = _text(g, tag)
        if value in ("Yes", "No"):
            seen = True
            pending += value == "Yes"
    gpu.pages_pending = pending if seen else None
    gpu.pages_failed = any(
        _text(g, tag) == "Yes"
        for tag in (
            "remapped_rows/remapped_row_failure",
            "remapped_rows/remapping_failure_occurred",
        )
    )
    gpu.unreadable = _broken(g)
    tlimit = _number(_text(g, "temperature/gpu_temp_tlimit"))
    if gpu.temperature_limit_c is None and tlimit is not None and gpu.temperature_c is not None:
        # Ada and later drivers give the margin to the slowdown (T.Limit), not the limit
        slow = _number(_text(g, "temperature/gpu_temp_slow_tlimit_threshold")) or 0.0
        gpu.temperature_limit_c = gpu.temperature_c + tlimit - slow
    return gpu


#: what the driver writes where it cannot read a GPU
LOST = re.compile(r"GPU is lost|Unknown Error|ERR!|GPU requires reset", re.I)
#: fields that say the GPU needs a reset or a repair (newer drivers)
NEEDS: dict[str, Callable[[str], bool]] = {
    "gpu_recovery_action": lambda v: v not in ("None", "N/A", ""),
    "gpu_reset_status/reset_required": lambda v: v == "Yes",
    "gpu_reset_status/drain_and_reset_recommended": lambda v: v == "Yes",
    "channel_repair_pending": lambda v: v == "Yes",
    "tpc_repair_pending": lambda v: v == "Yes",
    "sram_threshold_exceeded": lambda v: v == "Yes",
}


def _broken(g: ET.Element) -> list[str]:
    said = [f"{e.tag}: {e.text.strip()}" for e in g.iter()
            if e.text and LOST.search(e.text)]  # fmt: skip
    for path, bad in NEEDS.items():
        for e in g.iter(path.rsplit("/", 1)[-1]):
            value = (e.text or "").strip()
            if bad(value):
                said.append(f"{path}: {value}")
    return list(dict.fromkeys(said))


def dcgm(snap: Snapshot, run: Runner, timeout: float) -> None:
    """DCGM's passive health of group 0 (all GPUs), where ``dcgmi`` is installed: its
    warnings and failures are findings; DCGM not answering is said, not judged (the
    driver's own report above is the check)."""
    try:
        text = run(["dcgmi", "health", "-g", "0", "-c"], timeout)
    except ToolFailed as exc:
        snap.findings.append(
            Finding(
                "dcgm",
                "warn",
                f"dcgmi health did not answer: {exc}",
                "start nv-hostengine, or ignore: DCGM is optional",
            )
        )
        return
    for line in text.splitlines():
        if re.search(r"\b(Failure|Warning)\b", line):
            severity: Severity = "fail" if "Failure" in line else "warn"
            snap.findings.append(
                Finding(
                    "dcgm",
                    severity,
                    line.strip(" |")[:300],
                    "see `dcgmi health -g 0 -c` and DCGM's docs",
                )
            )
