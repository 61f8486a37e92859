"""Where a GPU server's TTFT goes, by servegate's own client: ``transformers serve`` on
one GPU, the bench's tiers one stream at a time.

    python3 benchmarks/gpu_ttft_decomposition.py --out DIR [--tiers 1k,4k,16k]
        [--repetitions 5] [--max-tokens 64] [--hidden 512 --layers 8]
        [--device cuda:0 --dtype bfloat16] [--serve "OPTIONS"]

Run as ``gpu_transformers_bench.py`` is (a CUDA GPU; torch, transformers and the
``transformers serve`` extras; servegate on ``PYTHONPATH``). It makes the same
random-weight Llama, serves it, and measures the tiers with the bench's own client
(``servegate.bench.driver``, prompts sized with the model's tokenizer files). That
server keeps no TTFT clock of its own (no ``/metrics``), so each trial's TTFT is split
with what can be seen from outside it:

- ``send → role event``: ``transformers serve`` sends its role-only event once it has
  parsed the request, rendered the chat template, tokenized the prompt and started the
  generation: the server's work before the prefill, as the client sees it;
- ``role event → first text``: the prefill, the first token and its way out;
- ``client_wait_s``: how long the first text may have waited for the client's thread to
  get a CPU (beyond 1 % of the TTFT the bench drops the trial's client timings);
- in this process, on the same GPU and the same messages: the chat template and the
  tokenizer (``template_tokenize_s``) and the model's prefill alone (``forward_s``: one
  forward pass over the prompt, synchronized, best of 3), so ``ttft - forward`` is all a
  request costs beyond the model's own prefill;
- the constant: ``ttft = c + prompt_tokens / rate`` fitted over the trials of all tiers
  (least squares): ``c`` is what a request costs whatever its length.

On vLLM (``benchmarks/bench_fidelity.py``, the CPU box) the engine's own histograms and
stamps inside its API server split the same time further. Writes ``result.json`` (the
bench's result file), ``ttft-decomposition.json`` (every trial and the summary),
``server.log`` and ``nvidia-smi.txt`` into ``--out``. ``--device cpu --dtype float32``
tries it without a GPU.
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
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from gpu_transformers_bench import free_port, wait_up

from servegate.bench import cases, client, driver, measure, sse
from servegate.bench.sse import Stream, now
from servegate.engine import adapters
from servegate.engine.openai import Endpoint

FIRST_EVENT: dict[int, float] = {}  # id(stream) → when its first event (any) was read


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tiers", default="1k,4k,16k")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--serve", default="", help="more options for transformers serve")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="sg-ttft-"))
    try:
        model = make_model(work, args)
        rows, result = measure_server(work, model, args)
        offline(model, rows, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = summarize(rows)
    doc = {
        "command": "benchmarks/gpu_ttft_decomposition.py " + " ".join(sys.argv[1:]),
        "system": system(args.device),
        "summary": summary,
        "trials": rows,
        "sizing": result.get("sizing"),
    }
    (args.out / "ttft-decomposition.json").write_text(json.dumps(doc, indent=1) + "\n")
    show(rows, summary)
    return 0


def make_model(work: Path, args: argparse.Namespace) -> Path:
    model = work / "model"
    maker = resources.files("servegate.demo") / "make_model.py"
    subprocess.run(
        [sys.executable, "-c", maker.read_text(), str(model), "--hidden", str(args.hidden),
         "--layers", str(args.layers), "--max-positions", "140000", "--no-eos",
         "--dtype", args.dtype],
        check=True,
    )  # fmt: skip
    return model


def serve_command(model: Path, port: int, args: argparse.Namespace) -> list[str]:
    exe = shutil.which("transformers")
    head = [exe] if exe else [sys.executable, "-m", "transformers.cli.transformers"]
    return [*head, "serve", str(model), "--host", "127.0.0.1", "--port", str(port),
            "--dtype", args.dtype, "--device", args.device, *args.serve.split()]  # fmt: skip


def measure_server(
    work: Path, model: Path, args: argparse.Namespace
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The bench's tiers, one stream a group, with each stream's first event kept."""
    streams: list[Stream] = []
    stream_chat, feed = client.stream_chat, sse.feed

    def keep(*a: Any, **k: Any) -> Stream:
        st = stream_chat(*a, **k)
        streams.append(st)
        return st

    def feed_first(line: str, stream: Stream, clock: Callable[[], float]) -> bool:
        if line.startswith("data:") and id(stream) not in FIRST_EVENT:
            FIRST_EVENT[id(stream)] = now()
        return feed(line, stream, clock)

    client.stream_chat = keep
    sse.feed = feed_first
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "HF_HUB_CACHE": str(work / "hub"), "HF_HUB_OFFLINE": "1"}
    (work / "hub").mkdir()
    rules = measure.Rules(
        max_tokens=args.max_tokens,
        max_dominant_ratio=1.0,
        min_unique_ratio=0.0,
        min_zlib_ratio=0.0,
        min_text_tokens=args.max_tokens // 4,
    )  # random weights: the content rules are off, as in gpu_transformers_bench; fmt: skip
    rows = []
    with (args.out / "server.log").open("wb") as log:
        server = subprocess.Popen(serve_command(model, port, args), stdout=log,
                                  stderr=subprocess.STDOUT, env=env)  # fmt: skip
        try:
            wait_up(url, server, 600)
            spec = cases.Spec(
                Endpoint(url, engine=adapters.TRANSFORMERS), str(model),
                cases.parse_cases(["regular"], args.tiers.split(","), [1]),
                repetitions=args.repetitions, max_tokens=args.max_tokens,
                sampling=cases.Sampling(seed=-1), rules=rules, tokenizer=str(model),
                tokenizer_python=sys.executable,
            )  # fmt: skip
            bench = driver.Bench(spec, args.out / "result.json")
            bench.prepare()
            bench.warm_up()
            for planned in spec.cases:
                for _ in range(spec.repetitions):
                    group = bench.measure(planned, 1)["groups"][-1]
                    st = streams[-1]
                    text = bench.prompts[f"{planned.profile}-{planned.tier}"]
                    tag = group["trials"][0].get("request_tag", "")
                    rows.append(row(planned.tier, group["trials"][0], st,
                                    bench.messages(planned.profile, text, tag)))  # fmt: skip
            result = dict(bench.finish())
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, check=False)
        (args.out / "nvidia-smi.txt").write_text(smi.stdout)
    return rows, result


