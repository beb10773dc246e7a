"""The paper's encoder-decoder on silkattn's ops: an encoder that reads the source, a decoder that
writes one token at a time, feeling what it already wrote (causal self-attention) and reaching
across to the encoder's output (cross-attention); "add & norm" around every sublayer, post-norm
(the paper) or pre-norm (the listing's block), chosen per model (Seq2SeqConfig.norm).

Padding: src_mask / memory_mask (..., src) are False at padded source tokens, which then reach no
query (a key padding mask, broadcast over heads and queries by the kernels, no (src, src) array).
decode_cached runs the decoder on new positions against a KV cache, with the cross-attention's
keys and values computed once per source (see generate.py).
"""
from .. import _checks as check
from .. import ops
from .. import reference as ref
from .config import Seq2SeqConfig
from .layers import cached_self_attention, feed_forward, merge_heads, multi_head, split_heads, sublayer


def encoder_block(X, p, mask=None):  # X: (..., src, d)
    """Self-attention, then feed-forward, each wrapped in add & norm (p["norm"])."""
    p = check.layer(p, kind="encoder")
    X = sublayer(X, lambda H: multi_head(H, *p["attn"], p["h"], mask), p["ln1"], p["norm"])
    return sublayer(X, lambda H: feed_forward(H, *p["ffn"]), p["ln2"], p["norm"])


def decoder_block(Y, memory, p, self_mask=None, memory_mask=None, *, causal=False):  # Y: (..., tgt, d)
    """Masked self-attention (self_mask, or causal=True for the kernels' causal flag), cross-attention
    over memory, feed-forward: each wrapped in add & norm (p["norm"])."""
    p = check.layer(p, kind="decoder")
    h, norm = p["h"], p["norm"]
    Y = sublayer(Y, lambda H: multi_head(H, *p["attn"], h, self_mask, causal=causal), p["ln1"], norm)
    Y = sublayer(Y, lambda H: multi_head(H, *p["cross"], h, memory_mask, memory), p["ln_cross"], norm)
    return sublayer(Y, lambda H: feed_forward(H, *p["ffn"]), p["ln2"], norm)


def encode(src_ids, P, src_mask=None):  # src_ids: (..., src) -> memory (..., src, d)
    """The encoder: scaled embeddings + positions, N encoder blocks."""
    Seq2SeqConfig.of(P)
    ids, src_mask = check.source(src_ids, src_mask, P)
    X = ref.embed(ids, P["src_emb"], P["pos"])
    for p in P["encoder"]:
        X = encoder_block(X, p, ref.key_padding(src_mask))
    return X


def decode(tgt_ids, memory, P, memory_mask=None):  # tgt_ids: (..., tgt) -> logits (..., tgt, tgt_vocab)
    """The decoder over a whole target: causal self-attention, cross-attention over memory."""
    Seq2SeqConfig.of(P)
    ids, memory, memory_mask = check.target(tgt_ids, memory, memory_mask, P)
    Y = ref.embed(ids, P["tgt_emb"], P["pos"])
    for p in P["decoder"]:
        Y = decoder_block(Y, memory, p, None, ref.key_padding(memory_mask), causal=True)
    return ops.linear(Y, P["tgt_emb"].T)


def cross_cache(memory, P):
    """Every decoder layer's cross-attention keys and values, (memory Wk, memory Wv): computed once
    per source, read by every decoding step."""
    return [(ops.linear(memory, p["cross"][1]), ops.linear(memory, p["cross"][2])) for p in P["decoder"]]


def decode_cached(ids, P, cache, start, qkv, cross, memory_mask=None):  # ids: (n,) at positions start ..
    """The last new position's logits (tgt_vocab,); the new self-attention keys and values go to
    cache[layer] (qkv: each layer's fused_qkv), the cross-attention reads cross[layer] (cross_cache)."""
    Y = ref.embed(ids, P["tgt_emb"], P["pos"][start:])
    mask = ref.key_padding(memory_mask)
    for i, p in enumerate(P["decoder"]):
        h, (Wq, _, _, Wo), (Km, Vm) = p["h"], p["cross"], cross[i]
        Y = sublayer(Y, lambda H: cached_self_attention(H, qkv[i], p["attn"][3], h, cache[i], start),
                     p["ln1"], p["norm"])
        Y = sublayer(Y, lambda H: ops.linear(merge_heads(ops.attention(split_heads(ops.linear(H, Wq), h),
                                                                       split_heads(Km, h), split_heads(Vm, h),
                                                                       mask)), Wo),
                     p["ln_cross"], p["norm"])
        Y = sublayer(Y, lambda H: feed_forward(H, *p["ffn"]), p["ln2"], p["norm"])
    return ops.linear(Y[-1], P["tgt_emb"].T)


init_seq2seq_params = ref.init_seq2seq_params  # random weights in the paper's sizes (Seq2SeqConfig too)
