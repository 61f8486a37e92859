"""Probes: short real requests whose answers say whether a served model works.

- ``smoke``: one chat completion returns text and usage counts;
- ``correctness``: known answers (contains / starts-with), each prompt asked twice, no
  U+FFFD and no storm of one character;
- ``prefix_reuse``: an initial long turn, then the same conversation plus one turn,
  under a unique cache salt: ≥ 70 % of the follow-up prompt must come from the cache
  and its TTFT must be < 0.5 x the initial one;
- ``vision``: a generated image with known coloured regions must be described by
  them, then a long conversation with the image first must reuse the cache;
- ``spec_decode``: the speculative-decoding acceptance rate from ``/metrics`` deltas.
"""

from __future__ import annotations

import base64
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from servegate.bench import client, fixtures, image, prom, sizing
from servegate.bench.measure import cached_tokens
from servegate.bench.tiers import TIERS
from servegate.config import CorrectnessCase
from servegate.engine import openai


@dataclass(frozen=True)
class ProbeResult:
    name: str
    ok: bool
    reason: str
    seconds: float
    evidence: dict[str, Any] = field(default_factory=dict)


def smoke(
    endpoint: openai.Endpoint, model: str, prompt: str, max_tokens: int, timeout: float
) -> ProbeResult:
    """One chat completion must return text and usage counts."""
    start = time.monotonic()

    def done(ok: bool, reason: str, **evidence: Any) -> ProbeResult:
        return ProbeResult("smoke", ok, reason, time.monotonic() - start, evidence)

    try:
        body = openai.chat(endpoint, model, prompt, max_tokens, timeout)
    except (httpx.HTTPError, ValueError) as exc:
        return done(False, f"chat completion failed: {type(exc).__name__}: {exc}")
    choices = body.get("choices") or []
    text = choices[0].get("message", {}).get("content") if choices else None
    usage = body.get("usage") or {}
    prompt_tokens = int(usage.get("prompt_tokens") or 0)
    completion_tokens = int(usage.get("completion_tokens") or 0)
    evidence = {
        "model": model,
        "text": (text or "")[:200],
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
    }
    if not text:
        return done(False, "the completion carried no text", **evidence)
    if prompt_tokens <= 0 or completion_tokens <= 0:
        return done(False, f"usage counts missing or zero: {usage}", **evidence)
    return done(True, f"{completion_tokens} tokens of text", **evidence)


_STORM = re.compile(r"(.)\1{11,}", re.S)


def answer_problems(answer: str, case: CorrectnessCase) -> list[str]:
    problems = []
    seen = answer[: case.within] if case.within else answer
    if case.mode == "starts-with":
        if not answer.lstrip().startswith(case.expect):
            problems.append(f"does not start with {case.expect!r}")
    elif case.expect.lower() not in seen.lower():
        where = f" in its first {case.within} characters" if case.within else ""
        problems.append(f"no {case.expect!r}{where}")
    if "\ufffd" in answer:
        problems.append("contains U+FFFD (broken decoding)")
    storm = _STORM.search(answer)
    if storm:
        problems.append(f"a storm of {storm.group(1)!r}")
    return problems


def correctness(
    endpoint: openai.Endpoint,
    model: str,
    cases: Sequence[CorrectnessCase],
    timeout: float,
    asks: int = 2,
) -> ProbeResult:
    start = time.monotonic()
    answers: list[dict[str, Any]] = []
    failed = 0
    for case in cases:
        for n in range(asks):
            try:
                body = openai.chat(endpoint, model, case.prompt, 32, timeout)
                choices = body.get("choices") or []
                text = str(choices[0].get("message", {}).get("content") or "") if choices else ""
                problems = answer_problems(text, case)
            except (httpx.HTTPError, ValueError) as exc:
                text, problems = "", [f"request failed: {exc}"]
            failed += bool(problems)
            answers.append(
                {"prompt": case.prompt, "ask": n + 1, "answer": text[:120], "problems": problems}
            )
    total = len(answers)
    ok = failed == 0 and total > 0
    first = next((a for a in answers if a["problems"]), None)
    reason = (
        f"{total} answers correct"
        if ok
        else f"{failed} of {total} answers wrong; first: {first['prompt']!r} → "
        f"{first['answer']!r} ({'; '.join(first['problems'])})"
        if first
        else "no correctness prompts"
    )
    return ProbeResult("correctness", ok, reason, time.monotonic() - start, {"answers": answers})


