"""The kernels API: silkattn's ops on the current backend (set_backend, use_backend, SILKATTN_BACKEND).

Each op takes the reference's arguments and returns what the reference returns (float32 stays
float32), plus keyword-only extras: out= (a result array to fill), and attention's causal,
q_offset, scale, softcap, bias, alibi_slopes and window. Bad input raises a ValueError or TypeError
naming the argument, the same on every backend. Models (silkattn.models) are written with these ops
only; silkattn._api does the checks and holds each op's NumPy fallback, and the backend's Kernels
record does the arithmetic.
"""
import functools

from . import _api, _backends, _backward, _plan


def softmax(x, *, out=None):
    """softmax(x)_i = exp(x_i - max x) / sum_j exp(x_j - max x), over the last axis."""
    return _api.softmax(_backends.kernels(), x, out=out)


def layer_norm(X, g, b, eps=1e-5, *, out=None):
    """g * (X - mean) / sqrt(var + eps) + b over the last axis (population variance)."""
    return _api.layer_norm(_backends.kernels(), X, g, b, eps, out=out)


def attention(Q, K, V, mask=None, *, scale=None, softcap=None, bias=None, alibi_slopes=None, causal=False,
              window=None, q_offset=0, out=None, return_lse=False):
    """softmax(hide(softcap(scale Q K^T) + bias + alibi)) V over Q (..., Hq, Sq, d_k), K (..., Hkv, Sk,
    d_k), V (..., Hkv, Sk, d_v); the semantics are silkattn.reference.attention's.

    scale: the scores' factor (1/sqrt(d_k) by default); softcap: scores become softcap * tanh(s /
    softcap); bias: added to the scores, broadcast to (..., Hq, Sq, Sk); alibi_slopes (Hq,): the
    bias -slope_h * |p_i - j|, computed in the kernel. Hidden keys (mask False, causal j > p_i,
    window=(left, right) outside p_i - left <= j <= p_i + right) get the score -1e9; query i sits at
    position p_i = q_offset + i (with a KV cache of Sk keys, q_offset = Sk - Sq puts the new queries
    last). K and V may have fewer heads than Q (grouped-query attention: Hq % Hkv == 0, query head h
    reads K/V head h // (Hq / Hkv)), read in place, never repeated. return_lse: (out, lse), lse (...,
    Hq, Sq) = log sum_j exp(s_ij) of each row's final scores, what attention_backward takes.
    """
    return _api.attention(_backends.kernels(), Q, K, V, mask, scale=scale, softcap=softcap, bias=bias,
                          alibi_slopes=alibi_slopes, causal=causal, window=window, q_offset=q_offset, out=out,
                          return_lse=return_lse)


def attention_backward(dout, Q, K, V, out, lse, mask=None, *, scale=None, softcap=None, bias=None,
                       alibi_slopes=None, causal=False, window=None, q_offset=0):
    """(dQ, dK, dV): attention's gradients given dout = dL/d out, its inputs, and its (out, lse) from
    attention(..., return_lse=True) with the same keywords. P = exp(s - lse) is recomputed a tile at
    a time (nothing Sq x Sk is kept): dV = P^T dout, dS = P (dout V^T - rowsum(dout out)) (0 where a
    key is hidden; times 1 - tanh^2 under a softcap), dQ = scale dS K, dK = scale dS^T Q; a K/V head
    shared by a group of query heads (or broadcast) gets the sum. Each gradient has its operand's
    shape; the semantics are silkattn.reference.attention_backward's."""
    return _api.attention_backward(_backends.kernels(), dout, Q, K, V, out, lse, mask, scale=scale,
                                   softcap=softcap, bias=bias, alibi_slopes=alibi_slopes, causal=causal,
                                   window=window, q_offset=q_offset)


def softmax_backward(dY, Y):
    """dX = Y (dY - sum_j dY_j Y_j) over the last axis: softmax's gradient from its output Y."""
    return _backward.softmax_backward(_backends.kernels(), dY, Y)


