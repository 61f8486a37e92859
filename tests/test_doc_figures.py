"""Figures the README and docs cite are the figures of the committed files they name:
each entry below reads the file and says the text the document must hold. A figure that
drifts from its file (or a file edited without its sentence) fails here."""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Callable, Iterable
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
X, ND = "\u00d7", "\u2013"  # the docs' times sign and en dash
AP = "A'"  # the identical release of the GPU gate-power runs
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def _load(rel: str) -> Any:
    return json.loads((ROOT / rel).read_text())


def _cell(name: str) -> dict[str, Any]:
    cells = _load("benchmarks/sim/gate-sim-400.json")["cells"]
    (found,) = [c for c in cells if c["name"] == name]
    return dict(found)


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _rows(doc: Any) -> list[dict[str, Any]]:
    """Every gate row anywhere in a document."""
    if isinstance(doc, dict):
        here = [doc] if {"metric", "ratio", "verdict"} <= set(doc) else []
        return here + [r for v in doc.values() for r in _rows(v)]
    if isinstance(doc, list):
        return [r for v in doc for r in _rows(v)]
    return []


def _demo_slow_ratio() -> str:
    doc = _load("benchmarks/h200/demo-transformers.json")
    (row,) = {json.dumps(r, sort_keys=True): r for r in _rows(doc)
              if r["metric"] == "prefill_tps" and r["verdict"] == "FAIL"}.values()  # fmt: skip
    return f"prefill {row['ratio']:.3f}\u00d7 the live release's"


def _gpu_power() -> str:
    s = _load("benchmarks/h100/gate-power-fresh.json")["summary"]
    return (f"the identical release was rolled back {s['identical_false_alarms']} of "
            f"{s['identical_gates']}")  # fmt: skip


def _gpu_slow() -> str:
    s = _load("benchmarks/h100/gate-power-fresh.json")["summary"]
    return f"FAILed {s['slow_caught']} of {s['slow_gates']} times"


def _gpu_fresh() -> dict[str, Any]:
    doc = _load("benchmarks/h100/gate-power-fresh.json")
    rounds = [v for c in doc["calls"] for k, v in c["seconds"].items() if k.startswith("round_")]
    passes = [g for g in doc["gates"] if g["release"] == "A'" and g["verdict"] == "PASS"]
    lows = [r["interval"][0] for g in passes for r in g["rows"] if r["metric"] == "prefill_tps"]
    slow = [r["ratio"] for g in doc["gates"] if g["release"] == "B" for r in g["rows"]
            if r["metric"] == "prefill_tps"]  # fmt: skip
    return {"calls": len(doc["calls"]), "rounds": f"{min(rounds):.0f}-{max(rounds):.0f} s",
            "passes": len(passes), "lows": f"{min(lows):.3f}-{max(lows):.3f}",
            "slow": f"{min(slow):.2f}-{max(slow):.2f}\u00d7", "left": 10 - len(passes) - 1}  # fmt: skip


def _gpu_fresh_text() -> str:
    f = _gpu_fresh()
    return (f"{f['calls'] - 1} calls of one round each after the setup, `--resume`): the "
            f"identical release was rolled back 1 of {f['passes'] + 1} times (INCONCLUSIVE, "
            f"[0.925, 1.019]); its {f['passes']} PASSes each excluded the 5 % loss (prefill "
            f"lower bounds {f['lows']}). The slower release (prefill {f['slow']}) was")  # fmt: skip


def _cpu_aa() -> str:
    aa = _load("benchmarks/cpu/demo-aa-busy-3.json")["aa"]["summary"]
    return f"{aa['verdicts']['PASS']} of {aa['runs']} A/A gates PASSed"


def _r(x: float, places: int = 0, scale: str = "1") -> str:
    """``x`` times ``scale``, rounded half up as the file's decimal reads (0.8795 -> 0.880)."""
    q = Decimal(1).scaleb(-places)
    return str((Decimal(repr(x)) * Decimal(scale)).quantize(q, rounding=ROUND_HALF_UP))


def _span(xs: Iterable[float], places: int = 0, scale: str = "1", sep: str = "-") -> str:
    """``lo-hi`` of the values as ``_r`` writes them, one figure where both agree."""
    vals = list(xs)
    lo, hi = _r(min(vals), places, scale), _r(max(vals), places, scale)
    return lo if lo == hi else f"{lo}{sep}{hi}"


def _sp(x: float) -> str:
    return "0" if x == 0 else "100" if x == 1 else f"{100 * x:.1f}"


def _sim_span(cells: Iterable[str], key: str = "rolled_back") -> str:
    vals = [_cell(c)[key] for c in cells]
    lo, hi = _sp(min(vals)), _sp(max(vals))
    return lo if lo == hi else f"{lo}-{hi}"


def _sim_row(label: str, cvs: tuple[str, ...], offsets: tuple[str, ...]) -> str:
    grid = [f"cv {c}% offset {o}% noise" for c in cvs for o in offsets]
    cols = [_sim_span(f"{kind} {g} {noise}" for g in grid) + " %"
            for kind in ("unchanged", "5% loss on one row") for noise in ("known", "measured")]  # fmt: skip
    return f"| {label} | {cols[0]} / {cols[1]} | {cols[2]} / {cols[3]} |"


def _sim_known() -> list[dict[str, Any]]:
    """The first table's cells, the noise known and measured (4 rows, CV <= 2 %, offset
    <= 1 %)."""
    cells = _load("benchmarks/sim/gate-sim-400.json")["cells"]
    return [
        c for c in cells
        if re.fullmatch(r"(unchanged|5% loss on one row) cv .* (known|measured)", c["name"])
    ]  # fmt: skip


def _sim_prose() -> str:
    known = _sim_known()
    worst = max(c["rolled_back"] for c in known if c["name"].startswith("unchanged"))
    caught = min(c["rolled_back"] for c in known if c["name"].startswith("5%"))
    return (f"an unchanged release is rolled back at most {_pct(worst)} and a tolerance-sized "
            f"loss on one row is caught {100 * caught:.0f} % or more")  # fmt: skip


def _sim_lowest_cell() -> str:
    """The lowest known-noise cell of the first table, read again at 2,000 gates."""
    cells = _load("benchmarks/sim/gate-sim-cv2off1-2000.json")["cells"]
    assert all(c["gates"] == 2000 for c in cells), cells
    known, measured = (c["rolled_back"] for c in sorted(cells, key=lambda c: c["noise"] != "known"))
    return f"caught {_pct(known)} / {_pct(measured)}"


def _suite_time() -> str:
    serial = _load("benchmarks/suite/ci-serial-c7b9e90.json")
    parallel = _load("benchmarks/suite/ci-parallel-c64b898.json")
    assert (serial["processes"], parallel["processes"]) == (1, 2)
    assert not serial["busy"]
    assert not parallel["busy"]
    return (f"took {parallel['wall_seconds']:.0f} s in two processes\n"
            f"(`benchmarks/suite/ci-parallel-c64b898.json`) against {serial['wall_seconds']:.0f} s "
            "in one")  # fmt: skip


def _suite_busy() -> str:
    busy = _load("benchmarks/suite/ci-parallel-busy-185c731.json")
    assert busy["busy"]
    assert busy["processes"] == 2
    return (
        f"{busy['wall_seconds']:.0f} s\nin two processes beside a busy core "
        "(`benchmarks/suite/ci-parallel-busy-185c731.json`)"
    )


def _suite_now() -> str:
    busy = _load("benchmarks/suite/ci-parallel-busy-d72f13c.json")
    three = _load("benchmarks/suite/ci-parallel3-f62fdd9.json")
    assert (busy["busy"], busy["processes"], busy["failed"]) == (True, 2, [])
    assert (three["busy"], three["processes"], len(three["failed"])) == (False, 3, 2)
    return (f"it took {busy['wall_seconds']:.0f} s beside a busy core, all passing\n"
            "(`benchmarks/suite/ci-parallel-busy-d72f13c.json`); three processes took "
            f"{three['wall_seconds']:.0f} s on a\nquiet box")  # fmt: skip


def _suite_cut() -> str:
    before = _load("benchmarks/suite/ci-parallel-busy-d310c47.json")
    after = _load("benchmarks/suite/ci-parallel-busy-e208f73.json")
    assert (before["busy"], before["processes"], len(before["failed"])) == (True, 2, 1)
    assert (after["busy"], after["processes"], after["failed"]) == (True, 2, [])
    return (f"At d310c47 it took {before['wall_seconds']:.0f} s beside a busy core "
            "(`benchmarks/suite/ci-parallel-busy-d310c47.json`, one stream-fault test failed "
            f"there and was mended); at e208f73 it took {after['wall_seconds']:.0f} s, all "
            "passing (`benchmarks/suite/ci-parallel-busy-e208f73.json`)")  # fmt: skip


def _busy_run(commit: str, failed: int) -> dict[str, Any]:
    """A suite run beside a busy core in two processes, with ``failed`` tests failed."""
    run: dict[str, Any] = _load(f"benchmarks/suite/ci-parallel-busy-{commit}.json")
    assert (run["busy"], run["processes"], len(run["failed"])) == (True, 2, failed)
    return run


