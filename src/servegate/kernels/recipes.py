"""How each kind of GPU extension is compiled for a list of archs: hipcc, nvcc, CMake."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from servegate.config import KernelTarget
from servegate.errors import BuildFailed, CommandFailed, ConfigError
from servegate.pipeline import proc
from servegate.pipeline.hashing import sha256_file

COMPILED = {".hip", ".cu", ".cpp", ".cc", ".cxx", ".c"}
INSTALL = {
    "hipcc": "Debian: apt-get install hipcc libamdhip64-dev rocm-device-libs; or ROCm's hipcc",
    "nvcc": "the CUDA toolkit (nvcc), e.g. apt-get install nvidia-cuda-toolkit",
    "cmake": "pip install cmake, or apt-get install cmake",
    "ninja": "pip install ninja, or apt-get install ninja-build",
}


@dataclass(frozen=True)
class Step:
    argv: tuple[str, ...]
    env: Mapping[str, str]


def require_tool(name: str, environ: Mapping[str, str]) -> str:
    path = shutil.which(name, path=environ.get("PATH", os.defpath))
    if path is None:
        raise BuildFailed(f"{name} is not installed", hint=f"install it: {INSTALL[name]}")
    return path


def vendor(archs: tuple[str, ...]) -> str:
    kinds = {"amd" if a.startswith("gfx") else "nvidia" for a in archs}
    if len(kinds) > 1:
        raise ConfigError(
            "build.archs mixes AMD (gfx…) and NVIDIA (sm_…) architectures",
            hint="one box has one vendor: list that vendor's archs only",
        )
    return kinds.pop() if kinds else ""


def expand(checkout: Path, globs: tuple[str, ...]) -> list[Path]:
    files: set[Path] = set()
    for pattern in globs:
        files.update(p for p in checkout.glob(pattern) if p.is_file())
    return sorted(files)


def compiler(target: KernelTarget, archs: tuple[str, ...]) -> str:
    """The recipe that builds ``target``: a portable target follows the archs' vendor."""
    if target.kind == "portable":
        return "hipcc" if vendor(archs) == "amd" else "nvcc"
    return target.kind


def toolchain(
    target: KernelTarget, archs: tuple[str, ...], environ: Mapping[str, str]
) -> dict[str, str]:
    """Tool name → its ``--version`` lines (they key the cache)."""
    tools = {"hipcc": ["hipcc"], "nvcc": ["nvcc"], "cmake": ["cmake", "ninja"]}[
        compiler(target, archs)
    ]
    if target.kind == "cmake" and archs:
        tools.append("hipcc" if vendor(archs) == "amd" else "nvcc")
    versions = {}
    for tool in tools:
        exe = require_tool(tool, environ)
        env = dict(environ, HIP_PLATFORM="amd") if tool == "hipcc" else dict(environ)
        out = proc.run([exe, "--version"], env=env, timeout=60, check=False).output
        lines = [
            line.strip()
            for line in out.splitlines()
            if any(w in line.lower() for w in ("version", "release", "target:", "installeddir"))
        ]
        versions[tool] = " | ".join([*lines, os.path.realpath(exe)])
    return versions


#: the environment that changes what a compiler makes (besides ``build.env``, which keys
#: the cache whole): its variables, by name or by prefix
COMPILER_ENV = frozenset({"CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "LIBRARY_PATH",
                          "CC", "CXX", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS",
                          "CUDAHOSTCXX", "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS",
                          "COMPILER_PATH", "SOURCE_DATE_EPOCH", "MAX_JOBS"})  # fmt: skip
COMPILER_ENV_PREFIXES = ("HIP", "HCC_", "ROCM", "AMDGPU", "DEVICE_LIB", "CUDA", "NVCC_",
                         "CMAKE_", "TORCH_", "PYTORCH_", "Torch_", "CCC_", "CLANG", "LLVM_",
                         "GCC_", "LD_", "PERL", "OFFLOAD_", "OMP_TARGET")  # fmt: skip


def build_environment(environ: Mapping[str, str], configured: Mapping[str, str]) -> dict[str, str]:
    """What of the environment keys the cache: ``build.env`` as written (before its
    placeholders are filled: a release's own folder is no change of the build) and every
    compiler variable of ``environ`` (``HIPCC_COMPILE_FLAGS_APPEND``, ``CPATH``, ``CXX`` …);
    not which GPUs a job may see."""
    picked = {
        name: value
        for name, value in environ.items()
        if (name in COMPILER_ENV or name.startswith(COMPILER_ENV_PREFIXES))
        and not name.endswith("_VISIBLE_DEVICES")
    }
    return {**picked, **{name: f"build.env: {v}" for name, v in configured.items()}}


