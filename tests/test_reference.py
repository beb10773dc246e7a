"""silkattn.reference against independent loops, against the seed listing, and its properties."""
import numpy as np
import pytest

from silkattn import reference as ref

from loops import attention_loops, layer_norm_loops, softmax_loops

ATT_SHAPES = [  # (lead_q, lead_kv, Sq, Sk, d_k, d_v)
    ((), (), 5, 5, 4, 4),
    ((), (), 3, 7, 8, 5),      # Sq != Sk (cross-attention)
    ((), (), 7, 3, 8, 5),
    ((), (), 1, 9, 16, 16),    # one query (decoding)
    ((), (), 6, 6, 1, 3),      # d_k = 1
    ((2,), (2,), 4, 6, 8, 8),  # batched
    ((2, 3), (1, 3), 4, 6, 8, 2),  # batch x heads, K/V broadcast over the batch
]


def _qkv(rng, lead_q, lead_kv, Sq, Sk, dk, dv, dtype=np.float64):
    return (rng.standard_normal(lead_q + (Sq, dk)).astype(dtype),
            rng.standard_normal(lead_kv + (Sk, dk)).astype(dtype),
            rng.standard_normal(lead_kv + (Sk, dv)).astype(dtype))


@pytest.mark.parametrize("shape", [(1,), (7,), (3, 5), (2, 3, 4)])
def test_softmax_matches_loops(rng, shape):
    x = rng.standard_normal(shape) * 5
    np.testing.assert_allclose(ref.softmax(x), softmax_loops(x), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("shape", ATT_SHAPES)
@pytest.mark.parametrize("masking", ["none", "causal", "random"])
def test_attention_matches_loops(rng, shape, masking):
    Q, K, V = _qkv(rng, *shape)
    Sq, Sk = shape[2], shape[3]
    mask = {"none": None, "causal": ref.causal_mask(Sq, Sk), "random": rng.random((Sq, Sk)) < 0.6}[masking]
    np.testing.assert_allclose(ref.attention(Q, K, V, mask), attention_loops(Q, K, V, mask),
                               rtol=1e-12, atol=1e-13)


def test_attention_2d_is_exactly_the_listing(rng):
    Q, K, V = _qkv(rng, (), (), 6, 6, 8, 8)
    mask = ref.causal_mask(6)
    scores = np.where(mask, Q @ K.T / np.sqrt(8), -1e9)  # the listing's two lines, float64
    e = np.exp(scores - scores.max(-1, keepdims=True))
    assert np.array_equal(ref.attention(Q, K, V, mask), e / e.sum(-1, keepdims=True) @ V)


@pytest.mark.parametrize("shape", [(1, 4), (3, 6), (2, 2, 5)])
def test_layer_norm_matches_loops(rng, shape):
    X = rng.standard_normal(shape) * 3 + 1
    g, b = rng.standard_normal(shape[-1]), rng.standard_normal(shape[-1])
    np.testing.assert_allclose(ref.layer_norm(X, g, b), layer_norm_loops(X, g, b), rtol=1e-12, atol=1e-13)


def _weights(Q, K, mask=None):
    """The attention weights themselves: attention against V = identity."""
    return ref.attention(Q, K, np.eye(K.shape[-2]), mask)


def test_attention_rows_are_convex_combinations(rng):
    Q, K, V = _qkv(rng, (), (), 8, 11, 4, 3)
    mask = rng.random((8, 11)) < 0.5
    w = _weights(Q, K, mask)
    assert (w >= 0).all()
    np.testing.assert_allclose(w.sum(-1), 1, rtol=1e-14)
    out = ref.attention(Q, K, V, mask)
    np.testing.assert_allclose(out, w @ V, rtol=1e-12)
    assert (out <= V.max(0) + 1e-12).all() and (out >= V.min(0) - 1e-12).all()


def test_masked_keys_get_zero_weight(rng):
    Q, K, _ = _qkv(rng, (), (), 8, 11, 4, 3)
    mask = rng.random((8, 11)) < 0.5
    mask[:, 0] = True  # every row keeps at least one key
    assert (_weights(Q, K, mask)[~mask] == 0).all()


def test_fully_masked_row_is_mean_of_v(rng):
    Q, K, V = _qkv(rng, (), (), 4, 6, 4, 3)
    mask = rng.random((4, 6)) < 0.5
    mask[2] = False
    out = ref.attention(Q * 1e3, K, V, mask)  # large scores must not leak into the masked row
    np.testing.assert_allclose(out[2], V.mean(0), rtol=1e-12)
    assert np.isfinite(out).all()


def test_attention_is_permutation_equivariant_in_queries(rng):
    Q, K, V = _qkv(rng, (), (), 9, 7, 4, 5)
    perm = rng.permutation(9)
    np.testing.assert_allclose(ref.attention(Q[perm], K, V), ref.attention(Q, K, V)[perm], rtol=1e-13)


def test_layer_norm_standardises_rows(rng):
    X = rng.standard_normal((5, 64)) * 7 - 3
    Y = ref.layer_norm(X, np.ones(64), np.zeros(64))
    np.testing.assert_allclose(Y.mean(-1), 0, atol=1e-12)
    np.testing.assert_allclose(Y.var(-1), 1, rtol=1e-5)  # eps = 1e-5 pulls it a hair below 1


def test_multi_head_matches_a_loop_over_heads(rng):
    seq, d, h = 6, 16, 4
    X = rng.standard_normal((seq, d))
    Wq, Wk, Wv, Wo = (rng.standard_normal((d, d)) / 4 for _ in range(4))
    mask = ref.causal_mask(seq)
    Q, K, V = X @ Wq, X @ Wk, X @ Wv
    dk = d // h
    legs = [attention_loops(Q[:, i * dk:(i + 1) * dk], K[:, i * dk:(i + 1) * dk],
                            V[:, i * dk:(i + 1) * dk], mask)
            for i in range(h)]
    expected = np.concatenate(legs, axis=-1) @ Wo
    np.testing.assert_allclose(ref.multi_head(X, Wq, Wk, Wv, Wo, h, mask), expected, rtol=1e-12, atol=1e-13)
    batched = ref.multi_head(np.stack([X, X[::-1]]), Wq, Wk, Wv, Wo, h, mask)
    np.testing.assert_allclose(batched[0], expected, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(batched[1], ref.multi_head(X[::-1].copy(), Wq, Wk, Wv, Wo, h, mask),
                               rtol=1e-13)


def test_multi_head_rejects_h_not_dividing_d(rng):
    X, W = rng.standard_normal((3, 10)), np.eye(10)
    with pytest.raises(ValueError, match="h=3"):
        ref.multi_head(X, W, W, W, W, 3)


def test_block_is_prenorm_with_the_ffn_weights(rng):
    P = ref.init_params(20, d=16, h=4, n_layers=1, d_ff=32, max_len=8, seed=1, dtype=np.float64)
    p = P["layers"][0]
    p["ffn"] = tuple(w + 0.1 for w in p["ffn"])  # nonzero biases, so forgetting them would show
    X = rng.standard_normal((5, 16))
    mask = ref.causal_mask(5)
    mid = X + ref.multi_head(ref.layer_norm(X, *p["ln1"]), *p["attn"], p["h"], mask)
    W1, b1, W2, b2 = p["ffn"]
    expected = mid + np.maximum(ref.layer_norm(mid, *p["ln2"]) @ W1 + b1, 0) @ W2 + b2
    np.testing.assert_allclose(ref.block(X, p, mask), expected, rtol=1e-13)


def test_transformer_is_causal():
    P = ref.init_params(50, d=32, h=4, n_layers=2, d_ff=64, max_len=16, seed=3, dtype=np.float64)
    ids = np.array([3, 14, 15, 9, 26, 5, 35, 8])
    changed = ids.copy()
    changed[5] = 49
    a, b = ref.transformer(ids, P), ref.transformer(changed, P)
    assert a.shape == (8, 50)
    np.testing.assert_array_equal(a[:5], b[:5])  # earlier positions cannot feel token 5
    assert not np.allclose(a[5:], b[5:])


def test_float32_stays_float32(rng):
    P = ref.init_params(30, d=16, h=2, n_layers=1, d_ff=32, max_len=8, seed=0, dtype=np.float32)
    p = P["layers"][0]
    X = rng.standard_normal((4, 16)).astype(np.float32)
    mask = ref.causal_mask(4)
    assert ref.softmax(X).dtype == np.float32
    assert ref.attention(X, X, X, mask).dtype == np.float32
    assert ref.multi_head(X, *p["attn"], p["h"], mask).dtype == np.float32
    assert ref.layer_norm(X, *p["ln1"]).dtype == np.float32
    assert ref.feed_forward(X, *p["ffn"]).dtype == np.float32
    assert ref.block(X, p, mask).dtype == np.float32
    assert ref.transformer(np.array([1, 2, 3]), P).dtype == np.float32
    assert all(a.dtype == np.float32 for layer in P["layers"] for part in ("ln1", "attn", "ln2", "ffn")
               for a in layer[part])


def test_positional_encoding_is_the_papers_sinusoids():
    pe = ref.positional_encoding(50, 7)
    pos, i = 37, 2
    assert pe.shape == (50, 7)
    assert pe[pos, 2 * i] == pytest.approx(np.sin(pos / 10000 ** (2 * i / 7)))
    assert pe[pos, 2 * i + 1] == pytest.approx(np.cos(pos / 10000 ** (2 * i / 7)))
    assert pe[pos, 6] == pytest.approx(np.sin(pos / 10000 ** (6 / 7)))


def test_causal_mask():
    np.testing.assert_array_equal(ref.causal_mask(3), [[1, 0, 0], [1, 1, 0], [1, 1, 1]])
    assert ref.causal_mask(2, 4).tolist() == [[True, False, False, False], [True, True, False, False]]
    assert ref.causal_mask(3).dtype == bool


def test_init_params_layout():
    P = ref.init_params(40, d=24, h=3, n_layers=2, d_ff=48, max_len=10, seed=5)
    assert P["emb"].shape == (40, 24) and P["pos"].shape == (10, 24) and len(P["layers"]) == 2
    layer = P["layers"][0]
    assert layer["h"] == 3
    assert [w.shape for w in layer["attn"]] == [(24, 24)] * 4
    assert [w.shape for w in layer["ffn"]] == [(24, 48), (48,), (48, 24), (24,)]
    assert layer["ln1"][0] is not P["layers"][1]["ln1"][0]
    again = ref.init_params(40, d=24, h=3, n_layers=2, d_ff=48, max_len=10, seed=5)
    np.testing.assert_array_equal(again["layers"][1]["attn"][2], P["layers"][1]["attn"][2])
