"""How each kind of GPU extension is compiled for a list of archs: hipcc, nvcc, CMake,
and which files each build reads (what keys the build cache). The readers of linker
inputs (thin ``ar`` archives, linker scripts' ``INPUT``/``GROUP``, ``.incbin``) are
written here: no maintained Python library reads them, and each needs only the few
fields that name other files."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shlex
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from servegate.config import KernelTarget
from servegate.errors import BuildFailed, CommandFailed, ConfigError
from servegate.pipeline import gitenv, proc
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


#: how each vendor's archs are named, for a hint
ARCH_EXAMPLE = {"amd": "gfx… (--arch gfx1030)", "nvidia": "sm_… (--arch sm_90)"}


def compiler(target: KernelTarget, archs: tuple[str, ...]) -> str:
    """The recipe that builds ``target``: a portable target follows the archs' vendor."""
    if target.kind == "portable":
        return "hipcc" if vendor(archs) == "amd" else "nvcc"
    wants = {"hipcc": "amd", "nvcc": "nvidia"}.get(target.kind)
    if wants and archs and vendor(archs) != wants:
        raise ConfigError(
            f"target {target.name} is built with {target.kind} ({wants.upper()} GPUs), but the "
            f"archs asked for are {', '.join(archs)}: {target.kind} cannot build them",
            hint=f"build it for {ARCH_EXAMPLE[wants]}, or make the target portable "
            '(kind = "portable") to follow the archs',
        )
    return target.kind


def tools(target: KernelTarget, archs: tuple[str, ...]) -> list[str]:
    """The programs that build ``target`` for ``archs`` (a CMake build's compiler too)."""
    found = {"hipcc": ["hipcc"], "nvcc": ["nvcc"], "cmake": ["cmake", "ninja"]}[
        compiler(target, archs)
    ]
    if target.kind == "cmake" and archs:
        found.append("hipcc" if vendor(archs) == "amd" else "nvcc")
    return found


def toolchain(
    target: KernelTarget, archs: tuple[str, ...], environ: Mapping[str, str]
) -> dict[str, str]:
    """Tool name → its ``--version`` lines (they key the cache)."""
    versions = {}
    for tool in tools(target, archs):
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


def build_environment(
    environ: Mapping[str, str], configured: Mapping[str, str], checkout: Path | None = None
) -> dict[str, str]:
    """What of the environment keys the cache: ``build.env`` as filled in ``environ``,
    the release's own folder (``checkout``) written back as ``{release}`` (a release's
    folder is no change of the build; the commit a ``{sha}`` stamps into it is), as
    written when ``environ`` lacks it; and every compiler variable of ``environ``
    (``HIPCC_COMPILE_FLAGS_APPEND``, ``CPATH``, ``CXX`` …); not which GPUs a job may see."""
    picked = {
        name: value
        for name, value in environ.items()
        if (name in COMPILER_ENV or name.startswith(COMPILER_ENV_PREFIXES))
        and not name.endswith("_VISIBLE_DEVICES")
    }
    folders = sorted({str(checkout), str(checkout.resolve())} if checkout else set(), key=len,
                     reverse=True)  # fmt: skip

    def keyed(name: str, written: str) -> str:
        value = environ.get(name, written)
        for folder in folders:
            value = value.replace(folder, "{release}")
        return f"build.env: {value}"

    return {**picked, **{name: keyed(name, v) for name, v in configured.items()}}


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
    flags = target.flags
    if kind in ("hipcc", "nvcc"):
        flags = compiler_flags(kind, target.flags, checkout, environ)
    named = named_files(checkout, target, flags)
    names.update(_key_name(checkout, f) for f in named)
    if kind in ("hipcc", "nvcc"):
        linked = linked_libraries(target, checkout, environ, flags)
        names.update(_key_name(checkout, f) for f in linked)
        inputs = library_inputs(checkout, [*named, *linked], flags, environ)
        names.update(_key_name(checkout, f) for f in inputs)
    names.update(_key_name(checkout, f) for f in assembled_files(checkout, names, flags, environ))
    return {name: sha256_file(checkout / name) for name in sorted(names)}


