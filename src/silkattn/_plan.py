"""The attention plan: one call of attention (or attention_varlen) laid out for a kernel, once, in
Python, so that both backends read the same named fields and run the same tasks in the same order.

A plan holds
  q, k, v, mask, bias   1-D views over each operand's memory (q, k, v, bias in the call's float
                        dtype, mask as uint8 0/1), out: the 1-D result (items' rows x d_v, C order)
  rs_q .. rs_bias       the element step between rows of each operand (0: one row broadcast over
                        the queries); every operand's last axis is unit-stride
  items (ITEM)          one per (batch item, query head) or packed sequence: the element offset of
                        its first row in q, k, v, mask, bias and out; its sq query rows and sk keys;
                        pos, the position of its query 0 (query i sits at pos + i); the K/V unit it
                        reads; its ALiBi slope
  units (UNIT)          the distinct K/V operands (offsets and keys): the items of a unit read the
                        same K and V rows (grouped-query heads, broadcast K/V)
  scale, softcap        the scores' factor; the logit cap (0: none)
  left, right           the visible keys of the query at position p: p - left <= j <= p + right
                        (UNBOUNDED on an open side; causal is folded in as right <= 0)
  has_mask, has_bias, has_alibi
  lse                   None, or the 1-D result of each output row's log sum exp of its final scores
                        (natural units; row i of an item at item.out / d_v + i), for the backward
  derived               for a plan kept for its call shape (silkattn._cache): what each backend
                        derives from it (its tables in the backend's form), kept with it
and the work, in one of two shapes chosen here by shape (ggml's rule: one op, the path by shape):
  path "tiles"          tasks (TASK): (item, first query, rows) in the order to run, the heaviest
                        first and the tiles of one K/V unit together, so the threads that take
                        them next share its keys in cache; bq: the most rows of a task
  path "rows"           few query rows per K/V unit (decode, a few new tokens, the heads of a GQA
                        group): groups (GROUP, one per unit) of rows (ROW: item, query index); the
                        keys of each group cut into chunks (CHUNK: group, keys j0 .. j1, the offset
                        of its partial results in a (sum of rows x (d_v + 2)) buffer) that the
                        threads share, then merged per group; stream: its K/V rows exceed half of
                        the last-level cache (LLC_BYTES), so they come from memory: the C kernel
                        prefetches the next block's K rows while it computes on this one.
A paged plan (attention_paged: each sequence's keys in pages of a shared pool) takes the rows path
with page_keys, the keys a page holds, and pages (int64 (n, 2)): the K and V element offsets of
every unit's pages in order, a unit's k then naming its first page there (key j of the unit is row
j % page_keys of page k + j // page_keys) and its chunks cut at page boundaries.
"""
import dataclasses

import numpy as np

from . import _cache

UNBOUNDED = 1 << 62  # an open side of the visible window (positions stay far below it)
ROWS_MAX = 16        # a K/V unit with at most this many query rows takes the rows path
CHUNK_KEYS = 256     # keys per chunk of the rows path: fixed, so results do not depend on threads


def _llc_bytes():
    """The last-level cache's bytes as Linux reports cpu0's (32 MiB when it does not say)."""
    for index in (3, 2):
        try:
            with open(f"/sys/devices/system/cpu/cpu0/cache/index{index}/size") as f:
                text = f.read().strip()
        except OSError:
            continue
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        if text[-1:] in units and text[:-1].isdigit():
            return int(text[:-1]) * units[text[-1]]
        if text.isdigit():
            return int(text)
    return 32 << 20


# The rows path prefetches the next block of keys when a call's K/V rows exceed half the LLC (Zen 4,
# 1 thread, bench/revision_ab.py): a decoding step of 32 heads over 4096 keys (134 MB of K/V) took
# 0.63x the time with it; with K/V in cache (4-8 MB) it took 1.1-1.2x (8 prefetches a key of 64
# dimensions), hence the line. Since 2026-12-04 it prefetches K's rows alone (4 a key): V's cost
# 10-15% from cache and gained nothing from memory.
LLC_BYTES = _llc_bytes()

_I8 = np.int64
ITEM = np.dtype([("q", _I8), ("k", _I8), ("v", _I8), ("mask", _I8), ("bias", _I8), ("out", _I8),
                 ("sq", _I8), ("sk", _I8), ("pos", _I8), ("unit", _I8), ("slope", np.float64)])
UNIT = np.dtype([("k", _I8), ("v", _I8), ("sk", _I8)])
TASK = np.dtype([("item", _I8), ("q0", _I8), ("rows", _I8)])
GROUP = np.dtype([("unit", _I8), ("row0", _I8), ("nrows", _I8), ("chunk0", _I8), ("nchunks", _I8)])
ROW = np.dtype([("item", _I8), ("i", _I8)])
CHUNK = np.dtype([("group", _I8), ("j0", _I8), ("j1", _I8), ("part", _I8)])


