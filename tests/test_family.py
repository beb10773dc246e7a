"""The family (models/family.py) on small GGUF files of each architecture written here: qwen2 (Q/K/V
biases, half-split rotary rows), qwen3 (QK-norm, no biases, heads wider than d / h), gemma3 (QK-norm,
sandwich norms, GeGLU, sqrt(d) embeddings, a sliding window on five layers of six with their own
rope base, heads wider than d / h) and llama, in float and block types, against reference.llama on
every backend; what the config reads; and the files and keys it refuses."""
import numpy as np
import pytest

import silkattn
from silkattn import reference as ref
from silkattn._testing import EXACT, TOL_MODEL, assert_matches

pytest.importorskip("gguf", reason="the llm extra is not installed (pip install 'silkattn[llm]')")
pytest.importorskip("tokenizers", reason="the llm extra is not installed (pip install 'silkattn[llm]')")

from test_llama import params64  # noqa: E402

from silkattn.models import llama  # noqa: E402
from silkattn.models.family import FamilyConfig  # noqa: E402
from silkattn.models.gguf import GGUFFile  # noqa: E402

import llama_files  # noqa: E402

# sizes a block type's rows fit (K-quants: rows of 256); qwen3's and gemma3's heads (128) wider than d / h
SIZES = {"qwen2": dict(d=256, h=4, h_kv=2, d_ff=256), "llama": dict(d=256, h=4, h_kv=2, d_ff=256),
         "qwen3": dict(d=256, h=4, h_kv=2, d_head=128, d_ff=256),
         "gemma3": dict(d=256, h=4, h_kv=2, d_head=128, d_ff=512, n_layers=6, window=5, rope_base=1e6)}
# one file of each architecture and type; "mixed": Q5_0 Q and K, Q8_0 V, Q4_K output, Q6_K down (the
# Gemma 3 file's own mix, so the joined Q|K|V and gate|up keep parts of two types)
TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "mixed"]


def _mixed(n_layers):
    kinds = {"attn_q": "Q5_0", "attn_k": "Q5_0", "attn_v": "Q8_0", "attn_output": "Q4_K", "ffn_gate": "Q5_0",
             "ffn_up": "Q4_K", "ffn_down": "Q6_K"}
    return {f"blk.{i}.{n}.weight": k for i in range(n_layers) for n, k in kinds.items()}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root, paths = tmp_path_factory.mktemp("family"), {}
    for arch, sizes in SIZES.items():
        for kind in TYPES:
            path = paths[arch, kind] = str(root / f"{arch}-{kind}.gguf")
            types = _mixed(sizes.get("n_layers", 2)) if kind == "mixed" else None
            llama_files.write(path, "Q8_0" if kind == "mixed" else kind, arch=arch, types=types,
                              **sizes)
    return paths


IDS = [[5], list(range(3, 15)), [200, 3, 3, 3, 3, 64, 250, 7, 1, 2, 9, 9, 9, 30, 31]]


@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("arch", list(SIZES))
def test_forward_matches_the_reference_on_every_backend(files, arch, kind, on_backend):
    model = llama.load(files[arch, kind], **EXACT)
    P64 = params64(model.params)
    for ids in IDS:
        assert_matches(model.forward(ids), ref.llama(ids, P64), np.float32, TOL_MODEL)


@pytest.mark.parametrize("kind", ["F32", "Q8_0", "mixed"])
@pytest.mark.parametrize("arch", list(SIZES))
def test_greedy_decoding_with_the_cache_is_the_reference_recomputing(files, arch, kind, on_backend):
    """Past the window too (gemma3's 5): the local layers' cache rows out of sight stay unread."""
    model = llama.load(files[arch, kind], **EXACT)
    prompt = [4, 9, 16, 25]
    new = model.generate(prompt, 9, ignore_eos=True)
    ids, P64 = list(prompt), params64(model.params)
    for token in new:
        assert token == int(np.argmax(ref.llama(ids, P64)[-1]))
        ids.append(token)


