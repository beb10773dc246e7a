"""The Llama-architecture model on small GGUF files written here (tests/llama_files.py): load in
every tensor type, the fast path against reference.llama on every backend, generation with the KV
cache against the reference's recompute, sampling, streaming text, patch(), and the errors."""
import dataclasses
import os
import shutil

import numpy as np
import pytest

import silkattn
from silkattn import reference as ref
from silkattn._testing import EXACT, TOL_Q8, assert_matches

pytest.importorskip("gguf", reason="the llm extra is not installed (pip install 'silkattn[llm]')")
pytest.importorskip("tokenizers", reason="the llm extra is not installed (pip install 'silkattn[llm]')")
pytest.importorskip("jinja2", reason="the llm extra is not installed (pip install 'silkattn[llm]')")

from silkattn.models import llama  # noqa: E402

import llama_files  # noqa: E402
import numpy_llama  # noqa: E402

TYPES = ["F32", "F16", "Q8_0", "Q4_0", "Q4_1"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{type: path} of one small model (d 64, 4 query heads over 2 K/V heads, 2 layers) per type,
    plus "untied" (its own output matrix) and "mqa" (one K/V head, 3 layers, base 500000)."""
    root = tmp_path_factory.mktemp("gguf")
    paths = {}
    for kind in TYPES:
        paths[kind] = str(root / f"tiny-{kind}.gguf")
        llama_files.write(paths[kind], kind)
    paths["untied"] = str(root / "untied.gguf")
    llama_files.write(paths["untied"], "Q8_0", tied=False, seed=1)
    paths["mqa"] = str(root / "mqa.gguf")
    llama_files.write(paths["mqa"], "F16", h=8, h_kv=1, n_layers=3, rope_base=500000.0, seed=2)
    paths["gqa-q4"] = str(root / "gqa-q4.gguf")  # the fused step with 4 query heads a K/V head, d_head 32
    llama_files.write(paths["gqa-q4"], "Q4_0", d=256, h=8, h_kv=2, d_ff=160, n_layers=3, seed=3)
    return paths


def params64(P):
    """The params in float64: the reference's answer to compare a float32 kernel against."""
    def cast(x):
        if isinstance(x, np.ndarray):
            return x.astype(np.float64)
        if isinstance(x, (list, tuple)):
            return type(x)(cast(v) for v in x)
        if isinstance(x, dict):
            return {k: cast(v) for k, v in x.items()}
        return x
    return cast(P)


IDS = [[5], [1, 70, 80, 90], list(range(3, 40)), [200, 3, 3, 3, 3, 64, 250, 7, 1, 2]]


@pytest.mark.parametrize("kind", TYPES + ["untied", "mqa"])
def test_forward_matches_the_reference_on_every_backend(files, kind, on_backend):
    model = llama.load(files[kind], **EXACT)
    P64 = params64(model.params)
    for ids in IDS:
        assert_matches(model.forward(ids), ref.llama(ids, P64), np.float32)


def test_load_undoes_llama_cpp_rotary_row_order(tmp_path):
    """GGUF holds Q and K rows in llama.cpp's interleaved rotary order: load gives back the original."""
    path = str(tmp_path / "m.gguf")
    t = llama_files.write(path, "F32")
    P = llama.load(path, **EXACT).params
    for i, p in enumerate(P["layers"]):
        for W, name in zip(p["attn"], ("attn_q", "attn_k", "attn_v", "attn_output")):
            np.testing.assert_array_equal(W, t[f"blk.{i}.{name}.weight"].T)
        np.testing.assert_array_equal(p["ffn"][0], t[f"blk.{i}.ffn_gate.weight"].T)
    np.testing.assert_array_equal(P["out"], t["token_embd.weight"].T)  # tied


def test_dequantized_weights_are_the_gguf_package_s(files):
    import gguf
    reader = gguf.GGUFReader(files["Q4_1"])
    t = {x.name: x for x in reader.tensors}["blk.1.ffn_down.weight"]
    expected = gguf.quants.dequantize(t.data, t.tensor_type)
    np.testing.assert_array_equal(llama.load(files["Q4_1"]).params["layers"][1]["ffn"][2], expected.T)


@pytest.mark.parametrize("kind", ["Q4_1", "mqa"])
def test_greedy_generation_is_the_reference_recomputing_every_step(files, kind, on_backend, threads):
    model = llama.load(files[kind], **EXACT)
    prompt = [1, 70, 80, 90, 100, 3]
    new = model.generate(prompt, 20, ignore_eos=True)
    assert len(new) == 20 and all(isinstance(t, int) for t in new)
    P64, ids = params64(model.params), list(prompt)
    for token in new:
        assert token == int(np.argmax(ref.llama(ids, P64)[-1]))
        ids.append(token)
    assert model.stats["new_tokens"] == 20 and model.stats["prompt_tokens"] == len(prompt)


def test_generation_stops_at_eos_unless_ignored(files):
    model = llama.load(files["F32"], **EXACT)
    model.params["out"][:, model.eos_id] = 0  # force EOS: its logit becomes the largest
    model.params["out"][-1, model.eos_id] = 1e4
    model.params["norm"][-1] = 1.0
    assert model.generate([5, 6], 10) == [model.eos_id]
    assert model.generate([5, 6], 10, ignore_eos=True) == [model.eos_id] * 10
    assert model.complete("ab", 10) == ""  # the closing EOS writes nothing


def test_sampling_is_seeded_and_top_k_1_is_greedy(files):
    model = llama.load(files["Q8_0"], **EXACT)
    ids = [1, 70, 80]
    a = model.generate(ids, 12, temperature=1.5, seed=7, ignore_eos=True)
    assert a == model.generate(ids, 12, temperature=1.5, seed=7, ignore_eos=True)
    assert a != model.generate(ids, 12, temperature=1.5, seed=8, ignore_eos=True)
    greedy = model.generate(ids, 12, ignore_eos=True)
    assert model.generate(ids, 12, temperature=1.0, top_k=1, seed=3, ignore_eos=True) == greedy
    assert model.generate(ids, 12, temperature=1.0, top_p=1e-9, seed=3, ignore_eos=True) == greedy


def test_text_round_trip_and_template(files):
    model = llama.load(files["F32"], **EXACT)
    texts = ["the cat", "héllo wörld", "数学 🙂👍🏽", "a  b\n\n\tc", "<|im_start|>user\nhi<|im_end|>", ""]
    for text in texts:
        ids = model.tokenize(text)
        assert model.detokenize(ids) == text
    assert model.tokenize("<|im_start|>") == [1]  # control tokens written in the text are matched
    assert model.tokenize("the")[:1] != model.tokenize(" the")[:1]
    prompt = model.apply_chat_template([{"role": "user", "content": "hi"}])
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert model.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=False) \
        == "<|im_start|>user\nhi<|im_end|>\n"


