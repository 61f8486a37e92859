"""How long `servegate lint` and `servegate render` take on the V620 profile.

    .venv/bin/python benchmarks/profile_tools.py [--repeat N]

Each run is the whole command as a user types it — a new process: interpreter start,
imports, loading the profile with its includes, resolving, rendering or linting with
every shipped rule — timed from outside (wall clock). Profiles: `v620-tp4` and its
piecewise variant (an include). Target: under 0.5 s each.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

PARAMS = [
    "--param", "runtime=/home/george/v620-experiments/upstream-20260915/v620-vllm-testing",
    "--param", "model=/home/george/v620-vllm/models/intel-autoround",
    "--release", "/home/george/v620-experiments/baseline-git-20260922",
    "--sha", "532ed3f930f475e731c82726e079f3374ab5b33f",
    "--port", "8080", "--config", "/nonexistent/servegate.toml",
]  # fmt: skip


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {result.returncode}:\n{result.stderr}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    base = [sys.executable, "-m", "servegate"]
    timed([*base, "--version"])  # warm the file cache once
    print(f"{'command':<44} {'median s':>9} {'p90 s':>7} {'max s':>7}  (n={args.repeat})")
    worst = 0.0
    for profile in ("v620-tp4", "v620-tp4-piecewise"):
        for command in (["render"], ["render", "--format", "unit"], ["lint"]):
            argv = [*base, *command, "--profile", profile, *PARAMS]
            runs = sorted(timed(argv) for _ in range(args.repeat))
            p90 = runs[int(0.9 * (len(runs) - 1))]
            median = statistics.median(runs)
            worst = max(worst, median)
            label = f"{' '.join(command)} --profile {profile}"
            print(f"{label:<44} {median:9.3f} {p90:7.3f} {runs[-1]:7.3f}")
    floor = sorted(timed([*base, "--version"]) for _ in range(args.repeat))
    print(f"{'servegate --version (interpreter + CLI)':<44} {statistics.median(floor):9.3f}")
    print(
        f"target: < 0.5 s each — {'met' if worst < 0.5 else 'NOT met'} (worst median {worst:.3f} s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