def layer_norm_backward(dY, X, g, eps=1e-5):
    """(dX, dg, db) of Y = g Xh + b, Xh = (X - mean) / sigma, sigma = sqrt(var + eps): dX = (G - mean(G)
    - Xh mean(G Xh)) / sigma with G = g dY; dg = sum dY Xh and db = sum dY over the rows."""
    return _backward.layer_norm_backward(_backends.kernels(), dY, X, g, eps)


def rms_norm_backward(dY, X, g, eps=1e-5):
    """(dX, dg) of Y = g X r, r = 1 / sqrt(mean(X^2) + eps): dX = r (G - X r^2 mean(G X)) with G = g dY;
    dg = sum dY X r over the rows."""
    return _backward.rms_norm_backward(_backends.kernels(), dY, X, g, eps)


def linear_backward(dY, X, W):
    """(dX, dW, db) of Y = X W (+ b): dX = dY W^T, dW = X^T dY, db = sum dY over X's leading axes."""
    return _backward.linear_backward(_backends.kernels(), dY, X, W)


def feed_forward_backward(dY, X, W1, b1, W2, b2, activation="relu"):
    """(dX, dW1, db1, dW2, db2) of act(X W1 + b1) W2 + b2, act ReLU (feed_forward) or the exact GELU
    ("gelu"); X W1 + b1 is recomputed, not taken from the forward."""
    return _backward.feed_forward_backward(_backends.kernels(), dY, X, W1, b1, W2, b2, activation)


def embedding_backward(dX, ids, vocab):
    """dE (vocab, d) of X = E[ids]: dE[t] = the sum of dX's rows where ids is t (zero elsewhere)."""
    return _backward.embedding_backward(_backends.kernels(), dX, ids, vocab)


def cross_entropy(H, E, targets):
    """The mean over H's rows of -log softmax(H E^T)[target]: next-token cross-entropy with the tied
    output projection E (vocab, d), the logits made a block of rows at a time."""
    return _backward.cross_entropy(_backends.kernels(), H, E, targets)


def cross_entropy_and_grads(H, E, targets):
    """(loss, dH, dE): cross_entropy(H, E, targets) and cross_entropy_backward(H, E, targets) in one
    pass, each block of the logits Z = H E^T made once, summed into the loss and turned into its
    gradient in place (what a training step takes)."""
    return _backward.cross_entropy_and_grads(_backends.kernels(), H, E, targets)


def cross_entropy_backward(H, E, targets, dloss=1.0):
    """(dH, dE) of dloss * cross_entropy(H, E, targets): with Z = H E^T, dZ = dloss (softmax(Z) -
    onehot(target)) / rows, dH = dZ E, dE = dZ^T H; each block of logits turned into its gradient in
    place (the rows x vocab logits never held whole, never twice)."""
    return _backward.cross_entropy_backward(_backends.kernels(), H, E, targets, dloss)


def attention_varlen(Q, K, V, cu_seqlens, *, causal=False, cu_seqlens_k=None, scale=None, softcap=None,
                     bias=None, alibi_slopes=None, window=None, out=None):
    """attention over sequences packed end to end: Q (..., total_q, d) holds n sequences, rows
    cu_seqlens[i] .. cu_seqlens[i + 1] (cu_seqlens: 0, ..., total_q); each attends to its own keys
    only, rows cu_seqlens_k[i] .. cu_seqlens_k[i + 1] of K and V (by default the same rows as its
    queries), so no padding is ever computed. A sequence's queries are its last keys (query r at
    position r + keys - queries: a prefill after a cache) for causal, window and alibi_slopes; the
    other keywords are attention's (bias: (..., Hq, total_q, total_k))."""
    return _api.attention_varlen(_backends.kernels(), Q, K, V, cu_seqlens, causal=causal,
                                 cu_seqlens_k=cu_seqlens_k, scale=scale, softcap=softcap, bias=bias,
                                 alibi_slopes=alibi_slopes, window=window, out=out)


