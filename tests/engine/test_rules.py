"""Lint rules: each shipped rule fires on the trap it names and stays quiet on the
shipped profiles; teams extend, replace and turn off rules with their own files."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from servegate.cli import main
from servegate.demo import vllm_env
from servegate.engine import lint, rules, vllm_envs
from servegate.engine.launch import LaunchSpec, parse_options
from servegate.engine.profiles import Expect, UnitSettings
from servegate.errors import ConfigError
from tests.conftest import REAL_HOME

PYTHON = "/opt/runtime/.venv/bin/python"
MODULE = ("-m", "vllm.entrypoints.openai.api_server")
OFFLINE = {"HF_HUB_OFFLINE": "1"}


def spec(
    *args: str,
    env: dict[str, str] | None = None,
    limits: UnitSettings | None = None,
    expect: Expect | None = None,
    python: str = PYTHON,
) -> LaunchSpec:
    argv = (python, *MODULE, *args)
    return LaunchSpec(
        "svc",
        argv,
        env if env is not None else dict(OFFLINE),
        Path("/srv/release"),
        "0" * 40,
        limits=limits or UnitSettings(),
        expect=expect or Expect(),
        args=parse_options(argv),
    )


def findings(s: LaunchSpec, tmp_path: Path, ruleset: rules.RuleSet | None = None) -> dict[str, str]:
    found = lint.lint(s, ruleset or rules.load(), tmp_path)
    return {f.rule: f"{f.severity}: {f.message}" for f in found}


@pytest.mark.parametrize("name", ["v620-tp4", "v620-tp4-piecewise", "cpu-demo"])
def test_shipped_profiles_have_no_fail_findings(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    params = ["--param", "runtime=/rt", "--param", "model=/m", "--param", "python=/usr/bin/python3"]
    if name == "cpu-demo":
        params = ["--param", "python=/usr/bin/python3", "--param", "model=/m"]
    assert main(["lint", "--profile", name, *params, "--json", "--config", "/nonexistent"]) == 0


def test_piecewise_with_mode_0(tmp_path: Path) -> None:
    cc = '{"mode":0,"cudagraph_mode":"PIECEWISE"}'
    found = findings(spec("--compilation-config", cc), tmp_path)
    assert found["compile.piecewise-mode0"].startswith("fail: cudagraph_mode PIECEWISE")
    ok = '{"mode":3,"cudagraph_mode":"PIECEWISE"}'
    assert "compile.piecewise-mode0" not in findings(spec("--compilation-config", ok), tmp_path)


def test_capture_sizes_must_cover_the_mtp_batches(tmp_path: Path) -> None:
    mtp2 = ("--speculative-config", '{"method":"mtp","num_speculative_tokens":2}')
    seqs = ("--max-num-seqs", "4")

    def cc(sizes: str) -> tuple[str, str]:
        return (
            "--compilation-config",
            f'{{"mode":0,"cudagraph_mode":"FULL_DECODE_ONLY","cudagraph_capture_sizes":{sizes}}}',
        )

    assert "compile.capture-sizes" not in findings(spec(*mtp2, *seqs, *cc("[3,6,12]")), tmp_path)
    short = findings(spec(*mtp2, *seqs, *cc("[3,6]")), tmp_path)["compile.capture-sizes"]
    assert "leave 9, 12 tokens without a graph" in short
    ladder = findings(spec(*mtp2, *seqs, *cc("[1,2,4,8]")), tmp_path)["compile.capture-sizes"]
    assert "leave 3, 6, 9, 12 tokens" in ladder  # no size is a multiple of 3 tokens
    unset = findings(spec(*mtp2, *cc("[3,6,12]")), tmp_path)["compile.capture-sizes"]
    assert "vLLM's default 256" in unset


def _rocblas(tmp_path: Path) -> tuple[Path, str]:
    lib = tmp_path / "rocm" / "lib"
    lib.mkdir(parents=True)
    (lib / "librocblas.so.4.3").write_bytes(b"\x7fELF rocblas build 1")
    (lib / "librocblas.so").symlink_to("librocblas.so.4.3")
    return lib, hashlib.sha256(b"\x7fELF rocblas build 1").hexdigest()[:12]


def test_tunableop_table_must_match_the_installed_rocblas(tmp_path: Path) -> None:
    lib, digest = _rocblas(tmp_path)

    def env(suffix: str) -> dict[str, str]:
        return {
            **OFFLINE,
            "LD_LIBRARY_PATH": str(lib),
            "PYTORCH_TUNABLEOP_ENABLED": "1",
            "PYTORCH_TUNABLEOP_TUNING": "0",
            "PYTORCH_TUNABLEOP_FILENAME": f"/rt/tunableop/rocblas-{suffix}/results.csv",
        }

    assert "tunableop.rocblas-mismatch" not in findings(spec(env=env(digest)), tmp_path)
    wrong = findings(spec(env=env("c27e2252cc7a")), tmp_path)["tunableop.rocblas-mismatch"]
    assert wrong.startswith("fail:")
    assert f"is for rocBLAS c27e2252cc7a, but {lib}/librocblas.so.4.3 has SHA-256 {digest}" in wrong
    unknown = {**env(digest), "LD_LIBRARY_PATH": str(tmp_path / "nowhere")}
    if not any(Path(p).exists() for p in lint.rocblas_candidates(spec(env=unknown))):
        assert findings(spec(env=unknown), tmp_path)["tunableop.rocblas-mismatch"].startswith(
            "warn: TunableOp table vs the installed rocBLAS: cannot verify"
        )


def test_tunableop_tuning_left_on(tmp_path: Path) -> None:
    on = {**OFFLINE, "PYTORCH_TUNABLEOP_ENABLED": "1"}  # PyTorch tunes by default
    assert findings(spec(env=on), tmp_path)["tunableop.tuning-on"].startswith("fail:")
    off = {**on, "PYTORCH_TUNABLEOP_TUNING": "0"}
    assert "tunableop.tuning-on" not in findings(spec(env=off), tmp_path)


def test_unit_that_restarts_forever(tmp_path: Path) -> None:
    forever = UnitSettings(restart="always", start_limit_interval=0)
    assert (
        "Restart=always with StartLimitIntervalSec=0"
        in findings(spec(limits=forever), tmp_path)["unit.restart-forever"]
    )
    bounded = UnitSettings(restart="always", start_limit_interval=600)
    assert "unit.restart-forever" not in findings(spec(limits=bounded), tmp_path)


def test_kv_cache_size_other_than_expected(tmp_path: Path) -> None:
    expect = Expect(kv_cache_bytes=4026531840)
    right = spec("--kv-cache-memory-bytes", "4026531840", expect=expect)
    assert not {"kv.unexpected-size", "kv.size-missing"} & set(findings(right, tmp_path))
    wrong = findings(spec("--kv-cache-memory-bytes", "8053063680", expect=expect), tmp_path)
    assert "is 8053063680, the profile was measured with 4026531840" in wrong["kv.unexpected-size"]
    assert "kv.size-missing" in findings(spec(expect=expect), tmp_path)


def test_expandable_segments_with_ple_offload(tmp_path: Path) -> None:
    env = {
        **OFFLINE,
        "PYTORCH_HIP_ALLOC_CONF": "expandable_segments:True",
        "VLLM_PLE_CPU_OFFLOAD": "1",
    }
    assert "memory.expandable-with-ple-offload" in findings(spec(env=env), tmp_path)
    env["VLLM_PLE_CPU_OFFLOAD"] = "0"
    assert "memory.expandable-with-ple-offload" not in findings(spec(env=env), tmp_path)


def test_max_num_seqs_above_the_safe_concurrency(tmp_path: Path) -> None:
    expect = Expect(safe_max_num_seqs=4)
    found = findings(spec("--max-num-seqs", "8", expect=expect), tmp_path)
    assert "--max-num-seqs 8 is above the safe concurrency 4" in found["concurrency.above-safe"]
    assert "concurrency.above-safe" not in findings(
        spec("--max-num-seqs", "4", expect=expect), tmp_path
    )


def test_local_model_without_offline_mode(tmp_path: Path) -> None:
    found = findings(spec("--model", "/models/x", env={}), tmp_path)
    assert "the model /models/x is a local path" in found["model.local-without-offline"]
    assert "model.local-without-offline" not in findings(spec("--model", "/models/x"), tmp_path)
    assert "model.local-without-offline" not in findings(
        spec("--model", "Qwen/Qwen3-8B", env={}), tmp_path
    )


def test_unknown_vllm_variable_from_the_shipped_list(tmp_path: Path) -> None:
    env = {**OFFLINE, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_KVCACHE_SPAEC": "1"}
    found = findings(spec(env=env), tmp_path)
    message = found["env.unknown-vllm"]
    assert message.startswith("warn: unknown vLLM variable: VLLM_CPU_KVCACHE_SPAEC")
    assert "did you mean 'VLLM_CPU_KVCACHE_SPACE'" in message
    declared = spec(env=env, expect=Expect(engine_env=("VLLM_CPU_KVCACHE_SPAEC",)))
    assert "env.unknown-vllm" not in findings(declared, tmp_path)


def test_unknown_vllm_variable_from_the_installed_vllm(tmp_path: Path) -> None:
    """A real interpreter resolving a real ``vllm`` package through the service's
    PYTHONPATH: the list comes from that package's envs.py, and a miss is a fail."""
    pkg = tmp_path / "fork" / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('servegate must not import vllm')\n")
    (pkg / "envs.py").write_text(
        "from typing import Any, Callable\n"
        "environment_variables: dict[str, Callable[[], Any]] = {\n"
        "    'VLLM_RDNA_AR': lambda: 1,\n    'VLLM_HOST_IP': lambda: '',\n}\n"
    )
    env = {**OFFLINE, "PYTHONPATH": str(pkg.parent), "VLLM_RDNA_AR": "1", "VLLM_RDNA_ARR": "1"}
    s = spec(env=env, python=sys.executable)
    message = findings(s, tmp_path)["env.unknown-vllm"]
    assert message.startswith(
        "fail: unknown vLLM variable: VLLM_RDNA_ARR is not a variable the installed vLLM"
    )
    assert "did you mean 'VLLM_RDNA_AR'" in message
    assert (tmp_path / "vllm-envs.json").exists()  # cached for the next lint


