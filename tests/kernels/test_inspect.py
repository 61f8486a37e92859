"""GPU code objects read from libraries really built with Debian's hipcc for gfx1030 (and
with nvcc where it is installed)."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
from importlib import resources
from pathlib import Path

import pytest

from servegate import config
from servegate.archs import check_arch_names
from servegate.cli import main
from servegate.errors import BuildFailed, ConfigError
from servegate.kernels.inspect import BUNDLE_MAGIC, inspect, require_archs

STACK = resources.files("servegate.demo") / "stack"
needs_hipcc = pytest.mark.skipif(
    shutil.which("hipcc") is None, reason="hipcc not installed (apt-get install hipcc)"
)
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
#: a second translation unit beside the demo kernels
SECOND_TU = """#include "portable.h"
__global__ void twice(float* y) { y[0] *= 2; }
extern "C" void launch_twice(float* y) { twice<<<1, 1>>>(y); }
"""


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


def link(tmp_path: Path, compiler: list[str], *arch_flags: list[str]) -> Path:
    """A library of the demo kernels and a second translation unit, each compiled on its
    own with its own arch flags (as a build with a prebuilt object or per-file flags)."""
    for item in (STACK / "kernels").iterdir():
        (tmp_path / item.name).write_text(item.read_text())
    (tmp_path / "second.hip").write_text(SECOND_TU)
    env = dict(os.environ, HIP_PLATFORM="amd")
    objects = []
    for src, flags in zip(["demo_kernels.hip", "second.hip"], arch_flags, strict=True):
        obj = tmp_path / f"{src}-{'-'.join(flags)}.o"
        pic = ["-Xcompiler", "-fPIC", "-x", "cu"] if compiler[0] == "nvcc" else ["-fPIC"]
        cmd = [*compiler, *flags, *pic, "-c", str(tmp_path / src), "-o", str(obj)]
        subprocess.run(cmd, check=True, env=env)
        objects.append(str(obj))
    out = tmp_path / f"lib-{len(list(tmp_path.glob('*.so')))}.so"
    subprocess.run([*compiler, "-shared", *objects, "-o", str(out)], check=True, env=env)
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


@needs_hipcc
def test_every_bundle_must_hold_the_arch(tmp_path: Path) -> None:
    """A kernel runs from its own translation unit's bundle: the other bundles' code for
    gfx1030 does not help it."""
    both = link(tmp_path, ["hipcc"], ["--offload-arch=gfx1030"], ["--offload-arch=gfx1030"])
    assert [o.arch for o in require_archs(both, ("gfx1030",))] == ["gfx1030", "gfx1030"]
    mixed = link(tmp_path, ["hipcc"], ["--offload-arch=gfx1030"], ["--offload-arch=gfx900"])
    assert sorted(o.arch for o in inspect(mixed)) == ["gfx1030", "gfx900"]
    with pytest.raises(BuildFailed) as failed:
        require_archs(mixed, ("gfx1030",))
    second = next(o.container for o in inspect(mixed) if o.arch == "gfx900")
    assert second > 0
    assert (
        f"the .hip_fatbin bundle at offset {second} holds no code for gfx1030 (it has: gfx900)"
        in str(failed.value)
    )


@needs_nvcc
def test_every_fatbin_must_hold_the_arch(tmp_path: Path) -> None:
    """The same for NVIDIA: one fatbin per translation unit. nvcc's own kernel-less link
    module (built for the link's default arch) needs no arch."""
    both = link(tmp_path, ["nvcc"], ["-arch=sm_90"], ["-arch=sm_90"])
    require_archs(both, ("sm_90",))
    mixed = link(tmp_path, ["nvcc"], ["-arch=sm_90"], ["-arch=sm_80"])
    second = next(o.container for o in inspect(mixed) if o.arch == "sm_80")
    with pytest.raises(BuildFailed) as failed:
        require_archs(mixed, ("sm_90",))
    assert f"the .nv_fatbin fatbin at offset {second} holds no code for sm_90" in str(failed.value)


def fake_bundle_library(tmp_path: Path, code: bytes) -> Path:
    """A host library (cc, no GPU compiler) whose .hip_fatbin section holds one hand-made
    offload bundle claiming ``code`` is a gfx1030 code object."""
    host, triple = b"host-x86_64-unknown-linux", b"hipv4-amdgcn-amd-amdhsa--gfx1030"
    header = len(BUNDLE_MAGIC) + 8 + 2 * 24 + len(host) + len(triple)
    bundle = BUNDLE_MAGIC + struct.pack("<Q", 2)
    bundle += struct.pack("<QQQ", header, 0, len(host)) + host
    bundle += struct.pack("<QQQ", header, len(code), len(triple)) + triple + code
    src = tmp_path / "fake.c"
    src.write_text(
        'static const unsigned char fat[] __attribute__((section(".hip_fatbin"), used)) = {'
        + ",".join(map(str, bundle))
        + "};\nint f(void) { return 1; }\n"
    )
    lib = tmp_path / f"fake-{len(code)}.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


def test_an_empty_or_foreign_code_object_is_no_code(tmp_path: Path) -> None:
    """A bundle header that names gfx1030 is not code for it: the entry must be a
    non-empty AMDGPU ELF (e_machine 224)."""
    empty = fake_bundle_library(tmp_path, b"")
    (obj,) = inspect(empty)
    assert (obj.arch, obj.problem) == ("gfx1030", "empty")
    with pytest.raises(BuildFailed, match=r"holds no code that runs \(it has: gfx1030 \(not"):
        require_archs(empty, ("gfx1030",))
    host_elf = fake_bundle_library(tmp_path, empty.read_bytes())  # an x86-64 ELF
    (obj,) = inspect(host_elf)
    assert obj.problem == "an ELF for machine 62, not 224"
    with pytest.raises(BuildFailed, match="not counted: an ELF for machine 62"):
        require_archs(host_elf, ("gfx1030",))


@needs_hipcc
def test_target_features_must_agree(tmp_path: Path) -> None:
    """AMD target IDs: code for gfx90a:xnack+ runs only with xnack on; code for plain
    gfx90a runs with either; a plain required gfx90a needs both settings covered."""
    on = build(tmp_path, "gfx90a:xnack+")
    require_archs(on, ("gfx90a:xnack+",))
    with pytest.raises(
        BuildFailed, match=r"holds no code for gfx90a:xnack- \(it has: gfx90a:xnack\+\)"
    ):
        require_archs(on, ("gfx90a:xnack-",))
    with pytest.raises(BuildFailed, match="holds no code for gfx90a:xnack-"):
        require_archs(on, ("gfx90a",))
    both = build(tmp_path, "gfx90a:xnack+", "gfx90a:xnack-")
    require_archs(both, ("gfx90a", "gfx90a:xnack-", "gfx90a:xnack+"))
    sramecc_on = build(tmp_path, "gfx90a:sramecc+:xnack-", "gfx90a:xnack+")
    with pytest.raises(BuildFailed, match="holds no code for gfx90a:sramecc-:xnack-"):
        require_archs(sramecc_on, ("gfx90a:xnack-",))
    any_xnack = build(tmp_path, "gfx90a")
    require_archs(any_xnack, ("gfx90a", "gfx90a:xnack-", "gfx90a:xnack+"))


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


def relabel(lib: Path, old: str, new: str) -> Path:
    """The library with each offload bundle label naming ``old`` made to name ``new``
    (of the same length): a hostile or broken build step's bundle."""
    assert len(old) == len(new)
    data = lib.read_bytes()
    label = f"amdgcn-amd-amdhsa--{old}".encode()
    assert label in data
    out = lib.with_name(f"relabelled-{new.replace(':', '_')}.so")
    out.write_bytes(data.replace(label, f"amdgcn-amd-amdhsa--{new}".encode()))
    return out


@needs_hipcc
@pytest.mark.parametrize(
    ("built", "labelled", "why"),
    [
        ("gfx1031", "gfx1030", "its ELF header says gfx1031, not gfx1030"),
        ("gfx906", "gfx908", "its ELF header says gfx906, not gfx908"),
        ("gfx90a:xnack+", "gfx90a:xnack-", "says gfx90a:xnack+, not gfx90a:xnack-"),
    ],
)
def test_a_bundle_label_must_agree_with_its_elf_header(
    tmp_path: Path, built: str, labelled: str, why: str
) -> None:
    """Code built for one GPU under a label that names another passes the loader's match
    and then runs on the wrong GPU: inspect reads the processor and the xnack/sramecc
    settings from the code object's e_flags, not only from its label."""
    lib = build(tmp_path, built)
    require_archs(lib, (built,))
    lied = relabel(lib, built, labelled)
    (obj,) = inspect(lied)
    assert obj.arch == labelled
    assert why in obj.problem
    with pytest.raises(BuildFailed, match=f"not counted: .*{re.escape(why)}"):
        require_archs(lied, (labelled,))


@needs_hipcc
def test_labels_of_honest_builds_agree_with_their_headers(tmp_path: Path) -> None:
    lib = build(tmp_path, "gfx1030", "gfx90a:xnack-", "gfx90a:sramecc+:xnack+", "gfx906")
    objects = inspect(lib)
    assert {o.arch for o in objects} == {"gfx1030", "gfx90a:xnack-", "gfx90a:sramecc+:xnack+",
                                         "gfx906"}  # fmt: skip
    assert [o.problem for o in objects] == ["", "", "", ""]


def nv_build(tmp_path: Path, arch: str, *flags: str) -> Path:
    """The demo kernels built by nvcc for one arch (``flags``: compression …)."""
    for item in (STACK / "kernels").iterdir():
        (tmp_path / item.name).write_text(item.read_text())
    out = tmp_path / f"nv-{arch}-{len(list(tmp_path.glob('*.so')))}.so"
    num = arch.removeprefix("sm_")
    subprocess.run(["nvcc", "-gencode", f"arch=compute_{num},code=sm_{num}", "-Xcompiler",
                    "-fPIC", "-shared", *flags, "-x", "cu", str(tmp_path / "demo_kernels.hip"),
                    "-o", str(out)], check=True)  # fmt: skip
    return out


def nv_entries(data: bytes) -> list[tuple[int, int, int, int]]:
    """(offset, arch, flags, payload offset) of every fatbin entry in a library's bytes."""
    found, pos = [], 0
    while (pos := data.find(struct.pack("<I", 0xBA55ED50), pos)) >= 0:
        _magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", data, pos)
        entry, end = pos + header_size, pos + header_size + fat_size
        while entry + 64 <= end and struct.unpack_from("<I", data, entry + 4)[0]:
            _kind, _u, header, size = struct.unpack_from("<HHIQ", data, entry)
            (arch,) = struct.unpack_from("<I", data, entry + 28)
            (flags,) = struct.unpack_from("<Q", data, entry + 40)
            found.append((entry, arch, flags, entry + header))
            entry += header + size
        pos = end
    return found


def nv_relabel(lib: Path, old: int, new: int) -> Path:
    """The library with each fatbin entry for ``sm_old`` labelled ``sm_new``."""
    data = bytearray(lib.read_bytes())
    for entry, arch, _flags, _payload in nv_entries(bytes(data)):
        if arch == old:
            struct.pack_into("<I", data, entry + 28, new)
    out = lib.with_name(f"relabelled-{lib.name}")
    out.write_bytes(bytes(data))
    return out


@needs_nvcc
@pytest.mark.parametrize("compression", [[], ["-Xfatbin", "-compress-all"]],
                         ids=["plain", "compressed"])  # fmt: skip
def test_a_fatbin_label_must_agree_with_its_elf_header(
    tmp_path: Path, compression: list[str]
) -> None:
    """sm_80 code labelled sm_90 would pass a check of labels and then fail to load (or
    load the PTX JIT path) on the H100/H200 it was meant for: the SM in the cubin's
    e_flags must be the entry's arch, compressed entries (decompressed) included."""
    lib = nv_build(tmp_path, "sm_80", *compression)
    assert bool(nv_entries(lib.read_bytes())[0][2] & 0x8000) == bool(compression)
    require_archs(lib, ("sm_80",))
    lied = nv_relabel(lib, 80, 90)
    objects = [o for o in inspect(lied) if o.arch == "sm_90" and o.functions is not None]
    assert objects, inspect(lied)
    assert any("its ELF header says sm_80, not sm_90" in o.problem for o in objects)
    with pytest.raises(BuildFailed, match="not counted: .*says sm_80, not sm_90"):
        require_archs(lied, ("sm_90",))


@needs_nvcc
def test_a_compressed_entry_is_read_and_a_damaged_one_is_no_code(tmp_path: Path) -> None:
    lib = nv_build(tmp_path, "sm_90", "-Xfatbin", "-compress-all")
    require_archs(lib, ("sm_90",))
    assert [o.problem for o in inspect(lib)] == ["", ""]
    data = bytearray(lib.read_bytes())
    for _entry, _arch, flags, payload in nv_entries(bytes(data)):
        assert flags & 0x8000
        data[payload + 8 : payload + 24] = b"\xff" * 16  # inside the zstd frame
    damaged = lib.with_name("damaged.so")
    damaged.write_bytes(bytes(data))
    assert all("does not decompress" in o.problem for o in inspect(damaged))
    with pytest.raises(BuildFailed):
        require_archs(damaged, ("sm_90",))
