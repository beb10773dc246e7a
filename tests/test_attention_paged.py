"""attention_paged (each sequence's keys in pages of a shared pool, the queries its last positions) on
every backend against the reference's gather-then-attend: page sizes below, at and above the
kernel's chunk, grouped heads past the kernel's 16 rows, several query rows, windows, softcap,
ALiBi, pages in any order, float32 and float64; bad input named."""
import numpy as np
import pytest

from silkattn import reference as ref

from conftest import DTYPES, assert_close, f64

# (sequences, query heads, K/V heads, queries a sequence, page size, d_k, d_v)
SHAPES = [(3, 4, 2, 1, 16, 64, 64), (2, 8, 1, 3, 256, 64, 64), (4, 32, 1, 2, 64, 32, 32),
          (1, 6, 6, 20, 32, 16, 16), (5, 9, 3, 1, 512, 64, 64), (2, 4, 4, 1, 1, 8, 24),
          (3, 2, 1, 7, 100, 40, 8)]
KEYWORDS = [{}, {"window": (37, -1)}, {"window": (300, -1)}, {"softcap": 2.0}, {"scale": 0.3},
            {"alibi_slopes": "ramp"}]


def _case(rng, shape, dtype, n_pages=48):
    B, Hq, Hkv, Sq, P, dk, dv = shape
    Kp = rng.standard_normal((n_pages, Hkv, P, dk)).astype(dtype)
    Vp = rng.standard_normal((n_pages, Hkv, P, dv)).astype(dtype)
    lens = rng.integers(Sq, min(6 * P, n_pages // B * P) + 1, B)
    lens[0] = max(Sq, lens[0] // P * P)  # a sequence ending on a page's last row
    width = -(-int(lens.max()) // P) + 1  # a spare column: entries past a sequence's pages are not read
    pages = rng.permutation(n_pages)[:B * width].reshape(B, width)  # each sequence its own pages, any order
    pages[:, -1] = -1
    Q = rng.standard_normal((B, Hq, Sq, dk)).astype(dtype)
    return Q, Kp, Vp, pages, lens


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}-h{}of{}-sq{}-P{}-d{}x{}".format(*s))
def test_paged_matches_gathered_attention(any_backend, threads, rng, shape, dtype):
    Q, Kp, Vp, pages, lens = _case(rng, shape, dtype)
    for kw in KEYWORDS:
        if kw.get("alibi_slopes") == "ramp":
            kw = {"alibi_slopes": np.linspace(0.05, 1.0, Q.shape[1])}
        out = any_backend.attention_paged(Q, Kp, Vp, pages, lens, **kw)
        assert out.shape == Q.shape[:3] + Vp.shape[-1:] and out.dtype == dtype
        assert_close(out, ref.attention_paged(*f64(Q, Kp, Vp), pages, lens, **kw), dtype)


def test_paged_equals_attention_over_the_gathered_cache(backend, rng):
    """One sequence whose pages hold its cache in order: attention over the contiguous cache."""
    P, Hkv, dk, n = 64, 2, 32, 200
    K, V = rng.standard_normal((2, Hkv, 4 * P, dk)).astype(np.float32)
    Kp, Vp = (a.reshape(Hkv, 4, P, dk).swapaxes(0, 1).copy() for a in (K, V))
    Q = rng.standard_normal((1, 8, 1, dk)).astype(np.float32)
    out = backend.attention_paged(Q, Kp, Vp, np.arange(4)[None], [n])
    assert_close(out[0], ref.attention(*f64(Q[0], K[:, :n], V[:, :n]), causal=True, q_offset=n - 1),
                 np.float32)


def test_paged_scores_near_the_masked_value(any_backend, rng):
    """Every visible score below -1e9: the exact path, whose keys it finds through the pages."""
    Kp = np.ones((20, 2, 16, 8), np.float32)
    Vp = rng.standard_normal((20, 2, 16, 8)).astype(np.float32)
    pages, lens = np.stack([rng.permutation(20)[:5] for _ in range(2)]), np.array([50, 70])
    Q = np.full((2, 4, 2, 8), -1e9, np.float32)
    for kw in ({}, {"window": (10, -1)}):
        out = any_backend.attention_paged(Q, Kp, Vp, pages, lens, **kw)
        assert_close(out, ref.attention_paged(*f64(Q, Kp, Vp), pages, lens, **kw), np.float32)


def test_paged_empty_and_out(any_backend, rng):
    Q, Kp, Vp, pages, lens = _case(rng, SHAPES[0], np.float32)
    out = np.empty(Q.shape[:3] + (Vp.shape[-1],), np.float32)
    assert any_backend.attention_paged(Q, Kp, Vp, pages, lens, out=out) is out
    assert_close(out, ref.attention_paged(*f64(Q, Kp, Vp), pages, lens), np.float32)
    none = any_backend.attention_paged(Q[:0], Kp, Vp, pages[:0], lens[:0])
    assert none.shape == (0,) + Q.shape[1:3] + (Vp.shape[-1],)


def test_paged_refuses_bad_input(any_backend):
    Q, K = np.ones((2, 4, 1, 8), np.float32), np.ones((6, 2, 16, 8), np.float32)
    pages, lens = np.array([[0, 1], [2, 3]]), np.array([20, 5])
    call = any_backend.attention_paged
    with pytest.raises(ValueError, match="seq_lens must lie between"):
        call(Q, K, K, pages, [40, 5])  # past the table's 2 pages x 16 keys
    with pytest.raises(ValueError, match="seq_lens must lie between"):
        call(Q, K, K, pages, [0, 5])
    with pytest.raises(ValueError, match="outside the pool's 6"):
        call(Q, K, K, np.array([[0, 6], [2, 3]]), lens)
    with pytest.raises(ValueError, match="outside the pool's 6"):
        call(Q, K, K, np.array([[0, -1], [2, 3]]), lens)
    call(Q, K, K, np.array([[0, 1], [2, -1]]), lens)  # a page seq_lens does not reach is not read
    with pytest.raises(TypeError, match="page_table must be integers"):
        call(Q, K, K, pages.astype(float), lens)
    with pytest.raises(TypeError, match="seq_lens must be integers"):
        call(Q, K, K, pages, lens.astype(float))
    with pytest.raises(ValueError, match="page_table must have shape"):
        call(Q, K, K, pages[:1], lens)
    with pytest.raises(ValueError, match="seq_lens must have shape"):
        call(Q, K, K, pages, lens[:1])
    with pytest.raises(ValueError, match="multiple of K_pages' 2"):
        call(np.ones((2, 3, 1, 8), np.float32), K, K, pages, lens)
    with pytest.raises(ValueError, match="share d_k"):
        call(np.ones((2, 4, 1, 4), np.float32), K, K, pages, lens)
    with pytest.raises(ValueError, match="V_pages must have K_pages' pages"):
        call(Q, K, K[:3], pages, lens)
    with pytest.raises(ValueError, match="Q must have shape"):
        call(Q[0], K, K, pages, lens)
    with pytest.raises(ValueError, match="page size"):
        call(Q, np.ones((2, 2, 300, 8), np.float32), np.ones((2, 2, 300, 8), np.float32), pages, lens)
