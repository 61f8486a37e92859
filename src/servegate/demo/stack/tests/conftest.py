import ctypes
from pathlib import Path

import pytest

LIBRARY = Path(__file__).resolve().parent.parent / "build" / "libdemo_kernels.so"


@pytest.fixture(scope="session")
def lib() -> ctypes.CDLL:
    if not LIBRARY.exists():
        pytest.skip(f"{LIBRARY} is not built: run `servegate build`")
    lib = ctypes.CDLL(str(LIBRARY))
    lib.demo_scale_add.argtypes = [ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    probe = (ctypes.c_float * 1)(0.0)
    if lib.demo_scale_add(1.0, ctypes.addressof(probe), ctypes.addressof(probe), 1) != 0:
        pytest.skip("no GPU: the kernel library found no GPU runtime or device")
    return lib


def scale_add(lib: ctypes.CDLL, a: float, x: list[float], y: list[float]) -> list[float]:
    n = len(x)
    xs, ys = (ctypes.c_float * n)(*x), (ctypes.c_float * n)(*y)
    assert lib.demo_scale_add(a, ctypes.addressof(xs), ctypes.addressof(ys), n) == 0
    return list(ys)
