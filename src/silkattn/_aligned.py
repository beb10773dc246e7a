"""Arrays that start on a cache line. numpy aligns its data to 16 bytes: an array past glibc's mmap
threshold (128 KB at first) starts 16 bytes into a page, so every 64-byte load of its rows spans two
cache lines. The attention kernels read a KV cache placed so in 5% (grouped-query decoding) to 16%
(one query per K/V head) more time than an aligned one over 4096 keys on a Zen 4 core, bitwise the
same results; the models allocate their caches here."""
import numpy as np

LINE = 64  # bytes: a cache line, and one AVX-512 vector


def empty(shape, dtype):
    """np.empty(shape, dtype) whose first element sits at a multiple of LINE bytes."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    buf = np.empty(n + LINE, np.uint8)
    start = -buf.ctypes.data % LINE
    return buf[start:start + n].view(dtype).reshape(shape)


def pages(shape, dtype):
    """np.empty(shape, dtype) on memory of its own (an anonymous mapping: page-aligned, so aligned to
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
    m = mmap.mmap(-1, n)
    m.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(m, dtype).reshape(shape)  # the array keeps the mapping alive
