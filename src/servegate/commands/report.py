"""``servegate report``: the bench history of a stack, from its release records."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

from servegate import config as config_mod
from servegate.bench import charts, export, loadspec, results
from servegate.commands import args as common_args
from servegate.config import Config
from servegate.errors import ConfigError, NothingToDo, ResultFileError
from servegate.output import Output
from servegate.release import bench_gate, trend
from servegate.release.record import ReleaseRecord

#: the config a command reads when --config is not given
DEFAULT_CONFIG = Path("servegate.toml")


def collect(records: list[ReleaseRecord], files: list[Path]) -> list[charts.Point]:
    """Every release record with bench samples (oldest first), then the given files."""
    points: list[charts.Point] = []
    for rec in records:
        doc = bench_gate.recorded_samples(rec)
        if doc is None:
            continue
        check = rec.gate.check(bench_gate.CHECK) if rec.gate else None
        sha = rec.sha[:12]
        points += charts.points_from(
            results.from_record(doc, sha), sha, rec.at, check.verdict if check else "", rec.verdict
        )
    for path in files:
        s = results.load(path)
        points += charts.points_from(s, path.stem, "", "", "result file")
    return points


def change_points(cfg: Config | None, records: list[ReleaseRecord]) -> list[charts.Change]:
    """The change points of the host's released records measured like the newest one."""
    found = trend.summary(cfg, records).get("change_points", {}) if cfg is not None else {}
    return [
        charts.Change(key.rsplit(":", 1)[0], key.rsplit(":", 1)[1], s["sha"][:12], s["at"],
                       s["before"], s["after"], s["change"], s["pvalue"], s["loss"])
        for key, shifts in sorted(found.items())
        for s in shifts
    ]  # fmt: skip


def _kind(path: Path) -> str:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return ""
    return str(doc.get("kind", "")) if isinstance(doc, dict) else ""


def load_curves(cfg: Config | None, files: list[Path]) -> list[charts.LoadCurve]:
    """The load sweeps of the host's results directory (oldest first), then the given
    files: one curve each."""
    paths: list[Path] = []
    if cfg is not None:
        where = bench_gate.results_dir(cfg)
        if where.is_dir():
            paths += sorted(p for p in where.glob("*.json") if _kind(p) == loadspec.KIND)
    paths += [p for p in files if p not in paths]
    curves = []
    for path in paths:
        doc = export.read(path)
        try:
            curve = charts.curve_from(doc, path.stem)
        except (TypeError, ValueError, AttributeError, KeyError) as exc:
            raise ResultFileError(
                f"load result {path} is damaged: {type(exc).__name__}: {exc}",
                hint="pass a file servegate bench load wrote, or remove this one",
            ) from None
        curves.append(curve)
    return curves


def run(cfg_path: Path, out: Output, outdir: Path, files: list[Path]) -> int:
    if cfg_path != DEFAULT_CONFIG and not cfg_path.exists():
        raise ConfigError(
            f"config {cfg_path} not found: no release records to draw from",
            hint="pass the stack's config (--config PATH), or result files alone",
        )
    # a config without [host] (e.g. bench settings alone) still reads the given files
    cfg = config_mod.load(cfg_path, os.environ, build_only=True) if cfg_path.exists() else None
    sweeps = [p for p in files if _kind(p) == loadspec.KIND]
    records = trend.records(cfg) if cfg is not None else []
    points = collect(records, [p for p in files if p not in sweeps])
    curves = load_curves(cfg, sweeps)
    if not points and not curves:
        if cfg is None:
            why, hint = (
                f"no {DEFAULT_CONFIG} here and no result files",
                "pass the stack's config (--config PATH) or result files (servegate bench "
                "or servegate bench load)",
            )
        elif "bench" in cfg.gate.checks:
            why, hint = (
                "no release record with bench samples yet, and no result files",
                "promote a release (its bench check records the samples), or pass result "
                "files (servegate bench or servegate bench load)",
            )
        else:
            why, hint = (
                "no release record with bench samples: gate.checks has no 'bench'",
                "add 'bench' to gate.checks and promote, or pass result files "
                "(servegate bench or servegate bench load)",
            )
        raise NothingToDo(f"no bench measurements found: {why}", hint=hint)
    title = (cfg.stack.remote if cfg else "") or "bench history"
    written: dict[str, str] = {}
    groups: list[charts.GroupGpu] = []
    sources: dict[str, str] = {}
    for path in (p for p in files if _kind(p) == "servegate.bench"):  # (read above)
        doc = export.read(path)
        groups += charts.gpu_groups(doc, path.stem)
        sources[path.stem] = charts.gpu_source(doc)
    changes = change_points(cfg, records) if records else []
    if points:
        png, page = charts.render(points, outdir, title, groups, sources, changes)
        written.update(png=str(png), html=str(page))
    if curves:
        lpng, lpage = charts.render_load(
            curves, outdir, (cfg.stack.remote if cfg else "") or "load sweeps"
        )
        written.update(load_png=str(lpng), load_html=str(lpage))
    if out.json_mode:
        return out.emit({**written, "points": len(points), "load_curves": len(curves),
                         "change_points": [dataclasses.asdict(c) for c in changes]})  # fmt: skip
    if points:
        out.line(f"{len(points)} point(s) → {written['png']} and {written['html']}")
        for c in changes:
            out.line(f"  change point: {c.case} {c.metric} at {c.release}: {c.change:+.1%}")
    if curves:
        out.line(f"{len(curves)} load sweep(s) → {written['load_png']} and {written['load_html']}")
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=Path("servegate-report"), help="output directory")
    p.add_argument("files", nargs="*", type=Path, metavar="FILE", help="extra result files")
    common_args.common(p)


def main(args: argparse.Namespace, out: Output) -> int:
    return run(args.config, out, args.out, args.files)
