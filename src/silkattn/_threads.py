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


def _spinning(env=os.environ):
    """True when the user made libgomp's idle threads spin: GOMP_SPINCOUNT > 0 (it overrides the
    policy), or OMP_WAIT_POLICY=active without it. silkattn's default is passive (silkattn/_cy):
    sleeping threads leave the cores to numpy's GEMMs in a model, but waking one costs tens of
    microseconds, so small calls stay on one thread. With spinning threads a second thread pays
    off for far smaller calls (`python bench/idle_threads.py --cases small`)."""
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


def threads_for(work, min_per_thread):
    """silkattn's thread count, or fewer when each thread would get less than `min_per_thread` of
    the `work`: waking a sleeping thread costs tens of microseconds (the default, passive wait
    policy). When the user made idle threads spin (SPINNING), a quarter of that work suffices."""
    if SPINNING:
        min_per_thread /= 4
    return max(1, min(_num_threads, int(work // min_per_thread)))


def set_num_threads(n):
    """Set how many threads silkattn's kernels use (all backends); returns the previous value."""
    global _num_threads
    n = operator.index(n)
    if n < 1:
        raise ValueError(f"n must be a positive number of threads, got {n}")
    previous, _num_threads = _num_threads, n
    return previous


def get_num_threads():
    """The number of threads silkattn's kernels use."""
    return _num_threads


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
