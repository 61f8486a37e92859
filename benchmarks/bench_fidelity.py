"""Do servegate's TTFT and inter-token latency agree with vLLM's own histograms?

    .venv/bin/python benchmarks/bench_fidelity.py [--tiers 2k,8k] [--repetitions 3]

Starts the real vLLM CPU server with the demo's tiny model, runs ``servegate bench``
(one stream per group, so each group's ``/metrics`` delta holds exactly one request),
and compares every trial's ``ttft_s`` and ``mean_inter_token_latency_ms`` with the mean
of ``vllm:time_to_first_token_seconds`` and ``vllm:inter_token_latency_seconds``
observed across that request. Target: within 2 % at the field's tiers (8k and up).

Smaller tiers are shown too: there the client's TTFT is longer than vLLM's by a
constant ~0.1 s — the frontend's chat templating and tokenization, which happen before
vLLM stamps the request's arrival and which a user does wait for.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from servegate.bench import cases, runner
from servegate.demo.local_server import vllm_server
from servegate.engine.openai import Endpoint


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiers", default="2k,8k")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=1024)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, vllm_server(Path(tmp)) as server:
        spec = cases.Spec(
            Endpoint(server.url), "demo",
            cases.parse_cases(["regular", "coding"], args.tiers.split(","), [1]),
            repetitions=args.repetitions, max_tokens=args.max_tokens,
            sampling=cases.Sampling(seed=-1),
        )  # fmt: skip
        result = runner.run(spec, Path(tmp) / "fidelity.json")
    ttft_dev, itl_dev = [], []
    field_ttft: list[float] = []
    print(f"{'case':<14}{'TTFT s':>9}{'vLLM':>9}{'dev %':>8}{'ITL ms':>9}{'vLLM':>9}{'dev %':>8}")
    for case in result["cases"]:
        for group in case["groups"]:
            t, sm = group["trials"][0], group["server_metrics"]
            if not t["performance_valid"] or sm["ttft_mean_s"] is None or sm["itl_mean_s"] is None:
                print(f"{case['id']:<14} skipped: {t['invalid_reasons'] or 'no histogram delta'}")
                continue
            ttft, itl_client = t["ttft_s"], t["mean_inter_token_latency_ms"]
            if t["client_timing"] or ttft is None or itl_client is None:
                # held back between engine and client: not comparable
                print(f"{case['id']:<14} skipped: {t['client_timing'] or 'no client timing'}")
                continue
            d1 = (ttft / sm["ttft_mean_s"] - 1) * 100
            itl_server = sm["itl_mean_s"] * 1000
            d2 = (itl_client / itl_server - 1) * 100
            ttft_dev.append(abs(d1))
            if case["nominal_tokens"] >= 8192:
                field_ttft.append(abs(d1))
            itl_dev.append(abs(d2))
            itl = t["mean_inter_token_latency_ms"]
            print(
                f"{case['id']:<14}{t['ttft_s']:>9.3f}{sm['ttft_mean_s']:>9.3f}{d1:>+8.2f}"
                f"{itl:>9.3f}{itl_server:>9.3f}{d2:>+8.2f}"
            )
    if not ttft_dev:
        print("no valid trial")
        return 1
    ok = bool(field_ttft) and max(field_ttft) <= 2 and max(itl_dev) <= 2
    field = max(field_ttft, default=float("nan"))
    print(
        f"TTFT |dev| median {statistics.median(ttft_dev):.2f} %, max {max(ttft_dev):.2f} % "
        f"(all tiers); max {field:.2f} % at 8k and up; ITL |dev| median "
        f"{statistics.median(itl_dev):.2f} %, max {max(itl_dev):.2f} % (n={len(ttft_dev)}; "
        f"target <= 2 % at the field's tiers): {'OK' if ok else 'OUTSIDE'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
