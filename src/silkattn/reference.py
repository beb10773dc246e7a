"""The NumPy reference: the oracle every silkattn kernel is tested against.

The functions and signatures follow the forward pass at the end of the seed text
("Attention Is All You Need", explained), written anew. This module is the single
place where silkattn's semantics are defined:

* attention: scores = Q K^T / sqrt(d_k); where ``mask`` is False the score is
  *replaced* by -1e9 (not added to), then a max-shifted softmax over the keys and
  the weighted sum of V. A query row whose keys are all masked therefore gets the
  plain mean of V (uniform weights), never NaN or zeros. Q may be longer or
  shorter than K/V (cross-attention) and leading batch dimensions broadcast.
* layer_norm uses the population variance; feed_forward uses ReLU; block is
  pre-norm, as in the listing.
* dtype is preserved: float32 in, float32 out (constants take the array's dtype,
  so NumPy 2 never upcasts a float32 computation to float64).
* causal_mask(n, m, offset): query i sits at position offset + i and feels keys
  0..offset + i (a KV cache: offset = m - n puts n new queries after the cache).
* attention's keywords (the models since 2019), in this order of operations:
  s = scale * Q K^T (scale defaults to 1/sqrt(d_k)); s = softcap * tanh(s / softcap);
  s += bias (an array broadcast to (..., Hq, Sq, Sk)) and s -= slope_h * |p_i - j| (alibi_slopes);
  then every hiding rule (mask False, causal j > p_i, window j < p_i - left or j > p_i + right)
  *replaces* s by -1e9; softmax over the keys; times V. Query i sits at position p_i = q_offset + i.
  Grouped-query attention: K and V may have Hkv heads (axis -3) for Q's Hq, Hq % Hkv == 0, and
  query head h reads K/V head h // (Hq // Hkv). Every constant is cast to the scores' dtype.
* The Llama family (rms_norm, rope, silu, swiglu, llama_block, llama): RMSNorm g * x / sqrt(mean(x^2)
  + eps) with no mean subtracted and no bias; rotary embeddings rotate the pairs (x_i, x_{i + d/2}) of
  each head (the half-split layout transformers uses) by angle p * base^(-2i/d) at position p, the
  angles computed in float64; the feed-forward is SwiGLU, (silu(X Wg) * X Wu) Wd.
* Bad arguments of the model-level functions raise ValueError/TypeError naming them
  (silkattn._checks, shared with the fast models).
"""
import math

import numpy as np

from . import _checks as check

MASKED = -1e9  # the score a masked-out key gets


def softmax(x):
    """softmax(x)_i = exp(x_i - max x) / sum_j exp(x_j - max x), over the last axis."""
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def attention(Q, K, V, mask=None, *, scale=None, softcap=None, bias=None, alibi_slopes=None, causal=False,
              window=None, q_offset=0, return_lse=False):  # Q: (..., Hq, Sq, d_k)  K, V: (..., Hkv, Sk, d)
    """softmax(hide(softcap(scale Q K^T) + bias + alibi)) V  ->  (..., Hq, Sq, d_v): see the module doc.
    return_lse: (out, lse), lse (..., Hq, Sq) = log sum_j exp(s_j) of each row's final scores s (what
    attention_backward recomputes the weights from: P = exp(s - lse))."""
    scores = _scores(Q, K, mask, scale, softcap, bias, alibi_slopes, causal, window, q_offset)[0]
    out = softmax(scores) @ kv_heads(Q, V)  # each row of weights sums to 1
    if not return_lse:
        return out
    top = scores.max(-1)
    return out, top + np.log(np.exp(scores - top[..., None]).sum(-1))


def _scores(Q, K, mask, scale, softcap, bias, alibi_slopes, causal, window, q_offset):
    """(s, s0, shown): attention's final scores s (..., Hq, Sq, Sk) (hidden ones replaced by -1e9),
    s0 = scale Q K^T before the softcap, and which keys each query sees."""
    K = kv_heads(Q, K)
    dt = np.result_type(Q.dtype, K.dtype, np.float32)
    s0 = Q @ np.swapaxes(K, -1, -2)  # (..., Sq, Sk): how hard each thread pulls
    s0 = s0 / np.sqrt(dt.type(Q.shape[-1])) if scale is None else s0 * dt.type(scale)
    scores = s0 if softcap is None else dt.type(softcap) * np.tanh(s0 / dt.type(softcap))
    if bias is not None:
        scores = scores + np.asarray(bias).astype(dt, copy=False)
    if alibi_slopes is not None:
        scores = scores + alibi(alibi_slopes, *scores.shape[-2:], q_offset, dt)
    shown = visible(*scores.shape[-2:], q_offset, causal, window)
    shown = shown if mask is None else np.logical_and(mask, shown)
    return np.where(shown, scores, MASKED), s0, shown  # replaced: a fully hidden row is uniform, mean(V)


