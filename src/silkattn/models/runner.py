"""The model runner: a decoder's forward pass over what the memory manager holds, for one sequence
(run, decode_one: generate's prefill and decoding) and for a batch (BatchRunner: the scheduler's
joining prompts and running sequences).

Every path runs the one layer loop of models.blocks (layers), each with its own attend: over a
sequence's own cache (cached_attention), over a batch's pages through a memory.View (decode_paged),
over packed prompts (prefill_packed); the fused decoding steps (decode_one, decode_rows) where
blocks.fusable says. What silkattn promises between generate and generate_batch (each sequence's
tokens are generate's) is kept here: BatchRunner packs into one call only the prompts whose rows the
kernels multiply as generate multiplies them alone (ops.rows_alike), and a prompt takes the keys of
another that begins alike only where the attention computes its rows from their keys alone
(ops.attention_alone_rows); the scheduler (models.batch) only admits, orders and cancels.
"""
import numpy as np

from .. import ops
from . import blocks

PREFILL_ROWS = 2048  # the joining prompts' rows prefilled in one pass at most (a longer prompt alone)


def _shared_rows(cu, shared, where, prior, P):  # -> (own, taken, roots, cu_q)
    """Packed prompts (rows cu[b] .. cu[b + 1]), where[j] = (page, slot) of packed position j, of
    which some take their first p positions from another sequence (shared[b] = (a, p): a sequence
    of `prior`, page tables of sequences prefilled before, for a < len(prior), else the packed
    prompt a - len(prior) < b): own, the packed positions computed (computed row r is position
    own[r]); taken, the others; roots (2, len(taken)), the page and slot whose keys and values
    each taken position copies (a computed one's, or a prior sequence's); cu_q, the computed rows'
    bounds, prompt by prompt."""
    page, slot = where  # P: positions a page
    root_page, root_slot = page.copy(), slot.copy()
    own, taken, cu_q = [], [], [0]
    for b, share in enumerate(shared):
        a, p = share or (0, 0)
        lo, hi = cu[b], cu[b] + p
        if p and a < len(prior):
            table = np.asarray(prior[a])
            root_page[lo:hi], root_slot[lo:hi] = table[np.arange(p) // P], np.arange(p) % P
        elif p:
            src = cu[a - len(prior)]
            root_page[lo:hi], root_slot[lo:hi] = root_page[src:src + p], root_slot[src:src + p]
        taken.append(np.arange(cu[b], cu[b] + p))
        own.append(np.arange(cu[b] + p, cu[b + 1]))
        cu_q.append(cu_q[-1] + cu[b + 1] - cu[b] - p)
    taken = np.concatenate(taken)
    return np.concatenate(own), taken, (root_page[taken], root_slot[taken]), np.array(cu_q)


def shares(prompts, few=None, most=None, prior=()):  # -> [None or (a, p)] for prefill_packed, or None
    """Each prompt's longest prefix in common with a sequence prefilled before (prior: their
    prompts, a < len(prior)) or an earlier prompt of the same prefill (a - len(prior)): (a, p), its
    first p positions that sequence's (a chat template's system prompt, a corpus's instructions).
    most(n): the most positions a prompt of n positions may share (shareable: where its
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


def run(m, ids, cache, start, last_only=True, fused=True, records=None):  # ids at start .. start + n
    """Logits of the new positions (the last one only if last_only); their K and V written to cache.
    One token runs the fused step through `records` (made here if None; fused=False:
    the ops, its oracle)."""
    c = m.config
    if fused and len(ids) == 1 and m.fused:
        return decode_one(m, records or m.layer_records(cache), int(ids[0]), start)
    end = start + len(ids)

    def attend(i, q, k, v):  # the new K, V into the layer's cache, then q's attention over it
        return cached_attention(m, q, k, v, cache[i], start, end - q.shape[1], c.window(i))
    last = [len(ids) - 1] if last_only else None
    H = layers(m, m.embed(ids), np.arange(start, end), attend, last)
    return ops.linear(H, m.head)


def decode_paged(m, ids, view):  # -> logits (B, vocab)
    """One token of each of B sequences at its own position, in one pass over the weights: ids (B,);
    their keys and values written and read through view (memory.View: the pages, where each row's
    keys go, the lengths once they are written)."""
    c = m.config

    def attend(i, q, k, v):  # q (hq, B, dh), k, v (hkv, B, dh)
        view.write(i, k, v)
        K, V, tables = view.read(i)
        w = c.window(i)
        A = ops.attention_paged(q.swapaxes(0, 1)[:, :, None], K, V, tables, view.lengths, scale=c.scale,
                                window=None if w is None else (w - 1, -1))
        return A[:, :, 0].swapaxes(0, 1)
    return ops.linear(layers(m, m.embed(ids), view.lengths - 1, attend), m.head)


def prefill_packed(m, prompts, view, shared=None, prior=()):  # -> logits (B, vocab)
    """Prompts (arrays of ids) prefilled together, packed end to end: one pass over the weights
    for all their rows, each prompt's keys and values written to its pages through view
    (Memory.packed), each attending over its own rows (ops.attention_varlen); the
    logits after each prompt. shared: for each prompt None or (a, p) (shares): its first p
    positions are those of sequence a (prior[a], the page table of a sequence prefilled before,
    for a < len(prior), else prompt a - len(prior), an earlier one), whose keys and values it
    copies instead of multiplying its rows. They are the same to the bit where silkattn's own
    kernels multiply the rows (int8 activations; float32 rows up to ops.rows_alike): a row's
    products and, where shareable allows, its attention do not depend on the other rows of the
    call. A float32 GEMM past those rows is the BLAS's, whose row sums may (OpenBLAS's Haswell
    kernel): there they are within the tolerance table. Its own rows attend over them as they
    would alone."""
    c, lens = m.config, view.lengths
    cu = np.concatenate([[0], np.cumsum(lens)])
    positions = np.concatenate([np.arange(n) for n in lens])
    if shared is None or not any(shared):
        own, cu_q = None, cu
    else:
        where, P = (view.page, view.slot), view.memory.page_keys
        own, taken, (root_page, root_slot), cu_q = _shared_rows(cu, shared, where, prior, P)

    def attend(i, q, k, v):  # q (hq, rows, dh), k, v (hkv, rows, dh): the computed rows
        if own is None:
            view.write(i, k, v)
            k, v = as_cached(m, k), as_cached(m, v)  # what the pages hold: float16 rounds
        else:  # the computed rows to their pages, the shared positions copied, then every key read back
            view.write(i, k, v, own)
            view.copy(i, taken, root_page, root_slot)
            k, v = view.gather(i)
        w = c.window(i)
        if i + 1 < c.n_layers:  # the last layer's q: each prompt's last row alone (layers' last)
            return ops.attention_varlen(q, k, v, cu_q, cu_seqlens_k=cu, causal=True, scale=c.scale,
                                        window=None if w is None else (w - 1, -1))
        # the last layer: each prompt's last query over its keys, as generate's prefill takes it
        return np.concatenate([attend_cached(m, q[:, [b]], *view.keys(i, b), n - 1, n, w)
                               for b, n in enumerate(lens)], 1)
    ids = np.concatenate(prompts)
    if own is not None:
        ids, positions = ids[own], positions[own]
    H = layers(m, m.embed(ids), positions, attend, cu_q[1:] - 1)
    return ops.linear(H, m.head)


def shareable(m, n):  # -> int
    """The most of its first positions a prompt of n positions may take from another such prompt
    in a prefill (shares), 0 for none: so many that its own rows and the other's are more than
    ops.attention_alone_rows query rows a K/V head, where no window hides a key from them. There a
    causal row's result is a function of its keys alone, not of the rows before or after it in the
    call (the rows path and a window's first key are laid out by the call's rows; so is the
    reference's sum in NumPy)."""
    c = m.config
    least = ops.attention_alone_rows(c.h // c.h_kv)  # the fewest query rows computed from their keys alone
    if least is None or any(c.window(i) is not None and n > c.window(i) for i in range(c.n_layers)):
        return 0
    return max(0, n - least)


def layers(m, X, positions, attend, last=None):  # -> (rows, d), the final norm's output
    """X (n, d), the embedded tokens at `positions` (n,), through every layer (models.blocks);
    attend(i, q, k, v) -> A: layer i's attention of q (hq, rows, dh) after keeping k, v (hkv, n,
    dh) in its cache, A (hq, rows, dh). last: the rows (indices) the last layer's attention and
    what follows take alone (the others reach no logit), so that their products are those of so
    many rows."""
    return blocks.run_layers(m.config, m.layers, m.norm, X,
                             blocks.Pass(m.config, positions, attend, last))


def cached_attention(m, q, k, v, cache, start, first, w):
    """k, v (hkv, n, dh) of positions start .. end written to the layer's cache (K, V), then q's
    attention (positions first .. end) over it. A cache shorter than end is the window's ring:
    the positions it holds are put back in order before the new ones, and the new ones it keeps
    (the last of them) written to their slots."""
    K, V = cache  # each (hkv, positions, dh)
    end, size = start + k.shape[1], K.shape[1]
    # the attention reads what the cache holds: k, v written to it (rounded to its dtype there,
    # numpy's cast: one conversion, not a round trip before it) and read back by attend_cached
    if size >= end:
        K[:, start:end], V[:, start:end] = k, v
        return attend_cached(m, q, K, V, first, end, w)
    keep = np.arange(max(start, end - size), end)  # the new positions the ring keeps
    if end - start == 1:  # a decoding step: the ring, once written, is exactly its window
        K[:, keep % size], V[:, keep % size] = k, v
        return attend_cached(m, q, K, V, first, size, None)
    k, v = as_cached(m, k), as_cached(m, v)  # read from here, beside the ring's rows
    old = np.arange(max(0, start - w + 1), start)  # cached positions the first new one still sees
    Kc, Vc = np.concatenate([K[:, old % size], k], 1), np.concatenate([V[:, old % size], v], 1)
    K[:, keep % size], V[:, keep % size] = k[:, keep - start], v[:, keep - start]
    lo = start - len(old)
    return ops.attention(q, Kc, Vc, causal=True, q_offset=first - lo, window=(w - 1, -1),
                         scale=m.config.scale)


def attend_cached(m, q, K, V, first, end, w):  # q (hq, rows, dh) at positions first.., keys < end
    """Causal attention over the cached keys, those within the window w back where w is set. One
    position (a decoding step) sees every key it is given: a group's query heads then go in as
    the rows of one K/V head's attention, which reads each cached row once for the group."""
    hq, rows, dh = q.shape
    hkv = K.shape[0]
    one = rows == 1 and hq % hkv == 0
    lo = max(0, end - w) if one and w is not None else 0
    K, V = (A[:, lo:end].astype(np.float32, copy=False) for A in (K, V))  # a float16 cache widened
    if one:
        A = ops.attention(q.reshape(hkv, hq // hkv, dh), K, V, scale=m.config.scale)
        return A.reshape(hq, 1, dh)
    window = None if w is None else (w - 1, -1)
    return ops.attention(q, K, V, causal=True, q_offset=first, window=window, scale=m.config.scale)


def as_cached(m, k):  # k (float32) as the cache holds it: rounded to float16 and back, or k itself
    return k if m.kv_dtype == np.float32 else k.astype(m.kv_dtype).astype(np.float32)


def decode_one(m, records, token, pos):  # -> logits (1, vocab)
    """run() for one token at position pos through the fused step: one ops.layer_step a layer."""
    x = np.ascontiguousarray(m.embed([token])[0])  # (d,): the residual stream, updated in place
    for record in records:
        ops.layer_step(record, x, pos)
    return ops.linear(ops.rms_norm(x[None], m.norm, m.config.eps), m.head)


def decode_rows(m, records, tokens, view):  # -> logits (B, vocab)
    """decode_paged through the fused step of rows (ops.layer_step_rows, one call for all the layers):
    token b at position view.lengths[b] - 1 over page view.tables[b, 0], where each sequence's
    positions fit in its one page; records: the fused step's over a page (the pages' layout)."""
    X = np.ascontiguousarray(m.embed(tokens), np.float32)  # (B, d): the residual rows
    K, V = zip(*(view.memory.layer(i) for i in range(len(records))))
    ops.layer_step_rows(list(records), X, view.lengths - 1, list(K), list(V), view.tables[:, 0])
    return ops.linear(ops.rms_norm(X, m.norm, m.config.eps), m.head)


class BatchRunner:
    """The model run for a batch of sequences (models.batch.Sequence) over a memory.Memory: prefill
    the joining ones, decode the running ones one token each. It chooses the calls; the scheduler
    chooses the sequences."""

    def __init__(self, model, memory):
        self.model, self.memory = model, memory
        self._records = {}  # page -> the fused step's records over it

    def keeps(self, seq):  # -> whether an ended sequence's prompt is worth keeping for later prompts
        return len(seq.ids) > 1 and shareable(self.model, len(seq.ids)) > 0

    def prefill(self, seqs, running):  # -> [(seq, logits (vocab,))] in the order of seqs
        """The prompts of seqs (their pages reserved) to their first tokens' logits, packed into as
        few calls as keep each prompt's rows multiplied as generate multiplies them alone: prompts
        of at most ops.rows_alike rows (the few-row kernels) with such prompts only, up to that many
        rows in all; longer ones together up to PREFILL_ROWS rows. A prompt that begins as one of
        `running`'s (prefilled), a kept one's (memory.kept) or an earlier one's of its call
        copies the keys of their common positions (shares, within shareable) and sets seq.shared."""
        m, memory, out = self.model, self.memory, []
        few = max(ops.rows_alike(W) for W in m.layers[0].products)
        while seqs:
            short = len(seqs[0].ids) <= few
            group, rest, rows = [], [], 0
            for seq in seqs:
                if not group or (len(seq.ids) <= few) == short \
                        and rows + len(seq.ids) <= (few if short else PREFILL_ROWS):
                    group.append(seq)
                    rows += len(seq.ids)
                else:
                    rest.append(seq)
            seqs = rest
            for seq in group:  # the pages its prompt fills, of those reserved for it
                for _ in range(memory.pages_for(len(seq.ids))):
                    seq.pages.append(memory.take())
                    seq.reserved -= 1
            # sources in this group's class: the prompts running or prefilled before (not one-token
            # ones), kept ones
            prior = [(seq.ids, seq.pages) for seq in list(running) + [s for s, _ in out]
                     if seq.pages and len(seq.ids) > 1 and (len(seq.ids) <= few) == short]
            kept = [entry for entry in memory.kept if (len(entry[0]) <= few) == short]
            shared = shares([seq.ids for seq in group], None if short else few, lambda n: shareable(m, n),
                            [ids for ids, _ in prior + kept])
            view = memory.packed([seq.pages for seq in group], [len(seq.ids) for seq in group])
            logits = prefill_packed(m, [seq.ids for seq in group], view, shared,
                                    [pages for _, pages in prior + kept])
            for a in {share[0] - len(prior) for share in shared or () if share}:
                if 0 <= a < len(kept):
                    memory.used(kept[a])
            for seq, share in zip(group, shared or [None] * len(group)):
                seq.shared = share[1] if share else 0
            out += zip(group, logits)
        return out

    def decode(self, seqs):  # -> logits (B, vocab): one token of each sequence at its position
        """The running sequences' next logits: the fused step of one sequence (decode_one, what
        generate runs) or of rows (decode_rows) where every sequence's positions fit in its one
        page (a page laid out as a sequence's own cache), else the blocks over the pages."""
        m, memory = self.model, self.memory
        one_page = m.fused and all(len(seq.pages) == 1 and len(seq.ids) + seq.max_new_tokens
                                    <= memory.page_keys for seq in seqs)
        tokens, positions = np.array([seq.token for seq in seqs]), np.array([seq.position for seq in seqs])
        if one_page and len(seqs) == 1:
            return decode_one(m, self.records(seqs[0].pages[0]), int(tokens[0]), int(positions[0]))
        view = memory.view([seq.pages for seq in seqs], positions)
        return (decode_rows(m, self.records(0), tokens, view) if one_page else decode_paged(m, tokens, view))

    def records(self, page):  # -> the fused step's records over the page, made once a page and kept
        records = self._records.get(page)
        if records is None:
            records = self._records[page] = self.model.layer_records(
                [self.memory.data[i, :, page] for i in range(self.model.config.n_layers)])
        return records
