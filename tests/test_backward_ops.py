"""The backward ops other than attention's (silkattn.ops: softmax_backward, layer_norm_backward,
rms_norm_backward, linear_backward, feed_forward_backward, embedding_backward, cross_entropy and
cross_entropy_backward) on every backend against the reference (itself checked by finite
differences, tests/test_reference_backward.py), float32 and float64 (silkattn._testing.TOL_GRAD),
1 and 2 threads; the gains' gradients independent of the thread count; cross-entropy's logits made
a block at a time; bad input refused naming the argument."""
import numpy as np
import pytest

from silkattn import _backward
from silkattn import reference as ref
from silkattn._testing import TOL_GRAD, assert_close

from conftest import DTYPES, f64

SHAPES = [(3, 7), (2, 5, 33), (130, 64), (1, 1000)]


def close(actual, expected, dtype):
    assert_close(actual, np.asarray(expected).astype(dtype), dtype, table=TOL_GRAD)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_backward(any_backend, rng, shape, dtype, threads):
    X, dY = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    Y = ref.softmax(X)
    close(any_backend.softmax_backward(dY, Y), ref.softmax_backward(*f64(dY, Y)), dtype)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_backward(any_backend, rng, shape, dtype, threads):
    X, dY = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    X += dtype(3)  # an offset mean, as activations have
    g = rng.standard_normal(shape[-1]).astype(dtype)
    for got, want in zip(any_backend.layer_norm_backward(dY, X, g), ref.layer_norm_backward(*f64(dY, X, g))):
        close(got, want, dtype)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_backward(any_backend, rng, shape, dtype, threads):
    X, dY = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    g = rng.standard_normal(shape[-1]).astype(dtype)
    want = ref.rms_norm_backward(*f64(dY, X, g), 1e-6)
    for got, want in zip(any_backend.rms_norm_backward(dY, X, g, 1e-6), want):
        close(got, want, dtype)


def test_gain_gradients_do_not_depend_on_threads(backend, rng):
    import silkattn
    X, dY = (rng.standard_normal((1000, 48)).astype(np.float32) for _ in range(2))
    g = rng.standard_normal(48).astype(np.float32)
    results = []
    for n in (1, 2):
        previous = silkattn.set_num_threads(n)
        try:
            results.append(backend.layer_norm_backward(dY, X, g) + backend.rms_norm_backward(dY, X, g))
        finally:
            silkattn.set_num_threads(previous)
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_and_feed_forward_backward(any_backend, rng, dtype):
    X = rng.standard_normal((2, 9, 16)).astype(dtype)
    W1, W2 = rng.standard_normal((16, 40)).astype(dtype), rng.standard_normal((40, 16)).astype(dtype)
    b1, b2 = rng.standard_normal(40).astype(dtype), rng.standard_normal(16).astype(dtype)
    dY = rng.standard_normal((2, 9, 16)).astype(dtype)
    dZ = rng.standard_normal((2, 9, 40)).astype(dtype)
    for got, want in zip(any_backend.linear_backward(dZ, X, W1), ref.linear_backward(*f64(dZ, X, W1))):
        close(got, want, dtype)
    for activation in ("relu", "gelu"):
        got = any_backend.feed_forward_backward(dY, X, W1, b1, W2, b2, activation)
        want = ref.feed_forward_backward(*f64(dY, X, W1, b1, W2, b2), activation)
        for g, w in zip(got, want):
            close(g, w, dtype)


def test_embedding_backward(any_backend, rng):
    ids = rng.integers(0, 11, (3, 40))
    ids[0, :5] = 4  # a token many times
    dX = rng.standard_normal((3, 40, 8))
    got = any_backend.embedding_backward(dX, ids, 13)
    np.testing.assert_allclose(got, ref.embedding_backward(dX, ids, 13), rtol=1e-12, atol=1e-12)
    assert not got[11:].any()  # tokens never seen


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block", [None, 3])
def test_cross_entropy(any_backend, rng, monkeypatch, dtype, block):
    if block:  # logits made 3 rows at a time: the blocks' sums and gradients put together
        monkeypatch.setattr(_backward, "LOGIT_ELEMENTS", 3 * 50)
    H = rng.standard_normal((2, 10, 16)).astype(dtype)
    E = rng.standard_normal((50, 16)).astype(dtype)
    t = rng.integers(0, 50, (2, 10))
    loss = any_backend.cross_entropy(H, E, t)
    assert abs(loss - ref.cross_entropy(*f64(H, E), t)) < 1e-5 * abs(loss)
    want = ref.cross_entropy_backward(*f64(H, E), t, 0.5)
    for got, want in zip(any_backend.cross_entropy_backward(H, E, t, 0.5), want):
        close(got, want, dtype)
    both = any_backend.cross_entropy_and_grads(H, E, t)  # one pass: the two ops' answers, dloss 1
    assert both[0] == loss
    for got, want in zip(both[1:], ref.cross_entropy_backward(*f64(H, E), t, 1.0)):
        close(got, want, dtype)


def test_bad_input(any_backend, rng):
    X = rng.standard_normal((4, 8)).astype(np.float32)
    g = np.ones(8, np.float32)
    with pytest.raises(ValueError, match="dY"):
        any_backend.layer_norm_backward(X[:, :4], X, g)
    with pytest.raises(ValueError, match="g"):
        any_backend.rms_norm_backward(X, X, g[:4])
    with pytest.raises(TypeError, match="dY"):
        any_backend.softmax_backward(X.astype(int), X)
    with pytest.raises(ValueError, match="eps"):
        any_backend.rms_norm_backward(X, X, g, eps=0)
    with pytest.raises(ValueError, match="dY"):
        any_backend.linear_backward(X, X, np.ones((8, 3), np.float32))
    with pytest.raises(ValueError, match="activation"):
        any_backend.feed_forward_backward(X, X, np.ones((8, 3)), np.ones(3), np.ones((3, 8)), np.ones(8),
                                          "tanh")
    with pytest.raises(ValueError, match="ids"):
        any_backend.embedding_backward(X, np.array([0, 1, 2, 99]), 10)
    with pytest.raises(TypeError, match="ids"):
        any_backend.embedding_backward(X, np.zeros(4), 10)
    with pytest.raises(ValueError, match="targets"):
        any_backend.cross_entropy(X, np.ones((10, 8)), np.array([0, 1, 2, 10]))
    with pytest.raises(ValueError, match="targets"):
        any_backend.cross_entropy(X, np.ones((10, 8)), np.array([0, 1]))
    with pytest.raises(ValueError, match="share d"):
        any_backend.cross_entropy(X, np.ones((10, 7)), np.array([0, 1, 2, 3]))