def row(tier: str, t: Any, st: Stream, messages: list[dict[str, Any]]) -> dict[str, Any]:
    first = None if st.first_text_at is None else st.first_text_at - st.started
    event = FIRST_EVENT.get(id(st))
    return {
        "tier": tier,
        "prompt_tokens": t["prompt_tokens"],
        "valid": t["performance_valid"],
        "invalid_reasons": t["invalid_reasons"],
        "client_timing": t["client_timing"],
        "ttft_s": t["ttft_s"],
        "first_text_s": None if first is None else round(first, 6),
        "client_wait_s": t["client_wait_s"],
        "send_to_role_event_s": None if event is None else round(event - st.started, 6),
        "role_event_to_text_s": None if event is None or first is None else round(
            first - (event - st.started), 6),
        "generation_tps": t["generation_tps"],
        "messages": messages,
    }  # fmt: skip


def offline(model: Path, rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """The template, the tokenizer and the model's prefill alone, in this process on the
    same device, for each trial's own messages (best of 3 each)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    net = AutoModelForCausalLM.from_pretrained(model)
    net = net.to(device=args.device, dtype=getattr(torch, args.dtype)).eval()
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    for r in rows:
        messages = r.pop("messages")
        best_tok = best_fwd = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            encoded = tok.apply_chat_template(
                messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
            )
            ids = encoded["input_ids"]
            best_tok = min(best_tok, time.perf_counter() - start)
            ids = ids.to(args.device)
            with torch.no_grad():
                sync()
                start = time.perf_counter()
                net(input_ids=ids, use_cache=True)
                sync()
                best_fwd = min(best_fwd, time.perf_counter() - start)
        r["template_tokenize_s"] = round(best_tok, 6)
        r["forward_s"] = round(best_fwd, 6)
        if r["first_text_s"] is not None:
            r["beyond_forward_s"] = round(r["first_text_s"] - best_fwd, 6)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"tiers": {}}
    for tier in dict.fromkeys(r["tier"] for r in rows):
        mine = [r for r in rows if r["tier"] == tier and r["first_text_s"] is not None]
        keys = ("first_text_s", "client_wait_s", "send_to_role_event_s", "role_event_to_text_s",
                "template_tokenize_s", "forward_s", "beyond_forward_s")  # fmt: skip
        out["tiers"][tier] = {
            "trials": len(mine),
            "client_timing_dropped": sum(1 for r in mine if r["client_timing"]),
            **{k: median([r.get(k) for r in mine]) for k in keys},
        }
    kept = [r for r in rows if not r["client_timing"] and r["first_text_s"] is not None]
    points = [(r["prompt_tokens"], r["first_text_s"]) for r in kept if r["prompt_tokens"]]
    if len({n for n, _ in points}) >= 2:
        slope, c = statistics.linear_regression([n for n, _ in points], [s for _, s in points])
        out["constant_s"] = round(c, 6)
        out["prefill_tps_fitted"] = round(1 / slope, 1) if slope > 0 else None
    return out


def median(values: list[Any]) -> float | None:
    found = [v for v in values if isinstance(v, int | float)]
    return round(statistics.median(found), 6) if found else None


def show(rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    print(f"{'tier':<6}{'prompt':>8}{'TTFT s':>9}{'wait ms':>9}{'→role ms':>10}{'role→text':>11}"
          f"{'tmpl+tok ms':>12}{'forward s':>11}{'beyond ms':>11}")  # fmt: skip
    for r in rows:
        if r["first_text_s"] is None:
            print(f"{r['tier']:<6} no text: {r['invalid_reasons']}")
            continue
        cells = [
            f"{r['tier']:<6}{r['prompt_tokens'] or 0:>8}{r['first_text_s']:>9.4f}",
            cell(r["client_wait_s"], 9, 1e3, 2),
            cell(r["send_to_role_event_s"], 10, 1e3, 1),
            cell(r["role_event_to_text_s"], 11, 1, 4),
            cell(r.get("template_tokenize_s"), 12, 1e3, 1),
            cell(r.get("forward_s"), 11, 1, 4),
            cell(r.get("beyond_forward_s"), 11, 1e3, 1),
        ]
        print("".join(cells) + (f"  [{r['client_timing'][:50]}]" if r["client_timing"] else ""))
    print(json.dumps(summary, indent=1))


def cell(value: float | None, width: int, scale: float, places: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value * scale:>{width}.{places}f}"


def system(device: str) -> str:
    if not device.startswith("cuda") or not shutil.which("nvidia-smi"):
        return f"{os.cpu_count()} CPUs, {device}"
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                         capture_output=True, text=True, check=False)  # fmt: skip
    return smi.stdout.strip() or "unknown GPU"


if __name__ == "__main__":
    sys.exit(main())
