"""The compiled kernels (built from kernels/*.pyx).

Their OpenMP runtime is loaded with OMP_WAIT_POLICY=passive unless the user set the variable:
idle threads then sleep instead of spinning. The model alternates these kernels with numpy's
OpenBLAS GEMMs, whose threads otherwise fight spinning OpenMP threads for the cores (README,
"Build and run-time switches", has the figures and `python bench/idle_threads.py` measures them).
libgomp reads the variable once, when it loads; the environment is restored right after.
"""
from .._threads import env_default

with env_default("OMP_WAIT_POLICY", "passive"):
    from . import attention, feed_forward, layer_norm, softmax  # noqa: F401  (loads libgomp now)
