import pytest

import demo_stack

pytestmark = pytest.mark.gpu


def test_library_version_matches_the_package(lib):
    assert lib.demo_kernels_version() == demo_stack.KERNELS_VERSION