def _suite_cpu_of(run: dict[str, Any]) -> float:
    """The CPU-seconds of the suite's processes: the box's less the busy loop's."""
    return float(run["box_cpu_seconds"] - run["busy_loop_cpu_seconds"])


def _demo_seconds(run: dict[str, Any]) -> float:
    (t,) = [t for t in run["slowest"] if t["test"].startswith("tests/test_demo_vllm.py")]
    return float(t["seconds"])


def _suite_ran(commit: str, run: dict[str, Any]) -> str:
    return (f"it took {run['wall_seconds']:.0f} s "
            f"(`benchmarks/suite/ci-parallel-busy-{commit}.json`, the suite's processes "
            f"{_suite_cpu_of(run):.0f} CPU-seconds")  # fmt: skip


def _suite_cpu() -> str:
    return f"used {_suite_cpu_of(_busy_run('e208f73', 0)):.0f} CPU-seconds"


def _suite_latest() -> str:
    run = _busy_run("ee38e5b", 2)
    return (f"At ee38e5b {_suite_ran('ee38e5b', run)}; two timing tests failed there on the "
            f"busy box and were given room): the vLLM demo took {_demo_seconds(run):.0f} s")  # fmt: skip


def _suite_f2314b8() -> str:
    return f"At f2314b8 {_suite_ran('f2314b8', _busy_run('f2314b8', 1))}; one stream-fault test failed there"


def _suite_de71dea() -> str:
    run, before = _busy_run("de71dea", 0), _busy_run("f2314b8", 1)
    return (f"At de71dea, all passing, {_suite_ran('de71dea', run)}): the same tests took about "
            f"10 % more CPU-seconds each than in the run before (the vLLM demo "
            f"{_demo_seconds(run):.0f} s against {_demo_seconds(before):.0f} s)")  # fmt: skip


def _sim_readme() -> str:
    known = _sim_known()
    unchanged = [c["rolled_back"] for c in known if c["name"].startswith("unchanged")]
    caught = min(c["rolled_back"] for c in known if c["name"].startswith("5%"))
    sim = _load("benchmarks/sim/gate-sim-400.json")
    bursts = _cell("unchanged, 1 trial in 10 at a third of the rate noise known")["rolled_back"]
    return (f"(400 gates a cell, {sim['seconds']} s): at CV ≤ 2 % and offset ≤ 1 % an unchanged "
            f"release is rolled back {_sp(min(unchanged))}-{_sp(max(unchanged))} % and a 5 % loss "
            f"on one row caught ≥ {100 * caught:.0f} %, the noise known or measured; bursts of one "
            f"trial in ten roll back {_pct(bursts)}")  # fmt: skip


def _sim_plan() -> str:
    c = _cell("unchanged cv 2.0% offset 1.0% noise measured")
    assert round(c["mean_repetitions"]) == round(c["mean_starts"]), c  # one a start
    return (f"{c['mean_repetitions']:.0f} a side, one a service start, is what the plan needs "
            "at CV 2 % with a 1 % restart offset")  # fmt: skip


def _aa(n: int) -> dict[str, Any]:
    return dict(_load(f"benchmarks/cpu/demo-aa-busy-{n}.json"))


def _promote(n: int, step: str) -> dict[str, Any]:
    (found,) = [p for p in _aa(n)["demo"]["promotes"] if p["step"] == step]
    return dict(found)


def _row(rows: list[dict[str, Any]], metric: str) -> dict[str, Any]:
    (found,) = [r for r in rows if r["metric"] in (metric, f"engine_{metric}")]
    return dict(found)


def _ratio_iv(row: dict[str, Any], places: int) -> str:
    lo, hi = row["interval"]
    return f"{_r(row['ratio'], places + 1)}{X} [{_r(lo, places)}, {_r(hi, places)}]"


def _demo_run() -> str:
    d = _aa(3)
    starts = [r["switch"]["startup_seconds"] for r in d["aa"]["runs"]]
    return (f"It took {_r(d['demo']['seconds'])} s on 2 CPUs with one core kept busy (each vLLM "
            f"start there took {_span(starts, sep=ND)} s;")  # fmt: skip


def _aa3() -> str:
    d = _aa(3)
    s = d["aa"]["summary"]
    lo, hi = s["interval_95"]
    good = _row(_promote(3, "good #2")["bench"]["rows"], "prefill_tps")
    return (f"{_r(d['demo']['seconds'])} s for the demo's four promotes and {_r(d['aa']['seconds'])} "
            f"s for the A/A): {s['verdicts']['PASS']} of {s['runs']} A/A gates PASSed "
            f"({s['rolled_back']} rolled back; 95 % interval {_r(lo, 0, '100')}-{_r(hi, 0, '100')} "
            f"%), the demo's identical second release PASSed (prefill {_ratio_iv(good, 2)})")  # fmt: skip


def _aa3_bad() -> str:
    bad, slow = _promote(3, "bad"), _promote(3, "slow")
    pre = _row(slow["bench"]["rows"], "prefill_tps")["ratio"]
    return (f"the bad release was rolled back at provenance (exit {bad['exit_code']}) and the "
            f"slower one FAILed (prefill {_r(pre, 2)}{X}, exit {slow['exit_code']})")  # fmt: skip


def _aa1() -> str:
    s = _aa(1)["aa"]["summary"]
    fails = [
        _row(r["rows"], "generation_tps") for r in _aa(1)["aa"]["runs"] if r["verdict"] == "FAIL"
    ]
    lo, hi = s["interval_95"]
    return (f"{s['runs']} A/A gates rolled back {s['rolled_back']} times (two FAILs, decode "
            f"{_r(fails[0]['ratio'], 2)}{X} and {_r(fails[1]['ratio'], 2)}{X}; 95 % interval "
            f"{_r(lo, 0, '100')}{ND}{_r(hi, 0, '100')} %")  # fmt: skip


def _aa2() -> str:
    s = _aa(2)["aa"]["summary"]
    (verdict,) = [r["verdict"] for r in _aa(2)["aa"]["runs"] if r["verdict"] != "PASS"]
    rows = _promote(2, "good #2")["bench"]["rows"]
    return (f"and {s['rolled_back']} time ({verdict}; `demo-aa-busy-2.json`), and in the second "
            f"run the demo's identical second release was FAILed (prefill {_r(_row(rows, 'prefill_tps')['ratio'], 2)}{X}, decode "
            f"{_r(_row(rows, 'generation_tps')['ratio'], 2)}{X})")  # fmt: skip


def _aa1_promotes() -> str:
    starts = [r["switch"]["startup_seconds"] for r in _aa(1)["aa"]["runs"]]
    return (f"took {_r(_promote(1, 'good #2')['seconds'])} s where the first, with nothing to "
            f"compare, took {_r(_promote(1, 'good #1')['seconds'])} s; each service start there "
            f"took {_span(starts, sep=ND)} s")  # fmt: skip


def _aa_readme() -> str:
    a, b = (_aa(n)["aa"]["summary"] for n in (1, 2))
    return f"{a['rolled_back']} and {b['rolled_back']} of {a['runs']} rolled back"


def _fid(tier: str, key: str, lo: int = 1, hi: int = 1) -> str:
    s = _load("benchmarks/cpu/bench-fidelity.json")["summary"]["tiers"][tier][key]
    return f"{_r(s['min'], lo)}-{_r(s['max'], hi)}"


def _fid_trials(tier: str, key: str) -> list[float]:
    trials = _load("benchmarks/cpu/bench-fidelity.json")["trials"]
    return [t[key] for t in trials if t["case"].endswith(f"-{tier}")]


def _fid_row(label: str, key: str, inside: str, places: int = 1, hi8k: int = 1) -> str:
    return (f"| {label} | {_fid('2k', key, places, places)} ms | {_fid('8k', key, places, hi8k)} "
            f"ms | {inside} |")  # fmt: skip


def _fid_header() -> str:
    ttft = [_r(statistics.median(_fid_trials(t, "ttft_s")), n) for t, n in (("2k", 2), ("8k", 1))]
    return f"| from the request sent | 2k (TTFT {ttft[0]} s) | 8k (TTFT {ttft[1]} s) |"


def _fid_arrival() -> str:
    tiers = _load("benchmarks/cpu/bench-fidelity.json")["summary"]["tiers"]
    plus = [_r(tiers[t]["to_arrival_ms"]["median"] - tiers[t]["to_handler_ms"]["median"], 1)
            for t in ("2k", "8k")]  # fmt: skip
    return f"| to vLLM's arrival stamp | +{plus[0]} ms | +{plus[1]} ms | no |"


def _front(tier: str) -> str:
    return _span(_fid_trials(tier, "frontend_ttft_s"), 1, "1000")


def _front_pct(tier: str, places: int) -> str:
    """The frontend's share of vLLM's TTFT, from the trials (the summary rounds it first)."""
    shares = [f / e for f, e in zip(_fid_trials(tier, "frontend_ttft_s"),
                                    _fid_trials(tier, "engine_ttft_s"), strict=True)]  # fmt: skip
    return _span(shares, places, "100")


