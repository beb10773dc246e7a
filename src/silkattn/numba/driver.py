"""The Numba backend's kernel-contract entry points (see silkattn._api): each sets Numba's thread
count from the call's and runs the compiled kernels in softmax.py, layer_norm.py and attention.py.
Attention's entry point also packs K and V, deals the tiles out to the threads, and keeps the
per-thread workspace between calls."""
import functools
import math
import threading

import numba
import numpy as np

from . import attention as _attention
from . import layer_norm as _layer_norm
from . import linear as _linear
from . import softmax as _softmax
from ._simd import VBYTES


def _use_threads(num_threads):
    """Numba's thread count for the next kernel: the call's, capped at the threads Numba started."""
    n = max(1, min(int(num_threads), numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(n)
    return n


def softmax(x, out, num_threads):
    _softmax.softmax_rows(x, out, _use_threads(num_threads))


def layer_norm(x, g, b, eps, out, num_threads):
    _layer_norm.layer_norm_rows(x, g, b, eps, out, _use_threads(num_threads))


def attention(q, k, v, mask, out, offsets, strides, Sq, Sk, d_k, d_v, causal, q_offset, masked, num_threads):
    nthreads = _use_threads(num_threads)
    lanes2 = 2 * VBYTES // out.itemsize  # the P V micro-kernel works on two registers of d_v
    dvp = -(-d_v // lanes2) * lanes2
    # K and V are packed once per distinct (K, V) batch item (they are often broadcast)
    kv, unit = _units(offsets[:, 1:3].tobytes())
    nkt = -(-Sk // _attention.BK)
    kp = _workspace("kp", (len(kv), nkt, d_k, _attention.BK), out.dtype)
    vp = _workspace("vp", (len(kv), nkt * _attention.BK, dvp), out.dtype)
    work = _workspace("work", (nthreads, _attention.scratch_layout(d_k, dvp, Sk)[-1]), out.dtype)
    _attention.pack_kv(k, v, np.ascontiguousarray(kv[:, 0]), np.ascontiguousarray(kv[:, 1]),
                       int(strides[1]), int(strides[2]), Sk, d_k, d_v, dvp, kp, vp)
    sched, starts = _schedule(len(offsets), Sq, Sk, bool(causal), int(q_offset), nthreads)
    qoff, koff, voff, moff = (np.ascontiguousarray(offsets[:, i]) for i in range(4))
    qs, ks, vs, ms = (int(s) for s in strides)
    _attention.attention_tiles(q, k, v, kp, vp, mask, out, qoff, koff, voff, moff, unit, qs, ks, vs, ms, Sq,
                               Sk, d_k, d_v, bool(causal), int(q_offset), bool(masked), sched, starts, work)


def attention_decode(q, k, v, mask, out, offsets, strides, Sq, Sk, d_k, d_v, causal, q_offset, masked,
                     num_threads):
    """The kernel contract for one query row (Sq == 1): each item's keys cut into chunks the threads
    share, partial results merged (see attention.decode_rows)."""
    if Sq != 1:
        raise ValueError("attention_decode takes one query row (Sq == 1)")
    nthreads = _use_threads(num_threads)
    B, nk = len(offsets), min(Sk, q_offset + 1) if causal else Sk  # keys past the query weigh 0
    nsplit = -(-nk // _attention.DEC_CHUNK)
    parts = _workspace("parts", (B * nsplit, d_v + 2), out.dtype)
    work = _workspace("decode", (nthreads, _attention.decode_scratch(d_k)), out.dtype)
    qoff, koff, voff, moff = (np.ascontiguousarray(offsets[:, i]) for i in range(4))
    _attention.decode_rows(q, k, v, mask, out, qoff, koff, voff, moff, int(strides[1]), int(strides[2]), Sk,
                           nk, d_k, d_v, int(q_offset), bool(causal), bool(masked), nsplit,
                           _attention.DEC_CHUNK, parts, work)


def linear(x, w, b, out, transposed, has_bias, num_threads):
    """The kernel contract's x W (+ b) for a few rows of x (see linear.py)."""
    nthreads = _use_threads(num_threads)
    if transposed:
        _linear.linear_dots(x, w, out)
    else:
        T = max(1, min(nthreads, w.shape[0] // 64))  # a thread's share of w: at least 64 rows
        partial = _workspace("linear", (T,) + out.shape, out.dtype)
        _linear.linear_rows(x, w, partial)
        np.sum(partial, axis=0, out=out)
    if has_bias:
        out += b


_local = threading.local()
_KEEP = 1 << 25  # workspace bytes kept between calls, per Python thread and buffer


def _workspace(name, shape, dtype):
    """An uninitialised array for one call, reused from the previous call of this Python thread
    when big enough: a fresh np.empty of more than a few hundred KiB is an mmap whose page faults
    cost as much as a small attention call. Per Python thread, since the kernels release the GIL;
    buffers over _KEEP bytes are not kept."""
    size = math.prod(shape)
    store = _local.__dict__
    buf = store.get((name, dtype))
    if buf is None or buf.size < size:
        buf = np.empty(max(size, 1), dtype)
        if buf.nbytes <= _KEEP:
            store[(name, dtype)] = buf
    return buf[:size].reshape(shape)


@functools.lru_cache(maxsize=64)
def _units(kv_bytes):
    """(distinct (K, V) offset pairs, the index of each batch item's pair): from the pairs' bytes,
    so that repeated calls with the same batch layout cost a cache look-up."""
    kv = np.frombuffer(kv_bytes, np.int64).reshape(-1, 2)
    if len(kv) == 1:
        return kv.copy(), np.zeros(1, np.int64)
    kv, unit = np.unique(kv, axis=0, return_inverse=True)
    return kv, unit.reshape(-1).astype(np.int64)


@functools.lru_cache(maxsize=64)
def _schedule(B, Sq, Sk, causal, q_offset, nthreads):
    """Split the work items w = (query tile w // B, batch item w % B) over the threads.

    Items are sorted by cost (key tiles visited: fewer on causal tiles near the top) and dealt out
    in a snake (0, 1, .., n-1, n-1, .., 0, 0, 1, ..), which evens out the causal triangle. Returns
    (items grouped by thread, heaviest first within a thread; start of each thread's group)."""
    BQ, BK = _attention.BQ, _attention.BK
    nqt, nkt = -(-Sq // BQ), -(-Sk // BK)
    w = np.arange(B * nqt, dtype=np.int64)
    last_row = np.minimum((w // B + 1) * BQ, Sq) - 1 + q_offset  # its position
    cost = np.minimum(nkt, last_row // BK + 1) if causal else np.full(w.size, nkt)
    order = np.argsort(-cost, kind="stable")
    lap = np.arange(order.size) % (2 * nthreads)
    thread = np.where(lap < nthreads, lap, 2 * nthreads - 1 - lap)
    by_thread = np.argsort(thread, kind="stable")
    starts = np.zeros(nthreads + 1, np.int64)
    starts[1:] = np.cumsum(np.bincount(thread, minlength=nthreads))
    return order[by_thread].astype(np.int64), starts
