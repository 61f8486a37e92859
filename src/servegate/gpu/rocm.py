"""AMD GPUs where only ``rocm-smi`` is installed (ROCm before 6, or a box without
amd-smi): ``rocm-smi --showmeminfo vram --showtemp --showpower --showpids --json`` and
``rocminfo`` for the archs. rocm-smi's JSON is ``{"card<N>": {"<label>": "<value>"},
"system": {"PID<pid>": "<name>, <gpus>, <vram bytes>, …"}}``, every value a string
(``tests/gpu/fixtures/amd/SOURCES.md``); it has no ECC counts, no bad pages, no
temperature or power limits and no per-GPU process list, so the check says it is a
weaker one (a warning) and judges what there is: memory held by no process (against all
the processes' VRAM together), the archs and the count."""

from __future__ import annotations

import json
import re

from servegate.gpu.health import Finding, Gpu, Process, Runner, Snapshot, ToolFailed

TOOL = "rocm-smi"


def _float(text: object) -> float | None:
    try:
        return float(str(text))
    except ValueError:
        return None


def read(snap: Snapshot, run: Runner, timeout: float) -> None:
    argv = [
        "rocm-smi",
        "--showmeminfo",
        "vram",
        "--showtemp",
        "--showpower",
        "--showpids",
        "--json",
    ]
    try:
        doc = json.loads(run(argv, timeout))
    except ValueError as exc:
        raise ToolFailed(f"rocm-smi --json is not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ToolFailed("rocm-smi --json is not an object of cards")
    cards = sorted((k for k in doc if re.fullmatch(r"card\d+", k)), key=lambda k: int(k[4:]))
    try:
        archs = re.findall(r"Name:\s+(gfx[0-9a-f]+)\b", run(["rocminfo"], timeout))
    except ToolFailed:
        archs = []  # the archs go unchecked: the count and memory are still judged
    for n, card in enumerate(cards):
        fields = doc[card] if isinstance(doc[card], dict) else {}
        used = _float(fields.get("VRAM Total Used Memory (B)"))
        total = _float(fields.get("VRAM Total Memory (B)"))
        temp = _float(fields.get("Temperature (Sensor junction) (C)")) or _float(
            fields.get("Temperature (Sensor edge) (C)")
        )
        power = next(
            (_float(v) for k, v in fields.items() if k.endswith("Package Power (W)")), None
        )
        snap.gpus.append(
            Gpu(
                index=int(card[4:]),
                name=card,
                bus="",
                arch=archs[n] if n < len(archs) else "",
                memory_total_mib=total / 2**20 if total is not None else None,
                memory_used_mib=used / 2**20 if used is not None else None,
                temperature_c=temp,
                power_w=power,
            )
        )
    # processes: rocm-smi says how much VRAM each holds, not on which GPU; they are put on
    # the first GPU so that the memory check weighs all of them against all the memory
    system = doc.get("system") if isinstance(doc.get("system"), dict) else {}
    for key, row in (system or {}).items():
        parts = [p.strip() for p in str(row).split(",")]
        if key.startswith("PID") and key[3:].isdigit() and len(parts) >= 3 and snap.gpus:
            vram = _float(parts[2]) or 0.0
            snap.gpus[0].processes.append(Process(int(key[3:]), parts[0], vram / 2**20))
    if len(snap.gpus) > 1:
        used = sum(g.memory_used_mib or 0.0 for g in snap.gpus)
        snap.gpus[0].memory_used_mib = used  # weighed together (see above)
        for g in snap.gpus[1:]:
            g.memory_used_mib = None
    snap.findings.append(
        Finding(
            "tool",
            "warn",
            "only rocm-smi here: no ECC counts, bad pages, temperature or power "
            "limits, or per-GPU processes are read",
            "install amd-smi (ROCm 6 and later) for the full check",
        )
    )
