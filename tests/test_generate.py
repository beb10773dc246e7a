"""Generation with a KV cache: the incremental logits equal a full recompute at every step (so the
positions continue from the prompt and the cache holds every earlier key), greedy tokens equal the
reference's recompute-every-step generate on every backend, sampling is reproducible."""
import re

import numpy as np
import pytest
from test_seq2seq import as_f64, small_seq2seq

import silkattn
from silkattn import _aligned
from silkattn import reference as ref
from silkattn.models import decoder, seq2seq
from silkattn.models.generate import KVCache, _fused_blocks
from silkattn.models.layers import fused_qkv

from conftest import DTYPES, assert_close


def small_decoder(dtype=np.float32, seed=0, vocab=50, max_len=300):
    return ref.init_params(vocab, d=64, h=4, n_layers=2, d_ff=96, max_len=max_len, seed=seed, dtype=dtype)


def assert_clear_winner(logits, tol):
    """Greedy comparisons are only meaningful where the top two logits differ by more than a
    kernel's rounding: say so, instead of failing on a tie."""
    top2 = np.sort(np.asarray(logits, np.float64))[-2:]
    assert top2[1] - top2[0] > 100 * tol, f"near tie in the reference's logits: {top2}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_cached_logits_equal_a_full_recompute_at_every_step(on_backend, rng, dtype):
    """Prefill 70 tokens, then one token a step across the 64-key tile edges of the kernels."""
    P = small_decoder(dtype)
    P64 = as_f64(P)
    ids = rng.integers(0, 50, 140)
    cache, qkv = KVCache(2, len(ids), 64, dtype), [fused_qkv(*p["attn"][:3]) for p in P["layers"]]
    logits = decoder.forward_cached(ids[:70], P, cache, 0, qkv)
    assert_close(logits, ref.transformer(ids[:70], P64)[-1], dtype)
    for t in range(70, len(ids)):
        logits = decoder.forward_cached(ids[t:t + 1], P, cache, t, qkv)
        assert_close(logits, ref.transformer(ids[:t + 1], P64)[-1], dtype)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_cached_seq2seq_logits_equal_a_full_recompute(on_backend, rng, norm):
    P = small_seq2seq(norm, np.float32)
    P64 = as_f64(P)
    src, pad = rng.integers(0, 23, 11), np.arange(11) < 8
    memory = silkattn.encode(src, P, pad)
    memory64 = ref.encode(src, P64, pad)
    tgt = rng.integers(0, 29, 30)
    cache, cross = KVCache(2, len(tgt), 32, np.float32), seq2seq.cross_cache(memory, P)
    qkv = [fused_qkv(*p["attn"][:3]) for p in P["decoder"]]
    logits = seq2seq.decode_cached(tgt[:5], P, cache, 0, qkv, cross, pad)  # prefill
    assert_close(logits, ref.decode(tgt[:5], memory64, P64, pad)[-1], np.float32)
    for t in range(5, len(tgt)):
        logits = seq2seq.decode_cached(tgt[t:t + 1], P, cache, t, qkv, cross, pad)
        assert_close(logits, ref.decode(tgt[:t + 1], memory64, P64, pad)[-1], np.float32)


def _fused_or_skip(make):
    fused = make()
    if fused is None:
        pytest.skip("a float64 or strided model: its steps are the ops")
    return fused


@pytest.mark.parametrize("d, h, d_ff", [(64, 4, 96), (128, 2, 320)])
def test_fused_block_step_equals_a_full_recompute(on_backend, rng, d, h, d_ff):
    """A decoding step as one block_layer call per block (the way generate() runs it), after the
    ops' prefill, against the reference's recompute at every position."""
    P = ref.init_params(50, d=d, h=h, n_layers=2, d_ff=d_ff, max_len=80, seed=5, dtype=np.float32)
    P64, ids = as_f64(P), rng.integers(0, 50, 70)
    cache, qkv = KVCache(2, len(ids), d, np.float32), [fused_qkv(*p["attn"][:3]) for p in P["layers"]]
    fused = _fused_or_skip(lambda: _fused_blocks(P["layers"], qkv, cache, len(ids)))
    decoder.forward_cached(ids[:40], P, cache, 0, qkv)
    for t in range(40, len(ids)):
        logits = silkattn.ops.linear(fused(P["emb"][ids[t]] + P["pos"][t], t), P["emb"].T)
        assert_close(logits, ref.transformer(ids[:t + 1], P64)[-1], np.float32)


