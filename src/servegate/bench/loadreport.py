"""What a load sweep's points say: percentiles, the per-point summary, where the server
saturated and the knee before it, and the tables ``bench load`` prints.
:mod:`servegate.bench.load` measures the points; :mod:`servegate.bench.loadspec` says
what was asked for."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from servegate.bench.loadspec import MIN_STEADY, PERCENTILES, LoadSpec


def percentiles(values: Sequence[float], digits: int = 4) -> dict[str, float] | None:
    """p50/p90/p99 (linear between the closest ranks, as numpy's default), max and
    mean; None for no values."""
    if not values:
        return None
    s = sorted(values)

    def at(p: float) -> float:
        k = (len(s) - 1) * p / 100
        lo, hi = math.floor(k), math.ceil(k)
        return s[lo] + (s[hi] - s[lo]) * (k - lo)

    out = {f"p{p}": round(at(p), digits) for p in PERCENTILES}
    out["max"] = round(s[-1], digits)
    out["mean"] = round(sum(s) / len(s), digits)
    return out


def summarize(
    records: Sequence[Mapping[str, Any]],
    gaps: Sequence[float],
    spec: LoadSpec,
    value: float,
    wall: float,
    ramp_cap: float | None = None,
) -> dict[str, Any]:
    """One point's figures from its requests. ``ramp_cap``: the lightest point's median
    E2E, where the ramp of a later point ends at the latest."""
    ok = [r for r in records if r["ok"]]
    ends = [r["ended_s"] for r in ok if r["ended_s"] is not None]
    span = max(ends) if ends else wall
    out_tokens = sum(r["completion_tokens"] or 0 for r in ok)
    in_tokens = sum(r["prompt_tokens"] or 0 for r in ok if isinstance(r["prompt_tokens"], int))
    good = [r for r in ok if spec.slo.met(r)]
    # the requests in flight ramp up from none over the first E2E of every point, even on
    # a server with room to spare: only arrivals after that ramp show whether it grew. A
    # saturated point's own E2E grows with its queue (past the point's end, when the queue
    # is long): its ramp ends by the lightest point's E2E, or the growth would be hidden;
    # and, on the lightest point itself, by the E2E of its first arrivals (they met no
    # queue)
    e2els = sorted(r["e2el_s"] for r in ok if r["e2el_s"] is not None)
    ramp = e2els[len(e2els) // 2] if e2els else 0.0
    if ramp_cap is not None:
        ramp = min(ramp, ramp_cap)
    early = sorted(r["e2el_s"] for r in records[:3] if r["ok"] and r["e2el_s"] is not None)
    if early:
        ramp = min(ramp, early[len(early) // 2])
    steady = [r for r in records if r["due_s"] >= ramp]
    thirds = max(1, len(steady) // 3)
    first = [r["in_flight_at_send"] for r in steady[:thirds]]
    last = [r["in_flight_at_send"] for r in steady[-thirds:]]
    return {
        "mode": spec.mode,
        "value": value,
        "offered_rps": value if spec.mode == "rate" else None,
        "requests": len(records),
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "short": sum(1 for r in ok if not r["full_length"]),
        # answers that came in a burst: no ITL or TPOT, so no ITL or TPOT SLO met
        "bursts": sum(1 for r in ok if r.get("client_timing")),
        "errors": sorted({r["error"] for r in records if r["error"]})[:5],
        "duration_s": round(span, 4),
        "request_throughput": round(len(ok) / span, 4) if span > 0 else None,
        "output_throughput": round(out_tokens / span, 3) if span > 0 else None,
        "input_throughput": round(in_tokens / span, 3) if span > 0 else None,
        "ttft_s": percentiles([r["ttft_s"] for r in ok if r["ttft_s"] is not None], 6),
        "itl_ms": percentiles(list(gaps)),
        "request_itl_ms": percentiles([r["itl_ms"] for r in ok if r["itl_ms"] is not None]),
        "tpot_ms": percentiles([r["tpot_ms"] for r in ok if r["tpot_ms"] is not None]),
        "e2el_s": percentiles([r["e2el_s"] for r in ok if r["e2el_s"] is not None], 6),
        "slo": spec.slo.given(),
        "goodput_rps": round(len(good) / span, 4) if spec.slo.given() and span > 0 else None,
        "good_requests": len(good) if spec.slo.given() else None,
        "lag_ms": percentiles([r["lag_ms"] for r in records]) if spec.mode == "rate" else None,
        "in_flight": {
            "first_third_mean": round(sum(first) / len(first), 2) if first else 0.0,
            "last_third_mean": round(sum(last) / len(last), 2) if last else 0.0,
            "max": max((r["in_flight_at_send"] for r in records), default=0),
            "steady_from_s": round(ramp, 3),
            "steady_arrivals": len(steady),
        },
    }


def ideal_hit_rate(records: Sequence[Mapping[str, Any]], share: float) -> float | None:
    """The hit rate a prefix cache that forgot nothing would have had over these
    requests, in the order they were sent: each prompt's shared head (``share`` of its
    tokens) is served as far as an earlier prompt's head reached; the first prompt, and
    the part of a longer head no earlier prompt had, miss. With a few requests of mixed
    lengths that is well under ``share``: the target is what many requests approach."""
    sizes: list[int] = [
        r["prompt_tokens"] for r in records if isinstance(r.get("prompt_tokens"), int)
    ]
    if not sizes or not sum(sizes):
        return None
    hit, reach = 0.0, 0.0
    for tokens in sizes:
        head = share * tokens
        hit += min(head, reach)
        reach = max(reach, head)
    return round(hit / sum(sizes), 4)


def saturation(
    p: Mapping[str, Any],
    first: Mapping[str, Any] | None,
    previous: Mapping[str, Any] | None,
    spec: LoadSpec,
) -> str:
    """Why the point ``p`` saturated the server ("" : it did not)."""
    if p["requests"] == 0:
        return ""
    if p["failed"]:
        return f"{p['failed']} of {p['requests']} request(s) failed: {'; '.join(p['errors'][:2])}"
    flight = p["in_flight"]
    steady = flight.get("steady_arrivals", p["requests"]) >= MIN_STEADY
    if (
        spec.mode == "rate"
        and steady
        and flight["last_third_mean"] >= 2 * flight["first_third_mean"] + 1
    ):
        return (
            f"the queue grew through the point: {flight['first_third_mean']:g} request(s) in "
            f"flight at arrival in the first third after the ramp, "
            f"{flight['last_third_mean']:g} in the last"
        )
    ttft, ttft0 = p["ttft_s"], first["ttft_s"] if first else None
    if ttft and ttft0 and ttft["p50"] >= spec.ttft_growth * ttft0["p50"]:
        return (
            f"TTFT p50 {ttft['p50']:.3g}s is {ttft['p50'] / ttft0['p50']:.1f}x the first "
            f"point's {ttft0['p50']:.3g}s"
        )
    if spec.mode == "concurrency" and previous and previous["request_throughput"]:
        now, was = p["request_throughput"] or 0.0, previous["request_throughput"]
        if now < was * (1 + spec.min_gain):
            return (
                f"{p['value']:g} clients bought {now / was - 1:+.0%} throughput over "
                f"{previous['value']:g} ({now:.3g} vs {was:.3g} req/s)"
            )
    return ""


def knee(points: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The last point before the first saturated one (None: the first saturated, or
    none did and the sweep may not have reached it)."""
    for i, p in enumerate(points):
        if p["saturated"]:
            if i == 0:
                return {"value": None, "saturated_at": p["value"], "why": p["why"],
                        "what": "the lightest point already saturated the server"}  # fmt: skip
            before = points[i - 1]
            return {
                "value": before["value"],
                "request_throughput": before["request_throughput"],
                "saturated_at": p["value"],
                "why": p["why"],
                "what": f"the server took {before['value']:g} and saturated at {p['value']:g}",
            }
    return None


