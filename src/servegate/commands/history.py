from __future__ import annotations

import argparse
from typing import Any

from servegate import hostpaths
from servegate.commands import args as common_args
from servegate.config import Config
from servegate.output import Output
from servegate.release import trend
from servegate.release.state import HostState


def run(cfg: Config, out: Output, limit: int) -> int:
    state = HostState.load(hostpaths.of(cfg).state)
    entries = state.history[-limit:] if limit > 0 else state.history
    found = trend.summary(cfg)
    if out.json_mode:
        releases = [
            {
                "sha": e.sha,
                "verdict": e.verdict,
                "at": e.at,
                "tag": e.tag,
                "reason": e.reason,
                "startup_seconds": e.startup_seconds,
                "artifacts": e.artifacts,
            }
            for e in entries
        ]
        return out.emit({"releases": releases, "trend": found})
    rows = [
        [("▶ " if e == state.current else "  ") + e.sha[:12], e.verdict, e.at, e.tag, e.reason[:60]]
        for e in entries
    ]
    out.table("release history (newest last)", ["sha", "verdict", "at", "tag", "reason"], rows)
    show_trend(out, found)
    return 0


def show_trend(out: Output, found: dict[str, Any]) -> None:
    """The newest release against the best of the window, and the change points."""
    if "judged" not in found:
        out.line(f"trend: {found['why']}")
        return
    judged = found["judged"]
    shifts = found["change_points"]
    rows = [
        [r["case"], r["metric"], r["verdict"],
         "-" if r["ratio"] is None else f"{r['ratio']:.3f}",
         "-" if r["interval"] is None else f"[{r['interval'][0]:.3f}, {r['interval'][1]:.3f}]",
         (r["best"] or "-")[:12],
         _shifts(shifts.get(f"{r['case']}:{r['metric']}", []))]
        for r in judged["rows"]
    ]  # fmt: skip
    out.table(
        f"trend: {found['latest'][:12]} against {judged['against']} — {judged['verdict']}",
        ["case", "metric", "trend", "ratio", "interval", "against", "change points"],
        rows,
    )
    out.line(f"trend {judged['verdict']}: {judged['why']}")
    for line in found["skipped"]:
        out.line(f"  left out: {line}")


def _shifts(found: list[dict[str, Any]]) -> str:
    shown = (f"{s['sha'][:12]} {s['change']:+.1%} ({_p(s['pvalue'])})" for s in found)
    return "; ".join(shown) or "-"


def _p(value: float) -> str:
    return "p < 0.001" if value < 0.001 else f"p {value:.3f}"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", type=int, default=20, help="show the last N (0: all)")
    common_args.common(p)


def main(cfg: Config, args: argparse.Namespace, out: Output) -> int:
    return run(cfg, out, args.n)