@dataclasses.dataclass
class Plan:
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    mask: np.ndarray
    bias: np.ndarray
    out: np.ndarray
    rs_q: int
    rs_k: int
    rs_v: int
    rs_mask: int
    rs_bias: int
    dk: int
    dv: int
    sq_max: int
    sk_max: int
    scale: float
    softcap: float
    left: int
    right: int
    has_mask: bool
    has_bias: bool
    has_alibi: bool
    items: np.ndarray
    units: np.ndarray
    path: str = "tiles"
    bq: int = 0
    tasks: np.ndarray = None
    groups: np.ndarray = None
    rows: np.ndarray = None
    chunks: np.ndarray = None
    parts: int = 0  # rows x (d_v + 2) values of partial results the rows path needs
    stream: bool = False  # the rows path's K/V rows exceed LLC_BYTES / 2: prefetch ahead
    page_keys: int = 0  # a paged plan's keys a page (0: not paged)
    pages: np.ndarray = None  # a paged plan's pages: int64 (n, 2), K and V offsets of each page's row 0
    lse: np.ndarray = None  # None, or every output row's log sum exp (the module doc)
    derived: dict = None  # a kept plan's (silkattn._cache) {backend: what it derives from the plan}:
    #                       kept with it, shared by its bound copies; None: a plan made for one call

    def bind(self, q, k, v, out):
        """This plan over other operands of the same layout (a cached plan, the call's arrays): a
        shallow copy, cheaper than dataclasses.replace for a small call."""
        plan = object.__new__(Plan)
        plan.__dict__.update(self.__dict__)
        plan.q, plan.k, plan.v, plan.out = q, k, v, out
        return plan

    @property
    def work(self):
        """Multiply-adds of the visible part, for the thread count."""
        it = self.items
        return float(np.minimum(it["sk"], _span(self)).astype(np.float64) @ it["sq"]) * (self.dk + self.dv)


def _span(plan):
    """Keys a query can see at most: the window's width, or every key."""
    width = plan.left + plan.right + 1
    return min(width, UNBOUNDED)


def window_bounds(window, causal):
    """(left, right) of the kernel's rule p - left <= j <= p + right, causal folded in."""
    left, right = (None, None) if window is None else window
    left = UNBOUNDED if left is None or left < 0 else int(left)
    right = UNBOUNDED if right is None or right < 0 else int(right)
    return left, (min(right, 0) if causal else right)