def _fid_within() -> tuple[str, str]:
    """The client's TTFT error less the stamped frontend, and its ITL's, at worst (%)."""
    tiers = _load("benchmarks/cpu/bench-fidelity.json")["summary"]["tiers"].values()
    err = max(t["client_error_pct"]["max"] for t in tiers)
    itl = max(max(abs(t["itl_vs_engine_pct"]["min"]), t["itl_vs_engine_pct"]["max"]) for t in tiers)
    return f"{_r(err, 2)} %", f"{_r(itl, 2)} %"


def _fid_prose() -> str:
    err, itl = _fid_within()
    return (f"So the client's TTFT is vLLM's plus {_front('2k')} ms at 2k and {_front('8k')} ms "
            f"at 8k (`frontend_ttft_s`: +{_front_pct('2k', 1)} % and "
            f"+{_front_pct('8k', 2)} %), of which the frontend's stamped work "
            f"outside vLLM's clock is {_fid('2k', 'server_outside_engine_ms')} ms and "
            f"{_fid('8k', 'server_outside_engine_ms')} ms; less that, the client's TTFT is within "
            f"{err} of vLLM's (inter-token latency within {itl})")  # fmt: skip


def _fid_readme() -> str:
    err, itl = _fid_within()
    return (f"the client's TTFT is vLLM's +{_front_pct('2k', 1)} % at 2k and "
            f"+{_front_pct('8k', 2)} % at 8k ({_front('2k')} and {_front('8k')} "
            f"ms of frontend, `frontend_ttft_s`), within {err} of it less the frontend's stamped "
            f"share; ITL within {itl}")  # fmt: skip


def _hog_late() -> list[dict[str, Any]]:
    trials = _load("benchmarks/cpu/bench-fidelity-hog.json")["trials"]
    return [t for t in trials if t["client_timing"].startswith("client wait")]


def _hog() -> str:
    late = _hog_late()
    n = len(_load("benchmarks/cpu/bench-fidelity-hog.json")["trials"])
    return f"{len(late)} of {n} first texts were read {_hog_span()} s late"


def _hog_span() -> str:
    late = [t["delivery_s"] for t in _hog_late()]
    return f"{_r(min(late), 2)}-{_r(max(late), 1)}"


def _hog_wait() -> str:
    gaps = sorted(abs(t["client_wait_s"] - t["delivery_s"]) for t in _hog_late())
    return (f"within {_r(gaps[-2], 1, '1000')} ms of the stamped delay but one, an upper bound "
            f"by {_r(gaps[-1], 0, '1000')} ms")  # fmt: skip


def _before() -> tuple[str, str, str]:
    """The trial the run before kept latest: its case's tier, ms late and raw %."""
    text = (ROOT / "benchmarks/cpu/bench-fidelity-before.txt").read_text()
    rows = re.findall(r"^\S+-(\d+k)\s+([\d.]+)\s+[\d.]+\s+([\d.]+)\s+\+([\d.]+)", text, re.M)
    tier, ttft, vllm, raw = max(rows, key=lambda r: float(r[3]))
    return tier, _r(float(Decimal(ttft) - Decimal(vllm)), 0, "1000"), _r(float(raw))


def _perf(path: str, tier: str = "") -> list[dict[str, Any]]:
    rows = _load(path)["performance_table"]
    return [r for r in rows if r["ttft_s"] is not None and r["tier"].endswith(tier)]


def _groups(path: str) -> list[dict[str, Any]]:
    return [g for c in _load(path)["cases"] for g in c["groups"]]


def _tel(path: str, field: str, stat: str) -> list[float]:
    return [gpu[field][stat] for g in _groups(path) for gpu in g["telemetry"]["gpus"].values()]


def _trials(path: str) -> list[dict[str, Any]]:
    return [t for g in _groups(path) for t in g["trials"]]


def _valid(path: str) -> str:
    trials = _trials(path)
    return f"{sum(t['performance_valid'] for t in trials)} of {len(trials)}"


def _tiers_prompts(tokens: dict[str, float]) -> str:
    f = [
        f"{int(tokens[c]):,}" for c in ("regular-16k", "coding-16k", "regular-128k", "coding-128k")
    ]
    return f"{f[0]} / {f[1]} and {f[2]} / {f[3]} tokens"


def _h200_tiers() -> str:
    path = "benchmarks/h200/transformers-serve-16k-128k.json"
    sized = {k: v["tokens"] for k, v in _load(path)["sizing"].items()}
    perf = _perf(path)
    return (f"prompts of {_tiers_prompts(sized)} sized with the model's own tokenizer files (the "
            f"server's usage agreed within {_h200_usage()} tokens); TTFT "
            f"{_span((r['ttft_s'] for r in _perf(path, '16k')), 2)} s at 16k and "
            f"{_span((r['ttft_s'] for r in _perf(path, '128k')), 2)} s at 128k, prefill "
            f"{_span((r['prefill_tps'] for r in perf), 0, '0.001', 'k-')}k tok/s, decode "
            f"{_span(r['generation_tps'] for r in perf)} tok/s")  # fmt: skip


def _h200_usage() -> int:
    path = "benchmarks/h200/transformers-serve-16k-128k.json"
    sized = _load(path)["sizing"]
    return max(int(abs(t["prompt_tokens"] - sized[c["id"]]["tokens"]))
               for c in _load(path)["cases"] for g in c["groups"] for t in g["trials"])  # fmt: skip


def _mhz(path: str, field: str) -> str:
    lo, hi = min(_tel(path, field, "min")), max(_tel(path, field, "max"))
    return f"{int(lo):,}" if lo == hi else f"{int(lo):,}-{int(hi):,}"


def _h200_tel() -> str:
    p = "benchmarks/h200/transformers-serve-16k-128k.json"
    return (f"SM clock {_mhz(p, 'sm_clock_mhz')} MHz, memory clock {_mhz(p, 'mem_clock_mhz')} MHz, "
            f"{_r(min(_tel(p, 'power_w', 'min')))}-{_r(max(_tel(p, 'power_w', 'max')))} W, "
            f"{_r(min(_tel(p, 'temperature_c', 'min')))}-{_r(max(_tel(p, 'temperature_c', 'max')))} "
            f"°C, GPU utilisation {_span(_tel(p, 'utilization_pct', 'mean'))} % on average "
            f"({_r(max(_tel(p, 'utilization_pct', 'max')))} % only during a 128k prefill)")  # fmt: skip


def _h200_invalid() -> str:
    path = "benchmarks/h200/transformers-serve-16k-128k.json"
    rules = _load(path)["run"]["rules"]
    trials = _trials(path)
    valid = sum(t["performance_valid"] for t in trials)
    (dom,) = {t["content"]["dominant_token"] for t in trials
              if "dominant_repeated_token" in t["invalid_reasons"]}  # fmt: skip
    (short,) = [t for t in trials if "too_few_text_tokens" in t["invalid_reasons"]]
    return (f"{WORDS[valid].capitalize()} of {WORDS[len(trials)]} trials were valid: the random "
            f"model's code text repeats `{dom}` past the {_r(rules['max_dominant_ratio'], 0, '100')} "
            f"% dominance rule, and one 128k answer made {short['content']['text_tokens']} words "
            f"of the {rules['min_text_tokens']} required")  # fmt: skip


def _h100_tiers() -> str:
    p = "benchmarks/h100/transformers-serve-16k-128k.json"
    perf = {r["case"]: r for r in _perf(p)}
    ttft = {c: _r(r["ttft_s"], 2) for c, r in perf.items()}
    return (f"{_valid(p)} trials valid. Prompts of "
            f"{_tiers_prompts({c: r['prompt_tokens'] for c, r in perf.items()})}; TTFT "
            f"{ttft['regular-16k']} / {ttft['coding-16k']} s at 16k and {ttft['regular-128k']} / "
            f"{ttft['coding-128k']} s at 128k (prose / code), prefill "
            f"{_span((r['prefill_tps'] for r in perf.values()), 0, '0.001', 'k-')}k tok/s, decode "
            f"{_span(r['generation_tps'] for r in perf.values())} tok/s")  # fmt: skip


def _h100_tel() -> str:
    p = "benchmarks/h100/transformers-serve-16k-128k.json"
    return (f"SM clock {_mhz(p, 'sm_clock_mhz')} MHz, memory clock {_mhz(p, 'mem_clock_mhz')} MHz, "
            f"{_r(min(_tel(p, 'power_w', 'min')))}-{_r(max(_tel(p, 'power_w', 'max')))} W, "
            f"{_r(min(_tel(p, 'temperature_c', 'min')))}-{_r(max(_tel(p, 'temperature_c', 'max')))} "
            f"°C, {_r(max(_tel(p, 'memory_used_mib', 'max')), 1, '0.001')} GB used, utilisation "
            f"up to {_r(max(_tel(p, 'utilization_pct', 'max')))} %")  # fmt: skip


