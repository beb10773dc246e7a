"""`python -m silkattn bench` options that choose cases (the timing itself runs in bench/ and CI's set-up)."""
import pytest

from silkattn.__main__ import main


def test_bench_match_that_selects_nothing_is_an_error():
    with pytest.raises(SystemExit, match="matches no case"):
        main(["bench", "--match", "no such case"])


# ---------------------------------------------------------------- chat and complete on any file

def _tiny(tmp_path, **kw):
    pytest.importorskip("gguf", reason="the llm extra is not installed (pip install 'silkattn[llm]')")
    import llama_files
    path = str(tmp_path / "tiny.gguf")
    llama_files.write(path, "Q8_0", **kw)
    return path


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_complete_streams_the_models_continuation(tmp_path, capsys, arch):
    from silkattn.models import llama
    path = _tiny(tmp_path, arch=arch)
    main(["complete", "--model", path, "--max-new-tokens", "5", "--threads", "1", "ab c"])
    out, err = capsys.readouterr()
    model = llama.load(path)
    assert out == "ab c" + model.complete("ab c", 5) + "\n"
    assert "tiny.gguf" in err and "decode 5 tokens at" in err and "1 thread(s)" in err


def test_complete_with_a_float16_cache(tmp_path, capsys):
    from silkattn.models import llama
    path = _tiny(tmp_path)
    main(["complete", "--model", path, "--max-new-tokens", "6", "--threads", "1", "--kv-dtype", "float16",
          "ab c"])
    out, _ = capsys.readouterr()
    assert out == "ab c" + llama.load(path, kv_dtype="float16").complete("ab c", 6) + "\n"
    with pytest.raises(SystemExit):
        main(["complete", "--model", path, "--kv-dtype", "int8", "ab c"])


def test_chat_without_a_prompt_reads_a_conversation(tmp_path, capsys, monkeypatch):
    import io

    from silkattn.models import llama
    path = _tiny(tmp_path)
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\nand again\n"))
    main(["chat", "--model", path, "--max-new-tokens", "3", "--temperature", "0.7", "--seed", "1"])
    out, err = capsys.readouterr()
    model = llama.load(path)
    first = model.chat([{"role": "user", "content": "hello"}], 3, temperature=0.7, seed=1)
    second = model.chat([{"role": "user", "content": "hello"}, {"role": "assistant", "content": first},
                         {"role": "user", "content": "and again"}], 3, temperature=0.7, seed=1)
    assert out == f"> {first}\n> {second}\n> \n"
    assert err.count("decode 3 tokens") == 2


def test_chat_with_a_base_model_says_to_complete(tmp_path):
    with pytest.raises(SystemExit, match="has no chat template"):
        main(["chat", "--model", _tiny(tmp_path, template=None), "hi"])
