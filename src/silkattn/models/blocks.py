"""The blocks a decoder layer is composed of, and the compositions of them the family runs, as
llama.cpp's src/models/*.cpp compose build_norm / build_attn / build_ffn.

A block is a readable form in silkattn's ops: Pass.norm (RMSNorm by a gain), Pass.attention (the
mixer: Q/K/V, their biases and QK-norms, rotary, the cache through the pass's attend, the output
projection), Pass.ffn (the gated feed-forward), Pass.add and Pass.add_norm (a residual, with a
sandwich norm of the sublayer's output, and the next norm fused). A composition is a function

    layer(run, L, X, H) -> (X, H'):  X (rows, d) the residual stream, H = RMSNorm(X) by
                                     L.attn_norm, H' the next layer's (run.next_norm) normed stream

of the blocks over one layer's weights L (llama.LlamaLayer); the one layer loop (models.runner)
runs it for prefill, decoding one sequence and decoding many, and an architecture names its
composition (family.Architecture.layer). At the last layer of a prefill only the rows that reach a
logit go on: run.rows(X) cuts a stream to them, and Pass.attention returns only theirs.

The fused decoding steps (ops.layer_step and ops.layer_step_rows: one call for every layer) run
one composition, pre_norm, with what the layer step's record holds (Q/K/V biases, QK-norms,
sandwich norms, SwiGLU or GeGLU, a window): FUSED says so, here and nowhere else. Any other
composition, and any layer a record cannot hold, decodes through the blocks' ops forms."""
import numpy as np

from .. import ops


def pre_norm(run, L, X, H):
    """X += post_attn_norm(attention(H)); X += post_ffn_norm(ffn(RMSNorm(X))): Llama, Qwen2/3, and
    Gemma 3 with its sandwich norms (reference.llama_block)."""
    X, H = run.add_norm(run.rows(X), run.attention(L, H), L.post_attn_norm, L.ffn_norm)
    return run.add_norm(X, run.ffn(L, H), L.post_ffn_norm, run.next_norm)


FUSED = (pre_norm,)  # the compositions ops.layer_step's record describes (layer_records)


class _Room:
    """The layer loop's large results, one array a name reused layer after layer. Many rows' arrays
    are megabytes: made anew each layer, they came as fresh pages from the system, whose faults took
    about 8% of a 646-row prefill's time on one thread (SmolLM2, int8)."""

    def __init__(self):
        self.arrays = {}

    def __call__(self, name, *shape):  # -> a float32 array of this shape, its contents undefined
        a = self.arrays.get(name)
        if a is None or a.shape != shape:
            a = self.arrays[name] = np.empty(shape, np.float32)
        return a


def linear(X, W, out=None):  # X (n, k) through a layer's matrix, or its parts side by side
    if isinstance(W, tuple):
        return np.concatenate([ops.linear(X, w) for w in W], -1, out=out)
    return ops.linear(X, W, out=out)


