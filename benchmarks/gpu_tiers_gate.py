"""The mission's tiers through ``release promote``'s gate on a real GPU server.

    python3 benchmarks/gpu_tiers_gate.py --out DIR [--tiers 16k,128k]
        [--profiles regular,coding] [--hidden 1024 --layers 8] [--max-tokens 128]
        [--repetitions 3] [--max-repetitions 5] [--kv-blocks 640]
        [--tolerance 0.05] [--decode-tolerance 0.15] [--noise-restarts 2] [--arch sm_90]
        [--work DIR]

What ``gpu_transformers_bench.py`` measures with ``servegate bench`` against a server it
starts itself, this measures the way a team would meet it: a demo stack (bare origin,
host root, supervisord, the stack's CUDA extension built with nvcc for this GPU's arch
and mapped by the live server) whose config gates on the 16k and 128k tiers of prose and
code. Two releases are promoted with ``servegate release promote SHA --json``:

1. the first, which has nothing to compare with (it passes on validity alone: every
   trial of every case must be valid);
2. a second (the kernels' v2, the same server), compared with the first's recorded
   samples by the bench gate: planned repetitions, sequential looks up to the cap, a
   verdict per tier, profile and metric. ``--noise-restarts N`` first measures the box's
   noise on the live first release (``servegate bench noise``), which the gate plans
   with; without it the gate plans from its defaults. At the 16k tier of the default
   model (a prefill of a sixth of a second on an H100) the server's Python and its
   restarts move prefill by 5-10 %: the noise says the box resolves about 45 %, not 5 %,
   and an identical release can end INCONCLUSIVE, failing closed (docs/bench.md).

``transformers serve`` runs with the quiet setup of ``transformers-demo-gpu``
(continuous batching, CUDA graphs), its fixed KV cache enlarged to ``--kv-blocks`` blocks
of 256 tokens so that a 128k prompt fits. The model is a random-weight Llama made on the
GPU (``--hidden``/``--layers``, 140k positions); its answers are noise, so the content
rules are off as in the GPU demo (and one word of text is enough: at hidden 1024 it
samples runs with no space, "isisis…"), and every timing rule stays. ``nvidia-smi`` telemetry
(clocks, power, temperature, memory) is recorded beside every group in each result file.

Writes to ``--out``: ``promote-1.json``/``promote-2.json`` (each promote's JSON and its
stderr), the gate's result files (``bench/``), ``summary.json`` (per release and case:
valid trials, TTFT, prefill, decode, the gate's rows, the telemetry's range) and the
config. On a machine without an NVIDIA GPU ``--arch gfx1030`` runs the same flow on the
CPU (``transformers-demo``: hipcc kernels, float32) to try the script before a GPU is
spent on it.

Run from a checkout with servegate on ``PYTHONPATH``, a Python with torch, transformers
and the ``transformers serve`` extras, supervisord, and nvcc (hipcc for gfx).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from servegate import config as config_mod
from servegate.demo import sandbox, scenario
from servegate.engine.managers.supervisor import Supervisor

PROFILE = """# the GPU demo's quiet server with a KV cache that holds a 128k prompt
[profile]
description = "transformers-demo-gpu with {blocks} KV blocks of 256 tokens"
include = ["transformers-demo-gpu"]

