"""The load sweep's settings: the spec a sweep runs (points, duration, arrivals, the
workload, goodput SLOs) and how it is read from the command line or ``[load]``.
:mod:`servegate.bench.load` drives the sweep; :mod:`servegate.bench.loadreport` reads
its points."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from servegate.errors import ConfigError, did_you_mean

KIND = "servegate.load"
WORKLOADS = ("cold", "shared-prefix")
PERCENTILES = (50, 90, 99)
#: the fewest expected arrivals a rate point may have (rate x duration)
MIN_ARRIVALS = 5
#: the fewest steady-state arrivals the queue-growth rule needs
MIN_STEADY = 6


@dataclass(frozen=True)
class Slo:
    """Service-level objectives a request must meet to count towards goodput."""

    ttft_s: float | None = None
    itl_ms: float | None = None
    tpot_ms: float | None = None
    e2el_s: float | None = None

    def given(self) -> dict[str, float]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def met(self, r: Mapping[str, Any]) -> bool:
        """Every SLO given holds for request ``r`` (a failed request meets none)."""
        if not r["ok"]:
            return False
        checks = (
            (self.ttft_s, r["ttft_s"]),
            (self.itl_ms, r["itl_ms"]),
            (self.tpot_ms, r["tpot_ms"]),
            (self.e2el_s, r["e2el_s"]),
        )
        return all(limit is None or (v is not None and v <= limit) for limit, v in checks)


_SLO_KEYS = ("ttft", "itl", "tpot", "e2el")
_SLO_VALUE = re.compile(r"^(\d+(?:\.\d+)?|\.\d+)(ms|s)?$")


def parse_goodput(text: str, option: str = "--goodput") -> Slo:
    """``ttft:2s,itl:80ms`` → :class:`Slo`. Keys: ttft, itl (the request's mean
    inter-token latency), tpot, e2el; a value without a unit is in milliseconds, as
    ``vllm bench serve --goodput`` reads it. ``option``: how the user gave it, for the
    error (``--goodput`` or ``[load] goodput``)."""
    values: dict[str, float] = {}
    example = "e.g. ttft:2s,itl:80ms (keys ttft, itl, tpot, e2el; units s or ms, ms when none)"
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, colon, value = part.partition(":")
        key, value = key.strip(), value.strip()
        if not colon:
            raise ConfigError(f"{option} {part!r}: not KEY:VALUE", hint=example)
        if key not in _SLO_KEYS:
            close = did_you_mean(key.lower(), _SLO_KEYS)
            raise ConfigError(f"{option} {part!r}: no SLO named {key!r}{close}", hint=example)
        m = _SLO_VALUE.match(value)
        if not m:
            raise ConfigError(
                f"{option} {part!r}: {value!r} is not a positive time (a number, then s or ms)",
                hint=example,
            )
        number, unit = float(m.group(1)), m.group(2) or "ms"
        if number <= 0:
            raise ConfigError(f"{option} {part!r}: no request can meet a limit of 0", hint=example)
        name = f"{key}_s" if key in ("ttft", "e2el") else f"{key}_ms"
        if name in values:
            raise ConfigError(f"{option} gives {key} twice", hint=f"give each SLO once: {example}")
        seconds = number if unit == "s" else number / 1000
        values[name] = seconds if key in ("ttft", "e2el") else seconds * 1000
    return Slo(**values)


@dataclass(frozen=True)
class LoadSpec:
    """A sweep: the points, how long each runs, what the requests are."""

    #: "rate" (open loop, requests a second) or "concurrency" (closed loop, clients)
    mode: str
    points: tuple[float, ...]
    duration_s: float = 30.0
    burstiness: float = 1.0
    seed: int = 0
    slo: Slo = field(default_factory=Slo)
    workload: str = "cold"
    #: the share of every prompt that is common to all (the shared-prefix workload)
    prefix_share: float = 0.0
    #: stop at the first saturated point (False: run every point)
    stop_at_saturation: bool = True
    #: saturation: TTFT p50 this many times the first point's
    ttft_growth: float = 5.0
    #: saturation (closed loop): throughput gained over the previous point below this
    min_gain: float = 0.10
    #: seconds to wait for the requests in flight after the last arrival
    drain_s: float = 600.0

    def check(self, config: bool = False) -> None:
        """Refuse a sweep that cannot run, naming the settings as the user gave them:
        ``servegate bench load``'s options, or with ``config`` the ``[load]`` keys."""

        def n(key: str) -> str:
            return f"[load] {key.replace('-', '_')}" if config else f"--{key}"

        def eg(*pairs: tuple[str, str]) -> str:
            if config:
                return "e.g. " + ", ".join(f"{k.replace('-', '_')} = {v}" for k, v in pairs)
            shown = ((k, v.strip('[]"').replace(", ", ",")) for k, v in pairs)
            return "e.g. " + " ".join(f"--{k} {v}" for k, v in shown)

        if self.mode not in ("rate", "concurrency"):
            raise ConfigError(
                f"load mode {self.mode!r}", hint=f"give {n('rates')} or {n('concurrencies')}"
            )
        if not self.points or any(not (math.isfinite(p) and p > 0) for p in self.points):
            raise ConfigError(
                "a load sweep needs positive, finite points",
                hint=f"{eg(('rates', '[0.5, 1, 2, 4]'))} or {n('concurrencies')} 1,2,4,8",
            )
        if list(self.points) != sorted(set(self.points)):
            raise ConfigError(
                "load points must rise, each once: the sweep stops at the first that "
                "saturates and the knee is the one before it",
                hint=eg(("rates", "[0.5, 1, 2, 4]")),
            )
        if self.mode == "concurrency" and any(p != int(p) for p in self.points):
            raise ConfigError(f"{n('concurrencies')} takes whole numbers",
                              hint=eg(("concurrencies", "[1, 2, 4, 8]")))  # fmt: skip
        for key, value, example in (("duration", self.duration_s, "30"),
                                    ("burstiness", self.burstiness, "1")):  # fmt: skip
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(
                    f"{n(key)} {value:g} must be a positive number",
                    hint=eg((key, example))
                    + (" (seconds a point)" if key == "duration" else " (1: Poisson)"),
                )
        if self.mode == "rate" and self.points[0] * self.duration_s < MIN_ARRIVALS:
            raise ConfigError(
                f"{self.points[0]:g} req/s for {self.duration_s:g}s is fewer than "
                f"{MIN_ARRIVALS} expected arrivals: too few to say anything about a load",
                hint=f"a longer {n('duration')} (at least {MIN_ARRIVALS / self.points[0]:g}s) "
                "or a higher first rate",
            )
        if self.workload not in WORKLOADS:
            raise ConfigError(f"{n('workload')} {self.workload!r}",
                              hint=f"one of {', '.join(WORKLOADS)}")  # fmt: skip
        if self.workload == "shared-prefix" and not 0 < self.prefix_share < 1:
            raise ConfigError(
                f"the shared-prefix workload needs {n('prefix-share')} between 0 and 1",
                hint=eg(("workload", '"shared-prefix"'), ("prefix-share", "0.8")),
            )
        if self.workload != "shared-prefix" and self.prefix_share:
            raise ConfigError(
                f"{n('prefix-share')} {self.prefix_share:g} is for the shared-prefix workload; "
                f"the {self.workload} workload shares no prefix",
                hint=eg(("workload", '"shared-prefix"'), ("prefix-share", f"{self.prefix_share:g}"))
                + f", or leave {n('prefix-share')} out",
            )


