"""Prometheus text → sums per metric name, and the deltas the bench reads across a window."""

from __future__ import annotations

import re
from collections.abc import Mapping

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LE = re.compile(r'le="([^"]*)"')
#: a histogram bucket's key in :func:`parse`'s answer: the series name, then its bound
BUCKET = "{name}_bucket|le={le}"

# the series' names come from the engine's adapter (servegate.engine.adapters)


def parse(text: str) -> dict[str, float]:
    """Every sample summed over its labels (``name`` → value); a histogram's buckets
    also per bound (``BUCKET``: ``name_bucket|le=0.5``), summed over the other labels."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + value
        le = _LE.search(m.group(2) or "") if m.group(1).endswith("_bucket") else None
        if le:
            key = f"{m.group(1)}|le={le.group(1)}"
            out[key] = out.get(key, 0.0) + value
    return out


def bucket_deltas(
    before: Mapping[str, float], after: Mapping[str, float], names: tuple[str, ...] | str
) -> list[tuple[float, float]]:
    """A histogram's observations between two scrapes, per bucket: ``(bound, how many
    were at or under it)``, by bound, ``+Inf`` left out ([]: no buckets)."""
    for name in (names,) if isinstance(names, str) else names:
        prefix = f"{name}_bucket|le="
        found = []
        for key, value in after.items():
            if key.startswith(prefix) and key in before:
                try:
                    bound = float(key[len(prefix) :])
                except ValueError:
                    continue
                if bound != float("inf"):
                    found.append((bound, value - before[key]))
        if found:
            return sorted(found)
    return []


def first(sample: Mapping[str, float], names: tuple[str, ...] | str) -> float | None:
    for name in (names,) if isinstance(names, str) else names:
        if name in sample:
            return sample[name]
    return None


def delta(
    before: Mapping[str, float], after: Mapping[str, float], names: tuple[str, ...] | str
) -> float | None:
    a, b = first(after, names), first(before, names)
    return None if a is None or b is None else a - b


def histogram_mean_delta(
    before: Mapping[str, float], after: Mapping[str, float], names: tuple[str, ...] | str
) -> tuple[float, float] | None:
    """(mean, count) of a histogram's observations made between two scrapes."""
    for name in (names,) if isinstance(names, str) else names:
        s = delta(before, after, name + "_sum")
        c = delta(before, after, name + "_count")
        if s is not None and c:
            return s / c, c
    return None
