"""Launch profiles: the shipped V620 profile against the seed's run command, variants,
rendering, and every kind of bad profile."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from servegate import config
from servegate.engine import profiles
from servegate.engine import render as render_mod
from servegate.engine.launch import LaunchSpec, cache_key, launch_spec
from servegate.errors import ConfigError

DATA = Path(__file__).parent / "data"
SEED_BLOCK = DATA / "seed-000-run-command.sh"
SEED_FILE = Path(__file__).parents[3] / "shared" / "seeds" / "000_210618d2e3152a74.txt"
REPO = "/home/george/v620-experiments/baseline-git-20260922"
RUNTIME = "/home/george/v620-experiments/upstream-20260915/v620-vllm-testing"
MODEL = "/home/george/v620-vllm/models/intel-autoround"
SHA = "532ed3f930f475e731c82726e079f3374ab5b33f"
BUILTINS = {"release": REPO, "port": "8080", "sha": SHA, "short": SHA[:12], "host_root": "/h"}
PARAMS = {"runtime": RUNTIME, "model": MODEL}


def bash_eval(script: str) -> tuple[list[str], dict[str, str]]:
    """Run ``script`` in a clean bash; return the argv it would exec and its exports."""
    wrapper = (
        'exec() { printf \'%s\\0\' "$@" > "$ARGV_OUT"; env -0 > "$ENV_OUT"; }\n'
        "cd() { :; }\n" + script
    )
    out = Path(subprocess.run(["mktemp", "-d"], capture_output=True, text=True).stdout.strip())
    try:
        subprocess.run(
            ["env", "-i", f"ARGV_OUT={out}/argv", f"ENV_OUT={out}/env", "bash", "-c", wrapper],
            check=True,
        )
        argv = (out / "argv").read_bytes().decode().split("\0")[:-1]
        pairs = (out / "env").read_bytes().decode().split("\0")[:-1]
    finally:
        shutil.rmtree(out)
    env = dict(p.split("=", 1) for p in pairs)
    for noise in ("PWD", "SHLVL", "_", "ARGV_OUT", "ENV_OUT", "OLDPWD"):
        env.pop(noise, None)
    return argv, env


def seed_command() -> tuple[list[str], dict[str, str]]:
    """The seed's block, evaluated by bash: its variables, exports and exec'd argv."""
    lines = SEED_BLOCK.read_text().splitlines()
    keep = [
        ln
        for ln in lines
        if re.match(r"^(repo|runtime|model)=", ln) or ln.startswith(("export ", "set "))
    ]
    start = lines.index("args=(")
    keep += lines[start : lines.index(")", start) + 1]
    keep.append(next(ln for ln in lines if ln.startswith("exec ")))
    return bash_eval("\n".join(keep))


def v620(name: str = "v620-tp4") -> profiles.Resolved:
    return profiles.resolve(profiles.load(name), PARAMS, BUILTINS)


def test_the_kept_block_is_the_seeds_own_text() -> None:
    if not SEED_FILE.is_file():
        pytest.skip(f"{SEED_FILE} is not on this machine; the kept copy is compared instead")
    body = SEED_BLOCK.read_text().split("\n", 2)[2]
    assert body in SEED_FILE.read_text()


def test_v620_tp4_renders_the_seeds_command_variable_by_variable() -> None:
    _, seed_env = seed_command()
    ours = v620()
    assert len(seed_env) == 42
    for name, value in seed_env.items():
        assert ours.env.get(name) == value, name
    assert set(ours.env) == set(seed_env)
    assert list(ours.env) == list(_export_order())


def _export_order() -> list[str]:
    return re.findall(r"^export (\w+)=", SEED_BLOCK.read_text(), re.M)


def test_v620_tp4_renders_the_seeds_command_argument_by_argument() -> None:
    seed_argv, _ = seed_command()
    ours = list(v620().argv)
    assert len(ours) == len(seed_argv)
    for i, (mine, theirs) in enumerate(zip(ours, seed_argv, strict=True)):
        assert mine == theirs, f"argument {i}: {mine!r} != {theirs!r}"


def test_rendered_shell_block_runs_the_same_command() -> None:
    res = v620()
    spec = LaunchSpec("v620-tp4-git", res.argv, res.env, Path(res.cwd), SHA)
    argv, env = bash_eval(render_mod.shell(spec, "v620-tp4"))
    assert argv == list(res.argv)
    assert env == dict(res.env)


def test_piecewise_variant_states_only_the_difference() -> None:
    text = (profiles.shipped_dir() / "v620-tp4-piecewise.toml").read_text()
    assert "[env]" not in text
    base, piece = v620().argv, v620("v620-tp4-piecewise").argv
    differ = [i for i, (a, b) in enumerate(zip(base, piece, strict=True)) if a != b]
    assert len(differ) == 1
    assert base[differ[0] - 1] == "--compilation-config"
    assert json.loads(piece[differ[0]]) == {
        "mode": 3,
        "cudagraph_mode": "FULL_AND_PIECEWISE",
        "cudagraph_capture_sizes": [3, 6, 12],
    }
    assert v620("v620-tp4-piecewise").env == v620().env


def test_unit_has_the_seeds_limits() -> None:
    prof = profiles.load("v620-tp4")
    res = v620()
    spec = LaunchSpec("v620-tp4-git", res.argv, res.env, Path(res.cwd), SHA, limits=prof.unit)
    lines = render_mod.unit(spec).splitlines()
    for line in (
        "MemoryMax=236223201280",
        "MemorySwapMax=0",
        "KillMode=control-group",
        "Restart=on-failure",
    ):
        assert line in lines


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


BASE = """
[profile]
engine = "vllm"
[launch]
interpreter = "/usr/bin/python3"
module = "vllm.entrypoints.openai.api_server"
[env]
A = "1"
[args]
port = "{port}"
"""


def test_typo_in_a_key_names_file_line_and_suggestion(tmp_path: Path) -> None:
    bad = write(tmp_path / "p.toml", BASE.replace("module =", "modul ="))
    with pytest.raises(ConfigError, match=r"p\.toml:6: unknown key 'modul'.*did you mean 'module'"):
        profiles.load(str(bad))


def test_malformed_json_argument_names_file_and_line(tmp_path: Path) -> None:
    bad = write(
        tmp_path / "p.toml",
        BASE + 'compilation-config = \'{"mode":0, "cudagraph_mode":"FULL",}\'\n',
    )
    with pytest.raises(ConfigError, match=r"p\.toml:11: --compilation-config is not valid JSON"):
        profiles.load(str(bad))


def test_variable_set_twice_by_two_includes(tmp_path: Path) -> None:
    write(tmp_path / "a.toml", BASE)
    write(tmp_path / "b.toml", '[env]\nA = "2"\n')
    top = write(tmp_path / "top.toml", '[profile]\ninclude = ["a.toml", "b.toml"]\n')
    with pytest.raises(ConfigError) as err:
        profiles.load(str(top))
    text = str(err.value)
    # A is no allowlisted tuning variable: its values stay out of the message
    assert "A is set twice with different values: <a value not shown" in text
    assert "'1'" not in text
    assert "a.toml:8" in text
    assert "b.toml:2" in text
    # the including file decides, and then it holds
    write(top, '[profile]\ninclude = ["a.toml", "b.toml"]\n[env]\nA = "3"\n')
    assert profiles.load(str(top)).env["A"] == "3"


def test_include_cycle(tmp_path: Path) -> None:
    write(
        tmp_path / "a.toml", '[profile]\ninclude = ["b.toml"]\n[launch]' + BASE.split("[launch]")[1]
    )
    write(tmp_path / "b.toml", '[profile]\ninclude = ["a.toml"]\n')
    with pytest.raises(ConfigError, match="include cycle: a.toml → b.toml → a.toml"):
        profiles.load(str(tmp_path / "a.toml"))


def test_unknown_placeholder_and_missing_parameters(tmp_path: Path) -> None:
    bad = write(
        tmp_path / "p.toml",
        BASE.replace('A = "1"', 'A = "{runtme}/x"') + '[params]\nruntime = "/r"\n',
    )
    with pytest.raises(ConfigError, match=r"p\.toml:8: unknown placeholder \{runtme\}.*'runtime'"):
        profiles.resolve(profiles.load(str(bad)), {}, BUILTINS)
    with pytest.raises(ConfigError, match="needs the parameter\\(s\\) runtime, model"):
        profiles.resolve(profiles.load("v620-tp4"), {}, BUILTINS)
    with pytest.raises(ConfigError, match="has no parameter 'modle'.*'model'"):
        profiles.resolve(profiles.load("v620-tp4"), {**PARAMS, "modle": "/m"}, BUILTINS)


def test_argument_with_dashes_and_unknown_table(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="without dashes"):
        profiles.load(str(write(tmp_path / "p.toml", BASE + '"--port" = "1"\n')))
    with pytest.raises(ConfigError, match="unknown table \\[arg\\].*'args'"):
        profiles.load(str(write(tmp_path / "q.toml", BASE + "[arg]\nx = 1\n")))


def test_false_removes_an_argument_and_objects_merge(tmp_path: Path) -> None:
    write(
        tmp_path / "a.toml",
        BASE
        + 'enforce-eager = true\nspeculative-config = { method = "mtp", num_speculative_tokens = 2 }\n',
    )
    top = write(
        tmp_path / "top.toml",
        '[profile]\ninclude = ["a.toml"]\n[args]\nenforce-eager = false\n'
        "speculative-config = { num_speculative_tokens = 1 }\n",
    )
    res = profiles.resolve(profiles.load(str(top)), {}, BUILTINS)
    assert "--enforce-eager" not in res.argv
    spec_arg = res.argv[res.argv.index("--speculative-config") + 1]
    assert json.loads(spec_arg) == {"method": "mtp", "num_speculative_tokens": 1}


def service_config(
    tmp_path: Path, extra: str = "", env: str = "", profile: str = "v620-tp4"
) -> config.Config:
    text = f"""
