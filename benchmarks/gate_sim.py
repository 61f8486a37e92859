"""The gate's error rates on a simulated box: restarts, drift and outliers included.

    .venv/bin/python benchmarks/gate_sim.py [--gates 1000] [--out benchmarks/sim/gate-sim.json]

Each gate runs what ``release promote``'s bench check runs, on synthetic samples: the
plan (:func:`servegate.release.bench_gate.plan` and :func:`~servegate.release.bench_gate.
design`) from the box's noise record, the repetitions spread over the planned service
starts, the verdict (:func:`servegate.judging.verdict.evaluate`) at every look with one more
repetition of each open case up to ``bench.max_repetitions``, then the final look. The
baseline is measured the same way (the live release's own gate, or a fresh baseline).

The box: each sample is ``log y = level + start offset + box speed + noise``. ``cv`` is
the within-start SD and ``offset`` the SD of a service start's offset (drawn anew per
start and row); the reference workload beside each group reads the box speed with its
own 1 % noise. Per cell: P(rolled back) of an unchanged release (FAIL and INCONCLUSIVE
together), P(caught) of a loss, P(FAIL), and the mean repetitions and starts a side.

Noise: ``known`` gives the gate the true offset (the rule's own power); ``measured``
gives it a ``servegate bench noise`` record of 3 starts x 4 repetitions drawn from the
same box (what a user has), pooled with the gate's own starts.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from servegate.bench.results import CaseSamples, Samples
from servegate.config import Bench, Config, Gate, GateRule
from servegate.judging import noise, verdict
from servegate.release import bench_gate

TOLERANCE = 0.05
METRICS = ("prefill_tps", "generation_tps")
REF_CV = 0.01


@dataclass
class Box:
    cv: float
    offset: float
    #: per "case:metric", the candidate's true loss (0.05: 5 % lower rate)
    loss: dict[str, float] = field(default_factory=dict)
    #: the box's speed during the candidate's run, as a factor (0.95: 5 % slower)
    cand_box: float = 1.0
    #: the share of samples hit by a box outlier (a third of the rate), both sides
    outliers: float = 0.0
    #: the share of the candidate's samples the release serves at a third of the rate
    tail: float = 0.0
    #: per "case:metric", a restart offset of its own (the rest have ``offset``)
    offsets: dict[str, float] = field(default_factory=dict)


def _config(cases: Sequence[str], max_reps: int, max_starts: int) -> Config:
    profiles = sorted({c.split("-")[0] for c in cases})
    tiers = sorted({c.split("-")[1] for c in cases}, key=lambda t: int(t.rstrip("k")))
    cfg = Config.__new__(Config)
    object.__setattr__(cfg, "bench", Bench(profiles=tuple(profiles), tiers=tuple(tiers),
                                           repetitions=3, max_repetitions=max_reps,
                                           max_starts=max_starts))  # fmt: skip
    object.__setattr__(cfg, "gate", Gate(rules=tuple(GateRule(m, "higher", TOLERANCE)
                                                     for m in METRICS)))  # fmt: skip
    return cfg


class Side:
    """One release's samples as the gate collects them: start by start."""

    def __init__(self, rng: random.Random, box: Box, cases: Sequence[str], cand: bool) -> None:
        self.rng, self.box, self.cases, self.cand = rng, box, cases, cand
        self.values: dict[str, list[float]] = {f"{c}:{m}": [] for c in cases for m in METRICS}
        self.blocks: dict[str, list[int]] = {k: [] for k in self.values}
        self.refs: dict[str, list[float]] = {c: [] for c in cases}
        self.start = -1
        self.offsets: dict[str, float] = {}

    def restart(self) -> None:
        self.start += 1
        self.offsets = {k: self.rng.gauss(0, self.box.offsets.get(k, self.box.offset))
                        for k in self.values}  # fmt: skip

    def measure(self, case: str, n: int) -> None:
        box = math.log(self.box.cand_box) if self.cand else 0.0
        for _ in range(n):
            self.refs[case].append(100 * math.exp(box + self.rng.gauss(0, REF_CV)))
            hit = self.rng.random() < self.box.outliers
            tail = self.cand and self.rng.random() < self.box.tail
            for m in METRICS:
                key = f"{case}:{m}"
                loss = self.box.loss.get(key, 0.0) if self.cand else 0.0
                x = (self.offsets[key] + box + math.log(1 - loss)
                     + self.rng.gauss(0, self.box.cv))  # fmt: skip
                if hit or tail:
                    x -= math.log(3)
                self.values[key].append(100 * math.exp(x))
                self.blocks[key].append(self.start)

    def count(self, case: str) -> int:
        return len(self.refs[case])

    def samples(self) -> Samples:
        cases = {}
        for c in self.cases:
            cs = CaseSamples(c, True, True, self.count(c),
                             {m: list(self.values[f"{c}:{m}"]) for m in METRICS},
                             reference=list(self.refs[c]), reference_workload="sim",
                             starts=self.start + 1,
                             blocks={m: list(self.blocks[f"{c}:{m}"])
                                     for m in METRICS})  # fmt: skip
            cases[c] = cs
        return Samples("sim", "servegate-bench/1", {"digest": "x"}, cases)


