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
from . import feed_forward as _feed_forward
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


def attention(q, k, v, mask, out, offsets, strides, Sq, Sk, d_k, d_v, causal, q_offset, masked, num_threads,
              items=None):
    """The kernel contract's attention; items (B, 3): each item's own Sq, Sk and output offset
    (packed sequences), or None (every item Sq x Sk)."""
    nthreads = _use_threads(num_threads)
    B = len(offsets)
    # K and V are packed once per distinct (K, V) batch item (they are often broadcast)
    kv, unit = _units(offsets[:, 1:3].tobytes())
    units = len(kv[0])
    if items is None:
        sq, sk, ooff, usk = _uniform(B, Sq, Sk, d_v, units)
        sched, starts = _schedule(B, Sq, Sk, bool(causal), int(q_offset), nthreads)
    else:
        sq, sk, ooff = (np.ascontiguousarray(items[:, i]) for i in range(3))
        sched, starts = _deal(_costs(sq, sk, bool(causal), int(q_offset)), nthreads)
        usk = np.empty(units, np.int64)
        usk[unit] = sk  # a unit's keys: those of the items that read it
    lanes2 = 2 * VBYTES // out.itemsize  # the P V micro-kernel works on two registers of d_v
    dvp = -(-d_v // lanes2) * lanes2
    nkt = -(-Sk // _attention.BK)
    kp = _workspace("kp", (units, nkt, d_k, _attention.BK), out.dtype)
    vp = _workspace("vp", (units, nkt * _attention.BK, dvp), out.dtype)
    work = _workspace("work", (nthreads, _attention.scratch_layout(d_k, dvp, Sk)[-1]), out.dtype)
    # with threads, the parallel pack also wakes them for the tiles that follow
    pack = _attention.pack_kv if nthreads > 1 else _attention.pack_kv_serial
    pack(k, v, kv[0], kv[1], int(strides[1]), int(strides[2]), usk, d_k, d_v, dvp, kp, vp)
    qoff, koff, voff, moff = (np.ascontiguousarray(offsets[:, i]) for i in range(4))
    qs, ks, vs, ms = (int(s) for s in strides)
    _attention.attention_tiles(q, k, v, kp, vp, mask, out, qoff, koff, voff, moff, unit, sq, sk, ooff, qs, ks,
                               vs, ms, Sk, d_k, d_v, bool(causal), int(q_offset), bool(masked), sched, starts,
                               work)


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


def bias_relu(h, b, num_threads):
    _use_threads(num_threads)
    _feed_forward.bias_relu_rows(h, b)


def bias_gelu(h, b, num_threads):
    _use_threads(num_threads)
    (_feed_forward.bias_gelu32_rows if h.dtype == np.float32 else _feed_forward.bias_gelu64_rows)(h, b)


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
    """((K offsets, V offsets) of the distinct (K, V) pairs, the index of each batch item's pair):
    from the pairs' bytes, so that repeated calls with the same batch layout cost a cache look-up.
    The arrays are shared between calls: the kernels only read them."""
    kv = np.frombuffer(kv_bytes, np.int64).reshape(-1, 2)
    unit = np.zeros(1, np.int64)
    if len(kv) > 1:
        kv, unit = np.unique(kv, axis=0, return_inverse=True)
    return _int64(kv[:, 0], kv[:, 1]), _int64(unit.reshape(-1))[0]


@functools.lru_cache(maxsize=64)
def _uniform(B, Sq, Sk, d_v, units):
    """Per-item queries, keys and output offsets, and per-unit keys, for B items of Sq x Sk."""
    return _int64(np.full(B, Sq), np.full(B, Sk), np.arange(B) * (Sq * d_v), np.full(units, Sk))


def _int64(*arrays):
    return tuple(np.ascontiguousarray(a, dtype=np.int64) for a in arrays)


def _costs(sq, sk, causal, q_offset):
    """The cost of each work item w = (query tile w // B, batch item w % B): key tiles visited
    (fewer on causal tiles near the top; 0 for tiles past an item's queries)."""
    BQ, BK = _attention.BQ, _attention.BK
    B = len(sq)
    w = np.arange(B * -(-int(sq.max()) // BQ), dtype=np.int64)
    first, b = (w // B) * BQ, w % B
    last_row = np.minimum(first + BQ, sq[b]) - 1 + q_offset  # its position
    tiles = -(-sk[b] // BK)
    cost = np.minimum(tiles, last_row // BK + 1) if causal else tiles
    return np.where(first < sq[b], cost, 0)


def _deal(cost, nthreads):
    """Split the work items with cost > 0 over the threads: sorted by cost and dealt out in a snake
    (0, 1, .., n-1, n-1, .., 0, 0, 1, ..), which evens out a causal triangle. Returns (items
    grouped by thread, heaviest first within a thread; start of each thread's group)."""
    order = np.argsort(-cost, kind="stable")
    order = order[cost[order] > 0]
    lap = np.arange(order.size) % (2 * nthreads)
    thread = np.where(lap < nthreads, lap, 2 * nthreads - 1 - lap)
    by_thread = np.argsort(thread, kind="stable")
    starts = np.zeros(nthreads + 1, np.int64)
    starts[1:] = np.cumsum(np.bincount(thread, minlength=nthreads))
    return order[by_thread].astype(np.int64), starts


@functools.lru_cache(maxsize=64)
def _schedule(B, Sq, Sk, causal, q_offset, nthreads):
    """_deal for B items of Sq queries and Sk keys (cached: repeated calls of one shape)."""
    return _deal(_costs(np.full(B, Sq, np.int64), np.full(B, Sk, np.int64), causal, q_offset), nthreads)
