"""silkattn's GGUF tokenizers against llama.cpp's (llama-cpp-python), each contender and vocabulary in
its own process: the seconds to build the tokenizer from the file, and to encode about 1 MB of mixed
text (silkattn's Markdown docs and Python sources, with the CJK, emoji and other scripts of llama.cpp's
tokenizer suite between them), no BOS, control tokens in the text not parsed: the first encode of
the fresh tokenizer, and the median of --repeats more of the same text (where a tokenizer keeps
the pieces of words it has seen: the `tokenizers` package's BPE and silkattn's SentencePiece do,
llama.cpp does not). The two contenders' ids are compared: the bench stops if they differ.

    python bench/tokenizer_speed.py [--python PY] [--repeats 3] [--rounds 3] [--vocab qwen2,...]
                                    [--model PATH]
--python: an interpreter with llama_cpp (default: this one). Vocabularies: llama.cpp's suite files
(tests/real_files.py fetches them); --model adds a GGUF file of your own (Gemma 3's, say).
--rounds: the two contenders' processes alternate this many times a vocabulary; the times printed
are medians over the rounds, the ratios the medians of each round's ratio.
"""
import argparse
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
VOCABS = ["qwen2", "llama-bpe", "gpt-2", "deepseek-llm", "gemma-4", "llama-spm", "bert-bge"]
SIZE = 1_000_000  # bytes of UTF-8


def corpus():
    """About SIZE bytes: the docs and sources in turn with a suite text between files."""
    import real_files
    extra = []
    for name in real_files.SUITE:
        extra += [t for t in real_files.vocab_cases(name) if any(ord(c) > 0x2000 for c in t)]
    files = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + \
        sorted(glob.glob(os.path.join(ROOT, "src", "silkattn", "**", "*.py"), recursive=True))
    parts, size, i = [], 0, 0
    while size < SIZE:
        with open(files[i % len(files)], encoding="utf-8") as f:
            text = f.read() + "\n" + extra[i % len(extra)] + "\n"
        parts.append(text)
        size += len(text.encode())
        i += 1
    data = "".join(parts).encode()[:SIZE]
    return data.decode("utf-8", errors="ignore")


def child(kind, path, repeats, text_path):
    with open(text_path, encoding="utf-8") as f:
        text = f.read()
    t = time.perf_counter()
    if kind == "silkattn":
        from silkattn.models import gguf
        tok = gguf.tokenizer(gguf.GGUFFile(path))
        encode = lambda: tok.encode(text, special=False)  # noqa: E731
    else:
        import llama_cpp
        model = llama_cpp.Llama(path, vocab_only=True, verbose=False)
        raw = text.encode()
        encode = lambda: model.tokenize(raw, add_bos=False, special=False)  # noqa: E731
    build = time.perf_counter() - t
    t = time.perf_counter()
    ids = encode()
    first = time.perf_counter() - t
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        encode()
        times.append(time.perf_counter() - t)
    print(json.dumps({"build": build, "first": first, "again": statistics.median(times), "ids": ids}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--vocab", default=",".join(VOCABS))
    ap.add_argument("--model", action="append", default=[])
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child[0], a.child[1], int(a.child[2]), a.child[3])
    import real_files
    text = corpus()
    text_path = os.path.join(real_files.CACHE, "tokenizer-speed-corpus.txt")
    with open(text_path, "w", encoding="utf-8") as f:
        f.write(text)
    with open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                   platform.processor())
    print(f"cpu: {cpu}; one thread each; {len(text.encode()):,} bytes, {len(text):,} characters; "
          f"each contender in its own process, {a.rounds} rounds alternating; 'again': medians of "
          f"{a.repeats} encodes after the first")
    print(f"{'vocabulary':26s} {'tokens':>8s} {'build s':>11s} {'first encode s':>14s} {'ratio':>6s} "
          f"{'again s':>12s} {'ratio':>6s}   (silkattn / llama.cpp)")
    paths = [(v, real_files.vocab_path(v)) for v in a.vocab.split(",") if v] + [(os.path.basename(m), m)
                                                                               for m in a.model]
    for name, path in paths:
        rounds = []
        for _ in range(a.rounds):
            got = {}
            for kind, py in (("silkattn", sys.executable), ("llama.cpp", a.python)):
                out = subprocess.run([py, __file__, "--child", kind, path, str(a.repeats), text_path],
                                     capture_output=True, text=True, check=True)
                got[kind] = json.loads(out.stdout.strip().splitlines()[-1])
            rounds.append(got)
        ours, theirs = rounds[0]["silkattn"], rounds[0]["llama.cpp"]
        if ours["ids"] != theirs["ids"]:
            pairs = list(zip(ours["ids"], theirs["ids"]))
            n = next((i for i, (x, y) in enumerate(pairs) if x != y), len(pairs))
            sys.exit(f"{name}: the ids differ from token {n} on ({len(ours['ids'])} tokens against "
                     f"{len(theirs['ids'])})")

        def med(kind, key):
            return statistics.median(r[kind][key] for r in rounds)

        def ratio(key):
            return statistics.median(r["silkattn"][key] / r["llama.cpp"][key] for r in rounds)
        print(f"{name:26s} {len(ours['ids']):8,d} {med('silkattn', 'build'):5.2f} "
              f"{med('llama.cpp', 'build'):5.2f} "
              f"{med('silkattn', 'first'):6.3f} {med('llama.cpp', 'first'):6.3f} {ratio('first'):6.2f} "
              f"{med('silkattn', 'again'):5.3f} {med('llama.cpp', 'again'):5.3f} {ratio('again'):6.2f}")


if __name__ == "__main__":
    main()