def test_pieces_never_split_a_character(files):
    """Each byte is its own token in this vocabulary: every multi-byte character arrives split."""
    model = llama.load(files["F32"], **EXACT)
    text = "né 数 🙂👍🏽 ok"
    ids = model.tokenize(text)
    assert len(ids) > len(text)  # the multi-byte characters did split
    pieces = list(model.pieces(ids))
    assert "".join(pieces) == text and not any("\ufffd" in p for p in pieces)


def test_stream_yields_what_complete_returns(files):
    model = llama.load(files["Q4_0"], **EXACT)
    pieces = list(model.stream("the ", 16, ignore_eos=True))
    assert "".join(pieces) == model.complete("the ", 16, ignore_eos=True)
    assert model.detokenize(model.generate(model.tokenize("the "), 16, ignore_eos=True)) == "".join(pieces)
    answer = model.chat([{"role": "user", "content": "hi"}], 8, ignore_eos=True)
    assert answer == "".join(model.chat([{"role": "user", "content": "hi"}], 8, stream=True, ignore_eos=True))


def test_patch_runs_a_numpy_llama_on_the_kernels(files, on_backend):
    model = llama.load(files["mqa"], **EXACT)
    ids = [1, 70, 80, 90, 100]
    expected = ref.llama(ids, params64(model.params))
    assert_matches(numpy_llama.llama(ids, model.params), expected, np.float32)
    with silkattn.patched(numpy_llama):
        assert numpy_llama.rms_norm is silkattn.ops.rms_norm and numpy_llama.rope is silkattn.ops.rope
        assert numpy_llama.swiglu is silkattn.models.swiglu
        assert numpy_llama.attention is silkattn.ops.attention
        assert_matches(numpy_llama.llama(ids, model.params), expected, np.float32)
    assert numpy_llama.rms_norm is not silkattn.ops.rms_norm


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q4_1", "gqa-q4"])
def test_fused_decode_step_matches_the_reference_and_the_ops(files, kind, on_backend, threads):
    """A decoding step as one ops.layer_step per layer (one Kernels.layer_step call where the backend
    has it): its logits are the reference's at every position, and the cache it writes is the ops'."""
    model = llama.load(files[kind], **EXACT)
    assert all(L.quantized for L in model.layers)
    P64, ids = params64(model.params), [1, 70, 80, 90, 100, 3, 250, 7, 9, 40, 41, 42, 5]
    fused, ops = model.cache(len(ids)), model.cache(len(ids))
    model._run(np.array(ids[:3]), fused, 0)
    model._run(np.array(ids[:3]), ops, 0)
    for p in range(3, len(ids)):
        logits = model._run(np.array(ids[p:p + 1]), fused, p)
        assert_matches(logits[-1], ref.llama(ids[:p + 1], P64)[-1], np.float32)
        assert_matches(logits, model._run(np.array(ids[p:p + 1]), ops, p, fused=False), np.float32)
        assert_matches(fused[:, :, :, :p + 1], ops[:, :, :, :p + 1], np.float32)