@dataclass
class Turn:
    ttft_s: float | None
    prompt_tokens: int | None
    cached_metrics: float | None
    cached_usage: int | None
    text: str
    error: str


def _turn(
    endpoint: openai.Endpoint, model: str, messages: list[dict[str, Any]], salt: str, timeout: float
) -> Turn:
    before = prom.parse(client.metrics_text(endpoint))
    body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": 16,
                            "temperature": 0}  # fmt: skip
    if endpoint.adapter.extended_sampling:
        body["cache_salt"] = salt
    st = client.stream_chat(endpoint, body, timeout)
    after = prom.parse(client.metrics_text(endpoint))
    usage_cache = cached_tokens(st)
    return Turn(
        (st.first_text_at - st.started) if st.first_text_at else None,
        st.usage.get("prompt_tokens") if isinstance(st.usage.get("prompt_tokens"), int) else None,
        prom.delta(before, after, endpoint.adapter.metrics.prefix_hits),
        max(usage_cache.values()) if usage_cache else None,
        st.content,
        st.error,
    )


def _reuse_verdict(
    name: str,
    first: Turn,
    second: Turn,
    min_cached: float,
    max_ratio: float,
    start: float,
    extra: dict[str, Any],
) -> ProbeResult:
    evidence: dict[str, Any] = {
        **extra,
        "initial_prompt_tokens": first.prompt_tokens,
        "initial_ttft_s": first.ttft_s,
        "followup_prompt_tokens": second.prompt_tokens,
        "followup_ttft_s": second.ttft_s,
    }
    for turn in (first, second):
        if turn.error or turn.ttft_s is None or not turn.prompt_tokens:
            why = turn.error or "no text or no usage"
            return ProbeResult(
                name, False, f"a turn failed: {why}", time.monotonic() - start, evidence
            )
    cached = second.cached_usage if second.cached_usage else second.cached_metrics
    source = "usage" if second.cached_usage else "/metrics prefix_cache_hits delta"
    if cached is None:
        return ProbeResult(
            name, False,
            "the server reports cached tokens neither in usage nor in /metrics",
            time.monotonic() - start, evidence,
        )  # fmt: skip
    assert second.prompt_tokens
    assert first.ttft_s
    assert second.ttft_s is not None
    share = cached / second.prompt_tokens
    ratio = second.ttft_s / first.ttft_s
    evidence.update(cached_tokens=cached, cached_source=source, cached_share=round(share, 4),
                    ttft_ratio=round(ratio, 4))  # fmt: skip
    problems = []
    if share < min_cached:
        problems.append(
            f"only {share:.1%} of the follow-up came from the cache (< {min_cached:.0%})"
        )
    if ratio >= max_ratio:
        problems.append(f"follow-up TTFT is {ratio:.2f} x the initial (needs < {max_ratio})")
    reason = "; ".join(problems) or (
        f"{share:.1%} reused, TTFT {first.ttft_s:.2f}s → {second.ttft_s:.2f}s"
    )
    return ProbeResult(name, not problems, reason, time.monotonic() - start, evidence)


class TooLong(ValueError):
    pass


def _long_text(endpoint: openai.Endpoint, model: str, tier: str) -> str:
    fx = fixtures.load("regular")
    tok = sizing.probe(endpoint, model)
    if tier not in TIERS:
        raise TooLong(f"unknown tier {tier!r} (tiers: {', '.join(TIERS)})")
    if tok.max_model_len and TIERS[tier] + 512 > tok.max_model_len:
        raise TooLong(
            f"a {tier} conversation does not fit the server's max model length "
            f"{tok.max_model_len}: choose a smaller tier in [probes]"
        )
    sized = sizing.size(endpoint, model, tok, fx, TIERS[tier],
                        lambda text: [{"role": "user", "content": text}])  # fmt: skip
    return fx.head(sized.chars)


