"""Options several commands share: each command's own ``add_arguments`` calls these."""

from __future__ import annotations

import argparse
from pathlib import Path

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


def bench_run(p: argparse.ArgumentParser) -> None:
    """How a bench reaches and measures a server (``bench``, ``bench load``, ``compare``)."""
    p.add_argument("--url", help="server base URL (default: from the config's [service])")
    p.add_argument("--model", help="served model name (default: service.model or the first)")
    p.add_argument("--api-key-env", metavar="NAME", help="environment variable with the API key")
    p.add_argument("--profiles", metavar="LIST", help="regular,coding (default: bench.profiles)")
    p.add_argument("--tiers", metavar="LIST",
                   help="of 8k,16k,32k,64k,128k, or 1k,2k,4k for smoke-sized runs "
                   "(default: bench.tiers)")  # fmt: skip
    p.add_argument("--repetitions", type=int, metavar="N", help="groups per case")
    p.add_argument("--concurrency", metavar="LIST", help="streams started together, e.g. 1,4")
    p.add_argument("--max-tokens", type=int, metavar="N", help="exact output tokens (1024)")
    p.add_argument("--tolerance", type=float, metavar="PCT", help="prompt size tolerance in %%")
    p.add_argument("--seed", type=int, help="per-request seed (3407; -1: none sent)")
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-up request")
    p.add_argument("--ignore-eos", action="store_true", help="force the output length (recorded)")
    p.add_argument("--output", type=Path, metavar="FILE", help="result file (JSON)")
    p.add_argument("--no-lease", action="store_true", help="do not take the host's GPU lease")
    p.add_argument(
        "--engine",
        choices=("vllm", "transformers", "openai"),
        help="the server's engine (default: the config's; with --url: from /v1/models)",
    )
    p.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="the model's tokenizer files, to size prompts for a server without /tokenize",
    )
    p.add_argument(
        "--tokenizer-python",
        metavar="PATH",
        help="a Python with transformers that reads --tokenizer (default: this one)",
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
