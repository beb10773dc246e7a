"""The scheduler of continuous batching: which sequences run, in what order, and when they end.

Batch admits sequences in the order they came: at each step() the first waiting ones join while
fewer than max_batch run and the memory (memory.Memory: pages of every layer's keys and values)
can hold their prompt and all their new tokens (reserved then, so that a running sequence never
runs out of pages: one that would not fit waits, it neither fails nor takes another's); the
joining prompts are prefilled to their first tokens, then every sequence already running writes
one token, each by the model runner (runner.BatchRunner, which chooses the calls: which prompts
share one, the fused step or the paged one). A sequence leaves when it writes EOS (unless
ignore_eos) or its max_new_tokens, or when it is cancelled, and its pages go back to the memory
at once (its prompt's kept, free, until a sequence needs them). Each sequence samples with its own
settings and seed (reference.next_token, as generate does), so each one's tokens are those that
generate gives it alone (where the BLAS's sums part from generate's in the last bits, so long as
no two of a step's logits are closer than that: docs/serving.md). The scheduler knows nothing of
the kernels: it never touches the keys and values, and never chooses which prompts share a call.
"""
import dataclasses
import time

import numpy as np

from .. import _checks as check
from .. import reference as ref
from . import runner
from .memory import PAGE_KEYS, Memory

POSITIONS = 4096  # a sequence's positions in the default pool: max_batch x min(context, POSITIONS)


def one_page(positions):
    """The page size (a valid page_keys) that holds `positions` in one page: positions up to
    PAGE_KEYS, else rounded up to a multiple of it. A sequence in one page takes the fused step
    (the layout of its own cache): the paged step was two thirds as fast (SmolLM2 int8, prompts of
    519-1421 tokens), and with int8 activations its ops, summing in other orders than generate's
    step, can part from generate's greedy tokens after some tens of tokens."""
    positions = check.count(positions, "positions")
    return positions if positions <= PAGE_KEYS else -(-positions // PAGE_KEYS) * PAGE_KEYS


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
    constraint: object = None  # a grammar.Constraint its tokens are held to, or None
    logprobs: int = None       # None; else each token's log-probability and the top `logprobs` ones' kept
    token_logprobs: list = dataclasses.field(default_factory=list)  # [(logprob, [(id, logprob), ...])]
    fork_of: object = None     # the Sequence whose prompt's pages it forks when the two join together

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
        self.pool = Memory(model.config, cache_tokens, cache_bytes, page_keys, model.kv_dtype)
        self.runner = runner.BatchRunner(model, self.pool)
        self.waiting, self.running = [], []
        self.stats = {"steps": 0, "prompt_tokens": 0, "new_tokens": 0, "prefill_s": 0.0, "decode_s": 0.0,
                      "batch_rows": 0, "shared_tokens": 0}

    @property
    def idle(self):
        return not self.waiting and not self.running

    def submit(self, ids, max_new_tokens, *, temperature=0.0, top_k=None, top_p=None, seed=None,
               ignore_eos=False, constraint=None, logprobs=None):  # -> Sequence
        """A sequence to write up to max_new_tokens after ids, as Decoder.generate would; it waits
        until a step has room for it. A sequence the pool could never hold is refused here.
        constraint: a grammar.Constraint that masks its logits before each token is sampled;
        logprobs: None, or how many of the likeliest tokens' log-probabilities to keep with each
        token's own (seq.token_logprobs: log_softmax of the logits it was drawn from, before
        temperature, after the constraint's mask)."""
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
                       np.random.default_rng(seed), constraint=constraint,
                       logprobs=None if logprobs is None else check.count(logprobs, "logprobs", minimum=0))
        if max_new_tokens == 0:
            seq.finish_reason = "length"
        else:
            self.waiting.append(seq)
        return seq

    def fork(self, seq, **sampling):  # -> Sequence
        """Another answer to seq's prompt (n > 1), with sampling of its own (submit's keywords): if it
        joins in the step seq does, its prompt is not computed again: its pages are a fork of seq's
        (memory.Memory.fork: the full ones shared, the last copied) and its first token is drawn
        from seq's first logits; else it is prefilled as any prompt."""
        if not isinstance(seq, Sequence) or seq.fork_of is not None:
            raise TypeError("fork takes a Sequence of this batch that is not itself a fork")
        forked = self.submit(seq.ids, seq.max_new_tokens, **sampling)
        forked.fork_of = seq
        return forked

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
        forks = [seq for seq in joining if seq.fork_of in joining and len(seq.ids) > 1]
        for seq in [seq for seq in joining if len(seq.ids) == 1 or seq in forks]:
            # a one-token prompt is a decoding step at position 0, as generate prefills it
            joining.remove(seq)
            if seq not in forks:
                old.append(seq)
                self.stats["prompt_tokens"] += 1
        if joining:
            start = time.perf_counter()
            before = [seq for seq in self.running if seq not in joining and seq not in forks]
            prefilled = self.runner.prefill(joining, before)
            prefilled += self._forked(forks, dict(prefilled))
            self.stats["prefill_s"] += time.perf_counter() - start
            self.stats["prompt_tokens"] += sum(len(seq.ids) for seq in joining)
            self.stats["shared_tokens"] += sum(seq.shared for seq in joining)
            written += [(seq, self._next(seq, row)) for seq, row in prefilled]
        if old:
            start = time.perf_counter()
            for seq in old:  # the page this token's keys go to
                if seq.position >= len(seq.pages) * self.pool.page_keys:
                    seq.pages.append(self.pool.take())
                    seq.reserved -= 1
            logits = self.runner.decode(old)
            self.stats["decode_s"] += time.perf_counter() - start
            self.stats["batch_rows"] += len(old)
            written += [(seq, self._next(seq, row)) for seq, row in zip(old, logits)]
        return written

    def _forked(self, forks, logits):  # -> [(fork, its parent's first logits)]
        """Each fork's pages forked from its parent's prompt, just prefilled (before any token is
        drawn, so none has left yet)."""
        out = []
        for seq in forks:
            seq.pages = self.pool.fork(seq.fork_of.pages, len(seq.ids))
            seq.reserved -= len(seq.pages) - len(seq.ids) // self.pool.page_keys  # the copied page, taken
            seq.shared = len(seq.ids)
            self.stats["prompt_tokens"] += len(seq.ids)
            self.stats["shared_tokens"] += len(seq.ids)
            out.append((seq, logits[seq.fork_of]))
        return out

    def _next(self, seq, logits):  # -> the token written
        if seq.constraint is not None:
            logits = seq.constraint.masked(logits)
        token = ref.next_token(logits, seq.temperature, seq.top_k, seq.rng, seq.top_p)
        if seq.constraint is not None:
            seq.constraint.advance(token)
        if seq.logprobs is not None:
            seq.token_logprobs.append(_logprobs(logits, token, seq.logprobs))
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
        # its prompt prefilled (a first token written: not a prefill that failed part way), worth keeping
        keep = seq.new and seq.pages and self.runner.keeps(seq)
        self.pool.give(seq.pages, seq.reserved, seq.ids if keep else None)
        seq.pages, seq.reserved = [], 0


def _logprobs(logits, token, top):  # -> (token's log-probability, [(id, log-probability)] of the top)
    """log_softmax of logits (float64) at token, and at the `top` likeliest tokens, likeliest first."""
    x = np.asarray(logits, np.float64)
    finite = x[np.isfinite(x)]
    lse = finite.max() + np.log(np.exp(finite - finite.max()).sum())
    best = np.argsort(-x, kind="stable")[:top] if top else []
    return float(x[token] - lse), [(int(i), float(x[i] - lse)) for i in best]
