"""``servegate bench load``: how a release behaves under load, up to where it saturates.

A load point is a request rate (open loop: arrivals drawn from a Poisson process, or
from a gamma process when ``burstiness`` is not 1, as ``vllm bench serve`` draws them,
whatever the server does) or a concurrency (closed loop: N clients, each sending its
next request when its last one ended). Every request's prompt is drawn at random from
the run's sized prompts (every profile x tier given: mixed lengths). In the ``cold``
workload each prompt starts with its own tag, so no request reuses another's prefix; in
the ``shared-prefix`` workload the first ``prefix_share`` of every prompt is the same
text (the head of the run's longest prompt, whatever the prompt's profile or tier) and
the tag follows it, so a prefix cache can serve that share (the hit rate the engine
counted is reported beside the target). The cold figures stay what the gate uses.

Per point: p50/p90/p99/max of TTFT, inter-token latency (the gaps between text chunks,
pooled over the point's requests), time per output token and end-to-end latency;
request and token throughput; goodput (requests a second that met every SLO given);
the client's scheduling lag; the requests in flight; vLLM's queue gauges; GPU telemetry.

A sweep runs its points from the lightest and stops at the first one where the server
saturated (:func:`saturation`): the queue grew through the point, TTFT exploded against
the first point, requests failed, or (closed loop) more clients no longer bought more
throughput. The knee is the last point before that.

Why an event loop (asyncio with aiohttp, the client ``vllm bench serve`` uses) and not
the bench's threads and httpx: an open-loop arrival must leave when it is due, whatever
the streams in flight are doing; a thread a request pays its start and waits on the
interpreter lock, and httpx's async stack costs about three times aiohttp's CPU a
request (``benchmarks/load_client_lag.py``: p99 lag 1.8 ms vs 1.1 ms at 100 req/s, and
200 ms vs 1.6 ms at 200 req/s on two cores). Each request records its lag (sent -
due), and the result reports it: a lag that is not small means the client, not the
server, set the load.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import errno
import gc
import itertools
import json
import random
import re
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servegate.bench import cases, client, driver, fixtures, measure, prom, sse, telemetry
from servegate.bench.driver import Bench
from servegate.bench.loadreport import (
    ideal_hit_rate,
    knee,
    line,
    saturation,
    summarize,
)
from servegate.bench.loadspec import (
    KIND,
    LoadSpec,
    arrivals,
)
from servegate.engine import openai
from servegate.errors import BenchFailed
from servegate.pipeline.atomic import write_text
from servegate.pipeline.stages import QuietReporter, Reporter

if TYPE_CHECKING:  # imported where a sweep runs: a promote with no load check never pays it
    import aiohttp


@dataclass
class _Sent:
    """One request of a point: its prompt, when it was due, its stream."""

    key: str
    due: float
    stream: sse.Stream
    in_flight: int = 0
    #: ``ignore_eos`` was sent: an answer shorter than ``max_tokens`` was cut short
    exact: bool = False


async def _send(http: aiohttp.ClientSession, bench: Bench, payload: bytes, sent: _Sent) -> None:
    """One streamed chat completion on the event loop. The body is encoded before the
    request is due; the clock starts as it is sent."""
    import aiohttp

    endpoint = bench.spec.endpoint
    stream = sent.stream
    stream.started = sse.now()
    try:
        async with http.post(
            f"{endpoint.base_url}/v1/chat/completions",
            data=payload,
            headers={**endpoint.headers, "Content-Type": "application/json"},
        ) as resp:
            stream.http_status = resp.status
            if resp.status != 200:
                text = await resp.text(errors="replace")
                stream.error = f"HTTP {resp.status}: {text[:300]}"
                return
            async for raw in resp.content:  # one line at a time
                if sse.feed(raw.decode(errors="replace").rstrip("\r\n"), stream, sse.now):
                    break
    except TimeoutError:
        stream.error = f"no answer within {bench.spec.timeout:g}s"
    except aiohttp.ClientConnectorError as exc:
        if exc.os_error.errno in (errno.EMFILE, errno.ENFILE):  # the client's limit
            stream.error = f"{CLIENT_OUT_OF_FILES}: {exc.os_error}"
        else:
            stream.error = f"cannot connect to {endpoint.shown_url}: {exc.os_error}"
    except (aiohttp.ClientError, ValueError) as exc:
        stream.error = f"the stream broke off: {type(exc).__name__}: {exc}"
    client.ended(stream, endpoint)


#: a request the client could not open a socket for: its own open-file limit, not the server
CLIENT_OUT_OF_FILES = "the client ran out of open files"


#: Python 3.12+: a task that runs at once, up to its first wait (the request's clock
#: starts and its connection opens now, not after the callbacks already queued)
_EAGER = getattr(asyncio, "eager_task_factory", None)


def _start(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    """The request's task, started eagerly where Python can."""
    if _EAGER is not None:
        task: asyncio.Task[None] = _EAGER(asyncio.get_running_loop(), coro)
        return task
    return asyncio.create_task(coro)


