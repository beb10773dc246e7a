"""The vocabularies real models ship, as llama.cpp's tokenizer suite has them (tests/real_files.py):
every one of its 15 vocabularies with texts gives, text for text, the ids the model's own Hugging
Face tokenizer wrote; every pre-tokenizer llama.cpp's src/llama-vocab.cpp names is run or refused
by name, and each one silkattn runs gives llama.cpp's own ids (llama-cpp-python, live) on Qwen2's
151,936-token vocabulary over the suite's texts and texts of this file."""
import re

import pytest

pytest.importorskip("gguf", reason="the llm extra is not installed (pip install 'silkattn[llm]')")
pytest.importorskip("tokenizers", reason="the llm extra is not installed (pip install 'silkattn[llm]')")

import real_files  # noqa: E402

from silkattn.models import gguf  # noqa: E402
from silkattn.models.pretokenizers import PRE_TOKENIZERS, REFUSED  # noqa: E402

# beside the suite's texts: code, contractions in capitals, CJK, emoji and combining marks, runs of
# whitespace and digits, right-to-left and Indic scripts (marks inside words), mixed case, control
# tokens in the text
TEXTS = ["def f(x):\n    return x**2 + 1234567  # squares\n", "I'LL say DON'T, we're they've You'D",
         "你好世界，こんにちは。안녕하세요!", "🙂👍🏽 émigré café naïve e\u0301", "\t\t  \n\n\n  x  \n",
         "Ελληνικά Русский текст", "مرحبا بالعالم", "नमस्ते दुनिया", "...!!!???---", "https://example.com/a?b=1&c=2",
         "3.14159 and 1,000,000", "ÀÉÎÕÜ ÆØÅ ß", "MixedCASEWords and camelCaseIdentifiers",
         "  leading and trailing  ",
         "a\r\nb\rc\n", "1234567890 12 123456 x", "a" + " " * 700 + "b", "汉字漢字 中文 English",
         "IMGIMGABZ <sentinel:12> x", "<|im_start|>user\nhi<|im_end|>"]  # Qwen's control tokens: spelt out


@pytest.mark.parametrize("name", real_files.SUITE)
def test_the_suites_vocabularies_give_the_models_own_ids(name):
    """test-tokenizer-0.cpp's rule: no BOS, special tokens in the text not parsed."""
    tok = gguf.tokenizer(gguf.GGUFFile(real_files.vocab_path(name)))
    cases = real_files.vocab_cases(name)
    assert len(cases) >= 40
    wrong = {text: (ids, tok.encode(text, special=False)) for text, ids in cases.items()
             if tok.encode(text, special=False) != ids}
    assert not wrong, f"{len(wrong)} of {len(cases)} texts: {list(wrong.items())[:3]}"


def _llama_cpp_names():  # -> every tokenizer.ggml.pre value llama.cpp's vocabulary loader accepts
    path = f"{real_files.llama_cpp_dir()}/src/llama-vocab.cpp"
    with open(path, encoding="utf-8") as f:
        source = f.read()
    names = set(re.findall(r'tokenizer_pre == "([^"]+)"', source))
    assert {"default", "qwen2", "llama-bpe", "gpt-4o", "tekken"} <= names and len(names) > 80
    return names


def test_every_pre_tokenizer_llama_cpp_names_is_run_or_refused_by_name():
    names = _llama_cpp_names()
    assert names - set(PRE_TOKENIZERS) - set(REFUSED) == set()
    assert set(PRE_TOKENIZERS) | set(REFUSED) <= names  # no name of silkattn's own


@pytest.mark.parametrize("name", sorted(REFUSED)[:3] + ["kimi-k2", "gpt2"])
def test_a_pre_tokenizer_silkattn_does_not_run_is_refused_naming_it(tmp_path, name):
    path = real_files.with_pre_tokenizer(real_files.vocab_path("qwen2"), name, str(tmp_path / "v.gguf"))
    with pytest.raises(ValueError, match=f"pre-tokenizer '{re.escape(name)}'"):
        gguf.tokenizer(gguf.GGUFFile(path))


def _distinct():  # one name for each distinct pre-tokenizer of the table
    first = {}
    for name, pre in sorted(PRE_TOKENIZERS.items()):
        first.setdefault(pre, name)
    return sorted(first.values())