def test_gemma3_config_reads_the_layer_pattern_and_the_head_width(files):
    c = FamilyConfig.from_gguf(GGUFFile(files["gemma3", "F32"]))
    assert (c.d_head, c.h, c.d, c.arch) == (128, 4, 256, "gemma3")
    assert c.windows == (5, 5, 5, 5, 5, None)  # layer i global iff i % 6 == 5
    assert c.rope_bases == (1e4,) * 5 + (1e6,)
    assert c.embed_scale == 16.0 and c.family.activation == "gelu_tanh"
    model = llama.load(files["gemma3", "F32"], **EXACT)
    P = model.params
    assert [p["window"] for p in P["layers"]] == list(c.windows)
    assert all(p["q_norm"].shape == (128,) and p["post_ffn_norm"].shape == (256,) for p in P["layers"])


def test_qwen2_biases_and_rotary_rows_are_the_file_s(files, tmp_path):
    """A half-split file's Q rows are read as they are (no llama.cpp un-interleaving); the biases
    land after the product."""
    path = str(tmp_path / "q.gguf")
    t = llama_files.write(path, "F32", arch="qwen2")
    P = llama.load(path, **EXACT).params
    np.testing.assert_array_equal(P["layers"][0]["attn"][0], t["blk.0.attn_q.weight"].T)
    np.testing.assert_array_equal(P["layers"][1]["bias"][2], t["blk.1.attn_v.bias"])


def test_mixed_types_keep_each_part_s_blocks(files):
    model = llama.load(files["gemma3", "mixed"], **EXACT)
    L = model.layers[0]
    assert isinstance(L.wqkv, tuple) and [W.kind for W in L.wqkv] == ["Q5_0", "Q5_0", "Q8_0"]
    assert isinstance(L.wgu, tuple) and [W.kind for W in L.wgu] == ["Q5_0", "Q4_K"]
    assert (L.wo.kind, L.wd.kind) == ("Q4_K", "Q6_K")


def test_gelu_gate_and_sandwich_norms_change_the_answer(files):
    """Each of gemma3's switches reaches the logits: dropping any one of them moves them."""
    model = llama.load(files["gemma3", "F32"], **EXACT)
    ids, P = list(range(3, 15)), model.params
    want = ref.llama(ids, P)
    for key, value in (("activation", "silu"), ("post_ffn_norm", None), ("q_norm", None), ("window", None),
                       ("rope_base", 1e6)):
        layers = [dict(p, **{key: value}) for p in P["layers"]]
        assert not np.allclose(ref.llama(ids, dict(P, layers=layers)), want, rtol=1e-3, atol=1e-3), key
    assert not np.allclose(ref.llama(ids, dict(P, embed_scale=None)), want, rtol=1e-3, atol=1e-3)


