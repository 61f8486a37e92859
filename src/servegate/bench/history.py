"""Render a stack's bench history: prefill and decode per release and case, verdicts marked."""

from __future__ import annotations

import base64
import html
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from servegate.bench.results import Samples
from servegate.errors import ConfigError

COLOURS = {"PASS": "#2e7d32", "FAIL": "#c62828", "INCONCLUSIVE": "#ef6c00", "": "#555555"}


@dataclass(frozen=True)
class Point:
    """One measured release (or result file) and one case."""

    label: str
    at: str
    verdict: str
    outcome: str
    case: str
    prefill_tps: float | None
    generation_tps: float | None


def points_from(samples: Samples, label: str, at: str, verdict: str, outcome: str) -> list[Point]:
    out = []
    for cid, cs in sorted(samples.cases.items()):
        pre = cs.metrics.get("prefill_tps") or []
        gen = cs.metrics.get("generation_tps") or []
        out.append(
            Point(
                label, at, verdict, outcome, cid,
                statistics.median(pre) if pre else None,
                statistics.median(gen) if gen else None,
            )
        )  # fmt: skip
    return out


def render(points: Sequence[Point], outdir: Path, title: str) -> tuple[Path, Path]:
    try:
        import matplotlib
    except ImportError:
        raise ConfigError(
            "servegate report draws its charts with matplotlib, which is not installed "
            "(it is the optional extra 'report')",
            hint="install it beside servegate: pip install 'servegate[report]' (or "
            "`pipx inject servegate matplotlib`); the gate and the records need no charts",
        ) from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir.mkdir(parents=True, exist_ok=True)
    labels: list[str] = []
    for p in points:
        if p.label not in labels:
            labels.append(p.label)
    x_of = {label: i for i, label in enumerate(labels)}
    cases = sorted({p.case for p in points})
    fig, axes = plt.subplots(2, 1, figsize=(max(7.0, 1.1 * len(labels) + 3), 7), sharex=True)
    for ax, metric, name in (
        (axes[0], "prefill_tps", "prefill tok/s (median)"),
        (axes[1], "generation_tps", "decode tok/s (median)"),
    ):
        for case in cases:
            mine = [p for p in points if p.case == case and getattr(p, metric) is not None]
            if not mine:
                continue
            xs = [x_of[p.label] for p in mine]
            ys = [float(getattr(p, metric)) for p in mine]
            ax.plot(xs, ys, "-", linewidth=1.2, label=case, alpha=0.7)
            for p, x, y in zip(mine, xs, ys, strict=True):
                marker = "x" if p.outcome == "rolled_back" else "o"
                ax.scatter([x], [y], color=COLOURS.get(p.verdict, "#555555"), marker=marker, s=60,
                           zorder=3)  # fmt: skip
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="best")
    axes[0].set_title(f"{title}\n(dots: gate verdict — green PASS, red FAIL, orange INCONCLUSIVE; "
                      "x: rolled back)", fontsize=9)  # fmt: skip
    axes[1].set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    fig.tight_layout()
    png = outdir / "bench-history.png"
    fig.savefig(png, dpi=110)
    plt.close(fig)
    page = outdir / "bench-history.html"
    rows = "\n".join(
        f"<tr><td>{html.escape(p.label)}</td><td>{html.escape(p.at)}</td>"
        f"<td>{html.escape(p.case)}</td><td>{_n(p.prefill_tps)}</td><td>{_n(p.generation_tps)}</td>"
        f"<td style='color:{COLOURS.get(p.verdict, '#555')}'>{html.escape(p.verdict or '-')}</td>"
        f"<td>{html.escape(p.outcome)}</td></tr>"
        for p in points
    )
    image = base64.b64encode(png.read_bytes()).decode()
    page.write_text(
        "<!doctype html><meta charset='utf-8'>"
        f"<title>servegate bench history — {html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}</style>"
        f"<h1>Bench history</h1><p>{html.escape(title)}</p>"
        f"<img alt='prefill and decode per release' src='data:image/png;base64,{image}'>"
        "<table><tr><th>release</th><th>at</th><th>case</th><th>prefill tok/s</th>"
        f"<th>decode tok/s</th><th>gate</th><th>outcome</th></tr>{rows}</table>\n"
    )
    return png, page


def _n(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"
