"""The Numba backend: @njit(parallel=True) kernels, for users who want to read or re-tune a kernel
without a C toolchain.

Exports its Kernels record and the ops of silkattn.ops run on it alone: silkattn.numba.attention,
softmax, layer_norm and the rest of silkattn.ops (add_layer_norm runs its NumPy fallback here). The
kernels are in softmax.py, layer_norm.py, attention.py, linear.py, linear_q.py, matmul_int8.py,
feed_forward.py, rms_norm.py, rope.py, silu_mul.py and layer_step.py, their SIMD layer in _simd.py,
how they are compiled and cached in _jit.py, the kernel-contract entry points (packing, scheduling,
workspace) in driver.py.
"""
from .. import ops
from .._backends import Kernels, TileGeometry
from .._threads import openmp_defaults


def _start_threads():
    """Start Numba's thread pool now, with silkattn's wait policy (a short spin, unless the user
    chose one: silkattn._threads.openmp_environment). libgomp reads it once, at load."""
    with openmp_defaults():
        try:
            from numba.np.ufunc import parallel
            parallel._launch_threads()
        except (ImportError, AttributeError):  # a Numba without this hook: threads start on first use
            pass


_start_threads()

from . import _simd, driver  # noqa: E402  (after the thread pool has started)
from .attention import BQ, R  # noqa: E402

OPENMP = True  # Numba's own threading layer (omp, tbb or workqueue) is always there
KERNELS = Kernels("numba", softmax=driver.softmax, layer_norm=driver.layer_norm, attention=driver.attention,
                  attention_backward=driver.attention_backward, softmax_backward=driver.softmax_backward,
                  layer_norm_backward=driver.layer_norm_backward, rms_norm_backward=driver.rms_norm_backward,
                  gelu_backward=driver.gelu_backward,
                  attention_tiles=TileGeometry(BQ, BQ, R), linear=driver.linear, linear_q=driver.linear_q,
                  linear_qx=driver.linear_qx,
                  bias_relu=driver.bias_relu, bias_gelu=driver.bias_gelu, rms_norm=driver.rms_norm,
                  add_rms_norm=driver.add_rms_norm,
                  rope=driver.rope, silu_mul=driver.silu_mul, gelu_tanh_mul=driver.gelu_tanh_mul,
                  dequantize=driver.dequantize, gemm=driver.gemm,
                  gemm_q=driver.gemm_q, matmul_int8=driver.matmul_int8,
                  layer_step=driver.layer_step, layer_step_rows=driver.layer_step_rows,
                  isa=f"{_simd.VBYTES * 8}-bit (llvm)")

globals().update(ops.bind(KERNELS))
__all__ = ["KERNELS", "OPENMP"] + list(ops.OPS)