def _f(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def _p(d: Mapping[str, float] | None, key: str, digits: int = 2) -> str:
    return "-" if not d else _f(d.get(key), digits)


def line(p: Mapping[str, Any]) -> str:
    """One point in a progress line."""
    unit = "req/s" if p["mode"] == "rate" else "clients"
    state = f"SATURATED — {p['why']}" if p.get("saturated") else "ok"
    return (
        f"load {p['value']:g} {unit}: {p['completed']}/{p['requests']} done, "
        f"{_f(p['request_throughput'])} req/s, TTFT p50 {_p(p['ttft_s'], 'p50', 3)}s "
        f"p99 {_p(p['ttft_s'], 'p99', 3)}s — {state}"
    )


def tables(points: Sequence[Mapping[str, Any]]) -> list[tuple[list[str], list[list[str]]]]:
    """Two tables: what the load got (throughput, goodput, lag), what a request felt
    (latency percentiles)."""
    load_rows, latency_rows = [], []
    for p in points:
        flight = p["in_flight"]
        load_rows.append([
            f"{p['value']:g}", f"{p['completed']}/{p['requests']}", f"{p.get('bursts', 0)}",
            _f(p["request_throughput"]), _f(p["output_throughput"], 1), _f(p["goodput_rps"]),
            f"{flight['max']}", _p(p["lag_ms"], "p99", 3),
            f"SATURATED: {p['why']}" if p.get("saturated") else "ok",
        ])  # fmt: skip
        latency_rows.append([
            f"{p['value']:g}",
            _p(p["ttft_s"], "p50", 3), _p(p["ttft_s"], "p90", 3), _p(p["ttft_s"], "p99", 3),
            _p(p["itl_ms"], "p50", 1), _p(p["itl_ms"], "p99", 1),
            _p(p["tpot_ms"], "p50", 1), _p(p["tpot_ms"], "p99", 1),
            _p(p["e2el_s"], "p50", 2), _p(p["e2el_s"], "p99", 2), _p(p["e2el_s"], "max", 2),
        ])  # fmt: skip
    return [
        (["load", "done", "bursts", "req/s", "out tok/s", "goodput req/s", "in flight max",
          "lag p99 ms", "state"], load_rows),
        (["load", "TTFT p50 s", "p90", "p99", "ITL p50 ms", "p99", "TPOT p50 ms", "p99",
          "E2E p50 s", "p99", "max"], latency_rows),
    ]  # fmt: skip
