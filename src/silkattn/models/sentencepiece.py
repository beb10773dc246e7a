"""SentencePiece tokenizers from a GGUF file (tokenizer.ggml.model "llama": Llama 2, Mistral, Gemma).

The file holds the pieces, a score for each and a type (normal, unknown, control, user-defined,
unused, byte). Encoding, as llama.cpp encodes these files (so that the ids are token for token
llama.cpp's):
- the text is first cut at the special pieces written in it, the longest first: user-defined pieces
  (Gemma's runs of newlines, its "<start_of_turn>" is control) always, control pieces when
  `special` (silkattn matches them, as its byte-level BPE does);
- each remaining run of text gets a leading space if add_space_prefix and it follows a special piece
  or starts the text, its spaces become "\u2581", and it is split into characters;
- of all adjacent pairs whose joined text is a piece, the one with the highest score is joined (the
  leftmost of equal scores), again and again until no pair is a piece;
- a character that is not a piece is written as its UTF-8 bytes, pieces "<0xXX>" (byte fallback).
The `tokenizers` package has no model for this (its BPE ranks pairs, not the joined piece's score,
and converting the scores to merges is what takes transformers 44 s for Gemma's 262,144 pieces);
this builds in 0.1 s from the file's arrays.
"""
import heapq
import re

import numpy as np

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"
PARTS_KEPT = 1 << 16  # the parts of texts whose pieces encode() keeps (a few MiB)


