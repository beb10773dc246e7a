"""Make numpy's OpenBLAS worker threads go to sleep soon after a GEMM.

OpenBLAS (pthreads build, numpy's wheels) keeps each idle worker spinning for 2^28 cycles (about
0.1 s) after every call. The model alternates numpy GEMMs with silkattn's kernels, so each kernel's
second thread shared a core with a spinning worker (`python bench/idle_threads.py --cases model`
measures both settings; docs/switches.md quotes the figures). Back-to-back GEMMs are unaffected; a small
GEMM issued after an idle gap of more than about a millisecond pays the wake-up of the worker.

OpenBLAS reads OPENBLAS_THREAD_TIMEOUT (log2 of the cycles) when it starts its workers, which
happens when numpy is imported. So, unless the user set it (or GOTO_THREAD_TIMEOUT), silkattn sets
it once at import, has OpenBLAS re-read its environment and stops the workers; the next threaded
GEMM starts them again with the new timeout. Stopping workers is safe only while no other thread can
be inside BLAS, so it is skipped when the process already runs other Python threads.
"""
import ctypes
import os
import threading

from ._threads import env_default

TIMEOUT = 18  # 2^18 cycles: the worker stays awake about a millisecond after a GEMM


def _openblas_libraries():
    """Loaded shared libraries whose name says OpenBLAS (numpy's, scipy's, a system one)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.rsplit("/", 1)[-1].lower()}
    except OSError:  # not Linux: numpy uses Accelerate or a BLAS we do not touch
        return []
    return sorted(p for p in paths if ".so" in p)


def quiet_idle_workers(timeout=TIMEOUT):
    """Apply `timeout` to every loaded OpenBLAS; return the libraries changed (empty when the user
    set the variable, other threads run, or no OpenBLAS with the needed entry points is loaded)."""
    if "GOTO_THREAD_TIMEOUT" in os.environ or threading.active_count() > 1:
        return []
    changed = []
    with env_default("OPENBLAS_THREAD_TIMEOUT", str(timeout)) as ours:
        for path in _openblas_libraries() if ours else ():
            try:
                lib = ctypes.CDLL(path)
                read_env, shutdown = lib.openblas_read_env, lib.blas_thread_shutdown_
            except (OSError, AttributeError):
                continue
            read_env()  # stores the timeout; the workers read it when they start
            shutdown()  # joins the idle workers; the next threaded call restarts them
            changed.append(path)
    return changed


applied = quiet_idle_workers()
