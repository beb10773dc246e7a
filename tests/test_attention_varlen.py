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
