"""The layer-step record: one decoder layer's decoding step for one token, laid out once for a
fused kernel (Kernels.layer_step), so that both backends read the same named fields (kernels/
layer_step.h's sa_layer is its C twin, silkattn/numba/layer_step.py's Step its Numba one).

A step, in place on the residual row x (d,) at position pos (silkattn.ops.layer_step):

    attention sublayer   pre-norm: x += post1(o(attn(rope(qk_norm(qkv(norm1(x)))))));  post-norm
                         (post_norm): x = norm1(x + o(attn(rope(qkv(x))))). qkv's output is the h
                         query heads, then the h_kv key and value heads of dh each (its parts' outputs
                         side by side); with q_norm / k_norm each query / key head gets an RMSNorm of
                         its own first (Gemma 3); this token's K and V go to the cache's row pos, and
                         each query head attends over the keys at positions max(0, pos - window + 1)
                         .. pos of its K/V head (grouped-query: head j reads K/V head j // (h / h_kv)),
                         scores times `scale`. A float16 cache (half the bytes) holds K and V
                         rounded to nearest even, the attention reading them widened exactly. A
                         ring (ring: the cache holds the window's positions): position p in row
                         p % capacity, the step sees every row written. Rotary
                         (cos, sin given): the query and key heads turned by row pos of the tables
                         first (the half-split pairs of reference.rope). post1 (sandwich norms): an
                         RMSNorm of the sublayer's output before the residual add (none if empty).
    cross-attention      (has_cross) the same with cross_q, cross_o and norm_cross over the
                         memory's keys and values (heads side by side, no rotary, no cache write),
                         a key with keep == 0 hidden.
    feed-forward         relu: x += down(relu(up(norm2(x))));  gated: up's output is gate | up
                         (2 d_ff), x += post2(down(act(gate) up)), act silu (GATE_SILU) or the tanh
                         GELU (GATE_GELU_TANH); post-norm as above.

Each product is a Product: out = in W (+ b), W float32 (k, n) (DENSE) or GGUF blocks of W^T as
silkattn.quant.QuantizedMatrix holds them; q8: every block product takes its input rounded to 8
bits a block (reference.round_q8). A norm is LayerNorm (g, b) or, b empty, RMSNorm (g), with eps.

silkattn._api.layer_step_record builds and checks a LayerStep (the only check: kernels trust its
fields); a backend keeps what it derives from the record (its own form of it) in `prepared`.
"""
import dataclasses

import numpy as np

DENSE = -1  # a Product's kind for float32 weights; else the block type's code (silkattn.quant.KINDS)
GATE_NONE, GATE_SILU, GATE_GELU_TANH = 0, 1, 2  # the feed-forward's activation: relu(up), act(gate) up
GATES = {"relu": GATE_NONE, "swiglu": GATE_SILU, "geglu": GATE_GELU_TANH}


@dataclasses.dataclass(frozen=True, eq=False)
class Product:
    """out = in W (+ b) for an input of k values: W (k, n)."""

    w: np.ndarray   # DENSE: float32 (k, n) C-contiguous; blocks: uint8 (n, k / 32 * block bytes)
    kind: int       # DENSE or the block type's code
    k: int
    n: int
    b: np.ndarray   # (n,) float32, or empty: no bias
    matrix: object = None  # the QuantizedMatrix of blocks (a backend's layouts of it: QuantizedMatrix.rows16)


@dataclasses.dataclass(frozen=True, eq=False)
class Norm:
    """g (x - mean) / sqrt(var + eps) + b (LayerNorm), or with b empty g x / sqrt(mean(x^2) + eps)."""

    g: np.ndarray   # (d,) float32
    b: np.ndarray   # (d,) float32, or empty: RMSNorm


@dataclasses.dataclass(frozen=True, eq=False)
class Scratch:
    """The step's float32 buffers (shared by the records of one model's layers): qkv ((h + 2 h_kv)
    dh,), a (h dh,), hn (max(d, d_ff),), f (max(up's n, d),), scores (h, max(capacity, n_src))."""

    qkv: np.ndarray
    a: np.ndarray
    hn: np.ndarray
    f: np.ndarray
    scores: np.ndarray

    @property
    def arrays(self):
        return self.qkv, self.a, self.hn, self.f, self.scores


