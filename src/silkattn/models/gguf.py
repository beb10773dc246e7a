"""GGUF files (llama.cpp's format): the header parsed by _gguf_header (the gguf package gives the
type table and the float dequantize), the metadata, the tensors dequantized to float32, the
tokenizers (byte-level BPE built with the `tokenizers` package from the file's vocabulary and
merges; SentencePiece in tokenizer.py) and the chat template (rendered with jinja2).

Optional extra: pip install "silkattn[llm]". Every reader error is a ValueError that names the
file and what it found there.
"""
import datetime
import json
import os

import numpy as np

from . import _gguf_header

# the tensor types load() reads: floats, 32-weight blocks with fp16 scales (Q*_0; Q*_1 add a min) and
# the K-quants' super-blocks of 256 (silkattn.reference.dequantize gives every layout)
TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")

# tokenizer.ggml.pre -> how the text is split before byte-level BPE (the regexes llama.cpp names
# for each pre-tokenizer; "smollm" and its kin split digits one by one first)
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS = {"gpt2": ("whole", GPT2_SPLIT), "default": ("whole", GPT2_SPLIT),
                  "smollm": ("digits", GPT2_SPLIT), "starcoder": ("digits", GPT2_SPLIT),
                  "refact": ("digits", GPT2_SPLIT), "llama-bpe": ("whole", LLAMA3_SPLIT),
                  "llama3": ("whole", LLAMA3_SPLIT)}
CONTROL, USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values of special and added tokens


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
    text that id completes. Byte-level BPE (tokenizer.ggml.model "gpt2") or SentencePiece ("llama")."""
    kind = file.get("tokenizer.ggml.model")
    if kind == "llama":
        from . import sentencepiece
        return sentencepiece.from_gguf(file)
    if kind != "gpt2":
        raise ValueError(f"{file.path}: tokenizer.ggml.model {kind!r} is neither a byte-level BPE "
                         "(\"gpt2\") nor a SentencePiece vocabulary (\"llama\"), the kinds silkattn builds")
    return BytePair(_bpe(file))


class BytePair:
    """A tokenizers.Tokenizer behind the interface tokenizer() gives."""

    def __init__(self, tok):
        self.tok = tok

    def encode(self, text, special=True):
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self.tok.encode(text, add_special_tokens=False).ids

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


def _bpe(file):
    """A tokenizers.Tokenizer from the file's byte-level BPE: its tokens, merges and pre-tokenizer,
    the control tokens as special tokens."""
    try:
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    except ImportError as e:
        raise ImportError("the GGUF tokenizer needs the tokenizers package: "
                          "pip install \"silkattn[llm]\"") from e
    pre = file.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"{file.path}: unknown pre-tokenizer {pre!r} "
                         f"(silkattn knows {', '.join(PRE_TOKENIZERS)})")
    tokens, merges = list(file.get("tokenizer.ggml.tokens")), list(file.get("tokenizer.ggml.merges"))
    types = list(file.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    vocab = {token: i for i, token in enumerate(tokens)}
    bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges], fuse_unk=False)
    tok = Tokenizer(bpe)
    digits, split = PRE_TOKENIZERS[pre]
    steps = [pre_tokenizers.Digits(individual_digits=True)] if digits == "digits" else []
    steps += [pre_tokenizers.Split(Regex(split), behavior="isolated"),
              pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, t in enumerate(types) if t == CONTROL])
    tok.add_tokens([AddedToken(tokens[i], normalized=False)
                    for i, t in enumerate(types) if t == USER_DEFINED])
    return tok


# ---------------------------------------------------------------- the chat template

def chat_template(file):
    """The file's chat template (tokenizer.chat_template) as a render(messages, add_generation_prompt)
    function, in the jinja2 environment transformers renders templates in; None without a template."""
    source = file.get("tokenizer.chat_template", None)
    if source is None:
        return None
    try:
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as e:
        raise ImportError("chat templates need jinja2: pip install \"silkattn[llm]\"") from e

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    template = env.from_string(source)
    tokens = file.get("tokenizer.ggml.tokens")
    special = {name: tokens[file.meta[f"tokenizer.ggml.{name}_id"]] for name in ("bos_token", "eos_token")
               if f"tokenizer.ggml.{name}_id" in file.meta}

    def render(messages, add_generation_prompt=True, **extra):
        return template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               **special, **extra)
    return render
