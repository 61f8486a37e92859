"""Result files as samples: servegate's own, and llm-context-bench's (schema 7 and 8).

Both become :class:`Samples`: per case, the per-trial values of every metric from the
valid trials, whether the case was valid, and why not. A gate or a comparison only
ever reads samples, so a team's existing llm-context-bench numbers count as a
baseline or a candidate.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servegate import documents
from servegate.bench.cases import METRICS, SCHEMA
from servegate.bench.tiers import TIERS
from servegate.errors import ResultFileError

LCB_SCHEMAS = (7, 8)
#: llm-context-bench's trial keys → servegate's metric names (same definitions)
LCB_METRICS = {m: m for m in METRICS}


def spread(total: int, starts: int) -> list[int]:
    """``total`` repetitions over ``starts`` service starts, as even as they go."""
    starts = max(1, min(starts, total))
    return [total // starts + (1 if i < total % starts else 0) for i in range(starts)]


@dataclass
class CaseSamples:
    id: str
    required: bool = True
    valid: bool = True
    trials: int = 0
    metrics: dict[str, list[float]] = field(default_factory=dict)
    reasons: dict[str, int] = field(default_factory=dict)
    #: the box's speed beside each group (the reference workload's rate); empty: not measured
    reference: list[float] = field(default_factory=list)
    #: what the reference readings measured (:func:`servegate.bench.reference.workload`);
    #: readings of different workloads are never compared
    reference_workload: str = ""
    #: how many service starts the samples come from (the gate may spread them)
    starts: int = 1
    #: per metric, the valid trials without a value (a burst's dropped client timings,
    #: a group the engine's histograms did not count): the samples are the rest
    missing: dict[str, int] = field(default_factory=dict)
    #: per metric, the service start each sample was measured in (parallel to
    #: ``metrics``); empty: not kept (an older record, another harness)
    blocks: dict[str, list[int]] = field(default_factory=dict)

    def blocks_of(self, metric: str) -> list[int] | None:
        """Each sample's service start, where known; else, for samples that a record says
        came from several starts without saying which, spread in order as the gate
        measured them (even chunks); None: one start."""
        values = self.metrics.get(metric) or []
        known = self.blocks.get(metric)
        if known is not None and len(known) == len(values):
            return known
        if self.starts <= 1 or len(values) < 2:
            return None
        return [i for i, size in enumerate(spread(len(values), self.starts)) for _ in range(size)]

    def as_dict(self) -> dict[str, Any]:
        return {
            "required": self.required,
            "valid": self.valid,
            "trials": self.trials,
            "metrics": self.metrics,
            "reasons": self.reasons,
            "reference": self.reference,
            "reference_workload": self.reference_workload,
            "starts": self.starts,
            "missing": self.missing,
            "blocks": self.blocks,
        }


@dataclass
class Samples:
    source: str
    harness: str
    fingerprint: dict[str, Any]
    cases: dict[str, CaseSamples]
    status: str = "complete"

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "harness": self.harness,
            "fingerprint": self.fingerprint,
            "status": self.status,
            "cases": {k: v.as_dict() for k, v in self.cases.items()},
        }


@dataclass
class _Kept:
    """Samples as a release record keeps them (:meth:`Samples.as_dict`)."""

    harness: str
    fingerprint: dict[str, Any]
    #: per case id, a :class:`CaseSamples` without its id
    cases: dict[str, Any]
    status: str = "complete"
    source: str = ""


def from_record(doc: Any, source: str) -> Samples:
    """Samples kept in a release record (the inverse of :meth:`Samples.as_dict`), read by
    the strict document reader: a field of the wrong type (a note edited by hand, a
    damaged record) is a :class:`servegate.documents.DocumentError` that names it, never
    a value coerced ("no" read as true, "12" as 12)."""
    kept = documents.read(_Kept, doc, "samples")
    cases: dict[str, CaseSamples] = {}
    for cid, case in kept.cases.items():
        where = f"samples.cases.{cid}"
        if isinstance(case, dict) and "id" in case:
            raise documents.DocumentError(f"{where}.id", "is not a field of this document")
        cases[cid] = documents.read(CaseSamples, {"id": cid, **case} if isinstance(case, dict)
                                    else case, where)  # fmt: skip
        why = _impossible(cases[cid])
        if why:
            raise documents.DocumentError(where, why)
    return Samples(source, kept.harness, kept.fingerprint, cases, kept.status)


def _impossible(cs: CaseSamples) -> str:
    """What a recorded case claims that no bench measures ("": nothing): types aside, the
    counts must agree. More samples than trials, or more service starts than trials,
    would narrow the gate's interval (a side spread over many starts carries less of the
    restart offset); a reference reading must be a rate."""
    if cs.trials < 0 or not 1 <= cs.starts <= max(1, cs.trials):
        return f"has {cs.starts} service start(s) for {cs.trials} trial(s)"
    for m, values in cs.metrics.items():
        if len(values) > cs.trials:
            return f"has {len(values)} samples of {m} from {cs.trials} trial(s)"
        if len(set(cs.blocks.get(m, []))) > cs.starts:
            return f"places the samples of {m} in more starts than its {cs.starts}"
    if not all(math.isfinite(r) and r > 0 for r in cs.reference):
        return "has a reference reading that is not a positive rate"
    if any(k < 0 for k in (*cs.missing.values(), *cs.reasons.values())):
        return "has a negative count"
    return ""


def from_result(doc: Mapping[str, Any], source: str = "") -> Samples:
    """servegate's own result document."""
    cases: dict[str, CaseSamples] = {}
    for case in doc.get("cases") or []:
        docs = case.get("groups") or []
        groups = [list(g.get("trials") or []) for g in docs]
        starts = [int(g.get("start", 0) or 0) for g in docs]
        flat = [t for g in groups for t in g]
        cs = _case(case["id"], bool(case.get("required", True)), flat,
                   [s for g, s in zip(groups, starts, strict=True) for _ in g])  # fmt: skip
        if any(len(g) > 1 for g in groups):
            cs.metrics, cs.blocks = _per_group(groups, starts)
        refs = [
            g["reference"]
            for g in case.get("groups") or []
            if isinstance(g.get("reference"), dict) and g["reference"].get("rate")
        ]
        cs.reference = [float(r["rate"]) for r in refs]
        kinds = {str(r.get("workload") or "") for r in refs}
        cs.reference_workload = kinds.pop() if len(kinds) == 1 else ""
        cs.starts = max(1, len({g.get("start", 0) for g in case.get("groups") or []}))
        cases[cs.id] = cs
    fp = dict(doc.get("fingerprint") or {})
    return Samples(source, str(doc.get("harness", {}).get("name")), fp, cases,
                   str(doc.get("status")))  # fmt: skip


