"""linear with W a QuantizedMatrix (GGUF blocks) on every backend against the reference in float64,
X64 @ dequantize(blocks).T: the few-row kernel (linear_q) and numpy's matmul beyond it; and
reference.dequantize against the gguf package, bit for bit."""
import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest

import silkattn
from silkattn import reference as ref
from silkattn._api import FEW_ROWS, LINEAR_ROWS, Q8_ROWS
from silkattn.quant import KINDS, ROW_KINDS, ROWS16, QuantizedMatrix

from conftest import f64

# How far a result may stray from X64 W64 (W64: the reference's float32 weights in float64), as a
# number of roundings n times the unit u of the result's dtype, times the magnitude
# M = sum_i |x_i| (|d q_i| + |c|) + |b| (c: the block's offset, m for Q4_1, -8 d for Q4_0, none for
# Q8_0; the kernels add it as c sum(x)). A sum in which each term passes through at most n roundings
# is off by at most about n u M. The kernels' order: at most 32 roundings within a block (its
# products with x and their sum), its scale, k / 32 accumulating the blocks, at most 4 for the sum
# of a register's lanes, and a few for the offsets, the bias and the reference's own rounding of
# d q + m: n = k / 32 + 40. numpy's matmul (many rows, float64 X, the numpy backend) sums the k
# terms in an order of its own: n = k + 2.
UNIT = {np.dtype(np.float32): 2.0 ** -24, np.dtype(np.float64): 2.0 ** -53}


def roundings(k, kernel):
    return k // 32 + 40 if kernel else k + 2


def assert_close_q(actual, X, W, b, kernel):
    """actual against X64 W64 (+ b) within the bound above; its dtype is the result's. For
    W.activations "int8", X64 is reference.round_q8(X) (rounded in X's dtype, as the kernels do:
    the same 8-bit q), the bound the same: the kernels' integer sums are exact, and d_x d_w and
    the block's sum in float are two roundings where the reference's d_x q is one."""
    dtype = np.result_type(X, np.float32, *(() if b is None else (b,)))
    X64, W64 = f64(ref.round_q8(X) if W.q8 else X, W.dequantize())
    blocks = W.blocks.reshape(W.shape[1], -1, W.block_bytes)
    no_q = blocks.copy()
    no_q[..., 4 if W.kind == "Q4_1" else 2:] = 0  # q = 0: the blocks' offsets alone (-8 d for Q4_0)
    offsets = np.abs(ref.dequantize(no_q.reshape(W.blocks.shape), W.kind).T.astype(np.float64))
    # |d q| <= |w| + |c| for the 4-bit kinds (c = 0 for Q8_0)
    M = np.abs(X64) @ (np.abs(W64) + 2 * offsets) + (0 if b is None else np.abs(f64(b)[0]))
    expected = X64 @ W64 + (0 if b is None else f64(b)[0])
    assert isinstance(actual, np.ndarray) and actual.dtype == dtype, (type(actual), actual.dtype, dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    bound = roundings(X.shape[-1], kernel) * UNIT[dtype] * M
    err = np.abs(actual - expected)
    assert (err <= bound).all(), f"worst error {np.max(err / np.maximum(bound, 1e-300)):.3g} x the bound"


# where each kind's float16 fields are in its block (the rest is integer q and scales)
HALVES = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q4_K": (0, 2),
          "Q5_K": (0, 2), "Q6_K": (208,)}


