"""The Cython (OpenMP) backend: compiled, multithreaded kernels (kernels/ -> silkattn._cy).

Exports its Kernels record and the ops of silkattn.ops run on it alone: silkattn.cython.attention,
softmax, layer_norm, attention_varlen, attention_paged, linear, bias_relu, bias_gelu, add_layer_norm,
rms_norm, add_rms_norm, rope, silu_mul, matmul_int8.
"""
from . import ops
from ._backends import Kernels, TileGeometry
from ._cy import attention as _attention
from ._cy import attention_backward as _attention_backward
from ._cy import feed_forward as _feed_forward
from ._cy import layer_norm as _layer_norm
from ._cy import layer_step as _layer_step
from ._cy import linear as _linear
from ._cy import linear_q as _linear_q
from ._cy import matmul_int8 as _matmul_int8
from ._cy import rms_norm as _rms_norm
from ._cy import rope as _rope
from ._cy import silu_mul as _silu_mul
from ._cy import softmax as _softmax

OPENMP = _softmax.OPENMP
ISA = _softmax.ISA_NAME  # the kernel copy that runs: "avx512", "avx2", "generic" (or "avx2x64", forced)

KERNELS = Kernels("cython", softmax=_softmax.softmax, layer_norm=_layer_norm.layer_norm,
                  attention=_attention.attention, attention_tiles=TileGeometry(**_attention.TILES),
                  attention_backward=_attention_backward.attention_backward,
                  softmax_backward=_softmax.softmax_backward,
                  layer_norm_backward=_layer_norm.layer_norm_backward,
                  rms_norm_backward=_rms_norm.rms_norm_backward, gelu_backward=_feed_forward.gelu_backward,
                  linear=_linear.linear, linear_q=_linear_q.linear_q,
                  linear_qx=_linear_q.linear_qx, bias_relu=_feed_forward.bias_relu,
                  bias_gelu=_feed_forward.bias_gelu,
                  add_layer_norm=_layer_norm.add_layer_norm, rms_norm=_rms_norm.rms_norm,
                  add_rms_norm=_rms_norm.add_rms_norm, rope=_rope.rope, silu_mul=_silu_mul.silu_mul,
                  gelu_tanh_mul=_silu_mul.gelu_tanh_mul,
                  dequantize=_linear_q.dequantize, gemm=_linear.gemm, gemm_q=_linear_q.gemm_q,
                  gemm_q8=_linear_q.gemm_q8, matmul_int8=_matmul_int8.matmul_int8,
                  pack_rows16=_linear_q.pack_rows16 if _linear_q.rows16_usable() else None,
                  layer_step=_layer_step.layer_step, layer_step_rows=_layer_step.layer_step_rows, isa=ISA,
                  openmp=OPENMP)

globals().update(ops.bind(KERNELS))
__all__ = ["KERNELS", "ISA", "OPENMP"] + list(ops.OPS)