def _answer_error(st: sse.Stream, usage: Mapping[str, Any], max_tokens: int, exact: bool) -> str:
    """Why a stream that ended cleanly is still not a served request ("": it is). The
    server's own counts are checked before any figure is made from them: a count past
    what was asked for, or a negative one, would shrink the inter-token latency and
    inflate the throughput; an answer cut short would flatter every latency."""
    if st.first_text_at is None:
        return "the stream carried no text (0 output tokens)"
    if not usage:
        return "the stream carried no usage: the server did not count its tokens"
    raw = usage.get("completion_tokens")
    completion = measure.token_count(raw)
    if completion is None or not 1 <= completion <= max_tokens:
        return f"the server reported {raw!r} completion tokens for at most {max_tokens}"
    if "prompt_tokens" in usage and measure.token_count(usage["prompt_tokens"]) is None:
        return f"the server reported {usage['prompt_tokens']!r} prompt tokens"
    if st.finish_reason not in (None, "length", "stop"):
        return f"the answer ended with finish_reason {st.finish_reason!r}"
    if exact and completion < max_tokens:
        return (
            f"the answer was cut short: {completion} of {max_tokens} tokens, though "
            "ignore_eos was sent"
        )
    return ""


def _payload(body: dict[str, Any]) -> bytes:
    return json.dumps(client.streaming(body)).encode()


def _session(bench: Bench) -> aiohttp.ClientSession:
    """Connections unbounded (an arrival never waits for a free one), the request's
    whole time bounded by the bench's timeout."""
    import aiohttp

    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(total=bench.spec.timeout),
    )


def _spin_margin(wait: float) -> float:
    """How long before an arrival the loop stops sleeping and yields instead. The selector
    rounds its timeout up to a whole millisecond, and Linux lets a wait of ``t`` end up
    to ``t / 1000`` late (the timer slack it gives a normal task's ``epoll_wait``): a
    gap of 4 s between arrivals (0.5 req/s) ended 4.5 ms late, so a fixed margin made
    the low rates the late ones. Twice the slack plus 2 ms covers both and a wake-up;
    the yielding costs 0.2 % of the wait in CPU."""
    return 0.002 + 0.002 * max(wait, 0.0)


async def _until(due: float) -> None:
    """Sleep until ``due`` (``sse.now`` clock): by the selector until
    :func:`_spin_margin` before it, then by yielding to the loop, so the streams in
    flight are still read while it waits."""
    wait = due - sse.now()
    if wait > _spin_margin(wait):
        await asyncio.sleep(wait - _spin_margin(wait))
    while sse.now() < due:
        await asyncio.sleep(0)


_GAUGES = re.compile(r"^[\w:]*num_requests_(?:waiting|running)\b.*$", re.MULTILINE)


class _Queue:
    """vLLM's waiting/running gauges, read every second in a thread during a point."""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.samples: list[tuple[float, float | None, float | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="load-queue")

    def _loop(self) -> None:
        names = self.bench.spec.endpoint.adapter.metrics
        if not names.waiting:
            return
        with self.bench.spec.endpoint.client(10.0) as http:
            while not self._stop.wait(1.0):
                text = client.metrics_text(self.bench.spec.endpoint, http=http)
                # the two gauges alone, found at C speed: this thread shares the
                # interpreter with the event loop that sends the arrivals
                sample = prom.parse("\n".join(_GAUGES.findall(text)))
                waiting = prom.first(sample, names.waiting)
                self.samples.append((sse.now(), waiting, prom.first(sample, names.running)))

    def __enter__(self) -> _Queue:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, Any] | None:
        waiting = [w for _, w, _ in self.samples if w is not None]
        running = [r for _, _, r in self.samples if r is not None]
        if not waiting:
            return None
        return {
            "samples": len(waiting),
            "waiting_mean": round(sum(waiting) / len(waiting), 2),
            "waiting_max": max(waiting),
            "running_max": max(running) if running else None,
        }


