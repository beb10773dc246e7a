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
    int sa_cpu_has_avx512()
    void *sa_alloc(size_t bytes)

OPENMP = bool(SILKATTN_OPENMP)
ISA_NAMES = ("generic", "avx2", "avx512", "avx2x64")  # the copies of instances.h, by their number


def _choose_isa():
    """The copy the CPU runs best (avx512, else avx2 + fma, else generic), or the one SILKATTN_ISA
    names: generic, avx2, avx512, or avx2x64 (the avx512 copy's 64-byte code on AVX2, for tests)."""
    wanted = os.environ.get("SILKATTN_ISA", "auto").strip().lower() or "auto"
    if wanted not in ("auto",) + ISA_NAMES:
        raise ImportError(f"SILKATTN_ISA must be auto, {', '.join(ISA_NAMES)}, got {wanted!r}")
    if wanted == "auto":
        return 2 if sa_cpu_has_avx512() else 1 if sa_cpu_has_avx2() else 0
    needs = {"avx2": sa_cpu_has_avx2(), "avx2x64": sa_cpu_has_avx2(), "avx512": sa_cpu_has_avx512()}
    if not needs.get(wanted, True):
        raise ImportError(f"SILKATTN_ISA={wanted}, but this CPU lacks "
                          f"{'AVX-512 (F, DQ, VL, BW)' if wanted == 'avx512' else 'AVX2, FMA or F16C'}")
    return ISA_NAMES.index(wanted)


cdef int ISA = _choose_isa()
ISA_NAME = ISA_NAMES[ISA]
