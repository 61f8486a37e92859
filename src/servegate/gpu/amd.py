"""AMD GPUs through ``amd-smi`` (ROCm 6.1 and later): ``static`` (arch, bus, limits,
driver), ``metric`` (memory, temperatures, power, ECC, throttle), ``process`` (each
process's VRAM), ``bad-pages`` (pending retirement) and ``version`` (the ROCm version),
each with ``--json``.

The JSON's shapes, as amd-smi's CLI writes them (``amdsmi_cli``'s logger and commands;
``tests/gpu/fixtures/amd/SOURCES.md`` names the lines): a list of one object a GPU, each
beginning with ``"gpu": N`` (ROCm 7's amd-smi wraps the list in ``{"gpu_data": [...]}``);
a value it could not read is the string ``"N/A"``; a measured value is ``{"value": x,
"unit": "..."}``; an idle GPU's ``process_info`` is a sentence, not an object; a bad-page
field is a sentence, one page object, or a list of them. Everything is read through that.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from servegate.gpu.health import Finding, Gpu, Process, Runner, Snapshot, ToolFailed

TOOL = "amd-smi"


def _records(text: str, command: str) -> list[dict[str, Any]]:
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ToolFailed(f"amd-smi {command} --json is not JSON ({exc})") from None
    if isinstance(doc, dict) and isinstance(doc.get("gpu_data"), list):
        doc = doc["gpu_data"]
    if isinstance(doc, dict) and "gpu" in doc:
        doc = [doc]  # ROCm 6.0 printed one GPU as a bare object
    if not isinstance(doc, list) or not all(
        isinstance(r, dict) and isinstance(r.get("gpu"), int) and not isinstance(r["gpu"], bool)
        for r in doc
    ):
        raise ToolFailed(f"amd-smi {command} --json is not a list of GPUs")
    return doc


def _value(node: Any) -> float | None:
    """``{"value": x, "unit": u}`` or a bare number; None for "N/A" and anything else."""
    if isinstance(node, Mapping):
        node = node.get("value")
    if isinstance(node, bool):
        return None
    return float(node) if isinstance(node, int | float) else None


def _get(record: Mapping[str, Any], *path: str) -> Any:
    node: Any = record
    for key in path:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node


def read(snap: Snapshot, run: Runner, timeout: float) -> None:
    static = _records(run(["amd-smi", "static", "--json"], timeout), "static")
    metric = {
        r["gpu"]: r for r in _records(run(["amd-smi", "metric", "--json"], timeout), "metric")
    }
    procs = {
        r["gpu"]: r for r in _records(run(["amd-smi", "process", "--json"], timeout), "process")
    }
    try:
        pages = {
            r["gpu"]: r
            for r in _records(run(["amd-smi", "bad-pages", "--json"], timeout), "bad-pages")
        }
    except ToolFailed as exc:
        pages = {}  # needs root on some versions: said, as a weaker check
        snap.findings.append(
            Finding(
                "pages",
                "warn",
                f"amd-smi bad-pages was not read ({exc}): pages pending retirement are not seen",
                "run the check as root, or update ROCm",
            )
        )
    try:
        version = json.loads(run(["amd-smi", "version", "--json"], timeout))
        first = version[0] if isinstance(version, list) and version else version
        snap.runtime = str(first.get("rocm_version", "")) if isinstance(first, dict) else ""
    except (ToolFailed, ValueError):
        snap.runtime = ""
    for record in static:
        snap.gpus.append(
            _gpu(
                record,
                metric.get(record["gpu"], {}),
                procs.get(record["gpu"]),
                pages.get(record["gpu"]),
            )
        )
        driver = _get(record, "driver", "version")
        if isinstance(driver, str) and driver != "N/A":
            snap.driver = driver


def _gpu(
    static: Mapping[str, Any],
    metric: Mapping[str, Any],
    procs: Mapping[str, Any] | None,
    pages: Mapping[str, Any] | None,
) -> Gpu:
    name = _get(static, "board", "product_name") or _get(static, "asic", "market_name")
    arch = _get(static, "asic", "target_graphics_version")
    gpu = Gpu(
        index=int(static["gpu"]),
        name=str(name) if name not in (None, "N/A") else "",
        bus=str(_get(static, "bus", "bdf") or ""),
        arch=str(arch) if isinstance(arch, str) and arch.startswith("gfx") else "",
    )
    # amd-smi labels these "MB" and computes them as bytes // 2**20: MiB
    gpu.memory_total_mib = _value(_get(metric, "mem_usage", "total_vram"))
    gpu.memory_used_mib = _value(_get(metric, "mem_usage", "used_vram"))
    gpu.temperature_c = _value(_get(metric, "temperature", "hotspot")) or _value(
        _get(metric, "temperature", "edge")
    )
    hot = _value(_get(static, "limit", "slowdown_hotspot_temperature"))
    gpu.temperature_limit_c = (
        hot if hot is not None else _value(_get(static, "limit", "slowdown_edge_temperature"))
    )
    gpu.power_w = _value(_get(metric, "power", "socket_power"))
    gpu.power_limit_w = _value(_get(static, "limit", "socket_power"))
    if _get(metric, "power", "throttle_status") == "THROTTLED":
        gpu.throttle.append("throttled (power or thermal)")
    for key in (
        "socket_thermal_violation_status",
        "vr_thermal_violation_status",
        "hbm_thermal_violation_status",
        "prochot_violation_status",
    ):
        if _get(metric, "throttle", key) in ("ACTIVE", "Active", True):
            gpu.throttle.append(key.removesuffix("_violation_status").replace("_", " "))
    ecc = _get(metric, "ecc", "total_uncorrectable_count")
    gpu.ecc_uncorrectable = int(ecc) if isinstance(ecc, int) and not isinstance(ecc, bool) else None
    listed = (procs or {}).get("process_list") or []
    for entry in listed if isinstance(listed, list) else []:
        info = entry.get("process_info", entry) if isinstance(entry, Mapping) else None
        if not isinstance(info, Mapping):
            continue  # "No running processes detected"
        vram = _value(_get(info, "memory_usage", "vram_mem"))
        pid = info.get("pid")
        gpu.processes.append(
            Process(
                pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else -1,
                name=str(info.get("name", "")),
                memory_mib=(vram or 0.0) / 2**20,
            )
        )
    if pages is not None:
        gpu.pages_pending = _count_pages(pages.get("pending"))
        gpu.pages_failed = bool(_count_pages(pages.get("un_res")))  # bad, and not reserved
    return gpu


def _count_pages(field: Any) -> int | None:
    """A bad-page field: a sentence ("No bad pages found." → 0, "N/A" → unknown), one
    page object or a list of them."""
    if isinstance(field, list):
        return len(field)
    if isinstance(field, Mapping):
        return 1
    if isinstance(field, str) and field.startswith("No bad pages"):
        return 0
    return None