[args]
cb-num-blocks = {blocks}
"""


def gpu_arch() -> str:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return "sm_" + out.stdout.split()[0].replace(".", "")


def replace(text: str, old: str, new: str) -> str:
    if old not in text:
        raise SystemExit(f"the demo config has no {old!r}: this script needs updating")
    return text.replace(old, new, 1)


def tiers_config(sb: sandbox.Sandbox, args: argparse.Namespace) -> str:
    """The demo's config, gated on the tiers and profiles asked for."""
    text = sb.config.read_text()
    q = json.dumps
    text = replace(text, 'profiles = ["regular"]', f"profiles = {q(args.profiles.split(','))}")
    tier = "16k" if sb.gpu else "4k"
    text = replace(text, f'tiers = ["{tier}"]', f"tiers = {q(args.tiers.split(','))}")
    reps, cap, tokens = ("4", "10", "64") if sb.gpu else ("4", "6", "128")
    text = replace(text, f"repetitions = {reps}\n", f"repetitions = {args.repetitions}\n")
    cap_now = f"max_repetitions = {args.max_repetitions}\n"
    text = replace(text, f"max_repetitions = {cap}\n", cap_now)
    text = replace(text, f"max_tokens = {tokens}\n", f"max_tokens = {args.max_tokens}\n")
    text = replace(
        text, f"min_text_tokens = {int(tokens) // 4}", f"min_text_tokens = {args.max_tokens // 4}"
    )
    if sb.gpu:
        (sb.root / "tiers-gpu.toml").write_text(PROFILE.format(blocks=args.kv_blocks))
        text = replace(text, 'profile = "transformers-demo-gpu"', 'profile = "tiers-gpu.toml"')
        text = replace(text, "tolerance = 0.05", f"tolerance = {args.tolerance}")
        text = replace(text, "tolerance = 0.15", f"tolerance = {args.decode_tolerance}")
        # a wider random model samples runs without a space ("isisis…"): one "word" of
        # text is still text streamed, which is all this rule asks of noise
        text = replace(text, f"min_text_tokens = {args.max_tokens // 4}", "min_text_tokens = 1")
    else:  # two CPU cores: the content rules of the CPU demo, off like the GPU's
        text = replace(text, "max_dominant_ratio = 0.35\n", "max_dominant_ratio = 1.0\n"
                       "min_unique_ratio = 0.0\nmin_zlib_ratio = 0.0\n")  # fmt: skip
    # every trial of the tiers counts: a 128k request may take minutes on a small box
    return text.replace("[bench]\n", "[bench]\ntimeout = 3600.0\n", 1)


def promote(sb: sandbox.Sandbox, sha: str, out: Path, n: int) -> dict[str, Any]:
    argv = [sys.executable, "-m", "servegate", "release", "promote", sha,
            "--config", str(sb.config), "--json"]  # fmt: skip
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    took = time.monotonic() - start
    (out / f"promote-{n}.stderr").write_text(done.stderr)
    try:
        doc: dict[str, Any] = json.loads(done.stdout)
    except json.JSONDecodeError:
        doc = {"stdout": done.stdout}
    (out / f"promote-{n}.json").write_text(json.dumps(doc, indent=2) + "\n")
    result: dict[str, Any] = doc.get("result") or {}
    print(f"promote {n} ({sha[:12]}): exit {done.returncode} in {took:.0f} s: "
          f"{result.get('verdict')} {result.get('reason') or ''}", flush=True)  # fmt: skip
    return {"sha": sha, "verdict": result.get("verdict"), "exit_code": done.returncode,
            "seconds": round(took, 1)}  # fmt: skip


def measure_noise(sb: sandbox.Sandbox, args: argparse.Namespace) -> dict[str, Any]:
    """``servegate bench noise`` on the live first release: the within-start CV and the
    restart offset the second promote's gate then plans with (``noise.json``)."""
    argv = [sys.executable, "-m", "servegate", "bench", "noise", "--config", str(sb.config),
            "--restarts", str(args.noise_restarts), "--repetitions", str(args.repetitions),
            "--json"]  # fmt: skip
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    (args.out / "noise.json").write_text(done.stdout)
    (args.out / "noise.stderr").write_text(done.stderr)
    print(f"bench noise over {args.noise_restarts} restart(s): exit {done.returncode} in "
          f"{time.monotonic() - start:.0f} s", flush=True)  # fmt: skip
    return {"exit_code": done.returncode, "seconds": round(time.monotonic() - start, 1)}


#: the telemetry fields summed up per case: their range over the case's groups
TELEMETRY = ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temperature_c", "memory_used_mib")


def _range(values: list[float]) -> list[float] | None:
    return [min(values), max(values)] if values else None