class Unkeyable(Exception):
    """The build reads a file the cache cannot name: it is compiled every time."""


#: ``.incbin "FILE"`` or ``.include "FILE"`` as written in assembly, or in a C string of
#: inline assembly (the assembler's directives are case-insensitive: ``.INCBIN``)
INCBIN = re.compile(rb'\.(incbin|include)\s+(\\?"(?:[^"\\]|\\[^"])+\\?"|\S+)', re.IGNORECASE)


def assembled_files(
    checkout: Path,
    names: set[str],
    flags: tuple[str, ...],
    environ: Mapping[str, str] | None = None,
) -> list[str]:
    """Files the assembler pulls into the build with ``.incbin`` (copied in) or
    ``.include`` (assembled in: its own ``.incbin``/``.include`` are followed too), in
    assembly or inline assembly of any source or header the build reads: the compiler's
    ``-M`` listing shows neither. Each is looked for where the assembler looks (the
    compile's folder, the checkout, the ``-I`` folders and ``CPATH``) and in the including
    file's own folder; every one found keys the cache. Raises Unkeyable for one of no
    literal path to a file found there (a macro, a path put together by the
    preprocessor): the target is then compiled every time."""
    cpath = (environ or {}).get("CPATH", "").split(os.pathsep)
    folders = [checkout, *(checkout / f for f in (*_include_folders(flags), *cpath) if f)]
    found: list[str] = []
    todo = sorted(names)
    seen = {os.path.normpath(checkout / name) for name in todo}
    while todo:
        name = todo.pop(0)
        path = checkout / name
        with contextlib.suppress(OSError):
            data = path.read_bytes()
            lowered = data.lower()
            if b".incbin" not in lowered and b".include" not in lowered:
                continue
            for match in INCBIN.finditer(data):
                directive = match.group(1).decode().lower()
                literal = match.group(2).replace(b'\\"', b'"')
                file = literal[1:-1].decode(errors="surrogateescape")
                here = [str(f / file) for f in (*folders, path.parent) if (f / file).is_file()]
                if not (literal[:1] == literal[-1:] == b'"' and len(literal) > 2 and here):
                    raise Unkeyable(
                        f"{name} pulls in a file with .{directive} "
                        f"{literal.decode(errors='replace')}, not a literal path to a file"
                    )
                found += here
                if directive == "include":
                    for other in here:
                        if os.path.normpath(other) not in seen:
                            seen.add(os.path.normpath(other))
                            todo.append(other)
    return found


def _include_folders(flags: tuple[str, ...]) -> list[str]:
    folders = []
    it = iter(flags)
    for flag in it:
        if flag in ("-I", "-iquote", "-isystem", "-idirafter", "--include-directory"):
            folders.append(next(it, ""))
        elif flag.startswith("--include-directory="):
            folders.append(flag.partition("=")[2])
        elif flag.startswith("-I") and len(flag) > 2:
            folders.append(flag[2:])
    return [f for f in folders if f]


#: the variables through which the compiler driver adds flags of its own
DRIVER_FLAG_VARIABLES = {
    "hipcc": ("HIPCC_COMPILE_FLAGS_APPEND", "HIPCC_LINK_FLAGS_APPEND"),
    "nvcc": ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS"),
}


def compiler_flags(
    kind: str, flags: tuple[str, ...], checkout: Path, environ: Mapping[str, str]
) -> tuple[str, ...]:
    """The flags as the compiler gets them: the target's, each response file's words
    after it (``@opts.rsp``, relative to the checkout), and those the driver adds from
    the environment (``HIPCC_LINK_FLAGS_APPEND="-L/opt/x -lx"``, nvcc's
    ``NVCC_APPEND_FLAGS``): the libraries and files they name key the cache as the
    flags' own do."""
    words: list[str] = []
    for flag in flags:
        words.append(flag)
        if flag.startswith("@"):
            with contextlib.suppress(OSError, ValueError):
                words += shlex.split((checkout / flag[1:]).read_text(errors="replace"))
    for name in DRIVER_FLAG_VARIABLES.get(kind, ()):
        with contextlib.suppress(ValueError):
            words += shlex.split(environ.get(name, ""))
    return tuple(words)


