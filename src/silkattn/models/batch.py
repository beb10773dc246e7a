"""Many sequences at once: continuous batching over a paged KV cache.

KVPool holds every layer's keys and values in pages of a fixed number of positions, one allocation
for all the sequences: (n_layers, 2, pages, h_kv, page_keys, d_head), float32 or float16 (the
model's kv_dtype). A sequence is handed
pages as it grows (any free ones, in any order: ops.attention_paged reads them through its page
table) and gives them back when it ends; nothing is copied as it grows.

Batch is the scheduler. Sequences wait in the order they came; at each step() the first waiting
ones join while fewer than max_batch run and the pool can hold their prompt and all their new
tokens (reserved then, so that a running sequence never runs out of pages: one that would not fit
waits, it neither fails nor takes another's), the joining prompts prefilled together to their
first tokens (Llama._prefill_batch: packed end to end, one pass over the weights, up to
PREFILL_ROWS rows, each prompt's keys and values written straight to its pages; a prompt short
enough that generate multiplies its rows in the few-row kernels is packed only with such prompts,
up to that many rows in all, so that its products sum as generate's do, where a GEMM would sum
them otherwise: _api.few_rows; a float32 GEMM is the BLAS's, whose sums for a row may depend on the
rows packed with it: docs/serving.md says which promises hold to the bit). A joining prompt that
begins as a running sequence's prompt, an ended one's (its pages kept: KVPool.give, take) or an
earlier one of its prefill (a chat template's system prompt) copies the keys and values of their
common positions and multiplies only its other rows (shares: where those are the bits its own
rows would give, Llama._shareable, or, where the BLAS multiplies them, within its rounding); then
every sequence already running writes one token, all of them in one pass over the weights
(Llama._run_batch: the few-rows kernels or the GEMM over B rows, the attention of each over its own
pages). Where every running sequence fits in one page (its prompt and all its new tokens), the step
is the model's fused one instead, a page being laid out as a sequence's own cache: alone, the
step generate runs (Llama._step); several, the fused step of rows (Llama._step_rows,
ops.layer_step_rows: one call for all the layers and rows). A sequence leaves when it writes EOS
(unless ignore_eos) or its max_new_tokens, or when it is cancelled, and its pages go back to the
pool at once (its prompt's kept, free, until a sequence needs them). Each sequence samples with
its own settings and seed (reference.next_token, as
Llama.generate does), so each one's tokens are those that generate gives it alone (where the
BLAS's sums part from generate's in the last bits, so long as no two of a step's logits are
closer than that).
"""
import dataclasses
import time

import numpy as np

from .. import _aligned, _api, _backends
from .. import _checks as check
from .. import reference as ref

PAGE_KEYS = 256  # positions a page: the attention kernel's chunk of keys (_plan.CHUNK_KEYS)
PREFILL_ROWS = 2048  # the joining prompts' rows prefilled in one pass at most (a longer prompt alone)
POSITIONS = 4096  # a sequence's positions in the default pool: max_batch x min(context, POSITIONS)


