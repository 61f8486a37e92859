"""The demo's gate re-judged on real runs: every ordered pair of bench results of an
unchanged release (one as the baseline, the other as the candidate), and the slow
release against each of them, under a given restart offset and rules.

    .venv/bin/python benchmarks/demo_pairs.py --out benchmarks/cpu/demo-pairs.json

The result files in ``benchmarks/cpu/demo-runs/`` are the 2-CPU box's own: two
``servegate demo`` runs (the first two releases, the baselines measured afresh during the
later promotes) and ``servegate bench noise --restarts 6 --repetitions 4`` on the release
the first demo left serving (seven service starts of one release). ``slow/`` holds the
demo's slow release (8 batched tokens a step). The releases under ``unchanged/`` differ in
their kernel library only, which vLLM never calls: they serve alike.

Each setting is judged as the promote's last look judges (``final``), the demo's looks
planned (4 repetitions, up to 6). Three settings are written: the demo's config before
this file (prefill and decode at 50 %, the 2 % restart offset servegate assumes
unmeasured), with the scatter check as it was and with its credit for the box's own
scatter (the reference workload's beside the candidate), and the demo's config now
(prefill at 60 %, the 10.7 % restart offset `bench noise` bounds).
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any
from unittest import mock

from servegate.bench.results import Samples, from_result
from servegate.judging import verdict

RUNS = Path(__file__).resolve().parent / "cpu" / "demo-runs"
#: name: (metrics gated, tolerance, restart offset, scatter check credits the box's own)
SETTINGS = {
    "before: prefill and decode at 50 %, restart offset 2 %, no scatter credit": (
        ("engine_prefill_tps", "engine_generation_tps"),
        0.50,
        0.02,
        False,
    ),
    "before, with the scatter check's credit for the box's own scatter": (
        ("engine_prefill_tps", "engine_generation_tps"),
        0.50,
        0.02,
        True,
    ),
    "now: prefill at 60 %, restart offset 10.7 % (bench noise), scatter credit": (
        ("engine_prefill_tps",),
        0.60,
        0.11,
        True,
    ),
}


def _read(where: Path) -> list[tuple[str, Samples]]:
    return [(p.name, from_result(json.loads(p.read_text()), p.name))
            for p in sorted(where.glob("*.json"))]  # fmt: skip


def judge(
    metrics: tuple[str, ...], tolerance: float, offset: float, credit: bool
) -> dict[str, Any]:
    if not credit:  # the scatter check as it was: the box's own scatter not credited
        with mock.patch.object(verdict, "_box_scatter", return_value=0.0):
            return judge(metrics, tolerance, offset, True) | {"scatter_credit": False}
    rules = [verdict.Rule(m, "higher", tolerance) for m in metrics]
    st = verdict.Settings(looks=3, first=4, restart_offset=offset)
    same, slow = _read(RUNS / "unchanged"), _read(RUNS / "slow")
    unchanged: Counter[str] = Counter()
    held: list[dict[str, Any]] = []
    for (nb, b), (nc, c) in itertools.permutations(same, 2):
        d = verdict.evaluate(b, c, rules, st, final=True)
        unchanged[d["verdict"]] += 1
        if d["verdict"] != "PASS":
            held.append({"baseline": nb, "candidate": nc, "verdict": d["verdict"],
                         "why": d["why"][:300]})  # fmt: skip
    caught: Counter[str] = Counter()
    for (_, b), (_, c) in itertools.product(same, slow):
        caught[verdict.evaluate(b, c, rules, st, final=True)["verdict"]] += 1
    return {
        "rules": [f"{m} {tolerance:.0%}" for m in metrics],
        "restart_offset": offset,
        "scatter_credit": credit,
        "unchanged_pairs": dict(unchanged),
        "slow_against_each": dict(caught),
        "unchanged_held": held,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    settings = {name: judge(*s) for name, s in SETTINGS.items()}
    doc = {
        "command": "benchmarks/demo_pairs.py",
        "runs": sorted(str(p.relative_to(RUNS)) for p in RUNS.glob("*/*.json")),
        "settings": settings,
    }
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    for name, res in settings.items():
        print(f"{name}: unchanged {res['unchanged_pairs']}, slow {res['slow_against_each']}")


if __name__ == "__main__":
    main()
