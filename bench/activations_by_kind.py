"""A decoding step's product for each GGUF block type, with float32 and with int8 activations: one
row times a read-only (as a file's) 2048 -> 8192 matrix of the type's blocks, too large for the
caches, so each call streams the blocks from memory. Prints the milliseconds a call (medians of
--repeats after a warm-up, the two activations alternating in one process), the blocks' read rate,
and that as a fraction of numpy's read rate of a 1 GiB array on the same threads: what
models.llama.load's activations="auto" chooses per type rests on these figures (docs/llm.md).

    python bench/activations_by_kind.py [--threads 1] [--repeats 31] [--backend cython]

Unset OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE for the command alone if they are set.
"""
import argparse
import time

import numpy as np

K, N = 2048, 8192
# the offsets of each kind's float16 scales in its block (set finite: random bytes would make NaNs)
SCALES = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q4_K": (0, 2),
          "Q5_K": (0, 2), "Q6_K": (208,)}


def blocks(kind, rng):
    from silkattn import quant
    from silkattn import reference as ref
    weights, nbytes = ref.QUANT_BLOCKS[kind]
    b = rng.integers(0, 256, (N, K // weights, nbytes), dtype=np.uint8)
    for at in SCALES[kind]:
        b[:, :, at:at + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    b = np.ascontiguousarray(b.reshape(N, -1))
    b.flags.writeable = False  # a file's blocks: the int8 products may keep a 16-row layout of them
    return quant.QuantizedMatrix(kind, b, "float32")


def read_rate(threads):  # GB/s of numpy summing a 1 GiB float32 array, in `threads` threads
    from concurrent.futures import ThreadPoolExecutor
    a = np.ones(1 << 28, np.float32)
    spans = [(p[0], p[-1] + 1) for p in np.array_split(np.arange(a.size), threads)]
    with ThreadPoolExecutor(threads) as pool:
        def read():
            list(pool.map(lambda s: a[s[0]:s[1]].sum(), spans))
        read()
        ts = []
        for _ in range(5):
            t = time.perf_counter()
            read()
            ts.append(time.perf_counter() - t)
    return a.nbytes / np.median(ts) / 1e9


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=31)
    p.add_argument("--backend", default="cython", choices=["cython", "numba"])
    args = p.parse_args()
    import dataclasses

    import silkattn
    from silkattn import quant
    from silkattn._bench import cpu_line
    print(cpu_line())
    silkattn.set_num_threads(args.threads)
    linear = getattr(silkattn, args.backend).linear
    rate = read_rate(args.threads)
    print(f"{args.backend}, {args.threads} thread(s); numpy reads at {rate:.1f} GB/s; one row x {K} -> {N}, "
          f"read-only blocks; ms a call, medians of {args.repeats}")
    print("| type | bytes | float32 ms | GB/s | of read | int8 ms | GB/s | of read | int8 / float32 |")
    print("|---|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, K)).astype(np.float32)
    for kind in quant.KINDS:
        W = {"float32": blocks(kind, rng)}
        W["int8"] = dataclasses.replace(W["float32"], activations="int8")
        size = W["float32"].blocks.nbytes
        times = {a: [] for a in W}
        for a in W:
            for _ in range(3):
                linear(x, W[a])
        for _ in range(args.repeats):
            for a in W:
                t = time.perf_counter()
                linear(x, W[a])
                times[a].append(time.perf_counter() - t)
        ms = {a: float(np.median(t)) * 1e3 for a, t in times.items()}
        gbs = {a: size / ms[a] / 1e6 for a in W}
        print(f"| {kind} | {size / 2**20:.1f} MiB | {ms['float32']:.2f} | {gbs['float32']:.1f} | "
              f"{gbs['float32'] / rate:.0%} | {ms['int8']:.2f} | {gbs['int8']:.1f} | "
              f"{gbs['int8'] / rate:.0%} | "
              f"{ms['int8'] / ms['float32']:.2f}x |")


if __name__ == "__main__":
    main()
