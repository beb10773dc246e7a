"""The Numba backend: @njit(parallel=True) kernels, for users who want to read or re-tune a kernel
without a C toolchain.

Exports its Kernels record and the ops of silkattn.ops run on it alone: silkattn.numba.attention,
softmax, layer_norm (the fused ops run their NumPy fallback here). The kernels are in softmax.py,
layer_norm.py and attention.py, their SIMD layer in _simd.py, the kernel-contract entry points
(packing, scheduling, workspace) in driver.py.
"""
from .. import ops
from .._backends import Kernels
from .._threads import env_default


def _start_threads_waiting_passively():
    """Start Numba's thread pool now, with OMP_WAIT_POLICY=passive unless the user set it: its
    OpenMP threads then sleep between kernels instead of spinning against numpy's OpenBLAS
    threads (see silkattn/_cy/__init__.py). libgomp reads it once, at load."""
    with env_default("OMP_WAIT_POLICY", "passive"):
        try:
            from numba.np.ufunc import parallel
            parallel._launch_threads()
        except (ImportError, AttributeError):  # a Numba without this hook: threads start on first use
            pass


_start_threads_waiting_passively()

from . import driver  # noqa: E402  (after the thread pool has started)

OPENMP = True  # Numba's own threading layer (omp, tbb or workqueue) is always there
KERNELS = Kernels("numba", softmax=driver.softmax, layer_norm=driver.layer_norm, attention=driver.attention,
                  attention_decode=driver.attention_decode, isa="avx2 (llvm)")

globals().update(ops.bind(KERNELS))
__all__ = ["KERNELS", "OPENMP", *ops.OPS]
