"""The build cache against a hostile neighbour and against inputs its globs miss: a cache
hit must mean the library is what compiling this checkout would give. Real hipcc builds
of a small gfx1030 extension; the neighbour is another uid (root can hand it files)."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from servegate import config
from servegate.kernels.targets import TargetResult, build_all
from servegate.pipeline.hashing import sha256_file

pytestmark = pytest.mark.skipif(
    shutil.which("hipcc") is None, reason="hipcc not installed (apt-get install hipcc)"
)
NOBODY = 65534
BASE = '[stack]\nremote = "x"\n[host]\nroot = "/x"\n[service]\nport = 1\ncommand = ["x"]\n'
TARGET = """
[build]
archs = ["gfx1030"]
{env}
[[build.targets]]
name = "k"
kind = "hipcc"
sources = ["kernels/*.hip"]
output = "build/libk.so"
flags = ["-O2"]
"""
SOURCE = """#include <hip/hip_runtime.h>
#include "detail/sign.h"
__global__ void axpy(float a, const float* x, float* y) { y[threadIdx.x] SIGN a * x[threadIdx.x]; }
extern "C" int k_version() { return 1; }
"""


def cfg(env: str = "") -> config.Config:
    return config.parse(BASE + TARGET.format(env=env), environ={})


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    return make_checkout(tmp_path)


def make_checkout(tmp_path: Path) -> Path:
    """kernels/k.hip including kernels/detail/sign.h, under ``tmp_path``/stack."""
    root = tmp_path / "stack"
    (root / "kernels" / "detail").mkdir(parents=True)
    (root / "kernels" / "k.hip").write_text(SOURCE)
    (root / "kernels" / "detail" / "sign.h").write_text("#define SIGN +=\n")
    return root


def build(checkout: Path, cache: Path, c: config.Config | None = None, **env: str) -> TargetResult:
    environ = {**os.environ, **env}
    (result,) = build_all(c or cfg(), checkout, cache, environ, checkout.parent / "logs")
    return result


def library(checkout: Path) -> str:
    return sha256_file(checkout / "build" / "libk.so")


def test_inputs_the_globs_miss_still_key_the_cache(checkout: Path, tmp_path: Path) -> None:
    """A header the sources globs do not name, the compiler's environment and build.env
    each change the library; none of them may be answered by a cache hit."""
    cache = tmp_path / "cache"
    assert not build(checkout, cache).cached
    assert build(checkout, cache).cached
    plus = library(checkout)

    (checkout / "kernels" / "detail" / "sign.h").write_text("#define SIGN -=\n")
    minus = build(checkout, cache)
    assert not minus.cached
    assert minus.reason == "changed: includes (kernels/detail/sign.h)"
    assert library(checkout) != plus

    flags = build(checkout, cache, HIPCC_COMPILE_FLAGS_APPEND="-O0")
    assert not flags.cached
    assert flags.reason == "changed: environment (HIPCC_COMPILE_FLAGS_APPEND)"

    configured = cfg('[build.env]\nHIPCC_COMPILE_FLAGS_APPEND = "-O1"\n')
    env = build(checkout, cache, configured)
    assert not env.cached
    assert "environment (HIPCC_COMPILE_FLAGS_APPEND)" in env.reason
    # which GPUs a job may see is no change of the build
    assert build(checkout, cache, configured, HIP_VISIBLE_DEVICES="1").cached


def test_an_included_folder_reached_through_a_link_keys_the_cache(
    checkout: Path, tmp_path: Path
) -> None:
    """Python's ``**`` does not enter a linked folder; the compiler does."""
    vendor = tmp_path / "third_party"
    vendor.mkdir()
    shutil.move(checkout / "kernels" / "detail", vendor / "detail")
    (checkout / "kernels" / "detail").symlink_to(vendor / "detail")
    cache = tmp_path / "cache"
    build(checkout, cache)
    (vendor / "detail" / "sign.h").write_text("#define SIGN -=\n")
    again = build(checkout, cache)
    assert not again.cached
    assert "kernels/detail/sign.h" in again.reason


