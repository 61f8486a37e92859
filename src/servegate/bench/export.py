"""A result file in the formats other tools read.

- ``pytorch``: the PyTorch OSS benchmark database's records, one metric a record, one
  record a line (JSON lines), as ``vllm bench serve`` writes them for the field's
  dashboards: ``{"benchmark": {"name", "extra_info"}, "model": {"name"}, "metric":
  {"name", "benchmark_values", "extra_info"}}``. A bench file gives every valid trial's
  value of each metric per case (its samples); a load file one value a metric a point,
  named as vLLM names them (``median_ttft_ms``, ``p99_itl_ms``, ``request_throughput``…).
- ``csv``: one row a case (bench) or a load point (load), the same figures as columns.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from servegate.bench.cases import METRICS, SCHEMA
from servegate.bench.loadspec import KIND as LOAD_KIND
from servegate.errors import ResultFileError

#: load figures → (vLLM's name stem, factor to its unit)
_LOAD_LATENCIES = (("ttft_s", "ttft_ms", 1000.0), ("itl_ms", "itl_ms", 1.0),
                   ("tpot_ms", "tpot_ms", 1.0), ("e2el_s", "e2el_ms", 1000.0))  # fmt: skip
_STAT_NAMES = (("p50", "median"), ("mean", "mean"), ("p90", "p90"), ("p99", "p99"),
               ("max", "max"))  # fmt: skip
_LOAD_RATES = ("request_throughput", "output_throughput", "input_throughput", "goodput_rps")


def read(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ResultFileError(
            f"cannot read the result file {path}: {exc}",
            hint="pass a result file servegate bench or bench load wrote",
        ) from None
    kind = doc.get("kind") if isinstance(doc, dict) else None
    if kind not in ("servegate.bench", LOAD_KIND):
        raise ResultFileError(
            f"{path} is not a servegate result file (kind {kind!r})",
            hint="pass a result file servegate bench or bench load wrote",
        )
    if doc.get("schema") != SCHEMA:
        raise ResultFileError(
            f"{path}: result schema {doc.get('schema')!r}; this servegate reads {SCHEMA}",
            hint="convert it with the servegate that wrote it, or measure again",
        )
    why = damage(doc)
    if why:
        raise ResultFileError(
            f"{path} is damaged: {why}",
            hint="pass a file servegate bench or bench load wrote, unedited; a damaged file "
            "is not converted",
        )
    return dict(doc)


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def damage(doc: Mapping[str, Any]) -> str:
    """What in a result document the exports and the report cannot read ("": nothing):
    they take its figures as written, so a field of the wrong shape would crash them or
    drop a column without a word."""
    if doc["kind"] == LOAD_KIND:
        points = doc.get("points")
        if not isinstance(points, list):
            return "points is not a list"
        for i, p in enumerate(points):
            if not isinstance(p, dict):
                return f"point {i} is not an object"
            for key in ("value", "requests", "completed", "failed"):
                if not _number(p.get(key)):
                    return f"point {i}: {key} {p.get(key)!r} is not a number"
            if not isinstance(p.get("mode"), str):
                return f"point {i}: mode {p.get('mode')!r} is not text"
            for key in (*(k for k, _, _ in _LOAD_LATENCIES), "lag_ms"):
                if key not in p:
                    return f"point {i}: {key} is missing (null where nothing was measured)"
                stats = p.get(key)
                if stats is None:
                    continue
                if not isinstance(stats, dict):
                    return f"point {i}: {key} is not an object"
                odd = [k for k, v in stats.items() if not _number(v)]
                if odd:
                    return f"point {i}: {key}.{odd[0]} {stats[odd[0]]!r} is not a number"
            for key in _LOAD_RATES:
                if p.get(key) is not None and not _number(p[key]):
                    return f"point {i}: {key} {p[key]!r} is not a number"
        return ""
    cases = doc.get("cases")
    if not isinstance(cases, list):
        return "cases is not a list"
    for case in cases:
        if not isinstance(case, dict) or not all(k in case for k in ("id", "profile", "tier")):
            return "a case is not an object with id, profile and tier"
        groups = case.get("groups")
        if not isinstance(groups, list) or not all(
            isinstance(g, dict) and isinstance(g.get("trials"), list)
            and all(isinstance(t, dict) for t in g["trials"])
            for g in groups
        ):  # fmt: skip
            return f"case {case['id']}: groups is not a list of groups with trials"
    table = doc.get("performance_table")
    if table is not None and not (
        isinstance(table, list) and all(isinstance(r, dict) for r in table)
    ):
        return "performance_table is not a list of rows"
    return ""


def _load_figures(p: Mapping[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, stem, factor in _LOAD_LATENCIES:
        stats = p.get(key) or {}
        for stat, name in _STAT_NAMES:
            if isinstance(stats.get(stat), int | float):
                out[f"{name}_{stem}"] = round(stats[stat] * factor, 4)
    for key in _LOAD_RATES:
        if isinstance(p.get(key), int | float):
            out[key.replace("goodput_rps", "request_goodput")] = p[key]
    lag = p.get("lag_ms") or {}
    if isinstance(lag.get("p99"), int | float):
        out["p99_schedule_lag_ms"] = lag["p99"]
    return out


def _records(doc: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    run = doc.get("run") or {}
    bench = {
        "name": f"servegate {'load' if doc['kind'] == LOAD_KIND else 'bench'}",
        "extra_info": {
            "harness": doc.get("harness"),
            "command": run.get("command"),
            "system": run.get("system"),
            "max_tokens": run.get("max_tokens"),
            "started_at": doc.get("started_at"),
        },
    }
    model = {"name": run.get("model")}
    if doc["kind"] == LOAD_KIND:
        for p in doc.get("points") or []:
            where = {"mode": p["mode"], "load": p["value"], "workload": run.get("workload"),
                     "burstiness": run.get("burstiness"), "saturated": p.get("saturated"),
                     "requests": p["requests"], "failed": p["failed"],
                     "bursts": p.get("bursts"), "sweep_status": doc.get("status"),
                     "sweep_error": doc.get("error") or None}  # fmt: skip
            for name, value in _load_figures(p).items():
                yield {"benchmark": bench, "model": model,
                       "metric": {"name": name, "benchmark_values": [value],
                                  "extra_info": where}}  # fmt: skip
        return
    for case in doc.get("cases") or []:
        where = {"case": case["id"], "profile": case["profile"], "tier": case["tier"],
                 "concurrency": case["concurrency"]}  # fmt: skip
        trials = [t for g in case["groups"] for t in g["trials"] if t.get("performance_valid")]
        for metric in METRICS:
            values = [t[metric] for t in trials if isinstance(t.get(metric), int | float)]
            if values:
                yield {"benchmark": bench, "model": model,
                       "metric": {"name": metric, "benchmark_values": values,
                                  "extra_info": where}}  # fmt: skip


def pytorch(doc: Mapping[str, Any]) -> str:
    """The records as JSON lines."""
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in _records(doc))


def rows(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    if doc["kind"] == LOAD_KIND:
        out = []
        for p in doc.get("points") or []:
            row = {"mode": p["mode"], "load": p["value"], "requests": p["requests"],
                   "completed": p["completed"], "failed": p["failed"],
                   "bursts": p.get("bursts"), "saturated": p.get("saturated"),
                   "prefix_hit_rate": p.get("prefix_hit_rate"),
                   "prefix_hit_ideal": p.get("prefix_hit_ideal"),
                   "sweep_status": doc.get("status")}  # fmt: skip
            row.update(_load_figures(p))
            out.append(row)
        return out
    return [dict(r) for r in doc.get("performance_table") or []]


def to_csv(doc: Mapping[str, Any]) -> str:
    table = rows(doc)
    columns: list[str] = []
    for row in table:
        columns += [k for k in row if k not in columns]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in table:
        writer.writerow(row)
    return buf.getvalue()


def default_path(path: Path, fmt: str) -> Path:
    return path.with_suffix(".pytorch.jsonl" if fmt == "pytorch" else ".csv")
