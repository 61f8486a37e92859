"""servegate build: real hipcc and CMake builds, and the cache that skips them."""

from __future__ import annotations

import json
import os
import shutil
from importlib import resources
from pathlib import Path

import pytest

from servegate import config
from servegate.cli import main
from servegate.errors import BuildFailed
from servegate.kernels.targets import build_all

STACK = resources.files("servegate.demo") / "stack"
needs_hipcc = pytest.mark.skipif(
    shutil.which("hipcc") is None, reason="hipcc not installed (apt-get install hipcc)"
)

BASE = '[stack]\nremote = "x"\n[host]\nroot = "/x"\n[service]\nport = 1\ncommand = ["x"]\n'
HIP_TARGET = """
[build]
archs = [{archs}]
[[build.targets]]
name = "demo_kernels"
kind = "hipcc"
sources = ["kernels/*.hip", "kernels/*.h"]
output = "build/libdemo_kernels.so"
flags = [{flags}]
"""


def hip_config(archs: str = '"gfx1030"', flags: str = '"-O2"') -> config.Config:
    return config.parse(BASE + HIP_TARGET.format(archs=archs, flags=flags), environ={})


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    root = tmp_path / "stack"
    (root / "kernels").mkdir(parents=True)
    (root / "build").mkdir()
    for item in (STACK / "kernels").iterdir():
        (root / "kernels" / item.name).write_text(item.read_text())
    return root


@needs_hipcc
def test_cache_hit_then_rebuild_on_each_kind_of_change(checkout: Path, tmp_path: Path) -> None:
    cache, env, logs = tmp_path / "cache", dict(os.environ), tmp_path / "logs"
    (cold,) = build_all(hip_config(), checkout, cache, env, logs)
    assert not cold.cached
    assert cold.reason == "no earlier build of this target"
    assert "gfx1030" in {o["arch"] for objs in cold.code_objects.values() for o in objs}
    assert any("--offload-arch=gfx1030" in c for c in cold.commands[0])
    (checkout / "build" / "libdemo_kernels.so").unlink()
    (hit,) = build_all(hip_config(), checkout, cache, env, logs)
    assert hit.cached
    assert hit.commands == []
    assert hit.outputs == cold.outputs
    assert (checkout / "build" / "libdemo_kernels.so").exists()
    header = checkout / "kernels" / "version.h"
    header.write_text(header.read_text().replace("VERSION 1", "VERSION 5"))
    (changed,) = build_all(hip_config(), checkout, cache, env, logs)
    assert changed.reason == "changed: sources (kernels/version.h)"
    (flags,) = build_all(hip_config(flags='"-O3"'), checkout, cache, env, logs)
    assert flags.reason == "changed: recipe"
    (archs,) = build_all(
        hip_config(archs='"gfx1030", "gfx90a"', flags='"-O3"'), checkout, cache, env, logs
    )
    assert archs.reason == "changed: archs"
    assert {"gfx1030", "gfx90a"} <= {
        o["arch"] for objs in archs.code_objects.values() for o in objs
    }


@needs_hipcc
def test_build_command_reports_and_caches(
    checkout: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = checkout / "servegate.toml"
    path.write_text(BASE + HIP_TARGET.format(archs='"gfx1030"', flags='"-O2"'))
    args = [
        "build",
        "--config",
        str(path),
        "--dir",
        str(checkout),
        "--cache-dir",
        str(tmp_path / "c"),
        "--json",
    ]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)["result"]["targets"][0]
    assert main(args) == 0
    second = json.loads(capsys.readouterr().out)["result"]["targets"][0]
    assert (first["cached"], second["cached"]) == (False, True)
    assert second["toolchain"]["hipcc"].startswith("HIP version")


def test_missing_compiler_says_what_to_install(checkout: Path, tmp_path: Path) -> None:
    with pytest.raises(BuildFailed, match="hipcc is not installed") as err:
        build_all(hip_config(), checkout, None, {"PATH": str(tmp_path)}, tmp_path / "logs")
    assert "apt-get install hipcc" in err.value.hint


