"""matmul_int8, the integer GEMM, against NumPy's integer product (reference.matmul_int8: exact int64
sums) on every backend: rows, columns and depth on and off the micro-kernels' multiples (rows: 6 and
4 a tile, 96 a task; columns: 32, 16 or 8 a panel; depth: 4 or 2 a step, 256 a slice), one row,
empty operands, the sums at int32's edge, the threads' split, and bad input named."""
import numpy as np
import pytest

from silkattn import _api
from silkattn import reference as ref

ROWS = [1, 2, 4, 5, 6, 7, 13, 95, 96, 97]
COLS = [1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 70]
DEPTHS = [1, 2, 3, 4, 5, 63, 255, 256, 257, 600]


def operands(rng, m, k, n, low=-128, high=128):
    return (rng.integers(low, high, (m, k), dtype=np.int8), rng.integers(low, high, (k, n), dtype=np.int8))


def exact(A, B):
    return A.astype(np.int64) @ B.astype(np.int64)


def test_reference_is_the_exact_integer_product(rng):
    A, B = operands(rng, 5, 300, 7)
    want = [[sum(int(A[i, t]) * int(B[t, j]) for t in range(300)) for j in range(7)] for i in range(5)]
    got = ref.matmul_int8(A, B)
    assert got.dtype == np.int32 and got.tolist() == want


@pytest.mark.parametrize("m", ROWS)
def test_rows_edges(any_backend, rng, m):
    for k, n in ((5, 33), (257, 17), (64, 32)):
        A, B = operands(rng, m, k, n)
        got = any_backend.matmul_int8(A, B)
        assert got.dtype == np.int32 and got.shape == (m, n)
        np.testing.assert_array_equal(got, exact(A, B))


@pytest.mark.parametrize("n", COLS)
def test_columns_edges(any_backend, rng, n):
    for m, k in ((1, 3), (7, 600), (97, 31)):
        A, B = operands(rng, m, k, n)
        np.testing.assert_array_equal(any_backend.matmul_int8(A, B), exact(A, B))


@pytest.mark.parametrize("k", DEPTHS)
def test_depth_edges(any_backend, rng, k):
    for m, n in ((1, 1), (6, 32), (13, 17)):
        A, B = operands(rng, m, k, n)
        np.testing.assert_array_equal(any_backend.matmul_int8(A, B), exact(A, B))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_kernel_split_over_threads(backend, rng, threads):
    """The kernel itself at 1-3 threads (the op gives small products one), on shapes whose tasks
    (96 rows x one panel) do not divide evenly: the same exact sums."""
    for m, k, n in ((1, 40, 70), (97, 33, 65), (200, 260, 100), (5, 7, 3)):
        A, B = operands(rng, m, k, n)
        out = np.full((m, n), 7, np.int32)
        backend.KERNELS.matmul_int8(A, B, out, threads)
        np.testing.assert_array_equal(out, exact(A, B))


def test_a_product_big_enough_for_two_threads(any_backend, threads, rng):
    A, B = operands(rng, 300, 700, 90)  # 19 M multiply-adds: two threads' worth
    np.testing.assert_array_equal(any_backend.matmul_int8(A, B), exact(A, B))


def test_empty_operands(any_backend):
    for m, k, n in ((0, 5, 3), (4, 5, 0), (4, 0, 3), (0, 0, 0)):
        got = any_backend.matmul_int8(np.zeros((m, k), np.int8), np.zeros((k, n), np.int8))
        assert got.shape == (m, n) and got.dtype == np.int32 and not got.any()


def test_sums_at_int32s_edge(backend):
    """At the deepest k allowed every product -128 x -128 sums to 2^31 - 16384 and -128 x 127 to its
    negative's neighbour: no intermediate (vpdpbusd's a + 128, its -128 sum(b) start) wraps."""
    k = _api.INT8_MAX_K
    A = np.full((7, k), -128, np.int8)
    A[1] = 127
    A[2, ::2] = 127
    B = np.full((k, 35), -128, np.int8)
    B[:, 1] = 127
    B[::3, 2] = 5
    got = backend.matmul_int8(A, B)
    np.testing.assert_array_equal(got, exact(A, B))
    assert got[0, 0] == 128 * 128 * k and got[0, 1] == -128 * 127 * k


def test_batched_strided_and_out(any_backend, rng):
    A = rng.integers(-128, 128, (2, 3, 50), dtype=np.int8)
    B = rng.integers(-128, 128, (40, 50), dtype=np.int8).T  # (50, 40), not C-contiguous
    got = any_backend.matmul_int8(A, B)
    assert got.shape == (2, 3, 40)
    np.testing.assert_array_equal(got, exact(A.reshape(6, 50), B).reshape(2, 3, 40))
    wide = rng.integers(-128, 128, (9, 100), dtype=np.int8)
    out = np.empty((9, 40), np.int32)
    assert any_backend.matmul_int8(wide[:, ::2], B, out=out) is out
    np.testing.assert_array_equal(out, exact(wide[:, ::2], B))


def test_bad_input_is_named(any_backend):
    A, B = np.zeros((3, 4), np.int8), np.zeros((4, 5), np.int8)
    with pytest.raises(TypeError, match="A must be an int8 array"):
        any_backend.matmul_int8(A.astype(np.float32), B)
    with pytest.raises(TypeError, match="B must be an int8 array"):
        any_backend.matmul_int8(A, B.astype(np.uint8))
    with pytest.raises(ValueError, match=r"B must have shape \(4, n\)"):
        any_backend.matmul_int8(A, np.zeros((5, 4), np.int8))
    with pytest.raises(ValueError, match="B must have shape"):
        any_backend.matmul_int8(A, np.zeros(4, np.int8))
    with pytest.raises(ValueError, match="at least one dimension"):
        any_backend.matmul_int8(np.int8(3), B)
    k = _api.INT8_MAX_K + 1
    with pytest.raises(ValueError, match=f"depth\\) is {k}"):
        any_backend.matmul_int8(np.zeros((1, k), np.int8), np.zeros((k, 1), np.int8))
    with pytest.raises(ValueError, match="out must have shape"):
        any_backend.matmul_int8(A, B, out=np.empty((3, 5), np.int64))
    with pytest.raises(ValueError, match="overlap"):
        buf = np.zeros((3, 5), np.int32)
        any_backend.matmul_int8(buf.view(np.int8)[:, :4], B, out=buf)


def test_kernel_refuses_operands_that_do_not_fit(backend):
    A, B = np.zeros((3, 4), np.int8), np.zeros((4, 5), np.int8)
    with pytest.raises(ValueError):
        backend.KERNELS.matmul_int8(A, np.zeros((5, 5), np.int8), np.empty((3, 5), np.int32), 1)
    with pytest.raises(ValueError):
        backend.KERNELS.matmul_int8(A, B, np.empty((3, 4), np.int32), 1)