class Load:
    """A load sweep on a prepared :class:`Bench` (prompts sized, model warmed up)."""

    def __init__(
        self,
        bench: Bench,
        load: LoadSpec,
        output: Path | None,
        reporter: Reporter | None = None,
    ) -> None:
        self.bench = bench
        self.load = load
        self.output = output
        self.reporter = reporter or QuietReporter()
        self.rng = random.Random(load.seed)
        self.source = bench.telemetry  # found once, by the bench
        #: the first measured point's median E2E: the ramp of every later point ends by it
        self.unloaded_e2e: float | None = None
        self.result: dict[str, Any] = {
            "schema": cases.SCHEMA,
            "kind": KIND,
            "status": "running",
            "harness": bench.result["harness"],
            "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "finished_at": None,
            "error": "",
            "run": {
                **bench.result["run"],
                "mode": load.mode,
                "points": list(load.points),
                "duration_s": load.duration_s,
                "burstiness": load.burstiness,
                "seed": load.seed,
                "workload": load.workload,
                "prefix_share": load.prefix_share,
                "slo": load.slo.given(),
                "prompts": sorted(bench.prompts),
            },
            "engine": bench.result["engine"],
            "sizing": bench.result["sizing"],
            "warmup": bench.result["warmup"],
            "telemetry": bench.result.get("telemetry") or telemetry.describe(self.source),
            "points": [],
            "knee": None,
        }
        if bench.prompts:  # what the requests send: every load request asks for ignore_eos
            key = sorted(bench.prompts)[0]
            self.result["run"]["ignore_eos"] = bool(self._body(key, "-").get("ignore_eos"))

    def save(self) -> None:
        if self.output is not None:
            self.output.parent.mkdir(parents=True, exist_ok=True)
            write_text(self.output, json.dumps(self.result, indent=1) + "\n")

    # -- one request -----------------------------------------------------------------

    def _common(self) -> str:
        """The text every shared-prefix prompt starts with: the run's longest prompt, of
        which each prompt takes its share's length. So the prefix of a shorter prompt is
        a prefix of a longer one's, and a prefix cache serves it whatever the mix of
        profiles and tiers (each prompt's own head would share nothing with another's)."""
        return max(self.bench.prompts.values(), key=len)

    def _body(self, key: str, tag: str) -> dict[str, Any]:
        b = self.bench
        profile = key.rsplit("-", 1)[0]
        text = b.prompts[key]
        if self.load.workload == "shared-prefix":
            cut = int(len(text) * self.load.prefix_share)
            common = self._common()[:cut]
            messages = [
                {"role": "system", "content": "You are a careful, thorough assistant."},
                {"role": "user", "content": f"{common}\n\n[{tag}]\n\n{text[cut:]}\n\n"
                                            f"{fixtures.INSTRUCTIONS[profile]}"},
            ]  # fmt: skip
        else:
            messages = b.messages(profile, text, tag)
        body = b.payload(messages, b.spec.max_tokens, True, tag)
        if self.load.workload == "shared-prefix" and "cache_salt" in body:
            # one salt for the run: its requests share the prefix cache, no other run's do
            body["cache_salt"] = f"{b.scope}-shared"
        return body

    def _record(self, sent: _Sent) -> tuple[dict[str, Any], list[float]]:
        st = sent.stream
        usage = st.usage or {}
        completion = measure.token_count(usage.get("completion_tokens"))
        if not st.error:
            st.error = _answer_error(st, usage, self.bench.spec.max_tokens, sent.exact)
        if not st.error and completion is not None:
            st.error = self._backed(st, completion)
        done = st.done_at or st.last_text_at
        ttft = st.first_text_at - st.started if st.first_text_at is not None else None
        e2el = done - st.started if done is not None else None
        tpot = None
        if ttft is not None and e2el is not None and completion and completion > 1:
            tpot = (e2el - ttft) * 1000 / (completion - 1)
        itl = None
        first, last = st.first_text_at, st.last_text_at
        multi = completion is not None and completion > 1 and st.text_chunks > 1
        if first is not None and last is not None and completion and multi:
            itl = (last - first) * 1000 / (completion - 1)
        stamps = st.stamps or []
        gaps = [(b - a) * 1000 for a, b in itertools.pairwise(stamps)]
        ok = not st.error
        # a stream held back between the engine and the client and delivered at once:
        # its gaps are the hold's, not the decode's (the single-stream bench's rule)
        rules = self.bench.spec.rules
        window = last - first if first is not None and last is not None else None
        client_timing = (
            measure.burst(round(itl, 4) if itl is not None else None, completion,
                          None if window is None else round(window, 6), rules)
            or measure.held(st, rules)
        ) if ok else ""  # fmt: skip
        if ok and not client_timing and completion and completion > 1 and st.text_chunks == 1:
            client_timing = (
                f"burst: one chunk carried all {completion} tokens: no decode the client could time"
            )
        if client_timing:
            itl = tpot = None
            gaps = []
        rec = {
            "prompt": sent.key,
            "ok": ok,
            "error": st.error,
            "due_s": round(sent.due, 6),
            "lag_ms": round((st.started - sent.due) * 1000, 4),
            "in_flight_at_send": sent.in_flight,
            "prompt_tokens": measure.token_count(usage.get("prompt_tokens")),
            "completion_tokens": completion,
            "full_length": completion == self.bench.spec.max_tokens,
            "ttft_s": round(ttft, 6) if ok and ttft is not None else None,
            "itl_ms": round(itl, 4) if ok and itl is not None else None,
            "tpot_ms": round(tpot, 4) if ok and tpot is not None else None,
            "e2el_s": round(e2el, 6) if ok and e2el is not None else None,
            "ended_s": round(done, 6) if done is not None else None,
            #: why the client could not time this answer's decode ("": it could)
            "client_timing": client_timing,
        }
        return rec, gaps if ok else []

    def _first_token_check(
        self,
        sent: Sequence[_Sent],
        before: Mapping[str, float],
        after: Mapping[str, float],
        ended: float,
    ) -> None:
        """The point's first texts against vLLM's TTFT histogram over the point: a point
        whose requests got text before the model had any fails every request with that
        reason, so no figure of the point is taken from them and the load gate's failed
        share judges it. The clock may count the requests that got text and those cut
        off before theirs (the engine may have made a first token the client never saw),
        no more, no fewer: a clock gone from ``/metrics`` or blurred by other requests
        fails them all (``engine_clock_unread``). Whatever it counted, its times add up
        to no more than the client's: each request that got text waited at least its
        engine time for it, each one cut off lived at least that long. The buckets are
        checked too (:func:`measure.text_before_first_token`): a request cut off before
        its text only adds to the engine's side of each, so one hung request cannot pay
        for the early text of the others. Under load a stream's own pace cannot
        tell (a request's second token waits behind other prefills), so an engine
        without such a clock is not checked here."""
        names = self.bench.spec.endpoint.adapter.metrics
        if not names.ttft:
            return
        streams = [one.stream for one in sent if one.stream.started]
        seen = [st.first_text_at - st.started for st in streams if st.first_text_at is not None]
        if not seen:
            return
        lived = [(st.done_at or ended) - st.started for st in streams if st.first_text_at is None]
        engine = prom.histogram_mean_delta(before, after, names.ttft)
        slack, share = measure.FIRST_TOKEN_SLACK
        why = ""
        if engine is None or not len(seen) <= engine[1] <= len(streams):
            counted = "no count" if engine is None else f"{engine[1]:.0f} requests"
            why = (
                f"engine_clock_unread: the engine's TTFT clock ({names.ttft[0]}) counted "
                f"{counted} over the point, where {len(seen)} of its {len(streams)} "
                "request(s) got text: the first texts cannot be shown to be the model's"
            )  # fmt: skip
        elif sum(seen) + sum(lived) < engine[0] * engine[1] * (1 - share) - slack * engine[1]:
            why = (
                f"text_before_first_token: the client's {len(seen)} first texts came "
                f"{sum(seen):.3f} s after sending in all (and {len(lived)} request(s) cut off "
                f"before theirs lived {sum(lived):.3f} s), the engine's {engine[1]:.0f} first "
                f"tokens {engine[0] * engine[1]:.3f} s after arrival ({names.ttft[0]}): text "
                "came before the model had any"
            )  # fmt: skip
        else:  # the buckets bound the client's times whatever else the engine counted
            buckets = prom.bucket_deltas(before, after, names.ttft)
            found = measure.text_before_first_token(seen, engine, names.ttft[0], buckets)
            why = f"text_before_first_token: {found}" if found else ""
        for st in streams if why else ():
            st.error = st.error or why

    def _settled(self, before: Mapping[str, float], sent: Sequence[_Sent]) -> dict[str, float]:
        """``/metrics`` after a point, once the engine has counted the tokens of the
        requests that ended whole (:func:`driver.settled_metrics`)."""
        endpoint = self.bench.spec.endpoint
        whole = sum(1 for one in sent if one.stream.started and not one.stream.error)
        return driver.settled_metrics(
            endpoint, before, endpoint.adapter.metrics.generation_tokens, whole
        )

    def _engine_counts(
        self, sent: Sequence[_Sent], before: Mapping[str, float], after: Mapping[str, float]
    ) -> None:
        """The point's ``usage`` against the engine's own token counts
        (:func:`driver.engine_counts_problem`): a frontend that pads its answers with text
        it counts as tokens, or cuts prompts short and reports them whole, shows a decode
        or a prefill faster than the engine's; where the counts disagree or cannot be
        read, every request of the point fails with the reason, as with the TTFT clock."""
        streams = [one.stream for one in sent if one.stream.started]
        max_tokens = self.bench.spec.max_tokens
        whole = [  # the answers that would count; the others fail for their own reason
            one.stream for one in sent
            if one.stream.started and not one.stream.error and one.stream.usage
            and not _answer_error(one.stream, one.stream.usage, max_tokens, one.exact)
        ]  # fmt: skip
        found = driver.engine_counts_problem(
            self.bench.spec.endpoint.adapter.metrics, before, after,
            [measure.token_count(st.usage.get("prompt_tokens")) for st in whole if st.usage],
            [measure.token_count(st.usage.get("completion_tokens")) for st in whole if st.usage],
            self.bench.spec.rules.max_usage_excess, "point",
        )  # fmt: skip
        if found:
            why = "; ".join(f"{code}: {detail}" for code, detail in found)
            for st in streams:
                st.error = st.error or why

    def _backed(self, st: sse.Stream, completion: int) -> str:
        """Why the streamed text does not back the answer's figures ("": it does): its
        usage claims more tokens than the text counts again, or one chunk carried text
        that was never decoded in the window (both shrink the latencies and inflate the
        throughput, as in the single-stream bench's validity)."""
        rules = self.bench.spec.rules
        why = measure.oversized(st.largest_chunk, measure.median_chunk(st), len(st.content),
                                rules.max_chunk_share)  # fmt: skip
        if why:
            return f"oversized_chunk: {why}"
        _, code, detail = self.bench.recount(st, completion)
        return f"{code}: {detail}" if code else ""

    # -- one point -------------------------------------------------------------------

    async def _open_loop(self, rate: float, sent: list[_Sent]) -> None:
        offsets = arrivals(rate, self.load.duration_s, self.load.burstiness, self.rng)
        keys = sorted(self.bench.prompts)
        tasks: set[asyncio.Task[None]] = set()
        async with _session(self.bench) as http:
            start = sse.now() + 0.05
            for i, offset in enumerate(offsets):
                key = self.rng.choice(keys)
                body = self._body(key, f"{self.bench.scope}-load-r{rate:g}-{i:05d}")
                payload = _payload(body)
                one = _Sent(key, start + offset, sse.Stream(started=0.0, stamps=[]),
                            exact=bool(body.get("ignore_eos")))  # fmt: skip
                sent.append(one)
                await _until(one.due)
                one.in_flight = len(tasks)
                task = _start(_send(http, self.bench, payload, one))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                if not _EAGER:
                    await asyncio.sleep(0)  # the request leaves now, before the next is built
            if tasks:
                await asyncio.wait(set(tasks), timeout=self.load.drain_s)
            left = list(tasks)
            for task in left:  # past the drain: cut off, counted as failed
                task.cancel()
            await asyncio.gather(*left, return_exceptions=True)

    async def _closed_loop(self, clients: int, sent: list[_Sent]) -> None:
        keys = sorted(self.bench.prompts)
        in_flight = [0]
        async with _session(self.bench) as http:
            start = sse.now()
            stop = start + self.load.duration_s

            async def worker(w: int) -> None:
                n = 0
                while sse.now() < stop:
                    key = self.rng.choice(keys)
                    body = self._body(key, f"{self.bench.scope}-load-c{clients}-{w}-{n:05d}")
                    one = _Sent(key, sse.now(), sse.Stream(started=0.0, stamps=[]), in_flight[0],
                                exact=bool(body.get("ignore_eos")))  # fmt: skip
                    sent.append(one)
                    in_flight[0] += 1
                    try:
                        await _send(http, self.bench, _payload(body), one)
                    finally:
                        in_flight[0] -= 1
                    n += 1

            await asyncio.wait_for(
                asyncio.gather(*(worker(w) for w in range(clients))),
                self.load.duration_s + self.load.drain_s,
            )

    def point(self, value: float) -> dict[str, Any]:
        """Run one load point; its summary (also appended to the result)."""
        b, spec = self.bench, self.load
        what = f"{value:g} req/s" if spec.mode == "rate" else f"{value:g} client(s)"
        self.reporter.progress(f"load {what} for {spec.duration_s:g}s")
        names = b.spec.endpoint.adapter.metrics
        before = prom.parse(client.metrics_text(b.spec.endpoint))
        sampler = telemetry.Sampler(self.source).start()
        sent: list[_Sent] = []
        started = sse.now()
        with _Queue(b) as queue:
            run = (
                self._open_loop(value, sent)
                if spec.mode == "rate"
                else self._closed_loop(int(value), sent)
            )
            # no collector pauses while arrivals are due (a full collection over a point's
            # streams takes milliseconds); one collection after
            gc.disable()
            try:
                with contextlib.suppress(TimeoutError):  # the closed loop's drain ran out
                    asyncio.run(run)
            finally:
                gc.enable()
                gc.collect()
        ended = sse.now()
        for one in sent:  # a request cut off past the drain failed
            client.ended(one.stream, b.spec.endpoint)
        tele = sampler.stop()
        after = self._settled(before, sent)
        self._first_token_check(sent, before, after, ended)
        self._engine_counts(sent, before, after)
        records, gaps = [], []
        for one in sent:
            rec, g = self._record(one)
            rec["due_s"] = round(one.due - started, 6)
            if rec["ended_s"] is not None:
                rec["ended_s"] = round(rec["ended_s"] - started, 6)
            records.append(rec)
            gaps.extend(g)
        hits = prom.delta(before, after, names.prefix_hits)
        queries = prom.delta(before, after, names.prefix_queries)
        summary = summarize(records, gaps, spec, value, ended - started, self.unloaded_e2e)
        summary.update(
            server_queue=queue.summary(),
            prefix_hit_rate=round(hits / queries, 4) if hits is not None and queries else None,
            prefix_hit_ideal=ideal_hit_rate(records, spec.prefix_share)
            if spec.workload == "shared-prefix"
            else None,
            telemetry=tele,
            requests_detail=records,
        )
        return summary

    def _gone(self, p: Mapping[str, Any]) -> str:
        """Why the point shows a server that went away, not a loaded one ("": it does
        not). A saturated server queues, answers late or errs; one that refuses
        connections (its port closed: it died, or restarted) or breaks its streams off and
        no longer answers its health check is broken, and a knee read from it would be a
        lie."""
        errors = [str(r["error"]) for r in p.get("requests_detail") or [] if r["error"]]
        if not errors:
            return ""
        refused = [e for e in errors if e.startswith("cannot connect")]
        healthy, down = openai.health(self.bench.spec.endpoint)
        now = "" if healthy else f"; it does not answer now ({down})"
        if refused:
            return f"{len(refused)} request(s) could not connect ({refused[0]}){now}"
        # a server that errs under load and still answers its health check is loaded; one
        # that no longer answers it (an engine dead behind its proxy: 502s) is gone
        return f"{len(errors)} request(s) failed ({errors[0]}){now}" if now else ""

    def _failed(self, error: str, hint: str) -> BenchFailed:
        """The sweep ends failed: the file says so and why, what finished stays in it."""
        self.result.update(status="failed", error=error)
        self.result["finished_at"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        self.save()
        kept = f"; what finished is in {self.output}" if self.output else ""
        return BenchFailed(error, hint=hint + kept)

    def sweep(self) -> dict[str, Any]:
        points: list[dict[str, Any]] = self.result["points"]
        unit = "req/s" if self.load.mode == "rate" else "client(s)"
        for value in self.load.points:
            p = self.point(value)
            if any(str(r["error"]).startswith(CLIENT_OUT_OF_FILES) for r in p["requests_detail"]):
                points.append({**p, "saturated": None, "why": CLIENT_OUT_OF_FILES})
                raise self._failed(
                    f"{CLIENT_OUT_OF_FILES} at the {value:g} {unit} point, with "
                    f"{p['in_flight']['max']} request(s) in flight: the load was the client's "
                    "limit, not the server's",
                    "raise the open-file limit of the shell that runs it (ulimit -n 65536, or "
                    "LimitNOFILE= in a unit) or sweep lighter points",
                )
            gone = self._gone(p)
            if gone:
                points.append({**p, "saturated": None, "why": f"the server went away: {gone}"})
                raise self._failed(
                    f"the server went away during the {value:g} {unit} point: {gone}",
                    "a server that stops answering under load is broken, not saturated: "
                    "read its log (an engine that died, ran out of memory or was restarted)",
                )
            if not points and p["requests"] and not p["completed"]:
                points.append({**p, "saturated": None, "why": "every request failed"})
                raise self._failed(
                    f"every request of the lightest point ({value:g} {unit}) failed: "
                    f"{'; '.join(p['errors'][:2])}",
                    "one request at a time (servegate bench with the same --url and "
                    "--tiers) shows why a request fails",
                )
            base = next((q for q in points if q["ttft_s"]), None)
            why = saturation(p, base, points[-1] if points else None, self.load)
            p["saturated"], p["why"] = bool(why), why
            if self.unloaded_e2e is None and p["e2el_s"]:
                self.unloaded_e2e = p["e2el_s"]["p50"]
            points.append(p)
            self.save()
            self.reporter.note(line(p))
            if why and self.load.stop_at_saturation:
                break
        self.result["knee"] = knee(points)
        self.result["status"] = "complete"
        self.result["finished_at"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        self.save()
        return self.result


def run(
    bench: Bench,
    load: LoadSpec,
    output: Path | None,
    reporter: Reporter | None = None,
    prepared: Callable[[Bench], None] | None = None,
) -> dict[str, Any]:
    """Size the prompts, warm up, sweep; the result file keeps what finished."""
    load.check()
    try:
        bench.prepare()
        bench.warm_up()
        if prepared:
            prepared(bench)
        sweep = Load(bench, load, output, reporter)
    except BaseException as exc:
        bench.release()
        if output is not None:  # no earlier run's file may stand for this one
            output.parent.mkdir(parents=True, exist_ok=True)
            interrupted = isinstance(exc, KeyboardInterrupt)
            write_text(output, json.dumps({
                "schema": cases.SCHEMA, "kind": KIND,
                "status": "interrupted" if interrupted else "failed",
                "error": "interrupted" if interrupted else str(exc),
                "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "run": bench.result.get("run"), "engine": bench.result.get("engine"),
                "sizing": bench.result.get("sizing"), "warmup": bench.result.get("warmup"),
                "points": [], "knee": None,
            }, indent=1) + "\n")  # fmt: skip
        raise
    try:
        return sweep.sweep()
    except KeyboardInterrupt:
        sweep.result.update(status="interrupted", error="interrupted")
        sweep.save()
        raise
    except BenchFailed:  # the sweep said why, in the file too
        raise
    except Exception as exc:
        sweep.result.update(status="failed", error=repr(exc))
        sweep.save()
        raise BenchFailed(
            f"the load sweep failed: {exc!r}", hint=f"what finished is in {output}"
        ) from exc
    finally:
        bench.release()  # the tokenizer helper counted every answer; none stays up
