"""attention's keywords on every backend against the reference: scale, softcap, bias, alibi_slopes,
window, causal with q_offset, a mask and grouped-query heads (GQA), each alone and every pair, in
float32 and float64, on both paths of the plan (silkattn._plan: "rows" when every K/V head has at
most ROWS_MAX query rows, "tiles" otherwise) and at their edges; properties over combinations
(hypothesis); equivalent spellings of one attention (a mask and its additive bias, a window and its
mask, ALiBi and its bias, GQA and repeated K/V, decode steps and the prefill); attention_varlen
with cu_seqlens_k; positions and element offsets past 2**31."""
import itertools
import mmap
import os
import platform
import sys
import types
from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import silkattn
from silkattn import _plan
from silkattn import reference as ref
from silkattn._testing import TOL

from conftest import DTYPES, assert_close, f64

EXAMPLES = 300 if os.environ.get("HYPOTHESIS_PROFILE") == "long" else 25
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))


def alibi_slopes(H):
    """ALiBi's slopes for H heads: 2 ** (-8 h / H), h = 1 .. H."""
    return 2.0 ** (-8.0 * np.arange(1, H + 1) / H)


class Geometry(NamedTuple):
    """One call's shapes: Q (*lead, Hq, Sq, dk), K and V (*lead, Hq / g, Sk, dk | dv); pos: the
    q_offset whenever causal, a window or ALiBi place the queries; window: the one its window
    feature uses; mask and bias: their shapes (broadcast to (*lead, Hq, Sq, Sk))."""
    lead: tuple
    Hq: int
    Sq: int
    Sk: int
    pos: int
    dk: int
    dv: int
    window: tuple
    mask: tuple
    bias: tuple
    path: str  # the plan's path, with or without GQA (g = 2): checked by test_geometries_take_their_path


GEOMETRIES = {
    # query tiles of 64 (Numba) / up to 96-144 (Cython) and key tiles of 64 all cut mid-way; the
    # window (37, 5) starts and ends inside a key tile; bottom-right aligned (a prefill after a cache)
    "tiles": Geometry((2,), 4, 130, 197, 67, 20, 13, (37, 5), (2, 1, 130, 197), (2, 4, 130, 197), "tiles"),
    "square": Geometry((), 4, 130, 130, 0, 36, 36, (37, 5), (4, 130, 130), (130, 130), "tiles"),
    "tiles17": Geometry((), 4, 17, 300, 283, 16, 16, (64, 3), (4, 17, 300), (300,), "tiles"),  # ROWS_MAX + 1
    # a few new tokens after ~2048 cached keys: the rows path, windows across its 256-key chunks
    "rows3": Geometry((), 4, 3, 2050, 1700, 24, 40, (300, 5), (3, 2050), (4, 1, 2050), "rows"),
    "rows8": Geometry((2,), 4, 8, 2047, 2039, 12, 12, (513, 0), (2, 4, 8, 2047), (2, 1, 8, 2047), "rows"),
    "decode": Geometry((3,), 4, 1, 777, 600, 7, 9, (255, 100), (3, 1, 1, 777), (3, 4, 1, 777), "rows"),
}
FEATURES = ("scale", "softcap", "bias", "alibi", "window", "causal", "mask", "gqa")
COMBOS = [(f,) for f in FEATURES] + list(itertools.combinations(FEATURES, 2))
POSITIONED = {"alibi", "window", "causal"}  # the features q_offset places the queries for


