"""Sentence embeddings of a BERT GGUF file three ways, each contender in its own process, rounds
alternating: SentenceEncoder.encode alone (bert.load(FILE)), the same through the server's
/v1/embeddings (python -m silkattn serve --model FILE --embedding, a client on the loopback), and
llama.cpp on the same file (llama-cpp-python, Llama(embedding=True).embed). One request = a batch
of 32 sentences of 6 to 60 words; each contender's time is the median of its repeats after a
warm-up, the figure the median over rounds. Printed beside them: the CPU and its instruction sets,
and the encoder's GFLOP/s as a fraction of numpy's sgemm measured in the same run.

    python bench/embed_serve.py --model minilm-q8_0.gguf [--python PY] [--threads 2] [--rounds 3]

--python: the Python with llama-cpp-python (default: this one). Make the file with llama.cpp's
convert_hf_to_gguf.py (docs/models.md, "From a GGUF file").
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np

WORDS = ("the quick brown fox jumps over a lazy dog while seven silent engineers measure how fast "
         "attention runs on two small cores of a noisy virtual machine in winter").split()
SENTENCES = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(6 + (i * 17) % 55)) for i in range(32)]
REPEATS = 7

CHILD = r"""
import json, sys, time
import numpy as np
kind, path, threads, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
sentences = json.loads(sys.argv[5])
if kind == "encode":
    import silkattn
    from silkattn.models import bert
    silkattn.set_num_threads(threads)
    model = bert.load(path)
    run = lambda: model.encode(sentences)
else:
    import llama_cpp
    # its fastest setting measured: batches of the smallest power of two that holds the longest
    # sentence (its attention spans a whole batch, masked to each sequence: 128 here ran 0.58x the
    # time of 512, 0.31x that of 4096), its training context
    batch = int(sys.argv[6])
    llm = llama_cpp.Llama(model_path=path, embedding=True, n_ctx=512, n_batch=batch, n_ubatch=batch,
                          n_threads=threads, n_threads_batch=threads, verbose=False)
    run = lambda: llm.embed(sentences, normalize=True)
run()
times = []
for _ in range(repeats):
    t = time.perf_counter(); run(); times.append(time.perf_counter() - t)
print(json.dumps(float(np.median(times))))
"""


def child(python, kind, path, threads, batch=512):  # -> seconds per batch, in a process of its own
    out = subprocess.run([python, "-c", CHILD, kind, path, str(threads), str(REPEATS),
                          json.dumps(SENTENCES), str(batch)], capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise SystemExit(f"{kind} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def served(path, threads):  # -> seconds per request, the server in a process of its own
    import openai
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "silkattn", "serve", "--model", path, "--embedding",
                               "--port", str(port), "--threads", str(threads), "--name", "m"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", timeout=300,
                               max_retries=0)
        deadline = time.time() + 120
        while True:
            try:
                client.embeddings.create(model="m", input=SENTENCES)  # the warm-up
                break
            except openai.APIConnectionError:
                if time.time() > deadline or server.poll() is not None:
                    raise SystemExit("the server did not start")
                time.sleep(0.2)
        times = []
        for _ in range(REPEATS):
            t = time.perf_counter()
            client.embeddings.create(model="m", input=SENTENCES)
            times.append(time.perf_counter() - t)
        return float(np.median(times))
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(60)


def sgemm_rate(threads):  # GFLOP/s of numpy's sgemm, 1024^3, in this process
    from silkattn import set_num_threads
    set_num_threads(threads)
    a = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)
    a @ a
    t = time.perf_counter()
    for _ in range(10):
        a @ a
    return 10 * 2 * 1024 ** 3 / (time.perf_counter() - t) / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from silkattn.models import bert
    model = bert.load(args.model)
    lengths = [len(t) for t in model.tokenize(SENTENCES)]
    tokens, batch = sum(lengths), 1 << (max(lengths) - 1).bit_length()  # llama.cpp's batch
    c = model.config
    flops = tokens * c.n_layers * 2 * (4 * c.d * c.d + 2 * c.d * c.d_ff)  # the products (attention aside)
    from silkattn._bench import cpu_line
    print(f"{cpu_line()}; {os.cpu_count()} cores; threads {args.threads}")
    print(f"{args.model}: 32 sentences, {tokens} tokens a request (llama.cpp's batches: {batch} tokens)")
    rows = {"encode": [], "server": [], "llama.cpp": []}
    for r in range(args.rounds):
        order = list(rows) if r % 2 == 0 else list(reversed(rows))
        for kind in order:
            rows[kind].append(served(args.model, args.threads) if kind == "server" else
                              child(sys.executable if kind == "encode" else args.python, kind, args.model,
                                    args.threads, batch))
        print(f"round {r + 1}: " + ", ".join(f"{k} {1e3 * v[-1]:.1f} ms" for k, v in rows.items()),
              flush=True)
    med = {k: float(np.median(v)) for k, v in rows.items()}
    rate = sgemm_rate(args.threads)
    print(f"median over {args.rounds} rounds: " + ", ".join(f"{k} {1e3 * v:.1f} ms"
                                                           for k, v in med.items()))
    ratio = {k: med[a] / med[b] for k, (a, b) in {"server / encode": ("server", "encode"),
                                                   "server / llama.cpp": ("server", "llama.cpp"),
                                                   "encode / llama.cpp": ("encode", "llama.cpp")}.items()}
    print("; ".join(f"{k} {v:.2f}" for k, v in ratio.items()))
    gflops = flops / med["encode"] / 1e9
    print(f"encode: {gflops:.1f} GFLOP/s of products, {gflops / rate:.0%} of numpy's sgemm ({rate:.0f} "
          "GFLOP/s, 1024^3, this run)")


if __name__ == "__main__":
    main()
