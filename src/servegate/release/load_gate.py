"""The ``load`` gate check: a load sweep of the candidate, judged against the live
release's sweep, rule by rule (``[[load.rules]]``: a percentile or goodput at a point).

A load point gives one p99, not a series of samples, so a row is judged on the
point's requests: the ratio of the candidate's figure to the baseline's, with its
interval from a bootstrap over each side's requests (2,000 resamples, seeded: the same
files give the same verdict). The decision is the bench rows' (``stats.decide``) on
that interval: FAIL when the figure is a loss beyond the midpoint of the tolerance and
its bound at the false-alarm level says the candidate is worse; PASS when it is within
the midpoint and its bound at the miss level keeps the loss under the tolerance;
otherwise INCONCLUSIVE, which rolls the release back (a p99 from a few dozen requests
rarely decides anything: give the point a longer ``duration``).

Rows are reported only (``REPORT``) unless ``required``. A required row without a
comparable baseline follows ``gate.no_baseline``; a point the candidate's sweep never
reached (it saturated earlier) while the baseline served it is a FAIL.

Each release's record keeps its sweep compactly (per point: every request's TTFT, ITL,
TPOT and E2E, whether it completed and met the SLOs, and the point's span), so the next
release has its baseline.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import math
import random
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from servegate.bench import load, stats
from servegate.bench.cases import spec_from_config
from servegate.bench.runner import Bench
from servegate.bench.verdict import FAIL, INCONCLUSIVE, PASS, REPORT
from servegate.config import Config, LoadRule
from servegate.engine.openai import Endpoint
from servegate.errors import BenchFailed, ConfigError
from servegate.pipeline.stages import Reporter
from servegate.release.bench_gate import results_dir
from servegate.release.record import host_id

CHECK = "load"
#: the gate's latency figures → the request row's field (``request_itl_ms`` is each
#: request's mean inter-token latency, as the sweep's ``request_itl_ms`` percentiles;
#: the sweep's pooled ``itl_ms`` gaps are not kept per request)
LATENCIES = {"ttft_s": "ttft_s", "request_itl_ms": "itl_ms", "tpot_ms": "tpot_ms",
             "e2el_s": "e2el_s"}  # fmt: skip
STATS = ("p50", "p90", "p99")
#: the figures made by the client's clock of a decode: an answer that came in a burst
#: (held back between the engine and the client) has none
DECODE = ("request_itl_ms", "tpot_ms")
RATES = ("goodput_rps", "request_throughput")
RESAMPLES = 2000
#: requests a point keeps in the record (a random subset beyond)
KEEP = 2000


def metric_names() -> list[str]:
    return [f"{m}.{s}" for m in LATENCIES for s in STATS] + list(RATES)


def lower_is_better(metric: str) -> bool:
    return metric.split(".")[0] in LATENCIES


def spec_of(cfg: Config) -> load.LoadSpec:
    return load.spec_from(cfg.load)


def check_config(cfg: Config) -> None:
    """A ``load`` gate check that cannot run is refused when the config is loaded."""
    lo = cfg.load
    if bool(lo.rates) == bool(lo.concurrencies):
        raise ConfigError(
            "the load gate check needs [load] rates or concurrencies (one of them)",
            hint="e.g. [load] rates = [0.5, 1, 2] and duration = 60",
        )
    spec = spec_of(cfg)
    spec.check()
    for i, rule in enumerate(lo.rules):
        where = f"load.rules[{i}]"
        if rule.metric not in metric_names():
            raise ConfigError(
                f"{where}.metric = {rule.metric!r} is not a load figure",
                hint=f"one of {', '.join(metric_names())}",
            )
        if rule.point not in spec.points:
            raise ConfigError(
                f"{where}.point = {rule.point:g} is not one of the sweep's points "
                f"({', '.join(f'{p:g}' for p in spec.points)})",
                hint="read a rule at a point the sweep measures",
            )
        if not 0 < rule.tolerance < 1:
            raise ConfigError(f"{where}.tolerance must be between 0 and 1 (0.10: 10 %)")
        if rule.metric == "goodput_rps" and not spec.slo.given():
            raise ConfigError(
                f"{where} reads goodput, but [load] goodput sets no SLO",
                hint='e.g. [load] goodput = "ttft:2s,itl:80ms"',
            )


def fingerprint(cfg: Config, bench_digest: str) -> str:
    """What must match for two sweeps to be compared: the sweep and the bench's prompts."""
    spec = spec_of(cfg)
    doc = {
        "load": {**dataclasses.asdict(spec), "stop_at_saturation": None},
        "bench": bench_digest,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def compact(point: Mapping[str, Any], window: float, rng: random.Random) -> dict[str, Any]:
    """A point's requests as the record keeps them; ``window``: the seconds the load was
    applied (the point's duration)."""
    rows = list(point.get("requests_detail") or [])
    if len(rows) > KEEP:
        rows = rng.sample(rows, KEEP)
    slo = load.Slo(**{k: v for k, v in (point.get("slo") or {}).items()})
    out: dict[str, Any] = {
        "value": float(point["value"]),
        "window_s": float(window),
        "requests": int(point["requests"]),
        "failed": int(point["failed"]),
        "kept": len(rows),
        "saturated": bool(point.get("saturated")),
        "ok": [bool(r["ok"]) for r in rows],
        "good": [slo.met(r) for r in rows] if slo.given() else None,
        "ended": [r["ended_s"] for r in rows],
        "burst": [bool(r.get("client_timing")) for r in rows],
    }
    for name, field in LATENCIES.items():
        out[name] = [r[field] for r in rows if r["ok"] and r[field] is not None]
    return out


def _count(p: Mapping[str, Any], name: str) -> float | None:
    """Requests that completed (``request_throughput``) or met the SLOs (``goodput_rps``)
    within the point's window, scaled up from a kept subset."""
    flags = p["ok"] if name == "request_throughput" else p.get("good")
    if flags is None:
        return None
    window = float(p["window_s"])
    inside = sum(
        1
        for f, end in zip(flags, p["ended"], strict=True)
        if f and end is not None and end <= window
    )
    return float(inside * p["requests"] / max(1, p["kept"]))


def figure(p: Mapping[str, Any], metric: str) -> float | None:
    """A rule's figure from a compact point (None: not measured there)."""
    name, _, stat = metric.partition(".")
    if name in LATENCIES:
        q = load.percentiles(p.get(name) or [], 6)
        return q[stat] if q else None
    count = _count(p, name)
    return None if count is None else count / float(p["window_s"])


def compare(
    base: Mapping[str, Any], cand: Mapping[str, Any], metric: str, seed: int = 0
) -> tuple[float, list[float]] | None:
    """(d, the bootstrap distribution of d): d = log of the candidate's figure over the
    baseline's, turned so that > 0 is better. None when either side has no figure.

    A latency percentile is resampled over the point's requests. A rate's count is drawn
    as Poisson around the count seen (an open loop's arrivals are Poisson; a closed
    loop's completions vary less, so this errs towards INCONCLUSIVE, not a false FAIL):
    resampling the requests' flags alone would give a healthy point no spread at all."""
    b, c = figure(base, metric), figure(cand, metric)
    if not b or not c or b <= 0 or c <= 0:
        return None
    sign = -1.0 if lower_is_better(metric) else 1.0
    d = sign * math.log(c / b)
    name = metric.split(".")[0]
    ds: list[float] = []
    if name in LATENCIES:
        rng = random.Random(seed)
        vb, vc = base[name], cand[name]
        for _ in range(RESAMPLES):
            rb = figure({name: rng.choices(vb, k=len(vb))}, metric)
            rc = figure({name: rng.choices(vc, k=len(vc))}, metric)
            if rb and rc and rb > 0 and rc > 0:
                ds.append(sign * math.log(rc / rb))
    else:
        draws = np.random.default_rng(seed)
        nb, nc = b * float(base["window_s"]), c * float(cand["window_s"])
        kb = draws.poisson(nb, RESAMPLES)
        kc = draws.poisson(nc, RESAMPLES)
        ratio_w = float(base["window_s"]) / float(cand["window_s"])
        ds = [sign * math.log(x / y * ratio_w) for x, y in zip(kc, kb, strict=True) if x and y]
    return (d, sorted(ds)) if len(ds) >= RESAMPLES // 2 else None


def problem(p: Any, duration: float | None = None) -> str:
    """Why a recorded point cannot be judged ("" : it can): a baseline is read from a
    release record, which a damaged or hand-edited note could make anything. Its counts
    must agree with its requests (a failed count the kept requests contradict, or a good
    request that failed, would move the gate's failed share and goodput), and its window
    must be the sweep's ``duration`` (what the fingerprint covers) where given."""
    if not isinstance(p, dict):
        return "a point is not an object"
    try:
        kept, requests = p["kept"], p["requests"]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (kept, requests)):
            return "requests and kept must be whole numbers"
        if not 0 <= kept <= requests:
            return f"kept {kept} of {requests} requests"
        if not isinstance(p["failed"], int) or not 0 <= p["failed"] <= requests:
            return "failed is not a count of its requests"
        window = p["window_s"]
        if not isinstance(window, int | float) or not math.isfinite(window) or window <= 0:
            return f"window {window!r} is not a positive number of seconds"
        if not isinstance(p["value"], int | float):
            return "the point's load is not a number"
        optional = tuple(k for k in ("good", "burst") if p.get(k) is not None)
        for key in ("ok", "ended", *optional):
            if not isinstance(p[key], list) or len(p[key]) != kept:
                return f"{key} does not hold one entry a kept request"
        flags = p["ok"] + (p.get("good") or []) + (p.get("burst") or [])
        if not all(isinstance(f, bool) for f in flags):
            return "ok, good and burst must be true or false"
        if any(b and not o for b, o in zip(p.get("burst") or [], p["ok"], strict=False)):
            return "a request that failed is counted a burst"
        failed_kept = p["ok"].count(False)
        if kept == requests and p["failed"] != failed_kept:
            return f"failed {p['failed']} but {failed_kept} of its requests failed"
        if p["failed"] < failed_kept or requests - p["failed"] < kept - failed_kept:
            return f"failed {p['failed']} of {requests} cannot hold the kept requests"
        if p.get("good") is not None and any(
            g and not o for g, o in zip(p["good"], p["ok"], strict=True)
        ):
            return "a request that failed is counted good"
        if duration is not None and not math.isclose(duration, window, rel_tol=1e-9):
            return f"window {window!r} s is not the sweep's {duration:g} s"
        for name in LATENCIES:
            values = p[name]
            if not isinstance(values, list) or not all(
                isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                and v >= 0 for v in values
            ):  # fmt: skip
                return f"{name} is not a list of finite non-negative numbers"
        for end in p["ended"]:
            if end is not None and not (isinstance(end, int | float) and math.isfinite(end)):
                return "ended must be seconds or null"
    except KeyError as exc:
        return f"a point has no {exc.args[0]}"
    return ""


