"""Stages with timings, a status and a reason, reported as they run."""

from __future__ import annotations

import enum
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from rich.console import Console
from rich.markup import escape
from rich.status import Status as RichStatus


class Status(enum.StrEnum):
    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass
class StageResult:
    name: str
    status: Status
    seconds: float
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": str(self.status),
            "seconds": round(self.seconds, 3),
            "detail": self.detail,
        }


class Reporter(Protocol):
    def stage_started(self, name: str) -> None: ...
    def stage_ended(self, result: StageResult) -> None: ...
    def progress(self, text: str) -> None: ...
    def note(self, text: str) -> None: ...


class QuietReporter:
    """For ``--json``: stdout carries only the final JSON document."""

    def stage_started(self, name: str) -> None:
        pass

    def stage_ended(self, result: StageResult) -> None:
        pass

    def progress(self, text: str) -> None:
        pass

    def note(self, text: str) -> None:
        pass


class ConsoleReporter:
    """Stage lines on stderr; on a terminal a live status line, elsewhere a line every 10 s."""

    def __init__(self, console: Console | None = None, prefix: str = "") -> None:
        self.console = console or Console(stderr=True, highlight=False)
        self.prefix = prefix
        self._status: RichStatus | None = None
        self._last_plain = 0.0

    def stage_started(self, name: str) -> None:
        self._last_plain = time.monotonic()

    def stage_ended(self, result: StageResult) -> None:
        self._clear()
        mark = {"ok": "[green]✓[/]", "failed": "[red]✗[/]", "skipped": "[dim]-[/]"}[result.status]
        detail = f"  [dim]{escape(result.detail)}[/]" if result.detail else ""
        self.console.print(
            f"{escape(self.prefix)}{mark} {escape(result.name):<11} {result.seconds:7.2f}s{detail}",
            markup=True,
        )

    def progress(self, text: str) -> None:
        if self.console.is_terminal:
            if self._status is None:
                self._status = self.console.status(escape(text))
                self._status.start()
            else:
                self._status.update(escape(text))
            return
        now = time.monotonic()
        if now - self._last_plain >= 10:
            self._last_plain = now
            self.console.print(f"{self.prefix}  … {text}", markup=False, soft_wrap=True)

    def note(self, text: str) -> None:
        self._clear()
        self.console.print(f"{self.prefix}{text}", markup=False, soft_wrap=True)

    def _clear(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None


@dataclass
class StageRunner:
    reporter: Reporter
    results: list[StageResult] = field(default_factory=list)

    @contextmanager
    def stage(self, name: str) -> Iterator[StageResult]:
        """Time the block; an exception marks the stage failed (with its message) and
        propagates. The block may set ``result.detail``."""
        result = StageResult(name, Status.OK, 0.0)
        self.reporter.stage_started(name)
        start = time.monotonic()
        try:
            yield result
        except BaseException as exc:
            result.status = Status.FAILED
            first = (str(exc).splitlines() or [type(exc).__name__])[0]  # Ctrl-C has no text
            result.detail = result.detail or first[:160]
            raise
        finally:
            result.seconds = time.monotonic() - start
            self.results.append(result)
            self.reporter.stage_ended(result)

    def seconds(self, name: str) -> float:
        return sum(r.seconds for r in self.results if r.name == name)

    def as_list(self) -> list[dict[str, Any]]:
        return [r.as_dict() for r in self.results]