def _noise_cfgs(*names: str) -> list[dict[str, Any]]:
    return [c for c in _load("benchmarks/h200/server-noise.json")["configs"] if c["name"] in names]


def _noise_row(label: str, model: str, names: tuple[str, ...], cv_places: int = 0) -> str:
    cfgs = _noise_cfgs(*names)
    cv = [_span((c[f"regular-16k:{m}"]["cv"] for c in cfgs), cv_places, "100")
          for m in ("prefill_tps", "generation_tps")]  # fmt: skip
    ttft = _span((c["regular-16k:ttft_s"]["median"] for c in cfgs), 2)
    return f"| {label} | {model} | {ttft} s | {cv[0]} % | {cv[1]} % |"


def _noise_readme() -> str:
    cfgs = _load("benchmarks/h200/server-noise.json")["configs"]
    keys = ("ttft_s", "prefill_tps", "generation_tps")
    eager = [c[f"regular-16k:{k}"]["cv"] for c in cfgs for k in keys
             if "--cb-use-cuda-graph" not in c["flags"]]  # fmt: skip
    (graph,) = _noise_cfgs("large-cb-graph")
    return (f"{_span(eager, 0, '100')} % without CUDA graphs, "
            f"{_r(graph['regular-16k:prefill_tps']['cv'], 1, '100')} % / "
            f"{_r(graph['regular-16k:generation_tps']['cv'], 1, '100')} % with")  # fmt: skip


def _graph_2b() -> str:
    (graph,) = _noise_cfgs("large-cb-graph")
    return (f"(TTFT {_r(graph['regular-16k:ttft_s']['median'], 2)} s, CV "
            f"{_r(graph['regular-16k:prefill_tps']['cv'], 1, '100')} %)")  # fmt: skip


def _setup() -> list[dict[str, Any]]:
    return list(_load("benchmarks/h200/gate-power-setup.json")["runs"])


def _setup_apart() -> str:
    first = _setup()[0]
    held = re.search(r"held (\d+ GiB)", first["ended"])
    assert held is not None
    apart = max(c["prefill_tps"] for c in first["candidates_B_over_A"].values())
    return (f"held {held[1]}; the third ran out of memory), so \"identical\" servers measured up to "
            f"{_r(apart, 2)}{X} apart")  # fmt: skip


def _setup_plan() -> str:
    run = _setup()[1]
    pre, dec = (run["noise"][f"regular-16k:{m}"] for m in ("prefill_tps", "generation_tps"))
    plan = run["plan"][0]
    return (f"prefill CV {_r(pre['cv'], 1, '100')} %, restart offset {_r(pre['offset'], 1, '100')} "
            f"% → the plan resolves {_r(plan['tolerance'], 0, '100')} % with {plan['repetitions']} "
            f"repetitions over {plan['starts']} starts; decode CV {_r(dec['cv'], 1, '100')} %, "
            f"offset {_r(dec['offset'], 1, '100')} % → about "
            f"{_r(run['plan'][1]['resolves'], 0, '100')} % within the cap")  # fmt: skip


def _setup_candidates() -> str:
    c = _setup()[1]["candidates_B_over_A"]
    faster = c["--cb-max-batch-tokens 2048"]["prefill_tps"] - 1
    return (f"costs nothing with CUDA graphs ({_r(c['CUDA_LAUNCH_BLOCKING=1']['prefill_tps'], 4)}"
            f"{X} prefill), and `--cb-max-batch-tokens 2048` prefills {_r(faster, 0, '100')} % "
            "*faster* than 8192")  # fmt: skip


def _gp(name: str) -> dict[str, Any]:
    return dict(_load(f"benchmarks/h200/gate-power-{name}.json"))


def _gp_rows(name: str, release: str, metric: str, verdict: str = "") -> list[dict[str, Any]]:
    return [_row(g["rows"], metric) for g in _gp(name)["gates"]
            if g["release"] == release and g["verdict"].startswith(verdict)]  # fmt: skip


def _gp_noise(name: str, metric: str, key: str = "offset") -> str:
    n = _gp(name)["noise"][f"regular-16k:{metric}"]
    return f"CV {_r(n['cv'], 1, '100')} %, offset {_r(n[key], 1, '100')} %"


def _gp_rounds(name: str) -> list[float]:
    """Each round's seconds: a call's timings are cumulative from its start."""
    out = []
    for call in _gp(name)["calls"]:
        marks = list(call["seconds"].items())
        out += [t - marks[i - 1][1] for i, (k, t) in enumerate(marks) if k.startswith("round_")]
    return out


def _gp_timing(name: str) -> str:
    up = [c["seconds"]["servers_up"] for c in _gp(name)["calls"]]
    return f"{_span(_gp_rounds(name))} s; the three servers are up in {_span(up)} s"


def _gp_sd(name: str) -> float:
    return statistics.stdev(math.log(r["ratio"]) for r in _gp_rows(name, "A'", "prefill_tps"))


def _quiet_summary() -> str:
    s = _gp("quiet")["summary"]
    return (f"{s['slow_caught']} of {s['slow_gates']} slower releases caught, "
            f"{s['identical_false_alarms']} of {s['identical_gates']} identical releases rolled back")  # fmt: skip


def _per_call(name: str, resumed: bool = False) -> str:
    rounds = [c["rounds"] for c in _gp(name)["calls"] if c["resumed"] or not resumed]
    return f"{WORDS[min(rounds)]} or {WORDS[max(rounds)]} rounds a call"


def _quiet_calls() -> str:
    resumed = sum(c["resumed"] for c in _gp("quiet")["calls"])
    return f"{WORDS[resumed]} times ({_per_call('quiet', resumed=True)})"


def _quiet_noise() -> str:
    d = _gp("quiet")
    n = d["noise"]["regular-16k:prefill_tps"]
    (reps,) = {g["repetitions"]["regular-16k"] for g in d["gates"]}
    (starts,) = {g["starts"] for g in d["gates"]}
    return (f"the noise over {n['starts']} starts of {n['samples'] // n['starts']} trials: prefill "
            f"CV {_r(n['cv'], 1, '100')} %, restart offset {_r(n['offset'], 1, '100')} % (the point "
            f"estimate: see below); decode {_gp_noise('quiet', 'generation_tps')}. At that CV the "
            f"plan resolves {_r(d['plan'][0]['resolves'], 1, '100')} % of prefill at the cap, not "
            f"5 %, so every gate ran to the cap: {reps} repetitions a side over {starts} service "
            f"starts. Decode (15 % rule) needed {d['plan'][1]['repetitions']}")  # fmt: skip


def _margin(name: str) -> tuple[str, str]:
    m = _gp(name)["slow_margin"]
    return _r(m["regular-16k:prefill_tps"], 3), _r(m["regular-16k:generation_tps"], 3)


def _quiet_b() -> str:
    pre = _gp_rows("quiet", "B", "prefill_tps", "FAIL")
    dec = _gp_rows("quiet", "B", "generation_tps")
    return (f"B ({len(_gp_rows('quiet', 'B', 'prefill_tps'))} gates): FAIL each time on prefill, "
            f"ratio {_span((r['ratio'] for r in pre), 3)}, upper bound at most "
            f"{_r(max(r['interval'][1] for r in pre), 3)} (below 1: a decisive loss); decode "
            f"{_span((r['ratio'] for r in dec), 2)}, PASS")  # fmt: skip


def _quiet_a() -> str:
    passed = _gp_rows("quiet", "A'", "prefill_tps", "PASS")
    return (f"A' ({len(_gp_rows('quiet', AP, 'prefill_tps'))} gates): "
            f"PASS {len(passed)} times, prefill {_span((r['ratio'] for r in passed), 3)}")  # fmt: skip


def _quiet_alarm() -> str:
    (g,) = [g for g in _gp("quiet")["gates"] if g["release"] == "A'" and g["verdict"] == "FAIL"]
    dec = _gp_rows("quiet", "A'", "generation_tps")
    row = _row(g["rows"], "prefill_tps")
    return (f"decode {_span((r['ratio'] for r in dec), 2)}. **Round {g['round']} FAILed**: prefill "
            f"{_r(row['ratio'], 3)}, interval [{_r(row['interval'][0], 3)}, "
            f"{_r(row['interval'][1], 3)}]")  # fmt: skip


def _quiet_sd() -> str:
    d = _gp("quiet")
    (reps,) = {g["repetitions"]["regular-16k"] for g in d["gates"]}
    cv = d["noise"]["regular-16k:prefill_tps"]["cv"]
    alone = cv * math.sqrt(1 / 5 + 1 / reps)  # a round's fresh baseline is 5 trials
    return (f"ratio varied with a log SD of {_r(_gp_sd('quiet'), 1, '100')} %, twice the "
            f"{_r(alone, 1, '100')} % that the within-start CV alone gives for 5 + {reps} trials")  # fmt: skip