def normal(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def hide_a_row(mask):
    """A mask (a fresh array) with the first row of its first item seeing no key."""
    mask = mask.copy()
    mask[(0,) * (mask.ndim - 1)] = False
    return mask


def problem(features, geo, dtype, rng):
    """(Q, K, V, mask, keywords) of one call of geometry geo with the given features on."""
    g = 2 if "gqa" in features else 1
    Q = normal(rng, geo.lead + (geo.Hq, geo.Sq, geo.dk), dtype)
    K = normal(rng, geo.lead + (geo.Hq // g, geo.Sk, geo.dk), dtype)
    V = normal(rng, geo.lead + (geo.Hq // g, geo.Sk, geo.dv), dtype)
    kw, mask = {}, None
    if "scale" in features:
        kw["scale"] = 0.7
    if "softcap" in features:
        kw["softcap"] = 1.5  # scores of std 1 (or ~3 with the scale above): tanh bends them
    if "bias" in features:
        kw["bias"] = normal(rng, geo.bias, dtype)
    if "alibi" in features:
        kw["alibi_slopes"] = alibi_slopes(geo.Hq)
    if "window" in features:
        kw["window"] = geo.window
    if "causal" in features:
        kw["causal"] = True
    if POSITIONED & set(features):
        kw["q_offset"] = geo.pos
    if "mask" in features:
        mask = hide_a_row(rng.random(geo.mask) < 0.75)
    return Q, K, V, mask, kw


def expected(Q, K, V, mask=None, **kw):
    """The reference's answer in float64 on the same inputs (bias included)."""
    if kw.get("bias") is not None:
        kw["bias"] = np.asarray(kw["bias"], np.float64)
    return ref.attention(*f64(Q, K, V), mask, **kw)


def plan_path(Q, K, V, mask=None, bias=None, q_offset=0):
    """The path ("rows" or "tiles") silkattn._plan takes for this call."""
    from silkattn import _api
    Q, K, V, mask, bias, lead, _, _ = _api.prepare_attention(Q, K, V, mask, None, bias)
    _, items, nunits = _api._layout(Q, K, V, mask, bias, lead, q_offset, None)
    plan = types.SimpleNamespace(items=items, units=np.zeros(nunits, _plan.UNIT))
    return "rows" if _plan.takes_rows(plan) else "tiles"


# ---------------------------------------------------------------- every feature, every pair

@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("geo", list(GEOMETRIES))
@pytest.mark.parametrize("features", COMBOS, ids="+".join)
def test_features_and_pairs_match_reference(any_backend, rng, features, geo, dtype):
    Q, K, V, mask, kw = problem(features, GEOMETRIES[geo], dtype, rng)
    out = any_backend.attention(Q, K, V, mask, **kw)
    assert_close(out, expected(Q, K, V, mask, **kw), dtype)


@pytest.mark.parametrize("geo", list(GEOMETRIES))
def test_geometries_take_their_path(geo):
    """The geometries above reach the path they are meant for, with and without GQA (g = 2)."""
    rng = np.random.default_rng(0)
    for features in [(), ("gqa",)]:
        Q, K, V, _, _ = problem(features, GEOMETRIES[geo], np.float32, rng)
        assert plan_path(Q, K, V) == GEOMETRIES[geo].path, (geo, features)


def test_gqa_reaches_both_paths_at_the_rows_edge():
    """g query heads x Sq new queries share one K/V head: ROWS_MAX of them take the rows path."""
    rng = np.random.default_rng(0)
    for g, Sq in [(2, 8), (8, 2), (4, 4), (16, 1)]:
        assert g * Sq == _plan.ROWS_MAX
        K = normal(rng, (2, 1, 50, 8), np.float32)
        assert plan_path(normal(rng, (2, g, Sq, 8), np.float32), K, K) == "rows"
        assert plan_path(normal(rng, (2, g, Sq + 1, 8), np.float32), K, K) == "tiles"


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("geo", ["tiles", "rows3", "decode"])
def test_all_features_at_once(any_backend, threads, rng, geo, dtype):
    Q, K, V, mask, kw = problem(FEATURES, GEOMETRIES[geo], dtype, rng)
    out = np.full(Q.shape[:-1] + V.shape[-1:], np.nan, dtype)
    assert any_backend.attention(Q, K, V, mask, out=out, **kw) is out
    assert_close(out, expected(Q, K, V, mask, **kw), dtype)


@pytest.mark.parametrize("geo", ["tiles", "rows8", "decode"])
def test_all_features_are_the_same_on_any_thread_count(backend, rng, geo):
    Q, K, V, mask, kw = problem(FEATURES, GEOMETRIES[geo], np.float32, rng)
    results = []
    for n in (1, 2, 3):
        previous = silkattn.set_num_threads(n)
        try:
            results.append(backend.attention(Q, K, V, mask, **kw))
        finally:
            silkattn.set_num_threads(previous)
    assert_close(results[0], expected(Q, K, V, mask, **kw), np.float32)
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


# ---------------------------------------------------------------- grouped-query attention

GROUPS = [1, 2, 3, 4, 8, 24]  # Hq = 24 query heads over 24 (MHA), 12, 8, 6, 3 and 1 (MQA) K/V heads


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("kind", ["plain", "causal_window"])
@pytest.mark.parametrize("Sq", [1, 2, 3, 8, 70])
@pytest.mark.parametrize("g", GROUPS)
def test_gqa_equals_repeated_kv(any_backend, rng, g, Sq, kind, dtype):
    Hq, Sk, dk, dv = 24, 300, 12, 10
    if kind == "plain":  # K and V broadcast over the batch, too
        Q, K, V = normal(rng, (2, Hq, Sq, dk), dtype), normal(rng, (1, Hq // g, Sk, dk), dtype), normal(
            rng, (1, Hq // g, Sk, dv), dtype)
        kw = {}
    else:
        Q, K, V = normal(rng, (Hq, Sq, dk), dtype), normal(rng, (Hq // g, Sk, dk), dtype), normal(
            rng, (Hq // g, Sk, dv), dtype)
        kw = dict(causal=True, q_offset=Sk - Sq - 5, window=(150, 0))
    Kr, Vr = np.repeat(K, g, axis=-3), np.repeat(V, g, axis=-3)
    out = any_backend.attention(Q, K, V, **kw)
    assert_close(out, expected(Q, Kr, Vr, **kw), dtype)
    np.testing.assert_allclose(out, any_backend.attention(Q, Kr, Vr, **kw), **TOL[np.dtype(dtype)])


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("g", [1, 4, 8])
def test_decode_steps_equal_the_prefill_with_gqa(any_backend, rng, g, dtype):
    """Query t of a causal prefill (tiles) == the call for query t alone (rows: decode) and for
    queries t-2 .. t (a few new tokens), with q_offset, against the cache so far or all of it."""
    Hq, S = 8, 300
    Q, K, V = normal(rng, (2, Hq, S, 24), dtype), normal(rng, (2, Hq // g, S, 24), dtype), normal(
        rng, (2, Hq // g, S, 20), dtype)
    kw = dict(causal=True, window=(100, 0), alibi_slopes=alibi_slopes(Hq), softcap=4.0)
    full = any_backend.attention(Q, K, V, **kw)
    assert_close(full, expected(Q, K, V, **kw), dtype)
    tol = TOL[np.dtype(dtype)]
    for t in (0, 1, 2, 63, 64, 100, 101, 255, 256, 257, 299):
        q, k, v = Q[..., t:t + 1, :], K[..., :t + 1, :], V[..., :t + 1, :]
        step = any_backend.attention(q, k, v, q_offset=t, **kw)
        np.testing.assert_allclose(step, full[..., t:t + 1, :], **tol)
        step = any_backend.attention(q, K, V, q_offset=t, **kw)  # the later keys: hidden
        np.testing.assert_allclose(step, full[..., t:t + 1, :], **tol)
        if t >= 2:
            few = any_backend.attention(Q[..., t - 2:t + 1, :], K[..., :t + 1, :], V[..., :t + 1, :],
                                        q_offset=t - 2, **kw)
            np.testing.assert_allclose(few, full[..., t - 2:t + 1, :], **tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("g", [1, 4])
def test_streamed_rows_path_is_bitwise_the_cached_one(any_backend, threads, rng, g, dtype, monkeypatch):
    """K/V past half the last-level cache set the plan's stream (the C rows path then prefetches the
    next block of keys, up to the group's last key): the same bits as without, mask, window and a
    chunk edge included. A cut LLC_BYTES makes these small calls stream."""
    Hq, S = 8, 600
    Q, K, V = normal(rng, (2, Hq, 1, 64), dtype), normal(rng, (2, Hq // g, S, 64), dtype), normal(
        rng, (2, Hq // g, S, 48), dtype)
    mask = hide_a_row(rng.random((2, Hq, 1, S)) < 0.7)
    calls = [dict(), dict(q_offset=S - 1, causal=True, window=(300, 0)), dict(mask=mask)]
    silkattn.clear_cache()  # plans kept for these shapes hold the stream they were made with
    cached = [any_backend.attention(Q, K, V, **kw) for kw in calls]
    monkeypatch.setattr(_plan, "LLC_BYTES", 0)
    streams, rows_path = [], _plan._rows_path
    monkeypatch.setattr(_plan, "_rows_path", lambda plan: (rows_path(plan), streams.append(plan.stream)))
    silkattn.clear_cache()
    streamed = [any_backend.attention(Q, K, V, **kw) for kw in calls]
    silkattn.clear_cache()
    planned = not any_backend.__name__.endswith("_numpy")  # the reference plans nothing
    assert streams == [True] * (len(calls) if planned else 0)
    for kw, a, b in zip(calls, cached, streamed):
        assert_close(b, expected(Q, K, V, **kw), dtype)
        np.testing.assert_array_equal(a, b)


# A group of a multiple of 4 query rows per K/V head, d_k a multiple of 16, runs four rows per K
# load in the 64-byte float copy (rows4 in tmpl_attention.h); other groups and head sizes one dot
# product per row. (g, Sq): the group's rows are g heads x Sq queries. Sk = 333: a 256-key chunk
# edge and a tail of keys past the last 16; the window (70, 0) leaves some rows of a group no key
# in a block the others see; every rule once, with a mask hiding a row.
ROW_GROUPS = [(4, 1), (8, 1), (16, 1), (2, 2), (4, 4), (1, 4), (3, 1), (2, 1)]
ROW_CALLS = {"plain": dict(), "window": dict(causal=True, window=(70, 0), q_offset=329),
             "rules": dict(softcap=3.0, alibi=True, bias=True, mask=True, q_offset=329, causal=True)}


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("call", list(ROW_CALLS))
@pytest.mark.parametrize("dk", [16, 64, 128, 256, 40])
@pytest.mark.parametrize("rows", ROW_GROUPS, ids=lambda r: f"g{r[0]}xq{r[1]}")
def test_groups_of_four_rows_match_reference(any_backend, rng, rows, dk, call, dtype):
    (g, Sq), Hkv, Sk = rows, 2, 333
    Q, K = normal(rng, (Hkv * g, Sq, dk), dtype), normal(rng, (Hkv, Sk, dk), dtype)
    V = normal(rng, (Hkv, Sk, 24), dtype)
    kw, mask = dict(ROW_CALLS[call]), None
    if kw.get("q_offset"):
        kw["q_offset"] = Sk - Sq
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = alibi_slopes(Hkv * g)
    if kw.pop("bias", False):
        kw["bias"] = normal(rng, (Hkv * g, Sq, Sk), dtype)
    if kw.pop("mask", False):
        mask = hide_a_row(rng.random((Hkv * g, Sq, Sk)) < 0.8)
    assert plan_path(Q, K, V, mask, kw.get("bias"), kw.get("q_offset", 0)) == "rows"
    out = any_backend.attention(Q, K, V, mask, **kw)
    assert_close(out, expected(Q, K, V, mask, **kw), dtype)
    # the same call with K/V repeated per query head: one row a group, the per-row dot products
    Kr, Vr = np.repeat(K, g, axis=0), np.repeat(V, g, axis=0)
    np.testing.assert_allclose(out, any_backend.attention(Q, Kr, Vr, mask, **kw), **TOL[np.dtype(dtype)])


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_gqa_with_per_head_mask_and_bias(any_backend, rng, dtype):
    """A mask and a bias with one slice per query head (not per K/V head) under GQA."""
    Hq, g = 6, 3
    for Sq in (2, 40):  # rows (g * Sq = 6), tiles
        Q, K, V = normal(rng, (2, Hq, Sq, 16), dtype), normal(rng, (2, Hq // g, 90, 16), dtype), normal(
            rng, (2, Hq // g, 90, 16), dtype)
        mask = hide_a_row(rng.random((Hq, Sq, 90)) < 0.6)
        bias = normal(rng, (2, Hq, 1, 90), dtype)
        out = any_backend.attention(Q, K, V, mask, bias=bias)
        assert_close(out, expected(Q, K, V, mask, bias=bias), dtype)


# The calls today's models make (head sizes of 128 and 256, their group sizes, softcap, sliding
# windows, ALiBi), and windows starting exactly at, or one key before, a 256-key chunk edge.
MODEL_CASES = {  # name: (Hq, Hkv, Sq, Sk, d, keywords; q_offset = Sk - Sq whenever placed)
    "gemma2_decode": (8, 4, 1, 1000, 256, dict(causal=True, window=(511, 0), softcap=50.0, scale=1 / 16)),
    "gemma2_prefill": (4, 2, 100, 100, 256, dict(causal=True, window=(31, 0), softcap=50.0)),
    "llama_prefill": (8, 2, 150, 150, 128, dict(causal=True)),
    "llama_few_new": (32, 8, 4, 700, 128, dict(causal=True)),  # 4 heads x 4 queries a group: rows
    "llama_five_new": (32, 8, 5, 700, 128, dict(causal=True)),  # 20 a group: tiles
    "mistral_decode": (8, 2, 1, 600, 128, dict(causal=True, window=(255, 0))),
    "window_at_chunk_edge": (2, 1, 1, 512, 64, dict(causal=True, window=(255, 0))),  # keys 256 .. 511
    "window_before_chunk_edge": (2, 1, 1, 512, 64, dict(causal=True, window=(256, 0))),  # keys 255 .. 511
    "bloom_alibi": (8, 8, 70, 70, 64, dict(causal=True, alibi_slopes=alibi_slopes(8))),
    "mpt_alibi_decode": (8, 8, 1, 300, 64, dict(causal=True, alibi_slopes=alibi_slopes(8))),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("case", list(MODEL_CASES))
def test_model_shaped_calls(any_backend, rng, case, dtype):
    Hq, Hkv, Sq, Sk, d, kw = MODEL_CASES[case]
    kw = dict(kw, q_offset=Sk - Sq)
    Q, K, V = (normal(rng, shape, dtype) for shape in ((Hq, Sq, d), (Hkv, Sk, d), (Hkv, Sk, d)))
    assert_close(any_backend.attention(Q, K, V, **kw), expected(Q, K, V, **kw), dtype)


# ---------------------------------------------------------------- the same attention, spelled twice

@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("geo", ["tiles", "rows3", "decode"])
def test_a_mask_and_its_additive_bias_agree(any_backend, rng, geo, dtype):
    """mask False replaces the score by -1e9; bias -1e30 adds to it: the softmax weighs both keys 0
    as long as the row sees some key, so those rows agree; a row that sees none is mean(V) with the mask."""
    geo = GEOMETRIES[geo]
    Q, K, V, _, _ = problem((), geo, dtype, rng)
    mask = hide_a_row(rng.random(geo.lead + (geo.Hq, geo.Sq, geo.Sk)) < 0.3)
    bias = np.where(mask, 0, -1e30).astype(dtype)
    by_mask, by_bias = any_backend.attention(Q, K, V, mask), any_backend.attention(Q, K, V, bias=bias)
    assert_close(by_mask, expected(Q, K, V, mask), dtype)
    assert_close(by_bias, expected(Q, K, V, bias=bias), dtype)
    seen = mask.any(-1)
    assert not seen.all()
    np.testing.assert_allclose(by_bias[seen], by_mask[seen], **TOL[np.dtype(dtype)])
    mean_v = np.broadcast_to(V.astype(np.float64).mean(-2, keepdims=True), by_mask.shape)
    np.testing.assert_allclose(by_mask[~seen], mean_v[~seen], **TOL[np.dtype(dtype)])


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("geo", ["tiles", "square", "rows3", "decode"])
def test_window_causal_and_alibi_equal_their_explicit_mask_and_bias(any_backend, rng, geo, dtype):
    geo = GEOMETRIES[geo]
    Q, K, V, _, _ = problem((), geo, dtype, rng)
    tol = TOL[np.dtype(dtype)]
    for causal in (False, True):
        shown = ref.visible(geo.Sq, geo.Sk, geo.pos, causal, geo.window)
        by_rule = any_backend.attention(Q, K, V, causal=causal, window=geo.window, q_offset=geo.pos)
        np.testing.assert_allclose(by_rule, any_backend.attention(Q, K, V, shown), **tol)
        assert_close(by_rule, expected(Q, K, V, shown), dtype)
    slopes = alibi_slopes(geo.Hq)
    by_alibi = any_backend.attention(Q, K, V, alibi_slopes=slopes, q_offset=geo.pos)
    bias = ref.alibi(slopes, geo.Sq, geo.Sk, geo.pos, np.float64).astype(dtype)
    np.testing.assert_allclose(by_alibi, any_backend.attention(Q, K, V, bias=bias), **tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_window_spellings(any_backend, rng, dtype):
    """None or -1 on a side: unbounded; any ints; causal caps the right side at 0."""
    Q, K, V = (normal(rng, (2, S, 16), dtype) for S in (70, 100, 100))
    plain = any_backend.attention(Q, K, V)
    base = any_backend.attention(Q, K, V, window=(-1, 5), q_offset=10)
    assert_close(base, expected(Q, K, V, window=(-1, 5), q_offset=10), dtype)
    for w in [(None, 5), [-1, 5], (np.int64(-1), np.int32(5)), np.array([-1, 5])]:
        np.testing.assert_array_equal(any_backend.attention(Q, K, V, window=w, q_offset=10), base)
    np.testing.assert_array_equal(any_backend.attention(Q, K, V, window=(-1, -1)), plain)
    np.testing.assert_array_equal(any_backend.attention(Q, K, V, window=(None, None)), plain)
    np.testing.assert_array_equal(any_backend.attention(Q, K, V, causal=True, window=(20, 7)),
                                  any_backend.attention(Q, K, V, causal=True, window=(20, 0)))
    only_self = any_backend.attention(Q, K, V, window=(0, 0))  # query i sees key i alone
    assert_close(only_self, V[:, :70].astype(np.float64), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("Sq, Sk, q_offset", [(130, 100, 0), (5, 100, 98), (1, 300, 300)],
                         ids=["tiles", "rows", "decode"])
def test_rows_that_see_no_key_get_mean_v(any_backend, rng, Sq, Sk, q_offset, dtype):
    """A window past the last key hides every key of a row: mean(V), whatever bias, ALiBi, softcap
    or scale the visible keys would have had."""
    Hq, g = 4, 2
    Q, K, V = normal(rng, (Hq, Sq, 12), dtype), normal(rng, (Hq // g, Sk, 12), dtype), normal(
        rng, (Hq // g, Sk, 7), dtype)
    kw = dict(window=(0, 0), q_offset=q_offset, bias=normal(rng, (Hq, Sq, Sk), dtype) * 5,
              alibi_slopes=alibi_slopes(Hq), softcap=2.0, scale=3.0)
    out = any_backend.attention(Q, K, V, **kw)
    assert_close(out, expected(Q, K, V, **kw), dtype)
    blind = q_offset + np.arange(Sq) >= Sk
    assert blind.any()
    mean_v = np.repeat(V.astype(np.float64).mean(-2), g, axis=0)  # (Hq, dv)
    np.testing.assert_allclose(out[:, blind], np.broadcast_to(mean_v[:, None], out[:, blind].shape),
                               **TOL[np.dtype(dtype)])


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_scale_softcap_and_bias_inputs(any_backend, rng, dtype):
    """scale as any real number (numpy scalars too), softcap bounding the scores, integer bias."""
    Q, K, V = normal(rng, (3, 50, 20), dtype), normal(rng, (3, 60, 20), dtype), normal(rng, (3, 60, 8), dtype)
    default = any_backend.attention(Q, K, V)
    np.testing.assert_allclose(any_backend.attention(Q, K, V, scale=dtype(1 / np.sqrt(20))), default,
                               **TOL[np.dtype(dtype)])
    for scale in (np.float64(0.01), 2, 5.0):
        assert_close(any_backend.attention(Q, K, V, scale=scale), expected(Q, K, V, scale=scale), dtype)
    huge = any_backend.attention(Q * dtype(30), K, V, softcap=0.5)  # every score within +-0.5
    assert_close(huge, expected(Q * dtype(30), K, V, softcap=0.5), dtype)
    int_bias = rng.integers(-3, 4, (60,))
    assert_close(any_backend.attention(Q, K, V, bias=int_bias), expected(Q, K, V, bias=int_bias), dtype)
    wide = rng.standard_normal((50, 60))  # a float64 bias takes the scores' dtype, as in the reference
    assert_close(any_backend.attention(Q, K, V, bias=wide), expected(Q, K, V, bias=wide.astype(dtype)), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("Sq", [2, 75], ids=["rows", "tiles"])
def test_features_on_views(any_backend, rng, Sq, dtype):
    """Heads as strided views of packed projections (GQA: 8 query heads, 2 K/V heads), reversed
    rows, a transposed mask and a broadcast (zero-stride) bias: no copy needed to be right."""
    Hq, Hkv, dk, Sk = 8, 2, 16, 150
    X = normal(rng, (Sq, Hq * dk), dtype)
    KV = normal(rng, (Sk, 2 * Hkv * dk), dtype)

    def heads(M, h):  # (rows, h * dk) -> (h, rows, dk), row stride of the whole projection
        return M.reshape(len(M), h, dk).swapaxes(0, 1)

    Q, K, V = heads(X, Hq), heads(KV[:, :Hkv * dk], Hkv), heads(KV[:, Hkv * dk:], Hkv)
    mask = np.ascontiguousarray((rng.random((Sq, Sk)) < 0.8).T).T  # its key axis is not contiguous
    bias = np.broadcast_to(normal(rng, (1, Sk), dtype), (Hq, Sq, Sk))
    kw = dict(bias=bias, alibi_slopes=alibi_slopes(Hq), causal=True, window=(60, 0), q_offset=Sk - Sq,
              softcap=5.0)
    assert_close(any_backend.attention(Q, K, V, mask, **kw), expected(Q, K, V, mask, **kw), dtype)
    rQ, rK, rV = Q[:, ::-1], K[:, ::-1], V[:, ::-1]
    assert_close(any_backend.attention(rQ, rK, rV, mask[::-1, ::-1], **kw),
                 expected(rQ, rK, rV, mask[::-1, ::-1], **kw), dtype)


# ---------------------------------------------------------------- properties over combinations

@st.composite
def feature_problems(draw):
    """(Q, K, V, mask, keywords): random small shapes, heads and groups, any subset of the keywords."""
    dtype = draw(st.sampled_from(DTYPES))
    Hkv, g = draw(st.integers(1, 3)), draw(st.sampled_from([1, 2, 3, 5]))
    Hq = Hkv * g
    lead = tuple(draw(st.lists(st.integers(1, 2), max_size=1)))
    Sq, Sk = draw(st.integers(0, 40)), draw(st.integers(1, 150))
    dk, dv = draw(st.integers(1, 40)), draw(st.integers(1, 33))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    Q = normal(rng, lead + (Hq, Sq, dk), dtype)
    K, V = normal(rng, lead + (Hkv, Sk, dk), dtype), normal(rng, lead + (Hkv, Sk, dv), dtype)
    on = draw(st.sets(st.sampled_from(["scale", "softcap", "bias", "alibi", "window", "causal", "mask"])))
    kw, mask = {}, None
    if "scale" in on:
        kw["scale"] = draw(st.sampled_from([0.02, 0.3, 0.9]))
    if "softcap" in on:
        kw["softcap"] = draw(st.sampled_from([0.3, 2.0, 30.0]))
    if "bias" in on:
        shape = draw(st.sampled_from([(Sk,), (Sq, Sk), (Hq, 1, Sk), lead + (Hq, Sq, Sk), (1, Sq, 1)]))
        kw["bias"] = normal(rng, shape, dtype) * draw(st.sampled_from([0.1, 3.0]))
    if "alibi" in on:
        kw["alibi_slopes"] = rng.uniform(0, 0.5, Hq)
    if "window" in on:
        side = st.one_of(st.none(), st.integers(-1, Sk + 3))
        kw["window"] = (draw(side), draw(side))
    if "causal" in on:
        kw["causal"] = True
    if on & POSITIONED:
        kw["q_offset"] = draw(st.integers(0, Sk + 5))
    if "mask" in on:
        shape = draw(st.sampled_from([(Sq, Sk), (Hq, Sq, Sk), (Hq, 1, Sk), lead + (1, Sq, Sk)]))
        mask = rng.random(shape) < draw(st.sampled_from([0.1, 0.7, 1.0]))
    return Q, K, V, mask, kw


@PROPERTY
@given(problem=feature_problems())
def test_feature_combinations_match_reference(any_backend, problem):
    Q, K, V, mask, kw = problem
    out = any_backend.attention(Q, K, V, mask, **kw)
    assert_close(out, expected(Q, K, V, mask, **kw), Q.dtype)


@PROPERTY
@given(problem=feature_problems())
def test_rules_equal_their_explicit_arrays(any_backend, problem):
    """One attention spelled two ways on the same backend: causal and window as a mask, ALiBi as a
    bias, GQA as K/V repeated, agree."""
    Q, K, V, mask, kw = problem
    out = any_backend.attention(Q, K, V, mask, **kw)
    Sq, Sk, Hq = Q.shape[-2], K.shape[-2], Q.shape[-3]
    q_offset = kw.pop("q_offset", 0)
    shown = ref.visible(Sq, Sk, q_offset, kw.pop("causal", False), kw.pop("window", None))
    mask = shown if mask is None else mask & shown
    slopes = kw.pop("alibi_slopes", None)
    if slopes is not None:
        alibi = ref.alibi(slopes, Sq, Sk, q_offset, np.float64)
        kw["bias"] = (alibi if kw.get("bias") is None else kw["bias"] + alibi).astype(Q.dtype)
    g = Hq // K.shape[-3]
    K, V = np.repeat(K, g, axis=-3), np.repeat(V, g, axis=-3)
    np.testing.assert_allclose(out, any_backend.attention(Q, K, V, mask, **kw), **TOL[Q.dtype])


@PROPERTY
@given(problem=feature_problems(), shift=st.sampled_from([-40.0, 7.5]))
def test_a_per_row_bias_constant_changes_nothing(any_backend, problem, shift):
    """softmax is blind to a constant added to a row's scores: hidden keys stay at -1e9 (replaced)."""
    Q, K, V, mask, kw = problem
    out = any_backend.attention(Q, K, V, mask, **kw)
    row = np.float64(shift) * np.arange(Q.shape[-2])[:, None] / max(Q.shape[-2], 1)
    bias = (row if kw.get("bias") is None else row + kw["bias"]).astype(Q.dtype)
    shifted = any_backend.attention(Q, K, V, mask, **dict(kw, bias=bias))
    assert_close(shifted, out.astype(np.float64), Q.dtype)


# ---------------------------------------------------------------- attention_varlen

VARLEN_CASES = {  # name: (query lengths, key lengths or None: the same rows)
    "self_with_empty": ([5, 0, 7, 1], None),
    "decode_packed": ([1, 1, 1, 1], [300, 1, 64, 257]),  # one new token per sequence: rows
    "few_new_after_cache": ([3, 8, 1], [2048, 700, 5]),  # rows, 256-key chunks
    "prefill_after_cache": ([130, 0, 65, 2], [200, 3, 65, 300]),  # tiles; a sequence with keys, no queries
    "more_queries_than_keys": ([40, 17], [12, 17]),  # causal: the first queries sit before every key
    "empty_sequences": ([0, 0, 4, 0], [5, 0, 4, 0]),
}
VARLEN_FEATURES = {
    "plain": {}, "causal": dict(causal=True), "window": dict(window=(9, 2)),
    "causal_window": dict(causal=True, window=(70, 0)), "alibi_softcap": dict(alibi_slopes=True, softcap=2.0),
    "bias_scale": dict(bias=True, scale=0.4), "all": dict(causal=True, window=(33, 0), alibi_slopes=True,
                                                          softcap=3.0, bias=True, scale=0.3),
}


def varlen_problem(rng, q_lengths, k_lengths, features, dtype, Hq=4, g=2):
    cu = np.concatenate([[0], np.cumsum(q_lengths)]).astype(np.int64)
    cu_k = None if k_lengths is None else np.concatenate([[0], np.cumsum(k_lengths)]).astype(np.int32)
    total_q, total_k = int(cu[-1]), int(cu[-1] if cu_k is None else cu_k[-1])
    Q = normal(rng, (Hq, total_q, 20), dtype)
    K, V = normal(rng, (Hq // g, total_k, 20), dtype), normal(rng, (Hq // g, total_k, 11), dtype)
    kw = dict(features)
    if kw.get("alibi_slopes"):
        kw["alibi_slopes"] = alibi_slopes(Hq)
    if kw.get("bias"):
        small = total_q * total_k <= 20000
        kw["bias"] = normal(rng, (Hq, total_q, total_k) if small else (Hq, 1, total_k), dtype)
    if cu_k is not None:
        kw["cu_seqlens_k"] = cu_k
    return Q, K, V, cu, kw


def varlen_expected(Q, K, V, cu, **kw):
    if kw.get("bias") is not None:
        kw["bias"] = np.asarray(kw["bias"], np.float64)
    return ref.attention_varlen(*f64(Q, K, V), cu, **kw)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("features", list(VARLEN_FEATURES))
@pytest.mark.parametrize("case", list(VARLEN_CASES))
def test_varlen_matches_reference(any_backend, rng, case, features, dtype):
    Q, K, V, cu, kw = varlen_problem(rng, *VARLEN_CASES[case], VARLEN_FEATURES[features], dtype)
    out = any_backend.attention_varlen(Q, K, V, cu, **kw)
    assert_close(out, varlen_expected(Q, K, V, cu, **kw), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_varlen_equals_one_call_per_sequence(any_backend, threads, rng, dtype):
    """Sequence i of a packed call == attention on its own rows with q_offset = keys - queries."""
    q_lengths, k_lengths = [3, 1, 70, 0, 20], [300, 1, 150, 9, 20]
    Q, K, V, cu, kw = varlen_problem(rng, q_lengths, k_lengths, dict(causal=True, window=(50, 0), softcap=5.0,
                                                                     alibi_slopes=True), dtype)
    out = any_backend.attention_varlen(Q, K, V, cu, **kw)
    cu_k = kw.pop("cu_seqlens_k")
    for i in range(len(q_lengths)):
        rows, keys = slice(cu[i], cu[i + 1]), slice(cu_k[i], cu_k[i + 1])
        q_offset = k_lengths[i] - q_lengths[i]
        alone = any_backend.attention(Q[:, rows], K[:, keys], V[:, keys], q_offset=q_offset, **kw)
        np.testing.assert_allclose(out[:, rows], alone, **TOL[np.dtype(dtype)])
    assert_close(out, varlen_expected(Q, K, V, cu, cu_seqlens_k=cu_k, **kw), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_varlen_with_a_batch_axis_and_out(any_backend, rng, dtype):
    """(batch, Hq, total, d) packs, K and V broadcast over the batch with fewer heads, out= given."""
    cu, cu_k = np.array([0, 1, 4, 4, 90]), np.array([0, 300, 303, 310, 400])
    Q = normal(rng, (2, 6, 90, 12), dtype)
    K, V = normal(rng, (1, 2, 400, 12), dtype), normal(rng, (1, 2, 400, 9), dtype)
    kw = dict(cu_seqlens_k=cu_k, causal=True, window=(64, 0), alibi_slopes=alibi_slopes(6),
              bias=normal(rng, (2, 1, 1, 400), dtype))
    out = np.full((2, 6, 90, 9), np.nan, dtype)
    assert any_backend.attention_varlen(Q, K, V, cu, out=out, **kw) is out
    assert_close(out, varlen_expected(Q, K, V, cu, **kw), dtype)


@PROPERTY
@given(data=st.data())
def test_varlen_combinations_match_reference(any_backend, data):
    dtype = data.draw(st.sampled_from(DTYPES))
    n = data.draw(st.integers(1, 5))
    q_lengths = data.draw(st.lists(st.integers(0, 20), min_size=n, max_size=n))
    k_lengths = [data.draw(st.integers(1 if nq else 0, 40)) for nq in q_lengths]
    if data.draw(st.booleans()):
        k_lengths = None  # the keys are the queries' own rows
    names = data.draw(st.sets(st.sampled_from(["causal", "window", "alibi_slopes", "softcap", "bias",
                                                "scale"])))
    features = {"causal": True, "window": (data.draw(st.integers(-1, 12)), data.draw(st.integers(-1, 12))),
                "alibi_slopes": True, "softcap": 1.0, "bias": True, "scale": 0.25}
    g = data.draw(st.sampled_from([1, 2, 4]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1)))
    Q, K, V, cu, kw = varlen_problem(rng, q_lengths, k_lengths, {k: features[k] for k in names}, dtype, 4, g)
    out = any_backend.attention_varlen(Q, K, V, cu, **kw)
    assert_close(out, varlen_expected(Q, K, V, cu, **kw), dtype)


# ---------------------------------------------------------------- 64-bit positions and offsets

@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("Sq", [1, 4, 130], ids=["decode", "rows", "tiles"])
@pytest.mark.parametrize("q_offset", [2 ** 31 - 2, 2 ** 32 + 3])
def test_positions_past_2_to_the_31(any_backend, rng, q_offset, Sq, dtype):
    """Queries at positions around 2**31 and past 2**32, a window reaching back to key 100 + i:
    positions, window bounds and key ranges must be 64-bit (32 bits would hide or show other keys)."""
    Hq, Sk = 4, 300
    Q, K, V = normal(rng, (Hq, Sq, 16), dtype), normal(rng, (Hq // 2, Sk, 16), dtype), normal(
        rng, (Hq // 2, Sk, 16), dtype)
    kw = dict(causal=True, window=(q_offset - 100, 0), q_offset=q_offset)
    out = any_backend.attention(Q, K, V, **kw)
    assert_close(out, expected(Q, K, V, **kw), dtype)
    shown = ref.visible(Sq, Sk, q_offset, True, kw["window"])
    assert not shown[:, :100].any() and shown[:, 100 + Sq:].all()
    np.testing.assert_allclose(out, any_backend.attention(Q, K, V, shown), **TOL[np.dtype(dtype)])
    if dtype == np.float64:  # distances of ~2**32 times a small slope: resolvable in float64 only
        kw["alibi_slopes"] = np.array([2e-6, 1e-6, 1e-7, 0.0])  # penalties up to ~8600: ulp ~2e-12
        assert_close(any_backend.attention(Q, K, V, **kw), expected(Q, K, V, **kw), dtype)


# Linux's MAP_NORESERVE where the mmap module lacks the name (before Python 3.13): x86 and ARM's value
NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if platform.machine() in ("x86_64", "aarch64") else 0)


def sparse_buffer(nbytes):
    """nbytes of zeros that take no memory until touched (anonymous, not reserved), or a skip."""
    if not hasattr(mmap, "MAP_ANONYMOUS") or not sys.platform.startswith("linux"):
        pytest.skip("needs Linux's anonymous mappings")
    try:
        buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | NORESERVE)
    except (OSError, OverflowError, ValueError) as e:
        pytest.skip(f"no {nbytes >> 30} GiB of address space to map: {e}")
    return buf


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_element_offsets_past_2_to_the_32(any_backend, rng, dtype):
    """K and V rows 2**23 elements apart in one sparse mapping (tens of GiB of address space, a few
    MiB touched): key j's offset, j * row stride, passes 2**31 at j = 256 and 2**32 at j = 512, where a
    causal window reads them (rows and tiles paths, GQA with two K/V heads side by side in a row)."""
    Sk, dk, dv, Hkv, g = 600, 16, 8, 2, 2
    item = np.dtype(dtype).itemsize
    step = 2 ** 23  # elements between rows: [k head 0 | k head 1 | v head 0 | v head 1 | ... unused]
    buf = sparse_buffer(((Sk - 1) * step + Hkv * (dk + dv)) * item)
    flat = np.frombuffer(buf, dtype)
    K = np.lib.stride_tricks.as_strided(flat, (Hkv, Sk, dk), (dk * item, step * item, item))
    V = np.lib.stride_tricks.as_strided(flat[Hkv * dk:], (Hkv, Sk, dv), (dv * item, step * item, item))
    assert (Sk - 1) * step > 2 ** 32
    try:
        K[...] = normal(rng, K.shape, dtype)
        V[...] = normal(rng, V.shape, dtype)
        Kc, Vc = K.copy(), V.copy()
        for Sq in (3, 70):  # rows (g * Sq = 6), tiles
            Q = normal(rng, (Hkv * g, Sq, dk), dtype)
            kw = dict(causal=True, window=(200, 0), q_offset=Sk - Sq, alibi_slopes=alibi_slopes(Hkv * g))
            out = any_backend.attention(Q, K, V, **kw)
            assert_close(out, expected(Q, Kc, Vc, **kw), dtype)
            mask = ref.visible(Sq, Sk, Sk - Sq, True, (200, 0))
            out = any_backend.attention(Q, K, V, mask, bias=np.zeros((1, Sk), dtype))  # mask, bias rows too
            assert_close(out, expected(Q, Kc, Vc, mask), dtype)
    finally:
        del K, V, flat
        try:
            buf.close()
        except BufferError:  # a view still alive: the mapping goes with it
            pass


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_a_layers_views_reuse_one_plan_on_new_data(any_backend, threads, rng, dtype):
    """A model's decoding step: (H, S, d) head views of a projection and of a KV cache's first
    positions, the same layout layer after layer (one kept plan), with new data each time; and
    views whose strides differ (another cache capacity) get a plan of their own."""
    for capacity in (40, 57):
        cache = normal(rng, (5, 2, 3, capacity, 16), dtype)  # (layers, K/V, Hkv, capacity, d)
        for end, n in ((30, 1), (33, 3), (40, 1)):
            for layer in range(5):
                qkv = normal(rng, (n, 15 * 16), dtype)
                q = qkv[:, :9 * 16].reshape(n, 9, 16).swapaxes(0, 1)  # (9, n, 16): Hq = 9 over Hkv = 3
                K, V = cache[layer, 0, :, :end], cache[layer, 1, :, :end]
                got = any_backend.attention(q, K, V, causal=True, q_offset=end - n)
                assert_close(got, expected(q, K, V, causal=True, q_offset=end - n), dtype)


@pytest.mark.parametrize("contiguous", [False, True])
def test_kept_plans_do_not_keep_the_call_s_arrays(any_backend, rng, contiguous):
    """A call's plan is kept by layout in silkattn._cache (strided heads: a generate prefill's
    slice of its longer KV cache, a batch's page; or C-contiguous operands), never the call's
    arrays: a model's cache or a batch's pool goes when its owner lets it go, with the garbage
    collector off (a kept plan made from the first call's views held it before)."""
    import gc
    import weakref
    silkattn.clear_cache()
    collecting = gc.isenabled()
    gc.disable()
    try:
        for _ in range(2):  # the plan made, then found
            cache = rng.standard_normal((2, 3, 64, 16)).astype(np.float32)  # (K | V, heads, positions, d)
            Q = rng.standard_normal((3, 4, 16)).astype(np.float32)  # a GQA group's query heads as rows
            K, V = (cache[i, :, :20] for i in (0, 1))
            if contiguous:
                K, V = np.ascontiguousarray(K), np.ascontiguousarray(V)
            out = any_backend.attention(Q, K, V)
            assert_close(out, ref.attention(*f64(Q, K, V)), np.float32)
            alive = weakref.ref(cache), weakref.ref(K), weakref.ref(Q)
            del cache, K, V, Q
            assert [a() for a in alive] == [None] * 3
    finally:
        if collecting:
            gc.enable()
