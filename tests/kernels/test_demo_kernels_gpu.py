"""The demo stack's kernel on a real GPU, compared with numpy. One source, two vendors:
nvcc for NVIDIA (arch from the device), hipcc for AMD."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import time
from importlib import resources
from pathlib import Path

import pytest

from servegate.kernels.inspect import inspect

pytestmark = pytest.mark.gpu
STACK = resources.files("servegate.demo") / "stack"


def nvidia_arch() -> str | None:
    if not shutil.which("nvidia-smi") or not shutil.which("nvcc"):
        return None
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    )
    cap = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
    return "sm_" + cap.replace(".", "") if cap else None


def amd_arch() -> str | None:
    if not shutil.which("rocminfo") or not shutil.which("hipcc"):
        return None
    out = subprocess.run(["rocminfo"], capture_output=True, text=True)
    names = [w for w in out.stdout.split() if w.startswith("gfx")]
    return names[0] if names else None


def build(tmp_path: Path) -> tuple[Path, str, float]:
    src = tmp_path / "demo_kernels.cu"
    src.write_text((STACK / "kernels" / "demo_kernels.hip").read_text())
    (tmp_path / "portable.h").write_text((STACK / "kernels" / "portable.h").read_text())
    lib = tmp_path / "libdemo_kernels.so"
    start = time.monotonic()
    if arch := nvidia_arch():
        cmd = [
            "nvcc",
            f"-arch={arch}",
            "-Xcompiler",
            "-fPIC",
            "-shared",
            "-O2",
            "-DDEMO_KERNELS_VERSION=1",
            str(src),
            "-o",
            str(lib),
        ]
        subprocess.run(cmd, check=True)
    elif arch := amd_arch():
        cmd = [
            "hipcc",
            f"--offload-arch={arch}",
            "-fPIC",
            "-shared",
            "-O2",
            "-DDEMO_KERNELS_VERSION=1",
            str(src),
            "-o",
            str(lib),
        ]
        subprocess.run(cmd, check=True, env=dict(os.environ, HIP_PLATFORM="amd"))
    else:
        pytest.skip("no GPU: neither nvidia-smi+nvcc nor rocminfo+hipcc found a device")
    return lib, arch, time.monotonic() - start


def test_scale_add_matches_numpy_on_the_gpu(tmp_path: Path) -> None:
    lib_path, arch, build_s = build(tmp_path)
    np = pytest.importorskip("numpy")
    assert arch in {o.arch for o in inspect(lib_path)}
    lib = ctypes.CDLL(str(lib_path))
    lib.demo_scale_add.argtypes = [ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    rng = np.random.default_rng(0)
    n = 1 << 22
    x = rng.standard_normal(n, dtype=np.float32)
    y = rng.standard_normal(n, dtype=np.float32)
    want = y + np.float32(2.5) * x
    start = time.monotonic()
    assert lib.demo_scale_add(2.5, x.ctypes.data, y.ctypes.data, n) == 0
    run_s = time.monotonic() - start
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)
    print(
        f"\n{arch}: build {build_s:.2f}s, scale_add over {n} floats {run_s * 1000:.1f} ms "
        "(incl. allocation and copies)"
    )
