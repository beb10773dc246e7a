"""GGUF files (llama.cpp's format): the header parsed by _gguf_header (the gguf package gives the
type table and the float dequantize), the metadata, the tensors dequantized to float32, the
tokenizers (byte-level BPE under the pre-tokenizers of pretokenizers.py, Gemma 4's BPE and
WordPiece, built with the `tokenizers` package from the file's arrays; SentencePiece in
sentencepiece.py) and the chat template (rendered with jinja2).

Optional extra: pip install "silkattn[llm]". Every reader error is a ValueError that names the
file and what it found there.
"""
import os

import numpy as np

from . import _gguf_header
from .pretokenizers import PRE_TOKENIZERS, REFUSED

# the tensor types load() reads: floats, 32-weight blocks with fp16 scales (Q*_0; Q*_1 add a min) and
# the K-quants' super-blocks of 256 (silkattn.reference.dequantize gives every layout)
TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")

CONTROL, USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values of special and added tokens
SPACE = "\u2581"  # SentencePiece's space, in Gemma 4's and the WordPiece files' pieces


def _gguf():
    try:
        import gguf
    except ImportError as e:
        raise ImportError("reading GGUF files needs the gguf package: pip install \"silkattn[llm]\"") from e
    return gguf


class GGUFFile:
    """One GGUF file: .meta {key: value}, .tensors {name: reader tensor}, .path; dequantize(name)."""

    def __init__(self, path):
        gguf = _gguf()
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise FileNotFoundError(f"no GGUF file at {self.path}")
        try:
            self.version, self.meta, self.tensors = _gguf_header.read(self.path, gguf)
        except ValueError as e:  # a bad magic, a truncated header or tensor table, an unknown type
            size = os.path.getsize(self.path)
            raise ValueError(f"{self.path}: not a readable GGUF file ({size} bytes): {e}") from None

    def get(self, key, default=KeyError):
        """Metadata value `key`; a ValueError naming it when it is missing and has no default."""
        if key in self.meta:
            return self.meta[key]
        if default is KeyError:
            raise ValueError(f"{self.path}: the metadata has no {key!r}")
        return default

    def dequantize(self, name):  # -> float32, numpy's axis order: (rows, row length) for a matrix
        """Tensor `name` as float32 (the gguf package's dequantize of its blocks)."""
        if name not in self.tensors:
            raise ValueError(f"{self.path}: no tensor {name!r}")
        t = self.tensors[name]
        kind = t.tensor_type.name
        if kind not in TENSOR_TYPES:
            raise ValueError(f"{self.path}: tensor {name} has type {kind}, which silkattn does not read "
                             f"(it reads {', '.join(TENSOR_TYPES)})")
        if kind == "F32":
            return np.array(t.data, np.float32)  # a copy: the file's mapping is read-only
        return np.asarray(_gguf().quants.dequantize(t.data, t.tensor_type), np.float32)

    def read(self, name):  # -> the tensor's stored array (blocks: uint8 (rows, bytes)), a copy
        """Tensor `name` as stored (the blocks of a quantized type), read from the file into memory of
        its own rather than through the memory map, whose pages would then stay resident beside it:
        for tensors that are reordered or joined before use."""
        t = self.tensors[name]
        with open(self.path, "rb") as f:
            data = os.pread(f.fileno(), int(t.n_bytes), int(t.data_offset))
        return np.frombuffer(bytearray(data), t.data.dtype).reshape(t.data.shape)

    def shape(self, name):  # numpy's axis order (ggml lists the fastest axis first)
        return tuple(int(n) for n in reversed(self.tensors[name].shape))


# ---------------------------------------------------------------- the tokenizer

