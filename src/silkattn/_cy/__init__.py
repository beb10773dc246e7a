"""The compiled kernels (built from kernels/*.pyx).

Their OpenMP runtime is loaded with silkattn's wait policy, a short spin (silkattn._threads.
openmp_environment), unless the user chose one. libgomp reads the variables once, when it loads;
the environment is restored right after.
"""
from .._threads import openmp_defaults

with openmp_defaults():
    # (the first import loads libgomp, now)
    from . import attention, feed_forward, layer_norm, linear, linear_q, rms_norm, rope, silu_mul, softmax  # noqa: F401
