"""Stop signals for the commands that switch a live service.

A promote or rollback stopped after its switch must put the previous release back
before it exits; its code does that for ``KeyboardInterrupt``. But Python raises that
only for SIGINT, and only where SIGINT was not ignored when the interpreter started:
``nohup``, cron, a background job of a non-interactive shell (a CI step's ``cmd &``) and
Ansible run by any of them hand their children an ignored SIGINT. SIGTERM (systemd
stopping a unit, ``timeout``, a CI runner's cancel) and SIGHUP (a lost SSH session) end
Python at once, nothing put back, until the next release command recovers.

Within :func:`handled`, SIGINT, SIGTERM and SIGHUP each raise ``KeyboardInterrupt`` the
first time one comes, whatever was inherited. Later ones are said and otherwise
ignored: a second signal must not cut short the putting back that the first one
started (SIGKILL still stops it; ``release recover`` or the next release command then
finishes it). The standard library's ``signal`` is the whole machinery: no library of
the field does less.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from types import FrameType

#: the signals that stop a switching command the way Ctrl-C does
STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

#: the stop signals received within :func:`handled` (the first one's name first)
_received: list[str] = []
#: how many :func:`putting_back` blocks are running
_putting_back = [0]


def _say(text: str) -> None:
    """Print to stderr from a signal handler: a stderr that leads nowhere (a lost SSH
    session's, a closed pipe's) must not raise in place of the stop, nor in the middle of
    the putting back."""
    with suppress(OSError, ValueError):
        print(text, file=sys.stderr, flush=True)


@contextmanager
def putting_back() -> Iterator[None]:
    """Within the block (it puts a release back after a switch), a stop signal, the first
    one too, is said and does not cut it short; :func:`stop_if_received` afterwards stops
    a command that would go on to switch again."""
    _putting_back[0] += 1
    try:
        yield
    finally:
        _putting_back[0] -= 1


def stop_if_received() -> None:
    """KeyboardInterrupt if a stop signal came during a :func:`putting_back` block."""
    if _received:
        raise KeyboardInterrupt


@contextmanager
def handled(what: str) -> Iterator[None]:
    """Within the block, the first of ``STOPS`` raises KeyboardInterrupt; ``what`` names
    the command in what later ones print."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers (and gets the signals)
        return
    received = _received
    received.clear()

    def on_stop(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if received or _putting_back[0]:
            after = f" after {received[0]}" if received else ""
            received.append(name)
            _say(
                f"\nservegate: {name} while {what} is stopping{after}: it "
                "finishes what it started (putting the previous release back after a "
                "switch); SIGKILL stops it, and `release recover` then finishes it"
            )
            return
        received.append(name)
        if signum != signal.SIGINT:
            _say(f"\nservegate: {name}: {what} stops as for Ctrl-C")
        raise KeyboardInterrupt

    old = {s: signal.signal(s, on_stop) for s in STOPS}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        received.clear()
