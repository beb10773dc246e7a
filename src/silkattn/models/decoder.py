"""The listing's decoder-only transformer on silkattn's ops: pre-norm blocks, the causal rule as the
kernels' flag instead of a mask array, and every residual add fused with the layer norm after it.
forward_cached runs the same blocks on new positions against a KV cache (see generate.py)."""
from .. import _checks as check
from .. import ops
from .config import DecoderConfig
from .layers import cached_self_attention, feed_forward, multi_head


def block(X, p, mask=None, *, causal=False):  # X: (..., seq, d)
    """Pre-norm block: X += multi_head(LN1(X)); X += feed_forward(LN2(X)) (p["ffn"] passed)."""
    p = check.layer(p)
    A = multi_head(ops.layer_norm(X, *p["ln1"]), *p["attn"], p["h"], mask, causal=causal)
    X, H = ops.add_layer_norm(X, A, *p["ln2"])
    return X + feed_forward(H, *p["ffn"])


def _blocks(X, layers, attend):
    """The pre-norm blocks over X, unrolled so that every residual add meets the layer norm after
    it in one pass; attend(i, H) is layer i's attention sublayer on its normed input."""
    H = ops.layer_norm(X, *layers[0]["ln1"]) if layers else None
    for i, p in enumerate(layers):
        X, H = ops.add_layer_norm(X, attend(i, H), *p["ln2"])
        F = feed_forward(H, *p["ffn"])
        if i + 1 < len(layers):
            X, H = ops.add_layer_norm(X, F, *layers[i + 1]["ln1"])
        else:
            X = X + F
    return X


def transformer(token_ids, P):  # token_ids: (seq,) -> logits (seq, vocab)
    """Decoder-only forward pass with the causal rule: embeddings + positions, N blocks, tied output."""
    config = DecoderConfig.of(P)
    ids = check.token_ids(token_ids, config.vocab, config.max_len)
    X = P["emb"][ids] + P["pos"][:len(ids)]
    layers = P["layers"]
    X = _blocks(X, layers, lambda i, H: multi_head(H, *layers[i]["attn"], layers[i]["h"], causal=True))
    return ops.linear(X, P["emb"].T)


def forward_cached(ids, P, cache, start, qkv):  # ids: (n,) at positions start .. start + n - 1
    """The last new position's logits (vocab,), the new keys and values written to cache[layer];
    qkv: each layer's fused_qkv (checked arguments: generate validates P and the ids once)."""
    X = P["emb"][ids] + P["pos"][start:start + len(ids)]
    layers = P["layers"]
    X = _blocks(X, layers, lambda i, H: cached_self_attention(H, qkv[i], layers[i]["attn"][3], layers[i]["h"],
                                                              cache[i], start))
    return ops.linear(X[-1], P["emb"].T)
