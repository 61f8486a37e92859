"""``servegate bench noise``: measure the box's noise on the live release, keep it, plan.

The live release is measured with the config's ``[bench]`` cases in ``--restarts + 1``
service starts (the service is restarted in between, under the host lock, and must come
back healthy), ``--repetitions`` groups each. The within-start CV and the restart offset
per case and metric go to ``<host.root>/noise.json``; the table says, for each gate rule,
how many repetitions resolve its tolerance on this box — or which loss it resolves
instead.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
from collections.abc import Mapping
from pathlib import Path

from servegate import config as config_mod
from servegate.bench import results
from servegate.bench.cases import METRICS, spec_from_config
from servegate.bench.driver import Bench
from servegate.commands.bench import served_model
from servegate.engine.health import wait_healthy
from servegate.errors import BenchFailed, ConfigError, PreflightFailed
from servegate.judging import noise
from servegate.output import Output
from servegate.pipeline.lease import gpu_lease
from servegate.pipeline.lock import HostLock
from servegate.release import bench_gate
from servegate.release.context import Context
from servegate.release.state import Entry


def on_live(cfg_path: Path, out: Output, why: str) -> tuple[config_mod.Config, Context, Entry, str]:
    """(config, context, the live release, its served model) for a command that measures
    the live release; PreflightFailed (saying ``why`` it needs one) where there is none."""
    environ = dict(os.environ)
    cfg = config_mod.load(cfg_path, environ)
    ctx = Context.create(cfg, out.reporter(), environ)
    live = ctx.state.current
    if live is None:
        raise PreflightFailed(
            f"no live release on this host: {why}",
            hint="promote a release first (`release promote SHA`)",
        )
    return cfg, ctx, live, cfg.service.model or served_model(ctx.endpoint)


def run(cfg_path: Path, out: Output, restarts: int, repetitions: int) -> int:
    if restarts < 1 or repetitions < 2:
        raise ConfigError(
            f"--restarts {restarts} --repetitions {repetitions}: the restart offset needs two "
            "service starts or more, and the within-start CV two groups a start",
            hint="--restarts 2 (the default) or more, --repetitions 2 or more",
        )
    cfg, ctx, live, model = on_live(cfg_path, out, "the noise is measured on the live release")
    reporter, environ = ctx.reporter, ctx.environ
    spec = spec_from_config(cfg.bench, ctx.endpoint, model, "", socket.gethostname())
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    files: list[str] = []
    starts: list[results.Samples] = []
    with (
        HostLock(ctx.lock_path, "servegate bench noise"),
        gpu_lease(ctx.lease_path, "servegate bench noise", cfg.host.lease_timeout),
    ):
        for start in range(restarts + 1):
            if start:
                reporter.note(f"restarting {cfg.service.unit} ({start} of {restarts}) …")
                ctx.manager.stop()
                ctx.manager.start()
                wait_healthy(ctx.manager, ctx.endpoint, cfg.service.startup_timeout, reporter)
            output = bench_gate.results_dir(cfg) / f"{stamp}-noise-{start}.json"
            bench = Bench(spec, output, reporter, environ=environ)
            try:
                bench.prepare()
                bench.warm_up()
                for case in spec.cases:
                    bench.measure(case, repetitions)
            except BenchFailed as exc:
                bench.fail("failed", str(exc))
                raise
            finally:
                bench.release()  # whatever stopped it: no tokenizer helper left behind
            starts.append(results.from_result(bench.finish(), str(output)))
            files.append(str(output))
    found = noise.measure(starts, METRICS)
    missing = _unmeasured(starts, found)
    if not found:  # an empty record would replace a good one: keep what was there
        raise BenchFailed(
            "the noise could not be estimated for any case: " + "; ".join(missing),
            hint="each start needs two valid groups of a case; run again with more "
            "--repetitions, or on a quieter box (the result files say why trials were "
            f"dropped: {', '.join(files)})",
        )
    fingerprint = starts[-1]
    path = noise.save(cfg.host_root, found, fingerprint.fingerprint, live.sha,
                      socket.gethostname(), files)  # fmt: skip
    planned = bench_gate.plan(cfg, found)
    unresolved = bench_gate.unresolved(planned, cfg.bench.max_repetitions, cfg.bench.max_starts)
    doc = {
        "file": str(path),
        "rows": {k: v.as_dict() for k, v in found.items()},
        "plan": planned,
        "unresolved": unresolved,
        "unmeasured": missing,
    }
    if out.json_mode:
        return out.emit(doc)
    out.table(
        f"box noise — {restarts + 1} start(s) x {repetitions} of {live.sha[:12]}",
        ["case", "metric", "CV", f"restart offset ({noise.CONFIDENCE:.0%} bound)", "estimate",
         "samples"],
        [[k.split(":")[0], k.split(":")[1], f"{v.cv:.2%}", f"{v.offset:.2%}",
          "-" if v.offset_estimate is None else f"{v.offset_estimate:.2%}", str(v.samples)]
         for k, v in found.items()],
    )  # fmt: skip
    out.table(
        "gate plan",
        ["case", "metric", "tolerance", "repetitions", "service starts", "resolves at the cap"],
        [[r["case"], r["metric"], f"{r['tolerance']:.0%}",
          str(r["repetitions"]) if r["repetitions"] else "not within the cap",
          str(r["starts"]) if r["starts"] else "-",
          f"{r['resolves']:.1%}"] for r in planned],
    )  # fmt: skip
    for line in [*unresolved, *missing]:
        out.line(line)
    out.line(f"kept in {path}: the gate plans its repetitions from it")
    return 0


def _unmeasured(starts: list[results.Samples], found: Mapping[str, noise.Noise]) -> list[str]:
    """Each case and metric measured in some start but given no estimate, and why: the
    valid samples each start had (two a start are needed)."""
    lines = []
    for cid in sorted({c for s in starts for c in s.cases}):
        for m in METRICS:
            counts = [len(s.cases[cid].metrics.get(m, [])) if cid in s.cases else 0 for s in starts]
            if f"{cid}:{m}" not in found and any(counts):
                lines.append(f"{cid} {m}: not estimated (valid samples a start: "
                             f"{', '.join(map(str, counts))}; two a start are needed)")  # fmt: skip
    return lines
