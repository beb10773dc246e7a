"""This checkout's Numba kernels against a git revision's, in one process.

    python bench/revision_ab.py --rev 8e38174 [--threads 1] [--pairs 41]

For a refactor that must not change the kernels: the revision's kernel modules (attention, softmax,
rms_norm, layer_norm, linear_q, feed_forward, llama_layer) are loaded beside the current ones as
silkattn.numba.<name>_rev and swapped into the driver in turn. Each case first asserts that both
give bitwise-equal results, then times interleaved pairs (order alternating, each sample about
30 ms after a warm-up) and prints the median of the pair ratios and the ratio of the minima.
Both sides share this process's numpy, numba and thread pool, so whole-process noise (another
tenant, clock drift) hits both alike; what remains is code placement, a few percent: the rows of
modules whose source did not change (marked) show how much.
"""
import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import silkattn
from silkattn._bench import machine
from silkattn.numba import driver
from silkattn.quant import QuantizedMatrix

MODULES = ("attention", "softmax", "rms_norm", "layer_norm", "linear_q", "feed_forward", "llama_layer")


def load_revision(rev, folder):
    """The revision's kernel modules, as silkattn.numba.<name>_rev (relative imports resolve in
    silkattn.numba, so they share today's _simd and _plan), and the names whose source is today's
    to the letter: their rows are the control, what code placement alone does to a ratio."""
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                          check=True).stdout.strip()
    mods, same = {}, set()
    for name in MODULES:
        src = subprocess.run(["git", "-C", root, "show", f"{rev}:src/silkattn/numba/{name}.py"],
                             capture_output=True, text=True, check=True).stdout
        with open(os.path.join(root, "src", "silkattn", "numba", f"{name}.py")) as f:
            if f.read() == src:
                same.add(name)
        path = os.path.join(folder, f"{name}_rev.py")
        with open(path, "w") as f:
            f.write(src)
        spec = importlib.util.spec_from_file_location(f"silkattn.numba.{name}_rev", path)
        mods[name] = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mods[name]
        spec.loader.exec_module(mods[name])
    return mods, same


def bias_act(ff, h, b, gelu):
    """h = act(h + b) through whichever feed-forward kernels the module has."""
    if hasattr(ff, "bias_act_rows"):
        ff.bias_act_rows(h, b, gelu)
    elif gelu:
        (ff.bias_gelu32_rows if h.dtype == np.float32 else ff.bias_gelu64_rows)(h, b)
    else:
        ff.bias_relu_rows(h, b)
    return h