def tokenizer(file):
    """The file's tokenizer: encode(text) -> ids (no BOS/EOS; control tokens in the text matched),
    decode(ids, skip_special_tokens=False) -> str, stream() -> a decoder whose step(id) gives the
    text that id completes. tokenizer.ggml.model names the kind, as llama.cpp reads it: "gpt2"
    (byte-level BPE), "llama" (SentencePiece), "gemma4" (BPE over UTF-8 with byte fallback),
    "bert" (WordPiece)."""
    kind = file.get("tokenizer.ggml.model")
    if kind == "llama":
        from . import sentencepiece
        return sentencepiece.from_gguf(file)
    builders = {"gpt2": _bpe, "gemma4": _gemma4, "bert": _wordpiece}
    if kind not in builders:
        raise ValueError(f"{file.path}: tokenizer.ggml.model {kind!r} is not a kind of vocabulary silkattn "
                         f"builds (it builds {', '.join(['llama', *builders])})")
    built = builders[kind](file)
    return built if isinstance(built, Vocabulary) else Vocabulary(built)


class Vocabulary:
    """A tokenizers.Tokenizer behind the interface tokenizer() gives; encoder: a compiled encoder of
    the same vocabulary (bytepair.Encoder) that encodes in its place."""

    def __init__(self, tok, encoder=None):
        import threading
        self.tok, self.encoder = tok, encoder
        self._lock = threading.Lock()  # encode_special_tokens is the tokenizer's

    def encode(self, text, special=True):
        """special: control tokens written in the text are matched (False: spelt out as text, as
        llama.cpp's parse_special=false; user-defined tokens are matched either way)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if self.encoder is not None:
            return self.encoder.encode(text, special)
        with self._lock:
            self.tok.encode_special_tokens = not special
            # the batch's fast path: ids without the offsets and token strings encode() also builds
            return self.tok.encode_batch_fast([text], add_special_tokens=False)[0].ids

    def decode(self, ids, skip_special_tokens=False):
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def stream(self, skip_special_tokens=False):
        from tokenizers.decoders import DecodeStream
        return _BytePairStream(self.tok, DecodeStream(skip_special_tokens=skip_special_tokens))


class _BytePairStream:
    def __init__(self, tok, decoder):
        self.tok, self.decoder = tok, decoder

    def step(self, i):  # -> str or None
        return self.decoder.step(self.tok, int(i))


def _tokenizers():
    try:
        import tokenizers
    except ImportError as e:
        raise ImportError("the GGUF tokenizer needs the tokenizers package: "
                          "pip install \"silkattn[llm]\"") from e
    return tokenizers


def _vocabulary(file):  # -> tokens, token types
    tokens = list(file.get("tokenizer.ggml.tokens"))
    return tokens, list(file.get("tokenizer.ggml.token_type", [1] * len(tokens)))


def _add_special(tok, tokens, types):
    """The control tokens as special tokens, the user-defined ones as added tokens: matched whole
    in a text before the model's pieces."""
    from tokenizers import AddedToken
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, t in enumerate(types) if t == CONTROL])
    tok.add_tokens([AddedToken(tokens[i], normalized=False)
                    for i, t in enumerate(types) if t == USER_DEFINED])
    return tok


def _merges(file):
    return [tuple(m.split(" ", 1)) for m in file.get("tokenizer.ggml.merges")]