@dataclasses.dataclass(frozen=True, eq=False)
class LayerStep:
    d: int                 # the residual row's width
    h: int                 # query heads
    h_kv: int              # key/value heads (h % h_kv == 0)
    dh: int                # a head's width (not necessarily d / h)
    eps: float             # the norms' epsilon
    post_norm: bool        # x = norm(x + f(x)) instead of x + f(norm(x))
    gate: int              # GATE_NONE (relu), GATE_SILU or GATE_GELU_TANH: act(gate) up
    q8: bool               # block products round their input to 8 bits a block
    norm1: Norm
    qkv: tuple             # Products d -> (h + 2 h_kv) dh, their outputs side by side (1 to 3 parts:
    #                        a file's Q, K and V may be blocks of different types)
    o: Product             # h dh -> d
    norm2: Norm
    up: tuple              # Products d -> d_ff (relu) or 2 d_ff (gated: gate | up), 1 or 2 parts
    down: Product          # d_ff -> d
    q_norm: Norm           # (dh,) RMSNorm of each query head before rotary, or g empty: none
    k_norm: Norm           # the same for the key heads
    post1: Norm            # (d,) RMSNorm of the attention's output before the residual add, or empty
    post2: Norm            # the same for the feed-forward's
    scale: float           # the attention scores' factor (1 / sqrt(dh) unless the model says)
    window: int            # a query sees the keys less than window positions back (0: all)
    ring: bool             # the cache is a ring of the window's positions (capacity == window)
    positions: int         # the positions a step may be at: capacity, or with a ring the tables'
    K: np.ndarray          # the layer's cache, float32 or float16, C-contiguous: head g's row t at element
    V: np.ndarray          #   g head_stride + t row_stride of the flat K and V (Llama's (h_kv,
    head_stride: int       #   capacity, dh): capacity dh, dh; the listing's (capacity, d): dh, d)
    row_stride: int
    capacity: int          # positions (rows) the cache holds
    cos: np.ndarray        # (positions, dh / 2) rotary tables (row p: position p), or empty
    sin: np.ndarray
    has_cross: bool
    norm_cross: Norm       # has_cross: the cross-attention's norm and products (d -> h dh, h dh -> d)
    cross_q: Product
    cross_o: Product
    Km: np.ndarray         # has_cross: the memory's keys and values (n_src, d), float32
    Vm: np.ndarray
    keep: np.ndarray       # (n_src,) uint8: 0 hides a memory key
    scratch: Scratch
    work: int              # the weights' elements: the step's thread count (silkattn._threads)
    prepared: dict = dataclasses.field(default_factory=dict)  # {backend: its form of the record}

    @property
    def d_ff(self):
        return self.down.k

    @property
    def gated(self):
        return self.gate != GATE_NONE

    @property
    def products(self):
        cross = (self.cross_q, self.cross_o) if self.has_cross else ()
        return self.qkv + (self.o,) + self.up + (self.down,) + cross

    def keys_rows(self, positions):  # -> (m, 3) int64: keys(p) for each of the positions (m,)
        p = np.asarray(positions, np.int64)
        if self.ring:
            return np.stack([p % self.capacity, np.zeros_like(p), np.minimum(p + 1, self.capacity)], 1)
        lo = np.zeros_like(p) if not self.window else np.maximum(0, p - self.window + 1)
        return np.stack([p, lo, p + 1 - lo], 1)

    def keys(self, pos):  # -> (the cache row of position pos, first row seen, rows seen)
        """Where the step at pos writes its K and V and which rows its query reads."""
        if self.ring:
            return pos % self.capacity, 0, min(pos + 1, self.capacity)
        lo = 0 if not self.window else max(0, pos - self.window + 1)
        return pos, lo, pos + 1 - lo
