"""What commands print: tables for people, one versioned JSON document for machines."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from servegate.errors import ServegateError
from servegate.pipeline.redact import OWN_FIELDS
from servegate.pipeline.stages import ConsoleReporter, QuietReporter, Reporter

SCHEMA = 1


def _console(stream: TextIO) -> Console:
    """120 columns where there is no terminal (tables grow past it: :meth:`Output.table`)."""
    width = None if stream.isatty() else 120
    return Console(file=stream, highlight=False, width=width)


@dataclass
class Output:
    json_mode: bool
    command: str
    console: Console = field(default_factory=lambda: _console(sys.stdout))
    err: Console = field(default_factory=lambda: _console(sys.stderr))
    #: replaces secret values in every text printed (set once the secrets are known)
    scrub: Callable[[str], str] | None = None

    def _clean(self, text: str) -> str:
        return self.scrub(text) if self.scrub is not None else text

    def reporter(self) -> Reporter:
        return QuietReporter() if self.json_mode else ConsoleReporter(self.err)

    def emit(
        self,
        result: Any,
        exit_code: int = 0,
        error: ServegateError | None = None,
        error_doc: dict[str, str] | None = None,
    ) -> int:
        """In JSON mode print the envelope; people get their tables from the command.
        ``error_doc``: the error object of a code that is not servegate's own (``focus
        --run`` exits with pytest's)."""
        if self.json_mode:
            doc: dict[str, Any] = {
                "schema": SCHEMA,
                "command": self.command,
                "ok": exit_code == 0,
                "exit_code": exit_code,
                "result": result,
            }
            if error is not None:
                doc["error"] = {
                    "class": _documented(type(error)),
                    "message": str(error),
                    "hint": error.hint,
                }
            elif error_doc is not None:
                doc["error"] = dict(error_doc)
            elif exit_code != 0:  # a failure always says what failed, never "error": null
                doc["error"] = _error_of(exit_code, result)
            if self.scrub is not None:
                doc = _scrubbed(json.loads(json.dumps(doc, default=str)), self.scrub)
            sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
        return exit_code

    def error(self, err: ServegateError) -> int:
        if self.json_mode:
            return self.emit(None, err.exit_code, err)
        # the message is text, never markup: "[service]" must print, "[/" must not crash
        self.err.print(Text(self._clean(err.render()), style="red"), soft_wrap=True)
        return err.exit_code

    def table(self, title: str, columns: list[str], rows: list[list[str]]) -> None:
        table = Table(title=Text(self._clean(title)), title_justify="left")
        for col in columns:
            table.add_column(Text(col), overflow="fold")  # wrapped or folded, never cut
        for row in rows:
            table.add_row(*(Text(self._clean(cell)) for cell in row))
        if self.console.is_terminal:
            self.console.print(table)
            return
        # a log (CI, a pipe) keeps every cell on its row, whole and greppable: the table as
        # wide as its widest row needs ("regular-128k", "INCONCLUSIVE", an SSH error)
        need = Measurement.get(self.console, self.console.options.update_width(10**5), table)
        width = self.console.width
        self.console.width = max(need.maximum, width)
        try:
            self.console.print(table)
        finally:
            self.console.width = width

    def stages(self, title: str, stages: list[dict[str, Any]]) -> None:
        """The stage table of a promote or rollback."""
        rows = [[s["name"], s["status"], f"{s['seconds']:.2f}", s["detail"][:70]] for s in stages]
        self.table(title, ["stage", "status", "seconds", "detail"], rows)

    def line(self, text: str) -> None:
        self.console.print(self._clean(text), markup=False, soft_wrap=True)


def _scrubbed(node: Any, scrub: Callable[[str], str]) -> Any:
    if isinstance(node, str):
        return scrub(node)
    if isinstance(node, dict):
        return {
            k: v if k in OWN_FIELDS and not isinstance(v, dict | list) else _scrubbed(v, scrub)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_scrubbed(v, scrub) for v in node]
    return node


def _documented(cls: type[ServegateError]) -> str:
    """The class docs/exit-codes.md names for an error: itself, or the documented class
    it refines (``init``'s Unsupported is a ConfigError)."""
    import servegate.errors as errors

    for base in cls.__mro__:
        if base in errors.ALL_ERRORS:
            return base.__name__
    return cls.__name__


def _error_of(exit_code: int, result: Any) -> dict[str, str]:
    """The error object of a failure a command reported as a result (a gate FAIL, a lint
    fail): the class documented for its exit code, the result's own reason."""
    import servegate.errors as errors

    classes = [
        c
        for c in vars(errors).values()
        if isinstance(c, type) and issubclass(c, ServegateError) and c.exit_code == exit_code
    ]
    reason = ""
    if isinstance(result, dict):
        reason = str(result.get("reason") or result.get("why") or result.get("verdict") or "")
    return {
        "class": classes[0].__name__ if classes else "Failed",
        "message": reason or f"exited {exit_code} (docs/exit-codes.md)",
        "hint": "the result holds the evidence; docs/exit-codes.md says what the code means",
    }
