"""The gate's error rates: how often it FAILs an unchanged release, and a real loss.

    .venv/bin/python benchmarks/gate_power.py --simulate [--gates 1000]
    .venv/bin/python benchmarks/gate_power.py --runs 10 [--slow-arg=--max-num-batched-tokens=8]

``--simulate``: the gate's own decision (:func:`servegate.judging.verdict.evaluate`, as a
promote runs it: 3 repetitions, one more per look while a row is open, up to the cap,
then the ``evidence`` policy) on synthetic log-normal samples. Each gate has 4 deciding
rows (2 cases x prefill and decode), each row's noise is the within-run CV, and each
side's service start adds a log offset drawn with SD ``offset`` (the restart-to-restart
noise). Per cell: P(back) — rolled back: FAIL, or still INCONCLUSIVE at the cap because
the estimate is a loss beyond the tolerance — of an unchanged release per check (all 4
rows together; the target is <= 5 %) and of a release that lost exactly the tolerance
(5 %) on one row (target >= 99 %), and the mean repetitions a side that decided. Where
the box cannot resolve the tolerance (no plan) the gate says so before measuring, and
errs towards rolling back.

Real mode: three vLLM-CPU servers of the demo's tiny model, up at once — A (the live
release), A' (an identical release), B (the same with a slower launch setting) — and
``--runs`` rounds, each measuring A, A', B in a rotated order (so drift hits all three
alike) with the demo's gate bench (prose 2k, 512 tokens out, 3 repetitions, up to 5)
and judging A' and B against A's samples of that round with the demo's gate rules
(engine-clock prefill and decode, 50 %; each release passed over with its own drift).
Invalid trials (the random model's text) are counted apart from the verdicts.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from servegate.bench import cases, driver, measure, results
from servegate.bench.results import CaseSamples, Samples
from servegate.judging import stats, verdict

CASES = ("regular-16k", "coding-16k")
METRICS = ("prefill_tps", "generation_tps")
TOLERANCE = 0.05
#: the demo's gate rules when these runs were made: prefill and decode by the engine's own
#: clock, 50 % (the demo now gates prefill alone: README, benchmarks/cpu/demo-noise.json)
DEMO_METRICS = ("engine_prefill_tps", "engine_generation_tps")


def _side(
    rng: random.Random, n: int, cv: float, offset: float, loss: dict[str, float]
) -> dict[str, list[float]]:
    """Samples of one service start: per case:metric, ``n`` log-normal values."""
    out = {}
    for case in CASES:
        for m in METRICS:
            shift = rng.gauss(0, offset) + math.log(1 - loss.get(f"{case}:{m}", 0.0))
            out[f"{case}:{m}"] = [100 * math.exp(shift + rng.gauss(0, cv)) for _ in range(n)]
    return out


def _samples(values: dict[str, list[float]], n: int) -> Samples:
    cases = {
        case: CaseSamples(case, True, True, n, {m: values[f"{case}:{m}"][:n] for m in METRICS})
        for case in CASES
    }
    return Samples("sim", "servegate-bench/1", {"digest": "x"}, cases)


def simulate_gate(
    rng: random.Random, cv: float, offset: float, loss: dict[str, float], reps: int, cap: int
) -> tuple[str, int]:
    """One gate as bench_gate runs it, the box's noise known to it (``bench noise``):
    (verdict, repetitions a side that decided)."""
    rules = [verdict.Rule(m, "higher", TOLERANCE) for m in METRICS]
    offsets = {f"{c}:{m}": offset for c in CASES for m in METRICS}
    st = verdict.Settings(looks=cap - reps + 1, offsets=offsets)
    base = _samples(_side(rng, cap, cv, offset, {}), cap)
    cand_all = _side(rng, cap, cv, offset, loss)
    n = reps
    while True:
        d = verdict.evaluate(base, _samples(cand_all, n), rules, st, final=n >= cap)
        if d["verdict"] != verdict.INCONCLUSIVE or n >= cap:
            return d["verdict"], n
        n += 1


def _resolves(cv: float, offset: float, rows: int, cap: int) -> float:
    return stats.resolvable(cv, offset, stats.Levels.split(0.05, 0.01, rows, cap - 2), cap)


def simulate(gates: int) -> int:
    rng = random.Random(20261203)
    start = time.monotonic()
    rows = len(CASES) * len(METRICS)
    print(
        f"{gates} gates a cell; 4 deciding rows; tolerance {TOLERANCE:.0%}; repetitions 3, "
        "+1 a look while a row is open, up to the cap; the box's noise known to the gate"
    )
    header = (
        f"{'CV':>5} {'offset':>6} {'cap':>9} | {'P(back) unchanged':>17} "
        f"{'P(back) 5% loss':>15} | {'n unchanged':>11} {'n loss':>6} | resolves at cap"
    )
    print(header)
    print("-" * len(header))
    loss = {f"{CASES[0]}:generation_tps": TOLERANCE}
    for cv in (0.005, 0.01, 0.02, 0.05, 0.10):
        for offset in (0.0, 0.03):
            planned = stats.plan(cv, offset, TOLERANCE, 0.05, 0.01, rows, 3, cap=60)
            caps = [(5, "5")] + ([(max(planned, 3), f"{max(planned, 3)} plan")] if planned else [])
            for cap, label in caps:
                same = [simulate_gate(rng, cv, offset, {}, 3, cap) for _ in range(gates)]
                lost = [simulate_gate(rng, cv, offset, loss, 3, cap) for _ in range(gates)]
                # rolled back: FAIL, or INCONCLUSIVE at the cap (an estimate beyond the
                # tolerance that the samples could not decide)
                fa = sum(v != verdict.PASS for v, _ in same) / gates
                power = sum(v != verdict.PASS for v, _ in lost) / gates
                n_same = sum(n for _, n in same) / gates
                n_lost = sum(n for _, n in lost) / gates
                res = stats.resolvable(
                    cv, offset, stats.Levels.split(0.05, 0.01, rows, cap - 2), cap
                )
                print(f"{cv:>5.1%} {offset:>6.0%} {label:>9} | {fa:>17.1%} {power:>15.1%} | "
                      f"{n_same:>11.1f} {n_lost:>6.1f} | {res:.1%}", flush=True)  # fmt: skip
            if planned is None:
                print(f"{cv:>5.1%} {offset:>6.0%} {'no plan':>9} | this box resolves "
                      f"{_resolves(cv, offset, rows, 60):.1%} at 60 repetitions, "
                      f"not {TOLERANCE:.0%}")  # fmt: skip
    print(f"({time.monotonic() - start:.0f} s)")
    return 0


def real(runs: int, slow_arg: str) -> int:
    from contextlib import ExitStack

    from servegate.demo.local_server import vllm_server
    from servegate.engine.openai import Endpoint

    rules = [verdict.Rule(m, "higher", 0.5) for m in DEMO_METRICS]

    def spec(url: str, warmup: bool) -> cases.Spec:
        return cases.Spec(
            Endpoint(url), "demo", cases.parse_cases(["regular"], ["2k"], [1]), repetitions=3,
            max_tokens=512, sampling=cases.Sampling(seed=-1), warmup=warmup,
            rules=measure.Rules(max_dominant_ratio=0.35),
        )  # fmt: skip

    tally: dict[str, Counter[str]] = {"A'": Counter(), "B": Counter()}
    invalid: Counter[str] = Counter()
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        work = Path(tmp)
        servers: dict[str, Any] = {}
        for name, extra in (("A", ()), ("A'", ()), ("B", (slow_arg,))):
            print(f"{name}: starting vLLM {' '.join(extra) or '(as released)'}", flush=True)
            servers[name] = stack.enter_context(vllm_server(work / name.replace("'", "2"), *extra))
        names = list(servers)
        for i in range(runs):
            order = names[i % 3 :] + names[: i % 3]
            measured: dict[str, Samples] = {}
            for name in order:
                doc = driver.run(
                    spec(servers[name].url, i == 0), work / f"{name}-{i:02d}.json".replace("'", "2")
                )
                measured[name] = results.from_result(doc, name)
                bad = sum(not t["performance_valid"] for c in doc["cases"]
                          for g in c["groups"] for t in g["trials"])  # fmt: skip
                invalid[name] += bad
            for cand in ("A'", "B"):
                d = verdict.evaluate(measured["A"], measured[cand], rules, verdict.Settings())
                invalid_side = not all(cs.valid for s in (measured["A"], measured[cand])
                                       for cs in s.cases.values())  # fmt: skip
                key = "invalid" if invalid_side else d["verdict"]
                tally[cand][key] += 1
                ratios = ", ".join(
                    f"{r['metric']} {r['ratio']}"
                    + (
                        f" (box {r['drift']['change']:+.0%})"
                        if (r["drift"] or {}).get("checked")
                        else ""
                    )
                    for r in d["rows"]
                )
                print(f"round {i + 1} ({''.join(order)}): {cand} vs A {key} — {ratios}", flush=True)
    print(f"identical release A': {dict(tally[chr(65) + chr(39)])}")
    print(f"slower release B ({slow_arg}): {dict(tally['B'])}")
    print(f"invalid trials (the random model's text): {dict(invalid)}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--simulate", action="store_true", help="synthetic samples, no server")
    parser.add_argument("--gates", type=int, default=1000, help="gates a cell (--simulate)")
    parser.add_argument("--runs", type=int, default=10, help="rounds on the real servers")
    parser.add_argument("--slow-arg", default="--max-num-batched-tokens=8")
    args = parser.parse_args()
    return simulate(args.gates) if args.simulate else real(args.runs, args.slow_arg)


if __name__ == "__main__":
    sys.exit(main())