def _depfile(text: str) -> list[str]:
    """The prerequisites of a Makefile rule set as ``cc -M`` writes it (continued lines,
    ``\\ `` for a space in a path)."""
    found: list[str] = []
    for line in text.replace("\\\n", " ").splitlines():
        _, colon, rest = line.partition(": ")
        if colon:
            found += [re.sub(r"\\(.)", r"\1", t) for t in re.findall(r"(?:\\.|[^\s\\])+", rest)]
    return found


def _key_name(checkout: Path, path: str) -> str:
    """A file as the cache key names it: relative inside the checkout (each release has
    its own folder), absolute outside it."""
    full = Path(os.path.normpath(checkout / path))
    return str(full.relative_to(checkout)) if full.is_relative_to(checkout) else str(full)


def includes(
    target: KernelTarget, checkout: Path, archs: tuple[str, ...], environ: Mapping[str, str]
) -> dict[str, str]:
    """Every file the build reads beyond its ``sources`` globs → its SHA-256: for hipcc and
    nvcc, what the compiler's preprocessor includes with the target's own flags (``-M``:
    headers in any folder, through links, the toolchain's headers); for CMake, every file
    under ``source_dir`` that git tracks or would track. Raises BuildFailed when the
    compiler cannot list them (the compile would fail the same way)."""
    kind = compiler(target, archs)
    names: set[str] = set()
    if kind in ("hipcc", "nvcc"):
        with tempfile.TemporaryDirectory(prefix="servegate-deps-") as folder:
            depfile = Path(folder) / "deps"
            for step in dependency_steps(target, checkout, archs, environ):
                try:
                    proc.run((*step.argv, "-MF", str(depfile)), cwd=checkout, env=step.env,
                             timeout=300)  # fmt: skip
                except CommandFailed as exc:
                    raise BuildFailed(
                        f"building {target.name}: the compiler could not list the sources' "
                        f"includes: {exc}",
                        hint="fix the sources or the target's flags",
                    ) from None
                names.update(_key_name(checkout, d) for d in _depfile(depfile.read_text()))
    else:
        top = checkout / target.source_dir
        build = checkout / target.build_dir
        names.update(
            _key_name(checkout, str(p))
            for p in _tree(top)
            if not p.is_relative_to(build) and p.is_file()
        )
    names.update(_key_name(checkout, f) for f in named_files(checkout, target))
    if kind in ("hipcc", "nvcc"):
        names.update(_key_name(checkout, f) for f in linked_libraries(target, checkout, environ))
    names.update(_key_name(checkout, f) for f in assembled_files(checkout, names, target.flags))
    return {name: sha256_file(checkout / name) for name in sorted(names)}


class Unkeyable(Exception):
    """The build reads a file the cache cannot name: it is compiled every time."""


#: ``.incbin "FILE"`` as written in assembly, or in a C string of inline assembly
INCBIN = re.compile(rb'\.incbin\s+(\\?"(?:[^"\\]|\\[^"])+\\?"|\S+)')


def assembled_files(checkout: Path, names: set[str], flags: tuple[str, ...]) -> list[str]:
    """Files the assembler pulls into the build with ``.incbin`` (in assembly or inline
    assembly of any source or header the build reads): the compiler's ``-M`` listing
    does not show them. Each is looked for where the assembler looks (the compile's
    folder, the checkout, and the ``-I`` folders) and in the including file's own
    folder; every one found keys the cache. Raises Unkeyable for an ``.incbin`` of no
    literal path to a file found there (a macro, a path put together by the
    preprocessor): the target is then compiled every time."""
    folders = [checkout, *(checkout / f for f in _include_folders(flags))]
    found: list[str] = []
    for name in sorted(names):
        path = checkout / name
        with contextlib.suppress(OSError):
            data = path.read_bytes()
            if b".incbin" not in data:
                continue
            for match in INCBIN.finditer(data):
                literal = match.group(1).replace(b'\\"', b'"')
                file = literal[1:-1].decode(errors="surrogateescape")
                here = [str(f / file) for f in (*folders, path.parent) if (f / file).is_file()]
                if not (literal[:1] == literal[-1:] == b'"' and len(literal) > 2 and here):
                    raise Unkeyable(
                        f"{name} pulls in a file with .incbin {literal.decode(errors='replace')}, "
                        "not a literal path to a file"
                    )
                found += here
    return found


