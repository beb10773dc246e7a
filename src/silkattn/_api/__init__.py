"""Every op's bookkeeping, shared by all backends, a module a family of ops (common, norm_ops,
product_ops, attention_ops, row_ops, step_ops): argument checks, dtypes, the attention operands'
layout, out allocation, thread counts, and the NumPy fallback that runs when a backend's Kernels
record (silkattn._backends) has no kernel for the op.

Each op takes the record first, then the public arguments (silkattn.ops documents them), so kernels
only ever see float32/float64 buffers with unit-stride rows, explicit offsets and strides, and a
result array they may write. The kernel contract (the same for every backend):

    softmax(x, out, num_threads)                         x, out: (rows, n) C-contiguous
    layer_norm(x, g, b, eps, out, num_threads)           x, out: (rows, n); g, b: (n,)
    attention(plan, num_threads)                         plan: silkattn._plan.Plan, built here once
        for the call (attention and attention_varlen alike): each operand as a flat view with its
        row stride, the items (batch item x query head, or packed sequence: offsets, query rows,
        keys, position of query 0, K/V unit, ALiBi slope), the scores' scale, softcap and the
        visible window (causal folded in), and the work: "tiles" tasks (item, first query, rows)
        in the order to run, or for a few rows per K/V unit the "rows" groups and the key chunks
        the threads share. Kernels decide no layout and no order: silkattn._plan's docstring is
        the contract, and the kernel's own tile geometry (Kernels.attention_tiles) is the only
        thing the plan asks of it.
    attention_backward(plan, dout, D, lse, fix, items, first, dq, dk, dv, num_threads)
                                                         the forward's plan over copies giving each item
                                                         its own Q rows and each K/V unit its own rows;
                                                         dout (rows x d_v), D, lse by output row; fix: 2
                                                         a row, the kernel's scratch; items sorted by unit
                                                         (unit u's: items[first[u]:first[u + 1]]); dq zeroed
    linear(x, w, b, out, transposed, has_bias, num_threads)
                                                         out = x w (+ b), x: (m, k) with m <= LINEAR_ROWS,
                                                         w: (k, n), or (n, k) if transposed (out = x w^T)
    linear_q(x, blocks, kind, b, out, has_bias, q8, num_threads)
                                                         linear's out = x W (+ b) for W a silkattn.quant.
                                                         QuantizedMatrix: float32 x: (m, k), m <= LINEAR_ROWS
                                                         (q8: any m, taken 8 rows at a time: Q8_ROWS);
                                                         blocks: uint8 (n, k / 32 * block bytes), the GGUF
                                                         blocks of W^T (reference.dequantize), kind their
                                                         code (0 Q8_0, 1 Q4_0, 2 Q4_1: quant.KINDS); out:
                                                         (m, n) float32; b: (n,) float32; q8: x is taken as
                                                         reference.round_q8(x) (W.activations "int8")
    dequantize(blocks, kind, j0, out, num_threads)      out (rows, k) float32 = reference.dequantize of
                                                         blocks[j0 : j0 + rows] (blocks as linear_q's)
    gemm(x, w, out, transposed, sgemm, ilp64, num_threads)
                                                         out = x w for many rows of x (w (k, n), or (n, k)
                                                         if transposed), float32: each thread one call of
                                                         the BLAS's sgemm (address sgemm, silkattn._blas;
                                                         the library held at one thread) on its panel of
                                                         out's columns
    gemm_q(x, blocks, kind, out, sgemm, ilp64, num_threads)
                                                         the same for W as blocks (linear_q's), a panel of
                                                         W's rows dequantized a thread at a time first
    gemm_q8(x, blocks, kind, out, num_threads)           out = round_q8(x, Q8_BLOCK) W for many rows, as
                                                         integer products; returns False (nothing done)
                                                         where the CPU cannot (optional: AVX-512 VNNI)
    matmul_int8(A, B, out, num_threads)                 out (m, n) int32 = A (m, k) B (k, n) for int8 A, B,
                                                         exact: 1 <= k <= INT8_MAX_K; all C-contiguous
    layer_step(step, x, pos, num_threads)                one token through one decoder layer, in place on
                                                         its residual row x (d,) float32 at position pos
                                                         < step.capacity: step is a silkattn._step.LayerStep
                                                         (built and checked by layer_step_record: the
                                                         kernel trusts its fields), this token's K and V
                                                         written at row pos of its cache
    layer_step_rows(steps, X, ats, Ks, Vs, coss, sins, num_threads)
                                                         the m rows of X (m, d) float32 in place through
                                                         the Llama-family records steps in turn, one call
                                                         for all: for layer l, row r over the cache of
                                                         the flat pools Ks[l], Vs[l] from ats[l][r, 3]
                                                         (m, 4 int64: cache row, first key, keys, offset),
                                                         coss[l], sins[l] (m, dh / 2) its rotary rows
                                                         (empty: none); optional
    bias_relu(h, b, num_threads)                         h: (rows, n) C-contiguous, in place; b: (n,)
    bias_gelu(h, b, num_threads)                         the same, h = gelu(h + b)
    add_layer_norm(x, r, g, b, eps, s, out, num_threads) s = x + r, out = layer_norm(s); all (rows, n)
    rms_norm(x, g, eps, out, num_threads)                x, out: (rows, n) C-contiguous; g: (n,)
    add_rms_norm(x, r, g, eps, s, out, num_threads)      s = x + r, out = rms_norm(s); all (rows, n)
    rope(x, xo, out, oo, cos, sin, positions, num_threads)
                                                         rows as offsets (see _row_layout): row r is
                                                         x[xo[r]:][:d] -> out[oo[r]:][:d], out may be x
                                                         (in place); cos, sin: (P, d / 2) tables, row r
                                                         at position positions[r % len(positions)] < P
    silu_mul(g, go, u, uo, out, oo, n, num_threads)      out = silu(g) u over rows of n laid out as
                                                         rope's; out may be g or u (in place)

Attention kernels skip keys (tiles outside every row's window, fully masked tiles) that the
reference weighs exp(-1e9 - max): exactly 0 unless the row's max is near -1e9, and such rows are
recomputed exactly (the margin is named once per backend: kernels/attention.h, silkattn/numba/attention.py).
"""
from .._threads import ROW_WORK, threads_for
from .attention_ops import (
                            _layout,
                            attention,
                            attention_backward,
                            attention_paged,
                            attention_varlen,
                            prepare_attention,
)
from .common import FLOATS, _along_last_axis, _last_axis, _rows, as_float_array, check_out
from .norm_ops import add_layer_norm, add_rms_norm, layer_norm, rms_norm, softmax
from .product_ops import (
                            FEW_ROWS,
                            INT8_MAX_K,
                            LINEAR_ROWS,
                            Q8_ROWS,
                            _row_blocks,
                            bias_gelu,
                            bias_relu,
                            few_rows,
                            linear,
                            matmul_int8,
)
from .row_ops import _row_layout, gate_mul, gelu_tanh_mul, rope, silu_mul
from .step_ops import _layer_step_ops, layer_step, layer_step_record, layer_step_rows

__all__ = ["FEW_ROWS", "FLOATS", "INT8_MAX_K", "LINEAR_ROWS", "Q8_ROWS", "ROW_WORK", "_along_last_axis",
           "_last_axis", "_layer_step_ops", "_layout", "_row_blocks", "_row_layout", "_rows",
           "add_layer_norm", "add_rms_norm", "as_float_array", "attention", "attention_backward",
           "attention_paged", "attention_varlen", "bias_gelu", "bias_relu", "check_out", "few_rows",
           "gate_mul", "gelu_tanh_mul", "layer_norm", "layer_step", "layer_step_record", "layer_step_rows",
           "linear", "matmul_int8", "prepare_attention", "rms_norm", "rope", "silu_mul", "softmax",
           "threads_for"]