def _case(
    cid: str, required: bool, trials: list[Mapping[str, Any]], starts: list[int] | None = None
) -> CaseSamples:
    """``starts``: each trial's service start (None: not known)."""
    cs = CaseSamples(cid, required, valid=bool(trials), trials=len(trials))
    absent: dict[str, int] = {}  # valid trials that leave the metric out
    for i, t in enumerate(trials):
        if not t.get("performance_valid"):
            cs.valid = False
            for code in t.get("invalid_reasons") or ["invalid"]:
                cs.reasons[code] = cs.reasons.get(code, 0) + 1
            continue
        for m in METRICS:
            v = t.get(m)
            if isinstance(v, int | float) and not isinstance(v, bool):
                cs.metrics.setdefault(m, []).append(float(v))
                if starts is not None:
                    cs.blocks.setdefault(m, []).append(starts[i])
            elif v is None:  # dropped where the trial names it; absent: see below
                into = cs.missing if m in t else absent
                into[m] = into.get(m, 0) + 1
            else:  # a damaged file (ResultFileError, exit 14), never a measurement of 0
                raise TypeError(f"case {cid} trial {i + 1}: {m} is a {type(v).__name__}")
    # a metric the case's other valid trials measured is missing where a trial leaves it
    # out (another tool's file): else the rest would be judged as if they were all
    for m, k in absent.items():
        if m in cs.metrics:
            cs.missing[m] = cs.missing.get(m, 0) + k
    # an engine-clock metric no valid trial has is not measured here (no engine clock):
    # nothing missing. A client-clock metric always is: no trial keeping it means every
    # timing was dropped (bursts, a client kept off its CPU), and the gate says so.
    cs.missing = {
        m: k for m, k in cs.missing.items() if m in cs.metrics or not m.startswith("engine_")
    }
    return cs