class SentencePiece:
    """encode(text, special=True) -> list of ids; decode(ids, skip_special_tokens=False) -> str;
    stream() -> a decoder whose step(id) returns the text that id completes."""

    def __init__(self, pieces, scores, types, add_space_prefix=True, unknown_id=None):
        n = len(pieces)
        if not (len(scores) == len(types) == n):
            raise ValueError(f"{n} pieces with {len(scores)} scores and {len(types)} types")
        self.pieces, self.scores = list(pieces), np.asarray(scores, np.float64).tolist()
        self.types, self.add_space_prefix, self.unknown_id = list(types), add_space_prefix, unknown_id
        self.ids = {p: i for i, p in enumerate(self.pieces)}  # a repeated piece: its last id, as llama.cpp
        self._bytes = [self.ids.get(f"<0x{b:02X}>", unknown_id) for b in range(256)]
        specials = [i for i, t in enumerate(self.types) if t in (CONTROL, USER_DEFINED, UNKNOWN)]
        specials.sort(key=lambda i: -len(self.pieces[i].encode()))  # the longest first, ties by id
        self._specials = [(self.pieces[i], i, self.types[i] == USER_DEFINED) for i in specials
                          if self.pieces[i]]
        # Where a run can be cut with no join lost: before a "\u2581" whose left neighbour ends no
        # piece's text before an inner "\u2581" (Llama 2's and Phi-3's pieces hold none; Gemma 3's
        # one, ">\u2581</"). No pair across such a cut is ever a piece, so each part joins alone as
        # it would in the whole, and a part seen before is looked up (a text's words repeat).
        before = {p[k - 1] for p in self.pieces for k in range(1, len(p)) if p[k] == SPACE} | {SPACE}
        self._cut = re.compile(f"(?<![{re.escape(''.join(sorted(before)))}])(?={SPACE})")
        self._parts = {}

    def encode(self, text, special=True):
        """The ids of text (no BOS or EOS): see the module's docstring."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        out, after_special = [], True
        for part in self._partition(text, special):
            if isinstance(part, int):
                out.append(part)
                after_special = True
                continue
            if self.add_space_prefix and after_special:
                part = " " + part
            for piece in self._cut.split(part.replace(" ", SPACE)):
                ids = self._parts.get(piece)
                if ids is None:
                    if len(self._parts) >= PARTS_KEPT:
                        self._parts.clear()
                    ids = self._parts[piece] = []
                    self._merge(piece, ids)
                out.extend(ids)
            after_special = False
        return out

    def _partition(self, text, special):
        """text cut at the special pieces: a list of str (text) and int (a special piece's id)."""
        parts = [text] if text else []  # the empty text is no tokens, not the space prefix's
        for piece, i, user in self._specials:
            if not (user or special):
                continue
            cut = []
            for part in parts:
                if isinstance(part, int) or piece not in part:
                    cut.append(part)
                    continue
                for k, run in enumerate(part.split(piece)):
                    cut.extend(([i] if k else []) + ([run] if run else []))
            parts = cut
        return parts

    def _merge(self, text, out):
        """The pieces of one run of text, appended to out: the highest-scoring pair joined first."""
        n, ids, scores = len(text), self.ids, self.scores
        start, size = list(range(n)), [1] * n  # symbol k covers text[start[k]:][:size[k]]
        prev, nxt = list(range(-1, n - 1)), list(range(1, n + 1))
        nxt[-1:] = [-1]
        heap = []

        def pair(a, b):  # a and b adjacent symbols; queue their join if it is a piece
            if a >= 0 and b >= 0:
                joined = text[start[a]:start[a] + size[a] + size[b]]
                t = ids.get(joined)
                if t is not None:
                    heap.append((-scores[t], a, b, len(joined)))

        for k in range(1, n):
            pair(k - 1, k)
        heapq.heapify(heap)
        while heap:
            _, a, b, length = heapq.heappop(heap)
            if not size[a] or not size[b] or size[a] + size[b] != length:
                continue  # one side was joined elsewhere since this pair was queued
            size[a], size[b] = length, 0
            nxt[a] = nxt[b]
            if nxt[b] >= 0:
                prev[nxt[b]] = a
            for x, y in ((prev[a], a), (a, nxt[a])):
                if x >= 0 and y >= 0:
                    joined = text[start[x]:start[x] + size[x] + size[y]]
                    t = ids.get(joined)
                    if t is not None:
                        heapq.heappush(heap, (-scores[t], x, y, len(joined)))
        k = 0 if n else -1
        while k >= 0:
            piece = text[start[k]:start[k] + size[k]]
            t = ids.get(piece)
            out.extend([t] if t is not None else [self._bytes[b] for b in piece.encode()])
            k = nxt[k]

    def piece_bytes(self, i, skip_special_tokens=False):
        """The bytes token i stands for: a byte piece its byte, "\u2581" a space, a control piece its
        text (nothing if skip_special_tokens)."""
        kind, piece = self.types[i], self.pieces[i]
        if kind == BYTE:
            return bytes([int(piece[3:5], 16)])
        if kind == CONTROL and skip_special_tokens:
            return b""
        return (piece.replace(SPACE, " ") if kind in (NORMAL, UNUSED) else piece).encode()

    def decode(self, ids, skip_special_tokens=False):
        """The text of ids (bytes that are not whole UTF-8 characters as replacement characters;
        the leading space add_space_prefix put there taken off)."""
        text = b"".join(self.piece_bytes(self._id(i), skip_special_tokens) for i in ids).decode(
            "utf-8", "replace")
        return text[1:] if self.add_space_prefix and text[:1] == " " else text

    def _id(self, i):
        i = int(i)
        if not 0 <= i < len(self.pieces):
            raise ValueError(f"token id {i} is outside the vocabulary of {len(self.pieces)}")
        return i

    def stream(self, skip_special_tokens=False):
        return _Stream(self, skip_special_tokens)


class _Stream:
    """Decoding one id at a time: the bytes of a character split across tokens wait until it is whole."""

    def __init__(self, sp, skip_special_tokens):
        self.sp, self.skip, self.held = sp, skip_special_tokens, b""

    def step(self, i):  # -> str or None
        data = self.held + self.sp.piece_bytes(self.sp._id(i), self.skip)
        cut = len(data)
        for back in range(1, min(4, len(data)) + 1):  # a lead byte whose character is not yet whole
            b = data[-back]
            if b & 0xC0 != 0x80:
                need = 2 if b >> 5 == 6 else 3 if b >> 4 == 14 else 4 if b >> 3 == 30 else 1
                cut = len(data) - back if need > back else len(data)
                break
        self.held = data[cut:]
        text = data[:cut].decode("utf-8", "replace")
        return text or None


def from_gguf(file):
    """The SentencePiece of a GGUF file's tokenizer.ggml.* arrays."""
    tokens = file.get("tokenizer.ggml.tokens")
    scores = file.get("tokenizer.ggml.scores", None)
    if scores is None:
        raise ValueError(f"{file.path}: a SentencePiece vocabulary (tokenizer.ggml.model 'llama') "
                         "without tokenizer.ggml.scores")
    types = file.get("tokenizer.ggml.token_type", [NORMAL] * len(tokens))
    try:
        return SentencePiece(tokens, scores, types, bool(file.get("tokenizer.ggml.add_space_prefix", True)),
                             file.get("tokenizer.ggml.unknown_token_id", None))
    except ValueError as e:
        raise ValueError(f"{file.path}: tokenizer.ggml arrays: {e}") from None
