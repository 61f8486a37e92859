"""``servegate bench``: measure a server; ``bench compare``: A/B; ``bench gate``: judge files."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import shlex
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from servegate import config as config_mod
from servegate import envfile, flags, hostpaths
from servegate.bench import cases, document, driver, load, loadreport, loadspec, probes, results
from servegate.bench.cases import METRICS
from servegate.commands import args as common_args
from servegate.config import DEFAULT_CORRECTNESS, Config
from servegate.engine import adapters, lint, logscan, openai
from servegate.engine.launch import LaunchSpec, engine_of, launch_spec
from servegate.errors import BenchFailed, ConfigError, GateFailed, ResultFileError, ServegateError
from servegate.judging import verdict
from servegate.output import Output
from servegate.pipeline import redact
from servegate.pipeline.atomic import write_text
from servegate.pipeline.lease import gpu_lease, lease_path
from servegate.release import bench_gate

PROBES = ("correctness", "prefix_reuse", "vision", "spec_decode")


@dataclass(frozen=True)
class Options:
    url: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    #: the ``[bench]`` settings typed on the command line (:func:`servegate.flags.overrides`)
    bench: Mapping[str, Any] = field(default_factory=dict)
    output: Path | None = None
    server_command: str = ""
    system: str = ""
    server_log: Path | None = None
    probes: str = ""
    baseline: Path | None = None
    lenient: bool = False
    lease: bool = True
    #: vllm, transformers, openai, or None: the config's engine (with --url: detected from
    #: /v1/models)
    engine: str | None = None


def load_config(path: Path, environ: Mapping[str, str], need: bool) -> Config | None:
    """The config if the file exists; without one, --url must say where to measure. With
    --url the file may hold [bench], [gate] and [probes] alone."""
    if path.exists():
        return config_mod.load(path, environ, build_only=not need)
    if need:
        raise ConfigError(
            f"config file {path} not found and no --url given",
            hint="pass --url http://HOST:PORT (and --model), or --config PATH",
        )
    return None


def _csv(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def bench_settings(cfg: Config | None, o: Options) -> config_mod.Bench:
    """The config's ``[bench]`` (or the defaults) with the flags typed. A ``--repetitions``
    above ``bench.max_repetitions`` raises the cap with it."""
    b = cfg.bench if cfg else config_mod.Bench()
    changes = dict(o.bench)
    if "repetitions" in changes:
        changes["max_repetitions"] = max(changes["repetitions"], b.max_repetitions)
    return replace(b, **changes)


def served_model(endpoint: openai.Endpoint) -> str:
    """The first model the server lists; a server that does not answer is a BenchFailed
    naming it (the error's own text only when it is the network's: an encoding error
    would quote the request's headers, API key included)."""
    try:
        return openai.first_model(endpoint)
    except httpx.HTTPError as exc:
        why = f"{type(exc).__name__}: {exc}"
    except Exception as exc:
        why = type(exc).__name__
    raise BenchFailed(
        f"the server at {endpoint.shown_url} does not answer /v1/models ({why})",
        hint="start the server or pass the right --url",
    )


def endpoint_of(cfg: Config | None, o: Options, environ: Mapping[str, str]) -> openai.Endpoint:
    key_env = o.api_key_env or (cfg.service.api_key_env if cfg else "")
    if cfg is not None and key_env:
        environ = envfile.environ_with(cfg.service.env_file, environ)
    key = environ.get(key_env, "") if key_env else ""
    if key_env and not key:
        raise ConfigError(f"the API key variable {key_env} is not set", hint=f"export {key_env}")
    url = o.url or (f"http://{cfg.service.host}:{cfg.service.port}" if cfg else "")
    engine = adapters.by_name(o.engine) if o.engine else None
    if engine is None and cfg is not None and not o.url:
        engine = engine_of(cfg)
    return openai.Endpoint(url.rstrip("/").removesuffix("/v1"), key, engine)


@contextlib.contextmanager
def _maybe_lease(take: bool, what: str, cfg: Config | None) -> Iterator[None]:
    if not take:
        yield
        return
    path = lease_path(os.environ, cfg.host.state_dir if cfg else "")
    timeout = cfg.host.lease_timeout if cfg else 3600.0
    with gpu_lease(path, what, timeout):
        yield


def run(cfg_path: Path, out: Output, o: Options) -> int:
    environ = os.environ
    cfg = load_config(cfg_path, environ, need=o.url is None)
    b = bench_settings(cfg, o)
    endpoint = endpoint_of(cfg, o, environ)
    model = o.model or (cfg.service.model if cfg else "")
    if not model:
        model = served_model(endpoint)
    live = _live_launch(cfg)
    salt = redact.host_salt(cfg.host_root) if cfg and cfg.host.root else ""
    given = redact.argv(shlex.split(o.server_command), salt) if o.server_command else []
    command = " ".join(given) or (" ".join(redact.argv(live.argv, salt)) if live else "")
    spec = cases.spec_from_config(b, endpoint, model, command, o.system)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    where = bench_gate.results_dir(cfg) if cfg else Path("bench-results")
    output = o.output or where / f"{stamp}-{model.replace('/', '_')}.json"
    log = driver.LogWindow(o.server_log) if o.server_log else _service_log(cfg)
    probe_names = _csv(o.probes)
    unknown = [p for p in probe_names if p not in PROBES]
    if unknown:
        raise ConfigError(
            f"unknown probe(s): {', '.join(unknown)}", hint=f"probes: {', '.join(PROBES)}"
        )
    base = None
    if o.baseline:  # checked before anything is measured
        base = results.load(o.baseline)
        planned = {c.id: results.CaseSamples(c.id, c.required) for c in spec.cases}
        mine = results.Samples(str(output), cases.HARNESS, document.fingerprint(spec), planned)
        lenient = o.lenient or not base.harness.startswith("servegate")
        problems = results.check_comparable(base, mine, lenient)
        if problems:
            raise ResultFileError(
                f"baseline {o.baseline} cannot be compared: {'; '.join(problems)}",
                hint="measure with the baseline's settings (or --lenient for another harness); "
                "nothing was measured",
            )
        if lenient:
            for line in results.lenient_differences(base, mine):
                out.err.print(f"warning: baseline compared leniently although {line}", markup=False)
    reporter = out.reporter()
    out.err.print(
        f"bench: {len(spec.cases)} case(s) x {spec.repetitions} at {endpoint.shown_url} "
        f"({model}); results: {output}",
        markup=False,
    )
    with _maybe_lease(o.lease, f"servegate bench {endpoint.shown_url}", cfg):
        try:
            result = driver.run(spec, output, reporter, log, environ, _log_rules(cfg, live))
        except BenchFailed as exc:
            exc.hint = (exc.hint + "; " if exc.hint else "") + f"what finished is in {output}"
            raise
        probe_results = [_probe(name, endpoint, model, cfg) for name in probe_names]
    result["probes"] = [
        {"name": p.name, "ok": p.ok, "reason": p.reason, "seconds": round(p.seconds, 3),
         "evidence": p.evidence}
        for p in probe_results
    ]  # fmt: skip
    decision = None
    if base is not None:
        decision = judge(cfg, base, results.from_result(result, str(output)))
        result["gate"] = decision
    document.write_result(output, result)
    failed_requests = sum(
        1 for c in result["cases"] for g in c["groups"] for t in g["trials"] if not t["ok"]
    )
    if out.json_mode:
        code = _exit_code(failed_requests, decision, probe_results)
        return out.emit(result, code)
    print_tables(out, result)
    for p in probe_results:
        out.line(f"probe {p.name}: {'PASS' if p.ok else 'FAIL'} — {p.reason}")
    if decision:
        print_gate(out, decision)
    out.line(f"result file: {output}")
    code = _exit_code(failed_requests, decision, probe_results)
    if failed_requests:
        out.err.print(
            f"bench failed: {failed_requests} request(s) failed (see request_failed in {output})",
            markup=False,
        )
    return code


def _exit_code(
    failed: int, decision: dict[str, Any] | None, probes_: Sequence[probes.ProbeResult]
) -> int:
    if failed:
        return BenchFailed.exit_code
    if decision and decision["verdict"] != verdict.PASS:
        return GateFailed.exit_code
    if any(not p.ok for p in probes_):
        return GateFailed.exit_code
    return 0


def _live_launch(cfg: Config | None) -> LaunchSpec | None:
    """The configured service's launch, as promote starts it (None: no service here)."""
    if cfg is None or cfg.service.command == config_mod.UNCONFIGURED_COMMAND:
        return None
    return launch_spec(cfg, hostpaths.of(cfg).current, "", strict=False)


def _log_rules(
    cfg: Config | None, live: LaunchSpec | None
) -> Callable[[driver.Bench], None] | None:
    """With a configured service, its log rules judge every measured window too."""
    if cfg is None or live is None:
        return None
    check = logscan.window_check(lint.ruleset(cfg), lint.facts(live))

    def attach(bench: driver.Bench) -> None:
        bench.window_check = check

    return attach


def _service_log(cfg: Config | None) -> driver.LogWindow | None:
    if cfg is None or cfg.service.manager != "supervisor":
        return None
    path = hostpaths.of(cfg).service_log(cfg.service.unit)
    return driver.LogWindow(path) if path.exists() else None


def _probe(
    name: str, endpoint: openai.Endpoint, model: str, cfg: Config | None
) -> probes.ProbeResult:
    p = cfg.probes if cfg else config_mod.Probes()
    if name == "correctness":
        return probes.correctness(endpoint, model, p.correctness or DEFAULT_CORRECTNESS, p.timeout)
    if name == "prefix_reuse":
        return probes.prefix_reuse(endpoint, model, p.prefix_tier, p.prefix_min_cached,
                                   p.prefix_max_ttft_ratio, p.timeout)  # fmt: skip
    if name == "vision":
        return probes.vision(endpoint, model, p.vision_size, p.vision_followup_tier,
                             p.prefix_min_cached, p.prefix_max_ttft_ratio, p.timeout)  # fmt: skip
    return probes.spec_decode(endpoint, model, p.timeout, p.spec_min_acceptance)


def _f(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}" if isinstance(value, float) else f"{value:,}"


def print_tables(out: Output, result: Mapping[str, Any]) -> None:
    """The two tables the field reads: the whole load, and one stream."""
    load_rows, one_rows = [], []
    for case in result["cases"]:
        s = case["summary"]
        valid = (
            "yes"
            if s.get("performance_valid")
            else "NO: " + ", ".join(s.get("invalid_reason_totals", {}))
        )
        groups = [g["totals"] for g in case["groups"]]
        walls = [g["wall_s"] for g in groups if g["wall_s"]]
        load_rows.append([
            case["id"], str(case["concurrency"]), str(len(groups)),
            _f(sum(walls) / len(walls) if walls else None),
            _f(s.get("prefill_tps_total")), _f(s.get("token_generation_tps_total")),
            _f(s.get("requests_per_minute"), 2), valid,
        ])  # fmt: skip
        one_rows.append([
            case["id"], _f(s.get("prompt_tokens"), 0), _f(s.get("prefill_tps")),
            _f(s.get("generation_tps")), _f(s.get("ttft_s"), 2),
            _f(s.get("mean_inter_token_latency_ms"), 2), _f(s.get("output_tps_whole_request")),
            f"{s.get('valid_trials', 0)}/{s.get('trials', 0)}",
        ])  # fmt: skip
    out.table(
        "WHOLE LOAD — every stream of a group together (medians over groups)",
        ["case", "streams", "groups", "wall s", "TOTAL PP t/s", "TOTAL TG t/s", "req/min", "valid"],
        load_rows,
    )
    out.table(
        "ONE STREAM — what one request experiences (medians over valid trials)",
        ["case", "prompt tok", "PP t/s", "TG t/s", "TTFT s", "ITL ms", "out t/s", "valid"],
        one_rows,
    )
    out.line(
        "PP = prompt_tokens / TTFT; TG = (completion_tokens - 1) / decode window; "
        "TOTAL PP = all prompt tokens / slowest first token; TOTAL TG = all tokens but each "
        "stream's first / the group's generating window; token counts from usage."
    )


def print_gate(out: Output, decision: Mapping[str, Any]) -> None:
    rows = [
        [
            r["case"], r["metric"], "yes" if r["required"] else "report",
            _f(r["baseline_median"], 2), _f(r["candidate_median"], 2), _f(r["ratio"], 3),
            f"[{r['interval'][0]:.3f}, {r['interval'][1]:.3f}]" if r["interval"] else "-",
            _f(r["threshold"], 3), _f(r["floor"], 1), r["verdict"],
        ]
        for r in decision["rows"]
    ]  # fmt: skip
    out.table(
        f"GATE — {decision.get('method', '')}",
        ["case", "metric", "required", "baseline", "candidate", "ratio", "interval",
         "threshold", "floor", "verdict"],
        rows,
    )  # fmt: skip
    out.line(f"gate verdict: {decision['verdict']} — {decision['why']}")


def load_pair(
    out: Output, a: Path, b: Path, lenient: bool
) -> tuple[results.Samples, results.Samples]:
    """Two result files that may be compared (another harness on either side: lenient,
    and what differs between them is said, never dropped)."""
    sa, sb = results.load(a), results.load(b)
    foreign = not (sa.harness.startswith("servegate") and sb.harness.startswith("servegate"))
    problems = results.check_comparable(sa, sb, lenient or foreign)
    if problems:
        raise ResultFileError(
            f"{a} and {b} cannot be compared: {'; '.join(problems)}",
            hint="measure both with the same settings (or --lenient across harnesses)",
        )
    if lenient or foreign:
        for line in results.lenient_differences(sa, sb):
            out.err.print(f"warning: compared leniently although {line}", markup=False)
    return sa, sb


def judge(cfg: Config | None, base: results.Samples, cand: results.Samples) -> dict[str, Any]:
    """The gate's decision with the config's rules (the defaults without a config)."""
    st = verdict.Settings.of(cfg.gate if cfg else config_mod.Gate())
    return verdict.evaluate(
        base, cand, bench_gate.rules(cfg) if cfg else list(verdict.DEFAULT_RULES), st
    )


def gate_files(cfg_path: Path, out: Output, baseline: Path, candidate: Path, lenient: bool) -> int:
    """Judge a candidate result file against a baseline file with the config's gate rules."""
    cfg = load_config(cfg_path, os.environ, need=False)
    base, cand = load_pair(out, baseline, candidate, lenient)
    decision = judge(cfg, base, cand)
    code = 0 if decision["verdict"] == verdict.PASS else GateFailed.exit_code
    if out.json_mode:
        return out.emit(decision, code)
    print_gate(out, decision)
    return code


def compare_files(out: Output, a: Path, b: Path, lenient: bool, confidence: float) -> int:
    sa, sb = load_pair(out, a, b, lenient)
    rows = verdict.compare_table(sa, sb, METRICS, confidence)
    return _print_compare(out, rows, str(a), str(b), confidence, {})


def _print_compare(
    out: Output,
    rows: list[dict[str, Any]],
    a: str,
    b: str,
    confidence: float,
    extra: dict[str, Any],
) -> int:
    if out.json_mode:
        return out.emit({"a": a, "b": b, "confidence": confidence, "rows": rows, **extra})
    out.table(
        f"A/B — A: {a}  B: {b}  (B vs A, geometric-mean ratio, {confidence:.0%} Welch "
        "interval on log rates)",
        ["case", "metric", "A median", "B median", "delta %", "interval %", "n A", "n B"],
        [
            [
                r["case"], r["metric"], _f(r["a_median"], 3), _f(r["b_median"], 3),
                _f(r["delta_pct"], 2),
                _interval(r["interval_pct"]),
                str(r["n_a"]), str(r["n_b"]),
            ]
            for r in rows
        ],
    )  # fmt: skip
    return 0


def _interval(iv: list[float] | None) -> str:
    return f"[{iv[0]:+.2f}, {iv[1]:+.2f}]" if iv else "-"


def compare_live(
    cfg_path: Path, out: Output, o: Options, a_url: str, b_url: str, rounds: int, confidence: float
) -> int:
    """Two live endpoints measured in interleaved order (ABAB…), so drift cancels."""
    environ = os.environ
    cfg = load_config(cfg_path, environ, need=False)
    b = bench_settings(cfg, o)
    sides = {}
    for name, url in (("A", a_url), ("B", b_url)):
        ep = endpoint_of(cfg, replace(o, url=url), environ)
        model = o.model or served_model(ep)
        spec = cases.spec_from_config(b, ep, model, "", f"compare side {name}")
        sides[name] = driver.Bench(spec, None, out.reporter(), None, environ)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    outdir = o.output or Path("bench-results") / f"compare-{stamp}"
    with _maybe_lease(o.lease, f"servegate bench compare {a_url} {b_url}", cfg):
        try:
            for name, bench in sides.items():
                bench.output = outdir / f"{name}.json"
                bench.prepare()
                bench.warm_up()
            for _ in range(rounds):
                for case in sides["A"].spec.cases:
                    for name in ("A", "B"):
                        sides[name].measure(case, 1)
            for bench in sides.values():
                bench.finish()
        finally:
            for bench in sides.values():
                bench.release()  # whatever stopped it: no tokenizer helper left behind
    sa = results.from_result(sides["A"].result, a_url)
    sb = results.from_result(sides["B"].result, b_url)
    rows = verdict.compare_table(sa, sb, METRICS, confidence)
    return _print_compare(
        out, rows, a_url, b_url, confidence, {"results": str(outdir), "order": "ABAB"}
    )


def load_sweep(cfg_path: Path, out: Output, o: Options, spec: loadspec.LoadSpec) -> int:
    """``servegate bench load``: a sweep of rates or concurrencies to the knee."""
    environ = os.environ
    cfg = load_config(cfg_path, environ, need=o.url is None)
    b = bench_settings(cfg, o)
    endpoint = endpoint_of(cfg, o, environ)
    model = o.model or (cfg.service.model if cfg else "") or served_model(endpoint)
    bspec = cases.spec_from_config(b, endpoint, model, o.server_command, o.system)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    where = bench_gate.results_dir(cfg) if cfg else Path("bench-results")
    output = o.output or where / f"{stamp}-{model.replace('/', '_')}-load.json"
    unit = "req/s" if spec.mode == "rate" else "clients"
    out.err.print(
        f"bench load: {', '.join(f'{p:g}' for p in spec.points)} {unit}, {spec.duration_s:g}s "
        f"each, {spec.workload} prompts of {', '.join(c.id for c in bspec.cases)} at "
        f"{endpoint.shown_url} ({model}); results: {output}",
        markup=False,
    )
    bench = driver.Bench(bspec, None, out.reporter(), None, environ)
    release = _live_release(cfg) if o.url is None else ""

    def label(b: driver.Bench) -> None:
        b.result["run"]["release"] = release  # the live release the sweep measured

    with _maybe_lease(o.lease, f"servegate bench load {endpoint.shown_url}", cfg):
        result = load.run(bench, spec, output, out.reporter(), label)
    points = result["points"]
    code = 0
    if out.json_mode:
        shown = {**result, "points": [
            {k: v for k, v in p.items() if k != "requests_detail"} for p in points
        ]}  # fmt: skip
        return out.emit(shown, code)
    (head_load, rows_load), (head_lat, rows_lat) = loadreport.tables(points)
    out.table(f"LOAD — {spec.mode} sweep, {spec.workload} prompts", head_load, rows_load)
    out.table(
        "LATENCY — percentiles over each point's requests (ITL: their inter-chunk gaps)",
        head_lat,
        rows_lat,
    )
    k = result["knee"]
    if k:
        out.line(f"knee: {k['what']} — {k['why']}")
    else:
        out.line("knee: not reached — no point saturated the server (add heavier points)")
    for p in points:
        if p.get("prefix_hit_rate") is not None and spec.workload == "shared-prefix":
            ideal = p.get("prefix_hit_ideal")
            out.line(
                f"prefix-cache hit rate at {p['value']:g}: {p['prefix_hit_rate']:.0%} "
                f"(target {spec.prefix_share:.0%}"
                + (f"; a cache that forgot nothing: {ideal:.0%} over these requests, the "
                   "first of each length filling it" if ideal is not None else "")
                + ")"
            )  # fmt: skip
    tele = result["telemetry"]
    out.line(
        f"telemetry: {tele.get('source') or 'none'}"
        + (f" — {tele['why']}" if tele.get("why") else "")
    )
    out.line(f"result file: {output}")
    return code


def _live_release(cfg: Config | None) -> str:
    """The commit the configured host serves ("" : none recorded)."""
    if cfg is None or not cfg.host.root:
        return ""
    path = hostpaths.of(cfg).state
    if not path.exists():
        return ""
    from servegate.release.state import HostState

    try:
        current = HostState.load(path).current
    except ServegateError:
        return ""
    return current.sha if current else ""


def export(out: Output, path: Path, fmt: str, dest: str | None) -> int:
    """``servegate bench export``: a result file as PyTorch benchmark JSON lines or CSV."""
    from servegate.bench import export as export_mod

    doc = export_mod.read(path)
    if doc["kind"] == "servegate.load" and not doc["points"]:
        failed = f": {doc['error']}" if doc.get("error") else ""
        raise ResultFileError(
            f"{path} has no load point: the sweep measured nothing (status "
            f"{doc.get('status')!r}{failed})",
            hint="export a sweep that measured at least one point",
        )
    text = export_mod.pytorch(doc) if fmt == "pytorch" else export_mod.to_csv(doc)
    target = Path(dest) if dest else export_mod.default_path(path, fmt)
    if dest and (target.is_dir() or dest.endswith(("/", os.sep))):
        target = target / export_mod.default_path(path, fmt).name  # a folder: the file in it
    target.parent.mkdir(parents=True, exist_ok=True)
    write_text(target, text)
    lines = text.count("\n")
    if out.json_mode:
        return out.emit({"file": str(target), "format": fmt, "lines": lines})
    out.line(f"wrote {target} ({fmt}, {lines} line(s))")
    return 0


def add_arguments(b: argparse.ArgumentParser) -> None:
    """``servegate bench`` and its subcommands (compare, gate, noise, aa, load, export)."""
    common_args.bench_run(b)
    b.add_argument("--server-command", default="", help="the server's launch command (recorded)")
    b.add_argument("--system", default="", help="cards, OS, driver, engine version (recorded)")
    b.add_argument("--server-log", type=Path, help="the server's log file (scanned for JIT)")
    b.add_argument(
        "--probes", default="", help="also run: correctness,prefix_reuse,vision,spec_decode"
    )
    b.add_argument("--baseline", type=Path, help="judge this run against a result file")
    b.add_argument("--lenient", action="store_true", help="allow another harness's baseline")
    common_args.common(b)
    bsub = b.add_subparsers(
        dest="bench_command", required=False, metavar="[compare|gate|noise|aa|load|export]"
    )
    cmp_ = bsub.add_parser("compare", help="A/B: two result files, or two live servers (ABAB…)")
    cmp_.add_argument("files", nargs="*", type=Path, metavar="FILE", help="A.json B.json")
    cmp_.add_argument("--a-url", help="live server A")
    cmp_.add_argument("--b-url", help="live server B")
    cmp_.add_argument("--rounds", type=int, default=3, help="ABAB rounds per case (default 3)")
    cmp_.add_argument("--confidence", type=float, default=0.90, help="interval level (0.90)")
    cmp_.add_argument("--lenient", action="store_true", help="allow another harness's file")
    common_args.bench_run(cmp_)
    common_args.common(cmp_)
    gat = bsub.add_parser("gate", help="judge a candidate result file against a baseline file")
    gat.add_argument("baseline", type=Path)
    gat.add_argument("candidate", type=Path)
    gat.add_argument("--lenient", action="store_true", help="allow another harness's file")
    common_args.common(gat)
    noi = bsub.add_parser(
        "noise", help="measure the box's noise on the live release (restarts it) and plan the gate"
    )
    noi.add_argument("--restarts", type=int, default=2, help="service restarts (default 2)")
    noi.add_argument("--repetitions", type=int, default=5, help="groups a start (default 5)")
    common_args.common(noi)
    aa = bsub.add_parser(
        "aa",
        help="the live release against itself N times with the gate's own rule and design "
        "(restarts it): how often this box rolls back an unchanged release",
    )
    aa.add_argument("--runs", type=int, default=10, help="gates to run (default 10)")
    aa.add_argument("--out", type=Path, help="the result file (default: bench results dir)")
    common_args.common(aa)
    _load_arguments(bsub)
    exp = bsub.add_parser(
        "export", help="a result file (bench or load) as PyTorch benchmark JSON lines or CSV"
    )
    exp.add_argument("file", type=Path, metavar="FILE", help="a servegate result file")
    exp.add_argument("--format", choices=("pytorch", "csv"), default="pytorch")
    exp.add_argument(
        "--out",
        help="where to write: a file, or a folder (an existing one, or "
        "one given with a trailing /) to write FILE's name in (default: beside FILE)",
    )
    common_args.common(exp)


def _load_arguments(bsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    lo = bsub.add_parser(
        "load", help="a load sweep: open-loop rates or closed-loop concurrencies, to the knee"
    )
    how = lo.add_mutually_exclusive_group(required=True)
    how.add_argument("--rates", metavar="LIST", help="requests a second, e.g. 0.5,1,2,4")
    how.add_argument("--concurrencies", metavar="LIST", help="clients, e.g. 1,2,4,8")
    # a sweep of its own: the config's [load] (the load gate check's) does not apply
    flags.add(lo, config_mod.Load, None)
    lo.add_argument(
        "--no-stop", action="store_true", help="run every point, past the first saturated one"
    )
    common_args.bench_run(lo)
    common_args.common(lo)


def main(args: argparse.Namespace, out: Output) -> int:
    remote = _remote_bench(args.argv_seen, out)
    return remote if remote is not None else _local(args, out)


def _remote_bench(argv: Sequence[str], out: Output) -> int | None:
    """`servegate bench …` with a config of remote hosts: run there, as typed here."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--config", type=Path, default=Path("servegate.toml"))
    known, rest = parser.parse_known_args(list(argv))
    if not known.config.exists():
        return None
    cfg = config_mod.load(known.config, os.environ, build_only=True)
    if not cfg.remote_hosts:
        return None
    from servegate.commands import fleet

    after = rest[rest.index("bench") + 1 :] if "bench" in rest else rest
    return fleet.bench(cfg, out, [a for a in after if a != "--json"])


def _local(args: argparse.Namespace, out: Output) -> int:
    sub = getattr(args, "bench_command", None)
    if sub == "noise":
        from servegate.commands import noise

        return noise.run(args.config, out, args.restarts, args.repetitions)
    if sub == "aa":
        from servegate.commands import aa

        return aa.run(args.config, out, args.runs, args.out)
    if sub == "gate":
        return gate_files(args.config, out, args.baseline, args.candidate, args.lenient)
    if sub == "export":
        return export(out, args.file, args.format, args.out or None)
    opts = Options(
        url=args.url,
        model=args.model,
        api_key_env=args.api_key_env,
        bench=flags.overrides(config_mod.Bench, args),
        output=args.output,
        server_command=getattr(args, "server_command", ""),
        system=getattr(args, "system", ""),
        server_log=getattr(args, "server_log", None),
        probes=getattr(args, "probes", ""),
        baseline=getattr(args, "baseline", None),
        lenient=args.lenient,
        lease=not args.no_lease,
        engine=args.engine,
    )
    if sub == "load":
        given = [f"--{k}" for k in ("repetitions", "concurrency") if k in opts.bench]
        if given:
            raise ConfigError(
                f"bench load takes no {' or '.join(given)}: those shape the single-stream "
                "bench's groups; a load sweep sends its own load",
                hint="--concurrencies 1,2,4 for closed-loop clients, --rates for arrivals, "
                "--duration for how long a point runs",
            )
        return load_sweep(args.config, out, opts, _load_spec(args))
    if sub == "compare":
        if args.a_url and args.b_url:
            return compare_live(
                args.config, out, opts, args.a_url, args.b_url, args.rounds, args.confidence
            )
        if len(args.files) != 2:
            raise ConfigError(
                "bench compare needs two result files, or --a-url and --b-url",
                hint="servegate bench compare A.json B.json",
            )
        return compare_files(out, args.files[0], args.files[1], args.lenient, args.confidence)
    return run(args.config, out, opts)


def _load_spec(args: argparse.Namespace) -> loadspec.LoadSpec:
    rates = args.rates is not None
    text = args.rates if rates else args.concurrencies
    try:
        points = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ConfigError(
            f"{'--rates' if rates else '--concurrencies'} {text!r}: give numbers",
            hint="e.g. --rates 0.5,1,2,4",
        ) from None
    settings = config_mod.Load(
        rates=points if rates else (),
        # whole numbers or not, LoadSpec.check says so below with the option's name
        concurrencies=() if rates else points,  # type: ignore[arg-type]
        **flags.overrides(config_mod.Load, args),
    )
    spec = loadspec.spec_from(settings, stop_at_saturation=not args.no_stop)
    spec.check()
    return spec