def _bpe(file):
    """Byte-level BPE: the file's tokens, merges and pre-tokenizer (pretokenizers.PRE_TOKENIZERS)."""
    tk = _tokenizers()
    name = file.get("tokenizer.ggml.pre", "default")
    if name not in PRE_TOKENIZERS:
        why = REFUSED.get(name, "llama.cpp does not know it either")
        raise ValueError(f"{file.path}: the pre-tokenizer {name!r} (tokenizer.ggml.pre) is not one silkattn "
                         f"runs: {why}")
    pre = PRE_TOKENIZERS[name]
    tokens, types = _vocabulary(file)
    merges, vocab = _merges(file), {t: i for i, t in enumerate(tokens)}
    bpe = tk.models.BPE(vocab=vocab, merges=merges, fuse_unk=False,
                        ignore_merges=pre.ignore_merges)
    tok = tk.Tokenizer(bpe)
    steps = [tk.pre_tokenizers.Split(tk.Regex(regex), behavior="isolated") for regex in pre.regexes]
    tok.pre_tokenizer = tk.pre_tokenizers.Sequence(
        steps + [tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = tk.decoders.ByteLevel()
    from . import bytepair
    return Vocabulary(_add_special(tok, tokens, types),
                      bytepair.encoder(pre, tokens, types, vocab, merges, CONTROL, USER_DEFINED))


def _gemma4(file):
    """Gemma 4's BPE (llama.cpp's pre-tokenizer "gemma4"): over UTF-8 itself, spaces written as
    U+2581, the text cut into runs of newlines and runs of anything else, a character outside the
    vocabulary as its bytes' <0xXX> tokens."""
    tk = _tokenizers()
    tokens, types = _vocabulary(file)
    bpe = tk.models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=_merges(file), fuse_unk=False,
                        byte_fallback=True)
    tok = tk.Tokenizer(bpe)
    tok.normalizer = tk.normalizers.Replace(" ", SPACE)
    tok.pre_tokenizer = tk.pre_tokenizers.Split(tk.Regex(r"[^\n]+|[\n]+"), behavior="isolated")
    tok.decoder = tk.decoders.Sequence([tk.decoders.Replace(SPACE, " "), tk.decoders.ByteFallback(),
                                        tk.decoders.Fuse()])
    return _add_special(tok, tokens, types)


def _wordpiece(file):
    """BERT's WordPiece as llama.cpp's converter writes it: a piece that begins a word carries
    U+2581 in front, one that continues a word nothing (WordPiece's "##" the other way round);
    lower case and accents stripped unless tokenizer.ggml.normalizer.* say otherwise."""
    tk = _tokenizers()
    tokens, types = _vocabulary(file)
    vocab = {}
    for i, (t, kind) in enumerate(zip(tokens, types)):
        piece = t if kind == CONTROL else t[1:] if t.startswith(SPACE) else "##" + t
        vocab.setdefault(piece, i)
    unk = tokens[int(file.get("tokenizer.ggml.unknown_token_id", 100))]
    tok = tk.Tokenizer(tk.models.WordPiece(vocab=vocab, unk_token=unk, max_input_chars_per_word=10 ** 9))
    lowercase = bool(file.get("tokenizer.ggml.normalizer.lowercase", True))
    strip = bool(file.get("tokenizer.ggml.normalizer.strip_accents", lowercase))
    tok.normalizer = tk.normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                   strip_accents=strip, lowercase=lowercase)
    tok.pre_tokenizer = tk.pre_tokenizers.BertPreTokenizer()
    tok.decoder = tk.decoders.WordPiece()
    return _add_special(tok, tokens, types)


# ---------------------------------------------------------------- the chat template

def chat_template(file):
    """The file's chat templates (tokenizer.chat_template, and tokenizer.chat_template.<name> for
    each name tokenizer.chat_templates lists, e.g. tool_use) as a ChatTemplate that writes the
    file's special tokens; None without a template."""
    source = file.get("tokenizer.chat_template", None)
    if source is None:
        return None
    from .chat_template import ChatTemplate

    named = {name: file.get(f"tokenizer.chat_template.{name}")
             for name in file.get("tokenizer.chat_templates", [])
             if f"tokenizer.chat_template.{name}" in file.meta}
    tokens = file.get("tokenizer.ggml.tokens")
    special = {}
    for name, key in SPECIAL_TOKEN_KEYS:
        i = file.get(f"tokenizer.ggml.{key}", None)
        if i is not None and 0 <= int(i) < len(tokens):
            special[name] = tokens[int(i)]
    return ChatTemplate(source, special, named)


# the names a template knows the special tokens by (transformers' special_tokens_map), and the
# GGUF key of each one's id
SPECIAL_TOKEN_KEYS = (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                      ("unk_token", "unknown_token_id"), ("sep_token", "seperator_token_id"),
                      ("pad_token", "padding_token_id"), ("mask_token", "mask_token_id"))