[stack]
remote = "/srv/stack.git"
[host]
root = "{tmp_path}/host"
[service]
port = 8080
profile = "{profile}"
{extra}
[service.params]
runtime = "{RUNTIME}"
model = "{MODEL}"
[service.env]
{env}
"""
    return config.parse(text, environ={}, path=str(tmp_path / "servegate.toml"))


def test_service_env_conflicting_with_the_profile_is_an_error(tmp_path: Path) -> None:
    cfg = service_config(tmp_path, env='HF_HUB_OFFLINE = "0"')
    with pytest.raises(ConfigError, match="HF_HUB_OFFLINE is set twice.*v620-tp4.toml:\\d+"):
        launch_spec(cfg, Path(REPO), SHA)
    cfg = service_config(tmp_path, env='EXTRA = "yes"')
    assert launch_spec(cfg, Path(REPO), SHA).env["EXTRA"] == "yes"


def test_command_and_profile_together_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="either command or profile — not both"):
        service_config(tmp_path, extra='command = ["python"]')


def test_compile_caches_are_keyed_by_config_and_release(tmp_path: Path) -> None:
    cfg = service_config(tmp_path)
    one = launch_spec(cfg, Path(REPO), SHA)
    again = launch_spec(cfg, Path(REPO), SHA)
    assert one.cache_key
    assert one.cache_key == again.cache_key  # a rollback finds its warm cache
    assert one.env["TORCHINDUCTOR_CACHE_DIR"] == f"{REPO}/cache/inductor/{one.cache_key}"
    assert one.env["TRITON_CACHE_DIR"] == f"{REPO}/cache/triton/{one.cache_key}"
    assert one.env["VLLM_CACHE_ROOT"] == f"{REPO}/cache/vllm/{one.cache_key}"
    other_sha = launch_spec(cfg, Path(REPO), "f" * 40)
    assert other_sha.cache_key != one.cache_key
    piece = launch_spec(service_config(tmp_path, profile="v620-tp4-piecewise"), Path(REPO), SHA)
    assert piece.cache_key != one.cache_key
    assert cache_key(one) == cache_key(LaunchSpec(**{**one.__dict__, "env": dict(one.env)}))


def test_without_a_profile_caches_go_under_the_host_root(tmp_path: Path) -> None:
    text = f"""
