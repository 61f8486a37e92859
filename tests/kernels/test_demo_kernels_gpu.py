"""The demo stack's kernel built by servegate's own recipe for the GPU in this machine
(nvcc for NVIDIA, hipcc for AMD) and run there, compared with numpy."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import time
from importlib import resources
from pathlib import Path

import pytest

from servegate import config
from servegate.kernels.targets import build_all

pytestmark = pytest.mark.gpu
STACK = resources.files("servegate.demo") / "stack"


def gpu_arch() -> tuple[str, str] | None:
    """(compiler kind, arch) of the first GPU here, or None."""
    if shutil.which("nvidia-smi") and shutil.which("nvcc"):
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        )
        if out.returncode == 0 and out.stdout.strip():
            return "nvcc", "sm_" + out.stdout.split()[0].replace(".", "")
    if shutil.which("rocminfo") and shutil.which("hipcc"):
        out = subprocess.run(["rocminfo"], capture_output=True, text=True)
        names = [w for w in out.stdout.split() if w.startswith("gfx")]
        if names:
            return "hipcc", names[0]
    return None


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, float]:
    found = gpu_arch()
    if found is None:
        pytest.skip("no GPU: neither nvidia-smi+nvcc nor rocminfo+hipcc found a device")
    kind, arch = found
    checkout = tmp_path_factory.mktemp("stack")
    (checkout / "kernels").mkdir()
    for item in (STACK / "kernels").iterdir():
        (checkout / "kernels" / item.name).write_text(item.read_text())
    cfg = config.parse(
        f'[stack]\nremote = "x"\n[host]\nroot = "/x"\n[service]\nport = 1\ncommand = ["x"]\n'
        f'[build]\narchs = ["{arch}"]\n[[build.targets]]\nname = "demo_kernels"\nkind = "{kind}"\n'
        'sources = ["kernels/*.hip", "kernels/*.h"]\noutput = "build/libdemo_kernels.so"\n'
        'flags = ["-O2"]\n',
        environ={},
    )
    (checkout / "build").mkdir()
    start = time.monotonic()
    (result,) = build_all(cfg, checkout, None, dict(os.environ), checkout / "logs")
    seconds = time.monotonic() - start
    assert arch in {o["arch"] for objs in result.code_objects.values() for o in objs}
    return checkout / "build" / "libdemo_kernels.so", arch, seconds


def test_scale_add_matches_numpy(built: tuple[Path, str, float]) -> None:
    np = pytest.importorskip("numpy")
    lib_path, arch, build_s = built
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
        "(with allocation and copies)"
    )


def test_version_symbol_matches_the_header(built: tuple[Path, str, float]) -> None:
    lib = ctypes.CDLL(str(built[0]))
    header = (STACK / "kernels" / "version.h").read_text()
    assert f"DEMO_KERNELS_VERSION {lib.demo_kernels_version()}" in header


def test_small_and_odd_sizes(built: tuple[Path, str, float]) -> None:
    np = pytest.importorskip("numpy")
    lib = ctypes.CDLL(str(built[0]))
    lib.demo_scale_add.argtypes = [ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    for n in (1, 255, 257, 100_003):
        x = np.arange(n, dtype=np.float32)
        y = np.ones(n, dtype=np.float32)
        assert lib.demo_scale_add(-1.0, x.ctypes.data, y.ctypes.data, n) == 0
        np.testing.assert_array_equal(y, 1 - x)
