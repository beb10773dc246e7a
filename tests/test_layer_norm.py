"""layer_norm on every compiled backend against the reference."""
import numpy as np
import pytest

from silkattn import reference as ref

from conftest import DTYPES, assert_close, f64

SHAPES = [(1, 1), (3, 5), (7, 64), (2, 3, 512), (100, 1000), (33, 768), (0, 8), (9,)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_layer_norm_matches_reference(backend, threads, rng, shape, dtype):
    X = (rng.standard_normal(shape) * 3 + 2).astype(dtype)
    g, b = (rng.standard_normal(shape[-1]).astype(dtype) for _ in range(2))
    assert_close(backend.layer_norm(X, g, b), ref.layer_norm(*f64(X, g, b)), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_large_offset_needs_two_passes(backend, rng, dtype):
    """A mean of 1e4 with unit spread: a one-pass float32 sum of squares would lose the variance."""
    X = (1e4 + rng.standard_normal((16, 512))).astype(dtype)
    g, b = np.ones(512, dtype), np.zeros(512, dtype)
    assert_close(backend.layer_norm(X, g, b), ref.layer_norm(*f64(X, g, b)), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_views_eps_and_broadcast_params(backend, rng, dtype):
    X = rng.standard_normal((40, 96)).astype(dtype)
    g, b = rng.standard_normal(96).astype(dtype), rng.standard_normal(96).astype(dtype)
    for view in (X[::-2], X[:, ::2], X.T):
        n = view.shape[-1]
        assert_close(backend.layer_norm(view, g[:n], b[:n], eps=1e-3),
                     ref.layer_norm(*f64(view, g[:n], b[:n]), eps=1e-3), dtype)
    assert_close(backend.layer_norm(X, dtype(2), b[None, :]),
                 ref.layer_norm(*f64(X, dtype(2), b[None, :])), dtype)
    constant = np.full((3, 96), 7, dtype)  # zero variance: the result is b
    assert_close(backend.layer_norm(constant, g, b), ref.layer_norm(*f64(constant, g, b)), dtype)


def test_layer_norm_out_and_errors(backend, rng):
    X = rng.standard_normal((6, 9)).astype(np.float32)
    g, b = np.ones(9, np.float32), np.zeros(9, np.float32)
    out = np.empty_like(X)
    assert backend.layer_norm(X, g, b, out=out) is out
    with pytest.raises(ValueError, match="g"):
        backend.layer_norm(X, np.ones(8, np.float32), b)
    with pytest.raises(ValueError, match="eps"):
        backend.layer_norm(X, g, b, eps=-1.0)
    with pytest.raises(TypeError, match="X"):
        backend.layer_norm(X.astype(int), g, b)