def _include_folders(flags: tuple[str, ...]) -> list[str]:
    folders = []
    it = iter(flags)
    for flag in it:
        if flag in ("-I", "-iquote", "-isystem"):
            folders.append(next(it, ""))
        elif flag.startswith("-I") and len(flag) > 2:
            folders.append(flag[2:])
    return [f for f in folders if f]


def _linker_words(flags: tuple[str, ...]) -> list[str]:
    """The flags as the linker gets them: ``-Wl,a,b`` and ``-Xlinker a`` unpacked, nvcc's
    long spellings (``--library-path``, ``--library``) as ``-L``/``-l``."""
    words: list[str] = []
    it = iter(flags)
    for flag in it:
        if flag.startswith("-Wl,"):
            words += flag.split(",")[1:]
        elif flag in ("-Xlinker", "--linker-options"):
            words += next(it, "").split(",")
        elif flag in ("--library-path", "--library"):
            words += [{"--library-path": "-L", "--library": "-l"}[flag], next(it, "")]
        elif flag.startswith(("--library-path=", "--library=")):
            name, _, value = flag.partition("=")
            words += [{"--library-path": "-L", "--library": "-l"}[name], value]
        else:
            words.append(flag)
    return words


def linked_libraries(target: KernelTarget, checkout: Path, environ: Mapping[str, str]) -> list[str]:
    """The library files the target's ``-l`` flags link, found as the linker finds them:
    the ``-L`` folders (relative to the checkout, where the compile runs), then
    ``LIBRARY_PATH``, then the host compiler's own search folders. Both ``libNAME.so``
    and ``libNAME.a`` of the first folder holding either key the cache (a static
    library's code is copied into the output; a shared one's symbols decide the link);
    ``-l:FILE`` names the file itself. A library found nowhere is left to the link,
    which fails on it."""
    words = _linker_words(target.flags)
    folders: list[Path] = []
    wanted: list[tuple[str, ...]] = []
    it = iter(words)
    for word in it:
        if word in ("-L", "-l"):
            word += next(it, "")
        if word.startswith("-L") and len(word) > 2:
            folders.append(checkout / word[2:])
        elif word.startswith("-l") and len(word) > 2:
            name = word[2:]
            wanted.append(
                (name[1:],) if name.startswith(":") else (f"lib{name}.so", f"lib{name}.a")
            )
    if not wanted:
        return []
    folders += [Path(p or ".") for p in environ.get("LIBRARY_PATH", "").split(os.pathsep) if p]
    found: list[str] = []
    for candidates in wanted:
        for folder in folders:
            here = [folder / n for n in candidates if (folder / n).is_file()]
            if here:
                found += map(str, here)
                break
        else:
            found += _from_compiler(candidates, environ)
    return found


def _from_compiler(names: tuple[str, ...], environ: Mapping[str, str]) -> list[str]:
    """Where the host compiler's default search folders hold ``names``
    (``cc -print-file-name``: it answers the bare name when it finds nothing)."""
    cc = shutil.which("cc", path=environ.get("PATH", os.defpath))
    if cc is None:
        return []
    found = []
    for name in names:
        out = proc.run([cc, f"-print-file-name={name}"], env=dict(environ), timeout=60,
                       check=False).output.strip()  # fmt: skip
        if out != name and os.path.isfile(out):
            found.append(out)
    return found


def named_files(checkout: Path, target: KernelTarget) -> list[str]:
    """Files the target's flags and CMake arguments name (``@opts.rsp``,
    ``-Wl,--version-script=x.map``, ``-DCMAKE_TOOLCHAIN_FILE=t.cmake``, ``lib.a``): the
    compiler reads them, so their contents key the cache, not only their names."""
    found = []
    for arg in (*target.flags, *target.cmake_args):
        for candidate in {arg, arg.removeprefix("@"), arg.rpartition("=")[2],
                          arg.rpartition(",")[2]}:  # fmt: skip
            if candidate and (checkout / candidate).is_file():
                found.append(candidate)
    return found


def _tree(top: Path) -> list[Path]:
    """The files under ``top`` that git tracks or would track (all of them outside git)."""
    listed = proc.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "."],
        cwd=top, timeout=120, check=False,
    )  # fmt: skip
    if listed.returncode == 0:
        return [top / name for name in listed.output.split("\0") if name]
    return [Path(d) / f for d, dirs, files in os.walk(top) for f in files
            if ".git" not in Path(d).parts]  # fmt: skip