#: long spellings of ``-l``/``-L``: nvcc's, and ld's (``-Wl,--library=NAME``)
LONG_LINK_FLAGS = {"--library": "-l", "--library-path": "-L"}


def _linker_words(flags: tuple[str, ...]) -> list[str]:
    """The flags as the linker gets them: ``-Wl,a,b`` and ``-Xlinker a`` unpacked, the
    long spellings (``--library-path``, ``--library``, nvcc's or ld's) as ``-L``/``-l``."""
    unpacked: list[str] = []
    it = iter(flags)
    for flag in it:
        if flag.startswith("-Wl,"):
            unpacked += flag.split(",")[1:]
        elif flag in ("-Xlinker", "--linker-options"):
            unpacked += next(it, "").split(",")
        else:
            unpacked.append(flag)
    words: list[str] = []
    it = iter(unpacked)
    for word in it:
        name, eq, value = word.partition("=")
        if name in LONG_LINK_FLAGS:
            words += [LONG_LINK_FLAGS[name], value if eq else next(it, "")]
        else:
            words.append(word)
    return words


def linked_libraries(
    target: KernelTarget,
    checkout: Path,
    environ: Mapping[str, str],
    flags: tuple[str, ...] | None = None,
) -> list[str]:
    """The library files the target's ``-l`` flags link, found as the linker finds them:
    the ``-L`` folders (relative to the checkout, where the compile runs), then
    ``LIBRARY_PATH``, then the host compiler's own search folders. Both ``libNAME.so``
    and ``libNAME.a`` of the first folder holding either key the cache (a static
    library's code is copied into the output; a shared one's symbols decide the link);
    ``-l:FILE`` names the file itself. A library found nowhere is left to the link,
    which fails on it. ``flags``: the target's as the compiler gets them."""
    words = _linker_words(target.flags if flags is None else flags)
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
    folders += _library_path(checkout, environ)
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


def named_files(
    checkout: Path, target: KernelTarget, flags: tuple[str, ...] | None = None
) -> list[str]:
    """Files the target's flags and CMake arguments name (``@opts.rsp``,
    ``-Wl,--version-script=x.map``, ``-Wl,--whole-archive,lib.a,--no-whole-archive``,
    ``-Wl,-Tx.ld``, ``-DCMAKE_TOOLCHAIN_FILE=t.cmake``, ``lib.a``): the compiler reads
    them, so their contents key the cache, not only their names. ``flags``: the
    target's as the compiler gets them."""
    found = []
    for arg in (*(target.flags if flags is None else flags), *target.cmake_args):
        candidates = set()
        for piece in {arg, *arg.split(",")}:
            candidates |= {piece, piece.removeprefix("@"), piece.rpartition("=")[2]}
            if piece.startswith("-T"):
                candidates.add(piece[2:])
        for candidate in sorted(candidates):
            if candidate and (checkout / candidate).is_file():
                found.append(candidate)
    return found


def _library_path(checkout: Path, environ: Mapping[str, str]) -> list[Path]:
    """``LIBRARY_PATH``'s folders (a relative one is relative to the compile's folder)."""
    return [checkout / p for p in environ.get("LIBRARY_PATH", "").split(os.pathsep) if p]