def _per_group(
    groups: list[list[Mapping[str, Any]]], starts: list[int]
) -> tuple[dict[str, list[float]], dict[str, list[int]]]:
    """One sample per group and metric: the geometric mean of the group's trials.

    At concurrency above 1 the streams of a group share the box and the engine's batches,
    and the engine-clock rates are the group's mean copied onto each of its trials: the
    trials of one group are not independent samples. Counted one by one, 3 groups of 4
    streams are 12 samples holding 3 values, and the gate's interval shrinks by about
    half (an unchanged release FAILed 30 % of checks at a group CV of 4 %). The groups
    are the repetitions; the gate judges one value each. Only valid trials count (an
    invalid one makes the case invalid anyway). Beside them, each sample's service start."""
    out: dict[str, list[float]] = {}
    blocks: dict[str, list[int]] = {}
    for trials, start in zip(groups, starts, strict=True):
        for m in METRICS:
            vals = [
                float(v)
                for t in trials
                if t.get("performance_valid")
                and isinstance(v := t.get(m), int | float)
                and not isinstance(v, bool)
            ]
            if not vals:
                continue
            if all(math.isfinite(v) and v > 0 for v in vals):
                vals = [math.exp(math.fsum(map(math.log, vals)) / len(vals))]
            # else not a measurement: kept as is, for the gate to refuse by name
            out.setdefault(m, []).extend(vals)
            blocks.setdefault(m, []).extend([start] * len(vals))
    return out, blocks


def _tier_of(nominal: Any) -> str | None:
    for name, n in TIERS.items():
        if nominal == n:
            return name
    return None


def from_llm_context_bench(doc: Mapping[str, Any], source: str = "") -> Samples:
    """An llm-context-bench result (``benchmark_schema_version`` 7 or 8).

    Read as it writes them: the requested output length per case
    (``performance.max_tokens``), at concurrency above 1 the groups its trials belong to
    (``group_id``: one sample a group, as for servegate's own files), and what the
    fixtures and sampling were (``suite_sha256``, each case's ``performance.input_sha256``,
    ``performance_sampling`` per suite) — never assumed."""
    cases: dict[str, CaseSamples] = {}
    suites = doc.get("suites")
    if not isinstance(suites, dict):
        raise ResultFileError(f"{source}: llm-context-bench result without 'suites'")
    lengths: set[int] = set()
    fixtures: dict[str, str] = {}
    sampling: dict[str, Any] = {}
    for suite, body in suites.items():
        body = body or {}
        if body.get("suite_sha256"):
            fixtures[f"suite:{suite}"] = str(body["suite_sha256"])
        if body.get("performance_sampling") is not None:
            sampling[suite] = body["performance_sampling"]
        for case in body.get("cases") or []:
            perf = case.get("performance")
            if not isinstance(perf, dict):
                continue
            tier = _tier_of(case.get("nominal_input_tokens"))
            if tier is None:
                continue
            conc = int(perf.get("concurrency") or 1)
            cid = f"{suite}-{tier}" + (f"-c{conc}" if conc > 1 else "")
            trials = list(perf.get("trials") or [])
            cs = _case(cid, True, trials)
            if conc > 1:  # the streams of a group share the box: one sample a group
                groups: dict[str, list[Mapping[str, Any]]] = {}
                for i, t in enumerate(trials):
                    groups.setdefault(str(t.get("group_id", f"trial-{i}")), []).append(t)
                grouped = list(groups.values())
                cs.metrics, cs.blocks = _per_group(grouped, [0] * len(grouped))
            cases[cid] = cs
            wanted = perf.get("max_tokens") or (perf.get("summary") or {}).get(
                "required_output_tokens"
            )
            if isinstance(wanted, int) and not isinstance(wanted, bool):
                lengths.add(wanted)
            if perf.get("input_sha256"):
                fixtures[cid] = str(perf["input_sha256"])
    fp = {
        "harness": f"llm-context-bench/{doc.get('benchmark_schema_version')}",
        "fixtures": fixtures,
        "sampling": sampling,
        # one output length for the whole file, or none known (never assumed)
        "max_tokens": lengths.pop() if len(lengths) == 1 else None,
        "cases": sorted(cases),
        "digest": "",
    }
    return Samples(source, str(fp["harness"]), fp, cases, str(doc.get("status")))


