"""Concurrency, scale and resources: Python threads calling kernels at once, thread-count
independence, a single head with Sq * Sk > 2^31, MemoryError instead of a crash, no leaks."""
import threading

import numpy as np
import pytest

import silkattn
from silkattn import reference as ref


def test_python_threads_at_once_match_serial_calls(backend, rng):
    problems = [tuple(rng.standard_normal((2, 150 + 7 * i, 32)).astype(np.float32) for _ in range(3))
                for i in range(8)]
    serial = [backend.attention(*p, causal=bool(i % 2)) for i, p in enumerate(problems)]
    xs = [p[0] for p in problems]
    serial_sm = [backend.softmax(x) for x in xs]
    results, errors = {}, []

    def work(i):
        try:
            for _ in range(5):
                results[i] = (backend.attention(*problems[i], causal=bool(i % 2)), backend.softmax(xs[i]))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i in range(8):
        np.testing.assert_array_equal(results[i][0], serial[i])
        np.testing.assert_array_equal(results[i][1], serial_sm[i])


@pytest.mark.parametrize("op", ["softmax", "layer_norm"])
def test_rows_are_the_same_on_any_thread_count(backend, rng, op):
    x = rng.standard_normal((301, 257)).astype(np.float32)
    g, b = rng.standard_normal(257).astype(np.float32), rng.standard_normal(257).astype(np.float32)
    call = (lambda: backend.softmax(x)) if op == "softmax" else (lambda: backend.layer_norm(x, g, b))
    results = []
    for n in (1, 2, 3):
        previous = silkattn.set_num_threads(n)
        try:
            results.append(call())
        finally:
            silkattn.set_num_threads(previous)
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


def test_more_than_2_to_the_31_scores_in_one_head(backend):
    """Sq * Sk = 50000 * 45000 > 2^31, with an explicit (Sq, Sk) mask: 64-bit indexing throughout."""
    Sq, Sk, dk = 50000, 45000, 4
    rng = np.random.default_rng(7)
    Q, K, V = (rng.standard_normal((S, dk)).astype(np.float32) for S in (Sq, Sk, Sk))
    mask = np.ones((Sq, Sk), bool)
    rows = np.array([0, 1, 31234, Sq - 2, Sq - 1])
    mask[rows[-1], :Sk - 3] = False  # the last row sees only the last 3 keys: offsets past 2^31
    mask[rows[-2]] = False           # a fully masked row near the end: mean(V)
    out = backend.attention(Q, K, V, mask)
    np.testing.assert_allclose(out[rows], ref.attention(Q[rows].astype(np.float64), K.astype(np.float64),
                                                        V.astype(np.float64), mask[rows]),
                               rtol=1e-4, atol=1e-5)


def test_impossible_allocation_is_a_memory_error(backend):
    Q = np.broadcast_to(np.ones((1, 1, 8), np.float32), (2 ** 40, 1, 8))  # a view: no memory yet
    K = np.ones((1, 3, 8), np.float32)
    with pytest.raises(MemoryError):
        backend.attention(Q, K, K)


def _rss_kib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


@pytest.mark.parametrize("op", ["attention", "softmax", "layer_norm"])
def test_no_leak_over_20000_calls(backend, rng, op):
    Q, K, V = (rng.standard_normal((2, 24, 16)).astype(np.float32) for _ in range(3))
    mask = rng.random((24, 24)) < 0.7
    g, b = np.ones(16, np.float32), np.zeros(16, np.float32)
    call = {"attention": lambda: backend.attention(Q, K, V, mask, causal=True),
            "softmax": lambda: backend.softmax(Q), "layer_norm": lambda: backend.layer_norm(Q, g, b)}[op]
    for _ in range(2000):  # warm up allocator pools and caches
        call()
    before = _rss_kib()
    for _ in range(20000):
        call()
    grown = _rss_kib() - before
    assert grown < 2048, f"resident memory grew by {grown} KiB over 20000 calls"


OPENBLAS_CHILD = """
import ctypes, json, os
import numpy as np
import silkattn
a = np.arange(256 * 256, dtype=np.float64).reshape(256, 256) % 7
ok = bool(np.array_equal(a @ a, np.einsum("ij,jk->ik", a, a)))  # the restarted workers compute right
libs = silkattn._openblas.applied or silkattn._openblas._openblas_libraries()
timeout = ctypes.CDLL(libs[0]).openblas_thread_timeout() if libs else None
print(json.dumps(dict(applied=silkattn._openblas.applied, timeout=timeout, ok=ok,
                      left=os.environ.get("OPENBLAS_THREAD_TIMEOUT"))))
"""


@pytest.mark.parametrize("user", [None, "28"])
def test_openblas_idle_workers_sleep_unless_the_user_chose(user):
    """silkattn shortens numpy's OpenBLAS worker spin (silkattn/_openblas.py) only when the user
    did not set OPENBLAS_THREAD_TIMEOUT, and GEMMs stay correct after the workers restart."""
    import json
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if not k.endswith("THREAD_TIMEOUT")}
    env.update(OPENBLAS_NUM_THREADS="2", **({"OPENBLAS_THREAD_TIMEOUT": user} if user else {}))
    out = json.loads(subprocess.run([sys.executable, "-c", OPENBLAS_CHILD], env=env, capture_output=True,
                                    text=True, check=True).stdout.splitlines()[-1])
    assert out["ok"]
    assert out["left"] == user  # silkattn's setting does not leak into child processes
    if out["timeout"] is None:
        pytest.skip("numpy's BLAS here is not an OpenBLAS with the entry points silkattn uses")
    if user:
        assert out["applied"] == [] and out["timeout"] == 28
    else:
        assert out["applied"] and out["timeout"] == silkattn._openblas.TIMEOUT


@pytest.mark.parametrize("env, spinning", [
    ({}, True), ({"OMP_WAIT_POLICY": "passive"}, False), ({"OMP_WAIT_POLICY": "Active"}, True),
    ({"GOMP_SPINCOUNT": "10000"}, True), ({"GOMP_SPINCOUNT": "10k", "OMP_WAIT_POLICY": "passive"}, True),
    ({"GOMP_SPINCOUNT": "0", "OMP_WAIT_POLICY": "active"}, False), ({"GOMP_SPINCOUNT": "infinity"}, True)])
def test_spinning_threads_read_like_libgomp_reads_them(env, spinning):
    """GOMP_SPINCOUNT overrides OMP_WAIT_POLICY (libgomp's rule); silkattn's short spin applies when the
    user chose neither; small calls get two threads sooner when idle threads spin."""
    from silkattn._threads import SPIN_COUNT, _spinning, openmp_environment
    assert _spinning(env) is spinning
    chose = "GOMP_SPINCOUNT" in env or "OMP_WAIT_POLICY" in env
    assert openmp_environment(env) == ({} if chose else {"GOMP_SPINCOUNT": SPIN_COUNT})


def test_openmp_runtime_loads_with_the_short_spin_and_leaves_no_trace():
    """libgomp reads GOMP_SPINCOUNT as it loads (importing the kernels); the variable is gone again
    afterwards, so child processes start with the user's environment."""
    import json
    import os
    import subprocess
    import sys
    code = ("import ctypes, json, os, silkattn.cython, silkattn.numba; "
            "print(json.dumps(os.environ.get('GOMP_SPINCOUNT')))")
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.splitlines()[-1]) is None
