"""attention_varlen (sequences packed end to end, each attending to its own rows) on every backend
against the reference's per-sequence loop: lengths at tile edges, empty and one-row sequences,
heads as strided views of a packed projection, causal."""
import numpy as np
import pytest

from silkattn import reference as ref

from conftest import DTYPES, assert_close, f64

LENGTHS = [[1], [5, 0, 7], [64, 1, 65, 96, 97, 2], [130, 300, 17], [3] * 40]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lengths", LENGTHS, ids=lambda lens: f"{len(lens)}seqs-max{max(lens)}")
def test_varlen_matches_per_sequence_attention(any_backend, threads, rng, lengths, causal, dtype):
    cu = np.concatenate([[0], np.cumsum(lengths)])
    total, h, dk = int(cu[-1]), 4, 24
    X = rng.standard_normal((total, 3 * h * dk)).astype(dtype)  # a packed Q|K|V projection

    def heads(M):  # (total, h * dk) -> (h, total, dk), a strided view
        return M.reshape(total, h, dk).swapaxes(0, 1)
    Q, K, V = heads(X[:, :h * dk]), heads(X[:, h * dk:2 * h * dk]), heads(X[:, 2 * h * dk:])
    out = any_backend.attention_varlen(Q, K, V, cu, causal=causal)
    assert_close(out, ref.attention_varlen(*f64(Q, K, V), cu, causal), dtype)



@pytest.mark.parametrize("window", [None, (3, -1)])
def test_each_sequence_is_attention_alone_to_the_bit(any_backend, rng, window):
    """GQA (3 query heads a K/V head): sequences of 1 to 5 rows, whose K/V heads alone have at most
    _plan.ROWS_MAX query rows (the rows path), packed beside longer ones (the tiles path): each gets
    bit for bit what attention gives it alone, so a batch's packed prefill writes the keys and
    values that generate's prefill of each prompt writes."""
    lengths = [1, 2, 3, 4, 5, 6, 9, 33, 5, 70]
    cu = np.concatenate([[0], np.cumsum(lengths)])
    total = int(cu[-1])
    Q = rng.standard_normal((9, total, 32)).astype(np.float32)
    K, V = (rng.standard_normal((3, total, 32)).astype(np.float32) for _ in range(2))
    out = any_backend.attention_varlen(Q, K, V, cu, causal=True, window=window)
    for s, e in zip(cu[:-1], cu[1:]):
        alone = any_backend.attention(Q[:, s:e], K[:, s:e], V[:, s:e], causal=True, window=window)
        assert np.array_equal(out[:, s:e], alone)

def test_varlen_refuses_bad_offsets(any_backend):
    Q = np.ones((2, 10, 8), np.float32)
    with pytest.raises(ValueError, match="cu_seqlens must run from 0 to the 10 packed rows"):
        any_backend.attention_varlen(Q, Q, Q, [0, 4, 9])
    with pytest.raises(ValueError, match="cu_seqlens"):
        any_backend.attention_varlen(Q, Q, Q, [0, 6, 4, 10])
    with pytest.raises(TypeError, match="cu_seqlens must be integers"):
        any_backend.attention_varlen(Q, Q, Q, [0.0, 10.0])
    with pytest.raises(ValueError, match="the same packed rows"):
        any_backend.attention_varlen(Q, Q[:, :5], Q[:, :5], [0, 10])
