"""The compiled encoder of the Llama 3 / Qwen2 pre-tokenizers (silkattn.models.bytepair over
kernels/bytepair.h) gives the ids of the `tokenizers` tokenizer of the same file (itself checked
against the models' own ids and llama.cpp's in test_vocabularies.py): on real vocabularies from
llama.cpp's suite, with and without Llama 3's whole-word rule and with one or three digits a piece,
on random texts built to reach every branch of the regular expression, on long pieces, and with
control tokens parsed and spelt out. Bad tables are refused by name."""
import random

import numpy as np
import pytest

pytest.importorskip("gguf", reason="the llm extra is not installed (pip install 'silkattn[llm]')")
pytest.importorskip("tokenizers", reason="the llm extra is not installed (pip install 'silkattn[llm]')")

import real_files  # noqa: E402

from silkattn import tools  # noqa: E402
from silkattn.models import bytepair, gguf  # noqa: E402

native = pytest.importorskip("silkattn._cy.bytepair", reason="the compiled modules are not built")

# what each branch of the expression turns on: contractions in both cases, letters of several
# scripts and marks (not letters), numbers that are not digits, every kind of white space (and
# U+001C and U+200B, which are not), punctuation, emoji, added tokens of both vocabularies
POOL = (list("abcXYZ'") + ["'s", "'S", "'t", "'re", "'RE", "'Ve", "'ll", "'LL", "'d", "'M", "'x", "''s"]
        + list("0123456789") + ["²", "٣", "Ⅻ", "½", "12345", "0000000"]
        + [" ", "  ", "\t", "\n", "\r", "\r\n", "\x0b", "\x0c", "\x85", "\xa0", "\u2000", "\u3000",
           "\u1680", "\u200b", "\x1c", "    "]
        + ["\u0301", "e\u0301", "\u0915\u094d\u0937", "émigré", "Ελληνικά", "Русский", "مرحبا"]
        + ["你好", "世界", "こんにちは", "안녕", "🙂", "👍🏽", "🇫🇷"]
        + list(".,;:!?-_()[]{}<>/\\\"@#$%^&*+=~`|") + ["...", "!!!\n", " .", " -\r\n"]
        + ["<|im_start|>", "<|endoftext|>", "<|begin_of_text|>", "<|reserved_special_token_5|>",
           "<|im_end|>\n", "<|fim_prefix|>"])


def _texts(seed, count=300):
    rng = random.Random(seed)
    return ["".join(rng.choice(POOL) for _ in range(rng.randint(0, 40))) for _ in range(count)]


def _oracle(tok, text, special):  # the `tokenizers` tokenizer the encoder stands in for
    tok.tok.encode_special_tokens = not special
    return tok.tok.encode(text, add_special_tokens=False).ids


def _vocabulary(tmp_path, source, pre):
    path = real_files.vocab_path(source)
    if pre is not None:
        path = real_files.with_pre_tokenizer(path, pre, str(tmp_path / "v.gguf"))
    return gguf.tokenizer(gguf.GGUFFile(path))


# llama-bpe: Llama 3's expression with ignore_merges; qwen2: single digits, no whole-word rule, 290
# user-defined tokens; dbrx: Llama 3's without the rule; llama3 on Qwen2's vocabulary
CASES = [("llama-bpe", None), ("qwen2", None), ("qwen2", "dbrx"), ("qwen2", "llama3")]


@pytest.mark.parametrize("source,pre", CASES, ids=[f"{s}-{p or 'own'}" for s, p in CASES])
def test_the_compiled_encoder_gives_the_tokenizers_ids(tmp_path, source, pre):
    tok = _vocabulary(tmp_path, source, pre)
    assert isinstance(tok.encoder, bytepair.Encoder)
    texts = _texts(CASES.index((source, pre))) + list(real_files.vocab_cases(source))
    for special in (False, True):
        wrong = [t for t in texts if tok.encode(t, special=special) != _oracle(tok, t, special)]
        assert not wrong, f"special={special}: {len(wrong)} of {len(texts)}: {wrong[:3]!r}"


@pytest.mark.parametrize("text", ["a" * 20000, " " * 20000 + "x", "\n" * 5000, "9" * 10001,
                                  "ab" * 8000 + "!" * 3000, "🙂" * 3000, ""])
def test_long_pieces_are_merged_as_the_tokenizers_merge_them(text):
    tok = gguf.tokenizer(gguf.GGUFFile(real_files.vocab_path("qwen2")))
    assert tok.encode(text, special=False) == _oracle(tok, text, False)


def test_control_tokens_are_parsed_only_when_special():
    tok = gguf.tokenizer(gguf.GGUFFile(real_files.vocab_path("llama-bpe")))
    text = "<|begin_of_text|>hi<|eot_id|> x"
    parsed, spelt = tok.encode(text, special=True), tok.encode(text, special=False)
    assert parsed[0] == 128000 and 128009 in parsed  # <|begin_of_text|>, <|eot_id|>
    assert 128000 not in spelt and len(spelt) > len(parsed)
    assert tok.decode(parsed) == tok.decode(spelt) == text


def test_without_the_compiled_modules_the_tokenizers_encode(monkeypatch):
    monkeypatch.setattr(tools, "bytepair", lambda: None)  # an install without compiled modules
    tok = gguf.tokenizer(gguf.GGUFFile(real_files.vocab_path("llama-bpe")))
    assert tok.encoder is None
    assert tok.encode("Hello world!", special=False) == [9906, 1917, 0]


def test_other_pre_tokenizers_keep_the_tokenizers(tmp_path):
    assert _vocabulary(tmp_path, "qwen2", "gpt-2").encoder is None
    assert _vocabulary(tmp_path, "qwen2", "qwen35").encoder is None


def _tables(**change):
    tables = dict(token_bytes=np.frombuffer(bytes(range(256)), np.uint8),
                  offsets=np.arange(257, dtype=np.int64), ids=np.arange(256, dtype=np.int32),
                  left=np.zeros(1, np.int32), right=np.ones(1, np.int32), merged=np.zeros(1, np.int32),
                  flags=bytepair.flags(), digits=3, ignore_merges=True)
    tables.update(change)
    return tables


@pytest.mark.parametrize("change,message", [
    (dict(flags=np.zeros(1000, np.uint8)), "flags must have 1114112"),
    (dict(offsets=np.arange(256, dtype=np.int64)), "offsets must have one entry more"),
    (dict(offsets=np.r_[np.arange(256), 300].astype(np.int64)), "offsets must have one entry more"),
    (dict(offsets=np.r_[0, 5, np.arange(2, 257)].astype(np.int64)), "offsets must not decrease"),
    (dict(right=np.ones(2, np.int32)), "left, right and merged"),
    (dict(digits=0), "digits must be >= 1"),
    (dict(token_bytes=np.frombuffer(bytes(range(1, 256)) + b"a", np.uint8)), "every single byte"),
])
def test_bad_tables_are_refused_by_name(change, message):
    with pytest.raises(ValueError, match=message):
        native.BytePair(**_tables(**change))


def test_a_table_with_every_byte_encodes_bytes_as_their_tokens():
    model = native.BytePair(**_tables(merged=np.array([300], np.int32)))  # bytes 0 and 1 merge to 300
    assert model.encode(b"ab\x00\x01").tolist() == [97, 98, 300]  # "ab": a piece without a merge
    assert model.encode(b"\x00\x01").tolist() == [300]
    assert model.encode(b"").tolist() == []
