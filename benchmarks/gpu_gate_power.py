"""The gate's power on quiet hardware: the box's noise, then 10 gates of an identical
release and 10 of a slower one, on a real GPU server.

    python3 benchmarks/gpu_gate_power.py --out DIR [--runs 10] [--tier 16k]
        [--max-tokens 64] [--hidden 4096 --layers 16] [--serve "OPTIONS"]
        [--slow "CHANGE" --slow "CHANGE" ...] [--min-loss 0.07]
        [--tolerance 0.05] [--decode-tolerance 0.15] [--starts 3] [--noise-reps 4]
        [--base-reps 5] [--base-starts 1] [--deadline S]
        [--resume DIR/gate-power.json] [--work DIR]

The rounds take about 100 s each with their restarts; where one command may run only so
long, run the setup and the first rounds with ``--deadline``, then go on with
``--resume`` (the noise, the plan and B as measured; a new random model of the same
shape, so the same speed) until ``--runs`` rounds are done.

Run on a machine with a CUDA GPU and a Python that has torch, transformers and the
``transformers serve`` extras; servegate on ``PYTHONPATH``. It makes a random-weight
Llama like ``gpu_transformers_bench.py``'s but larger (hidden 4096, 16 layers, 2B
parameters, in bfloat16 on the GPU) and serves it three times with ``transformers serve``
and ``--serve``'s options: A (the live release), A' (an identical release) and B (the same
with a ``--slow`` change: server options, or ``NAME=VALUE`` environment settings, a team
could plausibly make; candidates are tried in order and the first that loses
``--min-loss`` or more on a gated metric is B). Then:

1. **Noise**, exactly as ``servegate bench noise`` measures it: A is measured over
   ``--starts`` service starts (killed and started again between them), and
   :func:`servegate.judging.noise.measure` estimates the within-start CV and the restart
   offset per case and metric; :func:`servegate.release.bench_gate.plan` says what
   repetitions the gate needs to resolve each rule's tolerance.
2. **B's margin**, measured first: A and each candidate side by side, the ratio of their
   medians.
3. **Gates**: ``--runs`` rounds, each measuring A afresh as the baseline (a result file
   the gate reads through ``gate.baseline``), then running the release gate's own bench
   check (:func:`servegate.release.bench_gate.run`: planned repetitions, sequential looks
   up to the cap, restarts between starts when the offset needs them) on A' and on B,
   with ``--tolerance`` on client prefill and ``--decode-tolerance`` on decode. The order
   alternates per round.

The defaults are what ``benchmarks/gpu_server_noise.py`` and two setup runs found on an
H200 (``benchmarks/h200/``): continuous batching with CUDA graphs and a fixed KV cache is
quiet (within-start CV 1.1 % of prefill, 2 % of decode, restart offsets 0.6 % and 1.5 %:
the plan resolves 5 % of prefill, about 10 % of decode), where one request at a time is
not (3-28 %); B serves with 8,192 batch tokens instead of 2,048 (prefill about 0.91x).

Prints and writes ``gate-power.json``: the noise, the plan, B's margin, and per gate
its verdict, the repetitions it chose and its rows. The random model's text is noise,
so the content rules of a trial's validity are off (``max_dominant_ratio = 1``);
timing validity stays.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_transformers_bench import free_port, serve_command, wait_up

from servegate import config as config_mod
from servegate import documents
from servegate.bench import results
from servegate.bench.cases import spec_from_config
from servegate.bench.driver import Bench
from servegate.engine import adapters
from servegate.engine.openai import Endpoint
from servegate.judging import noise
from servegate.pipeline.stages import ConsoleReporter
from servegate.release import bench_gate

METRICS = ("prefill_tps", "generation_tps")
#: continuous batching with CUDA graphs and a fixed KV cache: on an H200, within-start CV
#: 1.1 % of prefill and 0.5-2 % of decode (benchmarks/h200/server-noise.json); a fixed
#: cache, so servers that share the GPU are identical
QUIET = (
    "--continuous-batching --cb-use-cuda-graph --cb-block-size 256 --cb-num-blocks 256 "
    "--cb-max-batch-tokens 2048"
)
#: the same with 8,192 batch tokens: prefill about 0.91x on an H200, decode equal
#: (benchmarks/h200/gate-power-setup.json)
SLOWER = "--cb-max-batch-tokens 8192"


@dataclass
class Server:
    name: str
    model: Path
    extra: list[str]
    work: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launch(self) -> None:
        env = {**os.environ, "HF_HUB_CACHE": str(self.work / "hub"), "HF_HUB_OFFLINE": "1",
               **self.extra_env}  # fmt: skip
        (self.work / "hub").mkdir(parents=True, exist_ok=True)
        log = (self.work / f"{self.name.replace(chr(39), '2')}.log").open("ab")
        argv = [*serve_command(self.model, self.port), *self.extra]
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)

    def start(self) -> None:
        self.launch()
        assert self.proc is not None
        wait_up(self.url, self.proc, 300)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def restart(self) -> dict[str, Any]:
        self.stop()
        self.start()
        return {"restarted": self.name}


def config_text(
    root: Path,
    model: Path,
    tier: str,
    max_tokens: int,
    baseline: str,
    tolerance: float = 0.05,
    decode_tolerance: float = 0.0,
) -> str:
    return f"""
