"""The client's own wait for a CPU before it read a stream's first text.

A stream's chunks are stamped when the client's thread reads them. On a box whose cores
are busy (vLLM's CPU backend keeps one core for its worker and busy-polls its engine
core on the other, beside the API server and the bench) the thread can be woken by the
first text and then wait tens of milliseconds, or seconds, before it runs and reads it:
the stamp then measures the client's turn on a CPU, not the server. The kernel counts
that wait per thread (``/proc/thread-self/schedstat``: the time it was runnable but not
running; ``getrusage``: how many times it slept), so the reader can say how long the
first text may have waited for it: the wait counted since the thread last slept inside
a read for want of bytes (:func:`parse`, into ``Stream.client_wait``).

That is an upper bound: a wait on the way to that sleep (preempted before it reached the
socket) counts too, and so does the whole wait after a text-free event that woke the
thread ahead of the first text (``transformers serve`` sends its role-only event as the
prefill starts). The stamps are not moved by it: the bytes read at once after a wait came
somewhere within it, and a stamp moved back to the wake-up could end a TTFT before the
prefill did. A trial whose first text waited more than a little is not the server's
measurement (``measure.waited``). Time for Python's lock (other streams read by threads
of the same process) is a sleep, not a wait for a CPU, and is not counted. Where the
kernel does not say (not Linux) ``client_wait`` is None.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType

from servegate.bench.sse import Stream, now, parse_lines

#: (seconds the thread has waited for a CPU, times it slept), or None: unknown
Sample = Callable[[], tuple[float, int] | None]


class ThreadWaits:
    """The calling thread's scheduling counters (a few microseconds a read: read around
    each line of a stream's start)."""

    PATH = "/proc/thread-self/schedstat"

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open(self.PATH, os.O_RDONLY)
        except OSError:
            self._fd = None

    def __call__(self) -> tuple[float, int] | None:
        if self._fd is None:
            return None
        try:
            waited = int(os.pread(self._fd, 128, 0).split()[1]) / 1e9
            return waited, resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
        except (OSError, IndexError, ValueError):
            return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def parse(
    lines: Iterable[str], stream: Stream, clock: Callable[[], float] = now,
    sample: Sample | None = None,
) -> Stream:  # fmt: skip
    """``parse_lines`` in the thread that reads the stream, noting in ``stream.client_wait``
    how long its first text may have waited for that thread to get a CPU."""
    with ReadClock(clock, sample) as read:
        try:
            parse_lines(read.lines(lines), stream, read)
        finally:
            if stream.first_text_at is not None:
                stream.client_wait = read.first
    return stream


class ReadClock:
    """The parser's clock for one stream, read in the thread that reads the stream: the
    plain time, noting how long the bytes behind the first stamp may have waited."""

    def __init__(self, clock: Callable[[], float] = now, sample: Sample | None = None) -> None:
        self._clock = clock
        self._own: ThreadWaits | None = None
        if sample is None:
            self._own = ThreadWaits()
            sample = self._own
        self._sample = sample
        start = sample()
        #: the wait counted when the thread last slept in a read (None: not known)
        self._base = None if start is None else start[0]
        #: seconds the bytes being parsed may have waited for a CPU (None: not known)
        self.lag: float | None = None if start is None else 0.0
        #: the lag at the first stamp taken (the parser stamps only text and the stream's
        #: end, so on a stream with text: the first text's); None: not stamped or unknown
        self.first: float | None = None
        self._stamped = False

    def __enter__(self) -> ReadClock:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._own is not None:
            self._own.close()

    def __call__(self) -> float:
        if not self._stamped:
            self._stamped = True
            self.first = self.lag
        return self._clock()

    def lines(self, lines: Iterable[str]) -> Iterator[str]:
        """``lines``, keeping :attr:`lag` right for each as it is handed on, until the
        first stamp (nothing later is needed)."""
        source = iter(lines)
        while not self._stamped:
            before = self._sample()
            try:
                line = next(source)
            except StopIteration:
                return
            after = self._sample()
            if before is None or after is None or self._base is None:
                self.lag = None
            else:
                if after[1] != before[1]:  # it slept in this read: the bytes came after
                    self._base = before[0]
                self.lag = round(after[0] - self._base, 9)
            yield line
        yield from source
