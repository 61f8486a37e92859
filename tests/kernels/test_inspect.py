"""GPU code objects read from libraries really built with Debian's hipcc for gfx1030."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import pytest

from servegate import config
from servegate.archs import check_arch_names
from servegate.cli import main
from servegate.errors import BuildFailed, ConfigError
from servegate.kernels.inspect import inspect, require_archs

STACK = resources.files("servegate.demo") / "stack"
needs_hipcc = pytest.mark.skipif(
    shutil.which("hipcc") is None, reason="hipcc not installed (apt-get install hipcc)"
)


def build(tmp_path: Path, *archs: str) -> Path:
    for item in (STACK / "kernels").iterdir():
        (tmp_path / item.name).write_text(item.read_text())
    src = tmp_path / "demo_kernels.hip"
    out = tmp_path / f"lib-{'-'.join(archs)}.so"
    flags = [f"--offload-arch={a}" for a in archs]
    subprocess.run(
        ["hipcc", *flags, "-fPIC", "-shared", str(src), "-o", str(out)],
        check=True,
        env=dict(os.environ, HIP_PLATFORM="amd"),
    )
    return out


@needs_hipcc
def test_lists_each_built_arch(tmp_path: Path) -> None:
    lib = build(tmp_path, "gfx1030", "gfx90a")
    objects = inspect(lib)
    assert sorted(o.arch for o in objects) == ["gfx1030", "gfx90a"]
    assert all(o.vendor == "amd" and o.size > 0 for o in objects)
    listed = subprocess.run(["roc-obj-ls", str(lib)], capture_output=True, text=True, check=True)
    for o in objects:
        assert o.triple in listed.stdout


@needs_hipcc
def test_missing_arch_fails_the_build(tmp_path: Path) -> None:
    lib = build(tmp_path, "gfx90a")
    with pytest.raises(BuildFailed, match="holds no code for gfx1030"):
        require_archs(lib, ("gfx1030",))


@needs_hipcc
def test_inspect_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lib = build(tmp_path, "gfx1030")
    assert main(["inspect", str(lib), "--arch", "gfx1030"]) == 0
    assert "gfx1030" in capsys.readouterr().out
    assert main(["inspect", str(lib), "--arch", "gfx942", "--json"]) == 5
    doc = json.loads(capsys.readouterr().out)
    assert doc["result"][str(lib)]["missing"] == ["gfx942"]


def test_host_only_library_has_no_gpu_code(tmp_path: Path) -> None:
    src = tmp_path / "k.c"
    src.write_text("int k(void) { return 1; }\n")
    lib = tmp_path / "libk.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    assert inspect(lib) == []
    with pytest.raises(BuildFailed, match="no GPU code at all"):
        require_archs(lib, ("gfx1030",))


def test_arch_names_that_do_not_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    check_arch_names(("gfx1030", "sm_90", "gfx90a:xnack-"))
    with pytest.raises(ConfigError, match="'gfx1300' does not exist"):
        check_arch_names(("gfx1300",))
    with pytest.raises(ConfigError, match="does not exist"):
        config.parse(
            '[stack]\nremote="r"\n[host]\nroot="/r"\n[service]\nport=1\ncommand=["x"]\n'
            '[build]\narchs=["gfx1030", "sm90"]\n',
            environ={},
        )
    not_elf = tmp_path / "notes.txt"
    not_elf.write_text("hello")
    assert main(["inspect", str(not_elf)]) == 2
    assert "not a 64-bit little-endian ELF" in capsys.readouterr().err
