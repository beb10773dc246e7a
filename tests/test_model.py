"""The top-level API on every backend against the reference; backend choice; patch()."""
import os
import subprocess
import sys
import threading
import types

import numpy as np
import pytest

import silkattn
from silkattn import reference as ref
from silkattn._backends import MODULES

import seed_model
from conftest import DTYPES, assert_close, f64


def listing_style_module():
    """seed_model again, but with the listing's own `Q @ K.T / np.sqrt(d_k)`, which turns float32
    into float64 under NumPy 2: a separate module object, so patching one leaves the other."""
    with open(seed_model.__file__) as f:
        source = f.read()
    line = "    scores = Q @ np.swapaxes(K, -1, -2) / np.float32(np.sqrt(d_k)).astype(Q.dtype)"
    assert line in source
    module = types.ModuleType("seed_model_f64")
    listing = source.replace(line, "    scores = Q @ K.T / np.sqrt(d_k)")
    exec(compile(listing, "seed_model_f64", "exec"), module.__dict__)
    return module


seed_model_f64 = listing_style_module()


def small_model(dtype, vocab=37, seed=0):
    return ref.init_params(vocab, d=32, h=4, n_layers=2, d_ff=64, max_len=64, seed=seed, dtype=dtype)


def f64_params(P):
    def conv(x):
        return np.asarray(x, np.float64) if isinstance(x, np.ndarray) else x

    return {"emb": conv(P["emb"]), "pos": conv(P["pos"]),
            "layers": [{k: (tuple(map(conv, v)) if isinstance(v, tuple) else v) for k, v in L.items()}
                       for L in P["layers"]]}


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernels_at_top_level(on_backend, rng, dtype):
    x = rng.standard_normal((3, 5, 40)).astype(dtype)
    g, b = rng.standard_normal(40).astype(dtype), rng.standard_normal(40).astype(dtype)
    assert_close(silkattn.softmax(x), ref.softmax(*f64(x)), dtype)
    assert_close(silkattn.layer_norm(x, g, b), ref.layer_norm(*f64(x, g, b)), dtype)
    mask = rng.random((5, 5)) < 0.6
    assert_close(silkattn.attention(x, x, x, mask), ref.attention(*f64(x, x, x), mask), dtype)
    assert_close(silkattn.attention(x, x, x, causal=True),
                 ref.attention(*f64(x, x, x), ref.causal_mask(5)), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead", [(), (2,)])
@pytest.mark.parametrize("masking", ["none", "causal_mask", "causal_flag", "padding"])
def test_multi_head(on_backend, rng, dtype, lead, masking):
    seq, d, h = 19, 32, 4
    X = rng.standard_normal(lead + (seq, d)).astype(dtype)
    W = [(rng.standard_normal((d, d)) / np.sqrt(d)).astype(dtype) for _ in range(4)]
    mask = {"none": None, "causal_mask": ref.causal_mask(seq), "causal_flag": None,
            "padding": np.arange(seq) < 15}[masking]
    causal = masking == "causal_flag"
    expected = ref.multi_head(*f64(X, *W), h, ref.causal_mask(seq) if causal else mask)
    assert_close(silkattn.multi_head(X, *W, h, mask, causal=causal), expected, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_feed_forward_block_transformer(on_backend, rng, dtype):
    P = small_model(dtype)
    Pd = f64_params(P)
    layer, layer64 = P["layers"][0], Pd["layers"][0]
    layer["ffn"] = tuple(w + dtype(0.05) for w in layer["ffn"])  # nonzero biases
    layer64["ffn"] = tuple(np.asarray(w, np.float64) for w in layer["ffn"])
    X = rng.standard_normal((2, 12, 32)).astype(dtype)
    assert_close(silkattn.feed_forward(X, *layer["ffn"]),
                 ref.feed_forward(X.astype(np.float64), *layer64["ffn"]), dtype)
    mask = ref.causal_mask(12)
    assert_close(silkattn.block(X, layer, mask), ref.block(X.astype(np.float64), layer64, mask), dtype)
    ids = rng.integers(0, 37, 20)
    assert_close(silkattn.transformer(ids, P), ref.transformer(ids, Pd), dtype)


def test_feed_forward_follows_numpy_promotion(rng):
    X = rng.standard_normal((4, 8)).astype(np.float32)
    W1, W2 = np.eye(8, 16, dtype=np.float32), np.eye(16, 8, dtype=np.float32)
    out = silkattn.feed_forward(X, W1, np.zeros(16), W2, np.zeros(8, np.float32))  # float64 bias
    assert out.dtype == ref.feed_forward(X, W1, np.zeros(16), W2, np.zeros(8, np.float32)).dtype == np.float64
    H = silkattn.feed_forward(np.full((2, 8), np.nan, np.float32), W1, np.zeros(16, np.float32),
                              W2, np.zeros(8, np.float32))
    assert np.isnan(H).all()  # NaN survives the fused ReLU, as with np.maximum


def test_default_is_the_fastest_installed_and_choice_is_scoped():
    assert silkattn.get_backend() == "cython"
    assert list(silkattn.backends()) == ["cython", "numba", "numpy"]
    seen = {}
    with silkattn.use_backend("numpy"):
        assert silkattn.get_backend() == "numpy"
        t = threading.Thread(target=lambda: seen.setdefault("other", silkattn.get_backend()))
        t.start()
        t.join()
        with silkattn.use_backend("numba"):
            assert silkattn.get_backend() == "numba"
        assert silkattn.get_backend() == "numpy"
    assert seen["other"] == "cython"  # a context in one thread leaves the others alone
    previous = silkattn.set_backend("numba")
    try:
        assert previous == "cython" and silkattn.get_backend() == "numba"
    finally:
        silkattn.set_backend(previous)
    with pytest.raises(ValueError, match="unknown backend 'torch'"):
        silkattn.set_backend("torch")
    with pytest.raises(ValueError, match="choose one of"):
        with silkattn.use_backend("fortran"):
            pass


@pytest.mark.parametrize("env, expected", [("numba", "numba"), ("numpy", "numpy"), ("", "cython")])
def test_backend_from_environment(env, expected):
    code = "import silkattn; print(silkattn.get_backend())"
    proc = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, SILKATTN_BACKEND=env),
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == expected


def test_missing_backend_named_explicitly_is_an_error(monkeypatch):
    monkeypatch.setitem(MODULES, "numba", "silkattn._no_such_module")
    with pytest.raises(ImportError, match="'numba' is not available"):
        silkattn.set_backend("numba")
    assert silkattn.backends()["numba"].startswith("unavailable")


@pytest.mark.parametrize("module", [seed_model, seed_model_f64], ids=["float32-safe", "listing-upcasting"])
def test_patch_swaps_a_seed_style_module(module):
    P = ref.init_params(41, d=32, h=4, n_layers=2, d_ff=64, max_len=32, seed=2)
    ids = np.arange(0, 40, 3)
    before = module.transformer(ids, P)
    original = module.attention
    with silkattn.patched(module):
        assert module.attention is silkattn.attention and module.transformer is silkattn.transformer
        after = module.transformer(ids, P)
    assert module.attention is original
    assert before.dtype == (np.float64 if module is seed_model_f64 else np.float32)
    assert after.dtype == np.float32  # silkattn keeps float32 even where the listing upcast
    assert_close(after, ref.transformer(ids, f64_params(P)), np.float32)
    np.testing.assert_allclose(after, before, rtol=1e-4, atol=1e-4)
    silkattn.patch(module)
    silkattn.patch(module)  # twice is harmless: unpatch still finds the originals
    silkattn.unpatch(module)
    assert module.attention is original and not hasattr(module, "__silkattn_originals__")


def test_decoder_config_reads_and_makes_the_dict_layout():
    config = silkattn.DecoderConfig(vocab=37, d=32, h=4, n_layers=2, d_ff=64, max_len=20)
    P = config.init_params(seed=3)
    assert silkattn.DecoderConfig.of(P) == config
    reference_P = ref.init_params(37, d=32, h=4, n_layers=2, d_ff=64, max_len=20, seed=3)
    np.testing.assert_array_equal(P["layers"][1]["ffn"][2], reference_P["layers"][1]["ffn"][2])
    with pytest.raises(ValueError, match="h=5 does not divide"):
        silkattn.DecoderConfig(vocab=37, d=32, h=5)
    with pytest.raises(TypeError, match="n_layers must be an int"):
        silkattn.DecoderConfig(vocab=37, n_layers=1.5)


@pytest.mark.parametrize("damage, text", [
    (lambda P: P.pop("pos"), "P lacks 'pos'"),
    (lambda P: P["layers"][1].__setitem__("attn", P["layers"][1]["attn"][:3]),
     r"\['attn'\] must hold 4 arrays"),
    (lambda P: P["layers"][1].__setitem__("h", 2), "one head count per model"),
    (lambda P: P["layers"][0].__setitem__("ffn", (np.ones((32, 63)),) + P["layers"][0]["ffn"][1:]),
     r"P\['layers'\]\[0\]\['ffn'\] b1 must have shape \(63,\)"),
    (lambda P: P["layers"][1].__setitem__("ln2", (np.ones(31), np.zeros(32))),
     r"\['ln2'\] g must have shape \(32,\)"),
    (lambda P: P.__setitem__("pos", P["pos"][:, :16]), r"P\['pos'\] \(max_len, d\)"),
])
def test_transformer_names_the_parameter_that_does_not_fit(on_backend, damage, text):
    P = small_model(np.float32)
    damage(P)
    with pytest.raises(ValueError, match=text):
        silkattn.transformer(np.arange(5), P)
