"""response_format on a live server (127.0.0.1, a small GGUF file with random weights): every answer
held to its JSON schema parses and validates, greedy and sampled, streamed and not, on both
endpoints; the openai client's parse() gets its object; a schema the server cannot take is a 400
naming it. The vocabulary's bytes are checked against the tokenizer's own decoding."""
import json

import numpy as np
import pytest

pytest.importorskip("uvicorn", reason='pip install "silkattn[serve]"')
pytest.importorskip("llguidance", reason='pip install "silkattn[serve]"')
openai = pytest.importorskip("openai", reason='pip install "silkattn[test]"')

from live_server import live  # noqa: E402

from silkattn import serve  # noqa: E402
from silkattn.models import gguf, grammar, llama  # noqa: E402

import llama_files  # noqa: E402

NAME = "tiny"
SCHEMA = {"type": "object", "additionalProperties": False,
          "required": ["name", "age", "ok", "color", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 8},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "ok": {"type": "boolean"}, "color": {"enum": ["red", "green", "blue"]},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 3},
                                  "maxItems": 2}}}
SAMPLING = [dict(temperature=0), dict(temperature=0.7, seed=1), dict(temperature=1.3, seed=2),
            dict(temperature=1.0, top_p=0.9, seed=3), dict(temperature=1.0, seed=4, extra_body={"top_k": 5})]


def valid(doc):  # SCHEMA's rules, checked by hand
    assert set(doc) == {"name", "age", "ok", "color", "tags"}
    assert isinstance(doc["name"], str) and len(doc["name"]) <= 8
    assert isinstance(doc["age"], int) and not isinstance(doc["age"], bool) and 0 <= doc["age"] <= 120
    assert isinstance(doc["ok"], bool) and doc["color"] in ("red", "green", "blue")
    assert isinstance(doc["tags"], list) and len(doc["tags"]) <= 2
    assert all(isinstance(t, str) and len(t) <= 3 for t in doc["tags"])
    return doc


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("structured") / "tiny.gguf")
    llama_files.write(path, "Q8_0", context=256)
    model = llama.load(path)
    with live(serve.create_app(model, NAME, max_batch=4)) as url:
        yield url, model


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="-", timeout=60, max_retries=0)


def test_the_vocabulary_s_bytes_are_what_the_tokenizer_writes(server):
    """A text's tokens' bytes, joined, are the text's UTF-8; a control token is its text marked."""
    model = server[1]
    tokens = grammar.token_bytes(gguf.GGUFFile(model.path))
    assert len(tokens) == model.config.vocab
    for text in ("the cat", "héllo wörld ✓ 中文", " {\"a\": [1, 2]}\n\ttab", "<|im_start|>user"):
        ids = model.tokenize(text)
        joined = b"".join(tokens[i].removeprefix(b"\xff") for i in ids)
        assert joined == text.encode("utf-8")
    start = model.tokenize("<|im_start|>")
    assert len(start) == 1 and tokens[start[0]] == b"\xff<|im_start|>"


@pytest.mark.parametrize("sampling", SAMPLING, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_a_chat_answer_holds_to_its_schema(client, sampling):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    r = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "a person"}],
                                       max_tokens=120, response_format=fmt, **sampling)
    assert r.choices[0].finish_reason == "stop"
    valid(json.loads(r.choices[0].message.content))


def test_a_completion_holds_to_its_schema_streamed_as_whole(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    whole = client.completions.create(model=NAME, prompt="the cat", max_tokens=120, temperature=0,
                                      extra_body={"response_format": fmt})
    valid(json.loads(whole.choices[0].text))
    pieces = client.completions.create(model=NAME, prompt="the cat", max_tokens=120, temperature=0,
                                       stream=True, extra_body={"response_format": fmt})
    assert "".join(c.choices[0].text for c in pieces) == whole.choices[0].text


def test_json_object_answers_are_objects(client):
    for seed in range(3):
        r = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "json"}],
                                           seed=seed, max_tokens=200, temperature=1.0,
                                           response_format={"type": "json_object"})
        text = r.choices[0].message.content
        assert text.startswith("{")
        if r.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(text), dict)


def test_the_openai_client_parses_its_pydantic_model(client):
    from typing import Literal

    import pydantic

    class Person(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=8)
        age: int = pydantic.Field(ge=0, le=120)
        color: Literal["red", "green"]

    r = client.chat.completions.parse(model=NAME, messages=[{"role": "user", "content": "a person"}],
                                      max_tokens=120, temperature=0, response_format=Person)
    person = r.choices[0].message.parsed
    assert isinstance(person, Person) and 0 <= person.age <= 120 and person.color in ("red", "green")


@pytest.mark.parametrize("fmt, text", [
    ({"type": "xml"}, "'response_format' must be"),
    ({"type": "json_schema"}, "'response_format' must be"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}},
     "response_format: "),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 100}
                                         for i in range(700)}}}}, "bytes; at most"),
])
def test_a_schema_the_server_cannot_take_is_a_400(client, fmt, text):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "a"}],
                                       max_tokens=5, response_format=fmt)
    assert text in e.value.body["message"] and e.value.body["param"] == "response_format"


def test_masks_keep_only_what_the_grammar_allows(server):
    model = server[1]
    c = grammar.Constraint(model, grammar.compile_schema(model, {"enum": ["red", "green"]}))
    logits = np.zeros(model.config.vocab, np.float32)
    allowed = np.isfinite(c.masked(logits))
    assert allowed.any() and not allowed.all()
    assert all(model.detokenize([t]).startswith('"') for t in np.flatnonzero(allowed))
    with pytest.raises(ValueError, match="at most"):
        grammar.compile_schema(model, {"description": "x" * grammar.SCHEMA_BYTES})
    with pytest.raises(ValueError, match="must be an object"):
        grammar.compile_schema(model, ["a"])


def test_real_vocabularies_bytes_join_into_their_texts():
    """llama.cpp's vocabulary suite: the ids each model's own tokenizer gives a text (the .out files)
    join, token by token, into the text's UTF-8 (SentencePiece's: after its dummy-prefix space)."""
    import real_files
    for name in real_files.SUITE:
        file = gguf.GGUFFile(real_files.vocab_path(name))
        if file.get("tokenizer.ggml.model") == "bert":
            continue
        tokens = grammar.token_bytes(file)
        prefix = b" " if file.get("tokenizer.ggml.model") == "llama" else b""
        for text, ids in real_files.vocab_cases(name).items():
            joined = b"".join(tokens[i].removeprefix(b"\xff") for i in ids)
            assert joined in (text.encode(), prefix + text.encode()), (name, text)


def test_each_of_n_answers_holds_to_the_schema(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    r = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "people"}], n=3,
                                       max_tokens=120, temperature=1.0, seed=7, response_format=fmt)
    docs = [valid(json.loads(c.message.content)) for c in r.choices]
    assert len(docs) == 3 and all(c.finish_reason == "stop" for c in r.choices)
