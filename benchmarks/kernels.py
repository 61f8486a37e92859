"""Build-cache and focus figures on the demo stack.

    .venv/bin/python benchmarks/kernels.py [--arch ARCH] [--repeat N]

1. cold build vs cache hit of the demo extension (median of N, through
   `servegate build`'s own code: toolchain probe, source hashing, copy-back, inspection);
2. the share of the demo stack's GPU tests that a kernel-only change selects
   (`servegate focus` with the demo stack's focus map, counted by pytest's collection).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

from servegate import config
from servegate.kernels.focus import select
from servegate.kernels.targets import build_all

STACK = resources.files("servegate.demo") / "stack"
STACK_TOML = resources.files("servegate.demo") / "stack.toml"


def copy_stack(dest: Path) -> None:
    with resources.as_file(STACK) as src:
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "build"))


def timed_build(cfg: config.Config, checkout: Path, cache: Path) -> tuple[float, bool]:
    start = time.monotonic()
    (result,) = build_all(cfg, checkout, cache, dict(os.environ), checkout / "logs")
    return time.monotonic() - start, result.cached


def collected(checkout: Path, tests: list[str]) -> int:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", *tests],
        cwd=checkout,
        capture_output=True,
        text=True,
    ).stdout
    found = re.search(r"(\d+)(?:/\d+)? tests? (?:collected|selected)", out)
    return int(found.group(1)) if found else 0


def git(checkout: Path, *args: str) -> None:
    env = dict(
        os.environ,
        GIT_AUTHOR_NAME="b",
        GIT_AUTHOR_EMAIL="b@x",
        GIT_COMMITTER_NAME="b",
        GIT_COMMITTER_EMAIL="b@x",
    )
    subprocess.run(["git", *args], cwd=checkout, env=env, check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", action="append", default=[], help="instead of gfx1030")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with resources.as_file(STACK_TOML) as path:
        cfg = config.load(path, os.environ, build_only=True)
    if args.arch:
        cfg = dataclasses.replace(cfg, build=dataclasses.replace(cfg.build, archs=tuple(args.arch)))
    work = Path(tempfile.mkdtemp(prefix="servegate-bench-kernels-"))
    checkout = work / "stack"
    copy_stack(checkout)
    cold, hit = [], []
    for i in range(args.repeat):
        seconds, cached = timed_build(cfg, checkout, work / f"cache-{i}")
        assert not cached
        cold.append(seconds)
    for _ in range(args.repeat):
        (checkout / "build" / "libdemo_kernels.so").unlink()
        seconds, cached = timed_build(cfg, checkout, work / "cache-0")
        assert cached
        hit.append(seconds)
    print(
        f"demo extension for {', '.join(cfg.build.archs)}: cold build median "
        f"{statistics.median(cold):.3f}s (min {min(cold):.3f}), cache hit median "
        f"{statistics.median(hit):.3f}s (max {max(hit):.3f}), n={args.repeat}"
    )

    git(checkout, "init", "-q", "-b", "main")
    git(checkout, "add", "--all")
    git(checkout, "commit", "-q", "-m", "stack")
    git(checkout, "switch", "-q", "-c", "change")
    kernel = checkout / "kernels" / "demo_kernels.hip"
    kernel.write_text(kernel.read_text() + "\n// tuned block size\n")
    git(checkout, "commit", "-qam", "kernel-only change")
    sel = select(cfg.focus, checkout, "main", {}, [])
    chosen, total = collected(checkout, list(sel.tests)), collected(checkout, ["tests"])
    print(
        f"kernel-only change ({', '.join(sel.changed)}): selects {chosen} of {total} GPU tests "
        f"({100 * chosen / total:.0f}%) in {len(sel.tests)} file(s): {', '.join(sel.tests)}"
    )
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
