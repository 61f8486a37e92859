"""Prometheus text → sums per metric name, and the deltas the bench reads across a window.

The text is read by the Prometheus client library's own parser (``prometheus_client``:
label values with ``}``, ``"`` or escapes, comments and types as the format defines
them); a page it refuses as a whole (one malformed line, an engine's own extension) is
read line by line with the same parser, and the lines it refuses are left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client.parser import text_string_to_metric_families

#: a histogram bucket's key in :func:`parse`'s answer: the series name, then its bound
BUCKET = "{name}_bucket|le={le}"

# the series' names come from the engine's adapter (servegate.engine.adapters)


def _samples(text: str) -> Iterable[tuple[str, Mapping[str, str], float]]:
    try:
        return [
            (s.name, s.labels, float(s.value))
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]
    except ValueError:  # read what can be read: one bad line costs that line only
        found = []
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            try:
                for family in text_string_to_metric_families(line + "\n"):
                    found += [(s.name, s.labels, float(s.value)) for s in family.samples]
            except ValueError:
                continue
        return found


def parse(text: str) -> dict[str, float]:
    """Every sample summed over its labels (``name`` → value); a histogram's buckets
    also per bound (``BUCKET``: ``name_bucket|le=0.5``), summed over the other labels."""
    out: dict[str, float] = {}
    for name, labels, value in _samples(text):
        out[name] = out.get(name, 0.0) + value
        le = labels.get("le") if name.endswith("_bucket") else None
        if le is not None:
            key = f"{name}|le={le}"
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
