"""The paper's encoder-decoder: the reference's properties (post/pre norm, padding, causality,
cross-attention), and the fast path on every backend against it, batched and padded."""
import numpy as np
import pytest

import silkattn
from silkattn import reference as ref

from conftest import DTYPES, assert_close


def small_seq2seq(norm="post", dtype=np.float64, seed=0):
    return ref.init_seq2seq_params(23, 29, d=32, h=4, n_layers=2, d_ff=48, norm=norm, seed=seed, dtype=dtype,
                                   max_len=40)


def as_f64(P):
    """The same parameters in float64, for the reference's answer."""
    if isinstance(P, dict):
        return {k: as_f64(v) for k, v in P.items()}
    if isinstance(P, (list, tuple)):
        return type(P)(as_f64(v) for v in P)
    return np.asarray(P, np.float64) if isinstance(P, np.ndarray) else P


def test_post_norm_is_layer_norm_of_the_residual_sum(rng):
    P = small_seq2seq("post")
    p = P["encoder"][0]
    p["ffn"] = tuple(w + 0.1 for w in p["ffn"])  # nonzero biases, so forgetting them would show
    X = rng.standard_normal((5, 32))
    mid = ref.layer_norm(X + ref.multi_head(X, *p["attn"], 4), *p["ln1"])
    expected = ref.layer_norm(mid + ref.feed_forward(mid, *p["ffn"]), *p["ln2"])
    np.testing.assert_allclose(ref.encoder_block(X, p), expected, rtol=1e-12)
    pre = dict(p, norm="pre")
    np.testing.assert_allclose(ref.encoder_block(X, pre), ref.block(X, pre), rtol=1e-12)  # the listing's


def test_cross_attention_reads_keys_and_values_from_memory(rng):
    X, M = rng.standard_normal((3, 16)), rng.standard_normal((7, 16))
    W = [rng.standard_normal((16, 16)) / 4 for _ in range(4)]
    Q, K, V = X @ W[0], M @ W[1], M @ W[2]
    heads = [ref.attention(Q[:, i:i + 4], K[:, i:i + 4], V[:, i:i + 4]) for i in range(0, 16, 4)]
    expected = np.concatenate(heads, -1) @ W[3]
    np.testing.assert_allclose(ref.multi_head(X, *W, 4, memory=M), expected, rtol=1e-12)


def test_padding_hides_source_tokens_and_batches_equal_single_sequences(rng):
    P = small_seq2seq()
    src = np.array([[3, 5, 7, 9, 0, 0], [4, 4, 8, 1, 2, 6]])
    pad = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], bool)
    tgt = np.array([[1, 2, 3], [1, 5, 6]])
    memory = ref.encode(src, P, pad)
    logits = ref.decode(tgt, memory, P, pad)
    alone = ref.decode(tgt[0], ref.encode(src[0, :4], P), P)  # the first pair without its padding
    np.testing.assert_allclose(logits[0], alone, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(memory[0, :4], ref.encode(src[0, :4], P), rtol=1e-10, atol=1e-12)
    other = src.copy()
    other[0, 4:] = 11  # what sits under the padding does not matter
    np.testing.assert_allclose(ref.decode(tgt, ref.encode(other, P, pad), P, pad)[0], logits[0], rtol=1e-12)


def test_decoder_is_causal_and_reads_the_source():
    P = small_seq2seq()
    memory = ref.encode(np.array([3, 1, 4, 1, 5]), P)
    tgt = np.array([1, 7, 2, 8, 3])
    changed = tgt.copy()
    changed[3] = 20
    a, b = ref.decode(tgt, memory, P), ref.decode(changed, memory, P)
    assert a.shape == (5, 29)
    np.testing.assert_array_equal(a[:3], b[:3])
    assert not np.allclose(a[3:], b[3:])
    assert not np.allclose(ref.decode(tgt, ref.encode(np.array([2, 7, 1, 8, 2]), P), P), a)


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fast_encoder_decoder_matches_reference(on_backend, rng, norm, dtype):
    P = small_seq2seq(norm, dtype)
    P64 = as_f64(P)
    src = rng.integers(0, 23, (3, 9))
    pad = np.arange(9) < np.array([[9], [4], [1]])  # (3, 9): three source lengths
    tgt = rng.integers(0, 29, (3, 6))
    memory = silkattn.encode(src, P, pad)
    assert_close(memory, ref.encode(src, P64, pad), dtype)
    expected = ref.decode(tgt, ref.encode(src, P64, pad), P64, pad)
    assert_close(silkattn.decode(tgt, memory, P, pad), expected, dtype)
    X = rng.standard_normal((3, 9, 32)).astype(dtype)
    mask = ref.key_padding(pad)
    expected = ref.encoder_block(X, P64["encoder"][1], mask)
    assert_close(silkattn.encoder_block(X, P["encoder"][1], mask), expected, dtype)
    Y = rng.standard_normal((3, 6, 32)).astype(dtype)
    expected = ref.decoder_block(Y, X, P64["decoder"][0], ref.causal_mask(6), mask)
    assert_close(silkattn.decoder_block(Y, X, P["decoder"][0], ref.causal_mask(6), mask), expected, dtype)
    assert_close(silkattn.decoder_block(Y, X, P["decoder"][0], None, mask, causal=True), expected, dtype)


def test_seq2seq_config_reads_and_checks_params():
    config = silkattn.Seq2SeqConfig(23, 29, d=32, h=4, n_layers=2, d_ff=48, norm="pre", max_len=40)
    P = config.init_params(seed=1)
    assert silkattn.Seq2SeqConfig.of(P) == config
    P["decoder"][1]["cross"] = P["decoder"][1]["cross"][:3]
    with pytest.raises(ValueError, match=r"P\['decoder'\]\[1\]\['cross'\] must hold 4 arrays"):
        silkattn.Seq2SeqConfig.of(P)
    with pytest.raises(ValueError, match='norm must be "post"'):
        silkattn.Seq2SeqConfig(23, 29, norm="sandwich")


@pytest.mark.parametrize("call, error, text", [
    (lambda P: silkattn.encode(np.array([1, 23]), P), ValueError, r"src_ids must lie in \[0, 23\)"),
    (lambda P: silkattn.encode(np.array([1, 2]), P, np.array([1, 1, 0])), ValueError,
     r"src_mask must have shape \(2,\)"),
    (lambda P: silkattn.encode(np.array([1, 2]), P, np.array(["a", "b"])), TypeError,
     "src_mask must be boolean"),
    (lambda P: silkattn.decode(np.array([1]), np.ones((4, 31)), P), ValueError,
     "memory must have the model width"),
    (lambda P: silkattn.decode(np.array([1]), np.ones((4, 32)), P, np.ones(5, bool)), ValueError,
     r"memory_mask must have shape \(4,\)"),
    (lambda P: silkattn.decode(np.array([[1.5]]), np.ones((4, 32)), P), TypeError,
     "tgt_ids must be integers"),
    (lambda P: silkattn.encode(np.array([1]), {"src_emb": P["src_emb"]}), ValueError, "P lacks 'tgt_emb'"),
])
def test_encoder_decoder_refuse_bad_arguments(on_backend, call, error, text):
    P = small_seq2seq()
    with pytest.raises(error, match=text):
        call(P)