def attention_paged(Q, K_pages, V_pages, page_table, seq_lens, *, causal=True, scale=None, softcap=None,
                    alibi_slopes=None, window=None, out=None):
    """attention of B sequences whose keys sit in pages of a shared pool (a paged KV cache): Q (B, Hq,
    Sq, d_k) holds the queries of each sequence's last Sq positions (a decoding step: Sq = 1); the
    seq_lens[b] keys of sequence b are, in order, the rows of pages page_table[b, 0], page_table[b,
    1], ... of K_pages (n_pages, Hkv, P, d_k) and V_pages (n_pages, Hkv, P, d_v), read in place.
    -> (B, Hq, Sq, d_v). Causal by default; the other keywords are attention's. P: at most 256 keys
    or a multiple of 256. The semantics are silkattn.reference.attention_paged's."""
    return _api.attention_paged(_backends.kernels(), Q, K_pages, V_pages, page_table, seq_lens, causal=causal,
                                scale=scale, softcap=softcap, alibi_slopes=alibi_slopes, window=window,
                                out=out)


def linear(X, W, b=None, *, out=None):
    """X W + b (b optional) over X's last axis: numpy's matmul, except that a few rows of X (a
    decoding step) run silkattn's matrix-vector kernel, which streams W once on silkattn's threads.
    W may be a silkattn.quant.QuantizedMatrix (GGUF blocks, standing for the float32 (k, n) matrix
    they dequantize to): the kernel then reads the blocks themselves, and many rows multiply by W
    dequantized a panel at a time; the result's dtype is np.result_type(X, float32) (b's too)."""
    return _api.linear(_backends.kernels(), X, W, b, out=out)


def matmul_int8(A, B, *, out=None):
    """A B for int8 A (..., k) and B (k, n), summed exactly in int32 (as reference.matmul_int8): the
    integer GEMM (vpdpbusd on AVX-512 VNNI, vpmaddwd on AVX2 and AVX-512). k <= 131071, the depth up
    to which no such sum can leave int32 (a ValueError beyond)."""
    return _api.matmul_int8(_backends.kernels(), A, B, out=out)


def bias_relu(x, b, *, out=None):
    """max(x + b, 0), b broadcast along the last axis; out may be x itself (in place)."""
    return _api.bias_relu(_backends.kernels(), x, b, out=out)


def bias_gelu(x, b, *, out=None):
    """gelu(x + b) = v (1 + erf(v / sqrt 2)) / 2 with v = x + b (the exact GELU); out may be x."""
    return _api.bias_gelu(_backends.kernels(), x, b, out=out)


def add_layer_norm(X, R, g, b, eps=1e-5):
    """(S, layer_norm(S, g, b, eps)) with S = X + R: a residual add and the norm after it, one pass."""
    return _api.add_layer_norm(_backends.kernels(), X, R, g, b, eps)


def rms_norm(X, g, eps=1e-5, *, out=None):
    """g * X / sqrt(mean(X^2) + eps) over the last axis (the Llama family's norm: no mean, no bias)."""
    return _api.rms_norm(_backends.kernels(), X, g, eps, out=out)


def add_rms_norm(X, R, g, eps=1e-5):
    """(S, rms_norm(S, g, eps)) with S = X + R: a residual add and the norm after it, one pass."""
    return _api.add_rms_norm(_backends.kernels(), X, R, g, eps)


def rope(X, positions, base=10000.0, freq_factors=None, *, out=None):
    """Rotary positions over X (..., seq, d_head): the pair (x_i, x_(i + d_head/2)) of the row at
    position p turned by the angle p * base^(-2i/d_head) / f_i; positions (seq,) non-negative ints;
    f = freq_factors (d_head/2,) positive (Llama 3's rope_freqs), else 1. out may be X itself (in
    place, e.g. on the head views of a projection's output)."""
    return _api.rope(_backends.kernels(), X, positions, base, freq_factors=freq_factors, out=out)