def _bound_noise() -> str:
    n = _gp("bound")["noise"]
    pre, dec = n["regular-16k:prefill_tps"], n["regular-16k:generation_tps"]
    return (f"prefill CV {_r(pre['cv'], 1, '100')} %, restart offset estimated at "
            f"{_r(pre['offset_estimate'], 1, '100')} % and bounded at {_r(pre['offset'], 1, '100')} "
            f"%; decode {_gp_noise('bound', 'generation_tps', 'offset_estimate')}, bound "
            f"{_r(dec['offset'], 1, '100')} %. With a bound that wide the plan resolves about "
            f"{_r(_gp('bound')['plan'][0]['resolves'], 0, '100')} % of prefill and "
            f"{_r(_gp('bound')['plan'][1]['resolves'], 0, '100')} % of decode within the cap")  # fmt: skip


def _bound_b() -> str:
    pre = _gp_rows("bound", "B", "prefill_tps")
    dec = _gp_rows("bound", "B", "generation_tps")
    (ex,) = [_row(g["rows"], "prefill_tps") for g in _gp("bound")["gates"]
             if g["round"] == 2 and g["release"] == "B"]  # fmt: skip
    half = [(r["interval"][1] - r["interval"][0]) / 2 / r["ratio"] for r in pre]
    return (f"B ({len(pre)} gates): rolled back {len(_gp_rows('bound', 'B', 'prefill_tps', 'INCONCLUSIVE'))}"
            f" of {len(pre)}, each INCONCLUSIVE: prefill {_span((r['ratio'] for r in pre), 3)}, an "
            f"estimated loss beyond the 5 % rule that the interval (±{_span(half, 0, '100')} %, "
            f"e.g. [{_r(ex['interval'][0], 3)}, {_r(ex['interval'][1], 3)}]) does not resolve; "
            f"decode {_span((r['ratio'] for r in dec), 2)}, PASS")  # fmt: skip


def _bound_a() -> str:
    pre = _gp_rows("bound", "A'", "prefill_tps")
    dec = _gp_rows("bound", "A'", "generation_tps")
    return (f"A' ({len(pre)} gates): PASS {len(_gp_rows('bound', AP, 'prefill_tps', 'PASS'))}"
            f" of {len(pre)}, prefill {_span((r['ratio'] for r in pre), 3)}, decode "
            f"{_span((r['ratio'] for r in dec), 3)}. A''s prefill ratio varied with a log SD of "
            f"{_r(_gp_sd('bound'), 1, '100')} % over the ten rounds ({_r(_gp_sd('quiet'), 1, '100')}"
            " % in the ten rounds before the bound)")  # fmt: skip


def _bound_readme() -> str:
    s = _gp("bound")["summary"]
    (verdict,) = s["slow_verdicts"]
    return (f"(with the bound, {WORDS[len(_gp('bound')['gates']) // 2]} rounds: B rolled back "
            f"{s['slow_caught']} of {s['slow_gates']}, each {verdict}; A' passed "
            f"{s['identical_verdicts']['PASS']} of {s['identical_gates']})")  # fmt: skip


def _quiet_readme() -> str:
    s = _gp("quiet")["summary"]
    return (f"(that setup, {WORDS[len(_gp('quiet')['gates']) // 2]} rounds: {s['slow_caught']} of "
            f"{s['slow_gates']} B caught, {s['identical_false_alarms']} of {s['identical_gates']} "
            "A' rolled back")  # fmt: skip


def _bound_goal() -> str:
    s = _gp("bound")["summary"]
    return (f"{s['slow_caught']} of {s['slow_gates']} slower releases rolled back and "
            f"{s['identical_false_alarms']} of {s['identical_gates']} identical ones")  # fmt: skip


def _bound_base() -> str:
    (base,) = {json.dumps(g["baseline"]) for g in _gp("bound")["gates"] if "baseline" in g}
    b = json.loads(base)
    return f"The round's baseline is {WORDS[b['starts']]} start of {b['repetitions']} trials"


def _point_estimate() -> str:
    d = _gp("quiet")
    s = d["summary"]
    off = d["noise"]["regular-16k:prefill_tps"]["offset"]
    return (f"a prefill offset estimated at {_r(off, 1, '100')} % let an identical release FAIL "
            f"{WORDS[s['identical_false_alarms']]} gate in {WORDS[s['identical_gates']]}")  # fmt: skip


def _bound_reached() -> str:
    n = _gp("bound")["noise"].values()
    return f"(the H200's bounds reached {_r(max(x['offset'] for x in n), 1, '100')} %"


def _profile_cv() -> str:
    noise = [_gp(n)["noise"] for n in ("quiet", "bound")]
    pre, dec = (
        [x[f"regular-16k:{m}"]["cv"] for x in noise] for m in ("prefill_tps", "generation_tps")
    )
    return (f"on one H200 its within-start CV was {_span(pre, 1, '100')} % of prefill and "
            f"{_span(dec, 1, '100')} % of decode")  # fmt: skip


def _serial() -> str:
    d = _load("benchmarks/h200/gate-power.json")
    n, plan = d["noise"], d["plan"]
    (a,) = [g for g in d["gates"] if g["release"] == AP]
    (b,) = [g for g in d["gates"] if g["release"] == "B"]
    return (f"within-start CV {_r(n['regular-16k:prefill_tps']['cv'], 0, '100')} % of prefill and "
            f"{_r(n['regular-16k:generation_tps']['cv'], 0, '100')} % of decode, so the plan "
            f"resolved about {_span((p['resolves'] for p in plan), 0, '100')} %; a 5 % gate of an "
            f"identical release ended {a['verdict']} (rolled back, failing closed) and the slower "
            f"release (eager attention: prefill {_r(_row(b['rows'], 'prefill_tps')['ratio'], 2)}{X} "
            f"of SDPA's) {b['verdict']}ed")  # fmt: skip


def _demo_steps() -> list[dict[str, Any]]:
    return list(_load("benchmarks/h200/demo-transformers.json")["result"]["steps"])


def _demo_bench(step: int) -> list[dict[str, Any]]:
    checks = _demo_steps()[step]["record"]["gate"]["checks"]
    (bench,) = [c for c in checks if c["name"] == "bench"]
    return list(bench["evidence"]["rows"])


def _demo_total() -> str:
    steps = _demo_steps()
    return f"{WORDS[len(steps)]} promotes took {_r(sum(s['seconds'] for s in steps))} s"


def _demo_good() -> str:
    s = _demo_steps()
    pre, dec = (_row(_demo_bench(1), m) for m in ("prefill_tps", "generation_tps"))
    return (f"good #1 released ({_r(s[0]['seconds'])} s), good #2 released (prefill "
            f"{_r(pre['ratio'], 3)}, interval [{_r(pre['interval'][0], 3)}, "
            f"{_r(pre['interval'][1], 3)}], {pre['verdict']} at {pre['n_candidate']} repetitions; "
            f"decode {_r(dec['ratio'], 3)}, {dec['verdict']}), the foreign kernels rolled back by "
            f"provenance ({_r(s[2]['seconds'])} s)")  # fmt: skip


def _demo_slow() -> str:
    pre = _row(_demo_bench(3), "prefill_tps")
    return (f"rolled back by the gate at {pre['n_candidate']} repetitions: prefill "
            f"{_r(pre['ratio'], 3)}, upper bound {_r(pre['interval'][1], 3)}, {pre['verdict']}")  # fmt: skip


def _sweep() -> list[dict[str, Any]]:
    return list(_load("benchmarks/h200/load-sweep-serial.json")["points"])


def _sweep_points() -> str:
    a, b = _sweep()
    slo = ",".join(f"{k.split('_')[0]}:{v:g}{'s' if k.endswith('_s') else 'ms'}"
                   for k, v in b["slo"].items())  # fmt: skip
    return (f"{a['value']:g} req/s taken ({a['completed']} of {a['requests']}, TTFT p50 "
            f"{_r(a['ttft_s']['p50'], 2)} s, p99 {_r(a['ttft_s']['p99'], 2)} s, ITL p50 "
            f"{_r(a['itl_ms']['p50'], 1)} ms, E2E p99 {_r(a['e2el_s']['p99'], 2)} s), "
            f"{b['value']:g} req/s saturated (the queue grew from "
            f"{b['in_flight']['first_third_mean']} to {b['in_flight']['last_third_mean']} requests "
            f"in flight at arrival; TTFT p99 {_r(b['ttft_s']['p99'], 1)} s, goodput "
            f"{_r(b['goodput_rps'], 2)} req/s against `{slo}`). The client's scheduling lag was "
            f"{_r(a['lag_ms']['p99'], 1)} ms at p99 at {a['value']:g} req/s")  # fmt: skip


def _sweep_lags() -> str:
    reqs = sorted(_sweep()[0]["requests_detail"], key=lambda r: r["due_s"])
    due = [0.0] + [r["due_s"] for r in reqs]
    lag = [_r(r["lag_ms"], 1) for r in reqs[:3]]
    gap = [_r(due[i + 1] - due[i], 1) for i in range(3)]
    return (f"(the lags were {lag[0]}, {lag[1]} and {lag[2]} ms after gaps of {gap[0]}, {gap[1]} "
            f"and {gap[2]} s with nothing in flight, {_span((r['lag_ms'] for r in reqs[3:]), 2)} "
            "ms after short ones)")  # fmt: skip


