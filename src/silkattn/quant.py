"""Matrices kept as the GGUF weight blocks they are stored in (silkattn.reference.dequantize gives
the layouts): ops.linear(X, W) reads such a W's 4.5 to 8.5 bits a weight where a float32 copy
would be 32, which is what a decoding step's speed depends on. The ROW_KINDS have few-row product
kernels (a decoding step's) and the fused step's; every kind has the GEMM path's dequantize.
"""
import dataclasses
import mmap

import numpy as np

from . import _aligned
from . import reference as ref

KINDS = tuple(ref.QUANT_BLOCKS)  # the block types; a kind's index is its code in the kernel contract
# the kinds with few-row product kernels and the fused step's; the others run a product as
# dequantized panels of W into a GEMM (ops.linear's prefill path), whatever the rows
ROW_KINDS = tuple(ref.QUANT_BYTES)
# the kinds with a layout in groups of 16 rows for the int8 decoding kernels (QuantizedMatrix.rows16,
# kernels/rows16.h): a backend's layouts of a file's blocks, with kernel-contract codes of their own
ROWS16 = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K")
ACTIVATIONS = ("float32", "int8")  # what a product with the matrix does to X first (QuantizedMatrix)


@dataclasses.dataclass(frozen=True, eq=False)
class QuantizedMatrix:
    """The (k, n) float32 matrix W = dequantize(blocks, kind).T, held as its blocks.

    kind: one of KINDS (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 blocks of 32 weights; the K-quants Q4_K, Q5_K,
    Q6_K of 256); blocks: C-contiguous uint8 (n, k / block weights * block bytes), row j the
    blocks of W's column j, exactly as a GGUF file stores an (n, k) matrix (a read-only memory map
    of the file will do: it is never copied). W's shape is (k, n), so ops.linear(X, W) is X W as
    for a float W of that shape: the file's (out, in) matrix applied to rows of X.

    activations: what ops.linear(X, W) multiplies. "float32": X as it is. "int8": round_q8(X,
    Q8_BLOCK[kind]) (silkattn.reference: X a block of 32 at a time as 8-bit integers times a scale,
    256 for the K-quants, as llama.cpp's Q8_0 and Q8_K), as llama.cpp's
    dot products take their activations, so that the kernels multiply bytes by bytes (integer
    dot-product instructions) instead of converting every weight to float; a slightly different
    product, measured in perplexity (bench/perplexity.py). dataclasses.replace(W, activations=...)
    shares the blocks.
    """

    kind: str
    blocks: np.ndarray
    activations: str = "float32"

    def __post_init__(self):
        if not isinstance(self.kind, str):
            raise TypeError(f"kind must be a str, one of {', '.join(KINDS)}, got {type(self.kind).__name__}")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        b = self.blocks
        if not isinstance(b, np.ndarray):
            raise TypeError(f"blocks must be a numpy.ndarray of uint8, got {type(b).__name__}")
        if b.dtype != np.uint8:
            raise TypeError(f"blocks must be uint8 (the file's bytes), got dtype {b.dtype}")
        if b.ndim != 2:
            raise ValueError(f"blocks must be 2-D (n, k / {self.block_weights} * {self.block_bytes}), "
                             f"got shape {b.shape}")
        if b.shape[1] % self.block_bytes:
            raise ValueError(f"blocks' rows must be whole {self.kind} blocks of {self.block_bytes} bytes, "
                             f"got rows of {b.shape[1]} bytes")
        if not b.flags.c_contiguous:
            raise ValueError("blocks must be C-contiguous (as the file stores them)")
        if not isinstance(self.activations, str):
            raise TypeError(f"activations must be a str, one of {', '.join(ACTIVATIONS)}, "
                            f"got {type(self.activations).__name__}")
        if self.activations not in ACTIVATIONS:
            raise ValueError(f"activations must be one of {', '.join(ACTIVATIONS)}, got {self.activations!r}")

    @classmethod
    def from_blocks(cls, kind, blocks, activations="float32"):
        """The matrix of `blocks` (checked, not copied): e.g. from_blocks(t.tensor_type.name, t.data)
        for a tensor t of the gguf package's reader."""
        return cls(kind, blocks, activations)

    @classmethod
    def from_float(cls, W, activations="int8", *, name="W"):
        """A float (k, n) matrix W (silkattn's layout: X W) quantized to Q8_0 blocks, 32 weights of a
        column a block (reference.quantize_q8_0, as llama.cpp writes them): a model's own matrices
        multiplied as 8-bit integers (activations "int8": the integer GEMM). k must be a multiple
        of 32 and W finite; `name` names W in the errors."""
        if not isinstance(W, np.ndarray) or W.dtype.kind != "f":
            raise TypeError(f"{name} must be a float numpy.ndarray, got "
                            f"{W.dtype if isinstance(W, np.ndarray) else type(W).__name__}")
        if W.ndim != 2 or W.shape[0] % 32 or not W.size:
            raise ValueError(f"{name} must be a non-empty (k, n) matrix with k a multiple of 32 (Q8_0 blocks "
                             f"of 32 weights), got shape {W.shape}")
        if not np.isfinite(W).all():
            raise ValueError(f"{name} holds a NaN or an infinity: it has no 8-bit scale")
        return cls("Q8_0", ref.quantize_q8_0(W.T), activations)

    @property
    def block_bytes(self):
        return ref.QUANT_BLOCKS[self.kind][1]

    @property
    def block_weights(self):
        return ref.QUANT_BLOCKS[self.kind][0]

    @property
    def q8(self):
        """True when products round X to 8 bits first (activations "int8")."""
        return self.activations == "int8"

    @property
    def code(self):
        """The kind's number in the kernel contract (silkattn._api): its index in KINDS."""
        return KINDS.index(self.kind)

    @property
    def shape(self):
        """(k, n): the shape of the float matrix it stands for."""
        return (self.blocks.shape[1] // self.block_bytes * self.block_weights, self.blocks.shape[0])

    @property
    def ndim(self):
        return 2

    @property
    def dtype(self):
        return np.dtype(np.float32)

    @property
    def nbytes(self):
        """Bytes of the blocks (what a product with it reads)."""
        return self.blocks.nbytes

    def rows16(self, pack):
        """(blocks, kind code) in groups of 16 rows for the int8 decoding kernels (kernels/rows16.h),
        made once by pack(blocks, code) (a backend's pack_rows16) and kept: None unless a ROWS16
        kind of int8 activations whose rows (n) are whole groups, its blocks read-only (a GGUF
        file's tensor is: a copy of blocks that can still change would go stale, so a writeable
        array is multiplied as it is, by the file layout's kernels). Where the blocks are a read-only
        file mapping (a GGUF file's tensor), their pages are then released: the backend's products,
        a prefill's GEMM too, read the copy, and whatever reads the blocks again has them back from
        the file, so the matrix stays in memory once."""
        if self.kind not in ROWS16 or not self.q8 or self.blocks.shape[0] % 16 or not self.blocks.size \
                or self.blocks.flags.writeable:
            return None
        packed = self.__dict__.get("_rows16")
        if packed is None:
            blocks, code = _pack_released(pack, self.blocks, self.code)
            blocks.flags.writeable = False
            packed = (blocks, code)
            object.__setattr__(self, "_rows16", packed)  # a cache: the matrix it stands for is unchanged
        return packed

    def dequantize(self):
        """W as a float32 (k, n) array: the reference's dequantize of the blocks, transposed (a view)."""
        return ref.dequantize(self.blocks, self.kind).T

    def __repr__(self):
        return (f"QuantizedMatrix({self.kind}, shape={self.shape}, {self.nbytes} bytes, "
                f"{self.activations} activations)")


PACK_BYTES = 1 << 22  # blocks packed at a time (whole groups of 16 rows), their file pages then released


def _pack_released(pack, blocks, code):
    """pack(blocks, code) a part of PACK_BYTES at a time, each part's file pages released once it is
    packed (_release_file_pages), so that a matrix read from a file is in memory about once while it
    is packed, not twice: the 1.1B model's Q6_K output head is 83 MB."""
    n, ldw = blocks.shape
    step = max(16, PACK_BYTES // ldw // 16 * 16)
    out, kind = _aligned.huge(blocks.shape, np.uint8), code
    for a in range(0, n, step):
        out[a:a + step], kind = pack(blocks[a:a + step], code)
        _release_file_pages(blocks[a:a + step])
    _release_file_pages(blocks)  # the pages across the parts' edges
    return out, kind


def _release_file_pages(a):
    """Drop from this process the whole pages of a read-only shared file mapping under array a (the
    kernel maps them in again from the file if a is read later). Nothing for any other memory: on
    anonymous or copy-on-write memory the same call would discard the data."""
    base = a
    while isinstance(base, (np.ndarray, memoryview)):  # views of views, np.frombuffer's memoryview
        base = base.base if isinstance(base, np.ndarray) else base.obj
    if not isinstance(base, mmap.mmap) or not memoryview(base).readonly or not hasattr(base, "madvise"):
        return
    start = np.frombuffer(base, np.uint8).ctypes.data
    lo, hi = a.ctypes.data, a.ctypes.data + a.nbytes
    lo, hi = -(-lo // mmap.PAGESIZE) * mmap.PAGESIZE, hi // mmap.PAGESIZE * mmap.PAGESIZE
    if start <= lo < hi <= start + len(base):
        base.madvise(mmap.MADV_DONTNEED, lo - start, hi - lo)
