"""The "numpy" backend: a Kernels record with no kernels, so every op runs its NumPy fallback
(silkattn._api), which is the reference itself behind the same checks as the compiled backends:
switching backends never changes which inputs are accepted."""
from . import ops
from ._backends import Kernels

KERNELS = Kernels("numpy", softmax=None, layer_norm=None, attention=None)

globals().update(ops.bind(KERNELS))
__all__ = ["KERNELS"] + list(ops.OPS)
