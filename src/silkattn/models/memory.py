"""The memory manager: what sequences keep between decoding steps, owned in one place.

Memory holds every layer's keys and values in pages of a fixed number of positions, one allocation
for all the sequences: (n_layers, 2, pages, h_kv, page_keys, d_head), float32 or float16 (the
model's kv_dtype); beside them, per sequence, state slots of fixed shapes (a recurrent layer's
state: none for attention-only models). Its contract:

- pages: reserve(n) promises n pages (the scheduler's admission: False where fewer are free), take()
  hands a promised one over with one reference, share(pages) adds a reference (a page read by two
  sequences: a fork's full pages, a cached prefix), give(pages) drops one and frees a page whose
  last reference goes. A page shared is read-only: a sequence writes only a page of its own.
- kept prompts: give(..., ids) keeps the pages of an ended sequence's prompt, keyed by its tokens,
  for a later prompt that begins alike (least recently used first; take() evicts them when no page
  is free; a kept page counts as free).
- fork(pages, n): a second table over a sequence's first n positions, its full pages shared and the
  last one, partly written, copied (n > 1 answers to one prompt).
- state slots: slot() a zeroed one, copy_slot, fork_slot and snapshot (a copy at a position: the
  end of a prompt), free_slot.
- view(tables, positions, slots): what one step of a batch reads and writes (View): the page tables,
  the lengths once the step's keys are written, where each row's keys go, the state slots;
  packed(tables, lengths): the same for prompts prefilled together, a row a position. The model
  runner reads and writes keys and values through views (the fused step of rows through its
  tables); the scheduler never touches the data.
"""
import dataclasses

import numpy as np

from .. import _aligned
from .. import _checks as check

PAGE_KEYS = 256  # positions a page: the attention kernel's chunk of keys