@pytest.mark.parametrize("name", _distinct())
def test_each_pre_tokenizer_gives_llama_cpps_ids(tmp_path, name):
    llama_cpp = pytest.importorskip("llama_cpp", reason="pip install llama-cpp-python")
    path = real_files.with_pre_tokenizer(real_files.vocab_path("qwen2"), name, str(tmp_path / "v.gguf"))
    tok = gguf.tokenizer(gguf.GGUFFile(path))
    model = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    texts = set(TEXTS)
    for suite in real_files.SUITE:
        texts.update(real_files.vocab_cases(suite))
    wrong = {}
    for text in sorted(texts):
        want = model.tokenize(text.encode(), add_bos=False, special=False) if text else []
        got = tok.encode(text, special=False)
        if got != want:
            wrong[text] = (want, got)
    assert not wrong, f"{len(wrong)} of {len(texts)} texts: {list(wrong.items())[:3]}"


def test_control_tokens_in_a_text_are_matched_unless_special_is_false():
    tok = gguf.tokenizer(gguf.GGUFFile(real_files.vocab_path("qwen2")))
    text = "<|im_start|>user\nhi<|im_end|>"
    ids = tok.encode(text)
    assert ids[0] == 151644 and ids[-1] == 151645  # <|im_start|>, <|im_end|>
    spelt = tok.encode(text, special=False)
    assert 151644 not in spelt and len(spelt) > len(ids)
    assert tok.decode(spelt) == tok.decode(ids) == text


def _vocabulary_file(path, model, tokens, types, merges=None, **keys):
    """A vocabulary-only GGUF file, as llama.cpp's converter writes one (tokenizer.ggml.* keys)."""
    from gguf import GGUFWriter
    writer = GGUFWriter(path, "llama")
    writer.add_tokenizer_model(model)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if merges is not None:
        writer.add_token_merges(merges)
    for key, value in keys.items():
        writer.add_uint32(f"tokenizer.ggml.{key}", value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return gguf.GGUFFile(path)


def test_wordpiece_files_take_the_longest_piece_lower_cased_without_accents(tmp_path):
    """BERT's WordPiece as the converter writes it: U+2581 before a piece that begins a word."""
    S = "\u2581"
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", S + "hello", S + "world", S + "un", "aff", "able", S + "!",
              S + "una", "f"]
    types = [3, 3, 3, 3] + [1] * (len(tokens) - 4)
    f = _vocabulary_file(str(tmp_path / "wpm.gguf"), "bert", tokens, types, unknown_token_id=1)
    tok = gguf.tokenizer(f)
    ids = {t: i for i, t in enumerate(tokens)}
    assert tok.encode("Hello  wörld!") == [ids[S + "hello"], ids[S + "world"], ids[S + "!"]]
    # the longest piece at each point, as llama.cpp and WordPiece take them: "una", then "f", "f",
    # "able" (not "un" + "aff" + "able")
    assert tok.encode("unaffable") == [ids[S + "una"], ids["f"], ids["f"], ids["able"]]
    assert tok.encode("xyz hello") == [1, ids[S + "hello"]]  # a word it cannot spell: [UNK] alone
    assert tok.decode([ids[S + "una"], ids["f"], ids["f"], ids["able"]]) == "unaffable"
    assert tok.encode("[CLS] hello") == [2, ids[S + "hello"]]


def test_gemma4_files_join_utf8_pieces_and_spell_the_rest_in_bytes(tmp_path):
    """Gemma 4's BPE: spaces as U+2581, runs of newlines apart, a character outside the vocabulary
    as its bytes' <0xXX> pieces."""
    S = "\u2581"
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", S, "a", "b", S + "a", "ab", "\n", "\n\n"] + \
        [f"<0x{b:02X}>" for b in range(256)]
    types = [3, 3, 3, 3] + [1] * 7 + [6] * 256
    f = _vocabulary_file(str(tmp_path / "g4.gguf"), "gemma4", tokens, types,
                         merges=[f"{S} a", "a b", "\n \n"])
    tok = gguf.tokenizer(f)
    ids = {t: i for i, t in enumerate(tokens)}
    assert tok.encode("a ab\n\nb") == [ids["a"], ids[S + "a"], ids["b"], ids["\n\n"], ids["b"]]
    assert tok.encode("ab") == [ids["ab"]]
    assert tok.encode("é") == [ids["<0xC3>"], ids["<0xA9>"]]
    assert tok.decode(tok.encode("a ab\n\né")) == "a ab\n\né"


def test_a_kind_of_vocabulary_silkattn_does_not_build_is_refused_naming_it(tmp_path):
    f = _vocabulary_file(str(tmp_path / "t5.gguf"), "t5", ["<pad>", "a"], [3, 1])
    with pytest.raises(ValueError, match="tokenizer.ggml.model 't5'"):
        gguf.tokenizer(f)