def _sweep_readme() -> str:
    a, b = _sweep()
    assert b["saturated"]
    assert not a["saturated"]
    return f"took {a['value']:g} req/s and saturated at {b['value']:g}"


def _tiers_gate(n: int) -> dict[str, Any]:
    return dict(_load("benchmarks/h100/tiers-gate-summary.json")["releases"][n])


def _tg_span(tier: str, key: str, places: int = 0, scale: str = "1") -> str:
    cases = _tiers_gate(0)["cases"]
    return _span((c[key] for k, c in cases.items() if k.endswith(f"-{tier}")), places, scale)


def _tg_first() -> str:
    r = _tiers_gate(0)
    trials = sum(c["trials"] for c in r["cases"].values())
    assert trials == sum(c["valid"] for c in r["cases"].values())
    return (f"in {_r(r['seconds'])} s on validity alone. All {trials} trials were valid: TTFT "
            f"{_tg_span('16k', 'ttft_s', 2)} s at 16k and {_tg_span('128k', 'ttft_s', 1)} s at "
            f"128k; prefill {_tg_span('16k', 'prefill_tps', 0, '0.001').replace('-', 'k-')}k tok/s"
            f" at 16k and {_tg_span('128k', 'prefill_tps', 0, '0.001').replace('-', 'k-')}k at "
            f"128k; decode {_tg_span('16k', 'generation_tps')} tok/s at 16k and "
            f"{_tg_span('128k', 'generation_tps')} at 128k")  # fmt: skip


def _tg_tel() -> str:
    cases = _tiers_gate(0)["cases"].values()

    def span(key: str, places: int = 0, scale: str = "1") -> str:
        return _span([v for c in cases for v in c[key]], places, scale)

    sm = [int(v) for c in cases for v in c["sm_clock_mhz"]]
    return (f"Telemetry: SM {min(sm):,}-{max(sm):,} MHz and {span('temperature_c')} °C. Power ran "
            f"{span('power_w')} W (the top during 128k prefill); memory use "
            f"{span('memory_used_mib', 1, '0.001')} GB")  # fmt: skip


def _tg_second() -> str:
    r = _tiers_gate(1)
    rows = r["rows"]
    passed = sum(x["verdict"] == "PASS" for x in rows)
    pre = sorted(_r(x["ratio"], 2) for x in rows if x["case"].endswith("128k") and x["metric"] == "prefill_tps")  # fmt: skip
    dec = [x["ratio"] for x in rows if x["metric"] == "generation_tps"]
    trials = sum(c["trials"] for c in r["cases"].values())
    return (f"after {_r(r['seconds'])} s. - Every one of its {trials} trials was valid, and "
            f"{WORDS[passed]} of its {WORDS[len(rows)]} gate rows PASSed: 128k prefill "
            f"{' / '.join(pre)}, decode {_span(dec, 2)}.")  # fmt: skip


def _tg_row() -> dict[str, Any]:
    (row,) = [x for x in _tiers_gate(1)["rows"] if x["verdict"] == "INCONCLUSIVE"]
    return dict(row)


def _tg_inconclusive() -> str:
    row = _tg_row()
    lo, hi = row["interval"]
    return (f"{row['case']} prefill came out at {_r(row['ratio'], 3)}, interval [{_r(lo, 3)}, "
            f"{_r(hi, 3)}] with {row['n_baseline']} + {row['n_candidate']} trials")  # fmt: skip


def _evidence(name: str) -> dict[str, Any]:
    """The bench check's evidence in a committed ``release promote --json`` of one H100."""
    checks = _load(f"benchmarks/h100/{name}.json")["result"]["record"]["gate"]["checks"]
    (bench,) = [c for c in checks if c["name"] == "bench"]
    return dict(bench["evidence"])


def _tg_samples() -> dict[str, list[float]]:
    cases = _evidence("tiers-gate-promote-1")["samples"]["cases"]
    return dict(cases[_tg_row()["case"]]["metrics"])


def _tg_outlier() -> str:
    m = _tg_samples()
    pre = [_r(x, 1, "0.001") + "k" for x in m["prefill_tps"]]
    ttft = m["ttft_s"]
    return (f"three samples there were {pre[0]}, {pre[1]} and **{pre[2]}** tok/s: one trial had a "
            f"TTFT of {_r(max(ttft), 3)} s against {_r(statistics.median(ttft), 3)} s")  # fmt: skip


def _tg_slow() -> str:
    pre = _tg_samples()["prefill_tps"]
    return _r(1 - min(pre) / statistics.median(pre), 0, "100")


def _tg_readme() -> str:
    row = _tg_row()
    lo, hi = row["interval"]
    ttft = _r(statistics.median(_tg_samples()["ttft_s"]), 2)
    return (f"(one baseline trial {_tg_slow()} % slow at a {ttft} s TTFT left the interval at "
            f"[{_r(lo, 2)}, {_r(hi, 2)}]")  # fmt: skip


def _noise_rows(name: str) -> dict[str, Any]:
    return dict(_load(f"benchmarks/h100/{name}.json")["result"]["rows"])


def _noise_metric(name: str, metric: str, key: str) -> list[float]:
    """``cv`` and ``offset`` from the plan (full precision), ``offset_estimate`` from the rows."""
    if key == "offset_estimate":
        return [v[key] for k, v in _noise_rows(name).items() if k.endswith(f":{metric}")]
    plan = _load(f"benchmarks/h100/{name}.json")["result"]["plan"]
    return [p[key] for p in plan if p["metric"] == metric]


def _tiers_noise() -> str:
    name = "tiers-noise-16k-128k"
    plan = _load(f"benchmarks/h100/{name}.json")["result"]["plan"]
    rows = {p["case"]: p for p in plan if p["metric"] == "prefill_tps"}
    pre = ", ".join(f"{c} {_r(rows[c]['cv'], 1, '100')} % / {_r(rows[c]['offset'], 1, '100')} %"
                    for c in ("regular-16k", "coding-16k", "regular-128k", "coding-128k"))  # fmt: skip
    return (f"(80 % bound) of prefill: {pre}; decode "
            f"{_span(_noise_metric(name, 'generation_tps', 'cv'), 0, '100')} % / "
            f"{_span(_noise_metric(name, 'generation_tps', 'offset'), 1, '100')} %. Within "
            f"`bench.max_repetitions` the box resolves {_span((p['resolves'] for p in plan), 0, '100')}"
            " % of a row, not 5 %")  # fmt: skip


def _t16(run: str = "") -> str:
    name = f"tiers16k-noise{run}"
    return (f"prefill CV {_span(_noise_metric(name, 'prefill_tps', 'cv'), 1, '100')} %, offset "
            f"{_span(_noise_metric(name, 'prefill_tps', 'offset'), 0, '100')} % (point estimates "
            f"{_span(_noise_metric(name, 'prefill_tps', 'offset_estimate'), 1, '100')} %)")  # fmt: skip


def _t16_plan() -> dict[str, Any]:
    plan = _load("benchmarks/h100/tiers16k-noise.json")["result"]["plan"]
    (p,) = [p for p in plan if p["case"] == "regular-16k" and p["metric"] == "prefill_tps"]
    return dict(p)


def _t16_resolves() -> str:
    p = _t16_plan()
    return (
        f"this box resolves {_r(p['resolves'], 0, '100')} %, not {_r(p['tolerance'], 0, '100')} %"
    )


def _t16_releases() -> dict[str, Any]:
    return dict(_load("benchmarks/h100/tiers16k-noise-summary.json"))


def _t16_row(name: str) -> dict[str, Any]:
    (row,) = [r for r in _evidence(name)["rows"] if r["verdict"] == "INCONCLUSIVE"]
    return dict(row)


def _t16_first() -> str:
    r = _t16_releases()["releases"][0]
    cases = r["cases"].values()
    return (f"Release 1 was released in {_r(r['seconds'])} s ({sum(c['valid'] for c in cases)} of "
            f"{sum(c['trials'] for c in cases)} trials valid)")  # fmt: skip


def _t16_second() -> str:
    r = _t16_releases()["releases"][1]
    (row,) = [x for x in r["rows"] if x["verdict"] == "INCONCLUSIVE"]
    lo, hi = row["interval"]
    return (f"after {_r(r['seconds'])} s: {row['case']} prefill {_r(row['ratio'], 3)} in "
            f"[{_r(lo, 3)}, {_r(hi, 3)}] at {row['n_baseline']} + {row['n_candidate']} trials")  # fmt: skip


def _t16_loss() -> str:
    found = re.search(r"resolve a loss of (\d+)%", _t16_row("tiers16k-noise-promote-2")["why"])
    assert found is not None
    return f"resolve a loss of {found[1]} %"


def _t16_ttft() -> str:
    return _span((c["ttft_s"] for r in _t16_releases()["releases"] for c in r["cases"].values()), 2)


def _t16_moves() -> str:
    vals = [v for run in ("", "-run2") for k in ("cv", "offset")
            for v in _noise_metric(f"tiers16k-noise{run}", "prefill_tps", k)]  # fmt: skip
    return f"move a {_t16_ttft()} s prefill by {_span(vals, 0, '100')} %"


