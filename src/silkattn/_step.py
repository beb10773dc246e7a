"""The layer-step record: one decoder layer's decoding step for one token, laid out once for a
fused kernel (Kernels.layer_step), so that both backends read the same named fields (kernels/
layer_step.h's sa_layer is its C twin, silkattn/numba/layer_step.py's Step its Numba one).

A step, in place on the residual row x (d,) at position pos (silkattn.ops.layer_step):

    attention sublayer   pre-norm: x += o(attn(rope(qkv(norm1(x)))));  post-norm (post_norm):
                         x = norm1(x + o(attn(rope(qkv(x))))). qkv's output is the h query heads,
                         then the h_kv key and value heads of dh each; this token's K and V go to row
                         pos of the cache, and each query head attends over rows 0 .. pos of its K/V
                         head (grouped-query: head j reads K/V head j // (h / h_kv)), scale
                         1 / sqrt(dh). Rotary (cos, sin given): the query and key heads turned by
                         row pos of the tables first (the half-split pairs of reference.rope).
    cross-attention      (has_cross) the same with cross_q, cross_o and norm_cross over the
                         memory's keys and values (heads side by side, no rotary, no cache write),
                         a key with keep == 0 hidden.
    feed-forward         relu: x += down(relu(up(norm2(x))));  swiglu: up's output is gate | up
                         (2 d_ff), x += down(silu(gate) up); post-norm as above.

Each product is a Product: out = in W (+ b), W float32 (k, n) (DENSE) or GGUF blocks of W^T as
silkattn.quant.QuantizedMatrix holds them; q8: every block product takes its input rounded to 8
bits a block (reference.round_q8). A norm is LayerNorm (g, b) or, b empty, RMSNorm (g), with eps.

silkattn._api.layer_step_record builds and checks a LayerStep (the only check: kernels trust its
fields); a backend keeps what it derives from the record (its own form of it) in `prepared`.
"""
import dataclasses

import numpy as np

DENSE = -1  # a Product's kind for float32 weights; else the block type's code (silkattn.quant.KINDS)


@dataclasses.dataclass(frozen=True, eq=False)
class Product:
    """out = in W (+ b) for an input of k values: W (k, n)."""

    w: np.ndarray   # DENSE: float32 (k, n) C-contiguous; blocks: uint8 (n, k / 32 * block bytes)
    kind: int       # DENSE or the block type's code
    k: int
    n: int
    b: np.ndarray   # (n,) float32, or empty: no bias


@dataclasses.dataclass(frozen=True, eq=False)
class Norm:
    """g (x - mean) / sqrt(var + eps) + b (LayerNorm), or with b empty g x / sqrt(mean(x^2) + eps)."""

    g: np.ndarray   # (d,) float32
    b: np.ndarray   # (d,) float32, or empty: RMSNorm


@dataclasses.dataclass(frozen=True, eq=False)
class Scratch:
    """The step's float32 buffers (shared by the records of one model's layers): qkv ((h + 2 h_kv)
    dh,), a (h dh,), hn (max(d, d_ff),), f (up's n,), scores (h, max(capacity, n_src))."""

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
    swiglu: bool           # the feed-forward's activation: silu(gate) up, else relu
    q8: bool               # block products round their input to 8 bits a block
    norm1: Norm
    qkv: Product           # d -> (h + 2 h_kv) dh
    o: Product             # h dh -> d
    norm2: Norm
    up: Product            # d -> d_ff (relu) or 2 d_ff (swiglu: gate | up)
    down: Product          # d_ff -> d
    K: np.ndarray          # the layer's cache, float32, C-contiguous: head g's row t at element
    V: np.ndarray          #   g head_stride + t row_stride of the flat K and V (Llama's (h_kv,
    head_stride: int       #   capacity, dh): capacity dh, dh; the listing's (capacity, d): dh, d)
    row_stride: int
    capacity: int          # positions the cache holds: 0 <= pos < capacity
    cos: np.ndarray        # (>= capacity, dh / 2) rotary tables (row p: position p), or empty
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
    def products(self):
        cross = (self.cross_q, self.cross_o) if self.has_cross else ()
        return (self.qkv, self.o, self.up, self.down) + cross