[stack]
remote = "/srv/stack.git"
[host]
root = "{tmp_path}/host"
[service]
port = 8080
command = ["python", "-m", "vllm.entrypoints.openai.api_server", "--compilation-config", '{{"mode":3}}']
"""
    spec = launch_spec(config.parse(text, environ={}), Path("/r"), SHA)
    assert (
        spec.env["TORCHINDUCTOR_CACHE_DIR"]
        == f"{tmp_path}/host/compile-cache/{spec.cache_key}/inductor"
    )
    assert spec.args["compilation-config"] == {"mode": 3}
    off = config.parse(
        text.replace("port = 8080", "port = 8080\ncompile_cache = false"), environ={}
    )
    assert "TORCHINDUCTOR_CACHE_DIR" not in launch_spec(off, Path("/r"), SHA).env


def test_an_openai_engine_profile_with_an_executable(tmp_path: Path) -> None:
    """Any OpenAI-compatible server: an executable with positional arguments; no vLLM
    compile caches, no vLLM variable list."""
    write(
        tmp_path / "llama.toml",
        '[profile]\nengine = "openai"\nrequired = ["model"]\n[params]\nmodel = ""\n'
        '[launch]\nexecutable = "/opt/llama.cpp/llama-server"\npositional = []\n'
        '[env]\nVLLM_NOT_READ = "1"\n[args]\nmodel = "{model}"\nport = "{port}"\nctx-size = 16384\n',
    )
    text = f"""
[stack]
remote = "/srv/stack.git"
[host]
root = "{tmp_path}/host"
[service]
port = 8081
profile = "llama.toml"
[service.params]
model = "/models/q.gguf"
"""
    cfg = config.parse(text, environ={}, path=str(tmp_path / "servegate.toml"))
    spec = launch_spec(cfg, Path("/r"), SHA)
    assert spec.argv == (
        "/opt/llama.cpp/llama-server", "--model", "/models/q.gguf", "--port", "8081",
        "--ctx-size", "16384",
    )  # fmt: skip
    assert spec.engine == "openai"
    assert spec.cache_key == ""
    assert "TORCHINDUCTOR_CACHE_DIR" not in spec.env
    from servegate.engine import lint, rules

    found = {f.rule for f in lint.lint(spec, rules.load(), tmp_path)}
    assert "env.unknown-vllm" not in found