def _noise_record(rng: random.Random, box: Box, cases: Sequence[str]) -> dict[str, noise.Noise]:
    """A ``bench noise`` record: 3 starts x 4 repetitions of the live release."""
    side = Side(rng, replace(box, loss={}, outliers=0.0, tail=0.0), cases, cand=False)
    starts = []
    for _ in range(3):
        side.restart()
        before = {k: len(v) for k, v in side.values.items()}
        for c in cases:
            side.measure(c, 4)
        starts.append({k: v[before[k] :] for k, v in side.values.items()})
    out = {}
    for key in side.values:
        est = noise.estimate([s[key] for s in starts])
        if est is not None:
            out[key] = est
    return out


def one_gate(
    rng: random.Random, box: Box, cases: Sequence[str], noise_mode: str, max_reps: int,
    max_starts: int,
) -> tuple[str, int, int, dict[str, Any]]:  # fmt: skip
    """(verdict, repetitions a side at the end, starts a side, the decision)."""
    cfg = _config(cases, max_reps, max_starts)
    if noise_mode == "known":
        found = {}
        for key in (f"{c}:{m}" for c in cases for m in METRICS):
            off = box.offsets.get(key, box.offset)
            found[key] = noise.Noise(box.cv, off, 1000, 100000, off)
    else:
        found = _noise_record(rng, box, cases)
    planned = bench_gate.plan(cfg, found)
    first, starts = bench_gate.design(planned, 3, max_reps, max_starts)
    looks = max(1, max_reps - first + 1)
    st = bench_gate.settings(cfg, False, looks, first, found)
    if noise_mode == "known":
        st = replace(st, offsets={k: box.offsets.get(k, box.offset) for k in found})
    rules = bench_gate.rules(cfg)
    base, cand = Side(rng, box, cases, False), Side(rng, box, cases, True)
    for side in (base, cand):
        for count in bench_gate.spread(first, starts):
            side.restart()
            for c in cases:
                side.measure(c, count)
    bs = base.samples()
    decision = verdict.evaluate(bs, cand.samples(), rules, st, final=False)
    while decision["verdict"] == verdict.INCONCLUSIVE:
        open_cases = {r["case"] for r in decision["rows"] if r["verdict"] == verdict.INCONCLUSIVE}
        todo = [c for c in cases if c in open_cases and cand.count(c) < max_reps]
        if not todo:
            break
        for c in todo:
            cand.measure(c, 1)
        decision = verdict.evaluate(bs, cand.samples(), rules, st, final=False)
    decision = verdict.evaluate(bs, cand.samples(), rules, st, final=True)
    reps = max(cand.count(c) for c in cases)
    return decision["verdict"], reps, starts, decision


def cell(
    name: str, gates: int, seed: int, box: Box, cases: Sequence[str], noise_mode: str,
    max_reps: int = Bench.max_repetitions, max_starts: int = Bench.max_starts,
) -> dict[str, Any]:  # fmt: skip
    rng = random.Random(seed)
    verdicts: dict[str, int] = {}
    reps = starts = 0
    for _ in range(gates):
        v, n, k, _ = one_gate(rng, box, cases, noise_mode, max_reps, max_starts)
        verdicts[v] = verdicts.get(v, 0) + 1
        reps, starts = reps + n, starts + k
    back = 1 - verdicts.get(verdict.PASS, 0) / gates
    return {
        "cell": name,
        "cv": box.cv,
        "offset": box.offset,
        "noise": noise_mode,
        "rows": len(cases) * len(METRICS),
        "gates": gates,
        "rolled_back": round(back, 4),
        "fail": round(verdicts.get(verdict.FAIL, 0) / gates, 4),
        "verdicts": verdicts,
        "mean_repetitions": round(reps / gates, 2),
        "mean_starts": round(starts / gates, 2),
    }