def dependency_steps(
    target: KernelTarget, checkout: Path, archs: tuple[str, ...], environ: Mapping[str, str]
) -> list[Step]:
    """One ``-M`` call a compiled source, with the flags its compile gets."""
    env = dict(environ)
    kind = compiler(target, archs)
    srcs = [p for p in expand(checkout, target.sources) if p.suffix in COMPILED]
    if kind == "hipcc":
        # the host side, then each arch's device side on its own: a header included
        # under __HIP_DEVICE_COMPILE__ is in no host listing
        env["HIP_PLATFORM"] = "amd"
        host = [f"--offload-arch={a}" for a in archs]
        sides = [host, *([f"--offload-arch={a}", "--cuda-device-only"] for a in archs)]
        return [
            Step(("hipcc", *side, "-fPIC", *target.flags, "-M", str(src)), env)
            for src in srcs
            for side in sides
        ]
    lang = ["-x", "cu"] if any(p.suffix != ".cu" for p in srcs) else []
    head = ["nvcc", *_gencode(archs), "-Xcompiler", "-fPIC", *target.flags, *lang]
    return [Step((*head, "-M", str(src)), env) for src in srcs]


LIBRARY_SUFFIXES = (".a", ".so", ".lo")


def split_libraries(flags: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """The target's flags, and the libraries among them (``-lNAME``, ``-l:FILE``,
    ``-Wl,-l…``, a ``lib.a``/``lib.so`` file) that go after the sources: the linker takes
    from a static library only what the objects before it need."""
    flags_out: list[str] = []
    libraries: list[str] = []
    for flag in flags:
        is_library = (
            (flag.startswith("-l") and len(flag) > 2)
            or flag.startswith("-Wl,-l")
            or (not flag.startswith("-") and flag.endswith(LIBRARY_SUFFIXES))
            or (not flag.startswith("-") and ".so." in flag)
        )
        (libraries if is_library else flags_out).append(flag)
    return flags_out, libraries


def _gencode(archs: tuple[str, ...]) -> list[str]:
    flags: list[str] = []
    for arch in archs:
        num = arch.removeprefix("sm_")
        flags += ["-gencode", f"arch=compute_{num},code=sm_{num}"]
    return flags


def steps(
    target: KernelTarget,
    checkout: Path,
    archs: tuple[str, ...],
    jobs: int,
    environ: Mapping[str, str],
) -> list[Step]:
    env = dict(environ)
    kind = compiler(target, archs)
    if kind == "hipcc":
        env["HIP_PLATFORM"] = "amd"
        srcs = [str(p) for p in expand(checkout, target.sources) if p.suffix in COMPILED]
        arch_flags = [f"--offload-arch={a}" for a in archs]
        out = checkout / target.output
        flags, libraries = split_libraries(target.flags)
        argv = ("hipcc", *arch_flags, "-fPIC", "-shared", *flags, *srcs, *libraries)
        return [Step((*argv, "-o", str(out)), env)]
    if kind == "nvcc":
        cu_srcs = [p for p in expand(checkout, target.sources) if p.suffix in COMPILED]
        lang = ["-x", "cu"] if any(p.suffix != ".cu" for p in cu_srcs) else []
        out = checkout / target.output
        flags, libraries = split_libraries(target.flags)
        argv = ("nvcc", *_gencode(archs), "-Xcompiler", "-fPIC", "-shared", *flags, *lang,
                *map(str, cu_srcs), *libraries, "-o", str(out))  # fmt: skip
        return [Step(argv, env)]
    arch_list = ";".join(archs)
    arch_args = []
    if archs and vendor(archs) == "amd":
        arch_args = [f"-DCMAKE_HIP_ARCHITECTURES={arch_list}", f"-DGPU_TARGETS={arch_list}"]
        env["PYTORCH_ROCM_ARCH"] = arch_list
    elif archs:
        arch_args = [f"-DCMAKE_CUDA_ARCHITECTURES={';'.join(a.removeprefix('sm_') for a in archs)}"]
    build_dir = checkout / target.build_dir
    configure = (
        "cmake",
        "-S",
        str(checkout / target.source_dir),
        "-B",
        str(build_dir),
        "-G",
        "Ninja",
        "-DCMAKE_BUILD_TYPE=Release",
        *arch_args,
        *target.cmake_args,
    )
    build = ("cmake", "--build", str(build_dir), "-j", str(jobs or os.cpu_count() or 1))
    return [Step(configure, env), Step(build, env)]


def outputs(target: KernelTarget, checkout: Path) -> list[Path]:
    if target.kind == "cmake":
        return expand(checkout, target.outputs)
    out = checkout / target.output
    return [out] if out.is_file() else []