def cases(threads):
    rng = np.random.default_rng(0)

    def r(*shape, dtype=np.float32):
        return rng.standard_normal(shape).astype(dtype)

    def blocks(kind, n, k):
        b = rng.integers(0, 256, (n, k // 32, {"Q8_0": 34, "Q4_0": 18}[kind]), dtype=np.uint8)
        b[:, :, 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)  # finite scales
        return QuantizedMatrix(kind, b.reshape(n, -1))

    nb = silkattn.numba
    Q1, Q8, q, kd, qg, kg, q4, k4 = (r(1, 2048, 64), r(1, 8, 512, 64), r(1, 8, 1, 64), r(1, 8, 4096, 64),
                                     r(1, 32, 1, 64), r(1, 8, 1024, 64), r(1, 8, 4, 64), r(1, 8, 2048, 64))
    X, G, B = r(4096, 1024), r(1024), r(1024)
    x1, xs, W8, W4, Wh = r(1, 576), r(64, 576), blocks("Q8_0", 1536, 576), blocks("Q4_0", 1536, 576), \
        blocks("Q8_0", 49152, 576)
    H, b1, H64, b64 = r(512, 1536), r(1536), r(512, 1536, dtype=np.float64), r(1536, dtype=np.float64)
    h, hkv, dh, cap = 9, 3, 64, 2048  # SmolLM2's decode-step attention
    qkv, K, V = r((h + 2 * hkv) * dh), r(hkv * cap * dh), r(hkv * cap * dh)
    scores, a = np.empty((h, cap + 16), np.float32), np.empty(h * dh, np.float32)

    def attend(m, n):
        none = np.empty(0, np.uint8)
        m._attend(qkv, K, V, cap * dh, dh, dh, n, h, h // hkv, none, False, scores, a, threads)
        return a

    return [
        ("attention", "attention (1,2048,64) causal, tiles", lambda m: nb.attention(Q1, Q1, Q1, causal=True)),
        ("attention", "attention (1,8,512,64), tiles", lambda m: nb.attention(Q8, Q8, Q8)),
        ("attention", "decode (1,8,1,64) vs 4096 keys, rows", lambda m: nb.attention(q, kd, kd)),
        ("attention", "GQA decode 32 q / 8 kv heads vs 1024", lambda m: nb.attention(qg, kg, kg)),
        ("attention", "4 new rows (1,8,4,64) vs 2048", lambda m: nb.attention(q4, k4, k4)),
        ("softmax", "softmax (4096,1024)", lambda m: nb.softmax(X)),
        ("rms_norm", "rms_norm (4096,1024)", lambda m: nb.rms_norm(X, G)),
        ("layer_norm", "layer_norm (4096,1024)", lambda m: nb.layer_norm(X, G, B)),
        ("linear_q", "linear_q Q8_0 1x576 -> 1536", lambda m: nb.linear(x1, W8)),
        ("linear_q", "linear_q Q4_0 1x576 -> 1536", lambda m: nb.linear(x1, W4)),
        ("linear_q", "linear_q Q8_0 1x576 -> 49152 (a head)", lambda m: nb.linear(x1, Wh)),
        ("linear_q", "linear_q Q8_0 64x576 -> 1536", lambda m: nb.linear(xs, W8)),
        ("feed_forward", "bias_gelu (512,1536) float32", lambda m: bias_act(m, H.copy(), b1, True)),
        ("feed_forward", "bias_gelu (512,1536) float64", lambda m: bias_act(m, H64.copy(), b64, True)),
        ("feed_forward", "bias_relu (512,1536) float32", lambda m: bias_act(m, H.copy(), b1, False)),
        ("llama_layer", "SmolLM2 step attention, 256 positions", lambda m: attend(m, 256)),
        ("llama_layer", "SmolLM2 step attention, 2000 positions", lambda m: attend(m, 2000)),
    ]


def sample(f, m, n):
    t0 = time.perf_counter()
    for _ in range(n):
        f(m)
    return (time.perf_counter() - t0) / n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", required=True, help="the git revision to compare with, e.g. a commit hash")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--pairs", type=int, default=41)
    args = ap.parse_args()
    silkattn.set_num_threads(args.threads)
    import numba
    numba.set_num_threads(args.threads)  # the feed-forward and step kernels are called directly
    with tempfile.TemporaryDirectory() as folder:
        old, same = load_revision(args.rev, folder)
        new = {name: importlib.import_module(f"silkattn.numba.{name}") for name in MODULES}
        info = machine()
        print(f"cpu: {info['cpu']} ({info['cores']} cores; {info.get('cpu_isa')}); numba "
              f"{info.get('numba_simd')}; {args.threads} thread(s); new = this checkout, old = {args.rev}")
        for name, label, f in cases(args.threads):
            attr = "_" + name

            def use(m, attr=attr):
                if hasattr(driver, attr):
                    setattr(driver, attr, m)

            outs = []
            for m in (new[name], old[name]):
                use(m)
                outs.append(np.array(f(m), copy=True))
            assert np.array_equal(outs[0], outs[1], equal_nan=True), f"{label}: the two revisions differ"
            use(new[name])
            n = max(1, int(0.03 / sample(f, new[name], 3)))
            tn, to = [], []
            for i in range(args.pairs):
                for m in ((new[name], old[name]) if i % 2 == 0 else (old[name], new[name])):
                    use(m)
                    (tn if m is new[name] else to).append(sample(f, m, n))
            use(new[name])
            ratios = [x / y for x, y in zip(tn, to)]
            print(f"{label:42s} new/old {statistics.median(ratios):.3f} (minima {min(tn) / min(to):.3f}), "
                  f"new {statistics.median(tn) * 1e3:.3f} ms, bitwise equal"
                  + (" (same source: a control)" if name in same else ""), flush=True)


if __name__ == "__main__":
    main()