def silu_mul(G, U, *, out=None):
    """silu(G) * U = G U / (1 + exp(-G)) (the SwiGLU gate), G and U of one shape; out may be G
    or U itself (in place, e.g. on the two column halves of one projection's output)."""
    return _api.silu_mul(_backends.kernels(), G, U, out=out)


def gelu_tanh_mul(G, U, *, out=None):
    """gelu_tanh(G) * U = G (1 + tanh(sqrt(2/pi) (G + 0.044715 G^3))) / 2 * U (the GeGLU gate,
    Gemma's), G and U of one shape; out may be G or U itself."""
    return _api.gelu_tanh_mul(_backends.kernels(), G, U, out=out)


def gate_mul(G, U, activation="silu", *, out=None):
    """act(G) * U for reference.GATES' activation: "silu" (silu_mul) or "gelu_tanh" (gelu_tanh_mul)."""
    return _api.gate_mul(_backends.kernels(), G, U, activation, out=out)


def layer_step_record(*, heads, norm1, qkv, o, norm2, up, down, cache, eps, kv_heads=None, activation="relu",
                      post_norm=False, rope_base=None, freq_factors=None, cross=None, scratch_of=None,
                      qk_norm=None, post_norms=None, window=None, positions=None, scale=None):
    """The record of one decoder layer's decoding step (silkattn._step.LayerStep), checked once, for
    layer_step to run a token through: the layer's weights, norms, eps, rotary tables and KV cache
    by name, never by position. Each argument is checked against the others (TypeError or
    ValueError naming the first that does not fit); the record is then all a kernel is given.

    heads, kv_heads (default heads): query and K/V heads (grouped-query attention); the head width
        is o's input over heads. norm1, norm2: the attention's and the feed-forward's norm, g (d,)
        for RMSNorm or (g, b) for LayerNorm; eps their epsilon.
    qkv (d, (heads + 2 kv_heads) head width): Q heads, K heads, V heads; o (heads head width, d); up
        (d, d_ff), or (d, 2 d_ff) gate | up with a gated activation; down (d_ff, d). Each a float32
        (in, out) array or a silkattn.quant.QuantizedMatrix (GGUF blocks of any of quant.KINDS;
        "int8" activations round the block products' input to 8 bits), or (matrix, bias); qkv and
        up may also be a list of parts side by side (blocks of different types), [Wq, Wk, Wv].
    activation: "relu" (relu(up)), "swiglu" (silu(gate) up) or "geglu" (gelu_tanh(gate) up).
    cache: the layer's (K, V), both float32 or both float16 (half the bytes: rows rounded to nearest
        even as they are written, widened exactly as they are read), each (kv_heads, capacity, head
        width) or (capacity, kv_heads head width); layer_step writes row pos and attends over the
        rows it sees.
    window: a query sees the keys less than window positions back; a cache of exactly window
        positions is then a ring (position p in row p % window) and positions (default capacity)
        the last position + 1 the step may be at (the rotary tables' length).
    qk_norm: (g_q, g_k) (head width,) RMSNorms of each query and key head before rotary (Gemma 3).
    post_norms: (g_attn, g_ffn) (d,) RMSNorms of the sublayers' outputs before their residual adds
        (Gemma 3's sandwich norms). scale: the scores' factor (default 1 / sqrt(head width)).
    post_norm: x = norm(x + f(x)) instead of x + f(norm(x)) (the paper's placement).
    rope_base: rotary positions of this base on the Q and K heads (None: none); freq_factors (head
        width / 2,): rope's per-frequency divisors (Llama 3's rope_freqs), with rope_base only.
    cross: the cross-attention over an encoder's memory, {"norm", "q" (d, d), "o" (d, d), "memory":
        (K, V) each (n_src, d), "keep": (n_src,) mask or None}.
    scratch_of: a record of the same sizes whose buffers this one shares (a model's layers)."""
    return _api.layer_step_record(heads=heads, norm1=norm1, qkv=qkv, o=o, norm2=norm2, up=up, down=down,
                                  cache=cache, eps=eps, kv_heads=kv_heads, activation=activation,
                                  post_norm=post_norm, rope_base=rope_base, freq_factors=freq_factors,
                                  cross=cross, scratch_of=scratch_of, qk_norm=qk_norm, post_norms=post_norms,
                                  window=window, positions=positions, scale=scale)


