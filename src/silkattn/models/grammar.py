"""Structured output: a sequence's tokens held to a JSON schema while it decodes, by a token mask
from llguidance (pip install "silkattn[serve]" brings it; no torch).

    grammar = compile_schema(model, {"type": "object", ...})   # ValueError naming what is wrong
    constraint = Constraint(model, grammar)                     # one per sequence
    logits = constraint.masked(logits)                          # the tokens the grammar allows
    constraint.advance(token)                                   # after sampling

The matcher reads the vocabulary as bytes: each token's bytes from the file's own arrays
(token_bytes: byte-level BPE's pieces mapped back to bytes, SentencePiece's U+2581 as a space and
its <0xXX> pieces as bytes), control tokens marked as llguidance marks them (a 0xFF byte in front),
the text tokenized by the model's own tokenizer. A schema is compiled with bounded size and effort
(LIMITS, SCHEMA_BYTES); compile it off the thread that decodes, since a large one takes long.
"""
import json

import numpy as np

SCHEMA_BYTES = 64 * 1024  # the largest schema accepted, as JSON text
SPACE = "\u2581"


def _byte_decoder():  # GPT-2's byte-level alphabet: printable stand-ins -> the bytes they stand for
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    codes, n = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, codes)}


def token_bytes(file):  # -> [bytes], one per token id
    """Each token's bytes as it writes them: control tokens (and added ones written <like_this>)
    marked with a 0xFF byte in front, as llguidance takes special tokens."""
    kind = file.get("tokenizer.ggml.model")
    tokens = file.get("tokenizer.ggml.tokens")
    types = list(file.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    byte_of = _byte_decoder() if kind == "gpt2" else None
    if kind not in ("gpt2", "llama", "gemma4"):
        raise ValueError(f"{file.path}: structured output reads a vocabulary of kind gpt2, llama or gemma4; "
                         f"this one is {kind!r}")
    out = []
    for t, kind_of in zip(tokens, types):
        if kind_of == 3 or (kind_of == 4 and t.startswith("<") and t.endswith(">")):
            out.append(b"\xff" + t.encode("utf-8"))
        elif byte_of is not None and kind_of != 4:
            out.append(bytes(byte_of.get(c, 0) for c in t) if all(c in byte_of for c in t) else t.encode())
        elif kind_of == 6 and len(t) == 6 and t.startswith("<0x"):  # a byte piece
            out.append(bytes([int(t[3:5], 16)]))
        else:
            out.append(t.replace(SPACE, " ").encode("utf-8"))
    return out


class _Wrapper:  # what llguidance.TokenizerWrapper reads of a tokenizer
    def __init__(self, model, tokens):
        self.model, self.tokens = model, tokens
        self.eos_token_id, self.bos_token_id = model.eos_id, model.bos_id
        self.special_token_ids = [i for i, t in enumerate(tokens) if t.startswith(b"\xff")]

    def __call__(self, text):
        text = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text
        return self.model.tokenize(text)


def vocabulary(model):  # -> token_bytes of the model's file, read once and kept on the model
    made = getattr(model, "_token_bytes", None)
    if made is None:
        from . import gguf
        made = model._token_bytes = token_bytes(gguf.GGUFFile(model.path))
    return made


def tokenizer(model):  # -> llguidance.LLTokenizer for the model, made once and kept on it
    made = getattr(model, "_lltokenizer", None)
    if made is None:
        import llguidance
        wrapper = _Wrapper(model, vocabulary(model))
        made = llguidance.LLTokenizer(llguidance.TokenizerWrapper(wrapper), n_vocab=model.config.vocab,
                                      eos_token=model.eos_id)
        model._lltokenizer = made
    return made


def limits():
    import llguidance
    return llguidance.LLParserLimits(max_grammar_size=200_000, initial_lexer_fuel=2_000_000,
                                     step_lexer_fuel=200_000, step_max_items=50_000, max_lexer_states=100_000)


def compile_schema(model, schema):  # -> the grammar (llguidance's JSON text)
    """The grammar of JSON documents that `schema` (a JSON schema, a dict) allows: ValueError naming
    what is wrong for a schema that is too large, that llguidance refuses, or a model without an
    end-of-text token."""
    import llguidance
    if not isinstance(schema, dict):
        raise ValueError(f"the JSON schema must be an object, got {type(schema).__name__}")
    text = json.dumps(schema)
    if len(text) > SCHEMA_BYTES:
        raise ValueError(f"the JSON schema is {len(text)} bytes; at most {SCHEMA_BYTES} are accepted")
    if model.eos_id is None:
        raise ValueError(f"{model.path}: the model has no end-of-text token to end a structured answer")
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(text, defaults={"whitespace_flexible": False})
    except ValueError as e:
        raise ValueError(f"the JSON schema is not valid: {e}") from None
    error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer(model), limits=limits())
    if error and not error.startswith("WARNING"):
        raise ValueError(f"the JSON schema is not supported: {error}")
    return grammar


class Constraint:
    """One sequence's matcher over a compiled grammar: masked() keeps the logits of the tokens the
    grammar allows next (the others -inf), advance() takes the token sampled."""

    def __init__(self, model, grammar):
        import llguidance
        self.matcher = llguidance.LLMatcher(tokenizer(model), grammar, log_level=0, limits=limits())
        if self.matcher.is_error():
            raise ValueError(f"the grammar is not supported: {self.matcher.get_error()}")
        self.vocab = model.config.vocab

    def masked(self, logits):  # (vocab,) -> a copy with the disallowed tokens at -inf
        bits = np.frombuffer(self.matcher.compute_bitmask(), np.uint8)
        allowed = np.unpackbits(bits, bitorder="little")[:self.vocab].astype(bool)
        if self.matcher.is_error():
            raise RuntimeError(f"structured output failed: {self.matcher.get_error()}")
        return np.where(allowed, logits, -np.inf).astype(logits.dtype, copy=False)

    def advance(self, token):
        if not self.matcher.consume_token(int(token)):
            raise RuntimeError(f"structured output failed: {self.matcher.get_error()}")