class Memory:
    """Pages of keys and values for every layer of `config`'s model: as many as `tokens` positions
    need (or `nbytes` hold), page_keys positions each, of dtype float32 or float16; `states`:
    {name: shape} of a sequence's state slots (float32), `slots` of each."""

    def __init__(self, config, tokens=None, nbytes=None, page_keys=PAGE_KEYS, dtype=np.float32, *,
                 states=None, slots=0):
        check.count(page_keys, "page_keys")
        if page_keys > PAGE_KEYS and page_keys % PAGE_KEYS:
            raise ValueError(f"page_keys must be at most {PAGE_KEYS} or a multiple of it, got {page_keys}")
        self.page_keys, c = int(page_keys), config
        dtype = np.dtype(dtype)
        if dtype not in (np.dtype(np.float32), np.dtype(np.float16)):
            raise ValueError(f"dtype must be float32 or float16, got {dtype}")
        page_bytes = c.n_layers * 2 * c.h_kv * page_keys * c.d_head * dtype.itemsize
        if (tokens is None) == (nbytes is None):
            raise ValueError("give the pool's size as tokens= or as nbytes=, one of them")
        if tokens is not None:
            pages = -(-check.count(tokens, "tokens") // page_keys)
        else:
            pages = check.count(nbytes, "nbytes") // page_bytes
            if not pages:
                raise ValueError(f"nbytes={nbytes} holds no page: one takes {page_bytes} bytes "
                                 f"({page_keys} positions of {c.n_layers} layers)")
        self.data = _aligned.pages((c.n_layers, 2, pages, c.h_kv, page_keys, c.d_head), dtype)
        self.refs = np.zeros(pages, np.int64)  # each page's readers: 0 for a free or kept one
        self._free = list(range(pages - 1, -1, -1))  # a stack: the most recently freed page first
        self.reserved = 0  # pages promised to running sequences and not yet taken
        self.kept = []  # [(prompt ids, its pages)] of ended sequences, the least recently used first
        slots = check.count(slots, "slots", minimum=0)
        self.states = {name: np.zeros((slots, *shape), np.float32) for name, shape in (states or {}).items()}
        self._slots = list(range(slots - 1, -1, -1)) if self.states else []

    @property
    def pages(self):
        return self.data.shape[2]

    @property
    def free(self):  # pages neither taken nor promised (those kept with a prompt's keys among them)
        return len(self._free) + sum(len(pages) for _, pages in self.kept) - self.reserved

    @property
    def taken(self):  # pages some sequence holds (read or written)
        return int((self.refs > 0).sum())

    @property
    def kept_pages(self):  # pages of ended prompts kept for later ones
        return sum(len(pages) for _, pages in self.kept)

    @property
    def nbytes(self):
        return self.data.nbytes + sum(a.nbytes for a in self.states.values())

    def pages_for(self, positions):
        return -(-positions // self.page_keys)

    def layer(self, i):  # -> (K, V), each (pages, h_kv, page_keys, d_head)
        return self.data[i, 0], self.data[i, 1]

    # ---- pages

    def reserve(self, n):
        """Promise n pages (True), or False where fewer are free."""
        if n > self.free:
            return False
        self.reserved += n
        return True

    def take(self):  # -> a promised page's index: a free one, else the least recently used kept one's
        if not self.reserved:
            raise RuntimeError("a page is taken that was not reserved")
        self.reserved -= 1
        if not self._free:
            self._free.extend(reversed(self.kept.pop(0)[1]))
        page = self._free.pop()
        self.refs[page] = 1
        return page

    def share(self, pages):
        """One more reader of each of these taken pages (read-only from now on)."""
        pages = np.asarray(pages, np.int64)
        if (self.refs[pages] < 1).any():
            raise ValueError("only a taken page can be shared")
        np.add.at(self.refs, pages, 1)

    def give(self, pages, unused=0, ids=None):
        """Back to the pool: a reference to each of the pages a sequence took or shared, and the
        `unused` ones it had reserved. A page whose last reference goes is free; with ids (the
        prompt, prefilled), those of its pages that hold the prompt are kept with it instead (kept),
        until take() needs them."""
        keep = self.pages_for(len(ids)) if ids is not None else 0
        gone = []
        for page in pages:
            self.refs[page] -= 1
            if not self.refs[page]:
                gone.append(page)
        kept = [p for p in pages[:keep] if p in gone]
        if kept and len(kept) == keep:  # the same prompt kept before holds nothing this one does not
            same = [e for e in self.kept if np.array_equal(e[0], ids)]
            self.kept = [e for e in self.kept if not any(e is d for d in same)] + [(ids, list(kept))]
            for _, old in same:
                self._free.extend(reversed(old))
        else:
            kept = []
        self._free.extend(reversed([p for p in gone if p not in kept]))
        self.reserved -= unused

    def used(self, entry):  # a kept entry a prompt copied from: the most recently used now
        self.kept = [e for e in self.kept if e is not entry] + [entry]

    def fork(self, pages, positions):  # -> a page table for the first `positions` of the table `pages`
        """A second sequence over the first `positions` positions of `pages`: the full pages shared,
        the last one (partly written) copied to a page taken now (one promised by reserve)."""
        full, part = divmod(positions, self.page_keys)
        table = list(pages[:full])
        self.share(table)
        if part:
            page = self.take()
            self.data[:, :, page, :, :part] = self.data[:, :, pages[full], :, :part]
            table.append(page)
        return table

    # ---- state slots

    def slot(self):  # -> a free state slot, zeroed
        if not self._slots:
            raise RuntimeError("no state slot is free")
        i = self._slots.pop()
        for a in self.states.values():
            a[i] = 0
        return i

    def copy_slot(self, src, dst):
        for a in self.states.values():
            a[dst] = a[src]

    def fork_slot(self, src):  # -> a new slot holding src's state (n > 1 answers, a shared prompt)
        dst = self.slot()
        self.copy_slot(src, dst)
        return dst

    snapshot = fork_slot  # a copy at a position (the end of a prompt), kept while src goes on

    def free_slot(self, i):
        self._slots.append(i)

    # ---- a step's view

    def packed(self, tables, lengths):  # -> View
        """The view of a prefill of B prompts packed end to end: tables, each prompt's page ids;
        lengths (B,), its positions; a row for each of their positions, prompt after prompt (row
        j of prompt b at position j - cu[b]), written where that position goes."""
        lengths, table = np.asarray(lengths, np.int64), _table(tables)
        positions = np.concatenate([np.arange(n) for n in lengths])
        page = np.concatenate([t[np.arange(n) // self.page_keys] for t, n in zip(table, lengths)])
        return View(self, table, lengths, page, positions % self.page_keys)

    def view(self, tables, positions, slots=None):  # -> View
        """The view of one step of B rows: tables, each row's page ids in order of position (lists);
        positions (B,), where each row's keys go; slots (B,), each row's state slot (or None)."""
        table, positions = _table(tables), np.asarray(positions, np.int64)
        rows = np.arange(len(positions))
        return View(self, table, positions + 1, table[rows, positions // self.page_keys],
                    positions % self.page_keys, None if slots is None else np.asarray(slots, np.int64))


def _table(tables):  # lists of page ids -> (B, the longest) int64, zeros past each list's end
    table = np.zeros((len(tables), max(len(t) for t in tables)), np.int64)
    for row, t in zip(table, tables):
        row[:len(t)] = t
    return table


@dataclasses.dataclass(frozen=True)
class View:
    """One step's rows over a Memory: tables (B, pages) their page ids, lengths (B,) their keys once
    this step's are written, page and slot (B,) where each row's keys and values go, slots (B,) their
    state slots (None: no states)."""

    memory: Memory
    tables: np.ndarray
    lengths: np.ndarray
    page: np.ndarray
    slot: np.ndarray
    slots: np.ndarray = None

    def write(self, i, k, v, rows=None):  # k, v (hkv, rows, dh): layer i's keys and values of the rows
        """To where each row's position goes: every row's, or those of `rows` (indices)."""
        K, V = self.memory.layer(i)
        page, slot = (self.page, self.slot) if rows is None else (self.page[rows], self.slot[rows])
        K[page, :, slot], V[page, :, slot] = k.swapaxes(0, 1), v.swapaxes(0, 1)

    def copy(self, i, rows, page, slot):  # layer i's keys and values of (page, slot) to the rows' places
        K, V = self.memory.layer(i)
        K[self.page[rows], :, self.slot[rows]] = K[page, :, slot]
        V[self.page[rows], :, self.slot[rows]] = V[page, :, slot]

    def gather(self, i):  # -> (k, v), each (hkv, rows, dh) float32: what the rows' places hold
        return tuple(A[self.page, :, self.slot].swapaxes(0, 1).astype(np.float32, copy=False)
                     for A in self.memory.layer(i))

    def keys(self, i, b):  # -> (K, V), each (hkv, lengths[b], dh): sequence b's keys and values
        n, table = self.lengths[b], self.tables[b]
        pages = table[:self.memory.pages_for(n)]
        return tuple(A[pages[0]][:, :n] if len(pages) == 1 else np.concatenate(list(A[pages]), 1)[:, :n]
                     for A in self.memory.layer(i))

    def read(self, i):  # -> (K, V, tables): layer i's pages the rows read, float32, and their tables
        K, V = self.memory.layer(i)
        if K.dtype == np.float32:
            return K, V, self.tables
        used, tables = np.unique(self.tables, return_inverse=True)  # a float16 pool's pages, widened
        return K[used].astype(np.float32), V[used].astype(np.float32), tables.reshape(self.tables.shape)