def layer_step(step, x, pos):
    """x (d,) float32, the residual row of one token at position pos, through one decoder layer in
    place (one fused kernel call where the backend has one, else the same step as separate ops):
    x += o(attention(rope(qkv(norm1(x))))) over the cache's rows 0 .. pos (this token's K and V
    written at row pos), [cross-attention,] x += down(act(up(norm2(x)))); post-norm x = norm(x +
    f(x)). step: a layer_step_record. Returns x."""
    return _api.layer_step(_backends.kernels(), step, x, pos)


def layer_step_rows(step, X, positions, K_pages, V_pages, pages):
    """X (m, d) float32, the residual rows of m tokens (a batch's decoding step), each through the
    layer of `step` in place as layer_step would take it alone: row r at position positions[r] over
    its own cache, page pages[r] of K_pages and V_pages (n_pages, h_kv, capacity, d_head: a pool of
    caches laid out as the record's, of its cache's dtype), its K and V written there. step may be
    a list of records, the layers run in turn (K_pages and V_pages then lists of their pools, one
    pair a record). One fused call for all the rows and layers where the backend has one (each
    product one pass over the weights for the rows), else the ops (each product one call for the
    rows, each row's attention over its page). Llama-family records (block products, pre-norm,
    gated, no cross-attention)."""
    return _api.layer_step_rows(_backends.kernels(), step, X, positions, K_pages, V_pages, pages)


# ---- what the current backend's kernels promise about a row (models.runner packs calls by them)

def rows_alike(W):  # -> int
    """The most rows of X that linear(X, W) multiplies in W's few-row kernels, each row summed as
    it is alone, where past them a GEMM sums a row otherwise (in the last bits); 0 where the two
    sum alike. A prompt of at most so many rows, prefilled with others of at most so many rows in
    all, gets generate's sums."""
    return _api.few_rows(_backends.kernels(), W)


def attention_alone_rows(group):  # -> int, or None
    """The fewest query rows a K/V head (group query heads to each) from which the current
    backend's compiled attention computes a causal row from its keys alone, whatever the other
    rows of the call (the tiles path: more than _plan.ROWS_MAX rows a K/V head); None where the
    backend has no compiled attention (NumPy's sums depend on the call's rows)."""
    if _backends.kernels().attention is None:
        return None
    return _plan.ROWS_MAX // group + 1


OPS = ("softmax", "layer_norm", "attention", "attention_backward", "attention_varlen", "attention_paged",
       "softmax_backward", "layer_norm_backward", "rms_norm_backward", "linear_backward",
       "feed_forward_backward", "embedding_backward", "cross_entropy", "cross_entropy_backward",
       "cross_entropy_and_grads",
       "linear", "matmul_int8", "bias_relu", "bias_gelu", "add_layer_norm", "rms_norm", "add_rms_norm",
       "rope", "silu_mul", "gelu_tanh_mul", "gate_mul", "layer_step", "layer_step_rows")


def bind(kernels):
    """{op name: the op run on `kernels` alone}: a backend module's own API (silkattn.numba.attention)."""
    def bound(name):
        public = globals()[name]
        impl = getattr(_api, name, None) or getattr(_backward, name)

        @functools.wraps(public)
        def call(*args, **kwargs):
            return impl(kernels, *args, **kwargs)
        return call
    return {name: bound(name) for name in OPS}
