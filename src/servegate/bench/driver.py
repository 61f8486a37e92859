"""``servegate bench``: long-context cases against an OpenAI-compatible server.

A run sizes every prompt for the served tokenizer, warms the model up once, then
measures each case (profile x tier x concurrency) in repetitions; the streams of a
group start together behind a barrier. Every request carries a run-scoped tag at the
very start of its prompt (and, on vLLM, a ``cache_salt``), so no trial starts from a
warm prefix cache; on vLLM the ``prefix_cache_hits`` counter must also stay still
across the group. The result file is rewritten atomically after every group.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import httpx

from servegate.bench import client, document, fixtures, measure, prom, reference, sizing, telemetry
from servegate.bench.cases import Case, Spec
from servegate.bench.schema import Case as CaseDoc
from servegate.bench.schema import Group, Result, ServerMetrics, Trial
from servegate.bench.sse import Stream, now
from servegate.engine import adapters, openai
from servegate.engine.openai import Endpoint
from servegate.errors import BenchFailed
from servegate.pipeline.atomic import write_text
from servegate.pipeline.stages import QuietReporter, Reporter


class LogWindow:
    """The server's log file, read between two marks (the measured window)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def mark(self) -> int:
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    def since(self, mark: int) -> str | None:
        """The log written since ``mark``; across a rotation (supervisord's ``NAME.1``),
        the rotated file's rest and the new file. None: the window cannot be read (the
        file is gone, unreadable, or shorter than the mark with nothing rotated): its
        lines were not checked, and the trials must not pass as if they had been."""
        cap = 4 * 1024 * 1024
        try:
            parts = []
            if self.path.stat().st_size < mark:
                rotated = self.path.with_name(self.path.name + ".1")
                if not rotated.is_file() or rotated.stat().st_size < mark:
                    return None
                with rotated.open("rb") as f:
                    f.seek(mark)
                    parts.append(f.read(cap))
                mark = 0
            with self.path.open("rb") as f:
                f.seek(mark)
                parts.append(f.read(cap))
        except OSError:
            return None
        return b"".join(parts).decode(errors="replace")


#: tokens a server's usage may claim beyond the recount of its streamed text, whatever
#: its length: special tokens the text does not show (a reasoning model's think tags, the
#: 9 or so markers of gpt-oss's harmony format)
USAGE_SLACK = 12


