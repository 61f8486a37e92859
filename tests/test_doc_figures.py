"""Figures the README and docs cite are the figures of the committed files they name:
each entry below reads the file and says the text the document must hold. A figure that
drifts from its file (or a file edited without its sentence) fails here."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


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


def _cpu_aa() -> str:
    aa = _load("benchmarks/cpu/demo-aa-busy-3.json")["aa"]["summary"]
    return f"{aa['verdicts']['PASS']} of {aa['runs']} A/A gates PASSed"


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
    ("docs/bench.md", lambda: f"({_load('benchmarks/sim/gate-sim-400.json')['seconds']} s on 2 CPUs)"),
    ("docs/bench.md", _gpu_power),
    ("docs/bench.md", _gpu_slow),
    ("docs/bench.md", _cpu_aa),
    ("README.md", _cpu_aa),
]  # fmt: skip


@pytest.mark.parametrize(("doc", "figure"), FIGURES, ids=[f"{d}:{i}" for i, (d, _) in
                                                         enumerate(FIGURES)])  # fmt: skip
def test_a_cited_figure_is_its_file_s(doc: str, figure: Callable[[], str]) -> None:
    text = " ".join((ROOT / doc).read_text().split())
    want = " ".join(figure().split())
    assert want in text, f"{doc} does not say {want!r} (the committed file's figure)"
