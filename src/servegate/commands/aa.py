"""``servegate bench aa``: the live release against itself, N times — how often this box's
gate rolls back a release that did not change (its false-alarm rate, measured).

Each run is the bench check of a promote with the live release on both sides: the live
release measured as it serves (the fresh baseline's first block), the service restarted
and proven (where the promote would switch to the candidate), the "candidate" measured
and judged with the gate's own rule, plan and design — ABAB with a restart at every
switch where the plan spreads the repetitions over service starts, the sequential looks,
``gate.inconclusive``. The trend check is left out: it judges a release's history, not
its gate. The result (every run's verdict and rows, the share rolled back with its
95 % Clopper-Pearson interval) is printed and written to ``--out`` (default: the bench
results directory). Runs under the host lock and the GPU lease; the live release serves
again at the end, proven, and a restart that does not come back is put back as a
rollback would.
"""

from __future__ import annotations

import datetime as dt
import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servegate import config as config_mod
from servegate.commands.noise import on_live
from servegate.engine import lint as lint_mod
from servegate.engine import logscan
from servegate.errors import ConfigError, PreflightFailed, ServegateError
from servegate.judging import verdict
from servegate.output import Output
from servegate.pipeline import atomic
from servegate.pipeline.lease import gpu_lease
from servegate.pipeline.lock import HostLock
from servegate.release import bench_gate, bringup
from servegate.release.context import Context
from servegate.release.record import ReleaseRecord
from servegate.release.rollback import restore

ROLLED_BACK = (verdict.FAIL, verdict.INCONCLUSIVE)


def interval(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The Clopper-Pearson interval of a share ``k / n``."""
    from scipy.stats import beta  # type: ignore[import-untyped]

    a = (1 - level) / 2
    low = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    high = 1.0 if k == n else float(beta.ppf(1 - a, k + 1, n - k))
    return low, high


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(runs)
    counts = {
        v: sum(r["verdict"] == v for r in runs)
        for v in (verdict.PASS, verdict.FAIL, verdict.INCONCLUSIVE)
    }
    back = sum(counts[v] for v in ROLLED_BACK)
    low, high = interval(back, n) if n else (0.0, 1.0)
    return {
        "runs": n,
        "verdicts": counts,
        "rolled_back": back,
        "rolled_back_share": round(back / n, 4) if n else None,
        "interval_95": [round(low, 4), round(high, 4)],
    }


def run(cfg_path: Path, out: Output, runs: int, dest: Path | None) -> int:
    if runs < 1:
        raise ConfigError(f"--runs {runs}: give 1 or more", hint="--runs 10")
    cfg, ctx, live, model = on_live(
        cfg_path, out, "the A/A runs measure the live release against itself"
    )
    reporter = ctx.reporter
    where = Path(live.release_dir)
    facts = lint_mod.facts(ctx.spec(where, live.sha))
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    dest = dest or bench_gate.results_dir(cfg) / f"{stamp}-aa-{live.sha[:12]}.json"
    done: list[dict[str, Any]] = []
    with (
        HostLock(ctx.lock_path, "servegate bench aa"),
        gpu_lease(ctx.lease_path, "servegate bench aa", cfg.host.lease_timeout),
    ):
        restart = bringup.restarter(ctx, live.sha, where, live.artifacts)
        record = bringup.live_record(ctx)
        try:
            bringup.prove(ctx, live.sha, where, live.artifacts, bringup.Evidence())
            for i in range(runs):
                reporter.note(f"A/A run {i + 1} of {runs}: {live.sha[:12]} against itself")
                done.append(_one(ctx, cfg, model, live.sha, record, restart, facts))
                _write(dest, live.sha, done, runs)
        except ServegateError as exc:
            _write(dest, live.sha, done, runs, error=str(exc))
            back = restore(ctx, live)
            now = "serves again, proven" if back["ok"] else f"was not put back: {back['reason']}"
            exc.hint = (
                f"{exc.hint + '; ' if exc.hint else ''}the live release {now}; the runs so "
                f"far are in {dest}"
            )
            raise
    doc = _write(dest, live.sha, done, runs)
    if out.json_mode:
        return out.emit(doc)
    out.table(
        f"A/A — {live.sha[:12]} against itself, {runs} gate(s) on {socket.gethostname()}",
        ["run", "verdict", "design", "samples", "rows (ratio, interval)"],
        [[str(i + 1), r["verdict"], r["design"], r["samples"],
          "; ".join(f"{x['case']} {x['metric']} {x['ratio']} {x['interval']}" for x in r["rows"])]
         for i, r in enumerate(done)],
    )  # fmt: skip
    s = doc["summary"]
    out.line(
        f"rolled back {s['rolled_back']} of {s['runs']} ({s['rolled_back_share']:.0%}; 95 % "
        f"interval {s['interval_95'][0]:.0%} to {s['interval_95'][1]:.0%}); gate.false_alarm "
        f"is {cfg.gate.false_alarm:.0%}. Kept in {dest}"
    )
    return 0


def _one(
    ctx: Context,
    cfg: config_mod.Config,
    model: str,
    sha: str,
    record: ReleaseRecord | None,
    restart: Callable[[], dict[str, Any]],
    facts: dict[str, Any],
) -> dict[str, Any]:
    check = logscan.window_check(ctx.rules, facts)
    live = bench_gate.LiveBench(
        cfg, ctx.endpoint, model, sha, ctx.reporter, ctx.environ,
        log_file=ctx.manager.log_file, window_check=check, to_live=restart,
    )  # fmt: skip
    live.begin()
    if live.failed:
        raise PreflightFailed(live.failed, hint="read the bench result file and the service log")
    switched = restart()  # where the promote switches to the candidate
    evidence = bench_gate.run(
        cfg, ctx.endpoint, model, sha, record, ctx.manager.log_file, ctx.reporter, ctx.environ,
        window_check=check, restart=restart, live=live,
    )  # fmt: skip
    counts = evidence.get("repetitions") or {}
    return {
        "verdict": evidence["verdict"],
        "why": evidence["why"],
        "design": (evidence.get("design") or {}).get("name", "?"),
        "samples": ", ".join(f"{k} {v}" for k, v in counts.items()),
        "switch": switched,
        "rows": [
            {k: r.get(k) for k in ("case", "metric", "verdict", "ratio", "interval", "why")}
            for r in evidence["rows"]
        ],
        "result_file": evidence.get("result_file"),
        "baseline_result_file": (evidence.get("design") or {}).get("baseline_result_file"),
    }


def _write(
    dest: Path, sha: str, done: list[dict[str, Any]], planned: int, error: str = ""
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "kind": "servegate-aa",
        "sha": sha,
        "host": socket.gethostname(),
        "planned_runs": planned,
        "summary": summarize(done),
        "runs": done,
        **({"error": error} if error else {}),
    }
    dest.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(dest, json.dumps(doc, indent=1) + "\n")
    return doc
