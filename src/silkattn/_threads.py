"""The thread count every compiled kernel runs with (OMP_NUM_THREADS honoured at import), and the
policy that gives a call fewer threads when it is too small to share."""
import contextlib
import operator
import os


def _default():
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "").split(",")[0]))
    except ValueError:
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


_num_threads = _default()


# How long libgomp's idle threads spin before they sleep (spins of a pause loop; tens of
# microseconds), unless the user set GOMP_SPINCOUNT or OMP_WAIT_POLICY. Sleeping threads cost tens
# of microseconds to wake, which a decoding step's back-to-back small kernels would pay dozens of
# times; threads that spin long (libgomp's own default, or OMP_WAIT_POLICY=active) take the cores
# from numpy's OpenBLAS threads while a model runs its GEMMs. A short spin serves both
# (`python bench/idle_threads.py` measures the settings).
SPIN_COUNT = "3000"


def openmp_environment(env=os.environ):
    """The variables silkattn sets while an OpenMP runtime loads (libgomp reads them once, then):
    GOMP_SPINCOUNT=SPIN_COUNT, unless the user chose a wait policy."""
    if "GOMP_SPINCOUNT" in env or "OMP_WAIT_POLICY" in env:
        return {}
    return {"GOMP_SPINCOUNT": SPIN_COUNT}


def _spinning(env=os.environ):
    """True when libgomp's idle threads spin before they sleep: GOMP_SPINCOUNT > 0 (it overrides
    the policy, and silkattn sets a short one by default), or OMP_WAIT_POLICY=active without it.
    Then a second thread pays off for far smaller calls than when waking it means a futex wake-up."""
    env = {**env, **openmp_environment(env)}
    count = env.get("GOMP_SPINCOUNT", "").strip().lower()
    if count:
        if count == "infinity":
            return True
        try:
            return float(count.rstrip("kmgt") or 0) > 0
        except ValueError:
            pass
    return env.get("OMP_WAIT_POLICY", "").strip().lower() == "active"


SPINNING = _spinning()


# The thread policy: the least work a thread must get before a second one is woken, in elements
# of a row-wise op (softmax, layer_norm), in multiply-adds of attention (B Sq Sk (d_k + d_v)), of
# single-query attention (memory-bound: each multiply-add reads a fresh key or value, so a thread
# pays off sooner) and in elements of an elementwise op (bias_relu).
ROW_WORK = 16384
ATTENTION_WORK = 4e6
DECODE_WORK = 1e6
ELEMENTWISE_WORK = 65536
LINEAR_WORK = 262144  # weights a few-row x W reads per thread (memory-bound, as decode attention)


def threads_for(work, min_per_thread):
    """silkattn's thread count, or fewer when each thread would get less than `min_per_thread` of
    the `work`: waking a sleeping thread costs tens of microseconds. When idle threads spin a
    while (SPINNING: silkattn's default), a quarter of that work suffices."""
    if SPINNING:
        min_per_thread /= 4
    return max(1, min(_num_threads, int(work // min_per_thread)))


def set_num_threads(n):
    """Set how many threads every silkattn call runs on, on every backend: its kernels' OpenMP or
    Numba team, and numpy's BLAS for the GEMMs inside silkattn's calls (silkattn._blas; numpy's own
    setting is left as it was for the user's code outside them); returns the previous value."""
    global _num_threads
    if isinstance(n, bool):
        raise TypeError("n must be an int (a number of threads), got bool")
    n = operator.index(n)
    if n < 1:
        raise ValueError(f"n must be a positive number of threads, got {n}")
    previous, _num_threads = _num_threads, n
    return previous


def get_num_threads():
    """The number of threads silkattn's calls run on (set_num_threads)."""
    return _num_threads


@contextlib.contextmanager
def openmp_defaults():
    """The block loads an OpenMP runtime with silkattn's defaults (openmp_environment)."""
    with contextlib.ExitStack() as stack:
        for name, value in openmp_environment().items():
            stack.enter_context(env_default(name, value))
        yield


@contextlib.contextmanager
def env_default(name, value):
    """os.environ[name] = value for the block, unless the user set it; yields whether it was set.
    For a runtime that reads its variable once, as it loads or starts threads: the variable is
    gone again afterwards, so child processes do not inherit silkattn's choice."""
    ours = name not in os.environ
    if ours:
        os.environ[name] = value
    try:
        yield ours
    finally:
        if ours:
            os.environ.pop(name, None)