@pytest.mark.parametrize("norm, padded", [("post", 3), ("pre", 3), ("post", 11)])
def test_fused_seq2seq_step_equals_a_full_recompute(on_backend, rng, norm, padded):
    """The decoder's step with cross-attention, post- and pre-norm, some or every source token padded
    (a query whose keys are all hidden averages them all, as the reference does)."""
    P = small_seq2seq(norm, np.float32, seed=1)
    P64 = as_f64(P)
    src, pad = rng.integers(0, 23, 11), np.arange(11) < 11 - padded
    memory, memory64 = silkattn.encode(src, P, pad), ref.encode(src, P64, pad)
    tgt = rng.integers(0, 29, 30)
    cache, cross = KVCache(2, len(tgt), 32, np.float32), seq2seq.cross_cache(memory, P)
    qkv = [fused_qkv(*p["attn"][:3]) for p in P["decoder"]]
    fused = _fused_or_skip(lambda: _fused_blocks(P["decoder"], qkv, cache, len(tgt), cross, pad))
    seq2seq.decode_cached(tgt[:5], P, cache, 0, qkv, cross, pad)
    for t in range(5, len(tgt)):
        x = ref.embed(tgt[t:t + 1], P["tgt_emb"], P["pos"][t:])[0]
        logits = silkattn.ops.linear(fused(x, t), P["tgt_emb"].T)
        assert_close(logits, ref.decode(tgt[:t + 1], memory64, P64, pad)[-1], np.float32)


def test_block_step_records_refuse_what_does_not_fit(any_backend):
    """The listing's block as a layer_step_record: every field checked against the others once
    (the kernels trust the record), a TypeError or ValueError naming the argument; cross-attention
    too, and a call past the cache."""
    d, h, dff, cap, f32 = 64, 4, 96, 8, np.float32
    p = small_decoder()["layers"][0]
    K, V = np.zeros((cap, d), f32), np.zeros((cap, d), f32)
    W1, b1, W2, b2 = p["ffn"]
    memory = (np.ones((5, d), f32), np.ones((5, d), f32))
    good = dict(heads=h, norm1=tuple(p["ln1"]), qkv=fused_qkv(*p["attn"][:3]), o=p["attn"][3],
                norm2=tuple(p["ln2"]), up=(W1, b1), down=(W2, b2), cache=(K, V), eps=1e-5)
    cross = dict(norm=tuple(p["ln1"]), q=p["attn"][0], o=p["attn"][3], memory=memory, keep=[1, 1, 0, 1, 1])

    def record(**change):
        return silkattn.ops.layer_step_record(**dict(good, **change))

    x = np.ones(d, f32)
    any_backend.layer_step(record(), x, 3)
    any_backend.layer_step(record(cross=cross, post_norm=True), x, 7)
    bad = [(dict(cache=(np.zeros((cap, d + 1), f32),) * 2), ValueError, "cache"),
           (dict(cache=(K, np.zeros((cap - 1, d), f32))), ValueError, "cache"),
           (dict(qkv=np.zeros((d, 2 * d), f32)), ValueError, "qkv"),
           (dict(down=(np.zeros((dff + 1, d), f32), b2)), ValueError, "down"),
           (dict(up=(W1, np.ones(dff + 1, f32))), ValueError, "up's bias"),
           (dict(o=p["attn"][3].astype(np.float64)), TypeError, "o"),
           (dict(o=np.asfortranarray(p["attn"][3])), ValueError, "C-contiguous"),
           (dict(norm1=(p["ln1"][0], np.ones(d + 1, f32))), ValueError, "norm1"),
           (dict(eps=-1.0), ValueError, "eps"), (dict(eps=float("inf")), ValueError, "eps"),
           (dict(heads=5), ValueError, "heads"), (dict(cross=dict(cross, memory=(memory[0][:0],) * 2)),
                                                  ValueError, "memory"),
           (dict(cross=dict(cross, keep=[1, 0])), ValueError, "keep"),
           (dict(cross={"norm": cross["norm"]}), ValueError, "cross lacks"),
           (dict(cross=[1]), TypeError, "cross"),
           (dict(cross=dict(cross, q=np.zeros((d, d + 1), f32))), ValueError, "cross's q")]
    for change, error, match in bad:
        with pytest.raises(error, match=match):
            record(**change)
    for pos in (cap, -1):
        with pytest.raises(ValueError, match="pos"):
            any_backend.layer_step(record(), x, pos)