def test_the_installed_vllm_cpu_knows_its_own_variables(tmp_path: Path) -> None:
    python = vllm_env.venv_dir({"XDG_CACHE_HOME": str(REAL_HOME / ".cache")}) / "bin" / "python"
    if not python.exists():
        pytest.skip(f"the demo's vLLM environment is not installed ({python})")
    known = vllm_envs.known(str(python), {}, "/", tmp_path)
    assert known.installed
    assert known.names == vllm_envs.snapshot().names  # the shipped list is this vLLM's


def test_team_rules_extend_replace_and_disable(tmp_path: Path) -> None:
    team = tmp_path / "team.toml"
    team.write_text(
        """
[[lint]]
id = "team.no-eager"
severity = "fail"
message = "--enforce-eager is off limits on the serving box"
remedy = "drop --enforce-eager"
when = [{ path = "args.enforce-eager", equals = true }]

[[lint]]
id = "concurrency.above-safe"
severity = "warn"
message = "more than {expect.safe_max_num_seqs} sequences"
when = [{ path = "args.max-num-seqs", above_path = "expect.safe_max_num_seqs" }]
"""
    )
    ruleset = rules.load([team], disable=["model.local-without-offline"])
    s = spec("--enforce-eager", "--model", "/m", "--max-num-seqs", "9", env={},
             expect=Expect(safe_max_num_seqs=4))  # fmt: skip
    found = findings(s, tmp_path, ruleset)
    assert found["team.no-eager"] == "fail: --enforce-eager is off limits on the serving box"
    assert found["concurrency.above-safe"] == "warn: more than 4 sequences"
    assert "model.local-without-offline" not in found
    relaxed = rules.load([team], severity={"team.no-eager": "warn"})
    assert findings(s, tmp_path, relaxed)["team.no-eager"].startswith("warn:")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (
            '[[lint]]\nid = "x"\nseverity = "fatal"\nmessage = "m"\ncheck = "capture-sizes"\n',
            "severity must be one of",
        ),
        (
            '[[lint]]\nid = "x"\nseverity = "fail"\nmessage = "m"\ncheck = "capture-size"\n',
            "did you mean 'capture-sizes'",
        ),
        (
            '[[lint]]\nid = "x"\nseverity = "fail"\nmessage = "m"\nwhen = [{ path = "env.A", equal = "1" }]\n',
            "one test of",
        ),
        ('[[lint]]\nid = "x"\nseverity = "fail"\nmessage = "m"\nwhn = []\n', "did you mean 'when'"),
        (
            '[[log]]\nid = "x"\nseverity = "fail"\nmessage = "m"\npattern = "(unclosed"\n',
            "missing ), unterminated",
        ),
        ('[[lints]]\nid = "x"\n', "use [[lint]] or [[log]]"),
    ],
)
def test_bad_rule_files_say_what_is_wrong(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "team.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=None) as err:
        rules.load([path])
    assert words in str(err.value)
    assert str(path) in str(err.value)


def test_disabling_an_unknown_rule_is_an_error() -> None:
    with pytest.raises(ConfigError, match="names rule 'tunableop.tuning'.*did you mean"):
        rules.load(disable=["tunableop.tuning"])


def test_lint_command_exits_15_on_a_fail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tmp_path / "bad.toml"
    profile.write_text(
        '[profile]\ninclude = ["v620-tp4"]\n[args]\n'
        'compilation-config = { mode = 0, cudagraph_mode = "PIECEWISE" }\nmax-num-seqs = 8\n'
    )
    code = main(["lint", "--profile", str(profile), "--param", "runtime=/rt", "--param",
                 "model=/m", "--config", str(tmp_path / "none.toml")])  # fmt: skip
    assert code == 15
    err = capsys.readouterr().err
    assert "compile.piecewise-mode0" in err
    assert "concurrency.above-safe" in err
    assert "compile.capture-sizes" in err  # 8 requests x 3 tokens: 15, 18, 21, 24 missing


def test_lint_rules_lists_every_rule(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--profile", "cpu-demo"], []):  # no config and no profile needed
        assert main(["lint", "--rules", *argv, "--config", "/nonexistent"]) == 0
        out = capsys.readouterr().out
        for rule in rules.load().rules:
            assert rule.id in out


def test_a_profile_alone_with_a_parameter_missing_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A preview may leave {release} open, never a parameter the profile needs."""
    assert main(["render", "--profile", "v620-tp4", "--config", "/nonexistent"]) == 2
    err = capsys.readouterr().err
    assert "not filled in: {model}, {runtime}" in err
    assert "--param NAME=VALUE" in err
    assert main(["lint", "--profile", "v620-tp4", "--config", "/nonexistent", "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"]["class"] == "ConfigError"
    args = ["--param", "model=/m", "--param", "runtime=/r", "--config", "/nonexistent"]
    assert main(["render", "--profile", "v620-tp4", *args, "--format", "shell"]) == 0
    assert "{release}" in capsys.readouterr().out
    # a --sha is a commit id, never text that would go raw into a unit file
    assert main(["render", "--profile", "v620-tp4", *args, "--sha", "abc def%n"]) == 2
    assert "is not a commit id" in capsys.readouterr().err


def test_render_and_lint_run_as_commands(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "servegate", "render", "--profile", "v620-tp4", "--format",
         "shell", "--param", "runtime=/rt", "--param", "model=/m", "--config", "/nonexistent"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert result.stdout.startswith("# servegate render: profile v620-tp4\nset -euo pipefail")
    assert "--kv-cache-memory-bytes 4026531840" in result.stdout
    assert "{release}" in result.stdout
    assert "not filled in: {release}" in result.stderr
