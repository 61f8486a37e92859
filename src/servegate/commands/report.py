"""``servegate report``: the bench history of a stack, from its release records."""

from __future__ import annotations

import json
import os
from pathlib import Path

from servegate import config as config_mod
from servegate import hostpaths
from servegate.bench import export, history, load, results
from servegate.config import Config
from servegate.errors import NothingToDo, ResultFileError, ServegateError
from servegate.output import Output
from servegate.release import bench_gate
from servegate.release.deploy import make_deployer
from servegate.release.record import host_records
from servegate.release.state import HostState


def collect(cfg: Config | None, files: list[Path]) -> list[history.Point]:
    """Every release record with bench samples (oldest first), then the given files."""
    points: list[history.Point] = []
    if cfg is not None and cfg.host.root and hostpaths.of(cfg).state.exists():
        state = HostState.load(hostpaths.of(cfg).state)
        repo = make_deployer(cfg).repo
        seen: set[str] = set()
        for entry in state.history:
            if entry.sha in seen:
                continue
            seen.add(entry.sha)
            try:
                records = host_records(cfg, repo.notes(entry.sha), entry.sha)  # its own
            except ServegateError:
                continue
            for rec in records:
                doc = bench_gate.recorded_samples(rec)
                if doc is None:
                    continue
                checks = [c for c in rec["gate"]["checks"] if isinstance(c, dict)]
                gate = next(c for c in checks if c.get("name") == bench_gate.CHECK)
                points += history.points_from(
                    results.from_record(doc, entry.sha[:12]), entry.sha[:12],
                    str(rec.get("at", "")), str(gate.get("verdict", "")), str(rec.get("verdict")),
                )  # fmt: skip
    for path in files:
        s = results.load(path)
        points += history.points_from(s, path.stem, "", "", "result file")
    return points


def _kind(path: Path) -> str:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return ""
    return str(doc.get("kind", "")) if isinstance(doc, dict) else ""


def load_curves(cfg: Config | None, files: list[Path]) -> list[history.LoadCurve]:
    """The load sweeps of the host's results directory (oldest first), then the given
    files: one curve each."""
    paths: list[Path] = []
    if cfg is not None:
        where = bench_gate.results_dir(cfg)
        if where.is_dir():
            paths += sorted(p for p in where.glob("*.json") if _kind(p) == load.KIND)
    paths += [p for p in files if p not in paths]
    curves = []
    for path in paths:
        doc = export.read(path)
        try:
            curve = history.curve_from(doc, path.stem)
        except (TypeError, ValueError, AttributeError, KeyError) as exc:
            raise ResultFileError(
                f"load result {path} is damaged: {type(exc).__name__}: {exc}",
                hint="pass a file servegate bench load wrote, or remove this one",
            ) from None
        curves.append(curve)
    return curves


def run(cfg_path: Path, out: Output, outdir: Path, files: list[Path]) -> int:
    # a config without [host] (e.g. bench settings alone) still reads the given files
    cfg = config_mod.load(cfg_path, os.environ, build_only=True) if cfg_path.exists() else None
    sweeps = [p for p in files if _kind(p) == load.KIND]
    points = collect(cfg, [p for p in files if p not in sweeps])
    curves = load_curves(cfg, sweeps)
    if not points and not curves:
        raise NothingToDo(
            "no bench measurements found: no release record with bench samples, no result files",
            hint="add 'bench' to gate.checks and promote, or pass result files "
            "(servegate bench or servegate bench load)",
        )
    title = (cfg.stack.remote if cfg else "") or "bench history"
    written: dict[str, str] = {}
    groups: list[history.GroupGpu] = []
    sources: dict[str, str] = {}
    for path in (p for p in files if _kind(p) == "servegate.bench"):  # (read above)
        doc = export.read(path)
        groups += history.gpu_groups(doc, path.stem)
        sources[path.stem] = history.gpu_source(doc)
    if points:
        png, page = history.render(points, outdir, title, groups, sources)
        written.update(png=str(png), html=str(page))
    if curves:
        lpng, lpage = history.render_load(
            curves, outdir, (cfg.stack.remote if cfg else "") or "load sweeps"
        )
        written.update(load_png=str(lpng), load_html=str(lpage))
    if out.json_mode:
        return out.emit({**written, "points": len(points), "load_curves": len(curves)})
    if points:
        out.line(f"{len(points)} point(s) → {written['png']} and {written['html']}")
    if curves:
        out.line(f"{len(curves)} load sweep(s) → {written['load_png']} and {written['load_html']}")
    return 0
