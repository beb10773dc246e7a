"""An architecture that differs from llama by a block, composed here, outside the package: GPT-J's
parallel attention and feed-forward (X + attention(RMSNorm(X)) + ffn(RMSNorm(X)), one norm a layer)
is a composition of models.blocks' blocks and a family entry, and it runs prefill, generate,
generate_batch and the server, checked against the same composition of the reference's functions."""
import numpy as np
import pytest

from silkattn import reference as ref
from silkattn._testing import EXACT, assert_matches

pytest.importorskip("gguf", reason="the llm extra is not installed (pip install 'silkattn[llm]')")
pytest.importorskip("tokenizers", reason="the llm extra is not installed (pip install 'silkattn[llm]')")
pytest.importorskip("jinja2", reason="the llm extra is not installed (pip install 'silkattn[llm]')")

from silkattn.models import family, llama  # noqa: E402

import llama_files  # noqa: E402


def parallel(run, L, X, H):
    """X + attention(H) + ffn(H), H = RMSNorm(X) by L.attn_norm: the sublayers side by side."""
    X = run.add(run.rows(X), run.attention(L, H))
    return run.add_norm(X, run.ffn(L, run.rows(H)), None, run.next_norm)


PARALLEL = family.Architecture(layer=parallel, ffn_norm=False)  # the family entry
SIZES = dict(d=64, h=4, h_kv=2, d_ff=96, n_layers=3, context=96, seed=7)


def numpy_parallel(ids, t, eps=1e-5):  # the reference's functions in float64, composed as parallel()
    t = {name: a.astype(np.float64) for name, a in t.items()}
    n, h, h_kv, positions = len(ids), SIZES["h"], SIZES["h_kv"], np.arange(len(ids))
    X = t["token_embd.weight"][ids]
    for i in range(SIZES["n_layers"]):
        W = {name: t[f"blk.{i}.{name}.weight"] for name in ("attn_q", "attn_k", "attn_v", "attn_output",
                                                             "ffn_gate", "ffn_up", "ffn_down")}
        H = ref.rms_norm(X, t[f"blk.{i}.attn_norm.weight"], eps)
        q, k, v = ((H @ W[name].T).reshape(n, heads, -1).swapaxes(0, 1)
                   for name, heads in (("attn_q", h), ("attn_k", h_kv), ("attn_v", h_kv)))
        A = ref.attention(ref.rope(q, positions), ref.rope(k, positions), v, causal=True)
        X = X + A.swapaxes(0, 1).reshape(n, -1) @ W["attn_output"].T \
            + ref.swiglu(H, W["ffn_gate"].T, W["ffn_up"].T, W["ffn_down"].T)
    return ref.rms_norm(X, t["output_norm.weight"], eps) @ t["token_embd.weight"].T


@pytest.fixture
def files(tmp_path, monkeypatch):
    """{qtype: (path, the float32 tensors)} of a parallel-architecture file, F32 and Q8_0."""
    monkeypatch.setitem(family.ARCHITECTURES, "parallel", PARALLEL)
    out = {}
    for qtype in ("F32", "Q8_0"):
        tensors = {name: a for name, a in llama_files.weights(arch="parallel", **{
            k: v for k, v in SIZES.items() if k != "context"}).items() if "ffn_norm" not in name}
        path = str(tmp_path / f"parallel-{qtype}.gguf")
        llama_files.write(path, qtype, arch="parallel", tensors=tensors, **SIZES)
        out[qtype] = path, tensors
    return out


def test_a_parallel_composition_prefills_as_its_numpy_composition(files, on_backend):
    path, tensors = files["F32"]
    model = llama.load(path, **EXACT)
    for ids in ([5, 80, 33], list(range(3, 60, 2))):
        assert_matches(model.forward(ids), numpy_parallel(np.array(ids), tensors), np.float32)
    with pytest.raises(ValueError, match="parallel"):  # reference.llama knows pre-norm layers only
        model.params


def test_a_parallel_composition_generates_as_its_numpy_composition(files, on_backend):
    """Decoding one token at a time runs the blocks' ops (the fused steps cover pre_norm only), one
    sequence or many, float32 matrices or blocks."""
    path, tensors = files["F32"]
    model, ids = llama.load(path, **EXACT), [5, 80, 33, 17]
    expected = []
    for _ in range(10):  # greedy tokens of the NumPy composition, its whole forward pass each time
        expected.append(int(np.argmax(numpy_parallel(np.array(ids + expected), tensors)[-1])))
    assert model.generate(ids, 10, ignore_eos=True) == expected
    blocks = llama.load(files["Q8_0"][0], **EXACT)
    assert not blocks.fused
    prompts = [[5, 80, 33], [9] * 20, list(range(40, 70)), [60]]
    alone = [blocks.generate(p, 8, ignore_eos=True) for p in prompts]
    assert blocks.generate_batch(prompts, 8, ignore_eos=True, max_batch=3) == alone
    assert blocks.generate_batch(prompts, 8, ignore_eos=True, cache_tokens=256, page_keys=16) == alone


def test_a_parallel_composition_is_served(files):
    pytest.importorskip("uvicorn", reason='pip install "silkattn[serve]"')
    openai = pytest.importorskip("openai", reason='pip install "silkattn[test]"')
    from live_server import live

    from silkattn import serve
    model = llama.load(files["Q8_0"][0])
    with live(serve.create_app(model, "parallel", max_batch=2)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="-", timeout=60, max_retries=0)
        r = client.completions.create(model="parallel", prompt="the cat", max_tokens=8, temperature=0)
        assert r.choices[0].text == model.complete("the cat", 8)
        chat = [{"role": "user", "content": "hi"}]
        r = client.chat.completions.create(model="parallel", messages=chat, max_tokens=6, temperature=0)
        assert r.choices[0].message.content == model.chat(chat, 6)