def q8_params(model):
    """The int8 path's oracle: model.params with every product's matrix rounding its rows first
    (ref.RoundsQ8), in blocks of its type's Q8_BLOCK (32, or the K-quants' 256)."""
    P = model.params

    def blocks(M, n):  # the round_q8 block of each of a joined matrix's n parts
        return [ref.Q8_BLOCK[W.kind] for W in (M if isinstance(M, tuple) else (M,) * n)]

    layers = [dict(p, attn=tuple(map(ref.RoundsQ8, p["attn"], blocks(L.wqkv, 3) + blocks(L.wo, 1))),
                   ffn=tuple(map(ref.RoundsQ8, p["ffn"], blocks(L.wgu, 2) + blocks(L.wd, 1))))
              for p, L in zip(P["layers"], model.layers)]
    return dict(P, layers=layers, out=ref.RoundsQ8(P["out"], ref.Q8_BLOCK[model.head.kind]))


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q4_1", "gqa-q4"])
def test_int8_activations_match_their_reference(files, kind, on_backend, threads):
    """load(activations="int8"): a prefill (the kernel's few rows, then round_q8 and the GEMM's many)
    and the decoding steps, fused and as ops, against reference.llama in float32 (round_q8 rounds in
    its input's dtype, float32 in the kernels) with every product's rows rounded, within TOL_Q8."""
    model = llama.load(files[kind], activations="int8", kv_dtype="float32")
    assert all(W.q8 for L in model.layers for W in L.products) and model.head.q8
    P, ids = q8_params(model), [1, 70, 80, 90, 100, 3, 250, 7, 9, 40, 41, 42, 5, 6]
    assert_matches(model.forward(ids[:11]), ref.llama(ids[:11], P), np.float32, TOL_Q8)
    fused, ops = model.cache(len(ids)), model.cache(len(ids))
    prefill = model._run(np.array(ids[:3]), fused, 0, last_only=False)
    assert_matches(prefill, ref.llama(ids[:3], P), np.float32, TOL_Q8)
    model._run(np.array(ids[:3]), ops, 0)
    for p in range(3, len(ids)):
        logits = model._run(np.array(ids[p:p + 1]), fused, p)
        assert_matches(logits[-1], ref.llama(ids[:p + 1], P)[-1], np.float32, TOL_Q8)
        assert_matches(logits, model._run(np.array(ids[p:p + 1]), ops, p, fused=False), np.float32, TOL_Q8)


