"""softmax on every compiled backend against the reference."""
import numpy as np
import pytest

from silkattn import reference as ref

from conftest import DTYPES, assert_close, f64

SHAPES = [(1,), (5,), (3, 1), (4, 7), (17, 33), (2, 3, 130), (64, 1000), (0, 4)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_softmax_matches_reference(backend, threads, rng, shape, dtype):
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    assert_close(backend.softmax(x), ref.softmax(*f64(x)), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_of_views_and_extremes(backend, rng, dtype):
    x = (rng.standard_normal((40, 30)) * 50).astype(dtype)
    x[3, :] = -1e9
    x[4, 7] = 1e4
    for view in (x, x.T, x[::2, ::-3], x[::-1]):
        assert_close(backend.softmax(view), ref.softmax(*f64(view)), dtype)


def test_softmax_out_and_errors(backend, rng):
    x = rng.standard_normal((6, 9)).astype(np.float32)
    out = np.empty_like(x)
    assert backend.softmax(x, out=out) is out
    assert_close(out, ref.softmax(x))
    with pytest.raises(TypeError, match="x"):
        backend.softmax(np.arange(6).reshape(2, 3))
    with pytest.raises(ValueError, match="out"):
        backend.softmax(x, out=np.empty((6, 8), np.float32))
    with pytest.raises(ValueError, match="out"):
        backend.softmax(x, out=x)
    with pytest.raises(ValueError, match="zero-length"):
        backend.softmax(np.empty((3, 0)))