def _t16_readme() -> str:
    name = "tiers16k-noise"
    return (f"(TTFT {_t16_ttft()} s) scatters {_span(_noise_metric(name, 'prefill_tps', 'cv'), 1, '100')}"
            f" % within a start and its service starts differ by up to "
            f"{_r(max(_noise_metric(name, 'prefill_tps', 'offset')), 0, '100')} % (80 % bound), so "
            f"the box resolves about {_r(_t16_plan()['resolves'], 0, '100')} %")  # fmt: skip


def _t16_readme_row() -> str:
    row = _t16_row("tiers16k-noise-promote-2")
    lo, hi = row["interval"]
    return f"({row['case']} prefill {_r(row['ratio'], 3)}, [{_r(lo, 2)}, {_r(hi, 2)}])"


def _run2() -> str:
    name = "tiers16k-noise-run2"
    rows = _evidence(f"{name}-promote-1")["table"]
    row = _t16_row(f"{name}-promote-2")
    lo, hi = row["interval"]
    return (f"prefill CV {_span(_noise_metric(name, 'prefill_tps', 'cv'), 1, '100')} %, offset bound "
            f"{_span(_noise_metric(name, 'prefill_tps', 'offset'), 1, '100')} %; decode CV "
            f"{_span(_noise_metric(name, 'generation_tps', 'cv'), 1, '100')} %. Release 1 released "
            f"({sum(r['valid_trials'] for r in rows)} of {sum(r['trials'] for r in rows)} valid), "
            f"release 2 rolled back INCONCLUSIVE on {row['case']} prefill, {_r(row['ratio'], 3)} in "
            f"[{_r(lo, 3)}, {_r(hi, 3)}]")  # fmt: skip


def _gpu_tests() -> str:
    text = (ROOT / "benchmarks/h100/gpu-tests.txt").read_text()
    found = re.search(r"(\d+) passed, .* in [\d.]+s \(\d+:(\d+):(\d+)\)", text)
    selected = re.search(r"/ (\d+) selected", text)
    assert found is not None
    assert selected is not None
    return f"{found[1]} of {selected[1]} passed in {int(found[2])} min {int(found[3])} s"


def _demo_noise_rows() -> tuple[dict[str, Any], dict[str, Any]]:
    rows = _load("benchmarks/cpu/demo-noise.json")["result"]["rows"]
    return rows["regular-2k:engine_prefill_tps"], rows["regular-2k:engine_generation_tps"]


def _demo_noise() -> str:
    p, g = _demo_noise_rows()
    return (
        f"prefill's scatter at {100 * p['cv']:.1f} % within a start and "
        f"{100 * p['offset_estimate']:.1f} % between starts (80 % bound "
        f"{100 * p['offset']:.1f} %), so one start a side resolves a loss of about 60 %; "
        f"decode's starts differ by {100 * g['offset_estimate']:.0f} % "
        f"({100 * g['offset']:.0f} %)"
    )


def _demo_pairs() -> str:
    settings = list(_load("benchmarks/cpu/demo-pairs.json")["settings"].values())
    old, credit, now = (s["unchanged_pairs"] for s in settings)
    total = sum(now.values())
    slow = settings[2]["slow_against_each"]
    return (
        f"{old['PASS']} of {total} unchanged pairs passed ({old['FAIL']} FAILed); with the "
        f"scatter check's credit for the box's own scatter, {credit['PASS']}; with the config "
        f"now (prefill at 60 %, restart offset 10.7 %), {now['PASS']} of {total}, and the slow "
        f"release FAILed against each ({slow['FAIL']} of {sum(slow.values())})"
    )


def _demo_pairs_docs() -> str:
    old = next(iter(_load("benchmarks/cpu/demo-pairs.json")["settings"].values()))
    pairs = old["unchanged_pairs"]
    return f"under the old rules the same pairs FAILed one time in {WORDS[round(sum(pairs.values()) / pairs['FAIL'])]}"


def _demo_restart_offset() -> str:
    """The demo config's restart offset is the noise record's bound."""
    p, _ = _demo_noise_rows()
    return f"restart_offset = {round(p['offset'], 2)}"


