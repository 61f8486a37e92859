"""Which GPU architectures a built library really holds code for.

Reads the ELF sections where the toolchains put device code — ``.hip_fatbin`` (clang
offload bundles, AMD) and ``.nv_fatbin`` (NVIDIA fatbins) — with no tool needed. A
library built without the target arch loads fine and fails only on the GPU ("no binary
for GPU"); this is the check that catches it at build time.

Each translation unit (and each device link) puts its own bundle or fatbin — a
*container* here — into the library, and a kernel runs only from its own container: so
every container that holds code must hold code for every required arch, not the library
as a whole. A container whose device code defines no function (the kernel-less module
``nvcc`` links in) needs no arch. An entry counts as code for its arch only when it is
non-empty and really is a device ELF: ``EM_AMDGPU`` (224) for AMD, ``EM_CUDA`` (190) for
NVIDIA. PTX is no binary and never counts. A compressed NVIDIA entry (``nvcc
-Xfatbin -compress-all``, ``--compress-mode``: zstd, or LZ4 from older toolkits) is
decompressed (``zstandard``, ``lz4``) and read as any other; one that does not
decompress to the size its header states is no code. A compressed AMD bundle is refused
(``roc-obj-ls`` lists it).

A CUDA entry's label (the fatbin entry's arch) must agree with the SM its ELF header
names: ``e_flags``' low byte in ELF ABI version 7, bits 8-15 from version 8 on (LLVM's
``EF_CUDA_SM``/``EF_CUDA_SM_MASK``). Code for sm_80 labelled sm_90 is no code for sm_90.

An AMD entry's label (the bundle's triple) must agree with what its ELF header says it
is: the processor in ``e_flags`` (``EF_AMDGPU_MACH``) and, in code objects of version 4
and later, the ``xnack`` and ``sramecc`` settings. Code for gfx1031 labelled gfx1030 (or
for ``xnack+`` labelled ``xnack-``) is no code for its label: the loader matches the
label and the GPU then runs code built for another one. A processor this table does not
know is taken by its label.

AMD target IDs (https://llvm.org/docs/AMDGPUUsage.html#target-id): ``gfx90a:xnack-``
names a processor and the setting of a target feature (``xnack``, ``sramecc``); a feature
left out is *any*. Code with a feature *any* runs with it on or off; code with ``+`` or
``-`` runs only with that setting. A required target ID names the devices the library
must run on: ``gfx90a:xnack-`` is met by code for ``gfx90a:xnack-`` or ``gfx90a``; a
plain ``gfx90a`` (either setting) only by code for ``gfx90a``, or by both
``gfx90a:xnack+`` and ``gfx90a:xnack-`` together.
"""

from __future__ import annotations

import contextlib
import itertools
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servegate.errors import BuildFailed

BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
COMPRESSED_BUNDLE_MAGIC = b"CCOB"
FATBIN_MAGIC = 0xBA55ED50
NV_KINDS = {1: "ptx", 2: "elf"}
NV_LZ4, NV_ZSTD = 0x2000, 0x8000  # fatbin entry flags
NV_COMPRESSED = NV_LZ4 | NV_ZSTD
#: no device code object of a serving stack comes near this unpacked
NV_MAX_UNPACKED = 1 << 31
EM_AMDGPU = 224
EM_CUDA = 190
#: ``e_flags & 0xff`` (EF_AMDGPU_MACH) → processor, from LLVM's AMDGPUUsage ("AMDGPU ELF
#: Header"); checked against hipcc's own output for the processors it builds
AMDGPU_MACH = {
    0x020: "gfx600", 0x021: "gfx601", 0x022: "gfx700", 0x023: "gfx701", 0x024: "gfx702",
    0x025: "gfx703", 0x026: "gfx704", 0x028: "gfx801", 0x029: "gfx802", 0x02A: "gfx803",
    0x02B: "gfx810", 0x02C: "gfx900", 0x02D: "gfx902", 0x02E: "gfx904", 0x02F: "gfx906",
    0x030: "gfx908", 0x031: "gfx909", 0x032: "gfx90c", 0x033: "gfx1010", 0x034: "gfx1011",
    0x035: "gfx1012", 0x036: "gfx1030", 0x037: "gfx1031", 0x038: "gfx1032", 0x039: "gfx1033",
    0x03A: "gfx602", 0x03B: "gfx705", 0x03C: "gfx805", 0x03D: "gfx1035", 0x03E: "gfx1034",
    0x03F: "gfx90a", 0x040: "gfx940", 0x041: "gfx1100", 0x042: "gfx1013", 0x043: "gfx1150",
    0x044: "gfx1103", 0x045: "gfx1036", 0x046: "gfx1101", 0x047: "gfx1102", 0x048: "gfx1200",
    0x049: "gfx1250", 0x04A: "gfx1151", 0x04B: "gfx941", 0x04C: "gfx942", 0x04E: "gfx1201",
    0x04F: "gfx950", 0x051: "gfx9-generic", 0x052: "gfx10-1-generic",
    0x053: "gfx10-3-generic", 0x054: "gfx11-generic", 0x055: "gfx1152", 0x058: "gfx1153",
    0x059: "gfx12-generic", 0x05F: "gfx9-4-generic",
}  # fmt: skip
#: code object v4 and later (EI_ABIVERSION >= 2): the feature fields of ``e_flags``
AMDGPU_FEATURES = {"xnack": (0x300, 8), "sramecc": (0xC00, 10)}
AMDGPU_SETTING = {0: "unsupported", 1: "any", 2: "-", 3: "+"}


@dataclass(frozen=True)
class CodeObject:
    vendor: str  # amd | nvidia
    arch: str  # gfx1030, gfx90a:xnack-, sm_90, ...
    kind: str  # code object | elf | ptx
    size: int
    triple: str = ""
    #: the offset of its bundle or fatbin in the section
    container: int = 0
    #: why it is no code for its arch ("" when it is): empty, not a device ELF
    problem: str = ""
    #: whether it defines a function (machine code in a ``.text`` section, or PTX)
    functions: bool = True

    @property
    def counts(self) -> bool:
        """True when this is device code that runs on its arch."""
        return not self.problem and self.kind != "ptx"

    def as_dict(self) -> dict[str, Any]:
        return {
            "vendor": self.vendor,
            "arch": self.arch,
            "kind": self.kind,
            "size": self.size,
            "triple": self.triple,
            "container": self.container,
            "problem": self.problem,
        }


@dataclass(frozen=True)
class Container:
    """One clang offload bundle or one NVIDIA fatbin: one translation unit's device code."""

    vendor: str
    section: str
    offset: int
    objects: tuple[CodeObject, ...]
    #: the compressed entries' code, decompressed
    unpacked: tuple[bytes, ...] = ()

    @property
    def name(self) -> str:
        kind = "bundle" if self.vendor == "amd" else "fatbin"
        return f"the {self.section} {kind} at offset {self.offset}"

    @property
    def runs_code(self) -> bool:
        return any(o.functions for o in self.objects if not o.problem)


