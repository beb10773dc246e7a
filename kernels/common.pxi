# Included by every kernel module: build facts (OpenMP) and the run-time choice of instruction set.
import os

cdef extern from *:
    """
    #ifdef _OPENMP
    #define SILKATTN_OPENMP 1
    #else
    #define SILKATTN_OPENMP 0
    #endif
    """
    int SILKATTN_OPENMP

cdef extern from "isa.h" nogil:
    int sa_cpu_has_avx2()
    void *sa_alloc(size_t bytes)

OPENMP = bool(SILKATTN_OPENMP)


def _choose_isa():
    """1 (avx2 + fma) or 0 (generic): the best the CPU runs, or SILKATTN_ISA=generic|avx2 to force one."""
    wanted = os.environ.get("SILKATTN_ISA", "auto").strip().lower() or "auto"
    if wanted not in ("auto", "avx2", "generic"):
        raise ImportError(f"SILKATTN_ISA must be auto, avx2 or generic, got {wanted!r}")
    if wanted == "avx2" and not sa_cpu_has_avx2():
        raise ImportError("SILKATTN_ISA=avx2, but this CPU lacks AVX2 or FMA")
    return 0 if wanted == "generic" else sa_cpu_has_avx2()


cdef int ISA = _choose_isa()
ISA_NAME = ("generic", "avx2")[ISA]