def kv_heads(Q, K):  # K: (..., Hkv, Sk, d) -> (..., Hq, Sk, d) for grouped-query attention
    """K with each of its Hkv heads repeated Hq // Hkv times (query head h reads K head h // g)."""
    if Q.ndim < 3 or K.ndim < 3 or K.shape[-3] in (1, Q.shape[-3]) or Q.shape[-3] % K.shape[-3]:
        return K  # as many heads, one broadcast over them (multi-query), or no grouping: broadcasting
    return np.repeat(K, Q.shape[-3] // K.shape[-3], axis=-3)


def visible(Sq, Sk, q_offset=0, causal=False, window=None):  # -> (Sq, Sk) bool
    """Which key j query i (at position p = q_offset + i) may see: j <= p if causal; with
    window = (left, right), p - left <= j <= p + right (None or -1: that side unbounded)."""
    p, j = q_offset + np.arange(Sq)[:, None], np.arange(Sk)[None, :]
    left, right = (-1, -1) if window is None else (-1 if w is None else w for w in window)
    shown = np.ones((Sq, Sk), bool) if not causal else j <= p
    return shown & ((j >= p - left) | (left < 0)) & ((j <= p + right) | (right < 0))


def alibi(slopes, Sq, Sk, q_offset=0, dtype=np.float64):  # slopes: (Hq,) -> (Hq, Sq, Sk)
    """ALiBi's bias -slope_h * |p_i - j|: a penalty growing with the distance to the key."""
    distance = np.abs(q_offset + np.arange(Sq)[:, None] - np.arange(Sk)[None, :]).astype(dtype)
    return -np.asarray(slopes, dtype)[:, None, None] * distance


def attention_varlen(Q, K, V, cu_seqlens, causal=False, *, cu_seqlens_k=None, **keywords):
    """attention over each packed sequence's own rows: rows cu_seqlens[i] .. cu_seqlens[i + 1] of
    Q attend to rows cu_seqlens_k[i] .. cu_seqlens_k[i + 1] of K and V (the same rows by default).
    A sequence's queries are its last keys: query r sits at position r + (keys - queries) (a
    prefill after a cache), the position causal, window and alibi_slopes see. keywords:
    attention's scale, softcap, bias (..., Hq, total_q, total_k), alibi_slopes, window."""
    cu_k = cu_seqlens if cu_seqlens_k is None else cu_seqlens_k
    bias = keywords.get("bias")
    if bias is not None:  # (..., total_q, total_k), so each sequence can take its block
        bias = np.broadcast_to(bias, np.shape(bias)[:-2] + (Q.shape[-2], K.shape[-2]))
    lead = np.broadcast_shapes(Q.shape[:-2], kv_heads(Q, K).shape[:-2], kv_heads(Q, V).shape[:-2])
    out = np.zeros(lead + (Q.shape[-2], V.shape[-1]), np.result_type(Q, K, V))
    for s, e, sk, ek in zip(cu_seqlens[:-1], cu_seqlens[1:], cu_k[:-1], cu_k[1:]):
        if e == s:  # a sequence with no queries: no rows
            continue
        q, kv = (..., slice(s, e), slice(None)), (..., slice(sk, ek), slice(None))
        kw = dict(keywords, bias=None if bias is None else bias[..., s:e, sk:ek])
        out[q] = attention(Q[q], K[kv], V[kv], causal=causal, q_offset=(ek - sk) - (e - s), **kw)
    return out


def attention_paged(Q, K_pages, V_pages, page_table, seq_lens, *, causal=True, **keywords):
    """attention of each sequence b over its own seq_lens[b] keys, kept in pages of a shared pool:
    key j of sequence b is row j % P of page page_table[b, j // P] of K_pages and V_pages
    (n_pages, Hkv, P, d). Q (B, Hq, Sq, d_k): the queries of the last Sq positions of each
    sequence (a decoding step: Sq = 1). keywords: attention's scale, softcap, alibi_slopes, window."""
    B, P = len(Q), K_pages.shape[-2]
    out = []
    for b in range(B):
        n, pages = int(seq_lens[b]), page_table[b, :-(-int(seq_lens[b]) // P)]
        K, V = (np.concatenate(list(a[pages]), -2)[..., :n, :] for a in (K_pages, V_pages))
        out.append(attention(Q[b], K, V, causal=causal, q_offset=n - Q.shape[-2], **keywords))
    return np.stack(out) if out else np.zeros(Q.shape[:-1] + V_pages.shape[-1:], Q.dtype)


def multi_head(X, Wq, Wk, Wv, Wo, h, mask=None, memory=None):  # X: (..., seq, d); W*: (d, d)
    """concat_i attention(X Wq_i, M Wk_i, M Wv_i, mask) Wo, with h heads of d_k = d / h and
    M = X (self-attention) or M = memory (cross-attention: keys and values from another sequence)."""
    X, M, d_k = check.multi_head(X, Wq, Wk, Wv, Wo, h, memory)

    def split(A):  # (..., seq, d) -> (..., h, seq, d_k): one read per leg
        return np.swapaxes(A.reshape(*A.shape[:-1], h, d_k), -2, -3)

    heads = np.swapaxes(attention(split(X @ Wq), split(M @ Wk), split(M @ Wv), mask), -2, -3)
    return heads.reshape(*heads.shape[:-2], -1) @ Wo  # pool the h reads: (..., seq, d)


LN_EPS = 1e-5  # the listing's layer_norm epsilon (its blocks call layer_norm without one)


def layer_norm(X, g, b, eps=LN_EPS):
    """g * (X - mean) / sqrt(var + eps) + b over the last axis (population variance)."""
    mu = X.mean(-1, keepdims=True)
    var = X.var(-1, keepdims=True)
    return g * (X - mu) / np.sqrt(var + eps) + b


def feed_forward(X, W1, b1, W2, b2):  # X: (..., d); W1: (d, d_ff); W2: (d_ff, d)
    """max(0, X W1 + b1) W2 + b2: each position on its own."""
    X = check.feed_forward(X, W1, b1, W2, b2)
    return np.maximum(X @ W1 + b1, 0) @ W2 + b2


def block(X, p, mask=None):  # X: (..., seq, d)
    """Pre-norm block: X += multi_head(LN1(X)); X += feed_forward(LN2(X)).

    Fixes a defect of the seed listing, which calls feed_forward without its weights:
    here they come from p["ffn"] = (W1, b1, W2, b2).
    """
    p = check.layer(p)
    X = X + multi_head(layer_norm(X, *p["ln1"]), *p["attn"], p["h"], mask)
    return X + feed_forward(layer_norm(X, *p["ln2"]), *p["ffn"])


def transformer(token_ids, P):  # token_ids: (seq,) ints -> logits (seq, vocab)
    """Decoder-only forward pass: embeddings + positions, N blocks, tied output projection.

    Fixes a defect of the seed listing, which passes no mask: the decoder "can't feel a
    thread that hasn't been spun yet", so every block gets the causal mask.
    """
    ids = check.token_ids(token_ids, len(P["emb"]), len(P["pos"]))
    n = len(ids)
    X = P["emb"][ids] + P["pos"][:n]  # words + positions
    for layer in P["layers"]:
        X = block(X, layer, causal_mask(n))
    return X @ P["emb"].T  # scores over the vocabulary


# ---- the paper's encoder-decoder: "add & norm" around every sublayer, cross-attention in the decoder

def sublayer(X, f, ln, norm):
    """A residual sublayer: LayerNorm(X + f(X)) for norm="post" (the paper), X + f(LayerNorm(X))
    for norm="pre" (the listing's block)."""
    return layer_norm(X + f(X), *ln) if norm == "post" else X + f(layer_norm(X, *ln))


def encoder_block(X, p, mask=None):  # X: (..., src, d)
    """Self-attention, then feed-forward, each wrapped in add & norm (p["norm"])."""
    p = check.layer(p, kind="encoder")
    X = sublayer(X, lambda H: multi_head(H, *p["attn"], p["h"], mask), p["ln1"], p["norm"])
    return sublayer(X, lambda H: feed_forward(H, *p["ffn"]), p["ln2"], p["norm"])


def decoder_block(Y, memory, p, self_mask=None, memory_mask=None):  # Y: (..., tgt, d)
    """Masked self-attention, cross-attention over the encoder's memory, feed-forward: each
    wrapped in add & norm (p["norm"])."""
    p = check.layer(p, kind="decoder")
    Y = sublayer(Y, lambda H: multi_head(H, *p["attn"], p["h"], self_mask), p["ln1"], p["norm"])
    cross = p["cross"]
    Y = sublayer(Y, lambda H: multi_head(H, *cross, p["h"], memory_mask, memory), p["ln_cross"], p["norm"])
    return sublayer(Y, lambda H: feed_forward(H, *p["ffn"]), p["ln2"], p["norm"])


def embed(ids, E, pos):  # ids: (..., seq) -> (..., seq, d)
    """E[ids] * sqrt(d) + positions: the paper scales the (shared) embedding weights by sqrt(d)."""
    return E[ids] * np.sqrt(E.dtype.type(E.shape[1])) + pos[: ids.shape[-1]]


def key_padding(mask):  # (..., src) bool -> (..., 1, 1, src): every head and query sees the same keys
    return None if mask is None else np.asarray(mask, bool)[..., None, None, :]


def encode(src_ids, P, src_mask=None):  # src_ids: (..., src) -> memory (..., src, d)
    """The encoder: embeddings + positions, N encoder blocks; src_mask (..., src) is False at padding."""
    ids, src_mask = check.source(src_ids, src_mask, P)
    X = embed(ids, P["src_emb"], P["pos"])
    for p in P["encoder"]:
        X = encoder_block(X, p, key_padding(src_mask))
    return X


def decode(tgt_ids, memory, P, memory_mask=None):  # tgt_ids: (..., tgt) -> logits (..., tgt, tgt_vocab)
    """The decoder: causal over the target, cross-attention over memory (padding: memory_mask False)."""
    ids, memory, memory_mask = check.target(tgt_ids, memory, memory_mask, P)
    Y = embed(ids, P["tgt_emb"], P["pos"])
    for p in P["decoder"]:
        Y = decoder_block(Y, memory, p, causal_mask(ids.shape[-1]), key_padding(memory_mask))
    return Y @ P["tgt_emb"].T  # output projection tied to the target embeddings


def next_token(logits, temperature=0.0, top_k=None, rng=None, top_p=None):  # logits: (vocab,) -> int
    """Greedy (argmax) at temperature 0; else a draw from softmax(logits / temperature) over the
    top_k largest logits (all if None), then over the fewest most likely of those whose probabilities
    sum to top_p or more (all if None), computed in float64."""
    logits = np.asarray(logits)
    if temperature == 0:  # float32's argmax is its float64 values' (each converts exactly)
        exact = logits.dtype in (np.float32, np.float64)
        return int(np.argmax(logits if exact else logits.astype(np.float64)))
    logits = logits.astype(np.float64)
    keep = np.argsort(-logits, kind="stable")[: top_k or len(logits)]
    p = softmax(logits[keep] / temperature)
    if top_p is not None:  # the nucleus: the smallest prefix whose mass reaches top_p
        n = min(int(np.searchsorted(np.cumsum(p), top_p)) + 1, len(p))
        keep, p = keep[:n], p[:n] / p[:n].sum()
    return int(keep[rng.choice(len(keep), p=p)])


def generate(prompt_ids, P, max_new_tokens, *, memory=None, memory_mask=None, temperature=0.0, top_k=None,
             seed=None, eos_id=None):  # -> the new token ids (n,)
    """Write max_new_tokens tokens after the prompt, recomputing the whole forward pass for each:
    the decoder-only transformer, or with memory (from encode) the encoder-decoder's decoder."""
    ids, rng = list(check.prompt(prompt_ids, P, max_new_tokens, memory)), np.random.default_rng(seed)
    check.sampling(temperature, top_k)
    for _ in range(max_new_tokens):
        logits = transformer(ids, P) if memory is None else decode(np.array(ids), memory, P, memory_mask)
        ids.append(next_token(logits[-1], temperature, top_k, rng))
        if ids[-1] == eos_id:
            break
    return np.array(ids[len(prompt_ids):], dtype=np.int64)


# ---- a BERT-family encoder, as sentence-transformers runs it: post-norm, biased projections, GELU

def gelu(x):
    """x Phi(x) = x (1 + erf(x / sqrt 2)) / 2, the exact (erf) form, in x's dtype."""
    return (x * (1 + _erf(x)) / 2).astype(x.dtype)


def _erf(x):  # erf(x / sqrt 2) in float64
    return np.frompyfunc(math.erf, 1, 1)(np.asarray(x, np.float64) / math.sqrt(2)).astype(np.float64)


def bert_layer(X, p, mask=None, eps=1e-12):  # X: (..., seq, d)
    """LayerNorm(X + attention(X)), then LayerNorm(X + gelu(X W1 + b1) W2 + b2); p["attn"] holds
    (Wq, bq, Wk, bk, Wv, bv, Wo, bo), every weight (in, out)."""
    Wq, bq, Wk, bk, Wv, bv, Wo, bo = p["attn"]
    d_k = X.shape[-1] // p["h"]

    def split(A):  # (..., seq, d) -> (..., h, seq, d_k)
        return np.swapaxes(A.reshape(*A.shape[:-1], p["h"], d_k), -2, -3)

    heads = np.swapaxes(attention(split(X @ Wq + bq), split(X @ Wk + bk), split(X @ Wv + bv), mask), -2, -3)
    X = layer_norm(X + heads.reshape(X.shape) @ Wo + bo, *p["ln1"], eps)
    W1, b1, W2, b2 = p["ffn"]
    return layer_norm(X + gelu(X @ W1 + b1) @ W2 + b2, *p["ln2"], eps)


def bert(ids, P, mask=None):  # ids: (..., seq) -> token embeddings (..., seq, d)
    """Word + position + token-type (0) embeddings, a layer norm, then the post-norm layers; mask
    (..., seq) is False at padding, which no token attends to."""
    X = layer_norm(P["word"][ids] + P["pos"][: ids.shape[-1]] + P["type"][0], *P["ln"], P["eps"])
    for p in P["layers"]:
        X = bert_layer(X, p, key_padding(mask), P["eps"])
    return X


def mean_pool(X, mask):  # X: (..., seq, d), mask: (..., seq) -> (..., d)
    """The mean of the real tokens' embeddings (sentence-transformers' mean pooling)."""
    m = np.asarray(mask, X.dtype)[..., None]
    return (X * m).sum(-2) / np.maximum(m.sum(-2), X.dtype.type(1e-9))


def normalize(x):  # (..., d): unit length (a zero vector stays zero)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), x.dtype.type(1e-12))


def positional_encoding(n, d):  # -> (n, d)
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d))."""
    angle = np.arange(n)[:, None] / 10000.0 ** (np.arange(0, d, 2) / d)  # (n, ceil(d/2))
    pe = np.empty((n, d))
    pe[:, 0::2], pe[:, 1::2] = np.sin(angle), np.cos(angle[:, : d // 2])
    return pe


def causal_mask(n, m=None, offset=0):  # -> (n, m) bool
    """mask[i, j] = j <= offset + i: query i, at position offset + i, feels keys 0..offset + i."""
    return np.tri(n, n if m is None else m, k=offset, dtype=bool)


def init_params(vocab, d=512, h=8, n_layers=6, d_ff=2048, max_len=2048, seed=0, dtype=np.float32):
    """Random weights in the layout transformer() takes (fan-in scaled normals)."""
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(dtype)

    def layer():  # fresh arrays per layer, so editing one layer's weights leaves the others
        ones, zeros = np.ones(d, dtype), np.zeros(d, dtype)
        return {"ln1": (ones, zeros.copy()), "attn": (w(d, d), w(d, d), w(d, d), w(d, d)), "h": h,
                "ln2": (ones.copy(), zeros.copy()),
                "ffn": (w(d, d_ff), np.zeros(d_ff, dtype), w(d_ff, d), zeros)}

    return {"emb": w(vocab, d), "pos": positional_encoding(max_len, d).astype(dtype),
            "layers": [layer() for _ in range(n_layers)]}


def init_seq2seq_params(src_vocab, tgt_vocab, d=512, h=8, n_layers=6, d_ff=2048, norm="post", seed=0,
                        dtype=np.float32, max_len=2048):
    """Random weights for encode/decode (the paper's sizes by default): two embeddings (the target's
    tied to the output projection), sinusoidal positions, n_layers encoder and decoder blocks."""
    rng = np.random.default_rng(seed)
    check.norm(norm)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(dtype)

    def ln():
        return np.ones(d, dtype), np.zeros(d, dtype)

    def block(cross):  # the listing's block layout, plus cross-attention in the decoder
        p = {"ln1": ln(), "attn": tuple(w(d, d) for _ in range(4)), "h": h, "norm": norm, "ln2": ln(),
             "ffn": (w(d, d_ff), np.zeros(d_ff, dtype), w(d_ff, d), np.zeros(d, dtype))}
        return dict(p, ln_cross=ln(), cross=tuple(w(d, d) for _ in range(4))) if cross else p

    return {"src_emb": w(src_vocab, d), "tgt_emb": w(tgt_vocab, d),
            "pos": positional_encoding(max_len, d).astype(dtype),
            "encoder": [block(False) for _ in range(n_layers)],
            "decoder": [block(True) for _ in range(n_layers)]}


# ---- the Llama family (SmolLM2, Llama 2/3, ...): RMSNorm, rotary positions, SwiGLU, grouped K/V heads

def rms_norm(X, g, eps=1e-5):  # X: (..., d); g: (d,)
    """g * X / sqrt(mean(X^2) + eps) over the last axis: a layer norm without the mean or a bias."""
    return g * (X / np.sqrt((X * X).mean(-1, keepdims=True) + X.dtype.type(eps)))


def rope(X, positions, base=10000.0, freq_factors=None):  # X: (..., seq, d_head); positions: (seq,) ints
    """Rotary embedding: the pair (x_i, x_{i + d/2}) of the row at position p turned by the angle
    p * base^(-2i/d) / f_i, i < d/2 (a head's query-key dot product then depends on p_q - p_k only);
    f = freq_factors (d/2,), Llama 3's per-frequency divisors (its rope_freqs tensor), else 1."""
    half = X.shape[-1] // 2
    inv_freq = float(base) ** (-np.arange(half) / half)  # (half,): one turning speed per pair
    if freq_factors is not None:
        inv_freq = inv_freq / np.asarray(freq_factors, np.float64)
    angle = np.asarray(positions, np.float64)[:, None] * inv_freq  # (seq, half)
    cos, sin = np.cos(angle).astype(X.dtype), np.sin(angle).astype(X.dtype)
    x1, x2 = X[..., :half], X[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def silu(x):
    """x sigmoid(x) = x / (1 + exp(-x)), in x's dtype."""
    return x / (1 + np.exp(-x))


def gelu_tanh(x):
    """x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) / 2: GELU's tanh form (Gemma's), in x's dtype."""
    c = x.dtype.type(math.sqrt(2 / math.pi))
    return x * (1 + np.tanh(c * (x + x.dtype.type(0.044715) * x * x * x))) / 2


GATES = {"silu": silu, "gelu_tanh": gelu_tanh}  # the family's feed-forward gates


def swiglu(X, Wg, Wu, Wd, activation="silu"):  # X: (..., d); Wg, Wu: (d, d_ff); Wd: (d_ff, d)
    """(act(X Wg) * (X Wu)) Wd: the gated feed-forward of the Llama family (act = silu: SwiGLU;
    gelu_tanh: Gemma's GeGLU)."""
    return (GATES[activation](X @ Wg) * (X @ Wu)) @ Wd


def llama_block(X, p, positions, eps=1e-5, rope_base=10000.0, freq_factors=None):  # X: (seq, d)
    """X += post_attn_norm(Wo grouped_attention(rope(q_norm(q)), rope(k_norm(k)), v)) of RMSNorm(X);
    X += post_ffn_norm(gated_ffn(RMSNorm(X))). p: "attn_norm", "attn" = (Wq, Wk, Wv, Wo) (Wq: (d,
    h d_head)), "h" query heads, "h_kv" K/V heads, "ffn_norm", "ffn" = (Wg, Wu, Wd). What varies in
    the family (Qwen2, Gemma 3, ...), each absent or None for Llama: "bias" (bq, bk, bv); "q_norm",
    "k_norm" (d_head,) per-head RMSNorm gains; "post_attn_norm", "post_ffn_norm" (d,) (sandwich
    norms); "activation" (swiglu's); "window" w: a query sees the keys less than w positions back;
    "rope_base", "rope_freqs", "scale": this layer's, over the model's and 1 / sqrt(d_head)."""
    (Wq, Wk, Wv, Wo), h, h_kv = p["attn"], p["h"], p["h_kv"]
    bq, bk, bv = p.get("bias") or (0, 0, 0)
    base, factors = p.get("rope_base") or rope_base, p.get("rope_freqs", freq_factors)
    H = rms_norm(X, p["attn_norm"], eps)

    def heads(W, b, n, g):  # -> (n, seq, d_head), RMSNorm-ed by g if given
        A = (H @ W + b).reshape(len(X), n, -1).swapaxes(0, 1)
        return A if g is None else rms_norm(A, g, eps)

    q, k = (rope(heads(W, b, n, p.get(g)), positions, base, factors)
            for W, b, n, g in ((Wq, bq, h, "q_norm"), (Wk, bk, h_kv, "k_norm")))
    window = None if p.get("window") is None else (p["window"] - 1, None)
    A = attention(q, k, heads(Wv, bv, h_kv, None), causal=True, window=window, scale=p.get("scale"))
    X = X + _maybe_norm(A.swapaxes(0, 1).reshape(len(X), -1) @ Wo, p.get("post_attn_norm"), eps)
    F = swiglu(rms_norm(X, p["ffn_norm"], eps), *p["ffn"], p.get("activation", "silu"))
    return X + _maybe_norm(F, p.get("post_ffn_norm"), eps)


def _maybe_norm(X, g, eps):
    return X if g is None else rms_norm(X, g, eps)


def llama(token_ids, P):  # token_ids: (seq,) ints -> logits (seq, vocab)
    """A Llama-family decoder: token embeddings (times P["embed_scale"], if there: Gemma's sqrt(d)),
    the blocks (rotary positions 0 .. seq - 1), a final RMSNorm, the output projection P["out"]
    (d, vocab) (P["emb"].T when tied); P["rope_freqs"], if there, rope's freq_factors."""
    ids = np.asarray(token_ids)
    X, positions = P["emb"][ids], np.arange(len(ids))
    if P.get("embed_scale") is not None:
        X = X * X.dtype.type(P["embed_scale"])
    for p in P["layers"]:
        X = llama_block(X, p, positions, P["eps"], P["rope_base"], P.get("rope_freqs"))
    return rms_norm(X, P["norm"], P["eps"]) @ P["out"]


# ---- GGUF weight blocks (llama.cpp's ggml types), little-endian, float16 scales

QUANT_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}  # bytes of one block of 32 weights: the kernels' types
# every type dequantize reads: (weights, bytes) a block; the K-quants are super-blocks of 256
QUANT_BLOCKS = {**{kind: (32, size) for kind, size in QUANT_BYTES.items()}, "Q5_0": (32, 22),
                "Q5_1": (32, 24), "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210)}


def dequantize(blocks, kind):  # blocks: uint8 (rows, nblocks * bytes) -> float32 (rows, nblocks * weights)
    """The float32 weights of a matrix stored as GGUF blocks, each row a run of blocks:
      Q8_0  34 bytes: fp16 d, 32 int8 q                          w = d q
      Q4_0  18 bytes: fp16 d, 16 bytes of 4-bit q                w = d (q - 8)
      Q4_1  20 bytes: fp16 d, fp16 m, 16 bytes as Q4_0's         w = d q + m
      Q5_0  22 bytes: fp16 d, 4 bytes of fifth bits, 16 as Q4_0  w = d (q - 16)
      Q5_1  24 bytes: fp16 d, fp16 m, the same 20 bytes          w = d q + m
      Q4_K, Q5_K, Q6_K: 256 weights in sub-blocks of 32 (16 for Q6_K) with 6- or 8-bit scales (_k_quant).
    Byte j of the 16 holds q_j in its low nibble and q_(j + 16) in its high one; bit j of the
    fifth bits is q_j's bit 4. In float32, each product in the order of the gguf package's
    dequantize, so the two agree to the bit."""
    weights, size = QUANT_BLOCKS[kind]
    rows, nblocks = blocks.shape[0], blocks.shape[1] // size
    b = blocks.reshape(rows, nblocks, size)  # one block a row
    if kind.endswith("_K"):
        return _k_quant(b, kind).reshape(rows, weights * nblocks)
    d = b[..., 0:2].view("<f2").astype(np.float32)  # (rows, nblocks, 1)
    if kind == "Q8_0":
        w = b[..., 2:].view(np.int8).astype(np.float32) * d
    else:
        q = _nibbles(b[..., -16:])  # (rows, nblocks, 32)
        if kind in ("Q5_0", "Q5_1"):
            q = q | _bits(b[..., size - 20:size - 16]) << 4
        if kind in ("Q4_0", "Q5_0"):
            w = d * (q.astype(np.int8) - np.int8(8 if kind == "Q4_0" else 16)).astype(np.float32)
        else:
            w = d * q.astype(np.float32) + b[..., 2:4].view("<f2").astype(np.float32)
    return w.reshape(rows, 32 * nblocks)


def quantize_q8_0(w):  # w: float (rows, 32 nblocks) -> uint8 (rows, 34 nblocks), Q8_0 blocks
    """w as Q8_0 blocks (dequantize's first layout), as llama.cpp writes them: per 32 weights
    d = max |w| / 127 and q = round(w / d) half away from zero (q = 0 where d = 0), computed in
    float32, d then stored as fp16 (so dequantize gives fp16(d) q). Finite w only."""
    b = np.asarray(w, np.float32).reshape(len(w), -1, 32)
    d = np.abs(b).max(-1, keepdims=True) / np.float32(127)
    v = b * np.where(d == 0, np.float32(0), np.float32(1) / np.where(d == 0, np.float32(1), d))
    q = (np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))).astype(np.int8)
    out = np.concatenate([d.astype("<f2").view(np.uint8), q.view(np.uint8)], axis=-1)
    return out.reshape(len(w), -1)


def _nibbles(b):  # (..., n) bytes -> (..., 2n): the n low nibbles, then the n high ones
    return np.concatenate([b & 15, b >> 4], axis=-1)


def _bits(b):  # (..., n) bytes -> (..., 8 n) uint8 0 or 1: bit j of the little-endian word
    return np.unpackbits(b, axis=-1, bitorder="little")


def _k_quant(b, kind):  # b: (rows, nblocks, bytes) -> float32 (rows, nblocks, 256)
    """A K-quant super-block of 256 weights (llama.cpp's block_q4_K, block_q5_K, block_q6_K):
      Q4_K 144 bytes: fp16 d, fp16 dmin, 12 bytes of 8 6-bit scales s and mins m, 128 bytes of 4-bit q;
           sub-block i (32 weights) w = (d s_i) q - (dmin m_i)
      Q5_K 176 bytes: Q4_K's fields with 32 bytes of fifth bits after the scales; q 5 bits
      Q6_K 210 bytes: 128 bytes of low 4 bits, 64 of high 2 bits, 16 int8 scales s, fp16 d;
           sub-block i (16 weights) w = (d s_i) (q - 32)
    Q4_K/Q5_K: a 64-weight pair of sub-blocks takes 32 bytes, low nibbles then high; the fifth bits
    of weight l of sub-block i are bit i of byte l. Q6_K: each half of 128 weights takes 64 bytes
    of low bits (low nibbles, then high) and 32 of high bits (2 bits a quarter of 32, from bit 0)."""
    f16 = "<f2"
    if kind == "Q6_K":
        low = np.concatenate([_nibbles(b[..., 0:64]), _nibbles(b[..., 64:128])], axis=-1)  # (.., 256)
        q = (low | _q6_high(b[..., 128:192]) << 4).astype(np.int8) - np.int8(32)
        ds = b[..., 208:210].view(f16).astype(np.float32) * b[..., 192:208].view(np.int8).astype(np.float32)
        return (ds[..., :, None] * q.reshape(*q.shape[:-1], 16, 16).astype(np.float32)).reshape(q.shape)
    scales, mins = _k_scales(b[..., 4:16])  # (rows, nblocks, 8) each
    qs = b[..., -128:].reshape(*b.shape[:-1], 4, 32)
    q = np.concatenate([qs & 15, qs >> 4], axis=-1).reshape(*b.shape[:-1], 8, 32)  # sub-block 2j, 2j + 1
    if kind == "Q5_K":
        q = q | (b[..., 16:48, None] >> np.arange(8, dtype=np.uint8) & 1).swapaxes(-1, -2) << 4
    d, dmin = (b[..., o:o + 2].view(f16).astype(np.float32) for o in (0, 2))  # (rows, nblocks, 1)
    ds, dm = d * scales.astype(np.float32), dmin * mins.astype(np.float32)
    return (ds[..., None] * q.astype(np.float32) - dm[..., None]).reshape(*b.shape[:-1], 256)


def _q6_high(qh):  # (..., 64) bytes -> (..., 256): Q6_K's high 2 bits, each half's 32 bytes 4 quarters
    halves = qh.reshape(*qh.shape[:-1], 2, 1, 32) >> (2 * np.arange(4, dtype=np.uint8))[:, None] & 3
    return halves.reshape(*qh.shape[:-1], 256)


def _k_scales(s):  # (..., 12) bytes -> the 8 6-bit scales and 8 6-bit mins of Q4_K and Q5_K
    """Bytes 0-3: scales 0-3 in their low 6 bits; 4-7: mins 0-3 likewise; 8-11: the low nibbles of
    scales 4-7 and the high nibbles of mins 4-7, whose top 2 bits are those of bytes 0-3 (scales)
    and 4-7 (mins)."""
    lo, mid, top = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    scales = np.concatenate([lo & 63, (top & 15) | (lo >> 6) << 4], axis=-1)
    mins = np.concatenate([mid & 63, (top >> 4) | (mid >> 6) << 4], axis=-1)
    return scales, mins


# the values of x a scale of round_q8 covers, by the type of W it multiplies: llama.cpp's Q8_0 for
# the blocks of 32, Q8_K (one scale a block of 256) for the K-quants
Q8_BLOCK = {**{kind: 32 for kind in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")},
            "Q4_K": 256, "Q5_K": 256, "Q6_K": 256}


def round_q8(x, block=32):  # x: (..., block nblocks) -> the same shape and dtype
    """x as integer dot products see it (llama.cpp's 8-bit activations), a block of `block` values
    at a time (Q8_BLOCK): with a = max |x| over the block, x ~ d q, q = rint(x (127 / a)) in int8
    and d = a / 127, each step rounded in x's dtype. A block of zeros stays zero; one holding a NaN
    or an inf is all NaN."""
    blocks = x.reshape(*x.shape[:-1], -1, block)
    a = np.abs(blocks).max(-1, keepdims=True)  # (..., nblocks, 1); NaN if the block holds one
    a = np.where(np.isfinite(a), a, x.dtype.type(np.nan))
    inv = x.dtype.type(127) / np.where(a == 0, x.dtype.type(1), a)
    return (np.rint(blocks * inv) * (a / x.dtype.type(127))).reshape(x.shape)


def matmul_int8(A, B):  # A: int8 (..., m, k); B: int8 (k, n) -> int32 (..., m, n)
    """A B summed exactly in integers: the integer GEMM's oracle (each sum fits int32 while k <=
    (2^31 - 1) // 128^2, silkattn.ops.matmul_int8's limit)."""
    return (A.astype(np.int64) @ B.astype(np.int64)).astype(np.int32)


class RoundsQ8:  # W whose products round their rows first: X @ RoundsQ8(W) = round_q8(X, block) @ W
    """A matrix that multiplies as a QuantizedMatrix with activations "int8" does (block: Q8_BLOCK of
    its type): reference.llama on params holding these instead of float matrices is the int8 path's
    oracle."""
    __array_ufunc__ = None  # numpy's X @ self then defers to __rmatmul__

    def __init__(self, W, block=32):
        self.W, self.block = W, block

    def __rmatmul__(self, X):
        return round_q8(X, self.block) @ self.W


# ---- training: the backward passes. Each takes dY = dL/dY, the gradient of a scalar loss L with
# respect to the forward's output, and the forward's inputs, and gives dL/d(each input) that a
# gradient flows through (tests/test_reference_backward.py checks them by finite differences).

def softmax_backward(dY, Y):  # Y = softmax(X) -> dX
    """dX = Y (dY - sum_j dY_j Y_j) over the last axis."""
    return Y * (dY - (dY * Y).sum(-1, keepdims=True))


def attention_backward(dout, Q, K, V, out, lse, mask=None, *, scale=None, softcap=None, bias=None,
                       alibi_slopes=None, causal=False, window=None, q_offset=0):  # -> (dQ, dK, dV)
    """attention's gradients from its output and lse (attention(..., return_lse=True)), the same
    keywords: P = exp(s - lse), the forward's weights (here softmax(s) itself; the kernels recompute
    them from lse a tile at a time, and a row with every key hidden, whose lse -1e9 + ln(keys) loses
    its ln(keys) to rounding, gets its uniform weights either way); dV = P^T dout, dS = P (dout V^T -
    rowsum(dout out)), zero where a key is hidden, times 1 - tanh^2(s0 / softcap) under a softcap;
    dQ = scale dS K, dK = scale dS^T Q. A K/V head read by a group of query heads (grouped-query)
    gets the group's sum."""
    s, s0, shown = _scores(Q, K, mask, scale, softcap, bias, alibi_slopes, causal, window, q_offset)
    dt = s.dtype
    scale = 1 / np.sqrt(dt.type(Q.shape[-1])) if scale is None else dt.type(scale)
    P = softmax(s)
    Kh, Vh = kv_heads(Q, K), kv_heads(Q, V)
    dS = P * (dout @ np.swapaxes(Vh, -1, -2) - (dout * out).sum(-1, keepdims=True))
    dS = np.where(shown, dS, 0)  # a hidden score is the constant -1e9
    if softcap is not None:
        dS = dS * (1 - np.tanh(s0 / dt.type(softcap)) ** 2)
    dK, dV = scale * np.swapaxes(dS, -1, -2) @ Q, np.swapaxes(P, -1, -2) @ dout
    return _unbroadcast(scale * dS @ Kh, Q.shape), _heads_back(dK, K, Q), _heads_back(dV, V, Q)


def _heads_back(dKh, K, Q):  # the gradient of kv_heads(Q, K) (..., Hq, Sk, d) -> K's shape
    if Q.ndim >= 3 and K.ndim >= 3 and K.shape[-3] not in (1, Q.shape[-3]):
        dKh = dKh.reshape(dKh.shape[:-3] + (K.shape[-3], -1) + dKh.shape[-2:]).sum(-3)
    return _unbroadcast(dKh, K.shape)


def _unbroadcast(d, shape):  # the gradient of broadcasting an operand of `shape` to d's shape
    d = d.sum(tuple(range(d.ndim - len(shape))))  # leading axes it was broadcast over
    return d.sum(tuple(i for i, n in enumerate(shape) if n == 1 and d.shape[i] != 1), keepdims=True)


def layer_norm_backward(dY, X, g, eps=LN_EPS):  # -> (dX, dg, db)
    """Y = g Xh + b, Xh = (X - mean) / sigma, sigma = sqrt(var + eps): dg = sum dY Xh and db = sum dY
    over the rows; dX = (G - mean(G) - Xh mean(G Xh)) / sigma with G = g dY."""
    sigma = np.sqrt(X.var(-1, keepdims=True) + X.dtype.type(eps))
    Xh, G = (X - X.mean(-1, keepdims=True)) / sigma, g * dY
    dX = (G - G.mean(-1, keepdims=True) - Xh * (G * Xh).mean(-1, keepdims=True)) / sigma
    rows = tuple(range(X.ndim - 1))
    return dX, (dY * Xh).sum(rows), dY.sum(rows)


def rms_norm_backward(dY, X, g, eps=1e-5):  # -> (dX, dg)
    """Y = g X r, r = 1 / sqrt(mean(X^2) + eps): dg = sum dY X r over the rows; dX = r (G - X r^2
    mean(G X)) with G = g dY."""
    r = 1 / np.sqrt((X * X).mean(-1, keepdims=True) + X.dtype.type(eps))
    G = g * dY
    return r * (G - X * (r * r) * (G * X).mean(-1, keepdims=True)), (dY * X * r).sum(tuple(range(X.ndim - 1)))


def linear_backward(dY, X, W):  # Y = X W (+ b) -> (dX, dW, db)
    """dX = dY W^T; dW = X^T dY and db = sum dY over every row (X's leading axes as rows)."""
    rows, drows = X.reshape(-1, X.shape[-1]), dY.reshape(-1, dY.shape[-1])
    return dY @ W.T, rows.T @ drows, drows.sum(0)


def gelu_grad(x):
    """d gelu / dx = Phi(x) + x phi(x) (the exact GELU's), in x's dtype."""
    x64 = np.asarray(x, np.float64)
    return ((1 + _erf(x)) / 2 + x64 * np.exp(-x64 * x64 / 2) / math.sqrt(2 * math.pi)).astype(x.dtype)


def feed_forward_backward(dY, X, W1, b1, W2, b2, activation="relu"):  # -> (dX, dW1, db1, dW2, db2)
    """The gradients of act(X W1 + b1) W2 + b2, act ReLU (feed_forward) or the exact GELU (gelu):
    back through W2, the activation's slope (ReLU's: 1 where X W1 + b1 > 0), then W1."""
    if activation not in ("relu", "gelu"):
        raise ValueError(f"activation must be 'relu' or 'gelu', got {activation!r}")
    Z = X @ W1 + b1
    dH, dW2, db2 = linear_backward(dY, np.maximum(Z, 0) if activation == "relu" else gelu(Z), W2)
    dX, dW1, db1 = linear_backward(dH * ((Z > 0) if activation == "relu" else gelu_grad(Z)), X, W1)
    return dX, dW1, db1, dW2, db2


def embedding_backward(dX, ids, vocab):  # X = E[ids] -> dE (vocab, d)
    """dE[t] = the sum of dX's rows at the positions where ids is t (zero for tokens not seen)."""
    dE = np.zeros((vocab, dX.shape[-1]), dX.dtype)
    np.add.at(dE, np.asarray(ids).reshape(-1), dX.reshape(-1, dX.shape[-1]))
    return dE


def cross_entropy(H, E, targets):  # H: (..., d) rows; E: (vocab, d), the tied output projection
    """The mean over H's rows of -log softmax(H E^T)[target]: next-token cross-entropy with the
    logits H E^T (transformer's tied output projection)."""
    logits = H.reshape(-1, H.shape[-1]) @ E.T
    top = logits.max(-1, keepdims=True)
    lse = top[:, 0] + np.log(np.exp(logits - top).sum(-1))
    return (lse - logits[np.arange(len(logits)), np.asarray(targets).reshape(-1)]).mean()


def cross_entropy_backward(H, E, targets, dloss=1.0):  # -> (dH, dE)
    """With Z = H E^T: dZ = dloss (softmax(Z) - onehot(target)) / rows; dH = dZ E, dE = dZ^T H."""
    rows = H.reshape(-1, H.shape[-1])
    Z = rows @ E.T
    dZ = softmax(Z)
    dZ[np.arange(len(Z)), np.asarray(targets).reshape(-1)] -= 1
    dZ *= H.dtype.type(dloss / len(Z))
    return (dZ @ E).reshape(H.shape), dZ.T @ rows