def spec_from(lo: Any, stop_at_saturation: bool = True, config: bool = False) -> LoadSpec:
    """A sweep from ``[load]``-shaped settings (``servegate.config.Load``): the gate's
    configured sweep (``config``) and ``servegate bench load``'s options alike."""
    rates = bool(lo.rates)
    return LoadSpec(
        mode="rate" if rates else "concurrency",
        points=tuple(float(p) for p in (lo.rates if rates else lo.concurrencies)),
        duration_s=lo.duration,
        burstiness=lo.burstiness,
        seed=lo.seed,
        slo=parse_goodput(lo.goodput, "[load] goodput" if config else "--goodput"),
        workload=lo.workload,
        prefix_share=lo.prefix_share,
        stop_at_saturation=stop_at_saturation,
    )


def arrivals(rate: float, duration: float, burstiness: float, rng: random.Random) -> list[float]:
    """Offsets (seconds from the start) of the arrivals in ``duration``: gamma-distributed
    gaps of mean ``1/rate`` and shape ``burstiness`` (1: exponential, a Poisson process;
    below 1 burstier, above 1 more even)."""
    out: list[float] = []
    t = 0.0
    scale = 1.0 / (rate * burstiness)
    while True:
        t += rng.gammavariate(burstiness, scale)
        if t >= duration:
            return out
        out.append(t)