class Bench:
    """One bench run: ``prepare()``, ``warm_up()``, ``measure(case, n)``…, ``finish()``."""

    def __init__(
        self,
        spec: Spec,
        output: Path | None,
        reporter: Reporter | None = None,
        log: LogWindow | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.spec = spec
        self.output = output
        self.reporter = reporter or QuietReporter()
        self.log = log
        self.environ = environ if environ is not None else {}
        self.scope = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]
        self.prompts: dict[str, str] = {}
        self.result: Result = document.new_result(spec, self.scope, str(log.path) if log else None)
        self._patterns = [re.compile(p) for p in spec.window_log_patterns]
        #: more checks of a measured window's log: the text → reasons the trials are invalid
        self.window_check: Callable[[str], list[str]] | None = None
        self._http: contextlib.ExitStack | None = None
        self._client: httpx.Client | None = None
        #: which service start the next groups measure (0: the first; see :meth:`restarted`)
        self.start = 0
        #: the GPU's vendor tool, read beside every group (None: a CPU server)
        self.telemetry = telemetry.find()
        #: what sized the prompts, kept to count every answer again (see :meth:`_recount`)
        self._tokenizer: sizing.Tokenizer | None = None

    def restarted(self) -> None:
        """The service was restarted: new groups belong to the next start, and the pooled
        connections to the old process are dropped."""
        self.close()
        self.start += 1
        self.result.setdefault("starts", []).append(
            {"start": self.start, "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
        )

    @property
    def http(self) -> httpx.Client:
        """The run's pooled client (opened on first use, closed by finish/fail/close)."""
        if self._client is None:
            self._http = contextlib.ExitStack()
            self._client = self._http.enter_context(
                client.pool(self.spec.endpoint, self.spec.timeout)
            )
        return self._client

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
        self._http = self._client = None

    def release(self) -> None:
        """The connections and the tokenizer helper (:meth:`finish` and :meth:`fail` do
        this; a caller that stops after :meth:`prepare` without either calls it)."""
        self.close()
        if self._tokenizer is not None and self._tokenizer.local is not None:
            self._tokenizer.local.close()
        self._tokenizer = None

    # -- the result document ---------------------------------------------------------

    def save(self) -> None:
        self.result["performance_table"] = document.table(self.result)
        if self.output is not None:
            self.output.parent.mkdir(parents=True, exist_ok=True)
            write_text(self.output, json.dumps(self.result, indent=1) + "\n")

    def fail(self, status: str, message: str) -> None:
        self.release()
        self.result["status"] = status
        self.result["error"] = message
        self.result["finished_at"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        self.save()

    def finish(self) -> Result:
        self.release()
        self.result["status"] = "complete"
        self.result["finished_at"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        self.save()
        return self.result

    # -- preparing -------------------------------------------------------------------

    def prepare(self) -> None:
        """Server reachable, model served, every prompt sized and within the max length."""
        s = self.spec
        try:
            served = client.models(s.endpoint)
        except (httpx.HTTPError, ValueError) as exc:
            raise BenchFailed(
                f"the server at {s.endpoint.shown_url} does not answer /v1/models: {exc}",
                hint="start the server (or pass the right --url); nothing was measured",
            ) from None
        ids = [str(m.get("id")) for m in served]
        pinned = s.endpoint.engine is not None and not s.endpoint.engine.lists_served_model
        if s.model not in ids and not pinned:
            raise BenchFailed(
                f"model {s.model!r} is not served at {s.endpoint.shown_url} (served: {ids})",
                hint="pass --model with one of the served names",
            )
        engine = s.endpoint.engine or adapters.detect(served)
        self.spec = s = replace(s, endpoint=replace(s.endpoint, engine=engine))
        self.close()  # the pool speaks to the identified engine from here on
        has_metrics = bool(prom.parse(client.metrics_text(s.endpoint, http=self.http)))
        self.result["telemetry"] = telemetry.describe(self.telemetry)
        local = (
            sizing.LocalTokenizer(Path(s.tokenizer), s.tokenizer_python or sys.executable)
            if s.tokenizer
            else None
        )
        self.release()
        try:
            tok = sizing.probe(s.endpoint, s.model, local)
            self._size(s, tok, has_metrics)
        except BaseException:
            if local is not None:
                local.close()
            raise
        self._tokenizer = tok  # the helper stays up: it counts every answer again
        self.save()

    def _size(self, s: Spec, tok: sizing.Tokenizer, has_metrics: bool) -> None:
        """The engine's facts, then every prompt sized for its tokenizer."""
        self.result["engine"] = {
            "resolved": s.endpoint.adapter.name,
            "metrics": has_metrics,
            "tokenize": tok.available,
            "tokenizer_source": tok.source,
            "tokenizer_fingerprint": tok.fingerprint,
            "max_model_len": tok.max_model_len,
        }
        too_long = [
            c for c in s.cases if tok.max_model_len and c.nominal + s.max_tokens > tok.max_model_len
        ]
        if too_long:
            need = max(c.nominal for c in too_long) + s.max_tokens
            raise BenchFailed(
                f"tier(s) {', '.join(sorted({c.tier for c in too_long}))} need up to {need} "
                f"tokens (prompt + {s.max_tokens} output) but the server's max model length "
                f"is {tok.max_model_len}",
                hint="choose smaller tiers, or serve with a larger --max-model-len",
            )
        for case in s.cases:
            key = f"{case.profile}-{case.tier}"
            if key in self.prompts:
                continue
            fx = fixtures.load(case.profile)
            self.reporter.progress(f"sizing {key} for the served tokenizer")
            sized = sizing.size(
                s.endpoint, s.model, tok, fx, case.nominal,
                functools.partial(self._sizing_messages, case.profile),
                self.environ,
            )  # fmt: skip
            if sized.tokens is not None and sized.tokens < case.nominal * 0.98:
                raise BenchFailed(
                    f"the {case.profile} fixture is {sized.tokens} tokens for this tokenizer: "
                    f"too short for the {case.tier} tier",
                    hint="drop that tier for this model",
                )
            self.prompts[key] = fx.head(sized.chars)
            self.result["sizing"][key] = {
                "chars": sized.chars,
                "tokens": sized.tokens,
                "method": sized.method,
            }

    def _sizing_messages(self, profile: str, text: str) -> list[dict[str, Any]]:
        """A tag of the measured tags' shape, fixed so the sizing cache can hit."""
        return self.messages(profile, text, "20000101T000000-00000000-sizing-000-0")

    def messages(self, profile: str, text: str, tag: str) -> list[dict[str, Any]]:
        """The tag goes first: prefix caches key on leading tokens."""
        return [
            {"role": "system", "content": f"[{tag}] You are a careful, thorough assistant."},
            {"role": "user", "content": f"{text}\n\n{fixtures.INSTRUCTIONS[profile]}"},
        ]

    def payload(
        self, messages: list[dict[str, Any]], max_tokens: int, ignore_eos: bool, tag: str
    ) -> dict[str, Any]:
        s = self.spec
        body: dict[str, Any] = {
            "model": s.model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": s.sampling.temperature,
            "top_p": s.sampling.top_p,
        }
        if s.sampling.seed >= 0:
            body["seed"] = s.sampling.seed
        if s.endpoint.adapter.extended_sampling:
            body.update(top_k=s.sampling.top_k, min_p=s.sampling.min_p, cache_salt=tag)
            if ignore_eos:
                # the tokens past an end-of-sequence show in the text, so the answer's
                # recount sees what usage counts (they are special tokens, else hidden)
                body.update(ignore_eos=True, skip_special_tokens=False)
        if s.chat_template_kwargs:
            body["chat_template_kwargs"] = dict(s.chat_template_kwargs)
        return body

    # -- measuring -------------------------------------------------------------------

    def warm_up(self) -> None:
        """One ~1,024-token prompt, 512 output tokens (``ignore_eos`` where accepted),
        then one request at each measured prompt and output length."""
        if not self.spec.warmup:
            self.result["warmup"] = {"skipped": True}
            return
        self.reporter.progress("warm-up: ~1,024-token prompt, 512 output tokens")
        tag = f"{self.scope}-warmup"
        text = fixtures.load("regular").head(3500)
        body = self.payload(self.messages("regular", text, tag), 512, True, tag)
        stream = client.stream_chat(self.spec.endpoint, body, self.spec.timeout, self.http)
        self.result["warmup"] = {
            "ok": not stream.error,
            "error": stream.error,
            "usage": stream.usage,
            "ignore_eos": body.get("ignore_eos", False),
            "seconds": round((stream.done_at or now()) - stream.started, 3),
        }
        self.save()
        if stream.error:
            raise BenchFailed(
                f"the warm-up request failed: {stream.error}",
                hint=self._warmup_hint("check that the server answers a small chat completion"),
            )
        self._warm_shapes()

    def _warm_shapes(self) -> None:
        """One request at each measured prompt and output length, not measured: the first
        request of a new shape pays for allocations and kernels picked for it, which
        would otherwise land in the first group."""
        shapes = []
        for key, text in self.prompts.items():
            self.reporter.progress(f"warm-up at the measured length: {key}")
            tag = f"{self.scope}-warmup-{key}"
            profile = key.rsplit("-", 1)[0]
            # the measured output length too: a server may size its cache by it
            body = self.payload(self.messages(profile, text, tag), self.spec.max_tokens,
                                self.spec.ignore_eos, tag)  # fmt: skip
            stream = client.stream_chat(self.spec.endpoint, body, self.spec.timeout, self.http)
            took = round((stream.done_at or now()) - stream.started, 3)
            shapes.append(
                {"prompt": key, "ok": not stream.error, "error": stream.error, "seconds": took}
            )
            if stream.error:
                self.result["warmup"] = {**(self.result["warmup"] or {}), "shapes": shapes}
                self.save()
                raise BenchFailed(
                    f"the warm-up request at {key} failed: {stream.error}",
                    hint=self._warmup_hint(
                        "check that the server accepts a prompt of that length (its max-model-len)"
                    ),
                )
        self.result["warmup"] = {**(self.result["warmup"] or {}), "shapes": shapes}
        self.save()

    def _warmup_hint(self, hint: str) -> str:
        """What to do about a warm-up request that failed: ``hint``, and where the server
        went down with it, why it may have (its log has the cause)."""
        healthy, why = openai.health(self.spec.endpoint)
        if healthy:
            return hint
        hint = f"the server no longer answers ({why}): its log says why; {hint}"
        if self.spec.sampling.seed >= 0:
            hint += (
                f"; a per-request seed ({self.spec.sampling.seed}) crashes vLLM's CPU build "
                "once a prompt is prefilled in chunks ('CPU Generator does not use offset'): "
                "--seed -1 (bench.seed = -1) sends none"
            )
        return hint

    def case_doc(self, case: Case) -> CaseDoc:
        for doc in self.result["cases"]:
            if doc["id"] == case.id:
                return doc
        doc = {
            "id": case.id,
            "profile": case.profile,
            "tier": case.tier,
            "nominal_tokens": case.nominal,
            "concurrency": case.concurrency,
            "required": case.required,
            "groups": [],
            "summary": {},
        }
        self.result["cases"].append(doc)
        return doc

    def measure(self, case: Case, repetitions: int) -> CaseDoc:
        """Run ``repetitions`` more groups of ``case``; returns its case document."""
        doc = self.case_doc(case)
        for _ in range(repetitions):
            n = len(doc["groups"]) + 1
            group = self._group(case, n)
            doc["groups"].append(group)
            document.summarize(doc)
            self.save()
            self._progress(case, n, group)
        return doc

    @contextlib.contextmanager
    def _ticker(self, what: str, live: list[Stream], started: float) -> Iterator[None]:
        """While a group runs (minutes at 128k on a slow box): its phase, the time it has
        taken and the text chunks received so far, every few seconds."""
        stop = threading.Event()

        def tick() -> None:
            while not stop.wait(TICK_SECONDS):
                self.reporter.progress(f"{what}: {progress_line(live, now() - started)}")

        thread = threading.Thread(target=tick, daemon=True, name="bench-progress")
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def _progress(self, case: Case, n: int, group: Group) -> None:
        for t in group["trials"]:
            if not t["performance_valid"]:
                why = "; ".join(f"{k}: {v}" for k, v in t["reason_details"].items())
                self.reporter.note(f"{case.id} #{n}: INVALID — {why}")
                continue
            parts = []
            if t["ttft_s"] is not None:
                parts.append(
                    f"TTFT {t['ttft_s']:.2f}s, prefill {t['prefill_tps']:,.0f} tok/s, "
                    f"decode {t['generation_tps']:,.1f} tok/s"
                )
            else:
                parts.append(f"client timing dropped ({t['client_timing']})")
            if t.get("engine_prefill_tps") and t.get("engine_generation_tps"):
                parts.append(
                    f"engine clock: prefill {t['engine_prefill_tps']:,.0f}, "
                    f"decode {t['engine_generation_tps']:,.1f} tok/s"
                )
            self.reporter.note(f"{case.id} #{n}: {'; '.join(parts)} — valid")

    def _group(self, case: Case, n: int) -> Group:
        s = self.spec
        text = self.prompts[f"{case.profile}-{case.tier}"]
        tags = [f"{self.scope}-{case.id}-{n:03d}-{i}" for i in range(case.concurrency)]
        bodies = [
            self.payload(self.messages(case.profile, text, tag), s.max_tokens, s.ignore_eos, tag)
            for tag in tags
        ]
        streams: list[Stream | None] = [None] * case.concurrency
        barrier = threading.Barrier(case.concurrency)

        live: list[Stream] = []

        def one(i: int) -> None:
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(timeout=60)
            streams[i] = client.stream_chat(s.endpoint, bodies[i], s.timeout, self.http, live)

        box_before = reference.rate() if s.reference else None
        before = prom.parse(client.metrics_text(s.endpoint, http=self.http))
        mark = self.log.mark() if self.log else 0
        sampler = telemetry.Sampler(self.telemetry).start()
        started = now()
        with self._ticker(f"{case.id} #{n}", live, started):
            threads = [threading.Thread(target=one, args=(i,)) for i in range(case.concurrency)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
        gpu = sampler.stop()
        after = self._settled_metrics(before, case.concurrency)
        box_after = reference.rate() if s.reference else None
        done = [st if st is not None else Stream(started, error="worker died") for st in streams]
        rules = measure.Rules(**{**asdict(s.rules), "max_tokens": s.max_tokens,
                                 "nominal_tokens": case.nominal,
                                 "tolerance_pct": s.tolerance_pct})  # fmt: skip
        trials = []
        for i, st in enumerate(done):
            t = measure.trial(st, rules)
            t["request_tag"] = tags[i]
            t["stream_index"] = i
            t["ignore_eos"] = bool(bodies[i].get("ignore_eos"))
            trials.append(t)
        for t, st in zip(trials, done, strict=True):
            self._recount(t, st)
        self._cross_checks(trials, before, after, mark)
        self._engine_clock(trials, before, after)
        self._first_token_check(trials, done, before, after)
        self._engine_counts(trials, before, after)
        totals = measure.group(trials, min(st.started for st in done), done)
        names = self.spec.endpoint.adapter.metrics
        return {
            "group": n,
            "start": self.start,
            "trials": trials,
            "totals": totals,
            "server_metrics": self._metric_deltas(before, after),
            "reference": document.group_reference(box_before, box_after),
            "telemetry": gpu,
            "first_text_check": "engine clock" if names.ttft else "stream pace",
        }

    def recount(self, stream: Stream, claimed: int) -> tuple[int | None, str, str]:
        """The streamed text counted again by the tokenizer that sized the prompts:
        (the count, the reason code, its detail; "" when the claim holds). A server whose
        ``usage`` claims more output tokens than it streamed would make its decode rate
        look faster (``usage_exceeds_stream``). Counting a finished answer costs one small
        request (or one call of the tokenizer helper) between groups or after a load
        point, outside every measured window. Where no tokenizer sized the prompts (an
        estimate) there is nothing to count with: (None, "", ""); where one did and now
        cannot count, ``usage_not_recounted`` (fail closed)."""
        tok = self._tokenizer
        if tok is None or not tok.available:
            return None, "", ""
        try:
            count = tok.count_text(self.spec.endpoint, self.spec.model, stream.content, self.http)
        except (httpx.HTTPError, ValueError, OSError, BenchFailed) as exc:
            return None, "usage_not_recounted", (
                f"the streamed text could not be counted again ({tok.source}): {str(exc)[:200]}"
            )  # fmt: skip
        excess = self.spec.rules.max_usage_excess
        if claimed > count * (1 + excess) + USAGE_SLACK:
            return count, "usage_exceeds_stream", (
                f"usage claims {claimed} output tokens; the streamed text is {count} "
                f"({tok.source}): more than {excess:.0%} + {USAGE_SLACK} over"
            )  # fmt: skip
        return count, "", ""

    def _recount(self, t: Trial, stream: Stream) -> None:
        t["recounted_tokens"] = None
        claimed = t["completion_tokens"]
        if not t["ok"] or claimed is None:
            return
        t["recounted_tokens"], code, detail = self.recount(stream, claimed)
        if code:
            measure.invalidate(t, code, detail)

    def _cross_checks(
        self,
        trials: list[Trial],
        before: dict[str, float],
        after: dict[str, float],
        mark: int,
    ) -> None:
        names = self.spec.endpoint.adapter.metrics
        if names.prefix_hits and not (before and after):
            for t in trials:  # the only way to see a cache hit on vLLM was not read
                measure.invalidate(
                    t, "metrics_unread",
                    f"{self.spec.endpoint.adapter.metrics_path} could not be scraped around "
                    "the group: a prompt-cache hit could not be ruled out",
                )  # fmt: skip
        hits = prom.delta(before, after, names.prefix_hits)
        if hits:
            for t in trials:
                measure.invalidate(
                    t, "prompt_cache_hit",
                    f"{names.prefix_hits[0]} rose by {hits:.0f} tokens during the request",
                )  # fmt: skip
        window = self.log.since(mark) if self.log is not None else ""
        if self.log is not None and window is None:
            for t in trials:
                measure.invalidate(
                    t, "log_unread",
                    f"the service log {self.log.path} could not be read for the measured "
                    "window (gone, unreadable or truncated): its compile/JIT lines and log "
                    "rules were not checked",
                )  # fmt: skip
        elif self.log is not None and window is not None:
            for line in window.splitlines():
                if any(p.search(line) for p in self._patterns):
                    for t in trials:
                        measure.invalidate(t, "compilation_in_window", line.strip()[:200])
                    break
            for reason in self.window_check(window) if self.window_check else []:
                for t in trials:
                    measure.invalidate(t, "log_rule", reason[:200])

    def _settled_metrics(self, before: dict[str, float], requests: int) -> dict[str, float]:
        """``/metrics`` after a group, once the engine has recorded its finished requests:
        vLLM observes the prefill/decode time histograms when a request finishes, which
        can be just after the client read [DONE] (on a busy box, noticeably after)."""
        names = self.spec.endpoint.adapter.metrics
        return settled_metrics(self.spec.endpoint, before, names.decode_time, requests, self.http)

    def _engine_clock(
        self, trials: list[Trial], before: dict[str, float], after: dict[str, float]
    ) -> None:
        """Prefill and decode rates by the engine's own clock (vLLM's request prefill and
        decode time histograms), for every request the engine observed in the group:
        exact per request at concurrency 1, the group's mean above."""
        names = self.spec.endpoint.adapter.metrics
        prefill = prom.histogram_mean_delta(before, after, names.prefill_time)
        decode = prom.histogram_mean_delta(before, after, names.decode_time)
        for t in trials:
            t["engine_prefill_tps"] = t["engine_generation_tps"] = None
            if not t["ok"] or not isinstance(t["completion_tokens"], int):
                continue
            if prefill and prefill[1] == len(trials) and prefill[0] > 0 and t["prompt_tokens"]:
                t["engine_prefill_tps"] = round(t["prompt_tokens"] / prefill[0], 4)
            if decode and decode[1] == len(trials) and decode[0] > 0 and t["completion_tokens"] > 1:
                t["engine_generation_tps"] = round((t["completion_tokens"] - 1) / decode[0], 4)
        self._engine_ttft(trials, prom.histogram_mean_delta(before, after, names.ttft))

    @staticmethod
    def _engine_ttft(trials: list[Trial], ttft: tuple[float, float] | None) -> None:
        """The engine's own TTFT beside the client's (``ttft``: the histogram's mean and
        count over the group), and at concurrency 1 the client's TTFT less it: the part
        the frontend and the network add, which the engine's clock does not see."""
        for t in trials:
            t["engine_ttft_s"] = t["frontend_ttft_s"] = None
        with_text = [t for t in trials if t["text_chunks"] > 0]
        if not ttft or ttft[1] != len(with_text) or not with_text:
            return
        for t in with_text:
            t["engine_ttft_s"] = round(ttft[0], 6)
        if len(trials) == 1 and trials[0]["ttft_s"] is not None:
            trials[0]["frontend_ttft_s"] = round(trials[0]["ttft_s"] - ttft[0], 6)

    def _engine_counts(
        self, trials: list[Trial], before: dict[str, float], after: dict[str, float]
    ) -> None:
        """``usage`` against the engine's own counts (:func:`engine_counts_problem`):
        where they disagree, or cannot be read, every trial of the group is invalid."""
        ok = [t for t in trials if t["ok"]]
        found = engine_counts_problem(
            self.spec.endpoint.adapter.metrics, before, after,
            [t["prompt_tokens"] for t in ok], [t["completion_tokens"] for t in ok],
            self.spec.rules.max_usage_excess, "group",
        )  # fmt: skip
        for code, detail in found:
            for t in trials:
                measure.invalidate(t, code, detail)

    def _first_token_check(
        self,
        trials: list[Trial],
        streams: list[Stream],
        before: dict[str, float],
        after: dict[str, float],
    ) -> None:
        """Was the first text the model's, or sent ahead of the prefill to pass a slower
        prefill as a faster one? Where the engine keeps a TTFT clock of its own (vLLM),
        the group's mean is checked against it (:func:`measure.text_before_first_token`),
        and it must have counted exactly the group's requests: a clock that is gone from
        ``/metrics``, or that counted other requests too (another client on the server,
        or requests the frontend made up to blur it), proves nothing, and every trial is
        invalid (``engine_clock_unread``) rather than judged by a weaker check the
        frontend chose. Where the engine has no such clock, each stream's own pace is
        the judge (:func:`measure.first_text_ahead`)."""
        names = self.spec.endpoint.adapter.metrics
        if not names.ttft:
            rules = self.spec.rules
            pairs = list(zip(trials, streams, strict=True))
            alone = [measure.first_text_ahead(st, t, rules) for t, st in pairs]
            anchors = [st.first_text_at for (_, st), why in zip(pairs, alone, strict=True)
                       if not why and st.first_text_at is not None]  # fmt: skip
            for (t, st), why in zip(pairs, alone, strict=True):
                if why:  # a wait another stream's prefill explains is not a lie
                    why = measure.first_text_ahead(st, t, rules, anchors)
                if why:
                    measure.invalidate(t, "first_text_ahead", why)
            return
        seen = [st.first_text_at - st.started for st in streams if st.first_text_at is not None]
        if not seen:
            return  # no text at all: the trials are invalid for that already
        engine = prom.histogram_mean_delta(before, after, names.ttft)
        if engine is None or engine[1] != len(seen):
            counted = "no count" if engine is None else f"{engine[1]:.0f} requests"
            detail = (
                f"the engine's TTFT clock ({names.ttft[0]}) counted {counted} over the "
                f"group, whose {len(seen)} request(s) got text: the first text cannot be "
                "shown to be the model's (another client on the server during the group, "
                "or a frontend that hides or blurs the clock)"
            )  # fmt: skip
            for t in trials:
                measure.invalidate(t, "engine_clock_unread", detail)
            return
        buckets = prom.bucket_deltas(before, after, names.ttft)
        why = measure.text_before_first_token(seen, engine, names.ttft[0], buckets)
        for t in trials if why else ():
            measure.invalidate(t, "text_before_first_token", why)

    def _metric_deltas(self, before: dict[str, float], after: dict[str, float]) -> ServerMetrics:
        names = self.spec.endpoint.adapter.metrics
        ttft = prom.histogram_mean_delta(before, after, names.ttft)
        itl = prom.histogram_mean_delta(before, after, names.itl)
        return {
            "prefix_cache_hits": prom.delta(before, after, names.prefix_hits),
            "prefix_cache_queries": prom.delta(before, after, names.prefix_queries),
            "spec_accepted": prom.delta(before, after, names.spec_accepted),
            "spec_draft": prom.delta(before, after, names.spec_draft),
            "ttft_mean_s": round(ttft[0], 6) if ttft else None,
            "itl_mean_s": round(itl[0], 6) if itl else None,
        }


def run(
    spec: Spec,
    output: Path | None,
    reporter: Reporter | None = None,
    log: LogWindow | None = None,
    environ: Mapping[str, str] | None = None,
    on_bench: Callable[[Bench], None] | None = None,
) -> Result:
    """A whole run; the result file keeps what finished whatever happens."""
    bench = Bench(spec, output, reporter, log, environ)
    if on_bench:
        on_bench(bench)
    try:
        bench.prepare()
        bench.warm_up()
        for case in spec.cases:
            bench.measure(case, spec.repetitions)
    except KeyboardInterrupt:
        bench.fail("interrupted", "interrupted")
        raise
    except BenchFailed as exc:
        bench.fail("failed", str(exc))
        raise
    except Exception as exc:
        bench.fail("failed", repr(exc))
        raise
    return bench.finish()


#: seconds between progress lines while a group runs
TICK_SECONDS = 5.0


def progress_line(live: list[Stream], elapsed: float) -> str:
    """``prefill 42s (no token yet)`` / ``decode 61s, 212 chunks received``."""
    if not live:
        return f"sending {elapsed:.0f}s"
    chunks = sum(st.text_chunks for st in live)
    waiting = sum(1 for st in live if st.first_text_at is None and not st.done_at)
    if chunks == 0:
        return f"prefill {elapsed:.0f}s (no token yet)"
    more = f", {waiting} stream(s) still in prefill" if waiting else ""
    return f"decode {elapsed:.0f}s, {chunks} chunk(s) received{more}"


def engine_counts_problem(
    names: adapters.MetricNames,
    before: Mapping[str, float],
    after: Mapping[str, float],
    prompt_claims: Sequence[Any],
    output_claims: Sequence[Any],
    excess: float,
    what_window: str,
) -> list[tuple[str, str]]:
    """``usage`` against the engine's own counts (vLLM's per-request prompt and
    generation token histograms, observed as each request finishes): ``(code, detail)``
    for each disagreement ([]: none, or the engine keeps no such counts). A frontend that
    cuts a prompt short before the engine and reports it whole would show a prefill too
    fast, one that pads its answer and claims the padding as tokens (text the recount
    also counts) a decode too fast: where the claims add up to more than the engine
    counted for every one of the requests (beyond ``excess`` and ``USAGE_SLACK`` a
    request), ``usage_exceeds_engine``. Other traffic in the window only adds to the
    engine's count, so it can hide a lie, never invent one; counts gone from
    ``/metrics``, or short of the requests once the engine has recorded them, prove
    nothing: ``engine_counts_unread``, never unchecked. ``what_window``: "group",
    "point"."""
    found = []
    for what, series, claims in (
        ("prompt", names.prompt_tokens, prompt_claims),
        ("output", names.generation_tokens, output_claims),
    ):
        if not series or not claims:
            continue
        engine = prom.histogram_mean_delta(before, after, series)
        if not engine or engine[1] < len(claims):
            got = "no count" if not engine else f"{engine[1]:.0f} requests"
            found.append((
                "engine_counts_unread",
                f"the engine's {what} token counts ({series[0]}) counted {got} over the "
                f"{what_window}'s {len(claims)} request(s): usage cannot be checked against "
                "them (a frontend that hides or holds them back)",
            ))  # fmt: skip
            continue
        claimed = sum(c for c in claims if isinstance(c, int) and not isinstance(c, bool))
        counted = engine[0] * engine[1]
        if claimed > counted * (1 + excess) + USAGE_SLACK * len(claims):
            found.append((
                "usage_exceeds_engine",
                f"usage claims {claimed} {what} tokens over the {what_window}'s "
                f"{len(claims)} request(s); the engine counted {counted:.0f} over "
                f"{engine[1]:.0f} ({series[0]}): more than {excess:.0%} + {USAGE_SLACK} a "
                "request over",
            ))  # fmt: skip
    return found


def settled_metrics(
    endpoint: Endpoint,
    before: Mapping[str, float],
    series: Sequence[str],
    requests: int,
    http: httpx.Client | None = None,
) -> dict[str, float]:
    """``/metrics`` once the engine's histogram ``series`` has counted ``requests`` more
    than ``before`` (vLLM observes its per-request histograms as a request finishes,
    which can be just after the client read its end), or after 10 s; at once where the
    engine keeps no such series."""
    deadline = now() + 10.0
    while True:
        after = prom.parse(client.metrics_text(endpoint, http=http))
        done = prom.delta(before, after, tuple(n + "_count" for n in series))
        if not series or not after or (done or 0) >= requests or now() > deadline:
            return after
        time.sleep(0.05)