def _q(sorted_values: Sequence[float], p: float) -> float:
    k = min(len(sorted_values) - 1, max(0, round(p * (len(sorted_values) - 1))))
    return sorted_values[k]


def _bursts(p: Mapping[str, Any]) -> int:
    return sum(1 for b in p.get("burst") or [] if b)


def judge(
    rule: LoadRule,
    base: Mapping[str, Any] | None,
    cand: Mapping[str, Any] | None,
    levels: stats.Levels,
    no_baseline: str,
    first_release: bool,
    decode_slo: bool = False,
) -> dict[str, Any]:
    """One rule's row. ``decode_slo``: the goodput SLOs include ITL or TPOT."""
    row: dict[str, Any] = {
        "metric": rule.metric, "point": rule.point, "required": rule.required,
        "tolerance": rule.tolerance, "baseline": None, "candidate": None, "ratio": None,
        "interval": None,
    }  # fmt: skip
    undecided = None if rule.required else REPORT
    if cand is None:
        if base is not None:
            row.update(verdict=undecided or FAIL,
                       why=f"the candidate's sweep saturated before {rule.point:g}, which "
                           "the baseline served")  # fmt: skip
        else:
            row.update(verdict=undecided or INCONCLUSIVE,
                       why=f"neither sweep reached {rule.point:g}")  # fmt: skip
        return row
    row["candidate"] = figure(cand, rule.metric)
    if base is None:
        if no_baseline == "first-release" and first_release:
            row.update(verdict=undecided or PASS, why="first release: nothing to compare with")
        else:
            why = "no comparable baseline sweep (never a pass on missing data)"
            row.update(verdict=undecided or FAIL, why=why)
        return row
    row["baseline"] = figure(base, rule.metric)
    cand_share = cand["failed"] / max(1, cand["requests"])
    base_share = base["failed"] / max(1, base["requests"])
    if cand["failed"] and cand_share > base_share:
        row.update(verdict=undecided or FAIL,
                   why=f"{cand['failed']} of {cand['requests']} request(s) failed at "
                       f"{rule.point:g} (the baseline: {base['failed']} of "
                       f"{base['requests']}): figures over the requests that completed "
                       "would hide them")  # fmt: skip
        return row
    name = rule.metric.split(".")[0]
    if name in DECODE or (name == "goodput_rps" and decode_slo):
        for side, p in (("candidate", cand), ("baseline", base)):
            if _bursts(p):
                row.update(verdict=undecided or INCONCLUSIVE,
                           why=f"{_bursts(p)} of the {side}'s {p['kept']} request(s) at "
                               f"{rule.point:g} arrived in a burst (held back between the "
                               "engine and the client): their decode was not timed, and a "
                               "figure over the others could hide them")  # fmt: skip
                return row
    got = compare(base, cand, rule.metric)
    if got is None:
        row.update(verdict=undecided or FAIL, why="no figure on one side: nothing measured")
        return row
    d, ds = got
    lo, hi = _q(ds, levels.beta), _q(ds, 1 - levels.alpha)
    sign = -1.0 if lower_is_better(rule.metric) else 1.0
    row["ratio"] = round(math.exp(sign * d), 4)  # the figure's own ratio (cand / base)
    bounds = sorted((math.exp(sign * lo), math.exp(sign * hi)))
    row["interval"] = [round(bounds[0], 4), round(bounds[1], 4)]
    m, t = stats.midpoint(rule.tolerance), math.log(1 - rule.tolerance)
    way = "slower" if lower_is_better(rule.metric) else "fewer"
    if d < m and hi < 0:
        verdict, why = FAIL, f"ratio {row['ratio']:.3f}: {way} beyond doubt"
    elif d >= m and lo >= t:
        verdict, why = PASS, f"ratio {row['ratio']:.3f}: no loss of {rule.tolerance:.0%}"
    else:
        verdict, why = (
            INCONCLUSIVE,
            (
                f"ratio {row['ratio']:.3f} in {row['interval']}: not decisive at "
                f"{rule.tolerance:.0%} (more requests at this point would tell)"
            ),
        )
    row.update(verdict=undecided or verdict, why=why)
    return row


