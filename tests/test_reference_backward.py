"""The reference's backward passes (silkattn.reference, the training section) against central
finite differences in float64: each gradient of L = sum(R * forward(...)) for a fixed random R,
entry by entry, over masks, causal offsets, grouped-query heads, windows, scale, softcap, bias and
ALiBi for attention."""
import numpy as np
import pytest

from silkattn import reference as ref


def numeric(loss, x, eps=1e-6):
    """dL/dx by central differences, x changed in place and put back."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        keep = x[i]
        x[i] = keep + eps
        up = loss()
        x[i] = keep - eps
        down = loss()
        x[i] = keep
        g[i] = (up - down) / (2 * eps)
    return g


def close(analytic, x, loss):
    expected = numeric(loss, x)
    assert analytic.shape == x.shape
    np.testing.assert_allclose(analytic, expected, rtol=1e-6, atol=1e-8 * max(1.0, np.abs(expected).max()))


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def test_softmax(rng):
    X, R = rng.standard_normal((3, 7)), rng.standard_normal((3, 7))
    close(ref.softmax_backward(R, ref.softmax(X)), X, lambda: (R * ref.softmax(X)).sum())


ATTENTION = {  # name: (Hq, Hkv, Sq, Sk, d_k, d_v, keywords; "mask": a random mask with a hidden row)
    "plain": (2, 2, 5, 5, 4, 4, {}),
    "cross, d_k != d_v": (2, 2, 3, 6, 4, 5, {}),
    "mask": (2, 2, 4, 6, 4, 4, {"mask": True}),
    "causal, q_offset": (2, 2, 3, 7, 4, 4, {"causal": True, "q_offset": 4}),
    "grouped-query": (4, 2, 4, 4, 3, 3, {"causal": True}),
    "multi-query": (3, 1, 4, 5, 3, 3, {}),
    "window": (2, 2, 6, 6, 4, 4, {"causal": True, "window": (2, 0)}),
    "scale, softcap": (2, 2, 4, 4, 4, 4, {"scale": 0.7, "softcap": 1.5}),
    "bias": (2, 2, 4, 5, 4, 4, {"bias": True}),
    "alibi": (2, 1, 4, 4, 4, 4, {"alibi_slopes": np.array([0.5, 0.25]), "causal": True}),
}


@pytest.mark.parametrize("name", ATTENTION)
def test_attention(rng, name):
    hq, hkv, sq, sk, dk, dv, kw = ATTENTION[name]
    kw = dict(kw)
    Q, K, V = (rng.standard_normal(s) for s in ((2, hq, sq, dk), (2, hkv, sk, dk), (2, hkv, sk, dv)))
    if kw.pop("mask", False):
        mask = rng.random((2, hq, sq, sk)) < 0.7
        mask[0, 1, 2] = False  # a row sees no key: the mean of V, its scores' gradient zero
        kw["mask"] = mask
    if kw.pop("bias", False):
        kw["bias"] = rng.standard_normal((hq, sq, sk))
    R = rng.standard_normal((2, hq, sq, dv))
    out, lse = ref.attention(Q, K, V, return_lse=True, **kw)
    assert np.array_equal(out, ref.attention(Q, K, V, **kw)) and lse.shape == out.shape[:-1]
    dQ, dK, dV = ref.attention_backward(R, Q, K, V, out, lse, **kw)
    for analytic, x in ((dQ, Q), (dK, K), (dV, V)):
        close(analytic, x, lambda: (R * ref.attention(Q, K, V, **kw)).sum())


def test_attention_broadcast_operands(rng):
    """Q shared by a batch of K/V (and K/V shared by a batch of queries): each gradient has its
    operand's shape, the batch's sum."""
    for qs, ks in (((1, 2, 4, 3), (3, 2, 5, 3)), ((3, 2, 4, 3), (1, 2, 5, 3)), ((4, 3), (2, 2, 5, 3))):
        Q, K, V = rng.standard_normal(qs), rng.standard_normal(ks), rng.standard_normal(ks)
        out, lse = ref.attention(Q, K, V, return_lse=True, causal=True, q_offset=1)
        R = rng.standard_normal(out.shape)
        grads = ref.attention_backward(R, Q, K, V, out, lse, causal=True, q_offset=1)
        for analytic, x in zip(grads, (Q, K, V)):
            close(analytic, x, lambda: (R * ref.attention(Q, K, V, causal=True, q_offset=1)).sum())


def test_lse_is_the_log_of_the_scores_exponentials(rng):
    Q, K, V = rng.standard_normal((3, 5, 4)), rng.standard_normal((3, 6, 4)), rng.standard_normal((3, 6, 4))
    lse = ref.attention(Q, K, V, return_lse=True)[1]
    assert np.allclose(lse, np.log(np.exp(Q @ K.swapaxes(-1, -2) / 2).sum(-1)), rtol=1e-12)


def test_norms(rng):
    X, g, b, R = rng.standard_normal((2, 3, 6)), rng.standard_normal(6), rng.standard_normal(6), \
        rng.standard_normal((2, 3, 6))
    dX, dg, db = ref.layer_norm_backward(R, X, g)
    for analytic, x in ((dX, X), (dg, g), (db, b)):
        close(analytic, x, lambda: (R * ref.layer_norm(X, g, b)).sum())
    dX, dg = ref.rms_norm_backward(R, X, g, 1e-3)
    for analytic, x in ((dX, X), (dg, g)):
        close(analytic, x, lambda: (R * ref.rms_norm(X, g, 1e-3)).sum())


def test_linear(rng):
    X, W, b, R = rng.standard_normal((2, 3, 5)), rng.standard_normal((5, 4)), rng.standard_normal(4), \
        rng.standard_normal((2, 3, 4))
    dX, dW, db = ref.linear_backward(R, X, W)
    for analytic, x in ((dX, X), (dW, W), (db, b)):
        close(analytic, x, lambda: (R * (X @ W + b)).sum())


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_feed_forward(rng, activation):
    X, W1, b1, W2, b2 = (rng.standard_normal(s) for s in ((2, 3, 5), (5, 7), (7,), (7, 5), (5,)))
    R = rng.standard_normal((2, 3, 5))

    def loss():
        H = X @ W1 + b1
        return (R * ((np.maximum(H, 0) if activation == "relu" else ref.gelu(H)) @ W2 + b2)).sum()
    grads = ref.feed_forward_backward(R, X, W1, b1, W2, b2, activation)
    for analytic, x in zip(grads, (X, W1, b1, W2, b2)):
        close(analytic, x, loss)
    if activation == "relu":  # the listing's feed_forward is the ReLU one
        assert np.allclose(loss(), (R * ref.feed_forward(X, W1, b1, W2, b2)).sum())
    with pytest.raises(ValueError, match="activation"):
        ref.feed_forward_backward(R, X, W1, b1, W2, b2, "tanh")


def test_gelu_grad(rng):
    x = rng.standard_normal(9) * 3
    close(ref.gelu_grad(x), x, lambda: ref.gelu(x).sum())


def test_embedding(rng):
    E, ids = rng.standard_normal((6, 4)), np.array([[1, 3, 1], [0, 1, 5]])
    R = rng.standard_normal((2, 3, 4))
    dE = ref.embedding_backward(R, ids, 6)
    close(dE, E, lambda: (R * E[ids]).sum())
    assert not dE[[2, 4]].any()  # tokens not seen


def test_cross_entropy_with_the_tied_projection(rng):
    H, E = rng.standard_normal((2, 3, 4)), rng.standard_normal((7, 4))
    targets = np.array([[0, 6, 2], [2, 2, 5]])
    dH, dE = ref.cross_entropy_backward(H, E, targets, dloss=0.5)
    for analytic, x in ((dH, H), (dE, E)):
        close(analytic, x, lambda: 0.5 * ref.cross_entropy(H, E, targets))
    logits = H @ E.T  # the plain definition
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    expected = -np.log(np.take_along_axis(p, targets[..., None], -1)).mean()
    assert np.isclose(ref.cross_entropy(H, E, targets), expected)