def _poison(entry: Path, outputs: dict[str, bytes]) -> None:
    """Rewrite a cache entry as a neighbour would: its files and a manifest whose hashes
    agree with them."""
    manifest = json.loads((entry / "manifest.json").read_text())
    manifest["outputs"] = {}
    for rel, data in outputs.items():
        kept = entry / "files" / rel
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_bytes(data)
        manifest["outputs"][rel] = sha256_file(kept)
    (entry / "manifest.json").write_text(json.dumps(manifest))


def _entry(cache: Path) -> Path:
    (entry,) = [p for p in cache.iterdir() if p.is_dir()]
    return entry


@pytest.mark.skipif(os.geteuid() != 0, reason="handing files to another uid needs root")
def test_a_neighbours_entry_or_cache_folder_is_never_a_cache_hit(
    checkout: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    build(checkout, cache)
    honest = library(checkout)
    entry = _entry(cache)
    evil = b"\x7fELF not what this checkout builds"
    _poison(entry, {"build/libk.so": evil})
    for path in [entry, *entry.rglob("*")]:
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    result = build(checkout, cache)
    assert not result.cached
    assert "not this user's alone" in result.reason
    assert library(checkout) == honest

    # a cache folder others may write is not read at all, nor written
    shutil.rmtree(cache)
    cache.mkdir()
    cache.chmod(0o1777)
    result = build(checkout, cache)
    assert not result.cached
    assert result.reason.startswith("cache not used: ")
    assert "chmod go-w" in result.reason
    assert list(cache.iterdir()) == []
    # nor is one below a folder others may write (without the sticky bit)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    result = build(checkout, shared / "cache")
    assert "a folder above it" in result.reason


def test_an_entry_may_restore_only_the_targets_outputs_inside_the_checkout(
    checkout: Path, tmp_path: Path
) -> None:
    """Even an entry of this user's (damaged, or written by something else running as
    this user) cannot plant an importable file, write outside the checkout, or hand
    back a file through a link: the target is compiled instead."""
    cache = tmp_path / "cache"
    build(checkout, cache)
    honest = library(checkout)
    entry = _entry(cache)
    lib = (entry / "files" / "build" / "libk.so").read_bytes()
    _poison(entry, {"build/libk.so": lib, "pkg/_hook.cpython-311-x86_64-linux-gnu.so": lib,
                    "../escaped.so": lib})  # fmt: skip
    result = build(checkout, cache)
    assert not result.cached
    assert "outputs are not the target's" in result.reason
    assert not (checkout / "pkg").exists()
    assert not (checkout.parent / "escaped.so").exists()

    build(checkout, cache)  # a fresh entry
    entry = _entry(cache)
    kept = entry / "files" / "build" / "libk.so"
    elsewhere = tmp_path / "elsewhere.so"
    elsewhere.write_bytes(kept.read_bytes())
    kept.unlink()
    kept.symlink_to(elsewhere)
    result = build(checkout, cache)
    assert not result.cached
    assert "damaged" in result.reason

    # an entry copied under another key's name answers for other inputs
    build(checkout, cache)
    (checkout / "kernels" / "detail" / "sign.h").write_text("#define SIGN -=\n")
    minus = build(checkout, cache)
    entries = sorted(p for p in cache.iterdir() if p.is_dir())
    assert len(entries) == 2
    target = next(p for p in entries if minus.key[:20] in p.name)
    other = next(p for p in entries if p != target)
    shutil.rmtree(target)
    shutil.copytree(other, target)
    result = build(checkout, cache)
    assert not result.cached
    assert "made for other inputs" in result.reason
    assert library(checkout) != honest  # compiled from this checkout: SIGN -=


def test_a_damaged_manifest_is_a_rebuild_not_a_crash(checkout: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    build(checkout, cache)
    (_entry(cache) / "manifest.json").write_text("{ not json")
    (cache / "k.last.json").write_text("[]")
    result = build(checkout, cache)
    assert not result.cached
    assert "damaged" in result.reason
    assert build(checkout, cache).cached  # the rebuild made a sound entry again


def test_servegate_build_applies_build_env_as_a_promote_does(
    checkout: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """CI's `servegate build` and a promote's build must make the same library."""
    from servegate.cli import main

    path = checkout / "servegate.toml"
    path.write_text(
        BASE
        + TARGET.format(env='[build.env]\nHIPCC_COMPILE_FLAGS_APPEND = "--offload-arch=gfx900"')
    )
    assert main(["build", "--config", str(path), "--dir", str(checkout), "--no-cache",
                 "--json"]) == 0  # fmt: skip
    (target,) = json.loads(capsys.readouterr().out)["result"]["targets"]
    archs = {o["arch"] for objs in target["code_objects"].values() for o in objs}
    assert archs == {"gfx1030", "gfx900"}


def test_device_only_headers_response_files_and_driver_variables_key_the_cache(
    checkout: Path, tmp_path: Path
) -> None:
    """What hipcc's host-side listing does not show: a header only the device side
    includes, a response file named in the flags, a clang driver variable."""
    (checkout / "kernels" / "k.hip").write_text(
        SOURCE.replace('#include "detail/sign.h"\n', '#include "detail/sign.h"\n'
                       "#if defined(__HIP_DEVICE_COMPILE__)\n#include \"detail/dev.h\"\n#endif\n")
    )  # fmt: skip
    (checkout / "kernels" / "detail" / "dev.h").write_text("#define SCALE 1.0f\n")
    (checkout / "kernels" / "opts.rsp").write_text("-DVERSION=1\n")
    flagged = config.parse(
        BASE + TARGET.format(env="").replace('flags = ["-O2"]', 'flags = ["-O2", "@kernels/opts.rsp"]'),
        environ={},
    )  # fmt: skip
    cache = tmp_path / "cache"
    build(checkout, cache, flagged)
    assert build(checkout, cache, flagged).cached
    (checkout / "kernels" / "detail" / "dev.h").write_text("#define SCALE 666.0f\n")
    device = build(checkout, cache, flagged)
    assert device.reason == "changed: includes (kernels/detail/dev.h)"
    (checkout / "kernels" / "opts.rsp").write_text("-DVERSION=666\n")
    assert build(checkout, cache, flagged).reason == "changed: includes (kernels/opts.rsp)"
    driver = build(checkout, cache, flagged, CCC_OVERRIDE_OPTIONS="+-DEVIL")
    assert driver.reason == "changed: environment (CCC_OVERRIDE_OPTIONS)"


@pytest.mark.skipif(os.geteuid() != 0, reason="a link of another uid needs root")
def test_a_cache_folder_reached_through_another_users_link_is_not_used(
    checkout: Path, tmp_path: Path
) -> None:
    real = tmp_path / "real-cache"
    real.mkdir(mode=0o700)
    link = tmp_path / "cache-link"
    link.symlink_to(real)
    os.chown(link, NOBODY, NOBODY, follow_symlinks=False)  # its owner could re-point it
    result = build(checkout, link)
    assert result.reason.startswith("cache not used: ")
    assert f"link of uid {NOBODY}" in result.reason


def _static_library(folder: Path, value: int) -> None:
    """libsc.a, outside the checkout: one C function the extension's host code calls."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sc.c").write_text(f"int sc_value(void) {{ return {value}; }}\n")
    subprocess.run(["cc", "-fPIC", "-c", "sc.c", "-o", "sc.o"], cwd=folder, check=True)
    (folder / "libsc.a").unlink(missing_ok=True)
    subprocess.run(["ar", "rcs", "libsc.a", "sc.o"], cwd=folder, check=True)


def _linked_value(checkout: Path) -> int:
    lib = ctypes.CDLL(str(checkout / "build" / "libk.so"), mode=os.RTLD_LOCAL)
    return int(lib.k_linked())


@pytest.mark.parametrize("how", ["-L", "LIBRARY_PATH", "-Wl,-l:"])
def test_a_library_linked_through_l_flags_keys_the_cache(
    checkout: Path, tmp_path: Path, how: str
) -> None:
    """A static library outside the checkout, linked with ``-L… -lsc`` (or found through
    LIBRARY_PATH, or named ``-l:libsc.a``): its code is copied into the extension, so a
    new build of it must be a rebuild, not a cache hit holding the old code."""
    vendor = tmp_path / "vendor"
    _static_library(vendor, 1)
    (checkout / "kernels" / "k.hip").write_text(
        SOURCE
        + 'extern "C" int sc_value(void);\nextern "C" int k_linked() { return sc_value(); }\n'
    )
    flags = {"-L": f'"-L{vendor}", "-lsc"', "LIBRARY_PATH": '"-lsc"',
             "-Wl,-l:": f'"-L{vendor}", "-Wl,-l:libsc.a"'}[how]  # fmt: skip
    linked = config.parse(
        BASE + TARGET.format(env="").replace('flags = ["-O2"]', f'flags = ["-O2", {flags}]'),
        environ={},
    )  # fmt: skip
    env = {"LIBRARY_PATH": str(vendor)} if how == "LIBRARY_PATH" else {}
    cache = tmp_path / "cache"
    assert not build(checkout, cache, linked, **env).cached
    assert build(checkout, cache, linked, **env).cached
    _static_library(vendor, 2)
    again = build(checkout, cache, linked, **env)
    assert not again.cached
    assert again.reason == f"changed: includes ({vendor / 'libsc.a'})"
    assert _linked_value(checkout) == 2


INCBIN_SOURCE = """
__asm__(".section .rodata\\n.global k_blob_data\\nk_blob_data:\\n.incbin PATH\\n.byte 0\\n.text\\n");
extern "C" const char k_blob_data[];
extern "C" const char* k_blob() { return k_blob_data; }
"""


def _blob(checkout: Path) -> bytes:
    lib = ctypes.CDLL(str(checkout / "build" / "libk.so"), mode=os.RTLD_LOCAL)
    lib.k_blob.restype = ctypes.c_char_p
    return bytes(lib.k_blob())


def test_a_file_the_assembler_pulls_in_keys_the_cache(checkout: Path, tmp_path: Path) -> None:
    """``.incbin`` in inline assembly copies a file into the library; the compiler's
    ``-M`` listing does not name it. A new blob must be a rebuild; an ``.incbin`` of no
    literal path cannot be keyed, so that target is compiled every time."""
    source = checkout / "kernels" / "k.hip"
    source.write_text(SOURCE + INCBIN_SOURCE.replace("PATH", '\\"kernels/blob.bin\\"'))
    (checkout / "kernels" / "blob.bin").write_bytes(b"first")
    cache = tmp_path / "cache"
    assert not build(checkout, cache).cached
    assert build(checkout, cache).cached
    (checkout / "kernels" / "blob.bin").write_bytes(b"second")
    again = build(checkout, cache)
    assert not again.cached
    assert again.reason == "changed: includes (kernels/blob.bin)"
    assert _blob(checkout) == b"second"

    source.write_text(
        '#define BLOB "\\"kernels/blob.bin\\""\n'
        + SOURCE
        + INCBIN_SOURCE.replace("PATH", '" BLOB "')
    )
    for _ in range(2):
        macro = build(checkout, cache)
        assert not macro.cached
        assert macro.reason.startswith("not cached: kernels/k.hip pulls in a file with .incbin")
    assert _blob(checkout) == b"second"
