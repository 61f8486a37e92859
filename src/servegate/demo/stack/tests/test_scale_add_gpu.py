import pytest

from tests.conftest import scale_add

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("n", [1, 255, 256, 257, 65_537])
def test_matches_the_host(lib, n):
    x = [float(i % 97) for i in range(n)]
    y = [1.0] * n
    assert scale_add(lib, 2.0, x, y) == [1.0 + 2.0 * v for v in x]


def test_negative_scale(lib):
    assert scale_add(lib, -1.0, [1.0, 2.0], [0.0, 0.0]) == [-1.0, -2.0]