def decide(
    cfg: Config,
    base: Mapping[str, Any] | None,
    cand: Mapping[str, Any],
    first_release: bool = False,
) -> dict[str, Any]:
    """The rows and the check's verdict (only required rows decide)."""
    rules = cfg.load.rules
    deciding = sum(1 for r in rules if r.required)
    levels = stats.Levels.split(cfg.gate.false_alarm, cfg.gate.miss, max(1, deciding), 1)
    points_b = {p["value"]: p for p in (base or {}).get("points", [])}
    points_c = {p["value"]: p for p in cand.get("points", [])}
    slo = spec_of(cfg).slo
    decode_slo = slo.itl_ms is not None or slo.tpot_ms is not None
    rows = [
        judge(r, points_b.get(r.point) if base else None, points_c.get(r.point), levels,
              cfg.gate.no_baseline, first_release, decode_slo)
        for r in rules
    ]  # fmt: skip
    required = [r for r in rows if r["required"]]
    verdicts = {r["verdict"] for r in required}
    if FAIL in verdicts:
        verdict = FAIL
    elif INCONCLUSIVE in verdicts:
        verdict = INCONCLUSIVE
    else:
        verdict = PASS
    picked = [r for r in required if r["verdict"] == verdict] if verdict != PASS else []
    why = "; ".join(f"{r['metric']} at {r['point']:g}: {r['why']}" for r in picked) or (
        f"{len(required)} required row(s) passed, {len(rows) - len(required)} reported"
    )
    return {"verdict": verdict, "why": why, "rows": rows}


