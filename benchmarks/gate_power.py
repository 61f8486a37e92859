"""Gate power on the real vLLM CPU server: a slower release is failed, an identical one passes.

    .venv/bin/python benchmarks/gate_power.py [--runs 10] [--slow-arg=--dtype=bfloat16]

Three server instances of the demo's tiny model (real vLLM, CPU), each started fresh:

- A1 (the live release): ``--runs`` baseline measurements;
- A2 (an identical release): ``--runs`` candidate measurements;
- B  (a release with a slower launch setting, by default ``--dtype=bfloat16``, which
  this CPU emulates: decode ~10 % slower; ``--slow-arg=--enforce-eager`` for no
  torch.compile, ~20 % slower): ``--runs`` candidate measurements.

Each measurement is the demo's gate bench (regular prose, 2k tier, 512 tokens out,
3 repetitions, no more: the cap is 3). Candidate run i is judged against baseline run i
with the gate's rule for decode (``generation_tps``, 5 % tolerance, bootstrap interval
of the median ratio, the median deciding at the cap). Prints how many of the runs each
way the gate got right.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from servegate.bench import results, runner, verdict
from servegate.demo.local_server import vllm_server
from servegate.engine.openai import Endpoint

RULE = verdict.Rule("generation_tps", "higher", 0.05)


def measure(url: str, runs: int, out: Path, name: str) -> list[results.Samples]:
    spec = runner.Spec(
        Endpoint(url), "demo", runner.parse_cases(["regular"], ["2k"], [1]),
        repetitions=3, max_tokens=512, sampling=runner.Sampling(seed=-1),
    )  # fmt: skip
    samples = []
    for i in range(runs):
        run_spec = spec if i == 0 else runner.Spec(**{**spec.__dict__, "warmup": False})
        doc = runner.run(run_spec, out / f"{name}-{i:02d}.json")
        s = results.from_result(doc, f"{name}-{i:02d}")
        gen = s.cases["regular-2k"].metrics.get("generation_tps", [])
        print(
            f"  {name} run {i + 1}: decode {', '.join(f'{g:.1f}' for g in gen)} tok/s", flush=True
        )
        samples.append(s)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--slow-arg", default="--dtype=bfloat16")
    args = parser.parse_args()
    found: dict[str, list[results.Samples]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, extra in (("A1", ()), ("A2", ()), ("B", (args.slow_arg,))):
            print(f"{name}: starting vLLM {' '.join(extra) or '(as released)'}", flush=True)
            with vllm_server(work, *extra) as server:
                found[name] = measure(server.url, args.runs, work, name)
    settings = verdict.Settings()
    tally: dict[str, list[str]] = {"A2": [], "B": []}
    for side in tally:
        for base, cand in zip(found["A1"], found[side], strict=True):
            d = verdict.evaluate(base, cand, [RULE], settings)
            tally[side].append(d["verdict"])

    def med(side: str) -> float:
        return statistics.median(
            v for s in found[side] for v in s.cases["regular-2k"].metrics["generation_tps"]
        )

    slow = med("B") / med("A1")
    print(f"decode medians: A1 {med('A1'):.1f}, A2 {med('A2'):.1f}, B {med('B'):.1f} tok/s "
          f"(B/A1 = {slow:.3f})")  # fmt: skip
    identical_pass = tally["A2"].count("PASS")
    slow_fail = tally["B"].count("FAIL")
    print(f"identical release: PASS {identical_pass} of {args.runs}  ({', '.join(tally['A2'])})")
    verdicts = ", ".join(tally["B"])
    print(f"slower release ({args.slow_arg}): FAIL {slow_fail} of {args.runs}  ({verdicts})")
    summary: dict[str, Any] = {"identical_pass": identical_pass, "slow_fail": slow_fail}
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