[stack]
remote = "/nonexistent"
[host]
root = "{root}"
id = "gpu-gate-power"
[service]
port = 1
engine = "transformers"
command = ["transformers", "serve"]
[bench]
profiles = ["regular"]
tiers = ["{tier}"]
repetitions = 3
max_repetitions = 12
max_starts = 5
max_tokens = {max_tokens}
seed = -1
tokenizer = "{model}"
tokenizer_python = "{sys.executable}"
reference = false
# random weights: noise text; the content rules are off, the timing rules stay
max_dominant_ratio = 1.0
min_unique_ratio = 0.0
min_zlib_ratio = 0.0
min_text_tokens = 1
[gate]
checks = ["bench"]
baseline = "{baseline}"
[[gate.rules]]
metric = "prefill_tps"
tolerance = {tolerance}
[[gate.rules]]
metric = "generation_tps"
tolerance = {decode_tolerance or tolerance}
"""


def load_cfg(work: Path, model: Path, args: argparse.Namespace, baseline: str) -> Any:
    path = work / "servegate.toml"
    tolerance = getattr(args, "tolerance", 0.05)
    decode = getattr(args, "decode_tolerance", 0.0)
    path.write_text(
        config_text(work / "host", model, args.tier, args.max_tokens, baseline, tolerance, decode)
    )
    (work / "host").mkdir(exist_ok=True)
    return config_mod.load(path, {})


def measure(cfg: Any, server: Server, reps: int, out: Path, starts: int = 1) -> results.Samples:
    """One side's samples with the gate's bench settings, over ``starts`` service starts."""
    ep = Endpoint(server.url, "", adapters.TRANSFORMERS)
    spec = spec_from_config(cfg.bench, ep, str(server.model), "", "gpu-gate-power")
    bench = Bench(spec, out, ConsoleReporter(prefix=f"{server.name}: "), environ=os.environ)
    bench.prepare()
    bench.warm_up()
    for chunk, count in enumerate(bench_gate.spread(reps, starts)):
        if chunk:
            server.restart()
            bench.restarted()
            bench.warm_up()
        for case in spec.cases:
            bench.measure(case, count)
    return results.from_result(bench.finish(), str(out))


def medians(s: results.Samples) -> dict[str, float]:
    out = {}
    for cid, cs in s.cases.items():
        for m in METRICS:
            values = cs.metrics.get(m, [])
            if values:
                out[f"{cid}:{m}"] = statistics.median(values)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--tier", default="16k")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--starts", type=int, default=3, help="service starts for the noise")
    parser.add_argument("--noise-reps", type=int, default=4)
    parser.add_argument(
        "--base-reps",
        type=int,
        default=0,
        help="the baseline's repetitions each round (0: what the gate's plan measures "
        "before its first look, as the fresh baseline of a promote does)",
    )
    parser.add_argument(
        "--base-starts",
        type=int,
        default=0,
        help="service starts the baseline's repetitions are spread over each round (0: "
        "as many as the plan gives the candidate, as the fresh baseline's ABAB design does)",
    )
    parser.add_argument(
        "--serve",
        default=QUIET,
        help="options every server gets (default: the quiet server found on an H200)",
    )
    parser.add_argument(
        "--slow",
        action="append",
        default=[],
        help="B's change: server options and NAME=VALUE environment settings; repeat it to "
        "try candidates in order, keeping the first that loses --min-loss or more",
    )
    parser.add_argument("--min-loss", type=float, default=0.07)
    parser.add_argument("--tolerance", type=float, default=0.05, help="the prefill rule's")
    parser.add_argument(
        "--decode-tolerance",
        type=float,
        default=0.15,
        help="the decode rule's (0: --tolerance); 15 %%: what the quiet server resolves",
    )
    parser.add_argument("--hidden", type=int, default=4096, help="the model's hidden size")
    parser.add_argument("--layers", type=int, default=16, help="the model's layers")
    parser.add_argument(
        "--deadline",
        type=float,
        default=0.0,
        help="seconds: start no new round after this (0: none); the rounds done are kept",
    )
    parser.add_argument(
        "--resume",
        type=Path,
        help="a gate-power.json of an earlier run: its noise, plan and B are taken as they "
        "were measured and its rounds kept; this run adds rounds up to --runs",
    )
    parser.add_argument(
        "--work",
        type=Path,
        help="where the model and the servers' files go (default: a new temporary folder, "
        "removed at the end); a model already there is used as it is",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="sg-gpu-power-"))
    work.mkdir(parents=True, exist_ok=True)
    model = work / "model"
    started = time.monotonic()
    if not (model / "config.json").is_file():
        maker = resources.files("servegate.demo") / "make_model.py"
        shape = ["--hidden", str(args.hidden), "--layers", str(args.layers),
                 "--max-positions", "140000", "--no-eos", "--dtype", "bfloat16",
                 "--device", "cuda"]  # fmt: skip
        subprocess.run([sys.executable, "-c", maker.read_text(), str(model), *shape], check=True)
    base_flags = args.serve.split()
    candidates = args.slow or [SLOWER]
    servers = {
        "A": Server("A", model, base_flags, work),
        "A'": Server("A'", model, base_flags, work),
    }
    if args.resume:
        report = json.loads(args.resume.read_text())
        for key in ("noise", "plan", "slow", "fingerprint", "gates"):
            if key not in report:
                raise SystemExit(f"{args.resume} has no {key!r}: not a run whose setup ended")
        flags, env = split_change(report["slow"])
        servers["B"] = Server("B", model, [*base_flags, *flags], work, extra_env=env)
    else:
        report = {"tier": args.tier, "max_tokens": args.max_tokens, "serve": args.serve,
                  "tolerance": args.tolerance,
                  "decode_tolerance": args.decode_tolerance or args.tolerance,
                  "model": f"hidden {args.hidden}, {args.layers} layers",
                  "candidates": {}, "gates": []}  # fmt: skip
    calls = report.setdefault("calls", [])
    call: dict[str, Any] = {"resumed": bool(args.resume), "rounds": 0, "seconds": {}}
    calls.append(call)

    def lap(name: str) -> None:
        call["seconds"][name] = round(time.monotonic() - started, 1)

    try:
        for s in servers.values():
            s.launch()
        for s in servers.values():
            assert s.proc is not None
            wait_up(s.url, s.proc, 300)
        lap("servers_up")
        print(f"servers up in {time.monotonic() - started:.0f} s", flush=True)
        cfg = load_cfg(work, model, args, "recorded")
        if args.resume:
            # the noise as the first run measured it (the bench fingerprint is the same)
            if any("offset_estimate" not in v for v in report["noise"].values()):
                raise SystemExit(
                    f"{args.resume} holds the noise as measured before the gate bounded the "
                    "restart offset (a point estimate): start a new run without --resume"
                )
            found = {k: documents.read(noise.Noise, v) for k, v in report["noise"].items()}
            noise.save(cfg.host_root, found, report["fingerprint"], "A", "gpu", [])
        else:
            # 1. the noise, as `servegate bench noise` measures it: A over several starts
            noise_starts = []
            for i in range(args.starts):
                if i:
                    servers["A"].restart()
                noise_starts.append(
                    measure(cfg, servers["A"], args.noise_reps, work / f"noise-{i}.json")
                )
            found = noise.measure(noise_starts, METRICS)
            fingerprint = noise_starts[-1].fingerprint
            noise.save(cfg.host_root, found, fingerprint, "A", "gpu", [])
            report["fingerprint"] = dict(fingerprint)
            report["noise"] = {k: v.as_dict() for k, v in found.items()}
            report["plan"] = bench_gate.plan(cfg, found)
            print(f"noise: {json.dumps(report['noise'])}\nplan: {json.dumps(report['plan'])}",
                  flush=True)  # fmt: skip
            lap("noise")
            # 2. B's margin, measured first: the first candidate that loses --min-loss
            a = medians(measure(cfg, servers["A"], 5, work / "margin-A.json"))
            for n, change in enumerate(candidates):
                flags, env = split_change(change)
                servers["B"] = b_srv = Server(
                    "B", model, [*base_flags, *flags], work, extra_env=env
                )
                b_srv.start()
                b = medians(measure(cfg, b_srv, 5, work / f"margin-B{n}.json"))
                margin = {k: round(b[k] / a[k], 4) for k in a if k in b}
                report["candidates"][change] = margin
                print(f"B candidate {change!r}: B / A medians {json.dumps(margin)}", flush=True)
                if min(margin.values()) <= 1 - args.min_loss:
                    report["slow"], report["slow_margin"] = change, margin
                    break
                b_srv.stop()
                del servers["B"]
            if "B" not in servers:
                raise SystemExit(f"no candidate for B loses {args.min_loss:.0%}")
            lap("margin")
        save(report, args.out)
        # 3. the gates: a fresh baseline each round, A' and B judged by the release gate
        first = 1 + max((g["round"] for g in report["gates"]), default=0)
        for i in range(first - 1, args.runs):
            if args.deadline and time.monotonic() - started > args.deadline:
                print(f"deadline: {i} of {args.runs} rounds done", flush=True)
                break
            base = work / f"base-{i:02d}.json"
            b = cfg.bench
            first, starts = bench_gate.design(
                report["plan"], b.repetitions, b.max_repetitions, b.max_starts
            )
            base_reps, base_starts = args.base_reps or first, args.base_starts or starts
            measure(cfg, servers["A"], base_reps, base, base_starts)
            gcfg = load_cfg(work, model, args, str(base))
            order = ["A'", "B"] if i % 2 == 0 else ["B", "A'"]
            for name in order:
                srv = servers[name]
                ep = Endpoint(srv.url, "", adapters.TRANSFORMERS)
                ev = bench_gate.run(gcfg, ep, str(model), f"{name}-{i}", None, None,
                                    ConsoleReporter(prefix=f"{name} gate: "), os.environ,
                                    restart=srv.restart)  # fmt: skip
                keys = ("case", "metric", "verdict", "ratio", "interval")
                row = {
                    "round": i + 1,
                    "release": name,
                    "verdict": ev["verdict"],
                    "repetitions": ev.get("repetitions"),
                    "starts": ev.get("starts"),
                    "baseline": {"repetitions": base_reps, "starts": base_starts},
                    "rows": [{k: r.get(k) for k in keys} for r in ev["rows"]],
                }
                report["gates"].append(row)
                ratios = "; ".join(f"{r['metric']} {r.get('ratio')}" for r in row["rows"])
                print(f"round {i + 1}: {name} {ev['verdict']} reps {ev.get('repetitions')} "
                      f"starts {ev.get('starts')} — {ratios}", flush=True)  # fmt: skip
                save(report, args.out)
            call["rounds"] += 1
            lap(f"round_{i + 1}")
    finally:
        for s in servers.values():
            s.stop()
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
        save(report, args.out)  # a run cut short keeps what it measured
    print(json.dumps(report["summary"]))
    return 0


def split_change(change: str) -> tuple[list[str], dict[str, str]]:
    """B's change: (server options, NAME=VALUE environment settings)."""
    flags = [w for w in change.split() if "=" not in w or w.startswith("-")]
    env = dict(w.split("=", 1) for w in change.split() if w not in flags)
    return flags, env


def save(report: dict[str, Any], out: Path) -> None:
    """``gate-power.json`` with the summary so far (a run cut short keeps its rounds). A
    gate that does not PASS rolls the release back, so it counts as a catch (of B) or a
    false alarm (of A'); how many of those were a FAIL (the loss resolved) and how many
    INCONCLUSIVE (rolled back without resolving it) is said beside them."""
    same = [g["verdict"] for g in report["gates"] if g["release"] == "A'"]
    slow = [g["verdict"] for g in report["gates"] if g["release"] == "B"]
    report["summary"] = {
        "identical_false_alarms": sum(v != "PASS" for v in same), "identical_gates": len(same),
        "slow_caught": sum(v != "PASS" for v in slow), "slow_gates": len(slow),
        "identical_verdicts": {v: same.count(v) for v in sorted(set(same))},
        "slow_verdicts": {v: slow.count(v) for v in sorted(set(slow))},
    }  # fmt: skip
    (out / "gate-power.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    sys.exit(main())
