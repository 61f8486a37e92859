"""Render a stack's bench history: prefill and decode per release and case, verdicts marked."""

from __future__ import annotations

import base64
import html
import math
import statistics
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


@dataclass(frozen=True)
class Change:
    """A change point of a case's metric over the releases (:mod:`servegate.judging.trend`):
    the level moved at ``release`` from ``before`` to ``after``."""

    case: str
    metric: str
    release: str
    at: str
    before: float
    after: float
    change: float
    pvalue: float
    #: the move is a loss in the rule's direction
    loss: bool


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ConfigError(
            "servegate report draws its charts with matplotlib, which is not installed "
            "(it is the optional extra 'report')",
            hint="install it into servegate's own environment from the checkout servegate was "
            "installed from: pip install -e 'PATH/TO/servegate[report]' (or pip install "
            "matplotlib there); the gate and the records need no charts",
        ) from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@dataclass(frozen=True)
class GroupGpu:
    """One measured group's GPU telemetry, from a bench result file."""

    label: str
    case: str
    group: int
    gpu: dict[str, tuple[float, float, float]] | None


def gpu_groups(doc: Mapping[str, Any], label: str) -> list[GroupGpu]:
    """Every group's telemetry in a bench result document (``servegate bench``)."""
    out = []
    for case in doc.get("cases") or []:
        if not isinstance(case, Mapping):
            continue
        for g in case.get("groups") or []:
            if isinstance(g, Mapping):
                out.append(GroupGpu(label, str(case.get("id", "")), int(g.get("group") or 0),
                                    gpu_summary(g.get("telemetry"))))  # fmt: skip
    return out


def render(
    points: Sequence[Point],
    outdir: Path,
    title: str,
    groups: Sequence[GroupGpu] = (),
    sources: Mapping[str, str] | None = None,
    changes: Sequence[Change] = (),
) -> tuple[Path, Path]:
    """The history chart and page; ``groups`` and ``sources`` (label → where the
    telemetry came from, or why none): the GPU telemetry beside every group of the
    result files given; ``changes``: change points, a dashed line before the release
    where a level moved and a table."""
    plt = _pyplot()
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
        for c in changes:
            if c.metric == metric and c.release in x_of:
                ax.axvline(x_of[c.release] - 0.5, color=COLOURS["FAIL" if c.loss else "PASS"],
                           linestyle="--", linewidth=1)  # fmt: skip
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=8, loc="best")
    axes[0].set_title(f"{title}\n(dots: gate verdict — green PASS, red FAIL, orange INCONCLUSIVE; "
                      "x: rolled back; dashed: a change point)", fontsize=9)  # fmt: skip
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
        + _changes_section(changes)
        + _gpu_section(groups, sources or {})
    )
    return png, page


def _changes_section(changes: Sequence[Change]) -> str:
    """The change points: where a case's level moved, release by release."""
    if not changes:
        return ""
    rows = "\n".join(
        f"<tr><td>{html.escape(c.case)}</td><td>{html.escape(c.metric)}</td>"
        f"<td>{html.escape(c.release)}</td><td>{html.escape(c.at)}</td><td>{_n(c.before)}</td>"
        f"<td>{_n(c.after)}</td><td style='color:{COLOURS['FAIL' if c.loss else 'PASS']}'>"
        f"{c.change:+.1%}</td><td>{c.pvalue:.3f}</td></tr>"
        for c in changes
    )
    return (
        "<h2>Change points</h2><p>Releases where the level of a case's metric moved (the "
        "geometric means of the released records measured like the newest one; "
        'docs/bench.md, "Creeping losses").</p><table><tr><th>case</th><th>metric</th>'
        "<th>from release</th><th>at</th><th>before</th><th>after</th><th>change</th>"
        f"<th>p</th></tr>{rows}</table>\n"
    )


def _gpu_section(groups: Sequence[GroupGpu], sources: Mapping[str, str]) -> str:
    """GPU telemetry beside every group of the result files (the records keep samples,
    not telemetry: a result file has it)."""
    if not sources:
        return ""
    listed = "".join(
        f"<li>{html.escape(label)}: {html.escape(src)}</li>" for label, src in sources.items()
    )
    rows = "\n".join(
        f"<tr><td>{html.escape(g.label)}</td><td>{html.escape(g.case)}</td><td>{g.group}</td>"
        f"{gpu_cells(g.gpu)}</tr>"
        for g in groups
        if g.gpu
    )
    table = (
        f"<table><tr><th>result</th><th>case</th><th>group</th>{gpu_heads()}</tr>{rows}</table>"
        if rows
        else ""
    )
    return f"<h2>GPU telemetry beside every group</h2><ul>{listed}</ul>{table}\n"


