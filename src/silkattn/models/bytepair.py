"""The compiled encoder of byte-level BPE vocabularies whose pre-tokenizer is Llama 3's regular
expression or Qwen2's (pretokenizers.LLAMA3, QWEN2: 23 of the names llama.cpp knows, the
Llama 3, Qwen2/2.5/3 and GLM files among them). It gives the ids the `tokenizers` package gives for
the same vocabulary (the tests compare the two on the suite's texts and on random ones), at about a
fifth of its time; other vocabularies, and an install without the compiled modules, keep `tokenizers`.

A text is cut first at the vocabulary's added tokens, found leftmost-longest as `tokenizers` finds
them (a control token is taken only when `special`, else spelt out as text); each run between them
is encoded by silkattn._cy.bytepair (kernels/bytepair.h). Letters and numbers are Unicode's
categories L* and N* as Python's unicodedata gives them; white space is Unicode's White_Space."""
import re
import unicodedata

import numpy as np

from .. import _cache, tools
from .pretokenizers import LLAMA3, QWEN2

DIGITS = {LLAMA3: 3, QWEN2: 1}  # the longest run of digits a piece takes
_WHITE_SPACE = [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029,
                0x202F, 0x205F, 0x3000]


def flags():
    """A byte per code point: 1 a letter, 2 a number, 4 white space (kernels/bytepair.h's flags)."""
    return _cache.get(("bytepair.flags", unicodedata.unidata_version), _flags)


def _flags():
    major = "".join(unicodedata.category(chr(c))[0] for c in range(0x110000)).encode("ascii")
    major = np.frombuffer(major, np.uint8)
    table = np.where(major == ord("L"), 1, np.where(major == ord("N"), 2, 0)).astype(np.uint8)
    table[_WHITE_SPACE] |= 4
    return table


def _byte_chars():
    """GPT-2's byte-level alphabet, char -> byte as str.translate takes it: the printable bytes stand
    for themselves, the others for U+0100 on; any other char maps to U+FFFF, which latin-1 refuses."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    table = {b: 0xFFFF for b in others}
    table.update({b: b for b in printable})
    table.update({0x100 + k: b for k, b in enumerate(others)})
    return table


_BYTE_CHARS = _byte_chars()


def _token_bytes(tokens):
    """The bytes each token stands for, None for a token outside the byte-level alphabet (no text
    reaches it)."""
    table, out = _BYTE_CHARS, []
    for t in tokens:
        try:
            out.append(t.translate(table).encode("latin-1"))
        except UnicodeEncodeError:
            out.append(None)
    return out


class Encoder:
    """encode(text, special) -> a list of ids, as the `tokenizers` tokenizer of the same file."""

    def __init__(self, native, added, control):
        self.native, self.control = native, control
        # longest first: Python's leftmost alternative at a position is then the longest token there
        alternatives = sorted(added, key=lambda t: (-len(t), t))
        self.added = added
        self.pattern = re.compile("|".join(map(re.escape, alternatives))) if alternatives else None

    def _pieces(self, text, out):
        if text:
            out.extend(self.native.encode(text.encode("utf-8")).tolist())

    def encode(self, text, special):
        if self.pattern is None:
            return self.native.encode(text.encode("utf-8")).tolist()
        out, start = [], 0
        for match in self.pattern.finditer(text):
            token = match.group()
            if token in self.control and not special:
                continue  # spelt out: left in the text between added tokens
            self._pieces(text[start:match.start()], out)
            out.append(self.added[token])
            start = match.end()
        self._pieces(text[start:], out)
        return out


def encoder(pre, tokens, types, vocab, merges, control_type, user_type):
    """The compiled encoder of a vocabulary (tokens, their types, vocab: token -> id as the
    `tokenizers` BPE model takes it, a repeated token its last id; merges as pairs of token strings)
    whose pre-tokenizer is `pre`, or None where it does not apply: another pre-tokenizer, no compiled
    modules, or a byte without its token."""
    native = tools.bytepair()
    if native is None or len(pre.regexes) != 1 or pre.regexes[0] not in DIGITS:
        return None
    raw = _token_bytes(vocab)
    keep = [k for k, b in enumerate(raw) if b is not None]
    offsets = np.zeros(len(keep) + 1, np.int64)
    np.cumsum([len(raw[k]) for k in keep], out=offsets[1:])
    id_of = np.fromiter(vocab.values(), np.int32, len(vocab))[keep]
    # a merge whose parts or result is not a token: `tokenizers` refuses the file before this is built
    left, right, merged = (np.array(ids_, np.int32).reshape(-1) for ids_ in (
        [vocab[a] for a, _ in merges], [vocab[b] for _, b in merges], [vocab[a + b] for a, b in merges]))
    try:
        model = native.BytePair(np.frombuffer(b"".join(raw[k] for k in keep), np.uint8), offsets, id_of,
                                left, right, merged, flags(), DIGITS[pre.regexes[0]], pre.ignore_merges)
    except ValueError:  # a byte without its token
        return None
    added = {t: i for i, (t, kind) in enumerate(zip(tokens, types)) if kind in (control_type, user_type)}
    control = {t for t, i in added.items() if types[i] == control_type}
    return Encoder(model, added, control)