def summarise(result: dict[str, Any]) -> dict[str, Any]:
    """Per case: valid trials, medians, and the GPU telemetry's range over its groups."""
    rows = {r["case"]: r for r in result.get("performance_table", [])}
    cases: dict[str, Any] = {}
    for case in result.get("cases", []):
        row = rows.get(case["id"], {})
        seen: dict[str, list[float]] = {}
        for group in case["groups"]:
            for fields in ((group.get("telemetry") or {}).get("gpus") or {}).values():
                for key, stats in fields.items():
                    seen.setdefault(key, []).extend((stats["min"], stats["max"]))
        cases[case["id"]] = {
            "valid": row.get("valid_trials"), "trials": row.get("trials"),
            "prompt_tokens": row.get("prompt_tokens"), "ttft_s": row.get("ttft_s"),
            "prefill_tps": row.get("prefill_tps"), "generation_tps": row.get("generation_tps"),
            **{key: _range(seen.get(key, [])) for key in TELEMETRY},
            "invalid": [t["reason_details"] for g in case["groups"] for t in g["trials"]
                        if not t["performance_valid"]],
        }  # fmt: skip
    gate = result.get("gate") or {}
    rows_kept = ("case", "metric", "ratio", "interval", "n_baseline", "n_candidate", "verdict")
    return {
        "gate": gate.get("verdict"),
        "rows": [{k: r.get(k) for k in rows_kept} for r in gate.get("rows", [])],
        "cases": cases,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tiers", default="16k,128k")
    parser.add_argument("--profiles", default="regular,coding")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--max-repetitions", type=int, default=5)
    parser.add_argument("--kv-blocks", type=int, default=640, help="KV blocks of 256 tokens")
    parser.add_argument("--tolerance", type=float, default=0.05, help="prefill's rule")
    parser.add_argument("--decode-tolerance", type=float, default=0.15, help="decode's rule")
    parser.add_argument(
        "--noise-restarts",
        type=int,
        default=0,
        help="bench noise over this many restarts before promote 2",
    )
    parser.add_argument("--arch", default="", help="default: the first NVIDIA GPU's")
    parser.add_argument("--work", type=Path, help="where the sandbox goes (default: a temp dir)")
    args = parser.parse_args()
    # `timeout` stops it with SIGTERM: the service is shut down and what was measured
    # is kept (the promote under way is killed; its host root goes with the sandbox)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    arch = args.arch or gpu_arch()
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="sg-tiers-"))
    python = Path(sys.executable)
    if not arch.startswith("sm_"):
        from servegate.demo import vllm_env
        from servegate.pipeline.stages import ConsoleReporter

        reporter = ConsoleReporter()
        python = vllm_env.ensure_transformers_serve(dict(os.environ), reporter)
    positions = "140000" if arch.startswith("sm_") else "32768"
    start = time.monotonic()
    sb = sandbox.create(work / "demo", python, engine="transformers", arch=arch,
                        model_shape=(str(args.hidden), str(args.layers), positions))  # fmt: skip
    sb.config.write_text(tiers_config(sb, args))
    shutil.copy(sb.config, args.out / "servegate.toml")
    print(f"sandbox {sb.root} ready in {time.monotonic() - start:.0f} s", flush=True)
    cfg = config_mod.load(sb.config, dict(os.environ))
    summary: dict[str, Any] = {"arch": arch, "tiers": args.tiers, "profiles": args.profiles,
                               "model": f"hidden {args.hidden}, {args.layers} layers",
                               "max_tokens": args.max_tokens, "releases": []}  # fmt: skip
    try:
        for n, make in enumerate((scenario.good_first, scenario.good_second), 1):
            if n == 2 and args.noise_restarts:
                summary["noise"] = measure_noise(sb, args)
            sha = make(sb)
            release = promote(sb, sha, args.out, n)
            summary["releases"].append(release)
            if release["verdict"] != "released":
                break
    finally:
        Supervisor(cfg).shutdown_daemon()
        bench_dir = sb.host_root / "bench"
        if bench_dir.is_dir():
            shutil.copytree(bench_dir, args.out / "bench", dirs_exist_ok=True)
        for release in summary["releases"]:  # the gate's result file: <stamp>-<sha12>.json
            found = sorted((args.out / "bench").glob(f"*-{release['sha'][:12]}.json"))
            if found:
                release |= summarise(json.loads(found[-1].read_text()))
        (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    for release in summary["releases"]:
        print(f"{release['sha'][:12]}: {release['verdict']} in {release['seconds']:.0f} s")
        for case, row in release.get("cases", {}).items():
            print(f"  {case:<13} {row['valid']}/{row['trials']} valid, prompt "
                  f"{row['prompt_tokens'] or 0:,.0f}, TTFT {row['ttft_s'] or 0:.3f} s, prefill "
                  f"{row['prefill_tps'] or 0:,.0f} tok/s, decode {row['generation_tps'] or 0:.1f} "
                  f"tok/s; SM {row['sm_clock_mhz']} MHz, {row['power_w']} W, "
                  f"{row['temperature_c']} °C")  # fmt: skip
            for why in row["invalid"]:
                print(f"    invalid: {json.dumps(why)[:300]}")
        for r in release.get("rows", []):
            ns = f"{r['n_baseline']}/{r['n_candidate']}"
            print(f"  gate {r['case']:<13} {r['metric']:<15} ratio {r['ratio']} interval "
                  f"{r['interval']} n {ns}: {r['verdict']}")  # fmt: skip
    ok = [r["verdict"] for r in summary["releases"]] == ["released", "released"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