def baseline(
    cfg: Config, previous_record: Mapping[str, Any] | None, digest: str
) -> tuple[dict[str, Any] | None, str]:
    if previous_record is None:
        return None, "no live release recorded"
    sha = str(previous_record.get("sha", ""))[:12]
    doc = None
    for check in (previous_record.get("gate") or {}).get("checks") or []:
        if check.get("name") == CHECK and isinstance(check.get("evidence"), dict):
            doc = check["evidence"].get("sweep")
    if not isinstance(doc, dict):
        return None, f"the live release {sha} has no recorded load sweep"
    theirs = previous_record.get("host_id") or f"hostname:{previous_record.get('host')}"
    if theirs != host_id(cfg):
        return None, f"the live release {sha} was measured on another host ({theirs})"
    if doc.get("fingerprint") != digest:
        return None, f"the live release {sha} swept differently (other [load] or [bench])"
    points = doc.get("points")
    why = "points is not a list" if not isinstance(points, list) else ""
    for p in points if isinstance(points, list) else []:
        why = why or problem(p, spec_of(cfg).duration_s)
    if why:
        return None, f"the live release {sha}'s recorded sweep is damaged: {why}"
    return doc, f"live release {sha}"


def run(
    cfg: Config,
    endpoint: Endpoint,
    model: str,
    sha: str,
    previous_record: Mapping[str, Any] | None,
    reporter: Reporter,
    environ: Mapping[str, str],
    *,
    command: str = "",
    first_release: bool = False,
    prepared: Callable[[Bench], None] | None = None,
) -> dict[str, Any]:
    """Sweep the candidate, judge it, and return the evidence (with its compact sweep)."""
    check_config(cfg)
    b = cfg.bench
    b = replace(b, tiers=cfg.load.tiers or b.tiers, max_tokens=cfg.load.max_tokens or b.max_tokens)
    spec = spec_from_config(b, endpoint, model, command, socket.gethostname())
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    output = results_dir(cfg) / f"{stamp}-{sha[:12]}-load.json"
    bench = Bench(spec, None, reporter, None, environ)
    digest = fingerprint(cfg, str(bench.result["fingerprint"]["digest"]))
    base, about = baseline(cfg, previous_record, digest)

    def label(bb: Bench) -> None:
        bb.result["run"]["release"] = sha
        if prepared:
            prepared(bb)

    evidence: dict[str, Any] = {"result_file": str(output), "baseline": about}
    try:
        result = load.run(bench, spec_of(cfg), output, reporter, label)
    except BenchFailed as exc:
        return {**evidence, "verdict": FAIL, "why": f"the load sweep could not run: {exc}",
                "rows": []}  # fmt: skip
    rng = random.Random(0)
    window = spec_of(cfg).duration_s
    sweep = {"fingerprint": digest,
             "points": [compact(p, window, rng) for p in result["points"]]}  # fmt: skip
    decision = decide(cfg, base, sweep, first_release)
    return {
        **evidence,
        **decision,
        "knee": result["knee"],
        "table": [{k: v for k, v in p.items() if k != "requests_detail"} for p in result["points"]],
        "sweep": sweep,
    }
