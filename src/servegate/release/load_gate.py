"""The ``load`` gate check: a load sweep of the candidate, judged against the live
release's sweep, rule by rule (``[[load.rules]]``: a percentile or goodput at a point).

A load point gives one p99, not a series of samples, so a row is judged on the
point's requests: the ratio of the candidate's figure to the baseline's, with its
interval from a bootstrap over each side's requests (2,000 resamples, seeded: the same
files give the same verdict). The decision is the bench rows' (``stats.decide``) on
that interval: FAIL when the figure is a loss beyond the midpoint of the tolerance and
its bound at the false-alarm level says the candidate is worse; PASS when it is within
the midpoint and its bound at the miss level keeps the loss under the tolerance;
otherwise INCONCLUSIVE, which rolls the release back. A failed request counts as slower
than any answer; a percentile decides only from enough requests to see its tail
(:func:`needed`); answers in a burst, TTFT on an engine without a TTFT clock and shorter
answers leave the rows they would bend undecided (docs/bench.md, "The load gate check").

Rows are reported only (``REPORT``) unless ``required``; a check without a required row
is refused (it could not fail). A required row without a comparable baseline follows
``gate.no_baseline``; a point the candidate's sweep never reached (it saturated earlier)
while the baseline served it is a FAIL.

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

from servegate import documents
from servegate.bench import load, loadspec
from servegate.bench.cases import spec_from_config
from servegate.bench.driver import Bench
from servegate.config import Config, LoadRule
from servegate.engine.openai import Endpoint
from servegate.errors import BenchFailed, ConfigError
from servegate.judging import stats
from servegate.judging.verdict import FAIL, INCONCLUSIVE, PASS, REPORT
from servegate.pipeline.stages import Reporter
from servegate.release.bench_gate import results_dir
from servegate.release.record import ReleaseRecord, host_id

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


@dataclasses.dataclass(frozen=True)
class Point:
    """One load point as a release record keeps it (the next release's baseline): per kept
    request whether it completed, met the SLOs, came in a burst or short, and when it
    ended; the completed requests' latencies. Read back through
    :func:`servegate.documents.read`; :func:`problem` checks what types cannot (counts
    that agree, finite values)."""

    #: the point's load: requests a second, or clients
    value: float
    #: the seconds the load was applied
    window_s: float
    requests: int
    failed: int
    #: the requests kept (all, or a random KEEP of them)
    kept: int
    ok: list[bool]
    ended: list[float | None]
    ttft_s: list[float]
    request_itl_ms: list[float]
    tpot_ms: list[float]
    e2el_s: list[float]
    saturated: bool = False
    #: met the SLOs (None: no SLO given)
    good: list[bool] | None = None
    #: answers whose decode came in a burst (not timed); records before it have none
    burst: list[bool] | None = None
    #: completed answers shorter than max_tokens
    short: list[bool] | None = None

    def latencies_of(self, name: str) -> list[float]:
        values: list[float] = getattr(self, name)
        return values


@dataclasses.dataclass(frozen=True)
class Sweep:
    """A release's load sweep as its record keeps it."""

    #: what must match for two sweeps to be compared (:func:`fingerprint`)
    fingerprint: str
    points: list[Point]
    #: the engine's TTFT clock checked every point's first texts (vLLM)
    first_text_checked: bool = False


def metric_names() -> list[str]:
    return [f"{m}.{s}" for m in LATENCIES for s in STATS] + list(RATES)


def lower_is_better(metric: str) -> bool:
    return metric.split(".")[0] in LATENCIES


def spec_of(cfg: Config) -> loadspec.LoadSpec:
    return loadspec.spec_from(cfg.load, config=True)


def check_config(cfg: Config) -> None:
    """A ``load`` gate check that cannot run is refused when the config is loaded."""
    lo = cfg.load
    if lo.rates and lo.concurrencies:
        raise ConfigError(
            "[load] gives both rates and concurrencies: a sweep is open loop (rates) or "
            "closed loop (concurrencies), not both",
            hint="keep one of them",
        )
    if not lo.rates and not lo.concurrencies:
        raise ConfigError(
            "the load gate check needs [load] rates or concurrencies (one of them)",
            hint="e.g. [load] rates = [0.5, 1, 2] and duration = 60",
        )
    spec = spec_of(cfg)
    spec.check(config=True)
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
        name, _, stat = rule.metric.partition(".")
        deciding = sum(1 for r in lo.rules if r.required)
        levels = stats.Levels.split(cfg.gate.false_alarm, cfg.gate.miss, max(1, deciding), 1)
        expected = rule.point * spec.duration_s
        least = needed(stat, levels) if name in LATENCIES else 0
        if rule.required and least > KEEP:
            raise ConfigError(
                f"{where} requires {rule.metric}, which needs {least} requests at a point to "
                f"see its tail at gate.miss {cfg.gate.miss:g}; a record keeps {KEEP}: the row "
                "could never decide",
                hint="a larger gate.miss, or a lower percentile",
            )
        if rule.required and least and spec.mode == "rate" and (
            _poisson_low(expected) < least
        ):  # fmt: skip
            enough = _rate_for(least)
            raise ConfigError(
                f"{where} requires {rule.metric} at {rule.point:g} req/s, which needs "
                f"{least} requests to see its tail at the miss level; {spec.duration_s:g} s "
                f"gives about {expected:.0f}, and Poisson arrivals fewer than {least} too "
                "often: the row would rarely decide",
                hint=f"[load] duration = {math.ceil(enough / rule.point)} (or more), or "
                "a lower percentile, or required = false (reported only)",
            )
        if rule.metric == "goodput_rps" and not spec.slo.given():
            raise ConfigError(
                f"{where} reads goodput, but [load] goodput sets no SLO",
                hint='e.g. [load] goodput = "ttft:2s,itl:80ms"',
            )
    if not any(rule.required for rule in lo.rules):
        raise ConfigError(
            "the load gate check has no required [[load.rules]] row: it would PASS whatever "
            "the candidate's sweep measured",
            hint='make a row decide, e.g. [[load.rules]] metric = "ttft_s.p50", point = '
            f'{spec.points[0]:g}, required = true; or take "load" out of gate.checks and '
            "sweep with `servegate bench load`",
        )


def _rate_for(least: int) -> float:
    """The expected arrivals at which a Poisson count falls under ``least`` only 1 time
    in 100."""
    expected = float(least)
    while _poisson_low(expected) < least:
        expected *= 1.02
    return expected


def _poisson_low(expected: float) -> float:
    """The 1 % quantile of a Poisson count with this mean. scipy.stats is imported here,
    not with the module: it takes about a second, and `release status` needs none of it."""
    from scipy.stats import poisson  # type: ignore[import-untyped]

    return float(poisson.ppf(0.01, expected))


def fingerprint(cfg: Config, bench_digest: str) -> str:
    """What must match for two sweeps to be compared: the sweep and the bench's prompts."""
    spec = spec_of(cfg)
    doc = {
        "load": {**dataclasses.asdict(spec), "stop_at_saturation": None},
        "bench": bench_digest,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def compact(point: Mapping[str, Any], window: float, rng: random.Random) -> Point:
    """A point's requests as the record keeps them; ``window``: the seconds the load was
    applied (the point's duration)."""
    rows = list(point.get("requests_detail") or [])
    if len(rows) > KEEP:
        rows = rng.sample(rows, KEEP)
    slo = loadspec.Slo(**{k: v for k, v in (point.get("slo") or {}).items()})
    latency = {
        name: [float(r[field]) for r in rows if r["ok"] and r[field] is not None]
        for name, field in LATENCIES.items()
    }
    return Point(
        value=float(point["value"]),
        window_s=float(window),
        requests=int(point["requests"]),
        failed=int(point["failed"]),
        kept=len(rows),
        saturated=bool(point.get("saturated")),
        ok=[bool(r["ok"]) for r in rows],
        good=[slo.met(r) for r in rows] if slo.given() else None,
        ended=[r["ended_s"] for r in rows],
        burst=[bool(r.get("client_timing")) for r in rows],
        short=[bool(r["ok"]) and r.get("full_length") is False for r in rows],
        **latency,
    )


def _count(p: Point, name: str) -> float | None:
    """Requests that completed (``request_throughput``) or met the SLOs (``goodput_rps``)
    within the point's window, scaled up from a kept subset."""
    flags = p.ok if name == "request_throughput" else p.good
    if flags is None:
        return None
    inside = sum(
        1
        for f, end in zip(flags, p.ended, strict=True)
        if f and end is not None and end <= p.window_s
    )
    return float(inside * p.requests / max(1, p.kept))


def latencies(p: Point, name: str) -> list[float]:
    """A point's values of one latency, a failed request's as infinite: it never got
    its answer, so it is slower than any that did (dropped, a candidate failing its slow
    requests would shrink its own percentiles)."""
    return [*p.latencies_of(name), *(math.inf for f in p.ok if not f)]


def percentile(values: Sequence[float], stat: str) -> float | None:
    """``p50``/``p90``/``p99`` of ``values``, linear between the closest ranks (numpy's
    default), infinite where it falls on a failed request; None for no values."""
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * int(stat[1:]) / 100
    lo, hi = math.floor(k), math.ceil(k)
    if hi == lo or s[hi] == s[lo]:
        return float(s[lo])
    return float(s[lo] + (s[hi] - s[lo]) * (k - lo))


def needed(stat: str, levels: stats.Levels) -> int:
    """The requests a ``stat`` (``p99``) needs at a point before its row can decide: with
    fewer, the chance that none of them falls above the true percentile (so no resample
    can show the tail a slower release grew there) is above the miss level."""
    q = int(stat[1:]) / 100
    return math.ceil(math.log(levels.beta) / math.log(q))


def figure(p: Point, metric: str) -> float | None:
    """A rule's figure from a compact point (None: not measured there; a percentile
    that falls on failed requests: infinite)."""
    name, _, stat = metric.partition(".")
    if name in LATENCIES:
        return percentile(latencies(p, name), stat)
    count = _count(p, name)
    return None if count is None else count / p.window_s


def compare(
    base: Point, cand: Point, metric: str, seed: int = 0
) -> tuple[float, list[float]] | None:
    """(d, the bootstrap distribution of d): d = log of the candidate's figure over the
    baseline's, turned so that > 0 is better. None when either side has no figure.

    A latency percentile is resampled over the point's requests. A rate's count is drawn
    as Poisson around the count seen (an open loop's arrivals are Poisson; a closed
    loop's completions vary less, so this errs towards INCONCLUSIVE, not a false FAIL):
    resampling the requests' flags alone would give a healthy point no spread at all."""
    b, c = figure(base, metric), figure(cand, metric)
    if not b or not c or b <= 0 or c <= 0 or (math.isinf(b) and math.isinf(c)):
        return None
    sign = -1.0 if lower_is_better(metric) else 1.0
    d = sign * _log_ratio(c, b)
    name, _, stat = metric.partition(".")
    ds: list[float] = []
    if name in LATENCIES:
        rng = random.Random(seed)
        vb, vc = latencies(base, name), latencies(cand, name)
        for _ in range(RESAMPLES):
            rb = percentile(rng.choices(vb, k=len(vb)), stat)
            rc = percentile(rng.choices(vc, k=len(vc)), stat)
            if rb and rc and rb > 0 and rc > 0 and not (math.isinf(rb) and math.isinf(rc)):
                ds.append(sign * _log_ratio(rc, rb))
    else:
        import numpy as np  # here: a promote with no load check never pays its import

        draws = np.random.default_rng(seed)
        nb, nc = b * base.window_s, c * cand.window_s
        kb = draws.poisson(nb, RESAMPLES)
        kc = draws.poisson(nc, RESAMPLES)
        ratio_w = base.window_s / cand.window_s
        ds = [sign * math.log(x / y * ratio_w) for x, y in zip(kc, kb, strict=True) if x and y]
    return (d, sorted(ds)) if len(ds) >= RESAMPLES // 2 else None


def _log_ratio(c: float, b: float) -> float:
    """log(c / b) of two positive figures, either of which may be infinite (not both)."""
    if math.isinf(c) or math.isinf(b):
        return math.inf if math.isinf(c) else -math.inf
    return math.log(c / b)


def problem(p: Point, duration: float | None = None) -> str:
    """Why a recorded point cannot be judged ("" : it can), beyond its types (which
    :func:`servegate.documents.read` checked): a baseline is read from a release record,
    which a damaged or hand-edited note could make anything. Its counts must agree with
    its requests (a failed count the kept requests contradict, or a good request that
    failed, would move the gate's failed share and goodput), and its window must be the
    sweep's ``duration`` (what the fingerprint covers) where given."""
    kept, requests = p.kept, p.requests
    if kept != min(requests, KEEP):  # every request, or a random KEEP of them
        return f"kept {kept} of {requests} requests (a point keeps {KEEP} at most, all below)"
    if not 0 <= p.failed <= requests:
        return "failed is not a count of its requests"
    if not math.isfinite(p.window_s) or p.window_s <= 0:
        return f"window {p.window_s!r} is not a positive number of seconds"
    if not math.isfinite(p.value) or p.value <= 0:
        return f"the point's load {p.value!r} is not a positive number"
    per_request: dict[str, Sequence[object] | None] = {
        "ok": p.ok, "ended": p.ended, "good": p.good, "burst": p.burst, "short": p.short
    }  # fmt: skip
    for key, values in per_request.items():
        if values is not None and len(values) != kept:
            return f"{key} does not hold one entry a kept request"
    for key, values in (("burst", p.burst), ("short", p.short), ("good", p.good)):
        if any(b and not o for b, o in zip(values or [], p.ok, strict=False)):
            return f"a request that failed is counted {key}"
    failed_kept = p.ok.count(False)
    if kept == requests and p.failed != failed_kept:
        return f"failed {p.failed} but {failed_kept} of its requests failed"
    if p.failed < failed_kept or requests - p.failed < kept - failed_kept:
        return f"failed {p.failed} of {requests} cannot hold the kept requests"
    if kept < requests and _implausible_sample(requests, p.failed, kept, failed_kept):
        return (f"{failed_kept} failed among {kept} requests kept at random from {requests} "
                f"with {p.failed} failed: not a random sample")  # fmt: skip
    if duration is not None and not math.isclose(duration, p.window_s, rel_tol=1e-9):
        return f"window {p.window_s!r} s is not the sweep's {duration:g} s"
    for name in LATENCIES:
        values = p.latencies_of(name)
        if not all(math.isfinite(v) and v >= 0 for v in values):
            return f"{name} is not a list of finite non-negative numbers"
        if len(values) > p.ok.count(True):
            return f"{name} holds more values than the point's completed requests"
    if not all(end is None or math.isfinite(end) for end in p.ended):
        return "ended must be seconds or null"
    return ""


def _implausible_sample(requests: int, failed: int, kept: int, failed_kept: int) -> bool:
    """The kept requests' failures are not what a random sample of the point's requests
    would hold (a hypergeometric tail below one in a million, either way): a record that
    keeps its successes and drops its failures would lower the baseline's failed share."""
    from scipy.stats import hypergeom

    dist = hypergeom(requests, failed, kept)
    return bool(min(dist.cdf(failed_kept), dist.sf(failed_kept - 1)) < 1e-6)


def _q(sorted_values: Sequence[float], p: float) -> float:
    k = min(len(sorted_values) - 1, max(0, round(p * (len(sorted_values) - 1))))
    return sorted_values[k]


def _bursts(p: Point) -> int:
    return sum(1 for b in p.burst or [] if b)


@dataclasses.dataclass(frozen=True)
class Reads:
    """What a sweep's figures rest on, beyond the rule's own: whether the engine's TTFT
    clock checked each point's first texts, and which SLOs goodput reads."""

    first_text_checked: bool = True
    slo: loadspec.Slo = dataclasses.field(default_factory=loadspec.Slo)


def judge(
    rule: LoadRule,
    base: Point | None,
    cand: Point | None,
    levels: stats.Levels,
    no_baseline: str,
    first_release: bool,
    reads: Reads | None = None,
) -> dict[str, Any]:
    """One rule's row."""
    reads = reads or Reads()
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
    fc = figure(cand, rule.metric)
    row["candidate"] = _finite(fc)  # JSON has no infinity: a failed request's figure is null
    if base is None:
        failed, asked = cand.failed, cand.requests
        if (
            no_baseline == "first-release"
            and first_release
            and (fc is None or not math.isfinite(fc) or 2 * failed > asked)
        ):  # nothing to compare with is no pass for a point that failed its own requests
            row.update(verdict=undecided or FAIL,
                       why=f"first release, nothing to compare with — but {failed} of {asked} "
                           f"request(s) failed at {rule.point:g}"
                           + ("" if fc is not None and math.isfinite(fc) else
                              f", and its {rule.metric} falls on a failed request"))  # fmt: skip
        elif no_baseline == "first-release" and first_release:
            row.update(verdict=undecided or PASS, why="first release: nothing to compare with")
        else:
            why = "no comparable baseline sweep (never a pass on missing data)"
            row.update(verdict=undecided or FAIL, why=why)
        return row
    fb = figure(base, rule.metric)
    row["baseline"] = _finite(fb)
    if more_failed(base, cand, levels.alpha):
        row.update(verdict=undecided or FAIL,
                   why=f"{cand.failed} of {cand.requests} request(s) failed at "
                       f"{rule.point:g} (the baseline: {base.failed} of "
                       f"{base.requests}): more beyond doubt, whatever the figures of "
                       "the requests that completed")  # fmt: skip
        return row
    name, _, stat = rule.metric.partition(".")
    if name in LATENCIES:
        least = needed(stat, levels)
        nb, nc = len(latencies(base, name)), len(latencies(cand, name))
        if min(nb, nc) < least:
            row.update(verdict=undecided or INCONCLUSIVE,
                       why=f"a {stat} needs {least} requests at a point to see its tail at "
                           f"the miss level (the candidate has {nc}, the baseline {nb}): "
                           "give the point a longer [load] duration")  # fmt: skip
            return row
        if fb is not None and math.isinf(fb):
            both = fc is not None and math.isinf(fc)
            row.update(verdict=undecided or INCONCLUSIVE,
                       why=f"the {stat} falls on failed requests on both sides: neither has "
                           "a figure" if both else f"the baseline's {stat} falls on failed "
                           "requests: it has no figure to compare with")  # fmt: skip
            return row
    goodput = name == "goodput_rps"
    slo = reads.slo
    if (name == "ttft_s" or (goodput and slo.ttft_s is not None)) and not reads.first_text_checked:
        row.update(verdict=undecided or INCONCLUSIVE,
                   why="the engine keeps no TTFT clock: under load a first text cannot be "
                       "shown to be the model's (a frontend could send text ahead of the "
                       "prefill), so a TTFT row cannot pass")  # fmt: skip
        return row
    if (name == "e2el_s" or name in RATES) and more_often(_short(cand), _short(base), levels.alpha):
        (ck, cn), (bk, bn) = _short(cand), _short(base)
        row.update(verdict=undecided or INCONCLUSIVE,
                   why=f"{ck} of the candidate's {cn} answers at {rule.point:g} were shorter "
                       f"than max_tokens (the baseline's: {bk} of {bn}): its end-to-end "
                       "latency and the requests it finished are over less work")  # fmt: skip
        return row
    decode_slo = slo.itl_ms is not None or slo.tpot_ms is not None
    if name in DECODE or (goodput and decode_slo):
        for side, p in (("candidate", cand), ("baseline", base)):
            if _bursts(p):
                row.update(verdict=undecided or INCONCLUSIVE,
                           why=f"{_bursts(p)} of the {side}'s {p.kept} request(s) at "
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
    ratio = math.exp(sign * d)  # the figure's own ratio (cand / base)
    bounds = sorted((math.exp(sign * lo), math.exp(sign * hi)))
    row["ratio"] = _shown(ratio)  # null where a figure fell on failed requests: the why says
    row["interval"] = [_shown(bounds[0]), _shown(bounds[1])]
    said = f"ratio {ratio:.3f}" if math.isfinite(ratio) else (
        f"the candidate's {stat} is a failed request" if ratio > 1 else
        f"the baseline's {stat} is a failed request")  # fmt: skip
    m, t = stats.midpoint(rule.tolerance), math.log(1 - rule.tolerance)
    way = "slower" if lower_is_better(rule.metric) else "fewer"
    if d < m and hi < 0:
        verdict, why = FAIL, f"{said}: {way} beyond doubt"
    elif d >= m and lo >= t:
        verdict, why = PASS, f"{said}: no loss of {rule.tolerance:.0%}"
    else:
        verdict, why = (
            INCONCLUSIVE,
            (
                f"{said} in {row['interval']}: not decisive at "
                f"{rule.tolerance:.0%} (more requests at this point would tell)"
            ),
        )
    row.update(verdict=undecided or verdict, why=why)
    return row


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _shown(x: float) -> float | None:
    return round(x, 4) if math.isfinite(x) else None


def more_failed(base: Point, cand: Point, alpha: float) -> bool:
    """The candidate failed more of the point's requests than the baseline, beyond
    doubt at the false-alarm level ``alpha``: one transient error in fifty is not a
    regression; a share of them that the baseline's cannot explain is, whatever the
    figures of the requests that completed."""
    return more_often((cand.failed, cand.requests), (base.failed, base.requests), alpha)


def more_often(cand: tuple[int, int], base: tuple[int, int], alpha: float) -> bool:
    """``cand`` (k of n) is a larger share than ``base``'s beyond doubt at ``alpha``
    (Fisher's exact test, one-sided)."""
    (ck, cn), (bk, bn) = cand, base
    if not ck or ck / max(1, cn) <= bk / max(1, bn):
        return False
    return stats.tail_p(ck, cn, bk, bn) < alpha  # Fisher's exact test, one-sided


def _short(p: Point) -> tuple[int, int]:
    """(answers shorter than max_tokens, answers) among the point's kept requests."""
    return sum(1 for f in p.short or [] if f), p.ok.count(True)


def decide(
    cfg: Config,
    base: Sweep | None,
    cand: Sweep,
    first_release: bool = False,
) -> dict[str, Any]:
    """The rows and the check's verdict (only required rows decide)."""
    rules = cfg.load.rules
    deciding = sum(1 for r in rules if r.required)
    levels = stats.Levels.split(cfg.gate.false_alarm, cfg.gate.miss, max(1, deciding), 1)
    points_b = {p.value: p for p in base.points} if base else {}
    points_c = {p.value: p for p in cand.points}
    reads = Reads(cand.first_text_checked, spec_of(cfg).slo)
    rows = [
        judge(r, points_b.get(r.point) if base else None, points_c.get(r.point), levels,
              cfg.gate.no_baseline, first_release, reads)
        for r in rules
    ]  # fmt: skip
    required = [r for r in rows if r["required"]]
    verdicts = {r["verdict"] for r in required}
    if not required:  # refused at config check; a check that cannot fail never passes
        return {"verdict": FAIL, "why": "no required row: nothing decides", "rows": rows}
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
    cfg: Config, previous_record: ReleaseRecord | None, digest: str
) -> tuple[Sweep | None, str]:
    if previous_record is None:
        return None, "no live release recorded"
    sha = previous_record.sha[:12]
    check = previous_record.gate.check(CHECK) if previous_record.gate else None
    doc = check.evidence.get("sweep") if check else None
    if not isinstance(doc, dict):
        return None, f"the live release {sha} has no recorded load sweep"
    theirs = previous_record.host_id or f"hostname:{previous_record.host}"
    if theirs != host_id(cfg):
        return None, f"the live release {sha} was measured on another host ({theirs})"
    if doc.get("fingerprint") != digest:
        return None, f"the live release {sha} swept differently (other [load] or [bench])"
    try:
        sweep = documents.read(Sweep, doc, "sweep")
    except documents.DocumentError as exc:
        return None, f"the live release {sha}'s recorded sweep is damaged: {exc}"
    values = [p.value for p in sweep.points]
    why = "two points at one load" if len(set(values)) < len(values) else ""
    why = why or next((w for p in sweep.points if (w := problem(p, spec_of(cfg).duration_s))), "")
    if why:
        return None, f"the live release {sha}'s recorded sweep is damaged: {why}"
    return sweep, f"live release {sha}"


def run(
    cfg: Config,
    endpoint: Endpoint,
    model: str,
    sha: str,
    previous_record: ReleaseRecord | None,
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
    sweep = Sweep(
        digest, [compact(p, window, rng) for p in result["points"]],
        first_text_checked=bool(endpoint.adapter.metrics.ttft),
    )  # fmt: skip
    decision = decide(cfg, base, sweep, first_release)
    return {
        **evidence,
        **decision,
        "knee": result["knee"],
        "table": [{k: v for k, v in p.items() if k != "requests_detail"} for p in result["points"]],
        "sweep": documents.plain(sweep),
    }