def test_fused_block_step_is_skipped_for_float64_and_strided_weights(rng):
    P = small_decoder(np.float64)
    qkv = [fused_qkv(*p["attn"][:3]) for p in P["layers"]]
    assert _fused_blocks(P["layers"], qkv, KVCache(2, 8, 64, np.float64), 8) is None
    P = small_decoder(np.float32)
    P["layers"][1]["ffn"] = (P["layers"][1]["ffn"][0].T.copy().T,) + P["layers"][1]["ffn"][1:]  # F-ordered
    qkv = [fused_qkv(*p["attn"][:3]) for p in P["layers"]]
    assert _fused_blocks(P["layers"], qkv, KVCache(2, 8, 64, np.float32), 8) is None
    np.testing.assert_array_equal(silkattn.generate([1, 2, 3], P, 5), ref.generate([1, 2, 3], P, 5))


def test_greedy_tokens_equal_the_reference_on_every_backend(on_backend, rng):
    P = small_decoder(np.float32, seed=3)
    prompt = rng.integers(0, 50, 20)
    expected = ref.generate(prompt, as_f64(P), 40)
    ids = np.concatenate([prompt, expected])
    for t in range(len(prompt), len(ids)):
        assert_clear_winner(ref.transformer(ids[:t], as_f64(P))[-1], 1e-4)
    out = silkattn.generate(prompt, P, 40)
    assert out.dtype == np.int64 and out.shape == (40,)
    np.testing.assert_array_equal(out, expected)


def test_seq2seq_greedy_tokens_equal_the_reference(on_backend, rng):
    P = small_seq2seq("post", np.float32, seed=2)
    src, pad = rng.integers(0, 23, 9), np.arange(9) < 7
    memory = silkattn.encode(src, P, pad)
    expected = ref.generate([1], as_f64(P), 12, memory=ref.encode(src, as_f64(P), pad), memory_mask=pad)
    np.testing.assert_array_equal(silkattn.generate([1], P, 12, memory=memory, memory_mask=pad), expected)


def test_sampling_is_reproducible_and_top_k_1_is_greedy(rng):
    P = small_decoder(np.float32, seed=4)
    prompt = rng.integers(0, 50, 10)
    a = silkattn.generate(prompt, P, 30, temperature=1.0, top_k=10, seed=7)
    np.testing.assert_array_equal(a, silkattn.generate(prompt, P, 30, temperature=1.0, top_k=10, seed=7))
    assert not np.array_equal(a, silkattn.generate(prompt, P, 30, temperature=1.0, top_k=10, seed=8))
    np.testing.assert_array_equal(a, ref.generate(prompt, P, 30, temperature=1.0, top_k=10, seed=7))
    np.testing.assert_array_equal(silkattn.generate(prompt, P, 30, temperature=0.7, top_k=1, seed=1),
                                  silkattn.generate(prompt, P, 30))


def test_generation_stops_at_eos_and_fills_the_model(rng):
    P = small_decoder(np.float32, seed=5, max_len=40)
    prompt = rng.integers(0, 50, 8)
    full = silkattn.generate(prompt, P, 32)  # exactly the 40 positions
    eos = int(full[5])
    stop = list(full).index(eos)
    np.testing.assert_array_equal(silkattn.generate(prompt, P, 32, eos_id=eos), full[:stop + 1])
    assert silkattn.generate(prompt, P, 0).shape == (0,)


def test_cache_is_preallocated_and_its_size_reported():
    cache = KVCache(6, 320, 512, np.float32)
    assert cache.data.shape == (6, 2, 320, 512)
    assert cache.bytes_per_token == 2 * 512 * 4  # keys and values, per layer
    K, V = cache[3]
    assert K.shape == V.shape == (320, 512) and np.shares_memory(K, cache.data)
    assert K.ctypes.data % 64 == V.ctypes.data % 64 == 0  # rows start on cache lines (_aligned)


