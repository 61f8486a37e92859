"""``servegate report``: the bench history of a stack, from its release records."""

from __future__ import annotations

import os
from pathlib import Path

from servegate import config as config_mod
from servegate import hostpaths
from servegate.bench import history, results
from servegate.config import Config
from servegate.errors import NothingToDo, ServegateError
from servegate.output import Output
from servegate.release import bench_gate
from servegate.release.deploy import make_deployer
from servegate.release.record import parse_notes
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
                records = parse_notes(repo.notes(entry.sha))
            except ServegateError:
                continue
            for rec in records:
                doc = bench_gate.recorded_samples(rec)
                if doc is None:
                    continue
                gate = next(c for c in rec["gate"]["checks"] if c.get("name") == bench_gate.CHECK)
                points += history.points_from(
                    results.from_record(doc, entry.sha[:12]), entry.sha[:12],
                    str(rec.get("at", "")), str(gate.get("verdict", "")), str(rec.get("verdict")),
                )  # fmt: skip
    for path in files:
        s = results.load(path)
        points += history.points_from(s, path.stem, "", "", "result file")
    return points


def run(cfg_path: Path, out: Output, outdir: Path, files: list[Path]) -> int:
    # a config without [host] (e.g. bench settings alone) still reads the given files
    cfg = config_mod.load(cfg_path, os.environ, build_only=True) if cfg_path.exists() else None
    points = collect(cfg, files)
    if not points:
        raise NothingToDo(
            "no bench measurements found: no release record with bench samples, no result files",
            hint="add 'bench' to gate.checks and promote, or pass result files",
        )
    png, page = history.render(points, outdir, (cfg.stack.remote if cfg else "") or "bench history")
    if out.json_mode:
        return out.emit({"png": str(png), "html": str(page), "points": len(points)})
    out.line(f"{len(points)} point(s) → {png} and {page}")
    return 0