class Pass:
    """One pass of rows through the layers: config (family.FamilyConfig), positions (n,) of the
    rows, attend(i, q, k, v) -> A (layer i's attention of q (hq, rows, dh) after keeping k, v
    (hkv, n, dh) in its cache; A (hq, rows, dh)), last: the rows (indices) the last layer takes
    alone (the others reach no logit), or None. The loop sets i and next_norm layer by layer."""

    def __init__(self, config, positions, attend, last=None):
        self.config, self.positions, self.attend, self.last = config, positions, attend, last
        self.room, self.i, self.next_norm = _Room(), 0, None

    def rows(self, X):  # X's rows that go on past this layer's mixer
        return X[self.last] if self.last is not None and self.i + 1 == self.config.n_layers else X

    def norm(self, X, gain):
        return ops.rms_norm(X, gain, self.config.eps)

    def add(self, X, F, post_norm=None):  # -> X + post_norm(F)
        return X + (F if post_norm is None else self.norm(F, post_norm))

    def add_norm(self, X, F, post_norm, gain):  # -> (X + post_norm(F), RMSNorm(X + post_norm(F)) by gain)
        if post_norm is not None:
            F = self.norm(F, post_norm)
        return ops.add_rms_norm(X, F, gain, self.config.eps)

    def attention(self, L, H):  # H (n, d) -> (rows, d): the layer's attention, its output projected
        c, room, i = self.config, self.room, self.i
        n, hq, hkv, dh = len(H), c.h, c.h_kv, c.d_head
        qkv = linear(H, L.wqkv, room("qkv", n, (hq + 2 * hkv) * dh))  # Q heads, K heads, V heads
        if L.bqkv is not None:
            qkv += L.bqkv
        qk = qkv[:, :(hq + hkv) * dh].reshape(n, hq + hkv, dh).swapaxes(0, 1)  # (hq + hkv, n, dh)
        if L.q_norm is not None:
            qk = np.concatenate([self.norm(qk[:hq], L.q_norm), self.norm(qk[hq:], L.k_norm)])
        base, factors = c.layer_rope(i)
        ops.rope(qk, self.positions, base, factors, out=qk)
        q = qk[:hq]
        if self.last is not None and i + 1 == c.n_layers:
            q = q[:, self.last]
        v = qkv[:, (hq + hkv) * dh:].reshape(n, hkv, dh).swapaxes(0, 1)
        A = self.attend(i, q, qk[hq:], v)  # (hq, rows, dh)
        rows = A.shape[1]
        heads = room("heads", rows, hq * dh)  # A's rows, each token's heads side by side
        heads.reshape(rows, hq, dh)[...] = A.swapaxes(0, 1)
        return linear(heads, L.wo, room("o", rows, c.d))

    def ffn(self, L, H):  # H (rows, d) -> (rows, d): down(activation(gate) * up)
        c, room, rows = self.config, self.room, len(H)
        if isinstance(L.wgu, tuple):  # gate and up as the file's parts: each (rows, d_ff), not joined
            gate, up = (ops.linear(H, W, out=room(name, rows, c.d_ff)) for W, name in zip(L.wgu, "gu"))
        else:
            G = ops.linear(H, L.wgu, out=room("gu", rows, 2 * c.d_ff))  # (rows, 2 d_ff): gate | up
            gate, up = G[:, :c.d_ff], G[:, c.d_ff:]
        return linear(ops.gate_mul(gate, up, c.family.activation, out=room("a", rows, c.d_ff)), L.wd,
                      room("f", rows, c.d))


def run_layers(config, layers, final_norm, X, p):  # -> (rows, d): the final norm's output
    """X (n, d), the embedded tokens, through every layer of `layers` by the architecture's
    composition over the pass p (Pass), then the final norm."""
    layer = config.family.layer
    H = ops.rms_norm(X, layers[0].attn_norm, config.eps)
    for i, L in enumerate(layers):
        p.i, p.next_norm = i, layers[i + 1].attn_norm if i + 1 < len(layers) else final_norm
        X, H = layer(p, L, X, H)
    return H


def fusable(config, layers):  # -> bool
    """Whether the fused decoding steps run these layers: a composition of FUSED, every product
    a block matrix (quant.QuantizedMatrix), one kind of activations for all of them."""
    return config.family.layer in FUSED and all(
        L.quantized and len({W.activations for W in L.products}) == 1 for L in layers)


def layer_records(config, layers, cache):  # -> [LayerStep], one a layer
    """The fused step's records (ops.layer_step_record) of pre_norm layers over `cache` (per layer
    (K, V)), sharing one set of buffers: the longest cache's record makes them."""
    c, records = config, [None] * len(layers)
    sizes = [K.shape[-2] for K in cache]
    positions, first = max(sizes), int(np.argmax(sizes))
    for i in [first] + [i for i in range(len(layers)) if i != first]:
        L = layers[i]
        base, factors = c.layer_rope(i)
        qkv, up = (list(W) if isinstance(W, tuple) else W for W in (L.wqkv, L.wgu))
        extras = {}
        if c.family.qk_norm:
            extras["qk_norm"] = (L.q_norm, L.k_norm)
        if c.family.sandwich:
            extras["post_norms"] = (L.post_attn_norm, L.post_ffn_norm)
        if c.window(i) is not None:  # a ring of the window's positions where the cache is shorter
            extras.update(window=c.window(i), positions=positions)
        records[i] = ops.layer_step_record(
            heads=c.h, kv_heads=c.h_kv, norm1=L.attn_norm, qkv=qkv if L.bqkv is None else (qkv, L.bqkv),
            o=L.wo, norm2=L.ffn_norm, up=up, down=L.wd, cache=(cache[i][0], cache[i][1]), eps=c.eps,
            activation="swiglu" if c.family.activation == "silu" else "geglu", rope_base=base,
            freq_factors=factors, scale=c.scale, scratch_of=records[first], **extras)
    return records
