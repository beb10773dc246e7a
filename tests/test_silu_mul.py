"""The gates, silu_mul (SwiGLU's silu(G) * U) and gelu_tanh_mul (GeGLU's gelu_tanh(G) * U), on every
backend against the reference, in place on the two column halves of one projection's output without
a copy."""
import dataclasses

import numpy as np
import pytest

from silkattn import _api
from silkattn import reference as ref

from conftest import DTYPES, assert_close, f64

SHAPES = [(1,), (1, 1), (3, 17), (7, 3), (5, 576), (4, 1536), (2, 3, 1536), (130, 33), (0, 8)]


ACTIVATIONS = {"silu_mul": "silu", "gelu_tanh_mul": "gelu_tanh"}


@pytest.fixture(params=list(ACTIVATIONS))
def gate(request):  # the op's name
    return request.param


def expected(G, U, gate="silu_mul"):
    """The reference's gate, computed in float64 (exp(-G) overflowing to inf is part of it)."""
    G, U = f64(G, U)
    with np.errstate(over="ignore", invalid="ignore"):
        return ref.GATES[ACTIVATIONS[gate]](G) * U


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_silu_mul_matches_reference(any_backend, gate, threads, rng, shape, dtype):
    G = (rng.standard_normal(shape) * 4).astype(dtype)
    U = rng.standard_normal(shape).astype(dtype)
    assert_close(getattr(any_backend, gate)(G, U), expected(G, U, gate), dtype)
    out = np.empty_like(G)
    assert getattr(any_backend, gate)(G, U, out=out) is out
    assert_close(out, expected(G, U, gate), dtype)
    for target in ("G", "U"):  # in place, into either operand
        G2, U2 = G.copy(), U.copy()
        into = G2 if target == "G" else U2
        assert getattr(any_backend, gate)(G2, U2, out=into) is into
        assert_close(into, expected(G, U, gate), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d_ff", [1, 3, 17, 576, 1536])
def test_silu_mul_in_place_on_the_halves_of_a_projection(any_backend, gate, threads, rng, dtype, d_ff):
    """As the model calls it: G and U the two halves of one (rows, 2 d_ff) array, the gate written
    over G; the rows strided, the halves interleaved in memory but sharing nothing."""
    H = (rng.standard_normal((9, 2 * d_ff)) * 3).astype(dtype)
    before = H.copy()
    G, U = H[:, :d_ff], H[:, d_ff:]
    want = expected(G, U, gate)
    assert_close(getattr(any_backend, gate)(G, U), want, dtype)
    assert getattr(any_backend, gate)(G, U, out=G) is G
    assert_close(G, want, dtype)
    np.testing.assert_array_equal(U, before[:, d_ff:])
    H3 = before.reshape(3, 3, 2 * d_ff).copy()  # batched: (batch, seq, 2 d_ff)
    G3, U3 = H3[..., :d_ff], H3[..., d_ff:]
    assert getattr(any_backend, gate)(G3, U3, out=U3) is U3
    assert_close(U3.reshape(9, d_ff), want, dtype)
    np.testing.assert_array_equal(G3.reshape(9, d_ff), before[:, :d_ff])


def test_silu_mul_halves_reach_the_kernel_uncopied(backend, rng):
    seen = []

    def spy(g, go, u, uo, out, oo, *rest):
        seen.append((g, u, out))
        backend.KERNELS.silu_mul(g, go, u, uo, out, oo, *rest)

    kernels = dataclasses.replace(backend.KERNELS, silu_mul=spy)
    H = rng.standard_normal((6, 2 * 96)).astype(np.float32)
    G, U = H[:, :96], H[:, 96:]
    want = expected(G, U)
    assert _api.silu_mul(kernels, G, U, out=G) is G
    assert all(np.shares_memory(a, H) for a in seen[-1])
    assert_close(G, want, np.float32)


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # the numpy backend's -inf / inf
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_extremes_nan_and_inf(any_backend, gate, dtype):
    """Past exp's range silu(g) is -0 (the reference's exp(-g) overflows to inf); g = -inf gives NaN
    as in the reference (-inf / inf); NaN stays NaN. Lanes in the vector body and the tail alike."""
    g = np.array([-1e4, -800.0, -100.0, -88.5, -88.0, -20.0, -1e-30, 0.0, 1e-30, 20.0, 88.0, 100.0, 800.0,
                  1e4, np.nan, np.inf, -np.inf])
    G = np.tile(g, (3, 3)).astype(dtype)  # 51 columns: whole vectors and a tail
    U = np.tile([2.0, -3.0, 1e-20, 1e20], (3, 13))[:, :51].astype(dtype)
    out = getattr(any_backend, gate)(G, U)
    want = expected(G, U, gate)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(np.isinf(out), np.isinf(want))
    assert_close(out[finite], want[finite], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1e-30, 1e-3, 1e3, 1e30])
@pytest.mark.parametrize("operand", ["G", "U"])
def test_silu_mul_big_and_tiny_magnitudes(any_backend, gate, rng, operand, scale, dtype):
    """The result scales with U; with G, from G^2 / 2 (tiny) to G or -0 (big). Compared at unit scale."""
    G, U = rng.standard_normal((4, 100)) * 5, rng.standard_normal((4, 100))
    G, U = (G * scale, U) if operand == "G" else (G, U * scale)
    G, U = G.astype(dtype), U.astype(dtype)
    assert_close(getattr(any_backend, gate)(G, U) / dtype(scale), expected(G, U, gate) / scale, dtype)


def test_silu_mul_promotes_views_and_0d(any_backend, gate, rng):
    G = rng.standard_normal((6, 10)).astype(np.float32)
    U = rng.standard_normal((10, 6)).T  # float64, not contiguous
    out = getattr(any_backend, gate)(G, U)
    assert out.dtype == np.float64
    assert_close(out, expected(G, U, gate), np.float64)
    assert_close(getattr(any_backend, gate)(G[::-1, ::3], G[::2, ::3][:3].repeat(2, 0)),
                 expected(G[::-1, ::3], G[::2, ::3][:3].repeat(2, 0), gate), np.float32)
    assert_close(getattr(any_backend, gate)(G, G), expected(G, G, gate), np.float32)  # one array, both
    rows = np.broadcast_to(U[0], U.shape)  # one row for all: stride 0
    assert_close(getattr(any_backend, gate)(U, rows), expected(U, rows, gate), np.float64)
    assert_close(getattr(any_backend, gate)(np.float32(2.0), np.float32(3.0)),
                 expected(np.float32(2.0), np.float32(3.0), gate), np.float32)
