"""Row softmax: out[i, :] = exp(x[i, :] - max x[i, :]) / sum_j exp(x[i, j] - max x[i, :])."""
from cython cimport floating
from cython.parallel cimport prange
from libc.math cimport exp

include "openmp.pxi"


def softmax(const floating[:, ::1] x, floating[:, ::1] out, int num_threads):
    """x, out: (rows, n) C-contiguous, same dtype; one thread per block of rows."""
    cdef Py_ssize_t i, j, n = x.shape[1]
    cdef floating m, s
    with nogil:
        for i in prange(x.shape[0], num_threads=num_threads, schedule="static"):
            m = x[i, 0]
            for j in range(1, n):
                if x[i, j] > m:
                    m = x[i, j]
            s = 0
            for j in range(n):
                out[i, j] = exp(x[i, j] - m)
                s = s + out[i, j]
            for j in range(n):
                out[i, j] = out[i, j] / s
