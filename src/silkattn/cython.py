"""The Cython (OpenMP) backend: the reference's API on compiled, multithreaded kernels."""
from . import _api
from ._cy import softmax as _softmax

OPENMP = _softmax.OPENMP


def softmax(x, *, out=None):
    """softmax(x)_i = exp(x_i - max x) / sum_j exp(x_j - max x), over the last axis."""
    return _api.softmax(_softmax, x, out)
