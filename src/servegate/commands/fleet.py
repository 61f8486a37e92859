"""`release …` and `servegate bench` for hosts over SSH (``host.ssh`` or a fleet)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from servegate.config import Config
from servegate.output import Output
from servegate.release import fleet


def promote(cfg: Config, out: Output, sha: str, allow_non_ff: bool) -> int:
    summary = fleet.promote(cfg, sha, allow_non_ff, out.reporter())
    code = int(summary["exit_code"])
    if out.json_mode:
        return out.emit(summary, code)
    rows = [
        [
            r["host"],
            str(r.get("before") or "")[:12],
            str(r.get("verdict", "not reached")),
            str(r.get("live") or "")[:12],
            str(r.get("rollback") or r.get("recovery") or ""),
            str(r.get("reason") or ""),
        ]
        for r in summary["hosts"]
    ]
    out.table(
        f"fleet promote {summary['sha'][:12]}: {summary['verdict']}",
        ["host", "before", "verdict", "live now", "rollback", "reason"],
        rows,
    )
    waves = " → ".join("[" + ", ".join(w) + "]" for w in summary["waves"])
    out.line(f"waves: {waves}")
    if summary["failed_host"]:
        out.line(f"stopped at {summary['failed_host']}; exit {code}")
    return code


def status(cfg: Config, out: Output) -> int:
    answers = fleet.each(cfg, lambda h: h.call("release", "status"))
    lives = [fleet.live_sha(a) for a in answers if a.ok]
    expected = max(set(lives), key=lives.count) if lives else None
    rows: list[dict[str, Any]] = []
    for a in answers:
        result = a.result if isinstance(a.result, dict) else {}
        live = fleet.live_sha(a) if a.ok else None
        service = result.get("service") or {}
        rows.append(
            {
                "host": a.host,
                "live": live,
                "matches": live is not None and live == expected,
                "healthy": bool(service.get("healthy")),
                "pending": result.get("pending"),
                "error": a.message,
            }
        )
    # a host's own check wins (7 unhealthy, 20 damaged state, 17 unreachable); 1 when the
    # hosts answered but serve different releases
    failed = [a.exit_code for a in answers if not a.ok]
    code = max(failed) if failed else 0 if all(r["matches"] and r["healthy"] for r in rows) else 1
    if out.json_mode:
        return out.emit({"expected": expected, "hosts": rows}, code)
    out.table(
        f"fleet: {len(rows)} host(s), expected {str(expected)[:12]}",
        ["host", "live", "matches", "healthy", "note"],
        [
            [
                r["host"],
                str(r["live"] or "(none)")[:12],
                "yes" if r["matches"] else "NO",
                "yes" if r["healthy"] else "NO",
                r["error"] or ("INTERRUPTED release pending" if r["pending"] else ""),
            ]
            for r in rows
        ],
    )
    return code


def each_command(cfg: Config, out: Output, args: Sequence[str]) -> int:
    """verify, rollback, history, recover on every host; the worst exit code wins.
    People see each host's own output; --json gets each host's JSON answer."""
    if not out.json_mode:
        return _passthrough(cfg, out, ["release", *args])
    answers = fleet.each(cfg, lambda h: h.call("release", *args))
    code = max((a.exit_code for a in answers), default=0)
    return out.emit(
        [
            {"host": a.host, "exit_code": a.exit_code, "result": a.result, "error": a.error}
            for a in answers
        ],
        code,
    )


def _passthrough(cfg: Config, out: Output, args: Sequence[str]) -> int:
    code = 0
    for host in fleet.connect(cfg):
        try:
            rc, text = host.passthrough(args)
        finally:
            host.transport.close()
        out.line(f"── {host.address} ──")
        out.line(text.rstrip())
        code = max(code, rc)
    return code


def bench(cfg: Config, out: Output, args: Sequence[str]) -> int:
    """`servegate bench …` on every host, its own output shown as the host printed it."""
    return _passthrough(cfg, out, ["bench", *args])
