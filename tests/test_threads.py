"""silkattn.set_num_threads(n) governs every thread of silkattn's calls: numpy's BLAS runs n threads
inside them (silkattn._blas) and the user's setting outside; where numpy's BLAS is OpenBLAS, the
GEMMs run on silkattn's own team (Kernels.gemm, gemm_q: the library's sgemm a panel a thread),
within the tolerance table of the exact product under every OpenBLAS setting (not numpy's matmul's
bits: with OpenBLAS's Haswell kernel a column's sums depend on the panel around it). (The speed of it
is measured in bench/threads.py.)"""
import threading

import numpy as np
import pytest

import silkattn
from silkattn import _blas
from silkattn.quant import QuantizedMatrix

from conftest import assert_close, f64

blas = _blas.controls()
needs_blas = pytest.mark.skipif(not blas, reason="no BLAS with a thread count silkattn can set")


def blas_counts():
    return [get() for _, get in blas]


@needs_blas
def test_blas_runs_silkattn_count_inside_its_calls_and_the_users_outside(rng):
    before = blas_counts()
    previous = silkattn.set_num_threads(1)
    try:
        with _blas.threads():
            assert blas_counts() == [1] * len(blas)
            with _blas.threads(1):  # nested, as an op inside a model: still one, the outer exit restores
                assert blas_counts() == [1] * len(blas)
            assert blas_counts() == [1] * len(blas)
        assert blas_counts() == before
        X, W = rng.standard_normal((64, 256)).astype(np.float64), rng.standard_normal((256, 128))
        silkattn.linear(X, W)  # float64: numpy's matmul, inside _blas.threads()
        assert blas_counts() == before
    finally:
        silkattn.set_num_threads(previous)


@needs_blas
def test_concurrent_calls_restore_the_users_count(rng):
    """Two Python threads in and out of silkattn's GEMMs: the count goes back once both left."""
    before = blas_counts()
    X, W = rng.standard_normal((300, 300)), rng.standard_normal((300, 300))
    errors = []

    def work():
        try:
            for _ in range(20):
                silkattn.linear(X, W)
        except Exception as e:  # pragma: no cover (reported below)
            errors.append(e)
    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert blas_counts() == before


def test_set_num_threads_refuses_what_is_not_a_count():
    for bad, error in ((0, ValueError), (-2, ValueError), (1.5, TypeError), ("2", TypeError),
                       (True, TypeError)):
        with pytest.raises(error):
            silkattn.set_num_threads(bad)


def _team_backends():
    """The backend modules with the team GEMMs (cython, numba), where numpy's BLAS is OpenBLAS."""
    found = []
    for name in ("cython", "numba"):
        try:
            module = __import__(f"silkattn.{name}", fromlist=["KERNELS"])
        except ImportError:
            continue
        if module.KERNELS.gemm is not None and _blas.sgemm() is not None:
            found.append(module)
    return found


TEAM = _team_backends()
team = pytest.mark.parametrize("be", TEAM, ids=[m.__name__.rsplit(".", 1)[-1] for m in TEAM])


@pytest.mark.blas
@team
@pytest.mark.parametrize("m, k, n", [(9, 64, 64), (40, 200, 1000), (300, 576, 960), (17, 33, 7),
                                     (256, 96, 130)])
@pytest.mark.parametrize("order", ["C", "F"])
def test_the_team_gemm_is_the_product_within_the_tolerance_table(be, threads, rng, m, k, n, order):
    X = rng.standard_normal((m, k)).astype(np.float32)
    W = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    W = np.asfortranarray(W) if order == "F" else W
    assert_close(be.linear(X, W), np.matmul(*f64(X, W)), np.float32)


@pytest.mark.blas
@team
@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q4_1"])
@pytest.mark.parametrize("m, k, n", [(33, 64, 64), (256, 576, 960), (40, 1536, 300)])
def test_the_team_gemm_of_blocks_is_the_dequantized_product_within_the_tolerance_table(be, threads, rng, kind,
                                                                                      m, k, n):
    size = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}[kind]
    blocks = rng.integers(0, 256, (n, k // 32, size), dtype=np.uint8)
    blocks[:, :, :2 if kind != "Q4_1" else 4] = np.frombuffer(np.float16(0.01).tobytes() * 2, np.uint8)[
        :2 if kind != "Q4_1" else 4]
    W = QuantizedMatrix(kind, blocks.reshape(n, -1))
    X = (rng.standard_normal((m, k)) / np.sqrt(k)).astype(np.float32)  # products of order 1
    assert_close(be.linear(X, W), np.matmul(*f64(X, W.dequantize())), np.float32)


@team
def test_the_team_gemm_kernels_check_their_shapes(be):
    K = be.KERNELS
    x, w = np.ones((16, 32), np.float32), np.ones((32, 64), np.float32)
    address, ilp64 = _blas.sgemm()
    with pytest.raises(ValueError, match="gemm"):
        K.gemm(x, w, np.empty((16, 65), np.float32), False, address, ilp64, 1)
    with pytest.raises(ValueError, match="gemm"):
        K.gemm(x, w, np.empty((16, 64), np.float32), True, address, ilp64, 1)
    blocks = np.zeros((64, 34), np.uint8)
    with pytest.raises(ValueError, match="gemm_q"):
        K.gemm_q(np.ones((16, 64), np.float32), blocks, 0, np.empty((16, 64), np.float32), address, ilp64, 1)