def test_layer_step_records_refuse_what_does_not_fit(files, any_backend):
    """ops.layer_step_record checks every field against the others once (the kernels trust the
    record: that check is all that keeps them within its arrays), naming the argument; ops.layer_step
    checks the row and the position on every backend."""
    model = llama.load(files["Q4_1"], **EXACT)
    c, L = model.config, model.layers[0]
    cache = np.zeros_like(model.cache(8))  # rows the steps read but no step wrote: zeros
    good = dict(heads=c.h, kv_heads=c.h_kv, norm1=L.attn_norm, qkv=L.wqkv, o=L.wo, norm2=L.ffn_norm,
                up=list(L.wgu), down=L.wd, activation="swiglu", cache=(cache[0, 0], cache[0, 1]), eps=c.eps,
                rope_base=c.rope_base)

    def record(**change):
        return silkattn.ops.layer_step_record(**dict(good, **change))

    step = record()
    x = np.ones(c.d, np.float32)
    any_backend.layer_step(step, x, 3)
    int8 = {name: dataclasses.replace(W, activations="int8")
            for name, W in (("qkv", L.wqkv), ("o", L.wo), ("down", L.wd))}
    int8["up"] = [dataclasses.replace(W, activations="int8") for W in L.wgu]
    any_backend.layer_step(record(**int8), x, 7)
    bad_records = [
        (dict(cache=(model.cache(4)[0, 0], cache[0, 1])), ValueError, "cache"),
        (dict(cache=(cache[0, 0], cache[0, 0])), ValueError, "overlap"),
        (dict(cache=(cache[0, 0, :, :, :8], cache[0, 1, :, :, :8])), ValueError, "cache"),
        (dict(cache=(cache[0, 0].astype(np.float64), cache[0, 1])), TypeError, "cache"),
        (dict(qkv=L.wo), ValueError, "qkv"), (dict(down=L.wgu[0]), ValueError, "down"),
        (dict(norm1=np.ones(c.d + 1, np.float32)), ValueError, "norm1"),
        (dict(norm2=np.ones(c.d, np.float64)), TypeError, "norm2"),
        (dict(up="W"), TypeError, "up"), (dict(heads=3), ValueError, "heads"),
        (dict(kv_heads=3), ValueError, "kv_heads"), (dict(heads=0), ValueError, "heads"),
        (dict(activation="gelu"), ValueError, "activation"), (dict(eps=0.0), ValueError, "eps"),
        (dict(eps="1e-5"), TypeError, "eps"), (dict(rope_base=-1.0), ValueError, "rope_base"),
        (dict(rope_base=10 ** 400), ValueError, "rope_base"),
        (dict(qkv=dataclasses.replace(L.wqkv, activations="int8")), ValueError, "activations"),
        (dict(scratch_of=record(cache=tuple(model.cache(7)[0]))), ValueError, "scratch_of"),
        (dict(qk_norm=(np.ones(c.d_head, np.float32),)), TypeError, "qk_norm"),
        (dict(qk_norm=(np.ones(c.d_head, np.float32), np.ones(c.d_head + 1, np.float32))), ValueError,
         "qk_norm"),
        (dict(post_norms=(np.ones(c.d, np.float32), np.ones(c.d, np.float64))), TypeError, "post_norms"),
        (dict(post_norms=(np.ones(c.d, np.float32),) * 2, post_norm=True), ValueError, "post_norms"),
        (dict(window=0), ValueError, "window"), (dict(window=2.5), TypeError, "window"),
        (dict(positions=16), ValueError, "positions"),
        (dict(positions=16, window=4), ValueError, "positions"),
        (dict(scale=-1.0), ValueError, "scale"), (dict(activation="gelu_tanh"), ValueError, "activation"),
        (dict(qkv=[L.wqkv] * 4), ValueError, "qkv"), (dict(up=[]), ValueError, "up"),
        (dict(qkv=[L.wqkv, L.wo]), ValueError, "qkv"),
        (dict(scratch_of="step"), TypeError, "scratch_of"),
    ]
    for change, error, match in bad_records:
        with pytest.raises(error, match=match):
            record(**change)
    bad_calls = [(dict(pos=8), ValueError, "pos"), (dict(pos=-1), ValueError, "pos"),
                 (dict(pos=2.0), TypeError, "pos"), (dict(x=np.ones(c.d + 32, np.float32)), ValueError, "x"),
                 (dict(x=np.ones(c.d)), ValueError, "x"),
                 (dict(x=cache[0, 0].reshape(-1)[:c.d]), ValueError, "x"),
                 (dict(step="step"), TypeError, "step")]
    for change, error, match in bad_calls:
        a = {**dict(step=step, x=np.ones(c.d, np.float32), pos=3), **change}
        with pytest.raises(error, match=match):
            any_backend.layer_step(a["step"], a["x"], a["pos"])
    ro = np.ones(c.d, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="x"):
        any_backend.layer_step(step, ro, 3)


