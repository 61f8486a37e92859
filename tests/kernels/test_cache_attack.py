"""Inputs that change what a hipcc target compiles to but that the build cache did not
key: each test builds through the cache, changes one such input, and checks that what
the next build leaves in the checkout is what a compile of it without the cache gives
(a stale cache hit fails). Real hipcc builds of a small gfx1030 extension."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from servegate import config
from servegate.kernels.targets import TargetResult, build_all
from tests.kernels.test_cache_trust import BASE, SOURCE, TARGET, _static_library, library
from tests.kernels.test_cache_trust import make_checkout as trust_checkout

pytestmark = pytest.mark.skipif(
    shutil.which("hipcc") is None, reason="hipcc not installed (apt-get install hipcc)"
)

LINKED = (
    SOURCE + 'extern "C" int sc_value(void);\nextern "C" int k_linked() { return sc_value(); }\n'
)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The test extension of test_cache_trust: kernels/k.hip including detail/sign.h."""
    return trust_checkout(tmp_path)


def flagged(flags: str, env: str = "") -> config.Config:
    """The test target with ``flags`` (TOML array items) after ``-O2``."""
    text = BASE + TARGET.format(env=env).replace('flags = ["-O2"]', f'flags = ["-O2", {flags}]')
    return config.parse(text, environ={})


def build(checkout: Path, cache: Path | None, c: config.Config, **env: str) -> TargetResult:
    environ = {**os.environ, **env}
    (result,) = build_all(c, checkout, cache, environ, checkout.parent / "logs")
    return result


def assert_what_a_compile_gives(
    checkout: Path, cache: Path, c: config.Config, **env: str
) -> TargetResult:
    """Build through the cache, then compile without it: the same library, or the cache
    answered with a library this checkout does not compile to."""
    result = build(checkout, cache, c, **env)
    got = library(checkout)
    build(checkout, None, c, **env)
    assert got == library(checkout), f"stale cache hit: {result.reason}"
    return result


def _value(checkout: Path, name: str) -> bytes:
    lib = ctypes.CDLL(str(checkout / "build" / "libk.so"), mode=os.RTLD_LOCAL)
    getattr(lib, name).restype = ctypes.c_char_p
    return bytes(getattr(lib, name)())


