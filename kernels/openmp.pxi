# Included by every kernel module: whether this build has OpenMP (a serial build still works).
cdef extern from *:
    """
    #ifdef _OPENMP
    #define SILKATTN_OPENMP 1
    #else
    #define SILKATTN_OPENMP 0
    #endif
    """
    int SILKATTN_OPENMP

OPENMP = bool(SILKATTN_OPENMP)