# ---------------------------------------------------------------- errors

def test_context_length_is_enforced(files):
    model = llama.load(files["F32"], **EXACT)  # context 64
    model.forward(list(range(3, 67)))
    with pytest.raises(ValueError, match="64"):
        model.forward(list(range(3, 68)))
    with pytest.raises(ValueError, match="context length of 64"):
        model.generate(list(range(3, 40)), 30)


@pytest.mark.parametrize("ids, error, match", [
    ([], ValueError, "empty"), ([1.5, 2.0], TypeError, "integers"), ([3, 265], ValueError, r"\[0, 265\)"),
    ([[1, 2]], ValueError, "1-D"), ([-1], ValueError, r"\[0, 265\)")])
def test_bad_ids(files, ids, error, match):
    model = llama.load(files["F32"], **EXACT)
    with pytest.raises(error, match=match):
        model.forward(ids)
    with pytest.raises(error, match=match):
        model.generate(ids, 2)


@pytest.mark.parametrize("kw, match", [
    (dict(max_new_tokens=-1), "max_new_tokens"), (dict(temperature=-1.0), "temperature"),
    (dict(top_k=0), "top_k"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p")])
def test_bad_generation_arguments(files, kw, match):
    model = llama.load(files["F32"], **EXACT)
    kw = {"max_new_tokens": 2, **kw}
    with pytest.raises(ValueError, match=match):
        model.generate([1, 2], kw.pop("max_new_tokens"), **kw)


def test_bad_text_arguments(files):
    model = llama.load(files["F32"], **EXACT)
    with pytest.raises(TypeError, match="text"):
        model.tokenize(b"bytes")
    with pytest.raises(TypeError, match="messages"):
        model.apply_chat_template([{"content": "hi"}])
    with pytest.raises(TypeError, match="unknown keyword"):
        model.complete("a", 2, temprature=0.5)


def _write_variant(path, **kw):
    llama_files.write(path, "F32", **kw)
    return path


@pytest.mark.parametrize("kw, match", [
    (dict(arch="gpt2"), "architecture 'gpt2'"),
    (dict(tokenizer_model="llama"), "without tokenizer.ggml.scores"),  # SentencePiece needs its scores
    (dict(tokenizer_model="t5"), "tokenizer.ggml.model 't5' is not a kind of vocabulary silkattn builds"),
    (dict(pre="mystery"), "pre-tokenizer 'mystery' .* llama.cpp does not know it either"),
    (dict(pre="kimi-k2"), "pre-tokenizer 'kimi-k2' .* code of its own"),
    (dict(h=5), "attn_q.weight has shape"),  # 64 is not 5 heads of the file's 12
    (dict(extra={"llama.rope.scaling.type": "yarn"}), "rope scaling 'yarn'"),
])
def test_files_silkattn_cannot_run(tmp_path, kw, match):
    path = str(tmp_path / "bad.gguf")
    if kw.get("h") == 5:  # 64 is not 5 whole heads
        tensors = llama_files.weights(h=4)
        llama_files.write(path, "F32", h=5, h_kv=5, tensors=tensors, permute_qk=False)
    elif kw.get("arch"):
        import gguf
        writer = gguf.GGUFWriter(path, "gpt2")
        writer.add_block_count(1)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    else:
        _write_variant(path, **kw)
    with pytest.raises(ValueError, match=match):
        llama.load(path)


def test_missing_tensor_wrong_shape_unknown_type(tmp_path):
    t = llama_files.weights()
    path = str(tmp_path / "a.gguf")
    llama_files.write(path, "F32", tensors={k: v for k, v in t.items() if k != "blk.1.ffn_up.weight"})
    with pytest.raises(ValueError, match="blk.1.ffn_up.weight is missing"):
        llama.load(path)
    llama_files.write(path, "F32", tensors=dict(t, **{"blk.0.ffn_up.weight": np.zeros((96, 32), np.float32)}))
    with pytest.raises(ValueError, match=r"blk.0.ffn_up.weight has shape \(96, 32\)"):
        llama.load(path)
    llama_files.write(path, "F32", tensors=dict(t, **{"blk.0.ffn_up.weight": np.zeros((96, 64), np.int8)}))
    with pytest.raises(ValueError, match="blk.0.ffn_up.weight has type I8"):
        llama.load(path)


def test_truncated_and_foreign_files(tmp_path, files):
    path = str(tmp_path / "cut.gguf")
    size = os.path.getsize(files["Q4_1"])
    for keep in (size - 100, size // 2, 2000, 10):
        with open(files["Q4_1"], "rb") as src, open(path, "wb") as dst:
            dst.write(src.read(keep))
        with pytest.raises(ValueError, match="cut.gguf"):
            llama.load(path)
    shutil.copy(__file__, path)
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        llama.load(path)
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        llama.load(str(tmp_path / "absent.gguf"))


def _llama_cpp_rope(X, positions, base, factors):  # X: (n_head, seq, d_head) rows in the file's order
    """llama.cpp's rope on the file's (interleaved) rows: the pair (x_2i, x_2i+1) turned by
    p base^(-2i/d) / factors_i; written apart from silkattn's half-split tables."""
    d = X.shape[-1]
    theta = np.outer(positions, base ** (-np.arange(0, d, 2) / d) / factors)  # (seq, d / 2)
    c, s = np.cos(theta), np.sin(theta)
    even, odd = X[..., 0::2], X[..., 1::2]
    out = np.empty_like(X)
    out[..., 0::2], out[..., 1::2] = even * c - odd * s, odd * c + even * s
    return out


def _file_order_llama(t, ids, h, h_kv, n_layers, base, factors, eps=1e-5):
    """Logits of the tensors as the file holds them (Q, K rows interleaved), in float64."""
    t = {k: v.astype(np.float64) for k, v in t.items()}
    X, pos = t["token_embd.weight"][ids], np.arange(len(ids))
    for i in range(n_layers):
        def w(name):
            return t[f"blk.{i}.{name}.weight"]
        H = ref.rms_norm(X, w("attn_norm"), eps)
        q, k, v = (np.swapaxes((H @ w(name).T).reshape(len(ids), n, -1), 0, 1)
                   for name, n in (("attn_q", h), ("attn_k", h_kv), ("attn_v", h_kv)))
        q, k = _llama_cpp_rope(q, pos, base, factors), _llama_cpp_rope(k, pos, base, factors)
        A = ref.attention(q, np.repeat(k, h // h_kv, 0), np.repeat(v, h // h_kv, 0), causal=True)
        X = X + np.swapaxes(A, 0, 1).reshape(X.shape) @ w("attn_output").T
        H = ref.rms_norm(X, w("ffn_norm"), eps)
        X = X + (ref.silu(H @ w("ffn_gate").T) * (H @ w("ffn_up").T)) @ w("ffn_down").T
    return ref.rms_norm(X, t["output_norm.weight"], eps) @ t["token_embd.weight"].T


@pytest.mark.parametrize("kind", ["F32", "Q8_0"])
def test_llama3_rope_freqs_as_llama_cpp_applies_them(tmp_path, kind, on_backend):
    """A Llama 3.1-style file (a rope_freqs.weight tensor of per-frequency divisors): the prefill and
    the fused decoding steps against llama.cpp's arithmetic on the file's own rows; without the
    factors the logits differ by more than the tolerance (the test can tell)."""
    path, h, h_kv, n_layers, base = str(tmp_path / "llama3.gguf"), 4, 2, 2, 500000.0
    factors = np.array([1, 1, 1, 1, 2, 4, 8, 8], np.float32)  # d_head 16: 8 frequencies
    t = llama_files.weights(h=h, h_kv=h_kv, n_layers=n_layers)
    written = llama_files.write(path, kind, tensors=dict(t, **{"rope_freqs.weight": factors}), rope_base=base)
    model = llama.load(path, **EXACT)
    assert model.config.rope_freqs == tuple(factors.tolist())
    P = model.params  # the file's matrices as the model holds them (Q8_0: dequantized)
    stored = dict(written)
    for i, p in enumerate(P["layers"]):  # the file's rows again, for the independent oracle
        Wq, Wk, Wv, Wo = p["attn"]
        stored.update({f"blk.{i}.attn_q.weight": llama_files.permute(Wq.T, h),
                       f"blk.{i}.attn_k.weight": llama_files.permute(Wk.T, h_kv),
                       f"blk.{i}.attn_v.weight": Wv.T, f"blk.{i}.attn_output.weight": Wo.T,
                       f"blk.{i}.ffn_gate.weight": p["ffn"][0].T, f"blk.{i}.ffn_up.weight": p["ffn"][1].T,
                       f"blk.{i}.ffn_down.weight": p["ffn"][2].T})
    stored["token_embd.weight"] = P["emb"]
    ids = [1, 70, 80, 90, 100, 3, 250, 7, 9, 40, 41, 42, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]
    expected = _file_order_llama(stored, ids, h, h_kv, n_layers, base, factors.astype(np.float64),
                                 model.config.eps)  # the file's float32 1e-5
    logits = model.forward(ids)
    assert_matches(logits, expected, np.float32)
    assert_matches(ref.llama(ids, params64(P)), expected, np.float64)
    plain = _file_order_llama(stored, ids, h, h_kv, n_layers, base, np.ones(8), model.config.eps)
    assert np.abs(plain - expected).max() > 100 * np.abs(logits - expected).max()  # the factors matter
    if model.fused:  # a quantized file: decoding steps through the records, tables with the factors
        cache = model.cache(len(ids))
        model._run(np.array(ids[:3]), cache, 0)
        for p in range(3, len(ids)):
            assert_matches(model._run(np.array(ids[p:p + 1]), cache, p)[-1], expected[p], np.float32)


def test_rope_freqs_of_a_wrong_shape_or_value_and_unused_tensors_are_refused(tmp_path):
    t, path = llama_files.weights(), str(tmp_path / "bad.gguf")
    llama_files.write(path, "F32", tensors=dict(t, **{"rope_freqs.weight": np.ones(5, np.float32)}))
    with pytest.raises(ValueError, match=r"rope_freqs.weight has shape \(5,\)"):
        llama.load(path)
    llama_files.write(path, "F32", tensors=dict(t, **{"rope_freqs.weight": -np.ones(8, np.float32)}))
    with pytest.raises(ValueError, match="rope_freqs.weight holds values that are not positive"):
        llama.load(path)
    llama_files.write(path, "F32", tensors=dict(t, **{"blk.0.attn_q_norm.weight": np.ones(16, np.float32)}))
    with pytest.raises(ValueError, match="blk.0.attn_q_norm.weight of the file is not part of the llama"):
        llama.load(path)


def _k_quant_file(path, activations_seed=7):
    """A Q4_K_M-like mix on d 256 (rows a multiple of 256): Q4_K for Q, K, V, Q6_K for ffn_down,
    Q5_K for the gate and up, Q5_0 and Q5_1 for attn_output, Q8_0 embeddings (the matrices load
    joins, Q|K|V and gate|up, of one kind each: joined, mixed kinds are float32 copies)."""
    types = {"token_embd.weight": "Q8_0"}
    for i in range(2):
        types.update({f"blk.{i}.ffn_down.weight": "Q6_K", f"blk.{i}.ffn_up.weight": "Q5_K",
                      f"blk.{i}.ffn_gate.weight": "Q5_K", f"blk.{i}.attn_output.weight": ("Q5_0", "Q5_1")[i]})
    llama_files.write(path, "Q4_K", d=256, h=4, h_kv=2, d_ff=512, n_layers=2, seed=activations_seed,
                      types=types, context=128)
    return types


@pytest.mark.parametrize("activations", ["float32", "int8"])
def test_k_quant_files_run_on_their_blocks(tmp_path, on_backend, activations):
    """K-quant and Q5 tensors stay the file's blocks (QuantizedMatrix of their kind, no float32 copy)
    and the model is reference.llama on their dequantized weights: the prefill and the decoding
    steps (the fused step, on every type), float32 and int8 activations."""
    path = str(tmp_path / "kq.gguf")
    _k_quant_file(path)
    model = llama.load(path, activations=activations, kv_dtype="float32")
    kinds = [(L.wqkv.kind, L.wo.kind, *{W.kind for W in L.wgu}, L.wd.kind) for L in model.layers]
    assert kinds == [("Q4_K", "Q5_0", "Q5_K", "Q6_K"), ("Q4_K", "Q5_1", "Q5_K", "Q6_K")] and model.fused
    assert model.emb.kind == "Q8_0" and all(L.wd.activations == activations for L in model.layers)
    P = model.params if activations == "float32" else q8_params(model)
    ids = [1, 70, 80, 90, 100, 3, 250, 7, 9, 40, 41, 42]
    expected = ref.llama(ids, params64(P) if activations == "float32" else P)
    tol = () if activations == "float32" else (TOL_Q8,)
    assert_matches(model.forward(ids), expected, np.float32, *tol)
    cache = model.cache(len(ids))
    model._run(np.array(ids[:4]), cache, 0)
    for p in range(4, len(ids)):
        assert_matches(model._run(np.array(ids[p:p + 1]), cache, p)[-1], expected[p], np.float32, *tol)


def test_k_quant_blocks_are_not_copied(tmp_path):
    path = str(tmp_path / "kq.gguf")
    _k_quant_file(path)
    model = llama.load(path, **EXACT)
    wd = model.layers[1].wd
    assert wd.kind == "Q6_K" and wd.shape == (512, 256) and wd.nbytes == 256 * 2 * 210
    assert not wd.blocks.flags.owndata  # the file's memory map itself


@pytest.mark.parametrize("qtype", ["Q2_K", "Q3_K", "IQ4_NL", "IQ2_XS"])
def test_types_silkattn_does_not_run_are_refused_at_load_by_tensor_and_type(tmp_path, qtype):
    path = str(tmp_path / "iq.gguf")
    llama_files.write(path, "F32", d=256, d_ff=512, types={"blk.1.ffn_up.weight": qtype})
    with pytest.raises(ValueError, match=f"tensor blk.1.ffn_up.weight has type {qtype}, which silkattn"):
        llama.load(path)


# ---------------------------------------------------------------- load's defaults

@pytest.mark.parametrize("kinds, expected", [
    ({"Q4_1"}, "float32"), ({"Q8_0", "Q4_0", "Q4_1"}, "float32"), (set(), "float32"),
    ({"Q8_0", "Q4_K"}, "int8"), ({"Q4_K", "Q6_K"}, "int8"), ({"Q5_0"}, "int8"), ({"Q5_1", "Q8_0"}, "int8"),
    ({"Q5_K"}, "int8")])
def test_auto_activations_go_by_the_file_s_block_types(kinds, expected):
    assert llama.auto_activations(kinds) == expected


def test_a_path_alone_loads_with_the_defaults(files, tmp_path):
    """load(path): a file of float32-fast blocks keeps float32 rows, one with K-quants (and Q5) takes
    int8 rows as llama.cpp's; a float16 cache either way; asked for, the other choices."""
    q41 = llama.load(files["Q4_1"])
    assert q41.kv_dtype == np.float16 and q41.cache(4)[0].dtype == np.float16
    assert {W.activations for L in q41.layers for W in L.products} == {"float32"} and q41.fused
    path = str(tmp_path / "kq.gguf")
    _k_quant_file(path)
    kq = llama.load(path)
    assert {W.activations for L in kq.layers for W in L.products} == {"int8"} and kq.fused
    assert kq.emb.activations == "int8" and kq.kv_dtype == np.float16
    asked = llama.load(path, activations="float32", kv_dtype="float32")
    assert {W.activations for L in asked.layers for W in L.products} == {"float32"}
    assert asked.kv_dtype == np.float32
    ids = [1, 70, 80, 90, 100, 3]
    np.testing.assert_array_equal(kq.forward(ids), llama.load(path, activations="int8").forward(ids))


@pytest.mark.parametrize("bad", ["int4", "AUTO", None, 8])
def test_a_bad_activations_is_refused_naming_it(files, bad):
    with pytest.raises(ValueError, match="activations must be 'auto' or one of float32, int8"):
        llama.load(files["Q4_1"], activations=bad)
