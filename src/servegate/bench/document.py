"""The result document of a bench run: its skeleton, the fingerprint that decides what
may be compared, per-case summaries and the flat performance table.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from servegate import __version__
from servegate.bench import fixtures, reference
from servegate.bench.cases import HARNESS, METRICS, SCHEMA, Spec
from servegate.bench.schema import Case, GroupReference, Result, metric_of
from servegate.pipeline.atomic import write_text


def new_result(s: Spec, scope: str, server_log: str | None) -> Result:
    """A new result document (schema :data:`SCHEMA`), status ``running``."""
    return {
        "schema": SCHEMA,
        "kind": "servegate.bench",
        "status": "running",
        "harness": {"name": HARNESS, "servegate_version": __version__},
        "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "finished_at": None,
        "error": "",
        "run": {
            "base_url": s.endpoint.shown_url,
            "model": s.model,
            "command": s.command,
            "system": s.system,
            "request_tag_scope": scope,
            "repetitions": s.repetitions,
            "max_tokens": s.max_tokens,
            "tolerance_pct": s.tolerance_pct,
            "ignore_eos": s.ignore_eos,
            "warmup": s.warmup,
            "sampling": asdict(s.sampling),
            "chat_template_kwargs": dict(s.chat_template_kwargs),
            "rules": asdict(s.rules),
            "window_log_patterns": list(s.window_log_patterns),
            "server_log": server_log,
        },
        "fixtures": {
            p: {
                "sha256": fixtures.load(p).sha256,
                "gzip_ratio": round(fixtures.load(p).gzip_ratio, 4),
                "sources": len(fixtures.load(p).sources),
                "licences": sorted({src["licence"] for src in fixtures.load(p).sources}),
            }
            for p in sorted({c.profile for c in s.cases})
        },
        "fingerprint": fingerprint(s),
        "engine": {},
        "sizing": {},
        "warmup": None,
        "cases": [],
        "performance_table": [],
    }


def fingerprint(spec: Spec) -> dict[str, Any]:
    """What must match for two runs' samples to be compared."""
    profiles = sorted({c.profile for c in spec.cases})
    parts = {
        "harness": HARNESS,
        "fixtures": {p: fixtures.load(p).sha256 for p in profiles},
        "instructions": hashlib.sha256(
            json.dumps({p: fixtures.INSTRUCTIONS[p] for p in profiles}).encode()
        ).hexdigest()[:16],
        "sampling": asdict(spec.sampling),
        "max_tokens": spec.max_tokens,
        "ignore_eos": spec.ignore_eos,
        "chat_template_kwargs": dict(spec.chat_template_kwargs),
        "cases": sorted(c.id for c in spec.cases),
    }
    parts["digest"] = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]
    return parts


def _median(values: Sequence[float]) -> float | None:
    return round(statistics.median(values), 6) if values else None


def summarize(case: Case) -> None:
    """Medians over the valid trials, validity, reason totals (in place)."""
    trials = [t for g in case["groups"] for t in g["trials"]]
    valid = [t for t in trials if t["performance_valid"]]
    summary: dict[str, Any] = {
        m: _median([v for t in valid if (v := metric_of(t, m)) is not None]) for m in METRICS
    }
    summary["prompt_tokens"] = _median([p for t in valid if (p := t["prompt_tokens"])])
    summary["trials"] = len(trials)
    summary["valid_trials"] = len(valid)
    totals: dict[str, int] = {}
    for t in trials:
        for code in t["invalid_reasons"]:
            totals[code] = totals.get(code, 0) + 1
    summary["invalid_reason_totals"] = dict(sorted(totals.items()))
    summary["performance_valid"] = bool(trials) and len(valid) == len(trials)
    groups = [g["totals"] for g in case["groups"] if g["totals"]["group_valid"]]
    summary["prefill_tps_total"] = _median(
        [v for g in groups if (v := g["prefill_tps_total"]) is not None]
    )
    summary["token_generation_tps_total"] = _median(
        [v for g in groups if (v := g["token_generation_tps_total"]) is not None]
    )
    summary["requests_per_minute"] = _median(
        [v for g in groups if (v := g["requests_per_minute"]) is not None]
    )
    case["summary"] = summary


def table(result: Result) -> list[dict[str, Any]]:
    """The flat per-case table (``performance_table``). A case cut off before its first
    group ended (a run that failed) has no summary yet: its row says it has no trials,
    so the run's own error is what the caller sees, not this table's."""
    rows = []
    for case in result["cases"]:
        s = case["summary"]
        rows.append(
            {
                "case": case["id"],
                "profile": case["profile"],
                "tier": case["tier"],
                "concurrency": case["concurrency"],
                "required": case["required"],
                **{m: s.get(m) for m in (*METRICS, "prompt_tokens")},
                "prefill_tps_total": s.get("prefill_tps_total"),
                "token_generation_tps_total": s.get("token_generation_tps_total"),
                "valid_trials": s.get("valid_trials", 0),
                "trials": s.get("trials", 0),
                "performance_valid": s.get("performance_valid", False),
                "invalid_reason_totals": s.get("invalid_reason_totals", {}),
            }
        )
    return rows


def group_reference(before: float | None, after: float | None) -> GroupReference | None:
    """The box's speed beside a group: the geometric mean of before and after."""
    if before is None or after is None:
        return None
    return {
        "before_gflops": round(before, 3),
        "after_gflops": round(after, 3),
        "rate": round((before * after) ** 0.5, 3),
        "workload": reference.workload(),
    }


def write_result(path: Path, result: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(result, indent=1) + "\n")