def load(path: Path) -> Samples:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultFileError(f"result file {path} not found") from None
    except (OSError, ValueError) as exc:
        raise ResultFileError(
            f"result file {path} is not JSON: {exc}",
            hint="a result file is rewritten atomically; this one is damaged or not a result",
        ) from None
    if not isinstance(doc, dict):
        raise ResultFileError(f"result file {path} is not a JSON object")
    try:
        return _parse(path, doc)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a field of a wrong shape
        raise ResultFileError(
            f"result file {path} has a field of the wrong shape ({type(exc).__name__}: {exc})",
            hint="it was edited or written by another tool; re-run the bench for a fresh one",
        ) from None


def _parse(path: Path, doc: dict[str, Any]) -> Samples:
    if not isinstance(doc.get("fingerprint", {}), dict):
        raise TypeError(f"fingerprint is a {type(doc['fingerprint']).__name__}, not an object")
    if doc.get("kind") == "servegate.bench":
        if doc.get("schema") != SCHEMA:
            raise ResultFileError(
                f"{path}: servegate bench schema {doc.get('schema')!r}, this servegate reads "
                f"{SCHEMA}",
                hint="upgrade servegate or re-run the bench",
            )
        return from_result(doc, str(path))
    if "benchmark_schema_version" in doc:
        if doc["benchmark_schema_version"] not in LCB_SCHEMAS:
            raise ResultFileError(
                f"{path}: llm-context-bench schema {doc['benchmark_schema_version']!r}; "
                f"servegate reads {', '.join(map(str, LCB_SCHEMAS))}"
            )
        return from_llm_context_bench(doc, str(path))
    if doc.get("kind") == "servegate.load":
        raise ResultFileError(
            f"{path} is a load sweep (servegate bench load), not a bench result",
            hint='sweeps are judged by the load gate check (gate.checks = [..., "load"] with '
            "[[load.rules]]) and drawn by servegate report; bench gate and compare read the "
            "files of `servegate bench --output`",
        )
    raise ResultFileError(
        f"{path} is neither a servegate bench result nor an llm-context-bench result",
        hint="pass the JSON file written by `servegate bench --output` or llm-context-bench",
    )


def lenient_differences(base: Samples, cand: Samples) -> list[str]:
    """What a lenient comparison allows and must say: the harnesses, the fixtures and the
    sampling that differ (each side's as recorded)."""
    fb, fc = base.fingerprint, cand.fingerprint
    out = []
    if base.harness != cand.harness:
        out.append(f"harness {base.harness} vs {cand.harness}")
    for key in ("fixtures", "sampling"):
        if fb.get(key) != fc.get(key):
            known = [s.source or s.harness for s, f in ((base, fb), (cand, fc)) if not f.get(key)]
            out.append(
                f"{key} differ" + (f" (not recorded by {', '.join(known)})" if known else "")
            )
    return out


def check_comparable(base: Samples, cand: Samples, lenient: bool = False) -> list[str]:
    """Why two sample sets may not be compared ([] if they may).

    Strict: the fingerprints' digests match. Lenient (``--lenient``, e.g. an
    llm-context-bench baseline): harness and fixture differences are allowed and
    reported, but the output length and a shared case must still match.
    """
    fb, fc = base.fingerprint, cand.fingerprint
    if not lenient:
        if fb.get("digest") and fb.get("digest") == fc.get("digest"):
            return []
        diffs = [k for k in sorted(set(fb) | set(fc)) if k != "digest" and fb.get(k) != fc.get(k)]
        return [f"fingerprints differ in: {', '.join(diffs) or 'digest'}"]
    problems = []
    for samples, fp in ((base, fb), (cand, fc)):
        if fp.get("max_tokens") is None:
            problems.append(
                f"{samples.source or samples.harness} does not record one output length "
                "(max_tokens): rates at different lengths are not comparable"
            )
    if not problems and fb.get("max_tokens") != fc.get("max_tokens"):
        problems.append(f"max_tokens {fb.get('max_tokens')} vs {fc.get('max_tokens')}")
    if not set(base.cases) & set(cand.cases):
        problems.append(
            f"no case in common ({', '.join(sorted(base.cases))} vs "
            f"{', '.join(sorted(cand.cases))})"
        )
    return problems
