"""Which GPU architectures a built library really holds code for.

Reads the ELF sections where the toolchains put device code — ``.hip_fatbin`` (clang
offload bundles, AMD) and ``.nv_fatbin`` (NVIDIA fatbins) — with no tool needed. A
library built without the target arch loads fine and fails only on the GPU ("no binary
for GPU"); this is the check that catches it at build time.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servegate.errors import BuildFailed

BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
COMPRESSED_BUNDLE_MAGIC = b"CCOB"
FATBIN_MAGIC = 0xBA55ED50
NV_KINDS = {1: "ptx", 2: "elf"}


@dataclass(frozen=True)
class CodeObject:
    vendor: str  # amd | nvidia
    arch: str  # gfx1030, sm_90, ...
    kind: str  # code object | elf | ptx
    size: int
    triple: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "vendor": self.vendor,
            "arch": self.arch,
            "kind": self.kind,
            "size": self.size,
            "triple": self.triple,
        }


def elf_sections(data: bytes) -> dict[str, bytes]:
    """Section name → contents of a 64-bit little-endian ELF file."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_off, names_size = headers[shstrndx][4], headers[shstrndx][5]
    names = data[names_off : names_off + names_size]
    sections = {}
    for name_idx, sh_type, _flags, _addr, offset, size in headers:
        name = names[name_idx : names.index(b"\0", name_idx)].decode()
        sections[name] = b"" if sh_type == 8 else data[offset : offset + size]  # 8: NOBITS
    return sections


def amd_code_objects(blob: bytes) -> list[CodeObject]:
    found: list[CodeObject] = []
    if COMPRESSED_BUNDLE_MAGIC in blob[:16]:
        raise ValueError("compressed offload bundle: list it with `roc-obj-ls`")
    for match in re.finditer(re.escape(BUNDLE_MAGIC), blob):
        pos = match.end()
        (count,) = struct.unpack_from("<Q", blob, pos)
        pos += 8
        for _ in range(count):
            _offset, size, triple_len = struct.unpack_from("<QQQ", blob, pos)
            pos += 24
            triple = blob[pos : pos + triple_len].decode()
            pos += triple_len
            if "amdgcn" in triple:
                arch = triple.rsplit("--", 1)[-1] if "--" in triple else triple.rsplit("-", 1)[-1]
                found.append(CodeObject("amd", arch, "code object", size, triple))
    return found


def nvidia_code_objects(blob: bytes) -> list[CodeObject]:
    found: list[CodeObject] = []
    pos = 0
    while pos + 16 <= len(blob):
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", blob, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # fatbins are 8-byte aligned inside the section
            continue
        entry, end = pos + header_size, pos + header_size + fat_size
        while entry + 32 <= end:
            kind, _u, entry_header, size = struct.unpack_from("<HHIQ", blob, entry)
            (arch,) = struct.unpack_from("<I", blob, entry + 28)
            if entry_header == 0:
                break
            found.append(CodeObject("nvidia", f"sm_{arch}", NV_KINDS.get(kind, str(kind)), size))
            entry += entry_header + size
        pos = end
    return found


def inspect(path: Path) -> list[CodeObject]:
    sections = elf_sections(path.read_bytes())
    objects = amd_code_objects(sections.get(".hip_fatbin", b""))
    objects += nvidia_code_objects(sections.get(".nv_fatbin", b""))
    return objects


def missing_archs(objects: list[CodeObject], archs: tuple[str, ...]) -> list[str]:
    """Configured archs with no device code (PTX does not count: it is not a binary)."""
    have = {o.arch.split(":")[0] for o in objects if o.kind != "ptx"}
    return [a for a in archs if a.split(":")[0] not in have]


def require_archs(path: Path, archs: tuple[str, ...]) -> list[CodeObject]:
    objects = inspect(path)
    missing = missing_archs(objects, archs)
    if missing:
        have = ", ".join(sorted({o.arch for o in objects})) or "no GPU code at all"
        raise BuildFailed(
            f"{path} holds no code for {', '.join(missing)} (it has: {have})",
            hint="pass the arch to the compiler (--offload-arch=gfx1030, "
            "-DCMAKE_HIP_ARCHITECTURES=gfx1030, -arch=sm_90) and build again",
        )
    return objects
