"""What a bench run measures: tiers, cases, sampling, the run's spec, the metric names.

``SCHEMA`` is the result file's version; ``HARNESS`` is bumped whenever a definition, a
validity rule or the prompt layout changes (it is part of the fingerprint).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from servegate.bench import fixtures, measure
from servegate.bench.tiers import TIERS
from servegate.engine.openai import Endpoint
from servegate.errors import ConfigError

if TYPE_CHECKING:  # the config imports the bench's tiers: a type, not an import cycle
    from servegate.config import Bench as BenchSettings

SCHEMA = 1
#: bumped whenever a definition, a validity rule or the prompt layout changes
HARNESS = "servegate-bench/1"
METRICS = (
    "prefill_tps",
    "generation_tps",
    "ttft_s",
    "mean_inter_token_latency_ms",
    "output_tps_whole_request",
    "decode_window_s",
    "engine_prefill_tps",
    "engine_generation_tps",
)
#: log lines that mean something compiled inside a measured window
WINDOW_LOG_PATTERNS = (
    r"Compiling a graph for",
    r"torch\.compile takes",
    r"[Cc]apturing (CUDA |cuda |HIP )?graphs?",
    r"[Tt]riton.*(JIT|[Aa]utotun|[Cc]ompiling)",
    r"Autotune Choices Stats",
    r"TunableOp.*[Tt]uning",
)


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_p: float = 0.95
    top_k: int = 20
    min_p: float = 0.0
    seed: int = 3407


@dataclass(frozen=True)
class Case:
    profile: str
    tier: str
    concurrency: int = 1
    required: bool = True

    @property
    def id(self) -> str:
        base = f"{self.profile}-{self.tier}"
        return base if self.concurrency == 1 else f"{base}-c{self.concurrency}"

    @property
    def nominal(self) -> int:
        return TIERS[self.tier]


@dataclass(frozen=True)
class Spec:
    endpoint: Endpoint
    model: str
    cases: tuple[Case, ...]
    repetitions: int = 3
    max_tokens: int = 1024
    tolerance_pct: float = 2.0
    warmup: bool = True
    ignore_eos: bool = False
    sampling: Sampling = field(default_factory=Sampling)
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    timeout: float = 1800.0
    command: str = ""
    system: str = ""
    rules: measure.Rules = field(default_factory=measure.Rules)
    window_log_patterns: tuple[str, ...] = WINDOW_LOG_PATTERNS
    #: measure the reference workload beside every group (the gate's drift check)
    reference: bool = True
    #: the model's tokenizer files, for a server without /tokenize ("": none)
    tokenizer: str = ""
    #: the Python (with transformers) that reads them ("": this one)
    tokenizer_python: str = ""


def parse_cases(
    profiles: Sequence[str],
    tiers: Sequence[str],
    concurrency: Sequence[int],
    report_only: Sequence[str] = (),
) -> tuple[Case, ...]:
    for t in tiers:
        if t not in TIERS:
            raise ConfigError(f"unknown tier {t!r}", hint=f"tiers: {', '.join(TIERS)}")
    for c in concurrency:
        if not 1 <= c <= 64:
            raise ConfigError(f"concurrency {c} is outside 1..64")
    for p in profiles:
        fixtures.load(p)
    cases = tuple(
        Case(p, t, c)
        for c in concurrency
        for p in profiles
        for t in sorted(tiers, key=TIERS.__getitem__)
    )
    ids = {c.id for c in cases}
    unknown = [r for r in report_only if r not in ids]
    if unknown:
        raise ConfigError(
            f"bench.report_only names no case: {', '.join(unknown)}",
            hint=f"cases of this run: {', '.join(sorted(ids))}",
        )
    return tuple(Case(c.profile, c.tier, c.concurrency, c.id not in report_only) for c in cases)


def spec_from_config(
    b: BenchSettings, endpoint: Endpoint, model: str, command: str = "", system: str = ""
) -> Spec:
    """A :class:`Spec` from the config's ``[bench]`` section."""
    return Spec(
        endpoint=endpoint,
        model=model,
        cases=parse_cases(b.profiles, b.tiers, b.concurrency, b.report_only),
        repetitions=b.repetitions,
        max_tokens=b.max_tokens,
        tolerance_pct=b.tolerance_pct,
        warmup=b.warmup,
        ignore_eos=b.ignore_eos,
        sampling=Sampling(b.temperature, b.top_p, b.top_k, b.min_p, b.seed),
        chat_template_kwargs=json.loads(b.chat_template_kwargs) if b.chat_template_kwargs else {},
        timeout=b.timeout,
        command=command,
        system=system,
        rules=measure.Rules(
            max_tokens=b.max_tokens,
            tolerance_pct=b.tolerance_pct,
            min_text_tokens=b.min_text_tokens,
            min_unique_ratio=b.min_unique_ratio,
            max_dominant_ratio=b.max_dominant_ratio,
            min_zlib_ratio=b.min_zlib_ratio,
            max_usage_excess=b.max_usage_excess,
            max_chunk_share=b.max_chunk_share,
            max_first_gap_share=b.max_first_gap_share,
        ),
        window_log_patterns=tuple(b.window_log_patterns) or WINDOW_LOG_PATTERNS,
        reference=b.reference,
        tokenizer=b.tokenizer,
        tokenizer_python=b.tokenizer_python,
    )
