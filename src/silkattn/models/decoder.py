"""The listing's decoder-only transformer on silkattn's ops: pre-norm blocks, the causal rule as the
kernels' flag instead of a mask array, and every residual add fused with the layer norm after it."""
from .. import _checks as check
from .. import ops
from .config import DecoderConfig
from .layers import feed_forward, multi_head


def block(X, p, mask=None, *, causal=False):  # X: (..., seq, d)
    """Pre-norm block: X += multi_head(LN1(X)); X += feed_forward(LN2(X)) (p["ffn"] passed)."""
    p = check.layer(p)
    A = multi_head(ops.layer_norm(X, *p["ln1"]), *p["attn"], p["h"], mask, causal=causal)
    X, H = ops.add_layer_norm(X, A, *p["ln2"])
    return X + feed_forward(H, *p["ffn"])


def transformer(token_ids, P):  # token_ids: (seq,) -> logits (seq, vocab)
    """Decoder-only forward pass with the causal rule: embeddings + positions, N blocks, tied output.

    The blocks are unrolled so that every residual add meets the layer norm after it in one pass.
    """
    config = DecoderConfig.of(P)
    ids = check.token_ids(token_ids, config.vocab, config.max_len)
    X = P["emb"][ids] + P["pos"][:len(ids)]
    layers = P["layers"]
    H = ops.layer_norm(X, *layers[0]["ln1"]) if layers else None
    for i, p in enumerate(layers):
        A = multi_head(H, *p["attn"], p["h"], causal=True)
        X, H = ops.add_layer_norm(X, A, *p["ln2"])
        F = feed_forward(H, *p["ffn"])
        if i + 1 < len(layers):
            X, H = ops.add_layer_norm(X, F, *layers[i + 1]["ln1"])
        else:
            X = X + F
    return X @ P["emb"].T
