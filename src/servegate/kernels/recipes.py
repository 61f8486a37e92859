"""How each kind of GPU extension is compiled for a list of archs: hipcc, nvcc, CMake."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from servegate.config import KernelTarget
from servegate.errors import BuildFailed, ConfigError
from servegate.pipeline import proc

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
            if "version" in line.lower() or "release" in line.lower()
        ]
        versions[tool] = " | ".join(lines[:3]) or out.strip()[:200]
    return versions


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
        return [
            Step(
                ("hipcc", *arch_flags, "-fPIC", "-shared", *target.flags, *srcs, "-o", str(out)),
                env,
            )
        ]
    if kind == "nvcc":
        cu_srcs = [p for p in expand(checkout, target.sources) if p.suffix in COMPILED]
        lang = ["-x", "cu"] if any(p.suffix != ".cu" for p in cu_srcs) else []
        gencode: list[str] = []
        for arch in archs:
            num = arch.removeprefix("sm_")
            gencode += ["-gencode", f"arch=compute_{num},code=sm_{num}"]
        out = checkout / target.output
        argv = (
            "nvcc",
            *gencode,
            "-Xcompiler",
            "-fPIC",
            "-shared",
            *target.flags,
            *lang,
            *map(str, cu_srcs),
            "-o",
            str(out),
        )
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