def any_blocks(rng, kind, n, k, special=None):
    """(n, k / block weights * block bytes) blocks of any kind: random bytes, each float16 field of
    random sign and a magnitude log-uniform in (1e-3, 0.1), or drawn from `special` for every third row."""
    weights, size = ref.QUANT_BLOCKS[kind]
    blocks = rng.integers(0, 256, (n, k // weights, size), dtype=np.uint8)
    for at in HALVES[kind]:
        shape = (n, k // weights)
        h = np.exp(rng.uniform(np.log(1e-3), np.log(0.1), shape)) * rng.choice([-1, 1], shape)
        if special is not None:
            h[::3] = special[rng.integers(0, len(special), h[::3].shape)]
        blocks[..., at:at + 2] = h.astype(np.float16).view(np.uint8).reshape(n, k // weights, 2)
    return blocks.reshape(n, -1)


def read_only(a):
    a.flags.writeable = False
    return a


def random_blocks(rng, kind, n, k, scales=(1e-3, 1e-1)):
    """(n, k / 32 * block bytes) random blocks: random q bytes, fp16 scales (and Q4_1's offsets) of
    random sign and magnitudes log-uniform in `scales`."""
    size = ref.QUANT_BYTES[kind]
    blocks = rng.integers(0, 256, (n, k // 32, size), dtype=np.uint8)
    halves = 2 if kind == "Q4_1" else 1
    lo, hi = np.log(scales)
    h = np.exp(rng.uniform(lo, hi, (n, k // 32, halves))) * rng.choice([-1, 1], (n, k // 32, halves))
    blocks[..., :2 * halves] = h.astype(np.float16).view(np.uint8).reshape(n, k // 32, 2 * halves)
    return blocks.reshape(n, -1)


def uses_kernel(backend, X):
    rows = X.size // X.shape[-1]
    return backend.__name__ != "silkattn._numpy" and X.dtype == np.float32 and rows <= FEW_ROWS


SHAPES = [  # (lead of X, k, n): rows 1 .. 32 run the kernel (8 a call), more numpy's matmul
    ((1,), 32, 1), ((2,), 64, 3), ((3,), 576, 17), ((4,), 1536, 64), ((5,), 32, 65), ((6,), 64, 576),
    ((7,), 576, 1000), ((8,), 1536, 65), ((), 576, 576), ((2, 3), 64, 17), ((1,), 1536, 1000),
    ((1,), 576, 65), ((8,), 576, 3), ((9,), 576, 64), ((4, 5), 32, 1), ((20,), 1536, 17),
    ((300,), 576, 1000), ((2, 20), 1536, 700), ((33,), 32, 2000),  # a prefill: W a panel at a time
]


@pytest.mark.parametrize("kind", ROW_KINDS)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("lead, k, n", SHAPES)
def test_linear_q_matches_the_reference(any_backend, threads, rng, lead, k, n, bias, kind):
    W = QuantizedMatrix(kind, random_blocks(rng, kind, n, k))
    X = rng.standard_normal(lead + (k,)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    assert_close_q(any_backend.linear(X, W, b), X, W, b, uses_kernel(any_backend, X))


@pytest.mark.parametrize("kind", ROW_KINDS)
@pytest.mark.parametrize("m", [1, 3, 8, 9, 64])
def test_linear_q_extreme_scales(any_backend, threads, rng, kind, m):
    """Scales from fp16's subnormals to its largest (65504), zeros and both signs, mixed in a row."""
    k, n = 1536, 67
    blocks = random_blocks(rng, kind, n, k).reshape(n, k // 32, -1)
    special = np.array([65504, -65504, 2.0 ** -24, -(2.0 ** -24), 6.1e-5, 3e-7, 0, -0.0, 1, 1000], np.float16)
    halves = 2 if kind == "Q4_1" else 1
    pick = special[rng.integers(0, len(special), (n, k // 32, halves))]
    blocks[..., :2 * halves] = pick.view(np.uint8).reshape(n, k // 32, 2 * halves)
    W = QuantizedMatrix(kind, blocks.reshape(n, -1))
    X = rng.standard_normal((m, k)).astype(np.float32)
    assert_close_q(any_backend.linear(X, W), X, W, None, uses_kernel(any_backend, X))


@pytest.mark.parametrize("kind", ROW_KINDS)
@pytest.mark.parametrize("lead, k, n", SHAPES)
def test_linear_q_int8_activations_match_the_reference(any_backend, threads, rng, lead, k, n, kind):
    """W.activations "int8": X rounded to 8 bits a block (reference.round_q8), then X W; the kernels'
    integer products against it, a block of zeros and a block of one large value among them."""
    W = QuantizedMatrix(kind, random_blocks(rng, kind, n, k), "int8")
    X = rng.standard_normal(lead + (k,)).astype(np.float32)
    X[..., :32] = 0
    X[..., -32:] *= 1e-3
    X[..., -1] = 1e4
    b = rng.standard_normal(n).astype(np.float32) if n % 2 else None
    assert_close_q(any_backend.linear(X, W, b), X, W, b, uses_kernel(any_backend, X))


@pytest.mark.parametrize("kind", ROW_KINDS)
@pytest.mark.parametrize("m", [1, 9])
def test_linear_q_int8_activations_of_nan_and_inf(any_backend, rng, kind, m):
    """A block of x holding a NaN or an inf makes that row's every output NaN (its scale is NaN),
    as in the reference; the other rows are untouched."""
    W = QuantizedMatrix(kind, random_blocks(rng, kind, 33, 96), "int8")
    X = rng.standard_normal((m, 96)).astype(np.float32)
    X[0, 40], X[-1, 95] = np.nan, -np.inf
    y = any_backend.linear(X, W)
    assert np.isnan(y[0]).all() and np.isnan(y[-1]).all()
    assert np.isnan(ref.round_q8(X[:1]) @ W.dequantize()).all()
    if m > 2:
        assert_close_q(y[1:-1], X[1:-1], W, None, uses_kernel(any_backend, X))


@pytest.mark.parametrize("block", [32, 256])
def test_round_q8_is_a_grid_of_255_steps_a_block(rng, block):
    """round_q8: each block is q d with integer |q| <= 127, d = max |x| / 127, within d / 2 of x (in
    x's dtype's rounding); zeros stay zeros; float64 and float32 alike; any leading shape."""
    for dtype in (np.float32, np.float64):
        X = (rng.standard_normal((3, 2, 512)) * np.exp(rng.uniform(-20, 20, (3, 2, 512)))).astype(dtype)
        X[0, 0, :block] = 0
        R = ref.round_q8(X, block)
        assert R.dtype == dtype and R.shape == X.shape
        blocks, rounded = X.reshape(-1, block).astype(np.float64), R.reshape(-1, block).astype(np.float64)
        d = np.abs(blocks).max(-1, keepdims=True) / 127
        q = np.divide(rounded, d, out=np.zeros_like(rounded), where=d > 0)
        eps = np.finfo(dtype).eps
        np.testing.assert_allclose(q, np.rint(q), atol=1e-3)
        assert (np.abs(q) <= 127 + 1e-3).all()
        assert (np.abs(rounded - blocks) <= d * (0.5 + 200 * eps)).all()
        assert not R[0, 0, :block].any()


def test_linear_q_out_float64_views_and_read_only_blocks(any_backend, rng, tmp_path):
    k, n = 576, 96
    blocks = random_blocks(rng, "Q4_1", n, k)
    path = tmp_path / "blocks.bin"
    blocks.tofile(path)
    mapped = np.memmap(path, np.uint8, "r", shape=blocks.shape)  # as a GGUF file's tensor: read-only
    W = QuantizedMatrix.from_blocks("Q4_1", mapped)
    assert W.shape == (k, n) and W.dtype == np.float32 and W.nbytes == blocks.nbytes and W.blocks is mapped
    X = rng.standard_normal((2, k)).astype(np.float32)
    cache = np.zeros((10, n), np.float32)
    assert any_backend.linear(X, W, out=cache[3:5]) is not None  # straight into rows of a cache
    assert_close_q(cache[3:5], X, W, None, uses_kernel(any_backend, X))
    assert not cache[:3].any() and not cache[5:].any()
    X64 = X.astype(np.float64)  # float64: numpy's matmul on W.dequantize(), in float64
    assert_close_q(any_backend.linear(X64, W), X64, W, None, False)
    b64 = rng.standard_normal(n)
    assert_close_q(any_backend.linear(X, W, b64), X, W, b64, False)  # a float64 b: a float64 result
    frozen = X.copy()
    frozen.flags.writeable = False
    assert_close_q(any_backend.linear(frozen[:, ::-1], W), X[:, ::-1], W, None, uses_kernel(any_backend, X))
    np.testing.assert_array_equal(blocks, mapped)  # never written
    np.testing.assert_array_equal(W.dequantize(), ref.dequantize(blocks, "Q4_1").T)


def test_quantized_matrix_is_its_blocks(rng):
    blocks = random_blocks(rng, "Q8_0", 5, 64)
    W = QuantizedMatrix("Q8_0", blocks)
    assert W.blocks is blocks and W.kind == "Q8_0" and W.shape == (64, 5) and W.ndim == 2
    assert W.dequantize().shape == (64, 5) and W.dequantize().dtype == np.float32
    with pytest.raises(AttributeError):
        W.kind = "Q4_0"  # frozen
    assert "Q8_0" in repr(W) and "(64, 5)" in repr(W) and W.activations == "float32" and not W.q8
    W8 = dataclasses.replace(W, activations="int8")
    assert W8.q8 and W8.blocks is blocks and "int8" in repr(W8)


@pytest.mark.parametrize("kind", KINDS)
def test_dequantize_matches_gguf_bit_for_bit(rng, kind):
    """Every type's reference.dequantize against the gguf package's, to the bit (signed zeros too):
    random bytes, every float16 field finite (random bits with exponent 31 are inf/NaN)."""
    gguf = pytest.importorskip("gguf")
    weights, size = ref.QUANT_BLOCKS[kind]
    blocks = rng.integers(0, 256, (37, 9 * size), dtype=np.uint8)
    for at in HALVES[kind]:
        halves = blocks.reshape(37, 9, size)[..., at:at + 2].view(np.uint16)
        halves[(halves & 0x7C00) == 0x7C00] &= 0xBFFF
    ours = ref.dequantize(blocks, kind)
    theirs = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[kind])
    assert ours.dtype == np.float32 and ours.shape == (37, 9 * weights)
    np.testing.assert_array_equal(ours.view(np.uint32), np.asarray(theirs, np.float32).view(np.uint32))


@pytest.mark.parametrize("scale", [1.0, 1e-4, 3e4])
def test_quantize_q8_0_matches_gguf_bit_for_bit(rng, scale):
    """reference.quantize_q8_0 writes the gguf package's (llama.cpp's) Q8_0 bytes: random blocks,
    a block of zeros, one of -0.0, exact halves (round half away from zero: 2.5 -> 3, -3.5 -> -4)."""
    gguf = pytest.importorskip("gguf")
    w = (rng.standard_normal((23, 8 * 32)) * scale).astype(np.float32)
    w[0, :32], w[1, :32] = 0, -0.0
    w[2, :32] = np.linspace(-127, 127, 32).round() + np.where(np.arange(32) % 2, 0.5, -0.5)
    w[2, 0] = 127  # d = 1: the halves stay halves
    ours = ref.quantize_q8_0(w)
    np.testing.assert_array_equal(ours, gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0))
    assert ref.dequantize(ours[:1], "Q8_0")[0, :32].tolist() == [0.0] * 32
    back = ref.dequantize(ours, "Q8_0")
    assert np.abs(back - w).max() <= np.abs(w).max() / 127  # within half a step of fp16(d) and rounding


def test_quantized_matrix_from_float(rng):
    W = rng.standard_normal((96, 10)).astype(np.float32)  # (k, n): X W
    Q = QuantizedMatrix.from_float(W)
    assert Q.kind == "Q8_0" and Q.shape == (96, 10) and Q.q8
    np.testing.assert_array_equal(Q.blocks, ref.quantize_q8_0(W.T))
    assert np.abs(Q.dequantize() - W).max() <= np.abs(W).max(0).max() / 127
    assert not QuantizedMatrix.from_float(W, "float32").q8
    with pytest.raises(ValueError, match=r"Wo must be a non-empty \(k, n\) matrix with k a multiple of 32"):
        QuantizedMatrix.from_float(W[:40], name="Wo")
    with pytest.raises(ValueError, match="W holds a NaN or an infinity"):
        QuantizedMatrix.from_float(np.where(W > 2, np.inf, W))
    with pytest.raises(TypeError, match="W must be a float numpy.ndarray, got int64"):
        QuantizedMatrix.from_float(W.astype(np.int64))
    with pytest.raises(ValueError, match="activations must be one of"):
        QuantizedMatrix.from_float(W, "int4")


def test_the_kernel_runs_for_a_few_float32_rows_only(backend, rng):
    """The compiled backends' linear_q sees 1 .. FEW_ROWS float32 rows in calls of at most
    LINEAR_ROWS, the blocks themselves (no copy); more rows or float64 take numpy's matmul."""
    import dataclasses

    from silkattn import _api

    seen = []

    def spy(x, blocks, kind, b, out, has_bias, q8, num_threads):
        seen.append((x.shape, blocks, kind))
        backend.KERNELS.linear_q(x, blocks, kind, b, out, has_bias, q8, num_threads)

    kernels = dataclasses.replace(backend.KERNELS, linear_q=spy)
    W = QuantizedMatrix("Q4_0", random_blocks(rng, "Q4_0", 40, 64))
    for rows in (1, LINEAR_ROWS):
        X = rng.standard_normal((rows, 64)).astype(np.float32)
        assert_close_q(_api.linear(kernels, X, W), X, W, None, True)
    assert [(shape, kind) for shape, _, kind in seen] == [((1, 64), 1), ((LINEAR_ROWS, 64), 1)]
    assert all(blocks is W.blocks for _, blocks, _ in seen)
    X = rng.standard_normal((FEW_ROWS - 3, 64)).astype(np.float32)
    Y = _api.linear(kernels, X, W)
    calls = [(LINEAR_ROWS, 64)] * 3 + [(FEW_ROWS - 3 - 3 * LINEAR_ROWS, 64)]
    assert [shape for shape, _, _ in seen[2:]] == calls
    assert_close_q(Y, X, W, None, True)
    del seen[2:]
    _api.linear(kernels, rng.standard_normal((FEW_ROWS + 1, 64)).astype(np.float32), W)
    _api.linear(kernels, rng.standard_normal((1, 64)), W)
    assert len(seen) == 2



@pytest.mark.parametrize("kind", KINDS)
def test_int8_rows_of_a_batch_are_each_row_alone(backend, rng, kind):
    """int8 activations: up to Q8_ROWS rows take the few-row kernels in one call (8 rows of x at a
    time against each task's rows of W, read once), so each row's product is bit for bit that of its
    8 in a call of their own, and where a row's sums do not depend on the rows beside it (the
    AVX-512 copy, numba) that of the row alone: a batch's decoding step of up to Q8_ROWS sequences
    gives each one a lone step's logits. One row more takes the integer GEMM (cython, VNNI) or the
    float GEMM path, not the few-row kernels."""
    import dataclasses

    from silkattn import _api
    k = 2 * ref.QUANT_BLOCKS[kind][0]
    W = QuantizedMatrix(kind, any_blocks(rng, kind, 48, k), "int8")
    X = rng.standard_normal((Q8_ROWS + 1, k)).astype(np.float32)
    K, calls = backend.KERNELS, []
    spies = {name: (lambda f: lambda x, *a: (calls.append(len(x)), f(x, *a))[1])(getattr(K, name))
             for name in ("linear_q", "linear_qx")}
    kernels = dataclasses.replace(K, **spies)
    Y = _api.linear(kernels, X[:Q8_ROWS], W)
    assert calls == [Q8_ROWS]
    for r in range(0, Q8_ROWS, 8):
        assert np.array_equal(Y[r:r + 8], backend.linear(X[r:r + 8], W))
    if K.name == "numba" or K.isa == "avx512":
        assert all(np.array_equal(Y[r:r + 1], backend.linear(X[r:r + 1], W)) for r in range(Q8_ROWS))
    del calls[:]
    _api.linear(kernels, X, W)
    assert calls == []

HALVES_SCRIPT = """
import numba
import numpy as np
from silkattn.numba import _simd

@numba.njit
def convert(a, n, stride, lo, hi):
    W = _simd.vwidth(lo)
    for i in range(0, n, W):
        d, c = _simd.vload_halves(lo, a, i * stride, stride, n - i)
        _simd.vstore(lo, i, d)
        _simd.vstore(hi, i, c)

halves = np.arange(2 ** 16 + 10, dtype=np.uint32).astype(np.uint16)  # every float16, then a few again
n, stride = halves.size // 2, 6
a = np.full(n * stride, 0xAB, np.uint8)  # words 6 bytes apart (unaligned), junk between them
for t in range(4):
    a[t::stride] = halves.view(np.uint8)[t::4]
W = _simd.VBYTES // 4
lo, hi = (np.full(n + W, 7, np.float32) for _ in range(2))
convert(a, n, stride, lo, hi)
got = np.stack([lo[:n], hi[:n]], axis=1).reshape(-1)
expected = halves.view(np.float16).astype(np.float32)
nan = np.isnan(expected)
assert (np.isnan(got) == nan).all()
np.testing.assert_array_equal(got[~nan].view(np.uint32), expected[~nan].view(np.uint32))  # -0 too
end = (n + W - 1) // W * W  # the last register's lanes past the count: zeros
assert n % W and not lo[n:end].any() and not hi[n:end].any() and (lo[end:] == 7).all()
print("ok", _simd.F16C)
"""


@pytest.mark.parametrize("f16c", ["host", "0"])
def test_numba_scales_are_every_float16_exactly(f16c):
    """The Numba kernel converts its blocks' float16 scales a register at a time (vload_halves):
    every float16, by F16C where the CPU has it and by integer operations (SILKATTN_NUMBA_F16C=0,
    what a CPU without it runs), bit for bit as numpy's conversion; the lanes past the blocks give 0."""
    pytest.importorskip("numba")
    env = dict(os.environ)
    env.pop("SILKATTN_NUMBA_F16C", None)
    if f16c == "0":
        env["SILKATTN_NUMBA_F16C"] = "0"
    proc = subprocess.run([sys.executable, "-c", HALVES_SCRIPT], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.startswith("ok")
    if f16c == "0":
        assert proc.stdout.split() == ["ok", "False"]


@pytest.mark.parametrize("kind", KINDS)
def test_dequantize_kernel_is_the_reference_to_the_bit(any_backend, threads, rng, kind):
    """A prefill's panels: rows j0 .. j0 + rows of W dequantized exactly as reference.dequantize,
    scales from fp16's subnormals to its largest among them, and nothing written past the rows."""
    kernel = any_backend.KERNELS.dequantize
    if kernel is None:
        pytest.skip(f"{any_backend.__name__} has no dequantize kernel (numpy's matmul path)")
    special = np.array([65504, -65504, 2.0 ** -24, 6.1e-5, 0, -0.0, 1, -3.5], np.float16)
    weights = ref.QUANT_BLOCKS[kind][0]
    for n, k, j0, rows in [(1, 1, 0, 1), (40, 18, 3, 37), (300, 48, 100, 200), (17, 2, 16, 1), (9, 3, 0, 0)]:
        k *= weights  # rows of 1 to 48 blocks
        blocks = any_blocks(rng, kind, n, k, special)
        out = np.full((rows + 1, k), 7.0, np.float32)  # a last row the kernel must not touch
        kernel(blocks, KINDS.index(kind), j0, out[:rows], silkattn.get_num_threads())
        np.testing.assert_array_equal(out[:rows], ref.dequantize(blocks[j0:j0 + rows], kind))
        assert (out[rows] == 7.0).all()


EXT_KINDS = [kind for kind in KINDS if kind not in ROW_KINDS]


@pytest.mark.parametrize("kind", EXT_KINDS)
@pytest.mark.parametrize("rows, blocks_a_row, n", [(1, 1, 1), (1, 3, 576), (3, 2, 65), (8, 6, 17),
                                                   (9, 2, 1000), (64, 3, 96), (300, 1, 40)])
@pytest.mark.parametrize("activations", ["float32", "int8"])
def test_linear_of_the_dequantized_kinds(any_backend, threads, rng, kind, rows, blocks_a_row, n, activations):
    """Q5_0, Q5_1, Q4_K, Q5_K, Q6_K: ops.linear is X W on W dequantized to the bit (the GEMM path's
    panels, for any number of rows), within the GEMM's summation bound (k + 2 roundings), with a bias
    and with int8 activations (reference.round_q8(X, Q8_BLOCK) W: blocks of 32, the K-quants' of 256
    as llama.cpp's Q8_K)."""
    k = blocks_a_row * ref.QUANT_BLOCKS[kind][0]
    W = QuantizedMatrix(kind, any_blocks(rng, kind, n, k), activations)
    assert W.shape == (k, n) and W.block_weights == ref.QUANT_BLOCKS[kind][0]
    X = rng.standard_normal((rows, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    y = any_backend.linear(X, W, b)
    X64, W64 = f64(ref.round_q8(X, ref.Q8_BLOCK[kind]) if W.q8 else X, ref.dequantize(W.blocks, kind).T)
    expected, M = X64 @ W64 + b, np.abs(X64) @ np.abs(W64) + np.abs(b)
    assert y.dtype == np.float32 and y.shape == (rows, n)
    assert (np.abs(y - expected) <= (k + 2) * 2.0 ** -24 * M).all()


@pytest.mark.parametrize("kind", EXT_KINDS)
def test_the_dequantized_kinds_are_refused_by_the_row_kernels(backend, kind, rng):
    """The few-row kernel has no loops for these kinds: called directly with one it refuses (the ops
    never call it so: linear_qx takes them, in the fused step too)."""
    W = QuantizedMatrix(kind, any_blocks(rng, kind, 8, 256))
    with pytest.raises(ValueError, match="linear_q"):
        backend.KERNELS.linear_q(np.ones((1, 256), np.float32), W.blocks, W.code, np.zeros(1, np.float32),
                                 np.empty((1, 8), np.float32), False, False, 1)


@pytest.mark.parametrize("kind", EXT_KINDS)
def test_the_other_kinds_int8_activations_of_nan_and_inf(any_backend, rng, kind):
    """A block of x (32 values, 256 for the K-quants) holding a NaN or an inf makes that row's every
    output NaN, as in the reference; the other rows are round_q8(X, Q8_BLOCK) W."""
    k = 2 * ref.QUANT_BLOCKS[kind][0]
    W = QuantizedMatrix(kind, any_blocks(rng, kind, 33, k), "int8")
    X = rng.standard_normal((4, k)).astype(np.float32)
    X[0, 40], X[-1, k - 1] = np.nan, -np.inf
    y = any_backend.linear(X, W)
    assert np.isnan(y[0]).all() and np.isnan(y[-1]).all() and not np.isnan(y[1:-1]).any()
    X64, W64 = f64(ref.round_q8(X[1:-1], ref.Q8_BLOCK[kind]), ref.dequantize(W.blocks, kind).T)
    assert (np.abs(y[1:-1] - X64 @ W64) <= (k + 2) * 2.0 ** -24 * (np.abs(X64) @ np.abs(W64))).all()


@pytest.mark.parametrize("kind", EXT_KINDS)
def test_blocks_of_the_wrong_length_for_the_kind(kind, rng):
    weights, size = ref.QUANT_BLOCKS[kind]
    with pytest.raises(ValueError, match=f"whole {kind} blocks of {size} bytes"):
        QuantizedMatrix(kind, np.zeros((4, size + 1), np.uint8))
    assert QuantizedMatrix(kind, np.zeros((4, 2 * size), np.uint8)).shape == (2 * weights, 4)


@pytest.mark.parametrize("kind", EXT_KINDS)
def test_the_few_row_kernel_of_the_other_kinds_checks_what_it_is_given(backend, kind, rng):
    """linear_qx (Q5_0 .. Q6_K, float32 rows) against the reference on one to eight rows, and its
    refusals: a kind with a row kernel of its own, nine rows, blocks of another row length."""
    k = 2 * ref.QUANT_BLOCKS[kind][0]
    W = QuantizedMatrix(kind, any_blocks(rng, kind, 40, k))
    kernel, b = backend.KERNELS.linear_qx, np.zeros(40, np.float32)
    for m in (1, 5, 8):
        X = rng.standard_normal((m, k)).astype(np.float32)
        out = np.empty((m, 40), np.float32)
        kernel(X, W.blocks, W.code, b, out, False, False, 2)
        X64, W64 = f64(X, ref.dequantize(W.blocks, kind).T)
        assert (np.abs(out - X64 @ W64) <= (k + 2) * 2.0 ** -24 * (np.abs(X64) @ np.abs(W64))).all()
    with pytest.raises(ValueError, match="linear_qx"):
        kernel(X, W.blocks, KINDS.index("Q8_0"), b, out, False, False, 1)
    with pytest.raises(ValueError, match="linear_qx"):
        kernel(np.ones((9, k), np.float32), W.blocks, W.code, b, np.empty((9, 40), np.float32), False, False,
               1)
    with pytest.raises(ValueError, match="linear_qx"):
        kernel(np.ones((1, 2 * k), np.float32), W.blocks, W.code, b, np.empty((1, 40), np.float32), False,
               False, 1)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("m, blocks_a_row, n", [(9, 1, 1), (13, 2, 31), (6, 3, 33), (7, 1, 64), (12, 2, 95),
                                                (40, 1, 200), (0, 1, 8)])
def test_the_integer_gemm_on_every_edge(rng, kind, m, blocks_a_row, n):
    """Kernels.gemm_q8 (cython, AVX-512 VNNI), called directly: out = round_q8(X, Q8_BLOCK) W within
    float32's summation bound, on rows that are not a whole micro-tile (6), columns not a whole panel
    (32), depths of one to three blocks, no rows at all; it says False where the CPU has no VNNI."""
    import silkattn.cython
    gemm_q8 = silkattn.cython.KERNELS.gemm_q8
    k = blocks_a_row * ref.QUANT_BLOCKS[kind][0]
    W = QuantizedMatrix(kind, any_blocks(rng, kind, n, k))
    X = rng.standard_normal((m, k)).astype(np.float32)
    out = np.full((m, n), np.nan, np.float32)
    if not gemm_q8(X, W.blocks, W.code, out, 2):
        assert np.isnan(out).all()
        pytest.skip("this CPU (or the copy forced) has no AVX-512 VNNI: the float GEMM path runs instead")
    if m:
        X64, W64 = f64(ref.round_q8(X, ref.Q8_BLOCK[kind]), ref.dequantize(W.blocks, kind).T)
        assert (np.abs(out - X64 @ W64) <= (k + 2) * 2.0 ** -24 * (np.abs(X64) @ np.abs(W64))).all()
    with pytest.raises(ValueError, match="gemm_q8"):
        gemm_q8(X, W.blocks, W.code, np.empty((m, n + 1), np.float32), 1)


@pytest.mark.parametrize("kind", ROWS16)
@pytest.mark.parametrize("n, blocks_a_row", [(16, 1), (48, 3), (272, 2)])
def test_blocks_in_groups_of_16_rows(rng, kind, n, blocks_a_row):
    """The int8 decoding kernels' layouts of Q8_0, Q4_0, Q4_1, Q5_0, Q4_K and Q6_K (quant.ROWS16,
    kernels/rows16.h): the file's bits rearranged in groups of 16 rows (unpacked back to the bit,
    each row's d where the layout puts it), and linear_qx on them, 1 to 8 rows with a bias, within
    the bound of the file's product and close to its result (the file's kernel: linear_q for the
    kinds it takes, linear_qx for the others): on the VNNI copy their own kernels, on every other
    copy (test_portable) the rows unpacked."""
    lq = pytest.importorskip("silkattn._cy.linear_q")
    weights, size = ref.QUANT_BLOCKS[kind]
    k = weights * blocks_a_row
    W = QuantizedMatrix(kind, any_blocks(rng, kind, n, k), "int8")
    packed, code = lq.pack_rows16(W.blocks, W.code, 2)
    assert packed.shape == W.blocks.shape and packed.dtype == np.uint8 and code >= len(KINDS)
    assert (lq.unpack_rows16(packed, W.code) == W.blocks).all()
    nb = k // weights
    group = packed.reshape(n // 16, nb, 16 * size)
    rows = W.blocks.reshape(n // 16, 16, nb, size)
    d = 208 if kind == "Q6_K" else 0  # the file's d (the layout's first 32 bytes: the 16 rows')
    assert (group[..., :32].reshape(n // 16, nb, 16, 2) == rows[..., d:d + 2].swapaxes(1, 2)).all()
    b = rng.standard_normal(n).astype(np.float32)
    for m in range(1, LINEAR_ROWS + 1):
        X = rng.standard_normal((m, k)).astype(np.float32)
        out, file = np.empty((m, n), np.float32), np.empty((m, n), np.float32)
        lq.linear_qx(X, packed, code, b, out, True, True, 2)
        (lq.linear_q if kind in ROW_KINDS else lq.linear_qx)(X, W.blocks, W.code, b, file, True, True, 2)
        X64, W64 = f64(ref.round_q8(X, ref.Q8_BLOCK[kind]), W.dequantize())
        expected, M = X64 @ W64 + b, np.abs(X64) @ np.abs(W64) + np.abs(b)
        assert (np.abs(out - expected) <= (k + 2) * 2.0 ** -24 * M).all()
        assert np.allclose(out, file, rtol=1e-5, atol=1e-5 * np.abs(file).max())
    with pytest.raises(ValueError, match="linear_qx"):  # float32 activations: no such kernel
        lq.linear_qx(X, packed, code, b, out, True, False, 1)
    X = rng.standard_normal((37, k)).astype(np.float32)  # a prefill's integer GEMM reads the layout too
    out, file = np.empty((37, n), np.float32), np.empty((37, n), np.float32)
    if lq.gemm_q8(X, packed, code, out, 2):
        assert lq.gemm_q8(X, W.blocks, W.code, file, 2)
        assert np.array_equal(out, file)  # the same bytes and scales unpacked: the same GEMM
    with pytest.raises(ValueError, match="pack_rows16"):  # rows not whole groups
        lq.pack_rows16(W.blocks[:n - 1].copy(), W.code)
    with pytest.raises(ValueError, match="pack_rows16"):  # a kind without the layout
        lq.pack_rows16(any_blocks(rng, "Q5_1", n, 32), KINDS.index("Q5_1"))


@pytest.mark.parametrize("kind", ROWS16)
def test_int8_products_read_their_packed_copy(backend, rng, kind):
    """ops.linear with an int8 matrix of quant.ROWS16's kinds, whole groups of 16 rows, its blocks
    read-only (as a GGUF file's), packs it once (where the backend has the layout:
    QuantizedMatrix.rows16) and keeps it; float32 activations, rows not a multiple of 16, other
    kinds and writeable blocks (a copy could go stale) keep the file's blocks."""
    W = QuantizedMatrix(kind, read_only(any_blocks(rng, kind, 32, 512)), "int8")
    X = rng.standard_normal((2, 512)).astype(np.float32)
    X64, W64 = f64(ref.round_q8(X, ref.Q8_BLOCK[kind]), W.dequantize())
    err = np.abs(backend.linear(X, W) - X64 @ W64)
    assert (err <= 514 * 2.0 ** -24 * (np.abs(X64) @ np.abs(W64))).all()
    pack = backend.KERNELS.pack_rows16
    if pack is None:
        assert W.__dict__.get("_rows16") is None
        return
    first = W.__dict__["_rows16"]
    assert (first[0] == pack(W.blocks, W.code, 1)[0]).all() and not first[0].flags.writeable
    backend.linear(X, W)
    assert W.__dict__["_rows16"] is first
    for other in (dataclasses.replace(W, activations="float32"),
                  QuantizedMatrix(kind, read_only(any_blocks(rng, kind, 40, 512)), "int8"),
                  QuantizedMatrix("Q5_K", read_only(any_blocks(rng, "Q5_K", 32, 512)), "int8"),
                  QuantizedMatrix(kind, any_blocks(rng, kind, 32, 512), "int8")):
        assert other.rows16(pack) is None


def test_packing_in_parts_is_packing_at_once(monkeypatch, rng):
    """QuantizedMatrix.rows16 packs quant.PACK_BYTES of blocks at a time (each part's file pages
    released before the next is packed): the parts side by side are the whole matrix's layout,
    whatever the part's size, the last part shorter."""
    lq = pytest.importorskip("silkattn._cy.linear_q")
    from silkattn import quant

    blocks = read_only(any_blocks(rng, "Q6_K", 80, 512))
    whole = lq.pack_rows16(blocks, KINDS.index("Q6_K"), 1)
    for part, sizes in ((32, [32, 32, 16]), (16, [16] * 5), (1, [16] * 5), (10 ** 6, [80])):
        monkeypatch.setattr(quant, "PACK_BYTES", part * blocks.shape[1])
        calls = []

        def pack(b, code):
            calls.append(b.shape[0])
            return lq.pack_rows16(b, code, 1)

        packed, code = QuantizedMatrix("Q6_K", blocks, "int8").rows16(pack)
        assert calls == sizes and code == whole[1] and (packed == whole[0]).all()


def test_packing_releases_the_file_pages_only(tmp_path, rng):
    """After QuantizedMatrix.rows16, blocks that are a read-only file mapping (a GGUF tensor) have
    their pages released and read back from the file unchanged; blocks in anonymous memory or a
    copy-on-write mapping are left alone (releasing those would lose them)."""
    import mmap

    raw = any_blocks(rng, "Q5_0", 64, 4096)
    path = tmp_path / "w.bin"
    path.write_bytes(b"\0" * 100 + raw.tobytes())
    with open(path, "rb") as f:
        shared = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        private = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    pack = lambda blocks, code: (blocks.copy(), code)  # noqa: E731  (the layout is not what is tested)
    for buf in (shared, private):
        blocks = np.frombuffer(buf, np.uint8, raw.size, 100).reshape(raw.shape)
        expected = raw.copy()
        if buf is private:  # a change only this process's pages hold
            blocks[3, 7] ^= 0xFF
            expected[3, 7] ^= 0xFF
        assert QuantizedMatrix("Q5_0", read_only(blocks), "int8").rows16(pack) is not None
        assert (blocks == expected).all()
    anon = read_only(raw.copy())
    assert QuantizedMatrix("Q5_0", anon, "int8").rows16(pack) is not None
    assert (anon == raw).all()
