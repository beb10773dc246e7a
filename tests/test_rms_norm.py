"""rms_norm and add_rms_norm (a residual add and the norm after it, fused) on every backend against
the reference."""
import numpy as np
import pytest

from silkattn import reference as ref

from conftest import DTYPES, assert_close, f64

SHAPES = [(1, 1), (1, 576), (3, 5), (7, 3), (4, 1), (2, 3, 17), (33, 576), (100, 1536), (0, 8), (9,)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm_matches_reference(any_backend, threads, rng, shape, dtype):
    X = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
    g = rng.standard_normal(shape[-1]).astype(dtype)
    assert_close(any_backend.rms_norm(X, g), ref.rms_norm(*f64(X, g)), dtype)
    out = np.empty_like(X)
    assert any_backend.rms_norm(X, g, eps=1e-3, out=out) is out
    assert_close(out, ref.rms_norm(*f64(X, g), eps=1e-3), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1e-15, 1e-3, 1e4, 1e15])
def test_rms_norm_big_and_tiny_magnitudes(any_backend, rng, scale, dtype):
    """No mean is subtracted, so nothing cancels at any scale; eps scales along, so that it
    neither swamps tiny rows nor vanishes next to big ones."""
    X = (rng.standard_normal((5, 576)) * scale).astype(dtype)
    g = rng.standard_normal(576).astype(dtype)
    eps = 1e-6 * scale**2
    assert_close(any_backend.rms_norm(X, g, eps), ref.rms_norm(*f64(X, g), eps), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_views_gains_and_promotion(any_backend, rng, dtype):
    X = rng.standard_normal((40, 96)).astype(dtype)
    g = rng.standard_normal(96).astype(dtype)
    for view in (X[::-2], X[:, ::2], X.T, X[:, 5:70]):
        n = view.shape[-1]
        assert_close(any_backend.rms_norm(view, g[:n], eps=1e-3), ref.rms_norm(*f64(view, g[:n]), eps=1e-3),
                     dtype)
    assert_close(any_backend.rms_norm(X, dtype(2)), ref.rms_norm(*f64(X, dtype(2))), dtype)  # a scalar gain
    assert_close(any_backend.rms_norm(X, g[None, :]), ref.rms_norm(*f64(X, g)), dtype)
    Y = any_backend.rms_norm(X.astype(np.float32), g.astype(np.float64))  # a float64 gain: float64, as numpy
    assert_close(Y, ref.rms_norm(*f64(X.astype(np.float32), g)), np.float64)
    zeros = np.zeros((3, 96), dtype)  # eps keeps the scale finite: a zero row stays zero
    np.testing.assert_array_equal(any_backend.rms_norm(zeros, g), zeros)


@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_rms_norm_nan_and_inf_propagate_like_the_reference(any_backend):
    X = np.array([[1.0, np.nan, 3.0, 4.0], [1.0, 2.0, np.inf, 0.5], [0.0, 1.0, 2.0, -1.0]])
    g = np.ones(4)
    for dtype in DTYPES:
        Xd = X.astype(dtype)
        np.testing.assert_array_equal(np.isnan(any_backend.rms_norm(Xd, g.astype(dtype))),
                                      np.isnan(ref.rms_norm(Xd, g.astype(dtype))))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (2, 17, 576), (100, 384), (7, 1536), (4, 3), (0, 8)])
def test_add_rms_norm_matches_reference(any_backend, threads, rng, shape, dtype):
    X, R = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    g = rng.standard_normal(shape[-1]).astype(dtype)
    S, Y = any_backend.add_rms_norm(X, R, g, eps=1e-5)
    np.testing.assert_array_equal(S, X + R)  # the sum in the dtype, as numpy rounds it
    assert S.dtype == Y.dtype == dtype
    assert_close(Y, ref.rms_norm(*f64(X + R, g)), dtype)


def test_add_rms_norm_promotes_and_accepts_views(any_backend, rng):
    X = rng.standard_normal((8, 24)).astype(np.float32)
    R = rng.standard_normal((24, 8)).astype(np.float32).T  # not contiguous
    S, Y = any_backend.add_rms_norm(X, R, np.ones(24), eps=1e-3)  # a float64 g: Y float64
    assert S.dtype == np.float32 and Y.dtype == np.float64
    assert_close(Y, ref.rms_norm(*f64(X + R, np.ones(24)), eps=1e-3), np.float64)
    S, Y = any_backend.add_rms_norm(X, R.astype(np.float64), np.ones(24, np.float32))  # a float64 R: S too
    assert S.dtype == Y.dtype == np.float64
    assert_close(Y, ref.rms_norm(*f64(X.astype(np.float64) + R, np.ones(24))), np.float64)