def elf_sections(data: bytes) -> dict[str, bytes]:
    """Section name → contents of a 64-bit little-endian ELF file."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    try:
        (shoff,) = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
        headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
        names_off, names_size = headers[shstrndx][4], headers[shstrndx][5]
        names = data[names_off : names_off + names_size]
        sections = {}
        for name_idx, sh_type, _flags, _addr, offset, size in headers:
            name = names[name_idx : names.index(b"\0", name_idx)].decode()
            sections[name] = b"" if sh_type == 8 else data[offset : offset + size]  # NOBITS
    except (struct.error, IndexError, ValueError, UnicodeDecodeError):
        raise ValueError("a damaged ELF file (its section headers cannot be read)") from None
    return sections


SHF_COMPRESSED = 0x800
#: how many ELF files one library may embed before the rest are not looked into
MAX_EMBEDDED = 4096


def compressed_sections(data: bytes) -> list[bytes]:
    """The ``SHF_COMPRESSED`` sections of the 64-bit ELF ``data`` (``-gz`` debug info),
    decompressed (zlib or zstd); one that does not decompress is left out."""
    import zstandard

    try:
        (shoff,) = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum, _ = struct.unpack_from("<HHH", data, 0x3A)
        headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    except struct.error:
        return []
    found = []
    for _name, _type, flags, _addr, offset, size in headers:
        if not flags & SHF_COMPRESSED or size < 24:
            continue
        kind, _reserved, unpacked = struct.unpack_from("<IIQ", data, offset)
        body = data[offset + 24 : offset + size]
        with contextlib.suppress(zlib.error, zstandard.ZstdError):
            if kind == 1 and unpacked <= NV_MAX_UNPACKED:
                found.append(zlib.decompress(body))
            elif kind == 2 and unpacked <= NV_MAX_UNPACKED:
                found.append(
                    zstandard.ZstdDecompressor().decompress(body, max_output_size=unpacked)
                )
    return found


def unpacked_views(data: bytes) -> list[bytes]:
    """Every form in which a library holds bytes: the file, each compressed section
    decompressed, and the same for every ELF it embeds (device code objects in an
    offload bundle, compressed CUDA fatbin entries decompressed) — to look for a
    string that compression would hide."""
    views = [data]
    embedded = [0]
    pos = 1
    while len(embedded) < MAX_EMBEDDED and (pos := data.find(b"\x7fELF", pos)) >= 0:
        embedded.append(pos)
        pos += 4
    with contextlib.suppress(ValueError):
        for container in nvidia_containers(elf_sections(data).get(".nv_fatbin", b"")):
            views += container.unpacked
    for start in embedded:
        views += compressed_sections(data[start:])
    for extra in list(views[1:]):
        if extra[:4] == b"\x7fELF":
            views += compressed_sections(extra)
    return views


def device_elf(data: bytes, machine: int) -> tuple[str, bool]:
    """(why ``data`` is no device ELF for ``machine`` or "", whether it has machine code)."""
    if not data:
        return "empty", False
    if data[:4] != b"\x7fELF" or len(data) < 20:
        return "not an ELF file", False
    (found,) = struct.unpack_from("<H", data, 18)
    if found != machine:
        return f"an ELF for machine {found}, not {machine}", False
    try:
        sections = elf_sections(data)
    except ValueError as exc:
        return str(exc), False
    return "", any(body for name, body in sections.items() if name.split(".")[1:2] == ["text"])


def label_mismatch(code: bytes, arch: str) -> str:
    """Why the AMDGPU ELF ``code`` is not code for the target ID ``arch`` its bundle
    label names ("" when its header agrees, or names a processor this table lacks)."""
    processor, want = _target_id(arch)
    (flags,) = struct.unpack_from("<I", code, 48)
    found = AMDGPU_MACH.get(flags & 0xFF)
    if processor not in AMDGPU_MACH.values():
        return ""
    if found != processor:
        said = found or f"an unknown processor (EF_AMDGPU_MACH {flags & 0xFF:#x})"
        return f"its ELF header says {said}, not {processor} as its label does"
    if code[8] < 2:  # code object v2/v3: no feature fields to compare
        return ""
    for name, (mask, shift) in AMDGPU_FEATURES.items():
        setting = AMDGPU_SETTING[(flags & mask) >> shift]
        expected = want.get(name, "any")
        if setting in ("-", "+") and setting != expected:  # code for one setting only
            return f"its ELF header says {processor}:{name}{setting}, not {arch} as its label does"
    return ""


def _bundle(blob: bytes, start: int) -> tuple[Container, int]:
    """The offload bundle at ``start`` and the offset where it ends."""
    pos, end, found = start + len(BUNDLE_MAGIC), start, []
    try:
        (count,) = struct.unpack_from("<Q", blob, pos)
        pos += 8
        for _ in range(count):
            offset, size, triple_len = struct.unpack_from("<QQQ", blob, pos)
            triple = blob[pos + 24 : pos + 24 + triple_len].decode()
            pos += 24 + triple_len
            end = max(end, pos, start + offset + size)
            if "amdgcn" not in triple:
                continue  # the host entry
            arch = triple.rsplit("--", 1)[-1] if "--" in triple else triple.rsplit("-", 1)[-1]
            code = blob[start + offset : start + offset + size]
            problem, functions = device_elf(code, EM_AMDGPU)
            if len(code) < size:
                problem = "cut short"
            problem = problem or label_mismatch(code, arch)
            found.append(
                CodeObject("amd", arch, "code object", size, triple, start, problem, functions)
            )
    except (struct.error, UnicodeDecodeError):
        raise ValueError(f"a damaged offload bundle at offset {start} of .hip_fatbin") from None
    return Container("amd", ".hip_fatbin", start, tuple(found)), end


def amd_containers(blob: bytes) -> list[Container]:
    """The clang offload bundles of a ``.hip_fatbin`` section, one after another."""
    found: list[Container] = []
    pos = 0
    while (start := blob.find(BUNDLE_MAGIC, pos)) >= 0:
        if blob.find(COMPRESSED_BUNDLE_MAGIC, pos, start) >= 0:
            break
        bundle, pos = _bundle(blob, start)
        found.append(bundle)
    if blob.find(COMPRESSED_BUNDLE_MAGIC, pos) >= 0:
        raise ValueError("compressed offload bundle: list it with `roc-obj-ls`")
    return found


def _nv_entry(blob: bytes, entry: int, container: int) -> tuple[CodeObject, int, bytes]:
    kind, _u, header, size = struct.unpack_from("<HHIQ", blob, entry)
    (arch,) = struct.unpack_from("<I", blob, entry + 28)
    flags, unpacked = 0, size
    if header >= 64:
        (flags,) = struct.unpack_from("<Q", blob, entry + 40)
        (unpacked,) = struct.unpack_from("<Q", blob, entry + 56)
    payload = blob[entry + header : entry + header + size]
    kind_name = NV_KINDS.get(kind, str(kind))
    problem, inflated = "", b""
    if kind_name == "elf" and flags & NV_COMPRESSED:
        (packed,) = struct.unpack_from("<I", blob, entry + 16)
        payload, problem = _nv_unpacked(payload, flags, packed, unpacked)
        inflated = payload
    if problem:
        functions = False
    elif kind_name != "elf":
        problem, functions = ("" if payload else "empty"), bool(payload)
    else:
        problem, functions = device_elf(payload, EM_CUDA)
        problem = problem or cuda_label_mismatch(payload, arch)
    obj = CodeObject("nvidia", f"sm_{arch}", kind_name, size, "", container, problem, functions)
    return obj, entry + header + size, inflated


def _nv_unpacked(payload: bytes, flags: int, packed: int, unpacked: int) -> tuple[bytes, str]:
    """A compressed fatbin entry's bytes, decompressed, or why not."""
    import lz4.block
    import zstandard

    method = "zstd" if flags & NV_ZSTD else "LZ4"
    data = payload[:packed] if 0 < packed <= len(payload) else payload
    if not data or not 0 < unpacked <= NV_MAX_UNPACKED:
        return b"", f"compressed ({method}), of no stated size"
    try:
        if flags & NV_ZSTD:
            out = zstandard.ZstdDecompressor().decompress(data, max_output_size=unpacked)
        else:
            out = lz4.block.decompress(data, uncompressed_size=unpacked)
    except (zstandard.ZstdError, lz4.block.LZ4BlockError) as exc:
        return b"", f"compressed ({method}) and it does not decompress: {exc}"
    if len(out) != unpacked:
        return b"", f"compressed ({method}) to {len(out)} bytes, not the {unpacked} it states"
    return out, ""