def test_sources_that_match_nothing(checkout: Path, tmp_path: Path) -> None:
    shutil.rmtree(checkout / "kernels")
    if shutil.which("hipcc") is None:
        pytest.skip("hipcc not installed")
    with pytest.raises(BuildFailed, match="no file matches"):
        build_all(hip_config(), checkout, None, dict(os.environ), tmp_path / "logs")


CMAKE = """
[build]
jobs = 2
[[build.targets]]
name = "ext"
kind = "cmake"
sources = ["CMakeLists.txt", "src/*.c"]
outputs = ["build/*.so"]
"""


def cmake_checkout(tmp_path: Path, lists: str) -> Path:
    root = tmp_path / "cm"
    (root / "src").mkdir(parents=True)
    (root / "src" / "ext.c").write_text("int ext(void) { return 3; }\n")
    (root / "CMakeLists.txt").write_text(lists)
    return root


def test_cmake_target_builds_with_ninja_and_caches(tmp_path: Path) -> None:
    root = cmake_checkout(
        tmp_path,
        "cmake_minimum_required(VERSION 3.20)\nproject(ext C)\nadd_library(ext SHARED src/ext.c)\n",
    )
    cfg = config.parse(BASE + CMAKE, environ={})
    (built,) = build_all(cfg, root, tmp_path / "cache", dict(os.environ), tmp_path / "logs")
    assert list(built.outputs) == ["build/libext.so"]
    assert built.commands[0][:2] == ["cmake", "-S"]
    assert "Ninja" in built.commands[0]
    assert built.commands[1][-2:] == ["-j", "2"]
    shutil.rmtree(root / "build")
    (again,) = build_all(cfg, root, tmp_path / "cache", dict(os.environ), tmp_path / "logs")
    assert again.cached
    assert (root / "build" / "libext.so").exists()


def test_cmake_failure_shows_the_tail_and_keeps_the_log(tmp_path: Path) -> None:
    root = cmake_checkout(
        tmp_path,
        "cmake_minimum_required(VERSION 3.20)\nproject(ext C)\n"
        "add_library(ext SHARED src/missing.c)\n",
    )
    cfg = config.parse(BASE + CMAKE, environ={})
    with pytest.raises(BuildFailed) as err:
        build_all(cfg, root, None, dict(os.environ), tmp_path / "logs")
    text = str(err.value)
    assert "building ext failed" in text
    assert "missing.c" in text
    log = tmp_path / "logs" / "ext.log"
    assert f"full log: {log}" in text
    assert "missing.c" in log.read_text()


def test_libraries_go_after_the_sources_and_a_flags_argument_stays_with_it() -> None:
    """A static library's code is taken only for objects before it; a word that is
    another flag's argument (``-Xlinker -lsc``) is not moved away from it."""
    from servegate.kernels.recipes import split_libraries

    flags = ("-O2", "-Xlinker", "-lsc", "-lm", "/x/libz.a", "-Wl,-lfoo", "-L", "lib.a")
    assert split_libraries(flags) == (
        ["-O2", "-Xlinker", "-lsc", "-L", "lib.a"],
        ["-lm", "/x/libz.a", "-Wl,-lfoo"],
    )


def test_an_arch_of_the_other_vendor_is_refused_by_name() -> None:
    """`build --arch sm_90` on a hipcc target used to fail the compile and say "fix the
    sources": the sources are fine, the arch is another vendor's."""
    from servegate.config import KernelTarget
    from servegate.errors import ConfigError
    from servegate.kernels.recipes import compiler

    hip = KernelTarget(name="k", kind="hipcc", sources=("k.hip",), output="k.so")
    with pytest.raises(ConfigError, match="target k is built with hipcc .* sm_90"):
        compiler(hip, ("sm_90",))
    assert compiler(hip, ("gfx1030",)) == "hipcc"
    cuda = KernelTarget(name="c", kind="nvcc", sources=("c.cu",), output="c.so")
    with pytest.raises(ConfigError, match="built with nvcc"):
        compiler(cuda, ("gfx1030",))
