"""Log rules over real server output: the seeds' failure lines, and the facts a real
vLLM start-up log yields."""

from __future__ import annotations

from pathlib import Path

import pytest

from servegate.engine import logscan, rules

DATA = Path(__file__).parent / "data"
V620 = {"env": {"VLLM_RDNA_AR": "1"}, "expect": {"log_lines": []}}
PLAIN: dict[str, object] = {"env": {}}

# lines as the seeds and known-failures.md quote them
SEED_LINES = [
    (
        "(EngineCore_DP0 pid=812) INFO 09-22 10:01:12 [vllm.py:812] Cudagraph mode PIECEWISE "
        "is not compatible with compilation mode 0. Overriding to NONE.",
        "log.piecewise-downgraded",
    ),
    (
        "(Worker_TP0 pid=901) WARNING: TunableOp disabled: the results file was created for "
        "another rocBLAS version",
        "log.tunableop-disabled",
    ),
    (
        ":0:rocdevice.cpp:3020: Callback: Queue aborting with error : HSA_STATUS_ERROR_EXCEPTION:"
        " An HSAIL operation resulted in a hardware exception. code: 0x1016",
        "log.hsa-error",
    ),
    (
        "(Worker_TP1 pid=902) WARNING No cudagraph for BatchDescriptor FULL num_tokens=12 "
        "num_reqs=4 uniform_token_count=3",
        "log.missing-cudagraph",
    ),
    (
        "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity of 29.98 GiB",
        "log.out-of-memory",
    ),
    ("(Worker_TP2 pid=903) Traceback (most recent call last):", "log.worker-traceback"),
]


@pytest.mark.parametrize(("line", "rule"), SEED_LINES)
def test_each_seed_failure_line_fails_its_rule(line: str, rule: str) -> None:
    text = f"INFO starting\n{line}\nINFO Application startup complete.\n"
    scan = logscan.scan(text, rules.load(), PLAIN, "startup")
    assert [f.rule for f in scan.failures] == [rule]
    assert scan.failures[0].evidence == line.strip()


def test_a_clean_log_has_no_findings() -> None:
    scan = logscan.scan((DATA / "vllm-cpu-startup.log").read_text(), rules.load(), PLAIN, "startup")
    assert scan.findings == []


def test_all_reduce_must_report_itself_active_when_enabled() -> None:
    active = "(Worker_TP0 pid=1) INFO rdna_ar: one-shot all-reduce active (4 ranks, 64 KiB)\n"
    assert logscan.scan(active, rules.load(), V620, "startup").findings == []
    missing = logscan.scan("INFO nothing about it\n", rules.load(), V620, "startup")
    assert [f.rule for f in missing.failures] == ["log.allreduce-not-active"]
    disabled = logscan.scan(
        "(Worker_TP0 pid=1) WARNING rdna_ar: custom all-reduce disabled (no P2P)\n",
        rules.load(),
        V620,
        "startup",
    )
    assert {f.rule for f in disabled.failures} == {
        "log.allreduce-disabled",
        "log.allreduce-not-active",
    }
    # the profile does not enable it: no expectation
    assert logscan.scan("INFO nothing\n", rules.load(), PLAIN, "startup").findings == []


def test_profile_expected_lines_are_required_at_startup_only() -> None:
    facts = {"env": {}, "expect": {"log_lines": ["graphs captured for [3, 6, 12]"]}}
    startup = logscan.scan("INFO ready\n", rules.load(), facts, "startup")
    assert [f.rule for f in startup.failures] == ["expect.log-line"]
    assert logscan.scan("INFO ready\n", rules.load(), facts, "window").findings == []


def test_startup_only_rules_are_not_applied_to_a_window() -> None:
    line = "Cudagraph mode PIECEWISE is not compatible with compilation mode 0. Overriding to NONE."
    assert logscan.scan(line, rules.load(), PLAIN, "window").findings == []
    hsa = "HSA_STATUS_ERROR_EXCEPTION in indexSelectSmallIndex<Half,long>"
    assert [f.rule for f in logscan.scan(hsa, rules.load(), PLAIN, "window").failures] == [
        "log.hsa-error"
    ]


def test_facts_from_a_real_vllm_cpu_startup() -> None:
    scan = logscan.scan((DATA / "vllm-cpu-startup.log").read_text(), rules.load(), PLAIN, "startup")
    assert scan.facts["kv_cache_tokens"] == 262144
    assert scan.facts["max_concurrency"] == pytest.approx(25.6)
    assert isinstance(scan.facts["engine_init_seconds"], float)
    assert scan.facts["engine_init_seconds"] > 0


def test_facts_from_gpu_startup_lines() -> None:
    text = (
        "(Worker_TP0 pid=7) INFO [gpu_model_runner.py:4100] Graph capturing finished in 3 secs, "
        "took 0.46 GiB\n"
        "(EngineCore_DP0 pid=6) INFO [kv_cache_utils.py:1087] GPU KV cache size: 1,245,184 tokens\n"
        "(Worker_TP0 pid=7) INFO [cuda.py:403] Using FLASH_ATTN attention backend out of "
        "potential backends: ['FLASH_ATTN', 'TRITON_ATTN']\n"
    )
    facts = logscan.scan(text, rules.load(), PLAIN, "startup").facts
    assert facts["graph_capture_seconds"] == 3
    assert facts["graph_capture_gib"] == pytest.approx(0.46)
    assert facts["kv_cache_tokens"] == 1245184
    assert facts["attention_backend"] == "FLASH_ATTN"


def test_repeated_lines_are_one_finding_with_a_count() -> None:
    text = "No cudagraph for FULL num_tokens=12\n" * 5
    [finding] = logscan.scan(text, rules.load(), PLAIN, "window").findings
    assert finding.message.endswith("(+4 more line(s))")
