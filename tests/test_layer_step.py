"""ops.layer_step, one decoder layer's decoding step from its record (ops.layer_step_record), on
every backend against the same step as separate ops on the NumPy reference backend: the listing's
block (LayerNorm, pre- and post-norm, ReLU with biases, cross-attention over a padded memory), and
the Llama family's (RMSNorm, rotary, grouped-query heads, SwiGLU, GGUF blocks with float32 or int8
activations, biases on the block products that take them), and the family's options (Gemma 3's
QK-norm, sandwich norms, GeGLU, a window over a ring cache, a scale of its own; K-quants and
matrices whose parts are blocks of different types), several positions of one cache."""
import numpy as np
import pytest

import silkattn
from silkattn import reference as ref
from silkattn._testing import TOL, TOL_F16_CACHE, TOL_Q8, assert_close
from silkattn.quant import QuantizedMatrix


def dense(rng, k, n):
    return (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)


def blocks(rng, kind, k, n, activations):
    """A QuantizedMatrix (k, n) of random blocks whose weights have a standard deviation of about
    1 / sqrt(k) (Q8_0's q are about 74 in size, the 4-bit ones' about 4.6)."""
    size = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}[kind]
    b = rng.integers(0, 256, (n, k // 32, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(1 / np.sqrt(k) / (74 if kind == "Q8_0" else 4.6)).tobytes(), np.uint8)
    b[:, :, 0:2] = scale
    if kind == "Q4_1":
        b[:, :, 2:4] = np.frombuffer(np.float16(-0.02).tobytes(), np.uint8)
    return QuantizedMatrix(kind, b.reshape(n, -1), activations)


def family_blocks(rng, kind, k, n, activations):
    """A QuantizedMatrix (k, n) of random valid `kind` blocks (any of quant.KINDS), weights of about
    1 / sqrt(k); those of quant.ROWS16's kinds read-only, as a file's are (the int8 step then reads
    them in groups of 16 rows where the backend has that layout: QuantizedMatrix.rows16)."""
    from llama_files import k_blocks
    if kind in ("Q4_K", "Q5_K", "Q6_K"):
        b = k_blocks(rng, kind, n, k)
        b.flags.writeable = kind != "Q4_K"
        return QuantizedMatrix(kind, b, activations)
    if kind in ("Q8_0", "Q4_0", "Q4_1"):
        W = blocks(rng, kind, k, n, activations)
        W.blocks.flags.writeable = False
        return W
    size = ref.QUANT_BLOCKS[kind][1]
    b = rng.integers(0, 256, (n, k // 32, size), dtype=np.uint8)
    d = np.float16(1 / np.sqrt(k) / 9.2)  # 5-bit q: about 9.2 in size
    b[:, :, 0:2] = np.frombuffer(d.tobytes(), np.uint8)
    if kind == "Q5_1":  # w = d q + m, q in 0 .. 31
        b[:, :, 2:4] = np.frombuffer(np.float16(-15.5 * float(d)).tobytes(), np.uint8)
    b.flags.writeable = kind != "Q5_0"
    return QuantizedMatrix(kind, b.reshape(n, -1), activations)


def family_layer(rng, activations, kinds, window=None, ring=False, d=256, h=4, h_kv=1, dh=128, d_ff=256):
    """A Gemma 3-style layer (QK-norm, sandwich norms, GeGLU, heads not d / h wide, a scale of its
    own) whose Q | K | V and gate | up are parts of the kinds given: kinds = (q, k, v, o, gate, up,
    down); window: a sliding window, over a ring cache of exactly the window's positions if ring."""
    def gain(n):
        return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    q, k, v, o, g, u, dn = (family_blocks(rng, kind, kk, n, activations) for kind, kk, n in zip(
        kinds, (d, d, d, h * dh, d, d, d_ff), (h * dh, h_kv * dh, h_kv * dh, d, d_ff, d_ff, d)))
    record = dict(heads=h, kv_heads=h_kv, norm1=gain(d), qkv=[q, k, v], o=o, norm2=gain(d), up=[g, u],
                  down=dn, eps=1e-6, activation="geglu", rope_base=10000.0, qk_norm=(gain(dh), gain(dh)),
                  post_norms=(gain(d), gain(d)), scale=0.3 / np.sqrt(dh), window=window)
    if ring:
        record["positions"] = 8
    return record, (h_kv, window if ring else 8, dh), d


def listing_block(rng, d=64, h=4, d_ff=96, cross=False, post_norm=False, kind=None):
    g = (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)
    b = (0.1 * rng.standard_normal(d)).astype(np.float32)
    up = dense(rng, d, d_ff) if kind is None else family_blocks(rng, kind, d, d_ff, "float32")
    record = dict(heads=h, norm1=(g, b), qkv=dense(rng, d, 3 * d), o=dense(rng, d, d), norm2=(g, b),
                  up=(up, 0.1 * rng.standard_normal(d_ff).astype(np.float32)),
                  down=(dense(rng, d_ff, d), 0.1 * rng.standard_normal(d).astype(np.float32)), eps=1e-5,
                  post_norm=post_norm)
    if cross:
        memory = tuple(rng.standard_normal((7, d)).astype(np.float32) for _ in range(2))
        record["cross"] = dict(norm=(g, b), q=dense(rng, d, d), o=dense(rng, d, d), memory=memory,
                               keep=np.arange(7) < 5)
    return record, (8, d), d


def llama_layer(rng, kind, activations, d=64, h=4, h_kv=2, d_ff=96, biases=False):
    dh = d // h
    g = (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)
    qkv = blocks(rng, kind, d, (h + 2 * h_kv) * dh, activations)
    up = blocks(rng, kind, d, 2 * d_ff, activations)
    if biases:  # Qwen2's Q/K/V biases, and one on up: the products that do not add the residual
        qkv = (qkv, 0.1 * rng.standard_normal((h + 2 * h_kv) * dh).astype(np.float32))
        up = (up, 0.1 * rng.standard_normal(2 * d_ff).astype(np.float32))
    record = dict(heads=h, kv_heads=h_kv, norm1=g, qkv=qkv, o=blocks(rng, kind, h * dh, d, activations),
                  norm2=g, up=up, down=blocks(rng, kind, d_ff, d, activations), eps=1e-6, activation="swiglu",
                  rope_base=10000.0)
    return record, (h_kv, 8, dh), d


CASES = {
    "listing pre-norm": lambda rng: listing_block(rng),
    "listing post-norm cross": lambda rng: listing_block(rng, cross=True, post_norm=True),
    "listing pre-norm cross": lambda rng: listing_block(rng, cross=True),
    "listing ReLU of blocks": lambda rng: listing_block(rng, kind="Q8_0"),
    "listing ReLU of Q5_0 blocks": lambda rng: listing_block(rng, kind="Q5_0"),
    "llama Q8_0": lambda rng: llama_layer(rng, "Q8_0", "float32"),
    "llama Q4_1 int8": lambda rng: llama_layer(rng, "Q4_1", "int8"),
    "llama Q4_0 biases": lambda rng: llama_layer(rng, "Q4_0", "float32", biases=True),
    "llama Q8_0 int8 biases": lambda rng: llama_layer(rng, "Q8_0", "int8", biases=True),
    "gemma K-quants": lambda rng: family_layer(
        rng, "float32", ("Q5_0", "Q5_0", "Q8_0", "Q4_K", "Q5_0", "Q5_1", "Q6_K")),
    "gemma K-quants int8 window": lambda rng: family_layer(
        rng, "int8", ("Q4_K", "Q5_K", "Q6_K", "Q4_K", "Q5_K", "Q5_K", "Q6_K"), window=3),
    "gemma ring": lambda rng: family_layer(rng, "float32", ("Q8_0",) * 7, window=4, ring=True),
    "gemma ring int8": lambda rng: family_layer(rng, "int8", ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_0", "Q5_1",
                                                              "Q6_K"), window=4, ring=True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_layer_step_is_the_same_step_as_ops(on_backend, threads, rng, case):
    """Six positions of one cache; each step against the ops' step from the same row and cache (so
    that a difference in the last bit, which rounding x to 8 bits can turn into a step of its grid,
    is not carried into the next position's input)."""
    record, shape, d = CASES[case](rng)
    K, V, K0, V0 = (np.zeros(shape, np.float32) for _ in range(4))
    step, ops_step = (silkattn.ops.layer_step_record(cache=c, **record) for c in ((K, V), (K0, V0)))
    x = rng.standard_normal(d).astype(np.float32)
    # int8 activations: the kernels' integer products against round_q8 and a float product
    table = TOL_Q8 if "int8" in case else TOL
    for pos in range(6):
        K0[...], V0[...], x0 = K, V, x.copy()
        with silkattn.use_backend("numpy"):
            silkattn.ops.layer_step(ops_step, x0, pos)
        silkattn.ops.layer_step(step, x, pos)
        for a, b in ((x, x0), (K, K0), (V, V0)):
            assert_close(a, b.astype(np.float64), np.float32, table)


ROWS_CASES = [case for case in CASES if not case.startswith("listing")]


F16_ROWS_CASES = ["llama Q8_0", "llama Q4_1 int8", "gemma K-quants", "gemma ring int8"]


@pytest.mark.parametrize("case, kv", [(case, "float32") for case in ROWS_CASES]
                         + [(case, "float16") for case in F16_ROWS_CASES])
def test_layer_step_rows_is_each_row_alone(on_backend, threads, rng, case, kv):
    """ops.layer_step_rows: 5 rows (a batch's step), each at a position of its own over its own page
    of a pool of 7 caches (already holding keys; float32 or float16), against layer_step of each row
    alone over a copy of its page: the rows and every page."""
    record, shape, d = CASES[case](rng)
    K, V = (rng.standard_normal((7,) + shape).astype(kv) for _ in range(2))
    K0, V0 = K.copy(), V.copy()
    step = silkattn.ops.layer_step_record(cache=(K[0], V[0]), **record)
    X = rng.standard_normal((5, d)).astype(np.float32)
    positions, pages = np.array([0, 5, 2, 7, 3]) % step.positions, np.array([4, 0, 6, 2, 5])
    expected = X.copy()
    for x, pos, page in zip(expected, positions, pages):
        alone = silkattn.ops.layer_step_record(cache=(K0[page], V0[page]), **record)
        silkattn.ops.layer_step(alone, x, int(pos))
    assert silkattn.ops.layer_step_rows(step, X, positions, K, V, pages) is X
    # int8: the rows' products sum otherwise than a row's alone; a float16 cache rounds such differences
    table = TOL_Q8 if "int8" in case else TOL_F16_CACHE if kv == "float16" else TOL
    for a, b in ((X, expected), (K, K0), (V, V0)):
        assert_close(a.astype(np.float32), b.astype(np.float64), np.float32, table)
        # numba's kernel of rows runs each row through its one-row step's own functions
        assert on_backend != "numba" or np.array_equal(a, b)


@pytest.mark.parametrize("kv", ["float32", "float16"])
@pytest.mark.parametrize("h, h_kv", [(3, 3), (6, 2), (5, 1), (6, 1), (7, 1)])
def test_layer_step_rows_attends_long_caches_a_group_at_a_time(on_backend, rng, h, h_kv, kv):
    """Query heads per K/V head 1, 3, 5, 6 and 7 (the compiled kernel takes up to 4 of a group a pass
    over the keys: 4 + 1, 4 + 2, 4 + 3), 64 wide, over caches of 17 to 40 keys (keys 16 at a time and
    the rest, columns 64 at a time), float32 or float16: the rows and the pools against the numpy
    backend's step."""
    record, _, d = llama_layer(rng, "Q8_0", "float32", d=64 * h, h=h, h_kv=h_kv)
    K, V = (rng.standard_normal((7, h_kv, 40, 64)).astype(kv) for _ in range(2))
    K0, V0 = K.copy(), V.copy()
    X = rng.standard_normal((5, d)).astype(np.float32)
    X0 = X.copy()
    positions, pages = np.array([39, 17, 33, 25, 16]), np.array([4, 0, 6, 2, 5])
    silkattn.ops.layer_step_rows(silkattn.ops.layer_step_record(cache=(K[0], V[0]), **record), X, positions,
                                 K, V, pages)
    with silkattn.use_backend("numpy"):
        silkattn.ops.layer_step_rows(silkattn.ops.layer_step_record(cache=(K0[0], V0[0]), **record), X0,
                                     positions, K0, V0, pages)
    for a, b in ((X, X0), (K, K0), (V, V0)):
        assert_close(a.astype(np.float32), b.astype(np.float64), np.float32,
                     TOL if kv == "float32" else TOL_F16_CACHE)


@pytest.mark.parametrize("kv", ["float32", "float16"])
@pytest.mark.parametrize("h, h_kv", [(3, 3), (6, 2), (9, 3), (5, 1), (7, 1)])
def test_layer_step_attends_long_caches_a_group_at_a_time(on_backend, threads, rng, h, h_kv, kv):
    """The one-row step: each thread's run of query heads cut where the K/V head changes (on two
    threads 9 / 3 heads split inside the second group, 7 / 1 as 3 + 4), a run's heads of one group
    in one pass, over caches of 17 to 40 keys (float32 or float16): the row and the cache against
    the numpy backend's."""
    record, _, d = llama_layer(rng, "Q8_0", "float32", d=64 * h, h=h, h_kv=h_kv)
    for pos in (39, 17, 33):
        K, V = (rng.standard_normal((h_kv, 40, 64)).astype(kv) for _ in range(2))
        K0, V0 = K.copy(), V.copy()
        x = rng.standard_normal(d).astype(np.float32)
        x0 = x.copy()
        silkattn.ops.layer_step(silkattn.ops.layer_step_record(cache=(K, V), **record), x, pos)
        with silkattn.use_backend("numpy"):
            silkattn.ops.layer_step(silkattn.ops.layer_step_record(cache=(K0, V0), **record), x0, pos)
        for a, b in ((x, x0), (K, K0), (V, V0)):
            assert_close(a.astype(np.float32), b.astype(np.float64), np.float32,
                         TOL if kv == "float32" else TOL_F16_CACHE)


F16_CASES = ["listing pre-norm", "listing post-norm cross", "llama Q8_0", "llama Q4_1 int8",
             "gemma K-quants int8 window", "gemma ring int8"]


@pytest.mark.parametrize("case", F16_CASES)
def test_a_float16_cache_is_the_float32_cache_rounded(on_backend, rng, case):
    """A float16 cache (half the bytes): six positions of one cache, each step against the numpy
    backend's step over a copy of the same float16 cache (x and the rows written; the backends'
    products may differ in the last bit, and their rows then round apart: TOL_F16_CACHE); and that
    step against the numpy backend's over a float32 cache holding the same keys: its rows written,
    rounded, are the float16 step's to the bit, and x differs by the rounding of the keys alone."""
    record, shape, d = CASES[case](rng)
    K, V = (rng.standard_normal(shape).astype(np.float16) for _ in range(2))
    K0, V0, K32, V32 = K.copy(), V.copy(), K.astype(np.float32), V.astype(np.float32)
    step = silkattn.ops.layer_step_record(cache=(K, V), **record)
    with silkattn.use_backend("numpy"):
        ops_step = silkattn.ops.layer_step_record(cache=(K0, V0), **record)
        wide = silkattn.ops.layer_step_record(cache=(K32, V32), **record)
    x = rng.standard_normal(d).astype(np.float32)
    for pos in range(6):
        K0[...], V0[...], x0 = K, V, x.copy()
        K32[...], V32[...], x32 = K, V, x.copy()
        with silkattn.use_backend("numpy"):
            silkattn.ops.layer_step(ops_step, x0, pos)
            silkattn.ops.layer_step(wide, x32, pos)
        silkattn.ops.layer_step(step, x, pos)
        for a, b in ((x, x0), (K, K0), (V, V0)):
            assert_close(a.astype(np.float32), b.astype(np.float64), np.float32,
                         TOL_Q8 if "int8" in case else TOL_F16_CACHE)
        assert K.dtype == V.dtype == np.float16
        assert np.array_equal(K0, K32.astype(np.float16)) and np.array_equal(V0, V32.astype(np.float16))
        if "int8" not in case:  # a rounded key can move a row's 8-bit rounding by a step
            assert_close(x0, x32.astype(np.float64), np.float32, TOL_F16_CACHE)


def float16_edges(rng, n):
    """n float32 values that test a rounding to float16: ties to even (normal and subnormal), the
    largest finite, the first that overflows, infinities, the subnormals' half-step, zero (not -0:
    the test's V is 0 + the value); then random bit patterns over float16's exponents and beyond."""
    edges = [0.0, 2.0 ** -30, 1.0, 1 + 2 ** -11, 1 + 3 * 2 ** -11, -(1 + 2 ** -11), 65504.0, 65519.996,
             65520.0, -65520.0, 1e6, np.inf, -np.inf, 2.0 ** -24, 2.0 ** -25, -2.0 ** -25,
             2.0 ** -25 * 1.0001, 3 * 2.0 ** -25, 5 * 2.0 ** -25, 2.0 ** -14, 2.0 ** -14 * (1 - 2 ** -11),
             2.0 ** -14 - 2.0 ** -25, 2.0 ** -26, 6.1e-5, 0.099976, 2049.0, 2051.0, 4097.0]
    bits = rng.integers(95 << 23, 150 << 23, n - len(edges), dtype=np.int64).astype(np.uint32)
    bits |= rng.integers(0, 2, len(bits), dtype=np.uint32) << 31
    return np.concatenate([np.array(edges, np.float32), bits.view(np.float32)])


def test_a_float16_cache_rounds_as_numpy_does(on_backend, rng):
    """The rows written to a float16 cache are numpy's astype(np.float16) of the float32 rows, bit
    for bit, over every rounding case (float16_edges): each value set as a V head's output (the
    listing's block, its V columns zero and their bias the values), a step at each of 3 positions."""
    record, shape, d = listing_block(rng, d=256, h=4)
    for pos in range(3):
        values = float16_edges(rng, d)
        W = record["qkv"] if not isinstance(record["qkv"], tuple) else record["qkv"][0]
        W = W.copy()
        W[:, 2 * d:] = 0
        b = np.concatenate([np.zeros(2 * d, np.float32), values])
        K, V = (np.zeros(shape, np.float16) for _ in range(2))
        step = silkattn.ops.layer_step_record(cache=(K, V), **dict(record, qkv=(W, b)))
        with np.errstate(invalid="ignore", over="ignore"):
            silkattn.ops.layer_step(step, rng.standard_normal(d).astype(np.float32), pos)
            expected = values.astype(np.float16)
        assert np.array_equal(V[pos].view(np.uint16), expected.view(np.uint16)), \
            (values[V[pos].view(np.uint16) != expected.view(np.uint16)])


def test_a_float16_cache_is_checked(rng):
    record, shape, d = CASES["llama Q8_0"](rng)
    with pytest.raises(TypeError, match="float32 or float16"):
        silkattn.ops.layer_step_record(cache=(np.zeros(shape, np.int8), np.zeros(shape, np.int8)), **record)
    with pytest.raises(TypeError, match="cache's V must be float16"):
        silkattn.ops.layer_step_record(cache=(np.zeros(shape, np.float16), np.zeros(shape)), **record)
    K, V = (np.zeros((3,) + shape, np.float16) for _ in range(2))
    step = silkattn.ops.layer_step_record(cache=(K[0], V[0]), **record)
    X = np.zeros((2, d), np.float32)
    with pytest.raises(ValueError, match="K_pages must be a writeable C-contiguous float16"):
        silkattn.ops.layer_step_rows(step, X, [1, 2], K.astype(np.float32), V, [0, 1])
    with pytest.raises(ValueError, match="V_pages"):
        silkattn.ops.layer_step_rows(step, X, [1, 2], K, V.astype(np.float32), [0, 1])


@pytest.mark.parametrize("case", ["llama Q4_1 int8", "gemma K-quants int8 window", "gemma ring"])
def test_layer_step_rows_runs_a_list_of_layers_in_turn(on_backend, rng, case):
    """A model's layers in one call (a list of records, each over its own pools): bit for bit the
    layers one call each, the rows and every pool."""
    layers = [CASES[case](rng) for _ in range(3)]
    pools = [tuple(rng.standard_normal((7,) + shape).astype(np.float32) for _ in range(2))
             for _, shape, _ in layers]
    copies = [(K.copy(), V.copy()) for K, V in pools]
    steps = [silkattn.ops.layer_step_record(cache=(K[0], V[0]), **record) for (record, _, _), (K, V) in
             zip(layers, pools)]
    d = layers[0][2]
    X = rng.standard_normal((5, d)).astype(np.float32)
    positions, pages = np.array([0, 5, 2, 7, 3]) % steps[0].positions, np.array([4, 0, 6, 2, 5])
    expected = X.copy()
    for step, (K, V) in zip(steps, copies):
        silkattn.ops.layer_step_rows(step, expected, positions, K, V, pages)
    Ks, Vs = [K for K, _ in pools], [V for _, V in pools]
    assert silkattn.ops.layer_step_rows(steps, X, positions, Ks, Vs, pages) is X
    assert np.array_equal(X, expected)
    for (K, V), (K0, V0) in zip(pools, copies):
        assert np.array_equal(K, K0) and np.array_equal(V, V0)
    with pytest.raises(ValueError, match="one pool a record"):
        silkattn.ops.layer_step_rows(steps, X, positions, Ks[:2], Vs, pages)
    with pytest.raises(TypeError, match="list"):
        silkattn.ops.layer_step_rows(steps, X, positions, Ks[0], Vs[0], pages)
    with pytest.raises(TypeError, match="LayerStep"):
        silkattn.ops.layer_step_rows([steps[0], "layer"], X, positions, Ks[:2], Vs[:2], pages)


def test_layer_step_rows_refuses_what_it_cannot_run(rng):
    record, shape, d = CASES["llama Q8_0"](rng)
    K, V = (np.zeros((3,) + shape, np.float32) for _ in range(2))
    step = silkattn.ops.layer_step_record(cache=(K[0], V[0]), **record)
    X = np.zeros((2, d), np.float32)
    run = silkattn.ops.layer_step_rows
    with pytest.raises(ValueError, match="distinct"):
        run(step, X, [1, 2], K, V, [1, 1])
    with pytest.raises(ValueError, match="pages must name"):
        run(step, X, [1, 2], K, V, [0, 3])
    with pytest.raises(ValueError, match="positions"):
        run(step, X, [1, 8], K, V, [0, 1])
    with pytest.raises(TypeError, match="positions"):
        run(step, X, [1.0, 2.0], K, V, [0, 1])
    with pytest.raises(ValueError, match="X must"):
        run(step, X[:, :-1].copy(), [1, 2], K, V, [0, 1])
    with pytest.raises(ValueError, match="K_pages"):
        run(step, X, [1, 2], K[:, :, :4].copy(), V, [0, 1])
    with pytest.raises(ValueError, match="overlap"):  # rows inside the pool itself
        run(step, K.reshape(-1)[:2 * d].reshape(2, d), [1, 2], K, V, [0, 1])
    with pytest.raises(ValueError, match="overlap"):  # rows inside the values' pool, the step's scratch
        run(step, V.reshape(-1)[-2 * d:].reshape(2, d), [1, 2], K, V, [0, 1])
    with pytest.raises(ValueError, match="overlap"):
        run(step, step.scratch.hn[-d:].reshape(1, d), [1], K, V, [0])
    listing, shape, d = CASES["listing pre-norm"](rng)
    K, V = (np.zeros((3,) + shape, np.float32) for _ in range(2))
    with pytest.raises(ValueError, match="Llama-family"):
        run(silkattn.ops.layer_step_record(cache=(K[0], V[0]), **listing), np.zeros((1, d), np.float32), [0],
            K, V, [0])


def test_layer_step_rows_checks_again_what_changed_since_the_last_call(rng):
    """What layer_step_rows derives from its rows is kept for the next call (every layer of a batch's
    step passes the same ones), by value: rows changed in place, a smaller pool or X moved into the
    pool are seen, and the caller's arrays are left writeable."""
    record, shape, d = CASES["llama Q8_0"](rng)
    K, V = (rng.standard_normal((3,) + shape).astype(np.float32) for _ in range(2))
    step = silkattn.ops.layer_step_record(cache=(K[0], V[0]), **record)
    X = rng.standard_normal((2, d)).astype(np.float32)
    positions, pages = np.array([1, 2]), np.array([0, 2])
    silkattn.ops.layer_step_rows(step, X.copy(), positions, K, V, pages)
    positions[1], pages[:] = 4, [2, 1]  # in place: the same arrays, other rows
    got = silkattn.ops.layer_step_rows(step, X.copy(), positions, K.copy(), V.copy(), pages)
    fresh = silkattn.ops.layer_step_rows(step, X.copy(), np.array([1, 4]), K.copy(), V.copy(),
                                         np.array([2, 1]))
    assert np.array_equal(got, fresh)
    assert positions.flags.writeable and pages.flags.writeable
    with pytest.raises(ValueError, match="pages must name"):
        silkattn.ops.layer_step_rows(step, X.copy(), positions, K[:2], V[:2], pages)
    with pytest.raises(ValueError, match="overlap"):
        silkattn.ops.layer_step_rows(step, K.reshape(-1)[:2 * d].reshape(2, d), positions, K, V, pages)


def test_a_block_product_with_a_bias_and_the_residual_is_refused(rng):
    record, shape, _ = llama_layer(rng, "Q8_0", "float32")
    record["o"] = (record["o"], np.zeros(64, np.float32))
    K = np.zeros(shape, np.float32)
    with pytest.raises(ValueError, match="residual"):
        silkattn.ops.layer_step_record(cache=(K, K.copy()), **record)


@pytest.mark.parametrize("case", ROWS_CASES)
def test_numba_step_writes_the_ops_keys_to_the_bit(rng, case):
    """numba's fused step writes the K and V rows its own ops would (the same norm and products; the
    rotary without FMA contraction, as the reference's: a function that leaves fastmath unset
    inherits its caller's, which once made the step's x c - y s one FMA)."""
    from silkattn import _api, _backends
    record, shape, d = CASES[case](rng)
    x = rng.standard_normal(d).astype(np.float32)
    with silkattn.use_backend("numba"):
        caches = [tuple(np.zeros(shape, np.float32) for _ in range(2)) for _ in range(2)]
        fused, ops_step = (silkattn.ops.layer_step_record(cache=c, **record) for c in caches)
        silkattn.ops.layer_step(fused, x.copy(), 3)
        _api._layer_step_ops(_backends.kernels(), ops_step, x.copy(), 3)
    for a, b in zip(*caches):
        assert np.array_equal(a, b) and np.abs(a).max() > 0