FIGURES: list[tuple[str, Callable[[], str]]] = [
    ("README.md", _demo_slow_ratio),
    ("docs/bench.md", lambda: "rolled back " + _pct(
        _cell("unchanged, 1 trial in 10 at a third of the rate noise known")["rolled_back"])),
    ("docs/bench.md", lambda: "| 5 % loss only at 128k, 16 rows | caught "
        + _pct(_cell("5% loss only at 128k (16 rows) noise known")["rolled_back"])),
    ("docs/bench.md", lambda: "| unchanged, 16 rows, CV 2 %, offset 1 % | rolled back "
        + _pct(_cell("unchanged (16 rows) noise known")["rolled_back"]) + " / "
        + _pct(_cell("unchanged (16 rows) noise measured")["rolled_back"])),
    ("docs/bench.md", lambda: "| CV 2 %, offset 1 % | "
        + _pct(_cell("unchanged cv 2.0% offset 1.0% noise known")["rolled_back"]) + " / "
        + _pct(_cell("unchanged cv 2.0% offset 1.0% noise measured")["rolled_back"])),
    ("docs/bench.md", lambda: "| 30 % of the release's trials at a third of the rate | caught "
        + _pct(_cell("30 % of the release's requests at a third of the rate noise known")
               ["rolled_back"])),
    ("docs/bench.md", lambda: f"({_load('benchmarks/sim/gate-sim-400.json')['seconds']} s on 2 CPUs"),
    ("docs/bench.md", _gpu_power),
    ("docs/bench.md", _gpu_slow),
    ("docs/bench.md", _gpu_fresh_text),
    ("docs/bench.md", lambda: f"a round is one device call of {_gpu_fresh()['rounds']}"),
    ("docs/bench.md", lambda: f"two candidates' gates took {_gpu_fresh()['rounds']}"),
    ("README.md", lambda: f"{['', 'one', 'two', 'three', 'four', 'five', 'six', 'seven', 'eight', 'nine', 'ten', 'eleven', 'twelve'][_gpu_fresh()['calls']]} calls: the setup took 226 s, a round {_gpu_fresh()['rounds']}"),
    ("README.md", lambda: f"the identical A' PASSed {_gpu_fresh()['passes']} of "
        f"{_gpu_fresh()['passes'] + 1} gates"),
    ("README.md", lambda: f"B (prefill {_gpu_fresh()['slow']}) FAILed "
        f"{_load('benchmarks/h100/gate-power-fresh.json')['summary']['slow_caught']} of "
        f"{_load('benchmarks/h100/gate-power-fresh.json')['summary']['slow_gates']}"),
    ("docs/bench.md", _cpu_aa),
    ("README.md", _cpu_aa),
    # the gate's simulated error rates (benchmarks/sim/gate-sim-400.json)
    ("docs/bench.md", lambda: _sim_row("CV 0.5-1 %, offset ≤ 1 %", ("0.5", "1.0"), ("0.0", "0.5", "1.0"))),
    ("docs/bench.md", lambda: _sim_row("CV 2 %, no offset", ("2.0",), ("0.0",))),
    ("docs/bench.md", lambda: _sim_row("CV 2 %, offset 0.5 %", ("2.0",), ("0.5",))),
    ("docs/bench.md", lambda: _sim_row("CV 2 %, offset 1 %", ("2.0",), ("1.0",))),
    ("docs/bench.md", lambda: "| unchanged, 1 trial in 10 at a third of the rate (both sides) | rolled back "
        + _pct(_cell("unchanged, 1 trial in 10 at a third of the rate noise known")["rolled_back"]) + " / "
        + _pct(_cell("unchanged, 1 trial in 10 at a third of the rate noise measured")["rolled_back"]) + " |"),
    ("docs/bench.md", lambda: "| unchanged, the box 5 % slower during the candidate's run | FAIL "
        + _pct(_cell("unchanged, the box 5 % slower during the candidate noise known")["fail"]) + " / "
        + _pct(_cell("unchanged, the box 5 % slower during the candidate noise measured")["fail"]) + " ("),
    ("docs/bench.md", lambda: "| 10 % of the release's trials at a third of the rate | caught "
        + _pct(_cell("10 % of the release's requests at a third of the rate noise known")["rolled_back"]) + " / "
        + _pct(_cell("10 % of the release's requests at a third of the rate noise measured")["rolled_back"]) + " |"),
    ("docs/bench.md", _sim_prose),
    ("docs/bench.md", _sim_lowest_cell),
    ("README.md", _suite_time),
    ("README.md", _suite_busy),
    ("README.md", _suite_now),
    ("docs/bench.md", lambda: f"({100 * _cell('unchanged cv 2.0% offset 1.0% noise measured')['rolled_back']:.0f}"
        f" % with four rows, {100 * _cell('unchanged (16 rows) noise measured')['rolled_back']:.0f} % with sixteen;"),
    ("docs/bench.md", lambda: "is rolled back "
        + _pct(_cell("unchanged, 1 trial in 10 at a third of the rate noise known")["rolled_back"]) + " (more when"),
    ("docs/bench.md", lambda: "caught "
        + _pct(_cell("30 % of the release's requests at a third of the rate noise known")["rolled_back"])
        + " in one start (" + _pct(_cell("30 % of the release's requests at a third of the rate noise measured")
                                   ["rolled_back"]) + " where more starts"),
    ("README.md", _sim_readme),
    ("docs/config.md", _sim_plan),
    ("docs/bench.md", lambda: "| unchanged, one row's restarts scatter 4 % (the rest 0.5 %) | rolled back "
        + _pct(_cell("unchanged, one row's restarts scatter 4 % (the rest 0.5 %) noise known")["rolled_back"]) + " / "
        + _pct(_cell("unchanged, one row's restarts scatter 4 % (the rest 0.5 %) noise measured")["rolled_back"])
        + ", FAIL " + _pct(_cell("unchanged, one row's restarts scatter 4 % (the rest 0.5 %) noise known")["fail"])
        + " / " + _pct(_cell("unchanged, one row's restarts scatter 4 % (the rest 0.5 %) noise measured")["fail"])),
    ("docs/bench.md", lambda: "| 5 % loss on a row whose restarts scatter 2 % / 3 % (the rest 0.5 %, CV 0.5 %) | caught "
        + " and ".join(_pct(_cell(f"5% loss on the row whose restarts scatter {o} % (the rest 0.5 %) noise known")["rolled_back"]) + " / "
                       + _pct(_cell(f"5% loss on the row whose restarts scatter {o} % (the rest 0.5 %) noise measured")["rolled_back"])
                       for o in (2, 3)) + " |"),
    ("docs/bench.md", lambda: "| 5 % loss on that row | caught "
        + _pct(_cell("5% loss on the row whose restarts scatter 4 % (the rest 0.5 %) noise known")["rolled_back"]) + " / "
        + _pct(_cell("5% loss on the row whose restarts scatter 4 % (the rest 0.5 %) noise measured")["rolled_back"])),
    # the CPU demo and its A/A runs (benchmarks/cpu/demo-aa-busy-*.json)
    ("README.md", lambda: f"prefills at {_r(_row(_promote(3, 'slow')['bench']['rows'], 'prefill_tps')['ratio'], 2)}"
        f"{X} the live release's rate"),
    ("README.md", _demo_run),
    ("README.md", _aa_readme),
    ("docs/bench.md", _aa3),
    ("docs/bench.md", _aa3_bad),
    ("docs/bench.md", _aa1),
    ("docs/bench.md", _aa2),
    ("docs/bench.md", _aa1_promotes),
    # where the client's TTFT goes on vLLM (benchmarks/cpu/bench-fidelity*.json, -before.txt)
    ("docs/bench.md", _fid_header),
    ("docs/bench.md", lambda: _fid_row("to the chat handler (HTTP, JSON, validation)", "to_handler_ms", "no")),
    ("docs/bench.md", _fid_arrival),
    ("docs/bench.md", lambda: _fid_row("chat template and tokenizer", "template_and_tokenizer_ms", "yes")),
    ("docs/bench.md", lambda: _fid_row("first token → the SSE event with its text leaves the handler",
                                       "first_token_to_text_out_ms", "no")),
    ("docs/bench.md", lambda: _fid_row("that event → read by the client (loopback, parsing)", "delivery_ms",
                                       "no", 2)),
    ("docs/bench.md", _fid_prose),
    ("README.md", _fid_readme),
    ("docs/bench.md", _hog),
    ("README.md", _hog),
    ("docs/bench.md", lambda: f"first texts read {_hog_span()} s late"),
    ("docs/bench.md", _hog_wait),
    ("docs/bench.md", lambda: "a {1} ms late one was kept: `benchmarks/cpu/bench-fidelity-before.txt`, +{2} % "
        "at {0}".format(*_before())),
    ("README.md", lambda: "kept one {1} ms late (+{2} %)".format(*_before())),
    # one H200 (benchmarks/h200/)
    ("docs/bench.md", _h200_tiers),
    ("docs/bench.md", _h200_tel),
    ("docs/bench.md", _h200_invalid),
    ("README.md", lambda: f"`benchmarks/h200/transformers-serve-16k-128k.json` "
        f"({_valid('benchmarks/h200/transformers-serve-16k-128k.json')} trials valid"),
    ("docs/bench.md", lambda: _noise_row("one request at a time (default)", "hidden 1024, 16 layers", ("small",))),
    ("docs/bench.md", lambda: _noise_row("the same", "hidden 4096, 16 layers (2B)", ("large",))),
    ("docs/bench.md", lambda: _noise_row("`--continuous-batching`", "2B", ("large-cb",))),
    ("docs/bench.md", lambda: _noise_row("`--continuous-batching --cb-use-cuda-graph`", "2B", ("large-cb-graph",), 1)),
    ("README.md", _noise_readme),
    ("docs/bench.md", _graph_2b),
    ("docs/bench.md", _setup_apart),
    ("docs/bench.md", _setup_plan),
    ("docs/bench.md", _setup_candidates),
    ("docs/bench.md", _quiet_summary),
    ("docs/bench.md", _quiet_calls),
    ("docs/bench.md", _quiet_noise),
    ("docs/bench.md", lambda: "B's margin, measured first: prefill {}{X}, decode {}{X} of A's".format(
        *_margin("quiet"), X=X)),
    ("docs/bench.md", _quiet_b),
    ("docs/bench.md", _quiet_a),
    ("docs/bench.md", _quiet_alarm),
    ("docs/bench.md", _quiet_sd),
    ("docs/bench.md", lambda: "takes about " + _gp_timing("quiet")),
    ("docs/bench.md", lambda: f"({_per_call('bound')}, {WORDS[len(_gp('bound')['calls'])]} calls)"),
    ("docs/bench.md", _bound_noise),
    ("docs/bench.md", lambda: "B's margin was {}{X} prefill, {}{X} decode".format(*_margin("bound"), X=X)),
    ("docs/bench.md", _bound_b),
    ("docs/bench.md", _bound_a),
    ("docs/bench.md", _bound_goal),
    ("docs/bench.md", _bound_base),
    ("docs/bench.md", lambda: "A round takes " + _gp_timing("bound")),
    ("docs/bench.md", _point_estimate),
    ("docs/bench.md", _bound_reached),
    ("README.md", _quiet_readme),
    ("README.md", _bound_readme),
    ("docs/profiles.md", _profile_cv),
    ("docs/bench.md", _serial),
    ("docs/bench.md", lambda: "passed, its " + _demo_total().replace(" took ", " in ")),
    ("README.md", _demo_total),
    ("docs/bench.md", _demo_good),
    ("docs/bench.md", _demo_slow),
    ("docs/bench.md", _sweep_points),
    ("docs/bench.md", _sweep_lags),
    ("README.md", _sweep_readme),
    # one H100 (benchmarks/h100/)
    ("docs/bench.md", _h100_tiers),
    ("docs/bench.md", _h100_tel),
    ("README.md", lambda: f"`benchmarks/h100/transformers-serve-16k-128k.json` "
        f"({_valid('benchmarks/h100/transformers-serve-16k-128k.json')} valid)"),
    ("docs/bench.md", _tg_first),
    ("docs/bench.md", _tg_tel),
    ("docs/bench.md", _tg_second),
    ("docs/bench.md", _tg_inconclusive),
    ("docs/bench.md", _tg_outlier),
    ("docs/bench.md", lambda: f"so one hiccup moves a trial by {_tg_slow()} %"),
    ("README.md", _tg_readme),
    ("docs/bench.md", _tiers_noise),
    ("docs/bench.md", _t16),
    ("docs/bench.md", _t16_resolves),
    ("docs/bench.md", _t16_first),
    ("docs/bench.md", _t16_second),
    ("docs/bench.md", _t16_loss),
    ("docs/bench.md", _run2),
    ("docs/bench.md", _t16_moves),
    ("README.md", _t16_readme),
    ("README.md", _t16_readme_row),
    ("docs/bench.md", _gpu_tests),
    ("README.md", _demo_noise),
    ("README.md", _demo_pairs),
    ("docs/bench.md", _demo_pairs_docs),
    ("src/servegate/demo/sandbox.py", _demo_restart_offset),
    ("README.md", _suite_cut),
    ("README.md", _suite_cpu),
    ("README.md", _suite_latest),
    ("README.md", _suite_f2314b8),
    ("README.md", _suite_de71dea),
]  # fmt: skip


@pytest.mark.parametrize(("doc", "figure"), FIGURES, ids=[f"{d}:{i}" for i, (d, _) in
                                                         enumerate(FIGURES)])  # fmt: skip
def test_a_cited_figure_is_its_file_s(doc: str, figure: Callable[[], str]) -> None:
    text = " ".join((ROOT / doc).read_text().split())
    want = " ".join(figure().split())
    assert want in text, f"{doc} does not say {want!r} (the committed file's figure)"
