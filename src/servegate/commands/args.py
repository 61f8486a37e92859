"""Options several commands share: each command's own ``add_arguments`` calls these."""

from __future__ import annotations

import argparse
from pathlib import Path

from servegate import config, flags

RELEASE_REF_HELP = (
    "a runner that releases: take only jobs of this ref whose workflow file comes from it "
    "(e.g. refs/heads/main); pull requests' jobs are refused"
)
RELEASE_REPO_HELP = (
    "with --release-ref on an organisation's runner: the repository (OWNER/REPO) whose "
    "jobs it takes (default: the one --url names)"
)


def common(parser: argparse.ArgumentParser) -> None:
    """``--config``, ``--json`` and ``--verbose``: what every config-reading command takes."""
    parser.add_argument(
        "--config",
        type=Path,
        default=Path("servegate.toml"),
        metavar="PATH",
        help="config file (default: ./servegate.toml)",
    )
    output(parser)


def output(parser: argparse.ArgumentParser) -> None:
    """``--json`` and ``--verbose``."""
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    parser.add_argument("-v", "--verbose", action="store_true", help="echo every command run")


def bench_run(p: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """How a bench reaches and measures a server (``bench``, ``bench load``, ``compare``):
    where the server is, plus every ``[bench]`` setting that declares a flag
    (:mod:`servegate.flags`), but those in ``skip``."""
    p.add_argument("--url", help="server base URL (default: from the config's [service])")
    p.add_argument("--model", help="served model name (default: service.model or the first)")
    p.add_argument("--api-key-env", metavar="NAME", help="environment variable with the API key")
    flags.add(p, config.Bench, "bench", skip)
    p.add_argument("--output", type=Path, metavar="FILE", help="result file (JSON)")
    p.add_argument("--no-lease", action="store_true", help="do not take the host's GPU lease")
    p.add_argument(
        "--engine",
        choices=("vllm", "transformers", "openai"),
        help="the server's engine (default: the config's; with --url: from /v1/models)",
    )


def launch(p: argparse.ArgumentParser) -> None:
    """Which launch ``render`` and ``lint`` look at."""
    p.add_argument(
        "--profile", help="a shipped profile name or a profile file (default: the config's)"
    )
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a profile parameter (repeatable)",
    )
    p.add_argument("--release", metavar="DIR", help="the release directory ({release})")
    p.add_argument("--sha", help="the release's commit (keys the compile caches)")
    p.add_argument("--port", type=int, help="the service port ({port})")
    common(p)