def _shared_library(folder: Path, major: int) -> None:
    """libsc.so → libsc.so.MAJOR (its soname), as a vendor's package installs it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sc.c").write_text(f"int sc_value(void) {{ return {major}; }}\n")
    real = f"libsc.so.{major}"
    subprocess.run(["cc", "-fPIC", "-shared", f"-Wl,-soname,{real}", "sc.c", "-o", real],
                   cwd=folder, check=True)  # fmt: skip
    (folder / "libsc.so").unlink(missing_ok=True)
    (folder / "libsc.so").symlink_to(real)


def _needed(checkout: Path) -> str:
    out = subprocess.run(["readelf", "-d", str(checkout / "build" / "libk.so")],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return " ".join(line for line in out.splitlines() if "libsc" in line)


# --- linker flags -----------------------------------------------------------------------


def test_a_static_library_named_inside_a_wl_list_keys_the_cache(
    checkout: Path, tmp_path: Path
) -> None:
    """``-Wl,--whole-archive,LIB.a,--no-whole-archive`` (the usual way to link all of a
    static library): the library is not the last comma piece, and not an ``-l``."""
    vendor = tmp_path / "vendor"
    _static_library(vendor, 1)
    (checkout / "kernels" / "k.hip").write_text(LINKED)
    c = flagged(f'"-Wl,--whole-archive,{vendor}/libsc.a,--no-whole-archive"')
    cache = tmp_path / "cache"
    build(checkout, cache, c)
    assert build(checkout, cache, c).cached
    _static_library(vendor, 2)
    again = assert_what_a_compile_gives(checkout, cache, c)
    assert not again.cached


def test_a_version_script_inside_a_wl_list_keys_the_cache(checkout: Path, tmp_path: Path) -> None:
    """``-Wl,--version-script,FILE,--no-undefined``: what the library exports."""
    (checkout / "kernels" / "k.map").write_text("{ global: k_version; local: *; };\n")
    c = flagged('"-Wl,--version-script,kernels/k.map,--no-undefined"')
    cache = tmp_path / "cache"
    build(checkout, cache, c)
    assert build(checkout, cache, c).cached
    (checkout / "kernels" / "k.map").write_text("{ global: *; };\n")
    assert not assert_what_a_compile_gives(checkout, cache, c).cached


@pytest.mark.parametrize("how", ["-Wl,--library=", "-Xlinker --library="])
def test_lds_long_spelling_of_l_keys_the_cache(checkout: Path, tmp_path: Path, how: str) -> None:
    """ld's ``--library=NAME`` (``-Wl,`` or ``-Xlinker``) links as ``-lNAME`` does: a
    vendor's shared library bumped to a new soname must not restore an extension that
    still needs the old one."""
    vendor = tmp_path / "vendor"
    _shared_library(vendor, 1)
    (checkout / "kernels" / "k.hip").write_text(LINKED)
    lib = '"-Wl,--library=sc"' if how.startswith("-Wl") else '"-Xlinker", "--library=sc"'
    c = flagged(f'"-L{vendor}", {lib}')
    cache = tmp_path / "cache"
    build(checkout, cache, c)
    assert "libsc.so.1" in _needed(checkout)
    assert build(checkout, cache, c).cached
    _shared_library(vendor, 2)
    assert not assert_what_a_compile_gives(checkout, cache, c).cached
    assert "libsc.so.2" in _needed(checkout)


def test_the_members_of_a_thin_archive_key_the_cache(checkout: Path, tmp_path: Path) -> None:
    """A thin archive (``ar rcsT``: LLVM's and Chromium's builds make them) holds the
    paths of its objects, not their code: a rebuilt object of the same size leaves the
    archive byte for byte the same while the extension links the new code."""
    vendor = tmp_path / "vendor"
    vendor.mkdir()

    def thin(value: int) -> None:
        (vendor / "sc.c").write_text(f"int sc_value(void) {{ return {value}; }}\n")
        subprocess.run(["cc", "-fPIC", "-c", "sc.c", "-o", "sc.o"], cwd=vendor, check=True)
        (vendor / "libsc.a").unlink(missing_ok=True)
        subprocess.run(["ar", "rcsT", "libsc.a", "sc.o"], cwd=vendor, check=True)

    thin(1)
    (checkout / "kernels" / "k.hip").write_text(LINKED)
    c = flagged(f'"-L{vendor}", "-lsc"')
    cache = tmp_path / "cache"
    build(checkout, cache, c)
    assert build(checkout, cache, c).cached
    thin(2)
    assert not assert_what_a_compile_gives(checkout, cache, c).cached


def test_the_files_a_linker_script_library_names_key_the_cache(
    checkout: Path, tmp_path: Path
) -> None:
    """``libsc.so`` may be a linker script (as glibc's libc.so is): ``INPUT(…)`` or
    ``GROUP(…)`` of the files the link really takes."""
    vendor = tmp_path / "vendor"
    _static_library(vendor, 1)
    (vendor / "libsc.a").rename(vendor / "libsc_impl.a")
    (vendor / "libsc.so").write_text("/* GNU ld script */\nGROUP ( libsc_impl.a )\n")
    (checkout / "kernels" / "k.hip").write_text(LINKED)
    c = flagged(f'"-L{vendor}", "-lsc"')
    cache = tmp_path / "cache"
    build(checkout, cache, c)
    assert build(checkout, cache, c).cached
    _static_library(vendor, 2)
    (vendor / "libsc.a").replace(vendor / "libsc_impl.a")
    assert not assert_what_a_compile_gives(checkout, cache, c).cached


@pytest.mark.parametrize("where", ["environment", "build.env"])
def test_a_library_hipcc_link_flags_append_links_keys_the_cache(
    checkout: Path, tmp_path: Path, where: str
) -> None:
    """``HIPCC_LINK_FLAGS_APPEND="-L/opt/vendor -lsc"``: the variable keys the cache, the
    library it links did not."""
    vendor = tmp_path / "vendor"
    _shared_library(vendor, 1)
    (checkout / "kernels" / "k.hip").write_text(LINKED)
    value = f"-L{vendor} -lsc"
    env = {"HIPCC_LINK_FLAGS_APPEND": value} if where == "environment" else {}
    c = (
        flagged('"-Wl,--no-as-needed"')
        if where == "environment"
        else flagged('"-Wl,--no-as-needed"', f'[build.env]\nHIPCC_LINK_FLAGS_APPEND = "{value}"')
    )
    if where == "build.env":
        env = {"HIPCC_LINK_FLAGS_APPEND": value}  # as run_build fills it in
    cache = tmp_path / "cache"
    build(checkout, cache, c, **env)
    assert "libsc.so.1" in _needed(checkout)
    assert build(checkout, cache, c, **env).cached
    _shared_library(vendor, 2)
    assert not assert_what_a_compile_gives(checkout, cache, c, **env).cached


# --- the assembler ----------------------------------------------------------------------

PART = '.section .rodata\n.global k_part_data\nk_part_data:\n.ascii "{text}"\n.byte 0\n.text\n'


def test_an_assembly_file_pulled_in_with_include_keys_the_cache(
    checkout: Path, tmp_path: Path
) -> None:
    """``.include "FILE"`` in inline assembly assembles FILE into the library, as
    ``.incbin`` copies it: the compiler's ``-M`` listing names neither."""
    (checkout / "kernels" / "k.hip").write_text(
        SOURCE
        + '__asm__(".include \\"kernels/part.s\\"\\n");\n'
        + 'extern "C" const char k_part_data[];\n'
        + 'extern "C" const char* k_part() { return k_part_data; }\n'
    )
    (checkout / "kernels" / "part.s").write_text(PART.format(text="first"))
    cache = tmp_path / "cache"
    c = flagged('"-O2"')
    build(checkout, cache, c)
    assert build(checkout, cache, c).cached
    (checkout / "kernels" / "part.s").write_text(PART.format(text="second"))
    assert not assert_what_a_compile_gives(checkout, cache, c).cached
    assert _value(checkout, "k_part") == b"second"


def test_an_incbin_spelled_in_capitals_keys_the_cache(checkout: Path, tmp_path: Path) -> None:
    """The assembler's directives are case-insensitive: ``.INCBIN`` is ``.incbin``."""
    (checkout / "kernels" / "k.hip").write_text(
        SOURCE
        + '__asm__(".section .rodata\\n.global k_blob_data\\nk_blob_data:\\n'
        + '.INCBIN \\"kernels/blob.bin\\"\\n.byte 0\\n.text\\n");\n'
        + 'extern "C" const char k_blob_data[];\n'
        + 'extern "C" const char* k_blob() { return k_blob_data; }\n'
    )
    (checkout / "kernels" / "blob.bin").write_bytes(b"first")
    cache = tmp_path / "cache"
    c = flagged('"-O2"')
    build(checkout, cache, c)
    assert build(checkout, cache, c).cached
    (checkout / "kernels" / "blob.bin").write_bytes(b"second")
    assert not assert_what_a_compile_gives(checkout, cache, c).cached
    assert _value(checkout, "k_blob") == b"second"


# --- build.env placeholders ---------------------------------------------------------------


def test_build_env_filled_with_the_commit_keys_the_cache(checkout: Path, tmp_path: Path) -> None:
    """``HIPCC_COMPILE_FLAGS_APPEND = "-DK_SHA=0x{short}"`` stamps the commit into the
    extension; keying ``build.env`` as written (``{short}``) made the next commit a cache
    hit that still says the old one. Only the release's own folder is no change."""
    from servegate.engine.launch import placeholders
    from servegate.kernels.build import run_build

    (checkout / "kernels" / "k.hip").write_text(
        SOURCE + 'extern "C" unsigned long long k_sha() { return K_SHA; }\n'
    )
    c = flagged('"-O2"', '[build.env]\nHIPCC_COMPILE_FLAGS_APPEND = "-DK_SHA=0x{short}"')
    cache = tmp_path / "cache"
    log = tmp_path / "logs" / "build.log"

    def sha_in_library() -> int:
        # a copy of its own: dlopen answers a path it has loaded with the loaded library
        copy = tmp_path / f"libk-{library(checkout)}.so"
        shutil.copy(checkout / "build" / "libk.so", copy)
        lib = ctypes.CDLL(str(copy), mode=os.RTLD_LOCAL)
        lib.k_sha.restype = ctypes.c_ulonglong
        return int(lib.k_sha())

    first, second = "a" * 40, "b" * 40
    run_build(c, checkout, placeholders(c, checkout, first), log, cache)
    assert sha_in_library() == int(first[:12], 16)
    again = run_build(c, checkout, placeholders(c, checkout, second), log, cache)
    assert not again.targets[0]["cached"]
    assert "environment (HIPCC_COMPILE_FLAGS_APPEND)" in again.targets[0]["reason"]
    assert sha_in_library() == int(second[:12], 16)
    # the release's own folder is still no change of the build
    other = tmp_path / "release-2"
    shutil.copytree(checkout, other)
    moved = flagged(
        '"-O2"', '[build.env]\nHIPCC_COMPILE_FLAGS_APPEND = "-DK_SHA=0x{short} -I{release}/kernels"'
    )
    run_build(moved, checkout, placeholders(moved, checkout, second), log, cache)
    hit = run_build(moved, other, placeholders(moved, other, second), log, cache)
    assert hit.targets[0]["cached"]


# --- the checkout's own path --------------------------------------------------------------


def test_a_library_that_holds_its_checkouts_path(checkout: Path, tmp_path: Path) -> None:
    """hipcc is given the sources by absolute path, so ``__FILE__`` (every ``assert``)
    and ``-g`` put the checkout's folder into the library; the key names the sources
    relative to the checkout, so another release's folder would restore a library
    naming the first release's folder. Such an entry is a rebuild in another folder; one
    that holds no folder is still reused there."""
    c = flagged('"-O2"')
    cache = tmp_path / "cache"
    build(checkout, cache, c)
    other = tmp_path / "release-2"
    shutil.copytree(checkout, other, ignore=shutil.ignore_patterns("build"))
    assert build(other, cache, c).cached  # no folder inside: reused

    for folder in (checkout, other):
        (folder / "kernels" / "k.hip").write_text(
            SOURCE + 'extern "C" const char* k_file() { return __FILE__; }\n'
        )
    build(checkout, cache, c)
    result = assert_what_a_compile_gives(other, cache, c)
    assert not result.cached
    assert result.reason == (
        f"the cached libk.so names the folder it was built in ({checkout}: __FILE__, an "
        "assert or debug info): built here"
    )
    assert _value(other, "k_file").startswith(str(other).encode())


def test_a_library_that_holds_its_checkouts_path_in_compressed_debug_info(
    checkout: Path, tmp_path: Path
) -> None:
    """``-g -gz``: the folder is in zlib-compressed debug sections (of the host library
    and of the device code object inside its bundle), where a search of the file's bytes
    does not find it."""
    c = flagged('"-O2", "-g", "-gz"')
    cache = tmp_path / "cache"
    build(checkout, cache, c)
    assert os.fsencode(str(checkout)) not in (checkout / "build" / "libk.so").read_bytes()
    other = tmp_path / "release-2"
    shutil.copytree(checkout, other, ignore=shutil.ignore_patterns("build"))
    result = assert_what_a_compile_gives(other, cache, c)
    assert not result.cached
    assert result.reason.startswith("the cached libk.so names the folder it was built in")