@pytest.mark.parametrize("shape", [(0,), (1,), (3, 5), (2, 8, 4096, 64), (7, 1, 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int8])
def test_aligned_arrays_start_on_a_cache_line(shape, dtype):
    arrays = [_aligned.empty(shape, dtype) for _ in range(4)]  # numpy alone gives 16 bytes
    for a in arrays:
        assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable
        assert a.size == 0 or a.ctypes.data % 64 == 0  # an empty array has no first element
    arrays[0][...] = 1  # the whole array is writable memory of its own
    assert all(not np.shares_memory(arrays[0], b) for b in arrays[1:])


def test_huge_arrays_are_cut_apart_on_memory_advised_for_huge_pages():
    """_aligned.huge: arrays of their own (on cache lines, apart), end to end in chunks the kernel is
    asked to back with 2 MB pages (smaps' THPeligible), a mapping of their own for big ones."""
    shapes = [(3, 5), (1000,), (16, 40), (0, 4), (_aligned.CHUNK + 1,), (7,)]
    arrays = [_aligned.huge(shape, np.uint8) for shape in shapes]
    for a, shape in zip(arrays, shapes):
        assert a.shape == shape and a.dtype == np.uint8 and a.flags.c_contiguous and a.flags.writeable
        assert a.size == 0 or a.ctypes.data % 64 == 0
        a[...] = 7
    for i, a in enumerate(arrays):
        assert not any(np.shares_memory(a, b) for b in arrays[i + 1:])
        assert (a == 7).all()
    f = _aligned.huge((2, 3), np.float32)
    assert f.dtype == np.float32 and f.shape == (2, 3) and f.ctypes.data % 64 == 0
    try:
        advised = "[never]" not in open("/sys/kernel/mm/transparent_hugepage/enabled").read()
        smaps = re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", open("/proc/self/smaps").read())
    except OSError:
        pytest.skip("no transparent huge pages to ask for here (not Linux)")

    def eligible(at):  # smaps' THPeligible of the mapping at address `at`
        for vma in smaps:
            lo, hi = (int(x, 16) for x in vma.split(" ", 1)[0].split("-"))
            if lo <= at < hi:
                return bool(re.search(r"^THPeligible:\s+1$", vma, re.M))
        raise AssertionError(f"no mapping at {at:#x} in smaps")
    # a small array's chunk, a big array's own mapping; the big one's end (past its last whole huge
    # page) is not, so that it does not make a whole huge page resident
    assert eligible(arrays[0].ctypes.data) == eligible(arrays[4].ctypes.data) == advised
    assert not eligible(arrays[4].ctypes.data + arrays[4].nbytes - 1)


@pytest.mark.parametrize("kwargs, error, text", [
    (dict(max_new_tokens=-1), ValueError, "max_new_tokens must be >= 0"),
    (dict(max_new_tokens=2.5), TypeError, "max_new_tokens must be an int"),
    (dict(max_new_tokens=300), ValueError, "exceed the 40 positions"),
    (dict(temperature=-1.0), ValueError, "temperature must be a finite number >= 0"),
    (dict(temperature=float("nan")), ValueError, "temperature"),
    (dict(top_k=0), ValueError, "top_k must be >= 1"),
    (dict(prompt_ids=[]), ValueError, "prompt_ids is empty"),
    (dict(prompt_ids=[50]), ValueError, r"prompt_ids must lie in \[0, 50\)"),
    (dict(memory=np.ones((3, 64))), ValueError, "P lacks 'src_emb'"),
])
def test_generate_refuses_bad_arguments(on_backend, kwargs, error, text):
    P = small_decoder(np.float32, max_len=40)
    args = dict(prompt_ids=[1, 2, 3], max_new_tokens=4) | kwargs
    prompt, n = args.pop("prompt_ids"), args.pop("max_new_tokens")
    for generate in (silkattn.generate, ref.generate):
        with pytest.raises(error, match=text):
            generate(prompt, P, n, **args)
