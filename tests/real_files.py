"""What real models ship, from llama.cpp's own source: the vocabulary-only GGUF files of its tokenizer
tests (models/ggml-vocab-*.gguf, with .inp texts and .out ids written by each model's Hugging Face
tokenizer), its chat templates, src/llama-vocab.cpp and its converter (convert_hf_to_gguf.py,
conversion/, gguf-py/), read from the llama-cpp-python sdist that vendors it. A test that needs them
skips with the line that fetches the sdist."""
import os
import tarfile

import pytest

VERSION = "0.3.36"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
CACHE = os.path.join(os.path.expanduser("~"), ".cache", "silkattn")
FETCH = (f"pip download --no-binary :all: --no-deps llama-cpp-python=={VERSION} -d {CACHE} "
         "(or SILKATTN_LLAMA_CPP_SDIST=path/to/the sdist)")
SEPARATOR = "\n__ggml_vocab_test__\n"  # between the texts of a .inp file (tests/test-tokenizer-0.cpp)
# the suite's vocabularies with texts
SUITE = ["bert-bge", "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2", "llama-bpe",
         "llama-spm", "mpt", "phi-3", "qwen2", "qwen35", "refact", "starcoder"]


def llama_cpp_dir():
    """vendor/llama.cpp of the sdist, the parts named above extracted once into the cache."""
    sdist = os.environ.get("SILKATTN_LLAMA_CPP_SDIST") or os.path.join(CACHE, SDIST)
    if not os.path.isfile(sdist):
        pytest.skip(f"llama.cpp's vocabulary files: {FETCH}")
    root = os.path.join(CACHE, f"llama-cpp-{VERSION}")
    done = os.path.join(root, ".extracted-with-converter")
    if not os.path.exists(done):
        prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
        wanted = tuple(prefix + part for part in ("models/", "src/llama-vocab.cpp", "convert_hf_to_gguf.py",
                                                  "conversion/", "gguf-py/"))
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(wanted) and m.isfile()]
            for m in members:
                m.name = m.name[len(prefix):]
            tar.extractall(root, members=members, filter="data")
        open(done, "w").close()
    return root


def vocab_path(name):
    return os.path.join(llama_cpp_dir(), "models", f"ggml-vocab-{name}.gguf")


def vocab_cases(name):  # -> {text: ids}, keyed by text as test-tokenizer-0.cpp keys them
    path = vocab_path(name)
    with open(path + ".inp", encoding="utf-8") as f:
        texts = f.read().split(SEPARATOR)
    with open(path + ".out", encoding="utf-8") as f:
        ids = f.read().split("\n")
    cases = {}
    for text, line in zip(texts, ids):
        cases.setdefault(text, [int(i) for i in line.split()])
    return cases


def with_pre_tokenizer(source, pre, path):
    """A copy of the vocabulary file `source` (one that names a pre-tokenizer) whose tokenizer.ggml.pre
    is `pre`, written at path: the header's string value replaced in place (a vocabulary file has
    no tensors, so nothing after it moves), zeros after it to reach the (absent) tensor data's
    32-byte alignment whatever the new length."""
    import struct

    with open(source, "rb") as f:
        data = f.read()
    key = b"tokenizer.ggml.pre"
    at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key)
    assert struct.unpack_from("<I", data, at)[0] == 8, "tokenizer.ggml.pre is not a string (GGUF type 8)"
    n = struct.unpack_from("<Q", data, at + 4)[0]
    value = pre.encode()
    with open(path, "wb") as f:
        f.write(data[:at + 4] + struct.pack("<Q", len(value)) + value + data[at + 12 + n:] + b"\0" * 32)
    return path