def cuda_label_mismatch(code: bytes, arch: int) -> str:
    """Why the CUDA ELF ``code`` is not code for ``sm_{arch}`` its fatbin entry names
    ("" when its header agrees)."""
    at = 48 if code[4] == 2 else 36  # e_flags in ELF64 / ELF32
    if len(code) < at + 4:
        return "cut short"
    (flags,) = struct.unpack_from("<I", code, at)
    sm = flags & 0xFF if code[8] <= 7 else (flags >> 8) & 0xFF
    if sm != arch:
        return f"its ELF header says sm_{sm}, not sm_{arch} as its fatbin entry does"
    return ""


def nvidia_containers(blob: bytes) -> list[Container]:
    """The fatbins of a ``.nv_fatbin`` section, one after another."""
    found: list[Container] = []
    pos = 0
    while pos + 16 <= len(blob):
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", blob, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # fatbins are 8-byte aligned inside the section
            continue
        entry, end, objects = pos + header_size, pos + header_size + fat_size, []
        inflated: list[bytes] = []
        try:
            while entry + 32 <= end:
                if struct.unpack_from("<I", blob, entry + 4)[0] == 0:
                    break
                obj, entry, code = _nv_entry(blob, entry, pos)
                objects.append(obj)
                inflated += [code] if code else []
        except struct.error:
            raise ValueError(f"a damaged fatbin at offset {pos} of .nv_fatbin") from None
        found.append(Container("nvidia", ".nv_fatbin", pos, tuple(objects), tuple(inflated)))
        pos = end
    return found