def test_sliding_window_pattern_key_and_linear_rope_scaling(tmp_path):
    path = str(tmp_path / "g.gguf")
    llama_files.write(path, "F32", arch="gemma3", n_layers=3, window=8,
                      extra={"gemma3.rope.scaling.type": "linear"},
                      extra_float={"gemma3.rope.scaling.factor": 8.0},
                      extra_array={"gemma3.attention.sliding_window_pattern": [True, False, True]})
    c = FamilyConfig.from_gguf(GGUFFile(path))
    assert c.windows == (8, None, 8)
    assert c.layer_rope_freqs[0] is None and c.layer_rope_freqs[1] == (8.0,) * (c.d_head // 2)
    model = llama.load(path, **EXACT)
    ids = list(range(3, 20))
    assert_matches(model.forward(ids), ref.llama(ids, params64(model.params)), np.float32)


@pytest.mark.parametrize("extra, match", [
    ({"gemma3.final_logit_softcapping": 30}, "final_logit_softcapping"),
    ({"gemma3.attn_logit_softcapping": 50}, "attn_logit_softcapping"),
    ({"gemma3.expert_count": 8}, "expert_count"),
    ({"gemma3.rope.scaling.type": "yarn"}, "rope scaling 'yarn'"),
    ({"gemma3.attention.sliding_window": 0}, "sliding_window = 0"),
])
def test_keys_the_family_does_not_cover_are_refused(tmp_path, extra, match):
    path = str(tmp_path / "bad.gguf")
    llama_files.write(path, "F32", arch="gemma3", extra=extra)
    with pytest.raises(ValueError, match=match):
        llama.load(path)


@pytest.mark.parametrize("arch, drop", [("gemma3", "blk.1.attn_k_norm.weight"),
                                        ("gemma3", "blk.0.post_ffw_norm.weight"),
                                        ("qwen2", "blk.0.attn_q.bias")])
def test_a_missing_architecture_tensor_is_named(tmp_path, arch, drop):
    t = llama_files.weights(arch=arch)
    del t[drop]
    path = str(tmp_path / "bad.gguf")
    llama_files.write(path, "F32", arch=arch, tensors=t)
    with pytest.raises(ValueError, match=f"the {arch} tensor {drop} is missing"):
        llama.load(path)


def test_another_architecture_s_tensor_is_refused(tmp_path):
    t = llama_files.weights(arch="gemma3")  # QK-norms and sandwich norms in a llama file
    path = str(tmp_path / "bad.gguf")
    llama_files.write(path, "F32", arch="llama", tensors=t)
    with pytest.raises(ValueError, match="attn_k_norm.weight.*not part of the llama architecture"):
        llama.load(path)


def test_architectures_outside_the_family_are_refused(tmp_path):
    path = str(tmp_path / "bad.gguf")
    llama_files.write(path, "F32", arch="phi3")
    with pytest.raises(ValueError, match="architecture 'phi3'.*'llama', 'qwen2', 'qwen3', 'gemma3'"):
        llama.load(path)


def test_models_load_picks_by_architecture(files):
    model = silkattn.models.load(files["qwen2", "Q8_0"], **EXACT)
    assert model.config.arch == "qwen2" and model.config.family.qkv_bias


def test_local_layers_keep_a_ring_of_their_window(files, on_backend):
    """gemma3's five local layers hold 5 positions whatever the context, its global one all of them;
    a prompt longer than the window (the prefill through the ring) then greedy decoding past it is
    still the reference recomputing everything."""
    model = llama.load(files["gemma3", "Q8_0"], **EXACT)
    c = model.config
    assert model.cache_positions(100) == [5, 5, 5, 5, 5, 100]
    assert model.cache_bytes(100) == (5 * 5 + 100) * 2 * c.h_kv * c.d_head * 4
    assert [layer.shape for layer in model.cache(100)][:2] == [(2, c.h_kv, 5, c.d_head)] * 2
    assert all(layer.ctypes.data % 64 == 0 for layer in model.cache(100))  # rows on cache lines
    assert model.cache_bytes(3) == 6 * 3 * 2 * c.h_kv * c.d_head * 4  # shorter than the window
    prompt = [4, 9, 16, 25, 36, 49, 64, 81, 100, 121, 144]
    new = model.generate(prompt, 6, ignore_eos=True)
    ids, P64 = list(prompt), params64(model.params)
    for token in new:
        assert token == int(np.argmax(ref.llama(ids, P64)[-1]))
        ids.append(token)


@pytest.mark.parametrize("arch", list(SIZES))
def test_int8_activations_of_every_type_match_their_reference(files, arch, on_backend):
    """load(activations="int8") on the mixed file (Q5_0, Q8_0, Q4_K, Q6_K: the integer products of
    linear_qx and linear_q): the forward pass and greedy decoding's logits against reference.llama
    with every product's rows rounded (reference.RoundsQ8), within TOL_Q8."""
    from test_llama import q8_params

    from silkattn._testing import TOL_Q8
    model = llama.load(files[arch, "mixed"], activations="int8", kv_dtype="float32")
    assert all(W.q8 for L in model.layers for W in L.products)
    P, ids = q8_params(model), [4, 9, 16, 25, 36, 49, 64, 81, 100]
    assert_matches(model.forward(ids), ref.llama(ids, P), np.float32, TOL_Q8)
    cache = model.cache(len(ids))
    model._run(np.array(ids[:3]), cache, 0)
    for p in range(3, len(ids)):
        logits = model._run(np.array(ids[p:p + 1]), cache, p)
        assert_matches(logits[-1], ref.llama(ids[:p + 1], P)[-1], np.float32, TOL_Q8)
