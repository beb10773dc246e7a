"""attention on every compiled backend against the reference: shapes, masks, views, dtypes, threads."""
import numpy as np
import pytest

import silkattn
from silkattn import reference as ref

from conftest import DTYPES, assert_close, f64

SHAPES = [  # (lead of Q, lead of K and V, Sq, Sk, d_k, d_v)
    ((), (), 1, 1, 1, 1),
    ((), (), 1, 300, 64, 64),          # one query against a long cache
    ((), (), 77, 77, 63, 63),          # nothing a multiple of a tile
    ((), (), 130, 257, 64, 64),        # Sq < Sk
    ((), (), 257, 130, 8, 8),          # Sq > Sk
    ((2,), (2,), 65, 129, 80, 80),
    ((2, 3), (2, 3), 33, 47, 128, 128),
    ((2, 3), (1, 3), 50, 70, 16, 24),  # K, V broadcast over the batch; d_v != d_k
    ((), (), 600, 600, 64, 64),        # many tiles each way
]
MASKS = ["none", "causal", "tril", "random", "key_padding", "rows_masked", "tile_masked"]


def make_mask(kind, rng, lead, Sq, Sk):
    """(mask array or None, causal flag) for one of the MASKS kinds."""
    if kind == "none":
        return None, False
    if kind == "causal":
        return None, True
    if kind == "tril":
        return ref.causal_mask(Sq, Sk), False
    if kind == "random":
        return rng.random(lead + (Sq, Sk)) < 0.7, False
    if kind == "key_padding":  # (..., 1, Sk): the last keys of each sequence are padding
        keep = np.arange(Sk) < rng.integers(1, Sk + 1, size=lead + (1, 1))
        return keep, False
    mask = rng.random(lead + (Sq, Sk)) < 0.8
    if kind == "rows_masked":  # some query rows see no key at all: they get mean(V)
        mask[..., ::3, :] = False
    else:  # a whole block of keys is masked for every query, as a run of whole tiles would be
        mask[..., :, Sk // 4: 3 * Sk // 4 + 1] = False
    return mask, False


def expected_attention(Q, K, V, mask, causal):
    Sq, Sk = Q.shape[-2], K.shape[-2]
    if causal:
        mask = ref.causal_mask(Sq, Sk) if mask is None else mask & ref.causal_mask(Sq, Sk)
    return ref.attention(*f64(Q, K, V), mask)


def qkv(rng, lead_q, lead_kv, Sq, Sk, dk, dv, dtype):
    return (rng.standard_normal(lead_q + (Sq, dk)).astype(dtype),
            rng.standard_normal(lead_kv + (Sk, dk)).astype(dtype),
            rng.standard_normal(lead_kv + (Sk, dv)).astype(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", MASKS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[0] + (s[2], s[3], s[4], s[5]))))
def test_attention_matches_reference(backend, threads, rng, shape, kind, dtype):
    Q, K, V = qkv(rng, *shape, dtype)
    lead = np.broadcast_shapes(shape[0], shape[1])
    mask, causal = make_mask(kind, rng, lead, shape[2], shape[3])
    out = backend.attention(Q, K, V, mask, causal=causal)
    assert_close(out, expected_attention(Q, K, V, mask, causal), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["none", "causal", "random", "rows_masked"])
def test_attention_is_the_same_on_any_thread_count(backend, rng, kind, dtype):
    Q, K, V = qkv(rng, (2, 3), (2, 3), 300, 333, 64, 64, dtype)
    mask, causal = make_mask(kind, rng, (2, 3), 300, 333)
    results = []
    for n in (1, 2, 3):
        previous = silkattn.set_num_threads(n)
        try:
            results.append(backend.attention(Q, K, V, mask, causal=causal))
        finally:
            silkattn.set_num_threads(previous)
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_on_views(backend, rng, dtype):
    """Head splits of a projection, transposes, reversed and strided rows: no copy needed to be right."""
    seq, h, dk = 70, 4, 16
    X = rng.standard_normal((seq, 3 * h * dk)).astype(dtype)
    def split(M):  # (h, seq, dk) view with row stride 3*h*dk
        return M.reshape(seq, h, dk).swapaxes(0, 1)

    Q, K, V = split(X[:, :h * dk]), split(X[:, h * dk:2 * h * dk]), split(X[:, 2 * h * dk:])
    mask = rng.random((seq, seq)) < 0.7
    assert_close(backend.attention(Q, K, V, mask), ref.attention(*f64(Q, K, V), mask), dtype)
    Kt = np.ascontiguousarray(K.swapaxes(-1, -2)).swapaxes(-1, -2)  # column-major K
    assert_close(backend.attention(Q[:, ::-1], Kt, V[:, ::-1]),
                 ref.attention(*f64(Q[:, ::-1], Kt, V[:, ::-1])), dtype)
    assert_close(backend.attention(Q[:, ::2], K[:, ::3], V[:, ::3], causal=True),
                 expected_attention(Q[:, ::2], K[:, ::3], V[:, ::3], None, True), dtype)
    mask_t = np.ascontiguousarray(mask.T).T  # a mask whose key axis is not contiguous
    assert_close(backend.attention(Q, K, V, mask_t), ref.attention(*f64(Q, K, V), mask_t), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_causal_combines_with_mask(backend, rng, dtype):
    Q, K, V = qkv(rng, (2,), (2,), 90, 140, 32, 32, dtype)
    mask = rng.random((2, 90, 140)) < 0.5
    assert_close(backend.attention(Q, K, V, mask, causal=True),
                 expected_attention(Q, K, V, mask, True), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fully_masked_rows_and_extreme_scores(backend, rng, dtype):
    Q, K, V = qkv(rng, (), (), 40, 300, 16, 8, dtype)
    mask = rng.random((40, 300)) < 0.5
    mask[5] = False
    mask[6, :] = False
    mask[6, 299] = True  # a row whose only key is the last one
    out = backend.attention(Q * dtype(30), K, V, mask)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out[5], V.mean(0), rtol=1e-5)
    np.testing.assert_allclose(out[6], V[299], rtol=1e-5)
    assert_close(out, ref.attention(*f64(Q * dtype(30), K, V), mask), dtype)


def test_attention_out_and_mask_dtypes(backend, rng):
    Q, K, V = qkv(rng, (), (), 20, 30, 8, 8, np.float32)
    mask = rng.random((20, 30)) < 0.5
    out = np.empty((20, 8), np.float32)
    assert backend.attention(Q, K, V, mask, out=out) is out
    assert_close(out, ref.attention(*f64(Q, K, V), mask), np.float32)
    for as_numbers in (mask.astype(np.int8), mask.astype(np.float64)):  # 0/1 masks read like np.where
        assert_close(backend.attention(Q, K, V, as_numbers), ref.attention(*f64(Q, K, V), mask), np.float32)
    with pytest.raises(ValueError, match="out"):
        backend.attention(Q, K, V, out=np.empty((20, 8), np.float64))


# Causal with an offset (a KV cache): query i at position q_offset + i sees keys j <= q_offset + i.
# Offsets land on, and one either side of, the tile edges of both backends (64 keys, 64 or 96
# queries), so a tile that is partly visible, fully visible or skipped is met at each edge.
OFFSET_CASES = [  # (Sq, Sk, q_offset)
    (1, 1, 0), (1, 300, 299), (1, 300, 64), (1, 300, 63), (1, 300, 0), (1, 65, 64),  # one new query
    (5, 200, 195), (5, 200, 128), (5, 200, 127), (5, 200, 129),                       # a few
    (40, 333, 96), (40, 333, 95), (40, 333, 97), (40, 333, 293),
    (130, 257, 127), (130, 257, 64), (130, 257, 0),                                   # Sq < Sk
    (100, 100, 5), (70, 50, 3), (3, 10, 20),                                          # past Sk: all visible
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Sq, Sk, q_offset", OFFSET_CASES)
def test_causal_offset_matches_an_explicit_mask(backend, threads, rng, Sq, Sk, q_offset, dtype):
    Q, K, V = qkv(rng, (2,), (2,), Sq, Sk, 32, 24, dtype)
    expected = ref.attention(*f64(Q, K, V), ref.causal_mask(Sq, Sk, q_offset))
    assert_close(backend.attention(Q, K, V, causal=True, q_offset=q_offset), expected, dtype)
    assert_close(backend.attention(Q, K, V, ref.causal_mask(Sq, Sk, q_offset)), expected, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_causal_offset_combines_with_a_padding_mask(backend, rng, dtype):
    Q, K, V = qkv(rng, (3,), (3,), 7, 150, 16, 16, dtype)
    keep = np.arange(150) < np.array([150, 100, 2])[:, None, None]  # (3, 1, 150) key padding per item
    out = backend.attention(Q, K, V, keep, causal=True, q_offset=143)
    expected = ref.attention(*f64(Q, K, V), keep & ref.causal_mask(7, 150, 143))
    assert_close(out, expected, dtype)


def test_decode_steps_equal_the_full_causal_call(backend, rng):
    """One query at a time against a growing prefix of the keys (as a KV cache is read) gives the
    rows of one full causal call."""
    Q, K, V = qkv(rng, (4,), (4,), 150, 150, 64, 64, np.float32)
    full = backend.attention(Q, K, V, causal=True)
    for t in (0, 1, 63, 64, 65, 95, 96, 149):
        step = backend.attention(Q[:, t:t + 1], K[:, :t + 1], V[:, :t + 1], causal=True, q_offset=t)
        np.testing.assert_allclose(step, full[:, t:t + 1], rtol=1e-5, atol=1e-6)


# One query row (a decoding step) takes the decode path: keys cut into chunks of 256 that the
# threads share, partial softmax results merged. Chunk edges, key padding, fully masked rows,
# causal offsets that hide the tail, d_k and d_v off the register width, and batches.
DECODE_CASES = [  # (lead, Sk, d_k, d_v)
    ((), 1, 64, 64), ((), 255, 64, 64), ((), 256, 64, 64), ((), 257, 64, 64), ((), 1000, 20, 12),
    ((3,), 513, 64, 64), ((1, 8), 4096, 64, 64), ((2, 3), 300, 7, 9),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["none", "key_padding", "random", "rows_masked", "causal_offset"])
@pytest.mark.parametrize("lead, Sk, dk, dv", DECODE_CASES, ids=lambda c: str(c))
def test_single_query_rows_match_reference(backend, threads, rng, lead, Sk, dk, dv, kind, dtype):
    Q, K, V = qkv(rng, lead, lead, 1, Sk, dk, dv, dtype)
    q_offset = 0
    if kind == "causal_offset":  # the query sits inside the cache: later keys are hidden
        q_offset = int(rng.integers(0, Sk))
        mask, causal = None, True
        full = ref.causal_mask(1, Sk, q_offset)
    else:
        mask, causal = make_mask(kind, rng, lead, 1, Sk)
        full = mask
    out = backend.attention(Q, K, V, mask, causal=causal, q_offset=q_offset)
    assert_close(out, ref.attention(*f64(Q, K, V), full), dtype)


def test_single_query_rows_are_the_same_on_any_thread_count(backend, rng):
    Q, K, V = qkv(rng, (3,), (3,), 1, 1500, 64, 64, np.float32)
    results = []
    for n in (1, 2, 3):
        previous = silkattn.set_num_threads(n)
        try:
            results.append(backend.attention(Q, K, V))
        finally:
            silkattn.set_num_threads(previous)
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


def test_single_query_reads_a_cache_view(backend, rng):
    """The layout a KV cache gives: (capacity, h * d_k) rows, each head a strided column block."""
    h, dk, capacity, t = 8, 64, 700, 517
    cache_k, cache_v = (rng.standard_normal((capacity, h * dk)).astype(np.float32) for _ in range(2))
    q = rng.standard_normal((1, h * dk)).astype(np.float32)

    def heads(M):
        return M.reshape(len(M), h, dk).swapaxes(0, 1)

    out = backend.attention(heads(q), heads(cache_k[:t]), heads(cache_v[:t]), causal=True, q_offset=t - 1)
    assert_close(out, ref.attention(*f64(heads(q), heads(cache_k[:t]), heads(cache_v[:t]))), np.float32)
