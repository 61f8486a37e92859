"""The client's own wait for a CPU, kept out of what it measures.

A stream's chunks are stamped when the client's thread reads them. On a box whose cores
are busy (vLLM's CPU backend keeps one core for its worker and busy-polls its engine
core on the other, beside the API server and the bench) the thread can be woken by the
first text and then wait tens of milliseconds, or seconds, before it runs and reads it:
the stamp then measures the client's turn on a CPU, not the server. The kernel counts
that wait per thread (``/proc/thread-self/schedstat``: time spent runnable but not
running, and how many times the thread was put on a CPU; ``getrusage``: how many times
it slept), so the reader can say how long the bytes it is parsing had been waiting.

:func:`parse` reads a stream so: the first text's stamp (``Stream.first_text_at``, the
end of the TTFT) is its read less the wait for a CPU since the thread last slept inside
a read (for want of bytes: what it read came after that, and every wait since delayed
its reading); ``Stream.client_wait`` says how much that was. A read in which the thread
also waited before it slept (preempted on its way to the socket, before the bytes came)
cannot be told apart: the wait is then unknown and nothing is moved. Time the thread
spent running (parsing) is not removed. Only the first text is moved: a backlog read at once
after a wait came over the whole wait, one chunk after another, and the kernel does not
say when each did (its stamps are left as read, so a start that arrived in a burst is
still dropped as one: ``measure.held``). The error left is the time between the bytes
that woke the thread and the first text (vLLM sends its role-only event 0.2-0.4 ms
before the first text, in the same step). Where the kernel does not say (not Linux)
nothing is moved and ``client_wait`` is None.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType

from servegate.bench.sse import Stream, now, parse_lines

#: (seconds the thread has waited for a CPU, times it was put on one, times it slept),
#: or None: unknown
Sample = Callable[[], tuple[float, int, int] | None]


class ThreadWaits:
    """The calling thread's scheduling counters, read from one open file (a few
    microseconds: read around each line of a stream's start)."""

    PATH = "/proc/thread-self/schedstat"

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open(self.PATH, os.O_RDONLY)
        except OSError:
            self._fd = None

    def __call__(self) -> tuple[float, int, int] | None:
        if self._fd is None:
            return None
        try:
            fields = os.pread(self._fd, 128, 0).split()
            slept = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
            return int(fields[1]) / 1e9, int(fields[2]), slept
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
    """``parse_lines`` in the thread that reads the stream, the first text's wait for a
    CPU left out of its stamp and kept in ``stream.client_wait``."""
    with ReadClock(clock, sample) as read:
        try:
            parse_lines(read.lines(lines), stream, read)
        finally:
            if stream.first_text_at is not None:
                stream.client_wait = read.first
                stream.first_text_at -= read.first or 0.0
    return stream


class ReadClock:
    """The parser's clock for one stream, read in the thread that reads the stream: the
    plain time, noting how long the bytes behind the first stamp had waited for a CPU."""

    def __init__(self, clock: Callable[[], float] = now, sample: Sample | None = None) -> None:
        self._clock = clock
        self._own: ThreadWaits | None = None
        if sample is None:
            self._own = ThreadWaits()
            sample = self._own
        self._sample = sample
        #: seconds the bytes being parsed have waited for this thread to get a CPU (None:
        #: cannot be told)
        self.lag: float | None = 0.0 if sample() is not None else None
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
        first stamp."""
        source = iter(lines)
        base: float | None = None  # the wait counted when the thread last slept in a read
        while not self._stamped:  # past the first stamp nothing more is needed
            before = self._sample()
            try:
                line = next(source)
            except StopIteration:
                return
            after = self._sample()
            if before is None or after is None:
                self.lag = None
            elif after[1] != before[1]:  # it left the CPU inside this read
                clean = after[1] - before[1] == 1 and after[2] - before[2] == 1
                # one sleep and one return to the CPU: the bytes came after the sleep began
                # and every wait since is theirs; more: it may have waited before
                base = before[0] if clean else None
                self.lag = after[0] - base if base is not None else None
            elif base is not None:
                self.lag = after[0] - base
            yield line
        yield from source
