"""GPU telemetry beside every measured group: clocks, power, temperature, memory, use.

A thermal throttle or a clock drop between two runs looks like a slower release; recorded
beside the samples, it shows up as what it is. The vendors' own tools are read, nothing
is loaded into this process:

- NVIDIA: ``nvidia-smi --query-gpu=… --format=csv,noheader,nounits`` (one line a GPU);
- AMD: ``rocm-smi --showtemp --showpower --showuse --showmemuse --showclocks --json``
  (one object a card; the keys are the tool's own, e.g. ``Temperature (Sensor edge) (C)``);
- neither on ``PATH`` (a CPU server): no telemetry, and the result file says so.

A :class:`Sampler` reads the tool every ``interval`` seconds in a thread while a group
runs; the group keeps the minimum, mean and maximum of every field per GPU, and the
number of readings. A tool that fails mid-run leaves the readings it made and its error.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: the fields every reading has (None where the tool reports none)
FIELDS = (
    "sm_clock_mhz",
    "mem_clock_mhz",
    "power_w",
    "temperature_c",
    "memory_used_mib",
    "memory_total_mib",
    "utilization_pct",
)

_NVIDIA_QUERY = (
    "index,name,clocks.sm,clocks.mem,power.draw,temperature.gpu,memory.used,memory.total,"
    "utilization.gpu"
)


def _number(text: str) -> float | None:
    m = re.search(r"-?\d+(?:\.\d+)?", text or "")
    return float(m.group()) if m and "N/A" not in text and "Not Supported" not in text else None


def parse_nvidia(text: str) -> list[dict[str, Any]]:
    """``nvidia-smi --query-gpu=<_NVIDIA_QUERY> --format=csv,noheader,nounits`` → readings."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 9:
            continue
        values = [_number(p) for p in parts[2:]]
        out.append({"gpu": parts[0], "name": parts[1], **dict(zip(FIELDS, values, strict=True))})
    return out


def _rocm_field(card: Mapping[str, Any], *patterns: str) -> float | None:
    for pattern in patterns:
        for key, value in card.items():
            if re.search(pattern, key, re.IGNORECASE):
                found = _number(str(value))
                if found is not None:
                    return found
    return None


def parse_rocm(text: str) -> list[dict[str, Any]]:
    """``rocm-smi --showtemp --showpower --showuse --showmemuse --showclocks --json`` →
    readings. Memory comes as a percentage there: ``memory_used_mib`` stays None and
    ``memory_used_pct`` carries it."""
    doc = json.loads(text)
    out = []
    for name, card in sorted(doc.items()):
        if not name.startswith("card") or not isinstance(card, dict):
            continue
        out.append(
            {
                "gpu": name.removeprefix("card"),
                "name": str(card.get("Card series") or card.get("Card SKU") or name),
                "sm_clock_mhz": _rocm_field(card, r"^sclk clock speed"),
                "mem_clock_mhz": _rocm_field(card, r"^mclk clock speed"),
                "power_w": _rocm_field(card, r"Graphics Package Power \(W\)", r"Power \(W\)"),
                "temperature_c": _rocm_field(
                    card, r"Temperature \(Sensor edge\)", r"Temperature \(Sensor junction\)"
                ),
                "memory_used_mib": None,
                "memory_total_mib": None,
                "utilization_pct": _rocm_field(card, r"^GPU use \(%\)"),
                "memory_used_pct": _rocm_field(
                    card, r"GPU Memory Allocated \(VRAM%\)", r"GPU memory use \(%\)"
                ),
            }
        )
    return out


@dataclass(frozen=True)
class Source:
    """A vendor tool that answers: its name, its command line and its parser."""

    tool: str
    argv: tuple[str, ...]
    parse: Callable[[str], list[dict[str, Any]]]

    def read(self, timeout: float = 10.0) -> list[dict[str, Any]]:
        run = subprocess.run(
            self.argv, capture_output=True, text=True, timeout=timeout, check=False
        )
        if run.returncode != 0:
            raise RuntimeError(f"{self.tool} exited {run.returncode}: {run.stderr.strip()[:200]}")
        readings = self.parse(run.stdout)
        if not readings:
            raise RuntimeError(f"{self.tool} reported no GPU")
        return readings


NO_TOOL = (
    "no GPU telemetry: neither nvidia-smi nor rocm-smi is on PATH (a CPU server has "
    "no clocks, power or temperature to record)"
)


def find(which: Callable[[str], str | None] = shutil.which) -> Source | None:
    """The first vendor tool on ``PATH`` (None: none, e.g. a CPU server)."""
    nvidia = which("nvidia-smi")
    if nvidia:
        argv = (nvidia, f"--query-gpu={_NVIDIA_QUERY}", "--format=csv,noheader,nounits")
        return Source("nvidia-smi", argv, parse_nvidia)
    rocm = which("rocm-smi")
    if rocm:
        flags = ("--showtemp", "--showpower", "--showuse", "--showmemuse", "--showclocks")
        return Source("rocm-smi", (rocm, *flags, "--json"), parse_rocm)
    return None


def describe(source: Source | None) -> dict[str, Any]:
    """What the result file says about telemetry, once per run."""
    if source is None:
        return {"source": None, "why": NO_TOOL}
    try:
        first = source.read()
    except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        return {"source": source.tool, "why": f"{source.tool} does not answer: {exc}"}
    return {"source": source.tool, "gpus": [{"gpu": r["gpu"], "name": r["name"]} for r in first]}


def summarize(readings: Sequence[Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """Readings over time (each a list with one entry a GPU) → per GPU, per field
    ``{"min", "mean", "max"}``; fields the tool never reported are left out."""
    per_gpu: dict[str, dict[str, list[float]]] = {}
    for reading in readings:
        for gpu in reading:
            fields = per_gpu.setdefault(str(gpu["gpu"]), {})
            for key, value in gpu.items():
                if key in ("gpu", "name") or not isinstance(value, int | float):
                    continue
                fields.setdefault(key, []).append(float(value))
    return {
        gpu: {
            key: {"min": min(v), "mean": round(sum(v) / len(v), 2), "max": max(v)}
            for key, v in sorted(fields.items())
        }
        for gpu, fields in sorted(per_gpu.items())
    }


class Sampler:
    """Reads ``source`` every ``interval`` seconds in a thread, from ``start()`` (which
    takes the first reading at once) to ``stop()`` (which takes a last one)."""

    def __init__(self, source: Source | None, interval: float = 1.0) -> None:
        self.source = source
        self.interval = interval
        self.readings: list[list[dict[str, Any]]] = []
        self.error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self) -> None:
        if self.source is None or self.error:
            return
        try:
            self.readings.append(self.source.read())
        except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
            self.error = f"{self.source.tool}: {exc}"

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._read()

    def start(self) -> Sampler:
        if self.source is not None:
            self._read()
            self._thread = threading.Thread(target=self._loop, daemon=True, name="telemetry")
            self._thread.start()
        return self

    def stop(self) -> dict[str, Any] | None:
        """The group's telemetry (None without a tool)."""
        if self.source is None:
            return None
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._read()
        return {
            "source": self.source.tool,
            "readings": len(self.readings),
            "seconds_between": self.interval,
            "gpus": summarize(self.readings),
            "error": self.error,
        }