def key_range(pos0, pos1, sk, left, right):
    """The keys [j0, j1) that queries at positions pos0 .. pos1 (inclusive) can see (arrays)."""
    j0 = np.clip(pos0 - np.minimum(left, UNBOUNDED // 2), 0, sk)
    j1 = np.clip(pos1 + np.minimum(right, UNBOUNDED // 2) + 1, 0, sk)
    return j0, np.maximum(j1, j0)


def takes_rows(plan):
    """The rows path, when no K/V unit has more than ROWS_MAX query rows."""
    rows_per_unit = np.bincount(plan.items["unit"], weights=plan.items["sq"], minlength=len(plan.units))
    return rows_per_unit.max(initial=0) <= ROWS_MAX


def schedule(plan, geometry, num_threads):
    """Lay out the work of the path takes_rows chooses (see the module doc); geometry: the backend's
    tile sizes (silkattn._backends.TileGeometry)."""
    if takes_rows(plan):
        _rows_path(plan)
    else:
        _tiles_path(plan, geometry, num_threads)
    return plan


def _ceil(a, b):
    return -(-a // b)


def _tiles_path(plan, geometry, num_threads):
    it = plan.items
    B, sq_max = len(it), plan.sq_max
    bq, mr = geometry.bq, geometry.mr
    # Few tiles: pick their count as a multiple of the threads, so each thread gets the same rows
    # (at most max_bq a tile); tile heights rounded to 16 queries (whole register blocks) and mr.
    if B * -(-sq_max // bq) < 8 * num_threads and (it["sq"] == sq_max).all():
        per_item = _ceil(sq_max, geometry.max_bq)
        while (B * per_item) % num_threads and per_item < sq_max:
            per_item += 1
        bq = min(_ceil(_ceil(sq_max, per_item), 16) * 16, geometry.max_bq)
    bq = max(1, min(bq, _ceil(sq_max, mr) * mr))
    plan.path, plan.bq = "tiles", bq
    key = ("tile tasks", *(it[name].tobytes() for name in ("sq", "sk", "pos", "unit")), bq, plan.left,
           plan.right)
    plan.tasks = _cache.get(key, lambda: _tile_tasks(*key[1:]))


def _tile_tasks(sq, sk, pos, unit, bq, left, right):
    """TASKs of every item's query tiles: the items by cost (a unit's items stay together, the
    costliest unit first), within an item its costliest tile first. Kept (silkattn._cache) by the
    items' bytes, so a repeated call shape costs a look-up."""
    sq, sk, pos, unit = (np.frombuffer(a, _I8) for a in (sq, sk, pos, unit))
    ntiles = -(-sq // bq)
    item = np.repeat(np.arange(len(sq), dtype=_I8), ntiles)
    q0 = (np.arange(len(item), dtype=_I8) - np.repeat(np.cumsum(ntiles) - ntiles, ntiles)) * bq
    rows = np.minimum(bq, sq[item] - q0)
    j0, j1 = key_range(pos[item] + q0, pos[item] + q0 + rows - 1, sk[item], left, right)
    cost = (j1 - j0) * rows
    unit_cost = np.bincount(unit[item], weights=cost, minlength=unit.max(initial=0) + 1)
    order = np.lexsort((-cost, item, -unit_cost[unit[item]]))
    tasks = np.empty(len(order), TASK)
    tasks["item"], tasks["q0"], tasks["rows"] = item[order], q0[order], rows[order]
    return tasks


def _rows_path(plan):
    it, units = plan.items, plan.units
    plan.path = "rows"
    key = ("row layout", it["sq"].tobytes(), it["pos"].tobytes(), it["unit"].tobytes(), units["sk"].tobytes(),
           plan.left, plan.right, min(plan.page_keys, CHUNK_KEYS))
    plan.groups, plan.rows, plan.chunks, plan.parts = _cache.get(key, lambda: _row_layout(*key[1:]))
    keys = int((plan.chunks["j1"] - plan.chunks["j0"]).sum())
    plan.stream = keys * (plan.dk + plan.dv) * plan.k.dtype.itemsize > LLC_BYTES // 2


def _row_layout(sq, pos, unit, usk, left, right, step=0):
    """(GROUPs, ROWs, CHUNKs, partial-result values / (d_v + 2)) of the rows path: one group per
    unit, its rows the (item, query) pairs that read it, its visible keys cut into CHUNK_KEYS from
    the first, or (step > 0, a paged plan's: step divides the page) at the multiples of step."""
    sq, pos, unit, usk = (np.frombuffer(a, _I8) for a in (sq, pos, unit, usk))
    by_unit = np.argsort(unit, kind="stable")
    row_item = np.repeat(by_unit, sq[by_unit])
    row_i = np.arange(len(row_item), dtype=_I8) - np.repeat(np.cumsum(sq[by_unit]) - sq[by_unit], sq[by_unit])
    nrows = np.bincount(unit, weights=sq, minlength=len(usk)).astype(_I8)
    row0 = np.cumsum(nrows) - nrows
    p = pos[row_item] + row_i
    first = np.full(len(usk), UNBOUNDED, _I8)
    last = np.full(len(usk), -UNBOUNDED, _I8)
    np.minimum.at(first, unit[row_item], p)
    np.maximum.at(last, unit[row_item], p)
    j0, j1 = key_range(first, last, usk, left, right)
    j0, j1 = np.where(nrows > 0, j0, 0), np.where(nrows > 0, j1, 0)
    size, base = (step, j0 // step * step) if step else (CHUNK_KEYS, j0)  # chunk c starts at base + c size
    nchunks = np.where(j1 > j0, -(-(j1 - base) // size), 0)
    nchunks = np.where((nrows > 0) & (nchunks == 0), 1, nchunks)  # no visible key: one empty chunk
    groups = np.empty(len(usk), GROUP)
    groups["unit"], groups["row0"], groups["nrows"] = np.arange(len(usk)), row0, nrows
    groups["chunk0"], groups["nchunks"] = np.cumsum(nchunks) - nchunks, nchunks
    g = np.repeat(np.arange(len(usk), dtype=_I8), nchunks)
    c = np.arange(len(g), dtype=_I8) - groups["chunk0"][g]
    chunks = np.empty(len(g), CHUNK)
    chunks["group"] = g
    chunks["j0"] = np.minimum(np.maximum(base[g] + c * size, j0[g]), j1[g])
    chunks["j1"] = np.minimum(base[g] + (c + 1) * size, j1[g])
    chunks["part"] = np.cumsum(nrows[g]) - nrows[g]
    rows = np.empty(len(row_item), ROW)
    rows["item"], rows["i"] = row_item, row_i
    return groups, rows, chunks, int(nrows[g].sum())
