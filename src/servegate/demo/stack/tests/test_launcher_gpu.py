import pytest

from demo_stack import serve

pytestmark = pytest.mark.gpu


def test_launcher_loads_the_checkouts_library(lib):
    loaded = serve.load_kernels(serve.LIBRARY)
    assert loaded.demo_kernels_version() == lib.demo_kernels_version()


def test_launcher_refuses_another_version(lib, monkeypatch):
    monkeypatch.setattr(serve.demo_stack, "KERNELS_VERSION", -1)
    with pytest.raises(SystemExit, match="expected -1"):
        serve.load_kernels(serve.LIBRARY)