def prefix_reuse(
    endpoint: openai.Endpoint,
    model: str,
    tier: str,
    min_cached: float,
    max_ratio: float,
    timeout: float,
) -> ProbeResult:
    start = time.monotonic()
    salt = f"servegate-probe-{uuid.uuid4().hex}"
    try:
        text = _long_text(endpoint, model, tier)
    except (TooLong, httpx.HTTPError) as exc:
        return ProbeResult("prefix_reuse", False, str(exc), time.monotonic() - start)
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": f"{text}\n\nSummarise the text above in one sentence."}
    ]
    first = _turn(endpoint, model, messages, salt, timeout)
    messages += [
        {"role": "assistant", "content": first.text or "(no answer)"},
        {"role": "user", "content": "Now name the first topic it covers."},
    ]
    second = _turn(endpoint, model, messages, salt, timeout)
    return _reuse_verdict("prefix_reuse", first, second, min_cached, max_ratio, start,
                          {"tier": tier, "salt": salt})  # fmt: skip


def vision(
    endpoint: openai.Endpoint,
    model: str,
    size: int,
    followup_tier: str,
    min_cached: float,
    max_ratio: float,
    timeout: float,
) -> ProbeResult:
    start = time.monotonic()
    png = image.regions_png(size)
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    picture = {"type": "image_url", "image_url": {"url": url}}
    ask = "This image has two coloured regions inside a white outline. Name their two colours."
    evidence: dict[str, Any] = {"image": f"{size}x{size} RGB PNG", "regions": sorted(image.REGIONS)}
    try:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": [picture, {"type": "text", "text": ask}]}],
            "max_tokens": 48,
            "temperature": 0,
        }
        with endpoint.client(timeout) as c:
            resp = c.post("/v1/chat/completions", json=body)
            resp.raise_for_status()
            answer = str(resp.json()["choices"][0]["message"]["content"] or "")
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
        return ProbeResult("vision", False, f"the image request failed: {exc}",
                           time.monotonic() - start, evidence)  # fmt: skip
    evidence["answer"] = answer[:200]
    missing = [name for name in image.REGIONS if name not in answer.lower()]
    if missing:
        return ProbeResult("vision", False, f"the answer does not name {', '.join(missing)}: "
                           f"{answer[:80]!r}", time.monotonic() - start, evidence)  # fmt: skip
    salt = f"servegate-vision-{uuid.uuid4().hex}"
    try:
        text = _long_text(endpoint, model, followup_tier)
    except (TooLong, httpx.HTTPError) as exc:
        return ProbeResult("vision", False, str(exc), time.monotonic() - start, evidence)
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [picture, {"type": "text", "text": f"{ask}\n\n{text}"}]}
    ]
    first = _turn(endpoint, model, messages, salt, timeout)
    messages += [
        {"role": "assistant", "content": first.text or "(no answer)"},
        {"role": "user", "content": "Which colour is on the left?"},
    ]
    second = _turn(endpoint, model, messages, salt, timeout)
    return _reuse_verdict("vision", first, second, min_cached, max_ratio, start, evidence)


def spec_decode(
    endpoint: openai.Endpoint, model: str, timeout: float, min_acceptance: float = 0.05
) -> ProbeResult:
    start = time.monotonic()
    before = prom.parse(client.metrics_text(endpoint))
    text = fixtures.load("regular").head(2000)
    body = {"model": model, "messages": [{"role": "user", "content": text + "\n\nContinue."}],
            "max_tokens": 256, "temperature": 0}  # fmt: skip
    st = client.stream_chat(endpoint, body, timeout)
    after = prom.parse(client.metrics_text(endpoint))
    names = endpoint.adapter.metrics
    accepted = prom.delta(before, after, names.spec_accepted)
    drafted = prom.delta(before, after, names.spec_draft)
    evidence = {"accepted": accepted, "drafted": drafted, "error": st.error}
    if st.error:
        return ProbeResult("spec_decode", False, f"the request failed: {st.error}",
                           time.monotonic() - start, evidence)  # fmt: skip
    if accepted is None or not drafted:
        why = ("the server exports no speculative-decoding counters (or drafted nothing): "
               "nothing to judge; drop spec_decode from the checks if the release does not "
               "decode speculatively")  # fmt: skip
        return ProbeResult("spec_decode", False, why, time.monotonic() - start, evidence)
    rate = accepted / drafted
    evidence["acceptance"] = round(rate, 4)
    ok = rate >= min_acceptance
    return ProbeResult("spec_decode", ok, f"acceptance {rate:.1%} of {drafted:.0f} drafted tokens",
                       time.monotonic() - start, evidence)  # fmt: skip
