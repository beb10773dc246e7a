"""Arrays that start on a cache line. numpy aligns its data to 16 bytes: an array past glibc's mmap
threshold (128 KB at first) starts 16 bytes into a page, so every 64-byte load of its rows spans two
cache lines. The attention kernels read a KV cache placed so in 5% (grouped-query decoding) to 16%
(one query per K/V head) more time than an aligned one over 4096 keys on a Zen 4 core, bitwise the
same results; the models allocate their caches here. Weights packed for the kernels go in huge
pages (huge())."""
import threading

import numpy as np

LINE = 64  # bytes: a cache line, and one AVX-512 vector
HUGE = 2 << 20  # bytes: an x86-64 huge page
CHUNK = 64 << 20  # bytes of address space a chunk of huge(): resident only as its huge pages are written
BIG = 4 << 20  # bytes: a huge() array this big has a mapping of its own (a chunk would leave its rest)

_chunk = [None]  # the current chunk's part not yet handed out (uint8, from a HUGE boundary)
_lock = threading.Lock()


def empty(shape, dtype):
    """np.empty(shape, dtype) whose first element sits at a multiple of LINE bytes."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    buf = np.empty(n + LINE, np.uint8)
    start = -buf.ctypes.data % LINE
    return buf[start:start + n].view(dtype).reshape(shape)


def pages(shape, dtype):
    """np.empty(shape, dtype) on memory of its own (a private anonymous mapping: page-aligned, so aligned to
    LINE too) that the kernel is asked not to back with huge pages, so that only the 4 KB pages
    written take memory. For a KV cache pool sized for the longest sequences: numpy asks for huge
    pages on every array of 4 MB or more, and a pool written a few positions per page of keys
    then became resident 2 MB at a time (SmolLM2, 16 sequences of ~100 positions in a pool of 16 x
    4096: 516 MB resident for 88 MB of keys and values). Where mmap has no madvise (not Linux):
    empty()."""
    import mmap
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if n == 0 or not hasattr(mmap, "MADV_NOHUGEPAGE"):
        return empty(shape, dtype)
    m, whole = _private(n)
    m.madvise(mmap.MADV_NOHUGEPAGE)
    return whole.view(dtype).reshape(shape)


def huge(shape, dtype):
    """np.empty(shape, dtype) on memory the kernel is asked to back with 2 MB pages (transparent huge
    pages), for arrays that live as long as a model and are read whole at every step: its weights
    packed for the kernels (quant.QuantizedMatrix.rows16). numpy asks for huge pages only on arrays
    of 4 MB or more; SmolLM2's matrices are 0.2-0.55 MB, so on 4 KB pages each 4 KB of them took a
    TLB entry of its own and the hardware prefetchers, which stop at a page's edge, began again on
    each (docs/kernels.md gives the times). Arrays under BIG bytes are cut end to end, each from a
    cache line, from chunks of CHUNK bytes of private anonymous memory, so that small ones share
    huge pages (a chunk is resident in HUGE units as it is written: at most one partly used huge
    page beyond its arrays); a bigger one has a mapping of its own, its whole huge pages advised
    and its end in 4 KB pages, as numpy gives one. A mapping is unmapped when its last array goes.
    Where mmap has no MADV_HUGEPAGE (not Linux): empty()."""
    import mmap
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if n == 0 or not hasattr(mmap, "MADV_HUGEPAGE"):
        return empty(shape, dtype)
    if n >= BIG:
        return _mapped(n, n // HUGE * HUGE).view(dtype).reshape(shape)
    with _lock:
        free = _chunk[0]
        if free is None or free.size < n:
            free = _mapped(CHUNK, CHUNK)
        out = free[:n]
        _chunk[0] = free[-(-n // LINE) * LINE:]
    return out.view(dtype).reshape(shape)


def _mapped(n, advise):  # -> uint8 (n) from a HUGE boundary of a mapping of its own
    """advise: its first `advise` bytes (a multiple of HUGE) asked for in huge pages; the rest stays in
    4 KB pages, so that the end of a big array does not make a whole huge page resident."""
    import mmap
    m, whole = _private(n + HUGE)
    start = -whole.ctypes.data % HUGE
    if advise:
        m.madvise(mmap.MADV_HUGEPAGE, start, advise)
    return whole[start:start + n]


def _private(n):  # -> (the mapping, uint8 (n) over it: the arrays cut from it keep it alive)
    """n bytes of private anonymous memory. Python's mmap is shared by default, and shared anonymous
    memory is shmem (tmpfs), whose page faults cost more: a KV pool takes its pages by faults during
    decoding steps."""
    import mmap
    m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return m, np.frombuffer(m, np.uint8)