def one_page(positions):
    """The page size (a valid page_keys) that holds `positions` in one page: positions up to
    PAGE_KEYS, else rounded up to a multiple of it. A sequence in one page takes the fused step
    (the layout of its own cache): the paged step was two thirds as fast (SmolLM2 int8, prompts of
    519-1421 tokens), and with int8 activations its ops, summing in other orders than generate's
    step, can part from generate's greedy tokens after some tens of tokens."""
    positions = check.count(positions, "positions")
    return positions if positions <= PAGE_KEYS else -(-positions // PAGE_KEYS) * PAGE_KEYS


def shares(prompts, few=None, most=None, prior=()):  # -> [None or (a, p)] for Llama._prefill_batch, or None
    """Each prompt's longest prefix in common with a sequence prefilled before (prior: their
    prompts, a < len(prior)) or an earlier prompt of the same prefill (a - len(prior)): (a, p), its
    first p positions that sequence's (a chat template's system prompt, a corpus's instructions).
    most(n): the most positions a prompt of n positions may share (Llama._shareable: where its
    rows are computed as in any other such prompt: to the bit where silkattn's kernels multiply
    them, within the BLAS's rounding where its GEMM does), by default all but its last, whose
    logits it needs; a sequence that may share none is no one's source either. few: where the
    prompts are longer than _api.few_rows and so multiplied by a GEMM, the last ones share less so
    that more than `few` rows are left to multiply (the few-row kernels would take fewer, summing
    otherwise); None where none shares."""
    sources = list(prior) + list(prompts)
    limit = [len(ids) - 1 if most is None else min(len(ids) - 1, most(len(ids))) for ids in sources]
    out = [None] * len(prompts)
    for b, ids in enumerate(prompts):
        for a in range(len(prior) + b):
            m = min(len(sources[a]), limit[len(prior) + b]) if limit[a] > 0 else 0
            differ = np.flatnonzero(sources[a][:m] != ids[:m])
            p = int(differ[0]) if len(differ) else m
            if p > (out[b] or (0, 0))[1]:
                out[b] = (a, p)
    need = 0 if few is None else few + 1 - (sum(map(len, prompts)) - sum(p for _, p in filter(None, out)))
    for b in reversed(range(len(out))):  # the last ones share less, so that more than few rows are left
        if need > 0 and out[b]:
            cut = min(need, out[b][1])
            out[b], need = (out[b][0], out[b][1] - cut) if cut < out[b][1] else None, need - cut
    return out if any(out) else None


class KVPool:
    """Pages of keys and values for every layer of `config`'s model: as many as `tokens` positions
    need (or `nbytes` hold), page_keys positions each, of dtype float32 or float16. Pages are taken
    and given back by index."""

    def __init__(self, config, tokens=None, nbytes=None, page_keys=PAGE_KEYS, dtype=np.float32):
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
        self._free = list(range(pages - 1, -1, -1))  # a stack: the most recently freed page first
        self.reserved = 0  # pages promised to running sequences and not yet taken
        self.kept = []  # [(prompt ids, its pages)] of ended sequences, the least recently used first

    @property
    def pages(self):
        return self.data.shape[2]

    @property
    def free(self):  # pages neither taken nor promised (those kept with a prompt's keys among them)
        return len(self._free) + sum(len(pages) for _, pages in self.kept) - self.reserved

    @property
    def nbytes(self):
        return self.data.nbytes

    def pages_for(self, positions):
        return -(-positions // self.page_keys)

    def layer(self, i):  # -> (K, V), each (pages, h_kv, page_keys, d_head)
        return self.data[i, 0], self.data[i, 1]

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
        return self._free.pop()

    def give(self, pages, unused=0, ids=None):
        """Back to the pool: the pages a sequence took, and the `unused` ones it had reserved. With
        ids (its prompt, prefilled), the pages that hold the prompt are kept with it: later prompts
        that begin alike copy its keys (shares), until take() needs the pages."""
        keep = self.pages_for(len(ids)) if ids is not None else 0
        if keep:  # the same prompt kept before holds nothing this one does not: its pages are free again
            same = [e for e in self.kept if np.array_equal(e[0], ids)]
            self.kept = [e for e in self.kept if not any(e is d for d in same)] + [(ids, list(pages[:keep]))]
            for _, old in same:
                self._free.extend(reversed(old))
        self._free.extend(reversed(pages[keep:]))
        self.reserved -= unused

    def used(self, entry):  # a kept entry a prompt copied from: the most recently used now
        self.kept = [e for e in self.kept if e is not entry] + [entry]


@dataclasses.dataclass(eq=False)
class Sequence:
    """One request of a Batch: its prompt, limits and sampling, and as it runs its tokens."""

    ids: np.ndarray           # the prompt's token ids
    max_new_tokens: int
    temperature: float = 0.0
    top_k: int = None
    top_p: float = None
    ignore_eos: bool = False
    rng: np.random.Generator = None
    new: list = dataclasses.field(default_factory=list)  # the tokens written so far
    pages: list = dataclasses.field(default_factory=list)  # its pages, in order of position
    reserved: int = 0          # pages promised to it, not yet taken
    shared: int = 0            # its first positions whose keys it took from another sequence (shares)
    finish_reason: str = None  # "stop" (EOS), "length" (max_new_tokens) or "cancelled"; None while it runs

    @property
    def done(self):
        return self.finish_reason is not None

    @property
    def token(self):  # the token a decoding step takes next: the last written, or a one-token prompt
        return self.new[-1] if self.new else int(self.ids[-1])

    @property
    def position(self):  # the position of that token (its keys and values are written there)
        return len(self.ids) + len(self.new) - 1


class Batch:
    """The scheduler of continuous batching for one model (see the module doc): submit() sequences,
    step() until idle. cache_tokens or cache_bytes sizes the pool (default: max_batch sequences of
    min(context, POSITIONS) positions: a Llama 3 context of 131072 for 16 sequences would be 137 GB
    of the 1B model's keys and values); page_keys: positions a page (default: with the default
    pool, one_page(min(context, POSITIONS)), a page a sequence, so that every sequence of up to
    that many positions takes the fused step; with a pool of a given size, PAGE_KEYS). Only the
    positions written take memory (_aligned.pages), whatever the pages' size."""

    def __init__(self, model, max_batch=16, *, cache_tokens=None, cache_bytes=None, page_keys=None):
        self.model, self.max_batch = model, check.count(max_batch, "max_batch")
        longest = min(model.config.context_length, POSITIONS)
        if cache_tokens is None and cache_bytes is None:
            page_keys = one_page(longest) if page_keys is None else page_keys
            cache_tokens = self.max_batch * max(longest, page_keys)  # max_batch pages of one_page(longest)
        page_keys = PAGE_KEYS if page_keys is None else page_keys
        self.pool = KVPool(model.config, cache_tokens, cache_bytes, page_keys, model.kv_dtype)
        self.waiting, self.running = [], []
        self._steps = {}  # page -> the fused step's records over it (_lone)
        self.stats = {"steps": 0, "prompt_tokens": 0, "new_tokens": 0, "prefill_s": 0.0, "decode_s": 0.0,
                      "batch_rows": 0, "shared_tokens": 0}

    @property
    def idle(self):
        return not self.waiting and not self.running

    def submit(self, ids, max_new_tokens, *, temperature=0.0, top_k=None, top_p=None, seed=None,
               ignore_eos=False):  # -> Sequence
        """A sequence to write up to max_new_tokens after ids, as Llama.generate would; it waits
        until a step has room for it. A sequence the pool could never hold is refused here."""
        m = self.model
        ids = m._ids(ids, "ids")
        check.count(max_new_tokens, "max_new_tokens", minimum=0)
        check.sampling(temperature, top_k, top_p)
        m._fits(len(ids), max_new_tokens)
        need = self.pool.pages_for(len(ids) + max_new_tokens)
        if need > self.pool.pages:
            raise ValueError(f"{len(ids)} prompt tokens + max_new_tokens={max_new_tokens} need {need} pages "
                             f"of {self.pool.page_keys} positions; the cache holds {self.pool.pages} "
                             "(raise cache_tokens or cache_bytes)")
        seq = Sequence(ids, max_new_tokens, temperature, top_k, top_p, bool(ignore_eos),
                       np.random.default_rng(seed))
        if max_new_tokens == 0:
            seq.finish_reason = "length"
        else:
            self.waiting.append(seq)
        return seq

    def cancel(self, seq):
        """Ends seq now (waiting or running): its pages go back to the pool."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.running:
            self._leave(seq)
        if not seq.done:
            seq.finish_reason = "cancelled"

    def step(self):  # -> [(sequence, token)] written in this step
        """Sequences join (each prefilled to its first token; a one-token prompt instead joins the
        step below, at position 0, as generate's prefill runs it), then the running ones advance
        one token together."""
        written, old, joining = [], list(self.running), []
        self.stats["steps"] += 1
        while self.waiting and len(self.running) < self.max_batch:
            seq = self.waiting[0]
            need = self.pool.pages_for(len(seq.ids) + seq.max_new_tokens)
            if not self.pool.reserve(need):
                break  # the first in line waits for pages; the later ones wait behind it
            self.waiting.pop(0)
            seq.reserved = need
            self.running.append(seq)
            joining.append(seq)
        for seq in [seq for seq in joining if len(seq.ids) == 1]:
            # a one-token prompt is a decoding step at position 0, as generate prefills it
            joining.remove(seq)
            old.append(seq)
            self.stats["prompt_tokens"] += 1
        few = max(_api.few_rows(_backends.kernels(), W) for W in self.model.layers[0].products)
        while joining:  # their prompts packed: short ones (few rows) together, long ones together
            short = len(joining[0].ids) <= few
            group, rest, rows = [], [], 0
            for seq in joining:
                if not group or (len(seq.ids) <= few) == short \
                        and rows + len(seq.ids) <= (few if short else PREFILL_ROWS):
                    group.append(seq)
                    rows += len(seq.ids)
                else:
                    rest.append(seq)
            joining = rest
            start = time.perf_counter()
            for seq in group:
                for _ in range(self.pool.pages_for(len(seq.ids))):
                    seq.pages.append(self.pool.take())
                    seq.reserved -= 1
            # sources in this group's class: the prompts running (prefilled: not one-token ones), kept
            prior = [(seq.ids, seq.pages) for seq in self.running if seq.pages and len(seq.ids) > 1
                     and seq not in group and (len(seq.ids) <= few) == short]
            kept = [entry for entry in self.pool.kept if (len(entry[0]) <= few) == short]
            shared = shares([seq.ids for seq in group], None if short else few, self.model._shareable,
                            [ids for ids, _ in prior + kept])
            logits = self.model._prefill_batch([seq.ids for seq in group], self.pool,
                                               [seq.pages for seq in group], shared,
                                               [pages for _, pages in prior + kept])
            for a in {share[0] - len(prior) for share in shared or () if share}:
                if 0 <= a < len(kept):
                    self.pool.used(kept[a])
            self.stats["prefill_s"] += time.perf_counter() - start
            self.stats["prompt_tokens"] += rows
            for seq, share in zip(group, shared or ()):
                seq.shared = share[1] if share else 0
                self.stats["shared_tokens"] += seq.shared
            written += [(seq, self._next(seq, row)) for seq, row in zip(group, logits)]
        if old:
            start = time.perf_counter()
            for seq in old:  # the page this token's keys go to
                if seq.position >= len(seq.pages) * self.pool.page_keys:
                    seq.pages.append(self.pool.take())
                    seq.reserved -= 1
            logits = self._lone(old[0]) if len(old) == 1 else self._fused_rows(old)
            if logits is None:
                positions = np.array([seq.position for seq in old])
                table = np.zeros((len(old), max(len(seq.pages) for seq in old)), np.int64)
                for row, seq in zip(table, old):
                    row[:len(seq.pages)] = seq.pages
                tokens = np.array([seq.token for seq in old])
                logits = self.model._run_batch(tokens, positions, self.pool, table, positions + 1)
            self.stats["decode_s"] += time.perf_counter() - start
            self.stats["batch_rows"] += len(old)
            written += [(seq, self._next(seq, row)) for seq, row in zip(old, logits)]
        return written

    def _lone(self, seq):  # -> logits (1, vocab), or None where the batch's step must run
        """A sequence running alone whose positions all fit in one page takes the model's fused
        decoding step (Llama._step, what generate runs) over that page as its cache: one page is
        (h_kv, page_keys, d_head) a layer, the layout of a sequence's own cache."""
        if not self._one_page([seq]):
            return None
        return self.model._step(self._records(seq.pages[0]), seq.token, seq.position)

    def _fused_rows(self, seqs):  # -> logits (B, vocab), or None where the batch's step must run
        """Sequences whose positions each fit in one page take the fused step of rows
        (Llama._step_rows: one call for all the layers and rows, each over its page)."""
        if not self._one_page(seqs):
            return None
        return self.model._step_rows(self._records(0), np.array([seq.token for seq in seqs]),
                                     np.array([seq.position for seq in seqs]), self.pool,
                                     np.array([seq.pages[0] for seq in seqs]))

    def _one_page(self, seqs):
        return self.model._fused and all(len(seq.pages) == 1 and len(seq.ids) + seq.max_new_tokens
                                         <= self.pool.page_keys for seq in seqs)

    def _records(self, page):  # -> the fused step's records over the page, made once a page and kept
        steps = self._steps.get(page)
        if steps is None:
            steps = self._steps[page] = self.model.layer_steps(
                [self.pool.data[i, :, page] for i in range(self.model.config.n_layers)])
        return steps

    def _next(self, seq, logits):  # -> the token written
        token = ref.next_token(logits, seq.temperature, seq.top_k, seq.rng, seq.top_p)
        seq.new.append(token)
        self.stats["new_tokens"] += 1
        if token == self.model.eos_id and not seq.ignore_eos:
            seq.finish_reason = "stop"
        elif len(seq.new) == seq.max_new_tokens:
            seq.finish_reason = "length"
        if seq.done:
            self._leave(seq)
        return token

    def _leave(self, seq):  # its pages back to the pool; those of a prompt others may share kept with it
        self.running.remove(seq)
        # its prompt prefilled (a first token written: not a prefill that failed part way), shareable
        keep = seq.new and seq.pages and len(seq.ids) > 1 and self.model._shareable(len(seq.ids)) > 0
        self.pool.give(seq.pages, seq.reserved, seq.ids if keep else None)
        seq.pages, seq.reserved = [], 0