def library_inputs(
    checkout: Path, files: list[str], flags: tuple[str, ...], environ: Mapping[str, str]
) -> list[str]:
    """The files that libraries and linker scripts among ``files`` bring into the link
    besides themselves: a thin archive's members (it holds their paths, not their code)
    and the files a linker script (a ``libNAME.so`` that is one, as glibc's libc.so is,
    or a ``-T`` script) names in ``INPUT``/``GROUP``/``AS_NEEDED``, and theirs in turn.
    Every place the linker may find a relative one keys the cache."""
    words = _linker_words(flags)
    folders = [checkout / w[2:] for w in words if w.startswith("-L") and len(w) > 2]
    folders += [checkout / b for a, b in itertools.pairwise(words) if a == "-L"]
    folders += _library_path(checkout, environ)
    seen: set[str] = set()
    found: list[str] = []
    todo = [os.path.normpath(checkout / f) for f in files]
    while todo:
        path = Path(todo.pop(0))
        for other in _inputs_of(path, checkout, folders):
            other = os.path.normpath(other)
            if other not in seen and os.path.isfile(other):
                seen.add(other)
                found.append(other)
                todo.append(other)
    return found


def _inputs_of(path: Path, checkout: Path, folders: list[Path]) -> list[str]:
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if head == b"!<thin>\n":
                return [str(path.parent / m) for m in _thin_members(head + f.read())]
            if head.startswith((b"!<arch>\n", b"\x7fELF")):
                return []
            data = head + f.read(1 << 20)
    except OSError:
        return []
    if b"\0" in data:
        return []
    text = re.sub(r"/\*.*?\*/", " ", data.decode(errors="replace"), flags=re.DOTALL)
    found: list[str] = []
    for match in re.finditer(r"\b(?:INPUT|GROUP)\s*\(", text):
        depth, end = 1, match.end()
        while end < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            end += 1
        for token in re.findall(r'"[^"]*"|[^\s,()"]+', text[match.end() : end - 1]):
            token = token.strip('"')
            if token == "AS_NEEDED":
                continue
            if token.startswith("-l"):
                name = token[2:]
                names = [name[1:]] if name.startswith(":") else [f"lib{name}.so", f"lib{name}.a"]
                found += [str(d / n) for d in folders for n in names]
            elif os.path.isabs(token):
                found.append(token)
            else:
                found += [str(d / token) for d in (checkout, path.parent, *folders)]
    return found


def _thin_members(data: bytes) -> list[str]:
    """The member paths a thin archive (``ar T``) names, relative to its folder."""
    members: list[str] = []
    longnames = b""
    pos = 8
    while pos + 60 <= len(data):
        header = data[pos : pos + 60]
        name = header[:16].rstrip(b" ")
        try:
            size = int(header[48:58].strip() or b"0")
        except ValueError:
            break
        pos += 60
        if name in (b"/", b"/SYM64/", b"//"):  # symbol table, long names: stored
            if name == b"//":
                longnames = data[pos : pos + size]
            pos += size + (size & 1)
            continue
        if name.startswith(b"/") and name[1:].isdigit():
            start = int(name[1:])
            end = longnames.find(b"/\n", start)
            name = longnames[start : end if end >= 0 else None]
        else:
            name = name.removesuffix(b"/")
        members.append(name.decode(errors="surrogateescape"))
    return members


def _tree(top: Path) -> list[Path]:
    """The files under ``top`` that git tracks or would track (all of them outside git)."""
    listed = gitenv.run(
        ["ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "."],
        top, timeout=120,
    )  # fmt: skip
    if listed.ok:
        return [top / name for name in listed.stdout.split("\0") if name]
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
#: flags whose next word is their argument: it stays with them
TAKES_AN_ARGUMENT = frozenset({"-Xlinker", "--linker-options", "-Xcompiler",
                               "--compiler-options", "-o", "-x", "-include", "-L"})  # fmt: skip


def split_libraries(flags: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """The target's flags, and the libraries among them (``-lNAME``, ``-l:FILE``,
    ``-Wl,-l…``, a ``lib.a``/``lib.so`` file) that go after the sources: the linker takes
    from a static library only what the objects before it need."""
    flags_out: list[str] = []
    libraries: list[str] = []
    for before, flag in zip(("", *flags), flags, strict=False):
        is_library = before not in TAKES_AN_ARGUMENT and (
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
