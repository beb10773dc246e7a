"""A GGUF file's header (metadata and tensor table) parsed straight from its memory map.

The gguf package's GGUFReader makes a NumPy view of every part of every field: for a vocabulary of
262,144 pieces with scores and types that is over a million views and 13 s here, while the whole
header is 6 MB. This reads it with struct in one pass (0.2 s) and leaves the tensors as views of the
map. Layout (little-endian): "GGUF", version u32 (2 or 3), tensor count u64, key count u64; each key
a string (u64 length, UTF-8) with a u32 value type and its value (an array: item type u32, count u64,
items); each tensor its name, u32 rank, u64 dims (fastest first), u32 ggml type, u64 offset from the
data section, which starts at the next multiple of general.alignment (32 unless set).
"""
import mmap
import struct
from dataclasses import dataclass

import numpy as np

# value type -> (struct format, numpy dtype) of the fixed-size scalars
_SCALARS = {0: ("<B", np.uint8), 1: ("<b", np.int8), 2: ("<H", np.uint16), 3: ("<h", np.int16),
            4: ("<I", np.uint32), 5: ("<i", np.int32), 6: ("<f", np.float32), 7: ("<?", np.bool_),
            10: ("<Q", np.uint64), 11: ("<q", np.int64), 12: ("<d", np.float64)}
_STRING, _ARRAY = 8, 9
# ggml types whose tensors are plain arrays (the rest are blocks of bytes, (rows, bytes a row))
_PLAIN = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
          "I32": np.int32, "I64": np.int64}


@dataclass(frozen=True)
class Tensor:
    """One tensor of the table: .data is a read-only view of the map in numpy's axis order (a block
    type's as uint8 (..., rows, bytes a row), as gguf's reader gives it); shape is ggml's order."""
    name: str
    tensor_type: object  # gguf.GGMLQuantizationType
    shape: tuple
    n_elements: int
    n_bytes: int
    data_offset: int
    data: np.ndarray


class _Cursor:
    """Reads little-endian values from the map at a moving offset; running off the end is an error."""

    def __init__(self, buf):
        self.buf, self.at = buf, 0

    def take(self, fmt):
        try:
            (value,) = struct.unpack_from(fmt, self.buf, self.at)
        except struct.error:
            raise ValueError(f"the header ends inside a value at byte {self.at}") from None
        self.at += struct.calcsize(fmt)
        return value

    def string(self):
        n = self.take("<Q")
        if self.at + n > len(self.buf):
            raise ValueError(f"a string of {n} bytes at byte {self.at} runs past the end of the file")
        s = self.buf[self.at:self.at + n].decode("utf-8", "replace")
        self.at += n
        return s

    def value(self, kind):
        if kind in _SCALARS:
            return self.take(_SCALARS[kind][0])
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise ValueError(f"unknown value type {kind} at byte {self.at - 4}")
        item, n = self.take("<I"), self.take("<Q")
        if item in _SCALARS:  # one frombuffer for the whole array (scores, token types)
            fmt, dtype = _SCALARS[item]
            size = struct.calcsize(fmt) * n
            if self.at + size > len(self.buf):
                raise ValueError(f"an array of {n} values at byte {self.at} runs past the end of the file")
            out = np.frombuffer(self.buf, dtype, n, self.at).tolist()
            self.at += size
            return out
        if item == _STRING:
            return self.strings(n)
        return [self.value(item) for _ in range(n)]

    def strings(self, n):
        """n strings in a row (a vocabulary's pieces, its merges): one tight loop, for 777k of them."""
        buf, at, end, out = self.buf, self.at, len(self.buf), []
        length = struct.Struct("<Q").unpack_from
        append = out.append
        try:
            for _ in range(n):
                (size,) = length(buf, at)
                at += 8
                if at + size > end:
                    raise ValueError(f"a string of {size} bytes at byte {at} runs past the end of the file")
                append(buf[at:at + size].decode("utf-8", "replace"))
                at += size
        except struct.error:
            raise ValueError(f"the header ends inside a value at byte {at}") from None
        self.at = at
        return out


def read(path, gguf):
    """(version, meta {key: value}, tensors {name: Tensor}) of the file at path; a ValueError on a
    malformed header. gguf: the gguf package (its type table)."""
    with open(path, "rb") as f:
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:
            raise ValueError("the file is empty") from None
    cur = _Cursor(buf)
    if buf[:4] != b"GGUF":
        raise ValueError(f"the magic is {bytes(buf[:4])!r}, not b'GGUF'")
    cur.at = 4
    version = cur.take("<I")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} (silkattn reads versions 2 and 3, little-endian)")
    n_tensors, n_keys = cur.take("<Q"), cur.take("<Q")
    meta = {}
    for _ in range(n_keys):
        key = cur.string()
        meta[key] = cur.value(cur.take("<I"))
    table = []
    for _ in range(n_tensors):
        name, rank = cur.string(), cur.take("<I")
        dims = tuple(cur.take("<Q") for _ in range(rank))
        table.append((name, dims, cur.take("<I"), cur.take("<Q")))
    align = int(meta.get("general.alignment", 32))
    start = -(-cur.at // align) * align
    return version, meta, _tensors(table, start, buf, gguf)


def _tensors(table, start, buf, gguf):
    whole = np.frombuffer(buf, np.uint8)
    out = {}
    for name, dims, raw, offset in table:
        if name in out:
            raise ValueError(f"tensor {name} is listed twice")
        try:
            kind = gguf.GGMLQuantizationType(raw)
        except ValueError:
            raise ValueError(f"tensor {name} has ggml type {raw}, unknown to the gguf package") from None
        block, size = gguf.GGML_QUANT_SIZES[kind]
        n = int(np.prod(dims, dtype=np.int64)) if dims else 1
        if dims and dims[0] % block:
            raise ValueError(f"tensor {name}: rows of {dims[0]} are not whole blocks of {block} "
                             f"({kind.name})")
        n_bytes, at = n // block * size, start + offset
        if at + n_bytes > len(whole):
            raise ValueError(f"truncated: tensor {name} ends at byte {at + n_bytes}, "
                             f"the file has {len(whole)}")
        np_dims = tuple(reversed(dims))
        if kind.name in _PLAIN:
            data = whole[at:at + n_bytes].view(_PLAIN[kind.name]).reshape(np_dims)
        else:
            data = whole[at:at + n_bytes].reshape(np_dims[:-1] + (dims[0] // block * size,))
        out[name] = Tensor(name, kind, dims, n, n_bytes, at, data)
    return out