Scenario = tuple[str, Box, tuple[str, ...], str, int]


def scenarios() -> list[Scenario]:
    """(name, box, cases, noise mode, seed) of every cell."""
    two = ("regular-16k", "coding-16k")
    sixteen = tuple(f"{p}-{t}" for p in ("regular", "coding")
                    for t in ("16k", "32k", "64k", "128k"))  # fmt: skip
    one_row = {"regular-16k:generation_tps": TOLERANCE}
    out: list[Scenario] = []
    seed = 20261206
    for mode in ("known", "measured"):
        for cv in (0.005, 0.01, 0.02):
            for off in (0.0, 0.005, 0.01):
                seed += 1
                where = f"cv {cv:.1%} offset {off:.1%} noise {mode}"
                out.append((f"unchanged {where}", Box(cv, off), two, mode, seed))
                out.append((f"5% loss on one row {where}", Box(cv, off, loss=one_row), two, mode,
                            seed + 500))  # fmt: skip
    extra = [
        ("unchanged, 1 trial in 10 at a third of the rate", Box(0.01, 0.005, outliers=0.1), two),
        ("unchanged, the box 5 % slower during the candidate", Box(0.01, 0.005, cand_box=0.95),
         two),
        ("5% loss only at 128k (16 rows)",
         Box(0.02, 0.01, loss={"regular-128k:prefill_tps": TOLERANCE}), sixteen),
        ("unchanged (16 rows)", Box(0.02, 0.01), sixteen),
        ("30 % of the release's requests at a third of the rate", Box(0.01, 0.005, tail=0.3),
         two),
        ("10 % of the release's requests at a third of the rate", Box(0.01, 0.005, tail=0.1),
         two),
        ("unchanged, one row's restarts scatter 4 % (the rest 0.5 %)",
         Box(0.01, 0.005, offsets={"regular-16k:generation_tps": 0.04}), two),
        ("5% loss on the row whose restarts scatter 4 % (the rest 0.5 %)",
         Box(0.01, 0.005, loss=one_row, offsets={"regular-16k:generation_tps": 0.04}), two),
        # an offset the F test barely tells from the rest's: pooled, it must not hide a loss
        ("5% loss on the row whose restarts scatter 2 % (the rest 0.5 %)",
         Box(0.005, 0.005, loss=one_row, offsets={"regular-16k:generation_tps": 0.02}), two),
        ("5% loss on the row whose restarts scatter 3 % (the rest 0.5 %)",
         Box(0.005, 0.005, loss=one_row, offsets={"regular-16k:generation_tps": 0.03}), two),
    ]  # fmt: skip
    for i, (name, box, cases) in enumerate(extra):
        for mode in ("known", "measured"):
            out.append((f"{name} noise {mode}", box, cases, mode, seed + 1000 + i))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--gates", type=int, default=1000)
    parser.add_argument("--only", default="", help="run the cells whose name contains this")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    start = time.monotonic()
    rows = []
    for name, box, cases, mode, seed in scenarios():
        if args.only and args.only not in name:
            continue
        row = cell(name, args.gates, seed, box, cases, mode)
        row["name"] = name
        rows.append(row)
        print(f"{name:<70} back {row['rolled_back']:>6.1%} fail {row['fail']:>6.1%} "
              f"n {row['mean_repetitions']:>5.1f} starts {row['mean_starts']:>4.1f}",
              flush=True)  # fmt: skip
    took = time.monotonic() - start
    print(f"({took:.0f} s)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "command": "python benchmarks/gate_sim.py " + " ".join(sys.argv[1:]),
            "tolerance": TOLERANCE, "false_alarm": 0.05, "miss": 0.01,
            "max_repetitions": Bench.max_repetitions, "max_starts": Bench.max_starts,
            "seconds": round(took), "cells": rows,
        }, indent=1) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
