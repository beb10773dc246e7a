"""The one cache of silkattn's bookkeeping: whatever is made from a call's shape, not its values,
and comes back with every call of that shape (attention plans and their schedules, the row offsets
of strided views, rotary tables, the tables a backend derives from a cached plan).

One rule: an entry is kept until the entries made or used since pass ENTRIES in number or BYTES in
the size of their arrays (least recently used out first); an entry larger than BYTES / 4 is made
each time and not kept. clear() (silkattn.clear_cache) empties it. Keys are tuples of plain values
(shapes, dtypes, keywords, byte strings), never object ids. Safe across Python threads: two threads
missing the same key may both make it; the first one kept wins.
"""
import dataclasses
import threading
from collections import OrderedDict

import numpy as np

ENTRIES = 1024
BYTES = 256 << 20

_entries = OrderedDict()  # key -> (value, bytes)
_bytes = 0
_lock = threading.Lock()
_MISSING = object()


def nbytes(value):
    """The bytes of the arrays a value holds: an array, a tuple or list of values, a dataclass."""
    if isinstance(value, np.ndarray):
        return value.nbytes if value.base is None else 0  # a view's memory is counted where it lives
    if isinstance(value, (tuple, list)):
        return sum(nbytes(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(nbytes(v) for v in vars(value).values())
    return 0


def get(key, make):
    """The value kept for key, or make() kept under it (unless larger than BYTES / 4)."""
    global _bytes
    hit = _entries.get(key, _MISSING)
    if hit is not _MISSING:
        try:
            _entries.move_to_end(key)  # one C call: atomic under the GIL
        except KeyError:  # evicted by another thread since
            pass
        return hit[0]
    value = make()
    size = nbytes(value)
    if size > BYTES // 4:
        return value
    with _lock:
        hit = _entries.get(key, _MISSING)
        if hit is not _MISSING:
            return hit[0]
        _entries[key] = (value, size)
        _bytes += size
        while len(_entries) > ENTRIES or _bytes > BYTES:
            _, (_, old) = _entries.popitem(last=False)
            _bytes -= old
    return value


def clear():
    """Forget everything silkattn keeps for the call shapes it has seen (plans, schedules, rotary
    tables, row offsets): their memory goes once nothing else holds it."""
    global _bytes
    with _lock:
        _entries.clear()
        _bytes = 0


def stats():
    """(entries, bytes) kept now."""
    return len(_entries), _bytes
