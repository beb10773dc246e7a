"""The feed-forward's elementwise step, fused: h = max(h + b, 0) in place, one pass over h."""
from cython cimport floating
from cython.parallel cimport prange

include "common.pxi"


def bias_relu(floating[:, ::1] h, const floating[::1] b, int num_threads):
    """h: (rows, n) C-contiguous, b: (n,). NaN stays NaN, as with np.maximum."""
    cdef Py_ssize_t i, j, n = h.shape[1]
    cdef floating v
    with nogil:
        for i in prange(h.shape[0], num_threads=num_threads, schedule="static"):
            for j in range(n):
                v = h[i, j] + b[j]
                h[i, j] = 0 if v < 0 else v
