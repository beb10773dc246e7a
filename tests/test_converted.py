"""Qwen2 and Qwen3 files as the Hub's are made: tiny random-weight transformers models with the real
Qwen2 vocabulary (151,936 tokens), converted by llama.cpp's own convert_hf_to_gguf.py and quantized
by llama.cpp itself to Q8_0 and Q4_K_M (tests/convert_tiny.py). On each file silkattn's float32 path
gives transformers' logits (its forward on the same file's dequantized weights) within 1e-3 of the
largest; the default load's greedy tokens are llama.cpp's; the chat goes through the file's real
template as transformers renders it and tokenizes it, and answers as llama.cpp does.

Needs the llama-cpp-python sdist (the converter, the suite's vocabulary and templates), torch,
transformers, accelerate and llama-cpp-python; about 3 minutes."""
import os
import subprocess
import sys

import numpy as np
import pytest
import real_files

torch = pytest.importorskip("torch", reason="pip install torch==2.13.0 (the CPU wheel)")
transformers = pytest.importorskip("transformers", reason="pip install transformers accelerate")
pytest.importorskip("accelerate", reason="pip install accelerate (transformers' GGUF loading needs it)")
llama_cpp = pytest.importorskip("llama_cpp", reason="pip install llama-cpp-python==0.3.36 (the rival)")

from silkattn._testing import EXACT  # noqa: E402
from silkattn.models import llama  # noqa: E402

TEXT = "The quick brown fox 数学 🙂 jumps over 1234 lazy dogs.\n\tdef f(x): return x ** 2"
CHAT = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "What is 2+2?"}]
KINDS = ["F32", "Q8_0", "Q4_K_M"]
NEW = 24  # greedy tokens compared


@pytest.fixture(scope="module", params=["qwen2", "qwen3"])
def converted(request, tmp_path_factory):
    """(arch, {kind: path}) of the files llama.cpp's converter and quantizer wrote."""
    root = real_files.llama_cpp_dir()
    if not os.path.isfile(os.path.join(root, "convert_hf_to_gguf.py")):
        pytest.skip(f"llama.cpp's converter: {real_files.FETCH}")
    arch, out = request.param, str(tmp_path_factory.mktemp(f"converted-{request.param}"))
    script = os.path.join(os.path.dirname(__file__), "convert_tiny.py")
    done = subprocess.run([sys.executable, script, arch, out, root], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return arch, out, {kind: os.path.join(out, f"{arch}-{kind}.gguf") for kind in KINDS}


def _transformers(path):  # -> transformers' model of a GGUF file, its weights dequantized to float32
    folder, name = os.path.split(path)
    return transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)


def _logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].double().numpy()


def test_the_converter_wrote_what_the_hub_has(converted):
    from silkattn.models import gguf
    arch, _, paths = converted
    for kind, path in paths.items():
        f = gguf.GGUFFile(path)
        assert f.get("general.architecture") == arch
        assert f.get("tokenizer.ggml.pre") == "qwen2" and len(f.get("tokenizer.ggml.tokens")) == 151936
        types = {t.tensor_type.name for t in f.tensors.values()}
        assert types == {"F32"} if kind == "F32" else {"Q8_0", "F32"} if kind == "Q8_0" else \
            {"Q4_K", "Q6_K"} <= types


def test_float32_path_gives_transformers_logits(converted):
    arch, folder, paths = converted
    ids = llama.load(paths["F32"], **EXACT).tokenize(TEXT)
    original = _logits(transformers.AutoModelForCausalLM.from_pretrained(
        os.path.join(folder, f"{arch}-hf"), dtype=torch.float32), ids)
    for kind, path in paths.items():
        theirs = _logits(_transformers(path), ids) if kind != "F32" else original
        ours = llama.load(path, **EXACT).forward(ids)
        assert np.abs(ours - theirs).max() <= 1e-3 * np.abs(theirs).max(), kind
        assert (ours.argmax(-1) == theirs.argmax(-1)).all(), kind


def _llama_cpp(path):
    return llama_cpp.Llama(path, n_ctx=256, n_threads=2, verbose=False, logits_all=True)


def _greedy_and_logits(llm, ids, n):  # -> llama.cpp's n greedy tokens, its logits at each
    out = []
    for t in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
        out.append(int(t))
        if len(out) == n:
            break
    llm.reset()
    llm.eval(ids + out)
    return out, np.array(llm.scores[len(ids) - 1:len(ids) - 1 + n], np.float64)


@pytest.mark.parametrize("kind", KINDS)
def test_default_load_decodes_as_llama_cpp(converted, kind):
    """llama.cpp's greedy tokens, read by silkattn's default load with them as input (teacher
    forcing): silkattn picks llama.cpp's token, or, where not, the two tokens' logits differ by less
    than the two programs' logits differ on that row (a near tie that the arithmetic decides: llama.cpp
    rounds activations to 8 bits and its cache to 16). A free-running generation agrees up to the
    first such tie."""
    _, _, paths = converted
    llm, model = _llama_cpp(paths[kind]), llama.load(paths[kind])
    ids = llm.tokenize(TEXT.encode(), add_bos=False, special=True)
    assert model.tokenize(TEXT) == ids
    theirs, their_logits = _greedy_and_logits(llm, ids, NEW)
    rows = model.forward(ids + theirs)[len(ids) - 1:len(ids) - 1 + NEW].astype(np.float64)
    ours = rows.argmax(-1)
    agree = ours == np.array(theirs)
    for i in np.flatnonzero(~agree):
        gap = rows[i, ours[i]] - rows[i, theirs[i]]
        assert gap <= np.abs(rows[i] - their_logits[i]).max(), (i, gap)
    free = model.generate(ids, NEW, ignore_eos=True)
    first_tie = int(np.flatnonzero(~agree)[0]) if not agree.all() else NEW
    assert free[:first_tie] == theirs[:first_tie]
    if kind == "F32":  # no 8-bit rounding on either side: every token the same
        assert agree.all() and free == theirs
    assert agree.mean() >= 0.75


def test_chat_through_the_files_real_template(converted):
    arch, _, paths = converted
    path = paths["F32"]
    model = llama.load(path)
    folder, name = os.path.split(path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    kw = {"enable_thinking": False} if arch == "qwen3" else {}
    prompt = model.apply_chat_template(CHAT, **kw)
    assert prompt == tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True, **kw)
    if arch == "qwen3":
        assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
        assert model.apply_chat_template(CHAT).endswith("<|im_start|>assistant\n")
    ids = model.prompt_ids(prompt)
    assert ids == tokenizer.encode(prompt, add_special_tokens=False)
    llm = _llama_cpp(path)
    assert ids == llm.tokenize(prompt.encode(), add_bos=False, special=True)
    theirs, _ = _greedy_and_logits(llm, ids, 12)
    reply = model.chat(CHAT, 12, ignore_eos=True, template_kwargs=kw)
    assert model.generate(ids, 12, ignore_eos=True) == theirs
    assert str(reply) == model.detokenize(theirs) and reply.reasoning_content is None