def containers(path: Path) -> list[Container]:
    sections = elf_sections(path.read_bytes())
    return amd_containers(sections.get(".hip_fatbin", b"")) + nvidia_containers(
        sections.get(".nv_fatbin", b"")
    )


def inspect(path: Path) -> list[CodeObject]:
    return [o for c in containers(path) for o in c.objects]


def _target_id(arch: str) -> tuple[str, dict[str, str]]:
    """``gfx90a:sramecc+:xnack-`` → ("gfx90a", {"sramecc": "+", "xnack": "-"})."""
    processor, *features = arch.split(":")
    return processor, {f[:-1]: f[-1] for f in features if len(f) > 1 and f[-1] in "+-"}


def uncovered(required: str, objects: tuple[CodeObject, ...]) -> list[str]:
    """The settings of the target ID ``required`` that no object in ``objects`` runs on,
    each as a target ID (``[]``: code for all of them is there)."""
    if required.startswith("sm_"):
        return [] if any(o.counts and o.arch == required for o in objects) else [required]
    processor, want = _target_id(required)
    codes = [f for p, f in (_target_id(o.arch) for o in objects if o.counts) if p == processor]
    free = sorted({name for c in codes for name in c} - set(want))
    missing = []
    for values in itertools.product("+-", repeat=len(free)):
        device = {**want, **dict(zip(free, values, strict=True))}
        if not any(all(device[f] == v for f, v in c.items()) for c in codes):
            missing.append(":".join([processor, *(f"{f}{device[f]}" for f in sorted(device))]))
    return missing


def _has(container: Container) -> str:
    listed = [o.arch + (f" ({o.kind})" if o.kind == "ptx" else "") for o in container.objects]
    listed = [a + (f" (not counted: {o.problem})" if o.problem else "")
              for a, o in zip(listed, container.objects, strict=True)]  # fmt: skip
    return ", ".join(listed) or "nothing"


def gaps(found: list[Container], archs: tuple[str, ...]) -> dict[str, list[str]]:
    """Required arch → where code for it is missing: every container of its vendor that
    runs code must hold code for it, and there must be one."""
    out: dict[str, list[str]] = {}
    for arch in archs:
        vendor = "nvidia" if arch.startswith("sm_") else "amd"
        mine = [c for c in found if c.vendor == vendor and c.runs_code]
        idle = [c for c in found if c.vendor == vendor and not c.runs_code]
        if not mine:
            out[arch] = [f"{c.name} holds no code that runs (it has: {_has(c)})" for c in idle]
            out[arch] = out[arch] or [
                f"no {vendor.upper()} GPU code" if found else "no GPU code at all"
            ]
        for c in mine:
            if lacking := uncovered(arch, c.objects):
                out.setdefault(arch, []).append(
                    f"{c.name} holds no code for {', '.join(lacking)} (it has: {_has(c)})"
                )
    return out


def require_archs(path: Path, archs: tuple[str, ...]) -> list[CodeObject]:
    found = containers(path)
    missing = gaps(found, archs)
    if missing:
        where = "; ".join(w for ws in missing.values() for w in ws)
        raise BuildFailed(
            f"{path} holds no code for {', '.join(missing)}: {where}",
            hint="pass the arch to the compiler for every source and prebuilt object "
            "(--offload-arch=gfx1030, -DCMAKE_HIP_ARCHITECTURES=gfx1030, -arch=sm_90) "
            "and build again",
        )
    return [o for c in found for o in c.objects]
