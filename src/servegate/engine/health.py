"""Wait until the restarted service is healthy — or notice at once that it never will be."""

from __future__ import annotations

import time

from servegate.engine import openai
from servegate.engine.managers import ServiceManager
from servegate.errors import ServiceFailed
from servegate.pipeline.stages import Reporter


def _indent(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.splitlines()) or "    (no output)"


def wait_healthy(
    manager: ServiceManager,
    endpoint: openai.Endpoint,
    timeout: float,
    reporter: Reporter,
    poll: float = 0.5,
) -> float:
    """Poll the manager and ``/health`` + ``/v1/models``; return the start-up seconds.

    Raises ServiceFailed as soon as the process exits or is restarted by its manager
    (a crash loop), or when ``timeout`` passes without a healthy answer. The first polls
    come quickly (50 ms, doubling up to ``poll``): a server up in 0.3 s is seen then,
    not at the next half second, and the start-up recorded is its own.
    """
    start = time.monotonic()
    why = "not polled yet"
    wait = min(0.05, poll)
    while True:
        elapsed = time.monotonic() - start
        state = manager.state()
        if state.restarts > 0 or state.gave_up:
            raise ServiceFailed(
                f"the service is in a restart loop: {manager.name} restarted it "
                f"{state.restarts} time(s) within {elapsed:.0f}s (state {state.raw})\n"
                f"  last log lines:\n{_indent(manager.log_tail(15))}",
                hint="read the service log; the release's server crashes after starting",
            )
        if state.exited:
            code = "" if state.exit_status is None else f" with status {state.exit_status}"
            raise ServiceFailed(
                f"the service exited{code} {elapsed:.1f}s after start (state {state.raw})\n"
                f"  last log lines:\n{_indent(manager.log_tail(15))}",
                hint="read the service log; the release's server fails at start",
            )
        ok, why = openai.health(endpoint, timeout=min(5.0, max(1.0, timeout - elapsed)))
        if ok:
            return time.monotonic() - start
        if elapsed > timeout:
            raise ServiceFailed(
                f"the service was not healthy within {timeout:.0f}s (last answer: {why})\n"
                f"  last log lines:\n{_indent(manager.log_tail(15))}",
                hint="raise service.startup_timeout if start-up is just slow, "
                "otherwise read the service log",
            )
        # whole: the reporter scrubs secrets out before it shortens the line
        last = manager.last_log_line().strip()
        reporter.progress(f"start-up {elapsed:4.0f}s / {timeout:.0f}s — {last or why}")
        time.sleep(wait)
        wait = min(wait * 2, poll)