def _n(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


@dataclass(frozen=True)
class LoadCurve:
    """One load sweep (a release, or a result file): its points as a curve."""

    label: str
    at: str
    mode: str
    workload: str
    #: (load, request throughput, TTFT p50 s, TTFT p99 s, ITL p99 ms, E2E p99 s, saturated)
    points: tuple[tuple[float, float, float, float, float, float, bool], ...]
    knee: float | None
    #: each point's GPU telemetry over its GPUs (:func:`gpu_summary`; None: none read)
    gpu: tuple[dict[str, tuple[float, float, float]] | None, ...] = ()
    #: where the telemetry came from, or why there is none ("none — a CPU server ...")
    gpu_source: str = ""
    #: the sweep's status ("complete", "failed", "interrupted") and its error
    status: str = "complete"
    error: str = ""


#: the telemetry fields a report shows, and how
GPU_FIELDS = (("sm_clock_mhz", "SM clock MHz"), ("power_w", "power W"),
              ("temperature_c", "temperature °C"), ("memory_used_mib", "memory used MiB"),
              ("utilization_pct", "utilization %"))  # fmt: skip


def gpu_summary(tele: Any) -> dict[str, tuple[float, float, float]] | None:
    """A group's or a point's telemetry (``telemetry.Sampler.stop``) over all its GPUs:
    per field (min of the minima, mean of the means, max of the maxima); None where it
    has no readings."""
    gpus = tele.get("gpus") if isinstance(tele, Mapping) else None
    if not isinstance(gpus, Mapping) or not gpus:
        return None
    out = {}
    for key, _ in GPU_FIELDS:
        stats = [g[key] for g in gpus.values() if isinstance(g, Mapping) and key in g]
        if stats:
            out[key] = (min(float(x["min"]) for x in stats),
                        round(sum(float(x["mean"]) for x in stats) / len(stats), 2),
                        max(float(x["max"]) for x in stats))  # fmt: skip
    return out or None


def gpu_source(doc: Mapping[str, Any]) -> str:
    """The result file's telemetry source, with its GPUs, or why it has none."""
    tele = doc.get("telemetry") or {}
    if not isinstance(tele, Mapping) or not tele.get("source"):
        why = tele.get("why") if isinstance(tele, Mapping) else ""
        return f"none — {why}" if why else "none recorded"
    names = sorted({str(g.get("name")) for g in tele.get("gpus") or [] if isinstance(g, Mapping)})
    return f"{tele['source']}" + (f" ({', '.join(names)})" if names else "") + (
        f" — {tele['why']}" if tele.get("why") else "")  # fmt: skip


def gpu_cells(g: Mapping[str, tuple[float, float, float]] | None) -> str:
    """Table cells for one group's or point's telemetry: min-max (mean) per field."""
    if not g:
        return "".join("<td>-</td>" for _ in GPU_FIELDS)
    return "".join(
        f"<td>{g[key][0]:g} to {g[key][2]:g} ({g[key][1]:g})</td>" if key in g else "<td>-</td>"
        for key, _ in GPU_FIELDS
    )


def gpu_heads() -> str:
    return "".join(f"<th>{html.escape(name)} min-max (mean)</th>" for _, name in GPU_FIELDS)


def _p(stats: Any, key: str) -> float:
    """A percentile, or NaN where the point has none (no answer timed: not drawn, "-")."""
    value = stats.get(key) if isinstance(stats, Mapping) else None
    return float(value) if isinstance(value, int | float) else math.nan


def curve_from(doc: Mapping[str, Any], fallback: str) -> LoadCurve:
    """A load result document → its curve (its drawable points: those that finished a
    request; a failed sweep keeps its status and error, drawn or not)."""
    run = doc.get("run") or {}
    rows, gpu = [], []
    for p in doc.get("points") or []:
        ttft = p.get("ttft_s") or {}
        if not p.get("request_throughput") or not ttft:
            continue
        rows.append((float(p["value"]), float(p["request_throughput"]), _p(ttft, "p50"),
                     _p(ttft, "p99"), _p(p.get("itl_ms"), "p99"), _p(p.get("e2el_s"), "p99"),
                     bool(p.get("saturated"))))  # fmt: skip
        gpu.append(gpu_summary(p.get("telemetry")))
    release = str(run.get("release") or "")
    knee = (doc.get("knee") or {}).get("value")
    return LoadCurve(release[:12] or fallback, str(doc.get("started_at") or ""),
                     str(run.get("mode", "")), str(run.get("workload", "")), tuple(rows),
                     float(knee) if isinstance(knee, int | float) else None, tuple(gpu),
                     gpu_source(doc), str(doc.get("status") or "complete"),
                     str(doc.get("error") or ""))  # fmt: skip


def _f(v: float, digits: int) -> str:
    return "-" if math.isnan(v) else f"{v:.{digits}f}"


def _plain(text: str) -> str:
    """Text matplotlib draws as written: a ``$`` would start its math mode."""
    return text.replace("$", r"\$")


def render_load(curves: Sequence[LoadCurve], outdir: Path, title: str) -> tuple[Path, Path]:
    """Latency against throughput, one curve a release: TTFT p50 and p99, ITL p99 and
    E2E p99 against the request throughput each load point achieved; saturated points
    hollow, the knee ringed."""
    plt = _pyplot()
    outdir.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(3, 2, figsize=(11, 11.5))
    panels = ((axes[0][0], 2, "TTFT p50 (s)"), (axes[0][1], 3, "TTFT p99 (s)"),
              (axes[1][0], 4, "ITL p99 (ms)"), (axes[1][1], 5, "E2E p99 (s)"))  # fmt: skip
    _gpu_panels(curves, axes[2][0], axes[2][1])
    for ax, index, name in panels:
        for curve in curves:
            xs = [row[1] for row in curve.points]
            ys = [row[index] for row in curve.points]
            failed = "" if curve.status == "complete" else f", {curve.status}"
            label = _plain(f"{curve.label} ({curve.workload}{failed})")
            (line,) = ax.plot(xs, ys, "-", linewidth=1.2, label=label)
            for row in curve.points:
                face = "none" if row[6] else line.get_color()
                ax.scatter([row[1]], [row[index]], facecolors=face, edgecolors=line.get_color(),
                           s=40, zorder=3)  # fmt: skip
                if curve.knee is not None and row[0] == curve.knee:
                    ax.scatter([row[1]], [row[index]], facecolors="none", edgecolors="black",
                               s=160, zorder=4)  # fmt: skip
        ax.set_xlabel("achieved requests/s")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    if any(c.points for c in curves):
        axes[0][0].legend(fontsize=8, loc="best")
    fig.suptitle(f"{_plain(title)}\n(hollow: the point saturated the server; ringed: the knee)",
                 fontsize=9)  # fmt: skip
    fig.tight_layout()
    png = outdir / "load-curves.png"
    fig.savefig(png, dpi=110)
    plt.close(fig)
    page = outdir / "load-curves.html"
    rows = "\n".join(
        f"<tr><td>{html.escape(c.label)}</td><td>{html.escape(c.workload)}</td>"
        f"<td>{row[0]:g}</td><td>{row[1]:.3f}</td><td>{_f(row[2], 3)}</td>"
        f"<td>{_f(row[3], 3)}</td><td>{_f(row[4], 1)}</td><td>{_f(row[5], 2)}</td>"
        f"<td>{'saturated' if row[6] else ('knee' if row[0] == c.knee else 'ok')}</td>"
        f"{gpu_cells(c.gpu[i] if i < len(c.gpu) else None)}</tr>"
        for c in curves
        for i, row in enumerate(c.points)
    )
    sources = "".join(
        f"<li>{html.escape(c.label)}: {html.escape(c.gpu_source or 'none recorded')}</li>"
        for c in curves
    )
    sweeps = "".join(
        f"<li>{html.escape(c.label)}: {html.escape(c.status)}"
        + (f" — {html.escape(c.error)}" if c.error else "")
        + ("" if c.points else " (no point finished a request: nothing drawn)")
        + "</li>"
        for c in curves
    )
    image = base64.b64encode(png.read_bytes()).decode()
    page.write_text(
        "<!doctype html><meta charset='utf-8'>"
        f"<title>servegate load curves — {html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}</style>"
        f"<h1>Latency against throughput</h1><p>{html.escape(title)}</p>"
        f"<img alt='latency against throughput per release' src='data:image/png;base64,{image}'>"
        f"<h2>Sweeps</h2><ul>{sweeps}</ul>"
        f"<h2>GPU telemetry</h2><ul>{sources}</ul>"
        "<table><tr><th>release</th><th>workload</th><th>load</th><th>req/s</th>"
        "<th>TTFT p50 s</th><th>TTFT p99 s</th><th>ITL p99 ms</th><th>E2E p99 s</th>"
        f"<th>state</th>{gpu_heads()}</tr>{rows}</table>\n"
    )
    return png, page


def _gpu_panels(curves: Sequence[LoadCurve], clock_ax: Any, power_ax: Any) -> None:
    """SM clock and power (mean, with the min-max range as a bar) against the achieved
    requests a second: a throttle or a clock drop under load shows beside the latencies
    it moved. Without telemetry the panels say why."""
    drawn = False
    for ax, key, name in ((clock_ax, "sm_clock_mhz", "GPU SM clock (MHz)"),
                          (power_ax, "power_w", "GPU power (W)")):  # fmt: skip
        for curve in curves:
            pts = [(row[1], g[key]) for row, g in zip(curve.points, curve.gpu, strict=False)
                   if g and key in g]  # fmt: skip
            if not pts:
                continue
            drawn = True
            xs = [x for x, _ in pts]
            means = [v[1] for _, v in pts]
            err = [[v[1] - v[0] for _, v in pts], [v[2] - v[1] for _, v in pts]]
            ax.errorbar(xs, means, yerr=err, fmt="-o", capsize=3, markersize=4,
                        linewidth=1.2, label=_plain(curve.label))  # fmt: skip
        ax.set_xlabel("achieved requests/s")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    if not drawn:
        why = "; ".join(sorted({
            (c.gpu_source or "none recorded").removeprefix("none — ")
            .removeprefix("no GPU telemetry: ") for c in curves
        }))  # fmt: skip
        for ax in (clock_ax, power_ax):
            ax.text(0.5, 0.5, _plain("no GPU telemetry:\n" + textwrap.fill(why, 50)),
                    ha="center", va="center", fontsize=8, transform=ax.transAxes)  # fmt: skip
            ax.set_xticks([])
            ax.set_yticks([])
