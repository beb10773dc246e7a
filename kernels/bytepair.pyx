"""Byte-level BPE for the Llama 3 and Qwen2 pre-tokenizers (kernels/bytepair.h): the text cut into
pieces by their regular expression, each piece a token whole (ignore_merges) or its bytes merged by
rank. Not an op: silkattn.models.gguf builds it beside a `tokenizers` tokenizer and checks its input."""
from libc.stdint cimport int32_t, int64_t, uint8_t

import numpy as np

cdef extern from "bytepair.h" nogil:
    ctypedef struct sa_bytepair:
        pass
    int SA_BP_CODEPOINTS
    int sa_bytepair_init(sa_bytepair *m, const uint8_t *bytes, const int64_t *offset, const int32_t *id,
                         int64_t n_tokens, const int32_t *left, const int32_t *right, const int32_t *merged,
                         int64_t n_merges, const uint8_t *flags, int digits, int ignore_merges)
    void sa_bytepair_free(sa_bytepair *m)
    int64_t sa_bytepair_encode(const sa_bytepair *m, const uint8_t *text, int64_t n, int32_t *out)

CODEPOINTS = SA_BP_CODEPOINTS


cdef class BytePair:
    """BytePair(token_bytes, offsets, ids, left, right, merged, flags, digits, ignore_merges):
    token e's bytes are token_bytes[offsets[e]:offsets[e + 1]] and its id ids[e]; merge r joins the
    tokens left[r] and right[r] into merged[r] at rank r; flags: a byte per code point (1 letter,
    2 number, 4 white space). The caller checks that ids are in range and every byte has a token."""
    cdef sa_bytepair m
    cdef bint ready
    cdef object flags  # the C tables point into it

    def __cinit__(self, const uint8_t[::1] token_bytes, const int64_t[::1] offsets, const int32_t[::1] ids,
                  const int32_t[::1] left, const int32_t[::1] right, const int32_t[::1] merged,
                  const uint8_t[::1] flags, int digits, bint ignore_merges):
        n_tokens, n_merges = ids.shape[0], left.shape[0]
        if offsets.shape[0] != n_tokens + 1 or offsets[0] != 0 or offsets[n_tokens] > token_bytes.shape[0]:
            raise ValueError("offsets must have one entry more than ids, from 0 to within token_bytes")
        if any(offsets[e] > offsets[e + 1] for e in range(n_tokens)):
            raise ValueError("offsets must not decrease")
        if right.shape[0] != n_merges or merged.shape[0] != n_merges:
            raise ValueError("left, right and merged must have one length")
        if flags.shape[0] != SA_BP_CODEPOINTS:
            raise ValueError(f"flags must have {SA_BP_CODEPOINTS} entries, got {flags.shape[0]}")
        if digits < 1:
            raise ValueError(f"digits must be >= 1, got {digits}")
        self.flags = flags
        cdef int rc = sa_bytepair_init(&self.m, &token_bytes[0] if token_bytes.shape[0] else NULL,
                                       &offsets[0], &ids[0] if n_tokens else NULL, n_tokens,
                                       &left[0] if n_merges else NULL, &right[0] if n_merges else NULL,
                                       &merged[0] if n_merges else NULL, n_merges, &flags[0], digits,
                                       ignore_merges)
        if rc == -1:
            raise MemoryError("the byte-pair tables")
        if rc == -2:
            raise ValueError("every single byte must have a token")
        self.ready = True

    def __dealloc__(self):
        if self.ready:
            sa_bytepair_free(&self.m)

    def encode(self, const uint8_t[::1] text):
        """UTF-8 bytes (valid: str.encode's) -> int32 ids."""
        cdef int64_t n = text.shape[0], count
        out = np.empty(max(n, 1), np.int32)
        cdef int32_t[::1] o = out
        with nogil:
            count = sa_bytepair_encode(&self.m, &text[0] if n else NULL, n, &o[0])
        if count < 0:
            raise MemoryError(f"encoding {n} bytes")
        return out[:count]
